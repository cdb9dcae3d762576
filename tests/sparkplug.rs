//! Sparkplug B against the reference implementation (docs/reference.md#sparkplug--sparkplug-b-30-ingest): Eclipse
//! Tahu's Node.js client (npm `sparkplug-client`, tests/sparkplug/edge.js) as
//! the edge node, a stock mosquitto between it and `tidemark run`.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::node::NodeScript;
use support::*;

const WAIT: Duration = Duration::from_secs(30);

/// The Tahu edge node process.
struct Edge(NodeScript);

impl Edge {
    fn start(port: u16, group: &str, node: &str) -> Self {
        let args = [
            format!("mqtt://127.0.0.1:{port}"),
            group.into(),
            node.into(),
        ];
        let e = Self(NodeScript::start("edge.js", &args, "sparkplug-client"));
        wait_until(WAIT, "Tahu edge node connected", || {
            e.count("connected") > 0
        });
        e
    }

    fn count(&self, event: &str) -> usize {
        self.0.with("event", event).len()
    }

    /// Sends one op and waits until the client has published it; returns its "done" event.
    fn op(&mut self, op: Value) -> Value {
        let before = self.count("done");
        self.0.send(&op);
        wait_until(WAIT, "edge op done", || self.count("done") > before);
        self.0.with("event", "done")[before].clone()
    }
}

/// Messages on exactly `P/{what}`.
fn on(out: &Collector, what: &str) -> Vec<Seen> {
    out.all()
        .into_iter()
        .filter(|s| s.topic == format!("tidemark/gw/{what}"))
        .collect()
}

fn alerts(out: &Collector, device: &str, kind: &str) -> usize {
    on(out, &format!("alerts/plant/{device}"))
        .iter()
        .filter(|s| s.json()["type"] == kind)
        .count()
}

#[test]
#[allow(clippy::too_many_lines, clippy::cast_precision_loss)]
fn a_tahu_edge_node_births_data_deaths_and_rebirths_through_tidemark() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::stock();
    let http = free_port();
    let cfg = gateway_config(
        dir.path(),
        &dir.path().join("state"),
        broker.port,
        &broker,
        http,
        "",
        "[group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 2000 }\n\
         out_of_orderness_ms = 300\nidle_timeout_ms = 5000\nallowed_lateness_ms = 1000\n\
         heartbeat_timeout_ms = 3600000\n\
         [sparkplug]\nenabled = true\nhost_id = \"tidemark-host\"\nrebirth = true\n",
    );
    let gw = Gateway::start(&cfg, &dir.path().join("gateway.log"));
    let out = Collector::start(broker.port, "tidemark/gw/#", "sparkplug-collector");

    // The gateway as Primary Host Application: a retained STATE birth.
    let state = retained(broker.port, "spBv1.0/STATE/tidemark-host");
    assert_eq!(state.len(), 1, "{state:?}");
    assert!(state[0].retain);
    assert_eq!(state[0].json()["online"], true);

    let mut edge = Edge::start(broker.port, "plant", "edge1");
    edge.op(json!({"op": "nbirth", "metrics": [
        {"name": "Temperature", "alias": 1, "type": "Double", "value": 20.0}
    ]}));
    edge.op(json!({"op": "dbirth", "device": "press", "metrics": [
        {"name": "Pressure", "alias": 2, "type": "Float", "value": 1.0},
        {"name": "Running", "alias": 3, "type": "Boolean", "value": true},
        {"name": "Label", "alias": 4, "type": "String", "value": "line 1"}
    ]}));
    // Births make both known and online before any reading.
    wait_until(WAIT, "retained online status of both", || {
        on(&out, "status/plant/edge1").len() == 1 && on(&out, "status/plant/edge1.press").len() == 1
    });

    // Data by alias only, each metric with its own timestamp.
    let (mut n_press, mut sum_press, mut n_temp, mut sum_temp) = (0u64, 0.0f64, 0u64, 0.0f64);
    let mut data = |edge: &mut Edge, k: u64| {
        let v = k as f64 * 0.5;
        edge.op(json!({"op": "ddata", "device": "press", "metrics": [
            {"alias": 2, "type": "Float", "value": v, "dt": -20},
            {"alias": 3, "type": "Boolean", "value": k.is_multiple_of(2), "dt": -20},
            {"alias": 4, "type": "String", "value": "x", "dt": -20}
        ]}));
        edge.op(json!({"op": "ndata", "metrics": [
            {"alias": 1, "type": "Double", "value": 20.0 + v, "dt": -10}
        ]}));
        n_press += 1;
        sum_press += v;
        n_temp += 1;
        sum_temp += 20.0 + v;
        // The fleet's pace, not a timing assertion.
        std::thread::sleep(Duration::from_millis(50));
    };
    for k in 0..40 {
        data(&mut edge, k);
    }
    // A lost message: the seq gap is counted and a rebirth requested; the client rebirths.
    edge.op(json!({"op": "skip"}));
    data(&mut edge, 40);
    wait_until(WAIT, "rebirth NCMD reached the edge node", || {
        edge.count("ncmd") > 0
    });
    wait_until(WAIT, "readings_missing counted", || {
        total(&metrics(http), "tidemark_readings_missing_total") == 1
    });
    for k in 41..60 {
        data(&mut edge, k);
    }
    // An alias no birth defined: rejected, naming it.
    edge.op(json!({"op": "ddata", "device": "press", "metrics": [
        {"alias": 99, "type": "Float", "value": 1.0, "dt": 0}
    ]}));
    wait_until(WAIT, "unknown alias rejected", || {
        out.on("/rejected").iter().any(|s| {
            let v = s.json();
            v["reason"] == "decode_error" && v["detail"].as_str().unwrap_or("").contains("alias 99")
        })
    });

    // DDEATH: the device offline at once (heartbeat_timeout_ms is an hour).
    edge.op(json!({"op": "ddeath", "device": "press"}));
    wait_until(WAIT, "press offline", || {
        alerts(&out, "edge1.press", "offline") == 1
    });
    assert_eq!(alerts(&out, "edge1", "offline"), 0);
    // The client process killed: the broker publishes its NDEATH (the will).
    let mut child = edge;
    child.0.kill();
    wait_until(WAIT, "edge node offline by its NDEATH", || {
        alerts(&out, "edge1", "offline") == 1
    });
    let status = |d: &str| {
        on(&out, &format!("status/plant/{d}"))
            .last()
            .map(|s| String::from_utf8_lossy(&s.payload).to_string())
    };
    assert_eq!(status("edge1").as_deref(), Some("\"offline\""));
    assert_eq!(status("edge1.press").as_deref(), Some("\"offline\""));

    // Both idle at once: every window closes, with exactly what the client sent.
    let sent = n_press + n_temp;
    wait_until(WAIT, "every reading in a closed window", || {
        window_readings(&out.all()) >= sent
    });
    let windows = final_windows(&out.all());
    let sum = |device: &str, metric: &str| -> (u64, f64) {
        windows
            .values()
            .filter(|w| w["device"] == device)
            .fold((0, 0.0), |(n, s), w| {
                (
                    n + w["count"].as_u64().unwrap(),
                    s + w["metrics"][metric]["sum"].as_f64().unwrap_or(0.0),
                )
            })
    };
    let (n, s) = sum("edge1.press", "Pressure");
    assert_eq!(n, n_press);
    assert!((s - sum_press).abs() < 1e-6, "{s} vs {sum_press}");
    let (n, s) = sum("edge1", "Temperature");
    assert_eq!(n, n_temp);
    assert!((s - sum_temp).abs() < 1e-6, "{s} vs {sum_temp}");
    let running: f64 = windows
        .values()
        .filter(|w| w["device"] == "edge1.press")
        .map(|w| w["metrics"]["Running"]["sum"].as_f64().unwrap())
        .sum();
    assert_eq!(running, 30.0, "Boolean true counts 1");
    assert!(
        windows
            .values()
            .all(|w| w["metrics"].get("Label").is_none())
    );
    let m = metrics(http);
    assert_eq!(total(&m, "tidemark_sparkplug_metrics_other_total"), n_press);
    assert!(out.on("/late").is_empty());
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    // Its will: the host STATE goes offline.
    let state = retained(broker.port, "spBv1.0/STATE/tidemark-host");
    assert_eq!(state[0].json()["online"], false, "{state:?}");
}

fn window_key(w: &Value) -> String {
    format!(
        "{} {} {} {}",
        w["count"],
        w["metrics"]["temp"]["sum"],
        w["metrics"]["hum"]["count"],
        w["metrics"]["temp"]["last"]
    )
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn a_simulated_sparkplug_fleet_is_aggregated_live_and_its_capture_replays_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(false);
    let http = free_port();
    let extra = "[group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 2000 }\n\
         out_of_orderness_ms = 500\nidle_timeout_ms = 3000\nallowed_lateness_ms = 2000\n\
         heartbeat_timeout_ms = 3600000\n[sparkplug]\nenabled = true\n\
         [time]\npolicy = \"device\"\n";
    let cfg = gateway_config(
        dir.path(),
        &dir.path().join("state"),
        broker.port,
        &broker,
        http,
        "",
        extra,
    );
    let gw = Gateway::start(&cfg, &dir.path().join("gateway.log"));
    let out = Collector::start(broker.port, "tidemark/gw/#", "sp-sim-collector");
    let capture_file = dir.path().join("capture.jsonl");
    let mut capture = support::tidemark()
        .args([
            "capture",
            "--url",
            &broker.url(),
            "--topic",
            "spBv1.0/#",
            "--output",
        ])
        .arg(&capture_file)
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(dir.path().join("capture.log")).unwrap())
        .spawn()
        .expect("capture");
    wait_until(WAIT, "capture subscribed", || {
        std::fs::read_to_string(dir.path().join("capture.log"))
            .unwrap_or_default()
            .contains("capture subscribed")
    });
    // 8 devices on 2 edge nodes, clocks up to 2 min off, 5 % redelivered. Device time
    // (not calibrated: `capture` stamps arrivals on its own receipt, not the gateway's),
    // so live and replayed windows must agree exactly.
    let sim = support::tidemark()
        .args([
            "simulate",
            "--url",
            &broker.url(),
            "--sparkplug",
            "--devices",
            "8",
            "--rate",
            "80",
            "--count",
            "600",
            "--skew-ms",
            "120000",
            "--duplicates",
            "0.05",
            "--qos",
            "1",
            "--seed",
            "4",
            "--quiet",
        ])
        .output()
        .expect("simulate");
    assert_eq!(
        sim.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
    let summary: Value = serde_json::from_slice(&sim.stdout).expect("summary");
    let t = &summary["messages"];
    let readings = t["readings"].as_u64().unwrap();
    assert!(t["births"].as_u64().unwrap() >= 10, "{t}");
    wait_until(WAIT, "every simulated reading in a closed window", || {
        window_readings(&out.all()) >= readings
    });
    let m = metrics(http);
    assert_eq!(
        total(&m, "tidemark_duplicates_total"),
        t["duplicates"].as_u64().unwrap()
    );
    assert_eq!(total(&m, "tidemark_readings_missing_total"), 0);
    assert_eq!(
        total(&m, "tidemark_sparkplug_metrics_other_total"),
        readings
    );
    assert_eq!(window_readings(&out.all()), readings);
    // simulate ends with each edge node's NDEATH: offline at once, not after heartbeat_timeout_ms.
    assert_eq!(t["deaths"].as_u64(), Some(2), "{t}");
    wait_until(WAIT, "both edge nodes offline after their NDEATH", || {
        let gone: std::collections::BTreeSet<String> = out
            .on("/alerts/")
            .iter()
            .map(|s| s.json())
            .filter(|a| a["type"] == "offline")
            .filter_map(|a| a["device"].as_str().map(str::to_owned))
            .collect();
        gone.contains("edge000") && gone.contains("edge001")
    });
    let live: std::collections::BTreeMap<String, String> = final_windows(&out.all())
        .into_iter()
        .map(|(k, w)| (k, window_key(&w)))
        .collect();
    gw.terminate();
    let _ = capture.kill();
    let _ = capture.wait();

    // The capture (payload_b64) through `replay`: the same window results.
    assert!(
        std::fs::read_to_string(&capture_file)
            .unwrap()
            .contains("payload_b64")
    );
    let offline: std::collections::BTreeMap<String, String> =
        final_windows(&replay(&cfg, &capture_file, 60_000))
            .into_iter()
            .map(|(k, w)| (k, window_key(&w)))
            .collect();
    assert_eq!(live, offline);
}
