//! `tidemark run` against real mosquitto processes: shapes of every output and
//! equality with `replay`, the embedded broker, mutual TLS, an unusable state
//! file, systemd notify and the HTTP endpoint.
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::fleet::*;
use support::{
    Collector, Gateway, Mosquitto, Publisher, final_windows, now_ms, wait_or_explain, wait_until,
};

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn end_to_end_outputs_have_spec_shapes_and_match_replay() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, DEVICE_POLICY);
    let up = Collector::start(broker.port, "tidemark/#", "e2e-collector");
    let gw = Gateway::start(&config, &dir.path().join("gw.log"));
    let mut records: Vec<(String, Vec<u8>)> = Vec::new();
    let mut publisher = Publisher::connect(broker.port, "e2e-fleet");
    let mut send = |p: &mut Publisher, topic: &str, payload: Vec<u8>| {
        p.send(topic, &payload);
        records.push((topic.to_string(), payload));
    };
    // Ten minutes ago, on a window boundary.
    let base = (now_ms() - 10 * 60_000) / 10_000 * 10_000;
    for s in 0..10i64 {
        let t = base + s * 1000 + 100;
        send(
            &mut publisher,
            "sensors/hall/d1/reading",
            reading(t, s as u64, 20.0 + s as f64),
        );
        send(
            &mut publisher,
            "sensors/hall/d2/reading",
            reading(t, s as u64, 30.0),
        );
        send(
            &mut publisher,
            "sensors/hall/d2/heartbeat",
            format!(r#"{{"ts": {t}}}"#).into_bytes(),
        );
    }
    // A QoS 1 redelivery, a malformed payload, a topic outside the pattern.
    send(
        &mut publisher,
        "sensors/hall/d1/reading",
        reading(base + 3100, 3, 23.0),
    );
    send(
        &mut publisher,
        "sensors/hall/d1/reading",
        b"{\"ts\": 12, \"temp\": [1, {".to_vec(),
    );
    send(
        &mut publisher,
        "sensors/hall/d1/telemetry",
        reading(base + 5000, 99, 1.0),
    );
    publisher.flush();
    // d2 falls silent; d1 carries on for 30 s of device time.
    for s in 10..40i64 {
        let t = base + s * 1000 + 100;
        send(
            &mut publisher,
            "sensors/hall/d1/reading",
            reading(t, s as u64, 20.0 + s as f64),
        );
    }
    publisher.flush();
    wait_until(MIN, "first window and d2 offline", || {
        up.on("/windows/hall/d1")
            .iter()
            .any(|s| s.json()["start"] == base)
            && up
                .on("/alerts/hall/d2")
                .iter()
                .any(|s| s.json()["type"] == "offline")
    });
    // Past end + lateness of the first window: late.
    send(
        &mut publisher,
        "sensors/hall/d1/reading",
        reading(base + 1500, 1000, 99.0),
    );
    // d2 comes back, far ahead of the watermark whatever time this machine took so far.
    send(
        &mut publisher,
        "sensors/hall/d2/reading",
        reading(base + 300_100, 10, 31.0),
    );
    publisher.flush();
    wait_until(MIN, "late, online and the last windows", || {
        !up.on("/late/").is_empty()
            && up
                .on("/alerts/hall/d2")
                .iter()
                .any(|s| s.json()["type"] == "online")
            && up
                .on("/windows/hall/d2")
                .iter()
                .any(|s| s.json()["start"] == base + 300_000)
            && up
                .on("/windows/hall/d1")
                .iter()
                .any(|s| s.json()["start"] == base + 30_000)
    });

    // Shapes (docs/reference.md#topics-and-payloads-upstream).
    let w = up.on("/windows/hall/d1")[0].json();
    for k in [
        "id",
        "gateway",
        "group",
        "device",
        "start",
        "end",
        "revision",
        "count",
        "heartbeats",
        "metrics",
    ] {
        assert!(w.get(k).is_some(), "window result lacks {k}: {w}");
    }
    assert_eq!(w["gateway"], "gw");
    for k in ["count", "sum", "min", "max", "mean", "first", "last"] {
        assert!(
            w["metrics"]["temp"].get(k).is_some(),
            "metric lacks {k}: {w}"
        );
    }
    let d2w = up.on("/windows/hall/d2")[0].json();
    assert_eq!(
        (d2w["count"].as_u64(), d2w["heartbeats"].as_u64()),
        (Some(10), Some(10))
    );
    let late = up.on("/late/hall/d1")[0].json();
    for k in [
        "group",
        "device",
        "event_time",
        "watermark",
        "arrival",
        "payload",
    ] {
        assert!(late.get(k).is_some(), "late lacks {k}: {late}");
    }
    assert_eq!(late["payload"]["temp"], 99.0);
    let rejected: Vec<_> = up.on("/rejected").iter().map(|s| s.json()).collect();
    let reasons: Vec<_> = rejected
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        reasons.contains(&"decode_error".to_string()),
        "{rejected:?}"
    );
    assert!(reasons.contains(&"bad_topic".to_string()), "{rejected:?}");
    for r in &rejected {
        for k in ["reason", "topic", "arrival", "detail"] {
            assert!(r.get(k).is_some(), "rejected lacks {k}: {r}");
        }
    }
    let offline = up
        .on("/alerts/hall/d2")
        .into_iter()
        .map(|s| s.json())
        .find(|a| a["type"] == "offline")
        .expect("offline");
    for k in ["type", "group", "device", "last_seen", "watermark", "at"] {
        assert!(offline.get(k).is_some(), "alert lacks {k}: {offline}");
    }
    let statuses: Vec<String> = up
        .on("/status/hall/d2")
        .iter()
        .map(|s| String::from_utf8_lossy(&s.payload).into_owned())
        .collect();
    assert_eq!(statuses, vec!["\"online\"", "\"offline\"", "\"online\""]);
    let gw_status = up
        .on("tidemark/gw/status")
        .into_iter()
        .find(|s| s.topic == "tidemark/gw/status")
        .expect("gateway status");
    assert_eq!(gw_status.json()["state"], "online");
    let metrics = up.on("tidemark/gw/metrics");
    assert!(!metrics.is_empty());
    let m = metrics.last().expect("metrics").json();
    for k in ["at", "uptime_s", "groups", "counters"] {
        assert!(m.get(k).is_some(), "metrics lacks {k}: {m}");
    }
    assert_eq!(m["counters"]["duplicates"], 1, "{m}");
    assert!(m["groups"]["hall"].get("watermark").is_some(), "{m}");

    let (code, took) = gw.terminate();
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(5), "stop took {took:?}");

    // The same records through `tidemark replay` give the same window results.
    let capture = dir.path().join("capture.jsonl");
    let mut text = String::new();
    let n = records.len();
    for (i, (topic, payload)) in records.iter().enumerate() {
        // One record per 100 ms; the late one 5 s after the rest, d2's return when its clock says.
        let arrival = match n - i {
            1 => base + 301_000,
            2 => base + 65_000 + i as i64 * 100,
            _ => base + 60_000 + i as i64 * 100,
        };
        let line = match serde_json::from_slice::<serde_json::Value>(payload) {
            Ok(v) => serde_json::json!({"arrival": arrival, "topic": topic, "payload": v}),
            Err(_) => {
                use base64::Engine as _;
                let b = base64::engine::general_purpose::STANDARD.encode(payload);
                serde_json::json!({"arrival": arrival, "topic": topic, "payload_b64": b})
            }
        };
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&capture, text).expect("capture");
    let replay_seen = support::replay(&config, &capture, 600_000);
    let live = final_windows(&up.all());
    let offline_run = final_windows(&replay_seen);
    let strip = |m: BTreeMap<String, serde_json::Value>| -> BTreeMap<String, String> {
        m.into_iter()
            .map(|(k, v)| {
                (
                    k,
                    format!("{} {} {}", v["count"], v["heartbeats"], v["metrics"]),
                )
            })
            .collect()
    };
    assert_eq!(
        strip(live),
        strip(offline_run),
        "live and replayed window results differ"
    );
}

#[test]
fn local_config_with_the_embedded_broker_turns_a_reading_into_a_window_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = support::free_port();
    let url = format!("mqtt://127.0.0.1:{port}");
    let log = dir.path().join("gw.log");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/local.toml");
    let f = std::fs::File::create(&log).expect("log");
    let child = support::tidemark()
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .env("TIDEMARK__BROKER__LISTEN", format!("127.0.0.1:{port}"))
        .env("TIDEMARK__SOURCE__URL", &url)
        .env("TIDEMARK__SINK__URL", &url)
        .env("TIDEMARK__GATEWAY__STATE_DIR", dir.path().join("state"))
        .stdout(std::process::Stdio::null())
        .stderr(f)
        .spawn()
        .expect("start tidemark");
    let gw = Gateway::adopt(child, &log);
    let up = Collector::start(port, "tidemark/#", "local-collector");
    let mut p = Publisher::connect(port, "local-sensor");
    let ts = now_ms();
    p.send(
        "sensors/lab/t1/reading",
        format!(r#"{{"ts": {ts}, "temp": 21.5}}"#).as_bytes(),
    );
    p.flush();
    wait_or_explain(
        MIN,
        || !up.on("/windows/lab/t1").is_empty(),
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    let w = up.on("/windows/lab/t1")[0].json();
    assert_eq!(w["count"], 1);
    assert_eq!(w["metrics"]["temp"]["last"], 21.5);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn unusable_state_file_stops_run_with_exit_1_naming_the_file_and_leaves_it_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let file = state.join("tidemark.redb");
    let garbage = vec![0x5a; 8192];
    std::fs::write(&file, &garbage).expect("garbage");
    let config = dir.path().join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nid = \"gw\"\nstate_dir = \"{}\"\n",
            state.display()
        ),
    )
    .expect("config");
    let out = support::tidemark()
        .arg("--config")
        .arg(&config)
        .env_remove("RUST_LOG")
        .output()
        .expect("tidemark");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = err.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(file.to_str().expect("path")), "{err}");
    assert_eq!(
        std::fs::read(&file).expect("read"),
        garbage,
        "state file modified"
    );
}

/// The value of an unlabelled Prometheus sample.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn systemd_notify_watchdog_and_the_local_http_endpoint() {
    use std::os::unix::net::UnixDatagram;
    let mut broker = Mosquitto::start(true);
    let dir = tempfile::tempdir().expect("tempdir");
    let http_port = support::free_port();
    let config = write_config(
        dir.path(),
        &broker,
        &broker,
        &format!("listen = \"127.0.0.1:{http_port}\"\nhealth_timeout_s = 2\n{DEVICE_POLICY}"),
    );
    let log = dir.path().join("gw.log");
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let f = std::fs::File::create(&log).unwrap();
    let child = support::tidemark()
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .stderr(f)
        .spawn()
        .expect("start tidemark");
    let gw = Gateway::adopt(child, &log);
    let notes = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let notes = notes.clone();
        let sock = sock.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match sock.recv(&mut buf) {
                    Ok(n) => notes
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(_) => return,
                }
                if notes
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|n| n.contains("STOPPING=1"))
                {
                    return;
                }
            }
        })
    };
    let count = |what: &str| {
        notes
            .lock()
            .unwrap()
            .iter()
            .filter(|n| n.contains(what))
            .count()
    };
    wait_until(MIN, "READY=1", || count("READY=1") == 1);
    // Watchdog pings keep coming at half the period while the engine is healthy.
    wait_until(MIN, "watchdog pings", || count("WATCHDOG=1") >= 5);

    // Metrics in Prometheus text, moving with the input.
    let mut publisher = Publisher::connect(broker.port, "http-fleet");
    let ts = now_ms();
    for seq in 0..5 {
        publisher.send(
            "sensors/hall/d1/reading",
            &reading(ts + seq, seq as u64, 20.0),
        );
    }
    publisher.send("sensors/hall/d1/bogus", b"{}");
    publisher.flush();
    // The text is refreshed once a second: the accepted count may show a pass before the
    // tick that moves the watermark.
    wait_until(MIN, "accepted and a watermark in /metrics", || {
        let (code, body) = support::http_get(http_port, "/metrics");
        code == 200
            && sample(&body, "tidemark_accepted_total") == Some(5.0)
            && body.contains("tidemark_group_watermark_seconds{group=\"hall\"}")
    });
    let (_, body) = support::http_get(http_port, "/metrics");
    assert!(
        body.contains("# TYPE tidemark_received_total counter"),
        "{body}"
    );
    assert!(
        body.contains("tidemark_rejected_total{reason=\"bad_topic\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("tidemark_connected{link=\"source\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("tidemark_timestamps_invalid_total{group=\"hall\"} 0"),
        "{body}"
    );
    // Active or already idle (idle_timeout_ms is 1.5 s; the text is refreshed each second).
    let devices = |state: &str| {
        sample(
            &body,
            &format!("tidemark_group_devices{{group=\"hall\",state=\"{state}\"}}"),
        )
    };
    assert_eq!(
        devices("active").zip(devices("idle")).map(|(a, i)| a + i),
        Some(1.0),
        "{body}"
    );
    assert!(
        body.contains("tidemark_group_watermark_seconds{group=\"hall\"}"),
        "{body}"
    );
    assert_eq!(
        support::http_get(http_port, "/healthz"),
        (200, "ok\n".to_owned())
    );
    assert_eq!(support::http_get(http_port, "/nope").0, 404);

    // The source down past health_timeout_s: /healthz fails and says why; the
    // watchdog keeps pinging (a restart would not bring the broker back).
    broker.stop();
    let pings = count("WATCHDOG=1");
    wait_until(MIN, "healthz 503", || {
        support::http_get(http_port, "/healthz").0 == 503
    });
    let (_, why) = support::http_get(http_port, "/healthz");
    assert!(why.contains("source down for"), "{why}");
    wait_until(MIN, "pings while the source is down", || {
        count("WATCHDOG=1") >= pings + 3
    });
    broker.restart();
    wait_until(2 * MIN, "healthz back to 200", || {
        support::http_get(http_port, "/healthz").0 == 200
    });

    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    reader.join().unwrap();
    assert_eq!(count("STOPPING=1"), 1);
    let n = notes.lock().unwrap();
    assert!(n[0].contains("READY=1"), "{n:?}");
}
