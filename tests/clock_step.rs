//! `tidemark run` whose wall clock is an hour ahead, or three hours behind, for
//! 25 s and then stepped to true time,
//! for real: libfaketime on the gateway only (the fleet and the broker keep
//! true time), the monotonic clock untouched, the offset file rewritten
//! mid-run as NTP would step the clock (docs/reference.md#time "The gateway's own clock").

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use support::*;

fn libfaketime() -> PathBuf {
    let found = [
        "x86_64-linux-gnu",
        "aarch64-linux-gnu",
        "arm-linux-gnueabihf",
    ]
    .iter()
    .map(|t| PathBuf::from(format!("/usr/lib/{t}/faketime/libfaketimeMT.so.1")))
    .find(|p| p.exists());
    found.expect("libfaketime (Debian package faketime; scripts/test.sh installs it)")
}

/// Ten devices with true clocks, one reading each per 200 ms for `rounds`
/// rounds; each reading's device time is kept in `sent` by device.
fn send_rounds(p: &mut Publisher, rounds: u64, sent: &mut Vec<(u64, i64)>) {
    for _ in 0..rounds {
        for d in 0..10 {
            let ts = now_ms();
            let body = format!(r#"{{"ts": {ts}, "temp": {d}}}"#);
            p.send(&format!("sensors/hall/d{d}/reading"), body.as_bytes());
            sent.push((d, ts));
        }
        // Pacing of the fleet, not a timing assertion.
        std::thread::sleep(Duration::from_millis(200));
    }
    p.flush();
}

const WINDOW_MS: i64 = 5_000;

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
/// A gateway whose clock is off by `offset` (libfaketime syntax, e.g. `+1h`,
/// `-3h`; `expect_ms` is that in ms) for 25 s, then stepped to true time.
fn off_then_stepped(offset: &str, expect_ms: i64) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::stock();
    let http = free_port();
    let offset_file = dir.path().join("faketime");
    std::fs::write(&offset_file, format!("{offset}\n")).unwrap();
    let cfg = gateway_config(
        dir.path(),
        &dir.path().join("state"),
        broker.port,
        &broker,
        http,
        "",
        &format!(
            "[group_defaults]\nwindow = {{ kind = \"tumbling\", size_ms = {WINDOW_MS} }}\n\
             out_of_orderness_ms = 500\nidle_timeout_ms = 3000\nallowed_lateness_ms = 2000\n\
             heartbeat_timeout_ms = 3600000\n"
        ),
    );
    let log = dir.path().join("gateway.log");
    let child = support::tidemark()
        .args(["run", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", &offset_file)
        .env("FAKETIME_NO_CACHE", "1")
        .env("DONT_FAKE_MONOTONIC", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start tidemark");
    let gw = Gateway::adopt(child, &log);
    let out = Collector::start(broker.port, "tidemark/gw/#", "clock-step-collector");
    let synced = total(&metrics(http), "tidemark_kernel_clock_synced") == 1;
    let alerts = |kind: &str| {
        out.on("/alerts")
            .iter()
            .filter(|s| s.json()["type"] == kind)
            .map(Seen::json)
            .collect::<Vec<_>>()
    };
    let mut p = Publisher::connect(broker.port, "clock-step-fleet");
    let mut sent = Vec::new();
    if synced {
        // A synchronized gateway is trusted (docs/reference.md#time): its clock is not overruled.
        eprintln!(
            "the kernel reports the clock synchronized: checking that the gateway is trusted"
        );
        send_rounds(&mut p, 30, &mut sent);
        // Judged after the gateway has taken every reading, not after a fixed time.
        wait_until(Duration::from_secs(60), "every reading received", || {
            total(&metrics(http), "tidemark_received_total") >= sent.len() as u64
        });
        assert!(alerts("gateway_clock").is_empty());
        gw.terminate();
        return;
    }
    // 25 s on the wrong clock, then NTP steps it to true time.
    send_rounds(&mut p, 125, &mut sent);
    let wrong = alerts("gateway_clock");
    assert_eq!(wrong.len(), 1, "{wrong:?}\n{}", gw.log_text());
    let error = wrong[0]["error_ms"].as_i64().unwrap();
    assert!((error - expect_ms).abs() < 5_000, "{wrong:?}");
    assert!(wrong[0]["devices_agreeing"].as_u64().unwrap() >= 3);
    std::fs::write(&offset_file, "+0\n").unwrap();
    send_rounds(&mut p, 25, &mut sent);
    wait_or_explain(
        Duration::from_secs(30),
        || !alerts("gateway_clock_ok").is_empty(),
        || format!("no gateway_clock_ok alert:\n{}", gw.log_text()),
    );
    // The fleet went quiet: idle, the watermark follows the clock and closes every window.
    let n = sent.len() as u64;
    wait_or_explain(
        Duration::from_secs(60),
        || window_readings(&out.all()) >= n,
        || {
            format!(
                "{} of {n} readings in windows:\n{}",
                window_readings(&out.all()),
                gw.log_text()
            )
        },
    );
    let seen = out.all();
    assert!(
        out.on("/late").is_empty(),
        "late: {}",
        out.on("/late").len()
    );
    assert_eq!(window_readings(&seen), n);
    // Each reading in the window of its true time.
    let mut expected: std::collections::BTreeMap<String, u64> = Default::default();
    for (d, ts) in &sent {
        let key = format!("\"hall\"/\"d{d}\"/{}", ts.div_euclid(WINDOW_MS) * WINDOW_MS);
        *expected.entry(key).or_default() += 1;
    }
    let got = final_windows(&seen);
    let on_true: u64 = expected
        .iter()
        .map(|(k, n)| {
            got.get(k)
                .and_then(|w| w["count"].as_u64())
                .unwrap_or(0)
                .min(*n)
        })
        .sum();
    let pct = 100.0 * on_true as f64 / n as f64;
    eprintln!(
        "gateway {offset}, stepped after 25 s: {on_true} of {n} readings on true time ({pct:.2} %)"
    );
    assert!(pct >= 99.0, "{on_true} of {n} on true time");
    assert_eq!(alerts("gateway_clock").len(), 1);
    assert_eq!(alerts("gateway_clock_ok").len(), 1);
    let device_alerts = seen
        .iter()
        .filter(|s| s.topic.starts_with("tidemark/gw/alerts/"))
        .count();
    assert_eq!(device_alerts, 0);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn a_gateway_clock_an_hour_ahead_then_stepped_back_loses_nothing_to_lateness() {
    off_then_stepped("+1h", 3_600_000);
}

#[test]
fn a_gateway_clock_three_hours_behind_then_stepped_times_its_first_readings_right() {
    off_then_stepped("-3h", -3 * 3_600_000);
}
