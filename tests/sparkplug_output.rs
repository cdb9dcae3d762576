//! tidemark as a Sparkplug B edge node (docs/reference.md#sink--the-upstream-broker), seen by a host application
//! nobody here wrote the decoder of: tests/sparkplug/host.js on Eclipse Tahu's
//! payload library, which checks the edge-node rules of Sparkplug 3.0 on every
//! message, a stock mosquitto between it and `tidemark run`.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use support::fleet::{FLEET, Fleet, MIN, counted, wait_counted, write_config};
use support::node::NodeScript;
use support::*;

/// The host application process.
struct Host(NodeScript);

impl Host {
    fn start(port: u16, node: &str, host_id: &str) -> Self {
        let args = [
            format!("mqtt://127.0.0.1:{port}"),
            "tidemark".into(),
            node.into(),
            host_id.into(),
        ];
        let h = Self(NodeScript::start("host.js", &args, "sparkplug-payload"));
        wait_until(MIN, "host application subscribed", || h.count("ready") > 0);
        if !host_id.is_empty() {
            wait_until(MIN, "host STATE online", || h.count("done") > 0);
        }
        h
    }

    fn of(&self, ev: &str) -> Vec<Value> {
        self.0.with("ev", ev)
    }

    fn count(&self, ev: &str) -> usize {
        self.of(ev).len()
    }

    fn op(&mut self, op: &str) {
        let before = self.count("done");
        self.0.send(&json!({ "op": op }));
        wait_until(MIN, "host op done", || self.count("done") > before);
    }

    fn violations(&self) -> Vec<Value> {
        self.of("violation")
    }
}

/// A plain result as the DDATA metrics should carry it.
fn expected(w: &Value) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for k in ["count", "heartbeats", "start", "revision"] {
        m.insert(format!("window/{k}"), w[k].as_f64().unwrap());
    }
    for (field, s) in w["metrics"].as_object().unwrap() {
        for k in ["mean", "min", "max", "sum", "count", "first", "last"] {
            m.insert(format!("{field}/{k}"), s[k].as_f64().unwrap());
        }
    }
    m
}

fn ddata_key(d: &Value) -> String {
    let m = &d["m"];
    format!(
        "{} {} {}",
        d["device"].as_str().unwrap(),
        m["window/start"],
        m["window/revision"]
    )
}

fn got(d: &Value) -> BTreeMap<String, f64> {
    d["m"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
        .collect()
}

#[test]
#[allow(clippy::too_many_lines, clippy::cast_precision_loss)]
fn results_reach_a_primary_host_once_each_held_while_it_is_away_and_the_session_survives_a_kill() {
    let broker = Mosquitto::stock();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &broker,
        &broker,
        &format!(
            "{FLEET}[sink.sparkplug]\nenabled = true\ngroup_id = \"tidemark\"\nprimary_host_id = \"scada\"\n"
        ),
    );
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/windows/#", "spb-plain");
    let spb = Collector::start(broker.port, "spBv1.0/tidemark/#", "spb-early");
    // The gateway first: connected, it waits for the primary host's STATE before NBIRTH.
    let gw = Gateway::start(&config, &log);
    wait_until(MIN, "edge node connected", || {
        gw.log_text().contains("Sparkplug edge node connected")
    });
    let mut publisher = Publisher::connect(broker.port, "spb-fleet");
    let mut fleet = Fleet::new(10, 200);
    fleet.send(&mut publisher, 10);
    publisher.flush();
    // Every result of these readings is out before the host comes: all of them held.
    wait_until(
        MIN,
        "the first readings' results on the plain topics",
        || counted(&up) >= fleet.next,
    );
    assert!(
        spb.all().is_empty(),
        "nothing before the host's STATE: {:?}",
        spb.all()
    );
    let mut host = Host::start(broker.port, "gw", "scada");
    wait_until(MIN, "NBIRTH after the host's STATE", || {
        host.count("NBIRTH") == 1
    });
    let first_bd = host.of("NBIRTH")[0]["bdSeq"].as_u64().unwrap();
    // Node metrics: the counters of P/metrics.
    for name in [
        "bdSeq",
        "Node Control/Rebirth",
        "received",
        "rejected",
        "windows_emitted",
    ] {
        assert!(
            host.of("NBIRTH")[0]["names"]
                .as_array()
                .unwrap()
                .contains(&json!(name)),
            "{name}"
        );
    }
    let first_birth_at = now_ms();

    // The first half live.
    while fleet.next < fleet.total() / 2 {
        fleet.send(&mut publisher, 10);
    }
    publisher.flush();
    wait_until(MIN, "the first half in closed windows", || {
        counted(&up) >= fleet.next
    });
    wait_until(MIN, "live results as DDATA", || {
        host.count("DDATA") == up.on("/windows/").len()
    });
    let before_away = host.count("DDATA");

    // The host goes away for 30 s: the edge node ends its session and holds everything.
    host.op("offline");
    let away = now_ms();
    wait_until(MIN, "NDEATH once the host is offline", || {
        host.count("NDEATH") == 1
    });
    while fleet.send(&mut publisher, 10) {}
    // A late reading of d0's first window: a revision.
    publisher.send(
        "sensors/fleet/d0/reading",
        &support::fleet::reading(fleet.base + 10, 10_000, 5.0),
    );
    publisher.flush();
    let held_from = up.on("/windows/").len();
    wait_until(MIN, "every result on the plain topics meanwhile", || {
        counted_with_revision(&up) && counted(&up) > fleet.total()
    });
    assert!(up.on("/windows/").len() > held_from);
    let left = 30_000 - (now_ms() - away).min(30_000);
    std::thread::sleep(Duration::from_millis(u64::try_from(left).unwrap_or(0)));
    assert_eq!(
        host.count("DDATA"),
        before_away,
        "nothing published while the primary host is offline"
    );
    host.op("online");
    let plain = up.on("/windows/");
    wait_until(MIN, "the held results after the host is back", || {
        host.count("DDATA") >= plain.len()
    });
    // A moment for anything extra to show up (duplicates would be a failure).
    let settled = host.count("DDATA");
    host.op("rebirth");
    wait_until(
        MIN,
        "NBIRTH and every DBIRTH again after NCMD rebirth",
        || host.count("rebirth_complete") == 1,
    );
    assert_eq!(host.of("rebirth_complete")[0]["devices"], 10);
    assert_eq!(host.count("DDATA"), settled);
    // NDATA carries the counters as they move (P/metrics every second here).
    wait_until(MIN, "NDATA with the readings counted", || {
        host.of("NDATA")
            .iter()
            .any(|d| d["m"]["received"].as_u64() >= Some(fleet.total()))
    });

    // Every plain result exactly once as DDATA, same values, the window end as timestamp.
    let ddata = host.of("DDATA");
    // Both come out of the same outbox entries, in its order.
    let keys: Vec<String> = ddata.iter().map(ddata_key).collect();
    let plain_keys: Vec<String> = plain
        .iter()
        .map(|s| {
            let w = s.json();
            format!(
                "fleet:{} {} {}",
                w["device"].as_str().unwrap(),
                w["start"],
                w["revision"]
            )
        })
        .collect();
    assert_eq!(keys, plain_keys, "one DDATA per result, in order");
    for (s, d) in plain.iter().zip(&ddata) {
        let w = s.json();
        assert_eq!(got(d), expected(&w), "{w}");
        assert_eq!(d["stamps"], json!([w["end"]]), "{w}");
    }
    // Held ones historical, in order; the ones published live not (but those made
    // before the host first came, which were held too).
    let early = up
        .on("/windows/")
        .iter()
        .filter(|s| s.at <= first_birth_at)
        .count();
    assert!(early > 0 && early < before_away);
    assert!(ddata[..early].iter().all(|d| d["historical"] == true));
    assert!(
        ddata[early..before_away]
            .iter()
            .all(|d| d["historical"] == false)
    );
    let held = &ddata[before_away..];
    assert!(!held.is_empty());
    assert!(held.iter().all(|d| d["historical"] == true), "{held:?}");
    assert!(
        ddata.iter().any(|d| d["m"]["window/revision"] == 1.0),
        "the revision arrived"
    );

    // kill -9: the broker publishes the NDEATH will with this session's bdSeq; a restart moves it on.
    let bd = host.of("NBIRTH").last().unwrap()["bdSeq"].as_u64().unwrap();
    assert_ne!(bd, first_bd, "the host's absence ended a session");
    gw.kill9();
    wait_until(MIN, "NDEATH will after kill -9", || {
        host.count("NDEATH") == 2
    });
    assert_eq!(host.of("NDEATH")[1]["bdSeq"], bd);
    let gw = Gateway::start(&config, &log);
    wait_until(MIN, "NBIRTH after the restart", || {
        host.of("NBIRTH").last().unwrap()["bdSeq"] != bd
    });
    assert_eq!(
        host.of("NBIRTH").last().unwrap()["bdSeq"],
        json!((bd + 1) % 256)
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    wait_until(MIN, "NDEATH before a deliberate disconnect", || {
        host.count("NDEATH") == 3
    });
    wait_counted(&fleet, &up, &log, MIN);
    assert_eq!(
        counted(&up),
        fleet.total() + 1,
        "every reading once, the late one too"
    );
    let v = host.violations();
    assert!(v.is_empty(), "Sparkplug rules broken: {v:?}");
    let bytes = |n: usize, total: usize| total as f64 / n as f64;
    eprintln!(
        "{} results as DDATA, {} held while the host was away; bytes per result: DDATA {:.0}, plain JSON {:.0}",
        ddata.len(),
        held.len(),
        bytes(
            ddata.len(),
            ddata
                .iter()
                .map(|d| d["bytes"].as_u64().unwrap() as usize)
                .sum()
        ),
        bytes(plain.len(), plain.iter().map(|s| s.payload.len()).sum()),
    );
}

/// The late reading made d0's first window revision 1.
fn counted_with_revision(up: &Collector) -> bool {
    up.on("/windows/").iter().any(|s| s.json()["revision"] == 1)
}

#[test]
fn over_mqtt_3_1_1_in_cbor_without_plain_topics_kill_9_loses_no_result() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &broker,
        &broker,
        &format!(
            "{FLEET}[sink]\nprotocol = \"v311\"\nformat = \"cbor\"\nplain = false\n\
             [sink.sparkplug]\nenabled = true\nedge_node_id = \"edge-7\"\n"
        ),
    );
    let log = dir.path().join("gw.log");
    let plain = Collector::start(broker.port, "tidemark/gw/windows/#", "spb-no-plain");
    let host = Host::start(broker.port, "edge-7", "");
    let mut publisher = Publisher::connect(broker.port, "spb-kill-fleet");
    let mut fleet = Fleet::new(8, 300);
    let mut gw = Gateway::start(&config, &log);
    for round in 1..=2 {
        // Killed once results flow (and the outbox holds some not yet confirmed).
        let target = fleet.total() * round / 3;
        while fleet.next < target {
            fleet.send(&mut publisher, 8);
            std::thread::sleep(Duration::from_millis(5));
        }
        let seen = host.count("DDATA");
        wait_until(MIN, "progress as DDATA", || host.count("DDATA") > seen);
        gw.kill9();
        wait_until(MIN, "NDEATH will", || host.count("NDEATH") as u64 == round);
        gw = Gateway::start(&config, &log);
    }
    while fleet.send(&mut publisher, 8) {}
    publisher.flush();
    let readings = |host: &Host| -> u64 {
        let mut unique = BTreeMap::new();
        for d in host.of("DDATA") {
            let n = d["m"]["window/count"].as_f64().unwrap();
            unique.insert(ddata_key(&d), n);
        }
        unique.values().map(|n| *n as u64).sum()
    };
    wait_or_explain(
        MIN,
        || readings(&host) >= fleet.total(),
        || {
            format!(
                "{} of {} readings as DDATA\n{}",
                readings(&host),
                fleet.total(),
                gw.log_text()
            )
        },
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_eq!(
        readings(&host),
        fleet.total(),
        "every reading once, deduplicated by window"
    );
    assert!(
        plain.all().is_empty(),
        "sink.plain = false: no plain results"
    );
    let bds: Vec<u64> = host
        .of("NBIRTH")
        .iter()
        .map(|b| b["bdSeq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        bds,
        vec![0, 1, 2],
        "one bdSeq per session, kept across kill -9"
    );
    let v = host.violations();
    assert!(v.is_empty(), "Sparkplug rules broken: {v:?}");
}

#[test]
fn a_rebirth_of_more_devices_than_the_link_queues_at_once_arrives_whole() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &broker,
        &broker,
        &format!("{FLEET}[sink.sparkplug]\nenabled = true\n"),
    );
    let log = dir.path().join("gw.log");
    let mut host = Host::start(broker.port, "gw", "");
    let gw = Gateway::start(&config, &log);
    wait_until(MIN, "NBIRTH", || host.count("NBIRTH") == 1);
    // 1 500 devices: a rebirth is 1 501 births, more than the link's request queue (1 024).
    let mut publisher = Publisher::connect(broker.port, "spb-many");
    let mut fleet = Fleet::new(1500, 2);
    while fleet.send(&mut publisher, 100) {}
    publisher.flush();
    wait_until(MIN, "a result of every device as DDATA", || {
        host.count("DDATA") >= 1500
    });
    host.op("rebirth");
    wait_until(MIN, "NBIRTH and every DBIRTH again", || {
        host.count("rebirth_complete") == 1
    });
    assert_eq!(host.of("rebirth_complete")[0]["devices"], 1500);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    let v = host.violations();
    assert!(v.is_empty(), "Sparkplug rules broken: {v:?}");
}
