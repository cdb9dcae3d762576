//! The tools around `tidemark run`: `capture` of live traffic for `replay`, and
//! `simulate` driving a fleet through the gateway upstream.
mod support;

use support::fleet::*;
use support::{
    Collector, Gateway, Mosquitto, Publisher, final_windows, now_ms, wait_or_explain, wait_until,
};

#[test]
fn capture_records_live_traffic_that_replay_reads_even_when_killed_mid_line() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("capture.jsonl");
    let log = dir.path().join("capture.log");
    let mut child = support::tidemark()
        .args([
            "capture",
            "--url",
            &broker.url(),
            "--topic",
            "sensors/#",
            "--output",
        ])
        .arg(&file)
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("capture");
    wait_or_explain(
        MIN,
        || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("capture subscribed")
        },
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    let mut p = Publisher::connect(broker.port, "capture-fleet");
    let ts = now_ms() - 60_000;
    p.send(
        "sensors/g/d1/reading",
        format!(r#"{{"ts": {ts}, "temp": 1.5}}"#).as_bytes(),
    );
    p.send("sensors/g/d1/reading", &[0xa2, 0x01, 0xff]);
    p.send(
        "sensors/g/d1/reading",
        format!(r#"{{"ts": {}, "temp": 2.5}}"#, ts + 1000).as_bytes(),
    );
    p.flush();
    wait_until(MIN, "three captured lines", || {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .count()
            == 3
    });
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&file).expect("capture");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.contains("payload_b64")),
        "{text}"
    );
    // Each line carries the gateway's monotonic clock and the kernel's NTP state (docs/reference.md#time).
    let mut last_mono = 0;
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).expect("capture line");
        let mono = v["mono"].as_i64().expect("mono");
        assert!(mono >= last_mono, "{l}");
        last_mono = mono;
        assert!(v["synced"].is_boolean(), "{l}");
    }
    // As if killed in the middle of a line.
    std::fs::write(&file, format!("{text}{{\"arrival\": 17964")).expect("torn");
    let config = dir.path().join("replay.toml");
    std::fs::write(&config, "[gateway]\nid = \"gw\"\n").expect("config");
    let replay = |extra: &[&str]| {
        support::tidemark()
            .args(["replay", "--config"])
            .arg(&config)
            .arg("--input")
            .arg(&file)
            .args(extra)
            .output()
            .expect("replay")
    };
    // Without --flush the capture's last window is still open at its end.
    let open = replay(&[]);
    assert_eq!(open.status.code(), Some(0));
    let open_total: u64 = final_windows(&support::replay_lines(&String::from_utf8_lossy(
        &open.stdout,
    )))
    .values()
    .map(|w| w["count"].as_u64().unwrap_or(0))
    .sum();
    assert_eq!(open_total, 0);
    // --flush closes it, as a final watermark at +infinity would.
    let out = replay(&["--flush"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("torn last line"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"decode_error\""), "{stdout}");
    let seen = support::replay_lines(&stdout);
    let total: u64 = final_windows(&seen)
        .values()
        .map(|w| w["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(total, 2, "{stdout}");
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn simulate_to_run_to_upstream_accounts_for_every_message() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, DEVICE_POLICY);
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/#", "sim-collector");
    let gw = Gateway::start(&config, &log);
    // A misbehaving fleet: disorder, late readings, redeliveries, garbage,
    // heartbeats, a device that falls silent, an outage and its backlog burst.
    let out = support::tidemark()
        .args(["simulate", "--url", &broker.url(), "--seed", "7"])
        .args([
            "--devices",
            "30",
            "--groups",
            "hall,lab,yard",
            "--format",
            "mixed",
        ])
        .args([
            "--rate",
            "2000",
            "--count",
            "12000",
            "--qos",
            "1",
            "--connections",
            "3",
        ])
        .args(["--out-of-order", "0.05", "--disorder-ms", "3000"])
        .args(["--late", "0.02", "--late-by-ms", "60000"])
        .args([
            "--duplicates",
            "0.03",
            "--malformed",
            "0.01",
            "--heartbeat-every",
            "10",
        ])
        .args(["--silent", "2", "--silence-at-s", "1", "--silence-s", "2"])
        .args(["--outage-at-s", "3", "--outage-s", "1", "--quiet"])
        .output()
        .expect("simulate");
    assert!(
        out.status.success(),
        "simulate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("summary");
    let sent = summary["sent"].as_u64().unwrap();
    assert_eq!(sent, 12_000, "{summary}");
    assert_eq!(summary["acked"].as_u64(), Some(sent), "{summary}");
    let m = &summary["messages"];
    for k in [
        "out_of_order",
        "late",
        "duplicates",
        "malformed",
        "heartbeats",
        "backlog",
    ] {
        assert!(m[k].as_u64().unwrap() > 0, "no {k} in {summary}");
    }

    // Every message ends in exactly one place: a window (as a reading or a
    // heartbeat), late, rejected, or a suppressed duplicate.
    let account = || {
        let seen = up.all();
        let windows = final_windows(&seen);
        let in_windows: u64 = windows
            .values()
            .map(|w| w["count"].as_u64().unwrap() + w["heartbeats"].as_u64().unwrap())
            .sum();
        let late = seen.iter().filter(|s| s.topic.contains("/late/")).count() as u64;
        let rejected = seen
            .iter()
            .filter(|s| s.topic.ends_with("/rejected"))
            .count() as u64;
        let dups = seen
            .iter()
            .rev()
            .find(|s| s.topic.ends_with("/metrics"))
            .map_or(0, |s| {
                s.json()["counters"]["duplicates"].as_u64().unwrap_or(0)
            });
        (in_windows, late, rejected, dups)
    };
    wait_or_explain(
        3 * MIN,
        || {
            let (w, l, r, d) = account();
            w + l + r + d == sent
        },
        || format!("accounted {:?} of {sent}; summary {summary}", account()),
    );
    let (w, l, r, d) = account();
    assert!(w > 0 && l > 0 && r > 0 && d > 0, "{:?}", (w, l, r, d));
    // The gateway's own counters say the same.
    let latest_metrics = || {
        up.all()
            .iter()
            .rev()
            .find(|s| s.topic.ends_with("/metrics"))
            .map(|s| s.json())
            .unwrap_or_default()
    };
    wait_until(MIN, "metrics after the last message", || {
        latest_metrics()["counters"]["received"].as_u64() == Some(sent)
    });
    let metrics = latest_metrics();
    let c = &metrics["counters"];
    assert_eq!(c["received"].as_u64(), Some(sent), "{metrics}");
    assert_eq!(c["late"].as_u64(), Some(l), "{metrics}");
    let rejected: u64 = c["rejected"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(rejected, r, "{metrics}");
    assert_eq!(rejected, m["malformed"].as_u64().unwrap(), "{summary}");
    assert_eq!(d, m["duplicates"].as_u64().unwrap(), "{summary}");
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}

/// The quick start's config on free ports and a private state dir.
fn local_config(dir: &std::path::Path) -> (std::path::PathBuf, u16, u16) {
    let (mqtt, http) = (support::free_port(), support::free_port());
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/configs/local.toml"))
        .expect("configs/local.toml")
        .replace("127.0.0.1:1883", &format!("127.0.0.1:{mqtt}"))
        .replace("127.0.0.1:9464", &format!("127.0.0.1:{http}"))
        .replace("./tidemark-state", &dir.join("state").display().to_string());
    let path = dir.join("local.toml");
    std::fs::write(&path, text).expect("config");
    (path, mqtt, http)
}

#[test]
fn simulate_with_its_defaults_against_the_quick_start_gateway_gets_every_message_acked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, mqtt, http) = local_config(dir.path());
    let log = dir.path().join("gw.log");
    let gw = Gateway::start(&config, &log);
    // The quick start's endpoint is on, and no v3.1.1 tuning warning for its own broker.
    support::wait_until(MIN, "/healthz", || {
        support::http_get(http, "/healthz").0 == 200
    });
    assert!(
        !gw.log_text().contains("max_inflight_messages"),
        "{}",
        gw.log_text()
    );
    let out = support::tidemark()
        .args(["simulate", "--url", &format!("mqtt://127.0.0.1:{mqtt}")])
        .args(["--devices", "5", "--count", "200", "--rate", "0"])
        .output()
        .expect("simulate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "simulate: {stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("summary JSON");
    assert_eq!(summary["sent"], 200, "{summary}");
    assert_eq!(summary["acked"], 200, "{summary}");
    assert!(stderr.contains("MQTT 3.1.1"), "{stderr}");
    let _ = gw.terminate();
}

#[test]
fn simulate_without_a_broker_stops_early_saying_so() {
    let port = support::free_port();
    let out = support::tidemark()
        .args(["simulate", "--url", &format!("mqtt://127.0.0.1:{port}")])
        .args(["--count", "10"])
        .output()
        .expect("simulate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no MQTT broker answers"), "{stderr}");
    assert!(stderr.contains(&port.to_string()), "{stderr}");
}
