//! `tidemark run` whose wall clock is an hour ahead and then stepped back,
//! for real: libfaketime on the gateway only (the fleet and the broker keep
//! true time), the monotonic clock untouched, the offset file rewritten
//! mid-run as NTP would step the clock (SPEC §4 "The gateway's own clock").

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
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

/// Ten devices with true clocks, one reading each per 200 ms for `rounds` rounds.
fn send_rounds(p: &mut Publisher, rounds: u64) -> u64 {
    let mut n = 0;
    for _ in 0..rounds {
        for d in 0..10 {
            let body = format!(r#"{{"ts": {}, "temp": {d}}}"#, now_ms());
            p.send(&format!("sensors/hall/d{d}/reading"), body.as_bytes());
            n += 1;
        }
        // Pacing of the fleet, not a timing assertion.
        std::thread::sleep(Duration::from_millis(200));
    }
    p.flush();
    n
}

#[test]
fn a_gateway_clock_an_hour_ahead_then_stepped_back_loses_nothing_to_lateness() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::stock();
    let http = free_port();
    let offset_file = dir.path().join("faketime");
    std::fs::write(&offset_file, "+1h\n").unwrap();
    let cfg = gateway_config(
        dir.path(),
        &dir.path().join("state"),
        broker.port,
        &broker,
        http,
        "",
        "[group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 5000 }\n\
         out_of_orderness_ms = 500\nidle_timeout_ms = 3000\nallowed_lateness_ms = 2000\n\
         heartbeat_timeout_ms = 3600000\n",
    );
    let log = dir.path().join("gateway.log");
    let child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
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
    let start = now_ms();
    let mut p = Publisher::connect(broker.port, "clock-step-fleet");
    let mut sent = send_rounds(&mut p, 30);
    if synced {
        // A synchronized gateway is trusted (SPEC §4): its clock is not overruled.
        eprintln!(
            "the kernel reports the clock synchronized: checking that the gateway is trusted"
        );
        // Judged after the gateway has taken every reading, not after a fixed time.
        wait_until(Duration::from_secs(60), "every reading received", || {
            total(&metrics(http), "tidemark_received_total") >= sent
        });
        assert!(alerts("gateway_clock").is_empty());
        gw.terminate();
        return;
    }
    wait_or_explain(
        Duration::from_secs(30),
        || !alerts("gateway_clock").is_empty(),
        || format!("no gateway_clock alert:\n{}", gw.log_text()),
    );
    let wrong = alerts("gateway_clock");
    let error = wrong[0]["error_ms"].as_i64().unwrap();
    assert!((3_595_000..3_605_000).contains(&error), "{wrong:?}");
    assert!(wrong[0]["devices_agreeing"].as_u64().unwrap() >= 3);
    // NTP steps the clock back to true time.
    std::fs::write(&offset_file, "+0\n").unwrap();
    sent += send_rounds(&mut p, 30);
    let end = now_ms();
    wait_or_explain(
        Duration::from_secs(30),
        || !alerts("gateway_clock_ok").is_empty(),
        || format!("no gateway_clock_ok alert:\n{}", gw.log_text()),
    );
    // The fleet went quiet: idle, the watermark follows the clock and closes every window.
    wait_or_explain(
        Duration::from_secs(60),
        || window_readings(&out.all()) >= sent,
        || {
            format!(
                "{} of {sent} readings in windows:\n{}",
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
    assert_eq!(window_readings(&seen), sent);
    for (id, w) in final_windows(&seen) {
        let s = w["start"].as_i64().unwrap();
        assert!(
            s >= start - 5_000 && s <= end,
            "window {id} is not on true time ({start}..{end})"
        );
    }
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
