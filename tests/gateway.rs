//! `tidemark run` against real mosquitto processes: shapes of every output,
//! equality with `replay`, acks after commit under kill -9, broker restarts,
//! an upstream outage, graceful stop.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::{
    Collector, Gateway, Mosquitto, Publisher, final_windows, now_ms, retained, wait_until,
};

const MIN: Duration = Duration::from_secs(60);

fn write_config(
    dir: &Path,
    source: &Mosquitto,
    sink: &Mosquitto,
    extra: &str,
) -> std::path::PathBuf {
    let path = dir.join("gateway.toml");
    let text = format!(
        "[gateway]\nid = \"gw\"\nstate_dir = \"{state}\"\n\
         [source]\nurl = \"{src}\"\nclient_id = \"gw-in-{sp}\"\n\
         [sink]\nurl = \"{snk}\"\nclient_id = \"gw-out-{kp}\"\n\
         [metrics]\ninterval_s = 1\n{extra}",
        state = dir.join("state").display(),
        src = source.url(),
        sp = source.port,
        snk = sink.url(),
        kp = sink.port,
    );
    std::fs::write(&path, text).expect("config");
    path
}

fn reading(ts: i64, seq: u64, temp: f64) -> Vec<u8> {
    format!(r#"{{"ts": {ts}, "seq": {seq}, "temp": {temp}, "hum": 40}}"#).into_bytes()
}

const DEVICE_POLICY: &str = "[time]\npolicy = \"device\"\n\
    [group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 10000 }\n\
    out_of_orderness_ms = 0\nidle_timeout_ms = 1500\nheartbeat_timeout_ms = 20000\n\
    allowed_lateness_ms = 5000\n";

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
    // d2 comes back.
    send(
        &mut publisher,
        "sensors/hall/d2/reading",
        reading(base + 45_100, 10, 31.0),
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
                .any(|s| s.json()["start"] == base + 40_000)
            && up
                .on("/windows/hall/d1")
                .iter()
                .any(|s| s.json()["start"] == base + 30_000)
    });

    // Shapes (SPEC §8).
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
        // One record per 100 ms; the late one and d2's return come 5 s after the rest.
        let arrival = base + 60_000 + i as i64 * 100 + if i + 2 >= n { 5_000 } else { 0 };
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
    let replayed = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["replay", "--config"])
        .arg(&config)
        .arg("--input")
        .arg(&capture)
        .args(["--drain-ms", "600000"])
        .output()
        .expect("replay");
    assert_eq!(
        replayed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    let replay_seen: Vec<support::Seen> = String::from_utf8_lossy(&replayed.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("line");
            support::Seen {
                topic: v["topic"].as_str().unwrap_or("").to_string(),
                payload: serde_json::to_vec(&v["payload"]).expect("payload"),
                retain: v["retain"].as_bool().unwrap_or(false),
            }
        })
        .collect();
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
