//! SIGHUP reloads (docs/reference.md#reload-sighup-systemctl-reload-tidemark) of the real binary under a QoS 1 fleet, on stock
//! mosquitto brokers: a window rule change, a topic filter added, lateness and
//! timeouts changed, the sink moved to a second broker, a rejected reload and a
//! restart-only key — same process, every reading counted once, windows of the
//! old and the new rule as docs/reference.md#reload-sighup-systemctl-reload-tidemark says; then the same with a kill -9 right after
//! a reload.

mod support;

use std::time::Duration;

use support::fleet::{MIN, reading};
use support::{
    Collector, Gateway, GatewayConfig, Mosquitto, Publisher, Seen, final_windows, now_ms, signal,
};

const DEVICES: u64 = 4;

struct Site {
    src: Mosquitto,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    log: std::path::PathBuf,
    base: i64,
    protocol: &'static str,
}

impl Site {
    fn new(protocol: &'static str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self {
            src: Mosquitto::stock(),
            config: dir.path().join("gateway.toml"),
            log: dir.path().join("gateway.log"),
            dir,
            // A multiple of every window size here, 30 minutes ago.
            base: (now_ms() - 30 * 60_000) / 60_000 * 60_000,
            protocol,
        }
    }

    /// Writes the config: `window_ms` tumbling windows, `topics`, the sink on `sink`.
    fn write(&self, sink: &Mosquitto, window_ms: i64, topics: &[&str], extra: &str) {
        let topics: Vec<String> = topics.iter().map(|t| format!("\"{t}\"")).collect();
        GatewayConfig::new("gw", &self.dir.path().join("state"), &self.src, sink)
            .set("gateway", "commit_interval_ms = 100")
            .set("source", &format!("protocol = \"{}\"", self.protocol))
            .set("source", &format!("topics = [{}]", topics.join(", ")))
            .set("sink", "client_id = \"gw-out\"")
            .set("time", "policy = \"device\"")
            .set(
                "group_defaults",
                &format!("window = {{ kind = \"tumbling\", size_ms = {window_ms} }}"),
            )
            .set(
                "group_defaults",
                "out_of_orderness_ms = 0\nidle_timeout_ms = 1000\nheartbeat_timeout_ms = 3600000\n\
                 allowed_lateness_ms = 600000",
            )
            .merge("group_defaults", extra)
            .write(&self.config);
    }

    /// Readings `ks` of every device of `group`, 100 ms apart in device time.
    fn send(&self, p: &mut Publisher, group: &str, devices: u64, ks: std::ops::Range<u64>) -> u64 {
        let mut n = 0;
        for k in ks {
            for d in 0..devices {
                let ts = self.base + i64::try_from(k).unwrap_or(0) * 100 + 50;
                p.send(
                    &format!("sensors/{group}/d{d}/reading"),
                    &reading(ts, k, 1.0),
                );
                n += 1;
            }
        }
        n
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn notices(up: &[&Collector], kind: &str) -> Vec<serde_json::Value> {
    up.iter()
        .flat_map(|c| c.on("/alerts"))
        .filter(|s| s.topic == "tidemark/gw/alerts")
        .map(|s| s.json())
        .filter(|v| v["type"] == kind)
        .collect()
}

fn wait_notices(up: &[&Collector], kind: &str, n: usize, site: &Site) -> Vec<serde_json::Value> {
    support::wait_or_explain(
        MIN,
        || notices(up, kind).len() >= n,
        || format!("no {n} {kind} notices\n{}", site.log_text()),
    );
    notices(up, kind)
}

/// The latest `P/metrics` counter `name` seen on any collector.
fn received(up: &[&Collector]) -> u64 {
    up.iter()
        .flat_map(|c| c.on("/metrics"))
        .filter_map(|s| s.json()["counters"]["received"].as_u64())
        .max()
        .unwrap_or(0)
}

fn wait_received(up: &[&Collector], n: u64, site: &Site) {
    support::wait_or_explain(
        MIN,
        || received(up) >= n,
        || format!("received {} of {n}\n{}", received(up), site.log_text()),
    );
}

fn all(up: &[&Collector]) -> Vec<Seen> {
    up.iter().flat_map(|c| c.all()).collect()
}

fn counted(up: &[&Collector]) -> u64 {
    final_windows(&all(up))
        .values()
        .map(|w| w["count"].as_u64().unwrap_or(0))
        .sum()
}

/// Waits until every reading sent is counted upstream, then checks none twice.
fn wait_counted_once(up: &[&Collector], sent: u64, site: &Site) {
    support::wait_or_explain(
        2 * MIN,
        || counted(up) >= sent,
        || format!("counted {} of {sent}\n{}", counted(up), site.log_text()),
    );
    assert_eq!(
        counted(up),
        sent,
        "every reading counted once (ids deduplicated)"
    );
}

/// Window shapes of group `fleet` after a switch from 2 s to 5 s windows at `t`.
fn assert_windows_switch_at(up: &[&Collector], t: i64) {
    let windows = final_windows(&all(up));
    let fleet: Vec<_> = windows.values().filter(|w| w["group"] == "fleet").collect();
    assert!(!fleet.is_empty());
    for w in fleet {
        let (s, e) = (w["start"].as_i64().unwrap(), w["end"].as_i64().unwrap());
        if s < t {
            assert!(e <= t, "old-rule window {w} crosses the switch at {t}");
            assert!(e - s == 2000 || e == t, "old-rule window {w}");
        } else {
            assert_eq!((e - s, s % 5000), (5000, 0), "new-rule window {w}");
        }
    }
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
fn reloads_apply_in_place(protocol: &'static str) {
    let site = Site::new(protocol);
    let (up1, up2) = (Mosquitto::stock(), Mosquitto::stock());
    let c1 = Collector::start(up1.port, "tidemark/#", "up1");
    let c2 = Collector::start(up2.port, "tidemark/#", "up2");
    let ups = [&c1, &c2];
    site.write(&up1, 2000, &["sensors/fleet/+/+"], "");
    let mut gw = Gateway::start(&site.config, &site.log);
    let pid = gw.child.id();
    let mut p = Publisher::connect(site.src.port, &format!("fleet-{protocol}"));

    let mut sent = site.send(&mut p, "fleet", DEVICES, 0..30);
    p.flush();
    wait_received(&ups, sent, &site);
    let status = |c: &Collector| -> Option<serde_json::Value> {
        c.on("tidemark/gw/status").last().map(Seen::json)
    };
    let first_hash = status(&c1).expect("status")["config_hash"].clone();

    // 1: a window rule, a topic filter, lateness and timeouts.
    site.write(
        &up1,
        5000,
        &["sensors/fleet/+/+", "sensors/extra/+/+"],
        "[groups.fleet]\nallowed_lateness_ms = 500000\nidle_timeout_ms = 1200\n",
    );
    signal(&gw.child, "HUP");
    let applied = wait_notices(&ups, "config_applied", 1, &site);
    let changed: Vec<&str> = applied[0]["changed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for k in [
        "group_defaults.window",
        "groups.fleet.window",
        "groups.fleet.allowed_lateness_ms",
        "groups.fleet.idle_timeout_ms",
        "source.topics",
    ] {
        assert!(changed.contains(&k), "{k} in {changed:?}");
    }
    let hash = applied[0]["hash"].clone();
    assert_ne!(hash, first_hash);
    support::wait_until(MIN, "status with the new hash", || {
        status(&c1).is_some_and(|s| s["config_hash"] == hash)
    });
    sent += site.send(&mut p, "fleet", DEVICES, 30..60);
    // The added filter: subscribed on the same session.
    sent += site.send(&mut p, "extra", 2, 0..30);
    p.flush();
    wait_received(&ups, sent, &site);

    // 2: the sink moves to a second broker.
    site.write(
        &up2,
        5000,
        &["sensors/fleet/+/+", "sensors/extra/+/+"],
        "[groups.fleet]\nallowed_lateness_ms = 500000\nidle_timeout_ms = 1200\n",
    );
    let good = std::fs::read_to_string(&site.config).unwrap();
    signal(&gw.child, "HUP");
    let applied = wait_notices(&[&c2], "config_applied", 1, &site);
    assert_eq!(applied[0]["changed"], serde_json::json!(["sink.url"]));
    sent += site.send(&mut p, "fleet", DEVICES, 60..90);
    p.flush();

    // 3: an unknown key; 4: a restart-only key. Neither changes anything.
    std::fs::write(&site.config, format!("{good}[log]\nbogus = 1\n")).unwrap();
    signal(&gw.child, "HUP");
    let rejected = wait_notices(&[&c2], "config_rejected", 1, &site);
    assert!(
        rejected[0]["errors"].to_string().contains("bogus"),
        "{}",
        rejected[0]
    );
    std::fs::write(&site.config, good.replace("id = \"gw\"", "id = \"gw2\"")).unwrap();
    signal(&gw.child, "HUP");
    let rejected = wait_notices(&[&c2], "config_rejected", 2, &site);
    assert!(
        rejected[1]["errors"]
            .to_string()
            .contains("gateway.id: needs a restart"),
        "{}",
        rejected[1]
    );
    // A reload that changes nothing is applied with nothing changed.
    std::fs::write(&site.config, &good).unwrap();
    signal(&gw.child, "HUP");
    let same = wait_notices(&[&c2], "config_applied", 2, &site);
    assert_eq!(same[1]["changed"], serde_json::json!([]));
    assert_eq!(same[1]["hash"], applied[0]["hash"]);

    wait_counted_once(&ups, sent, &site);
    // The latest event at the first reload was at +2.95 s: its 2 s window ends at +4 s,
    // and the first 5 s boundary at or after that is +5 s.
    assert_windows_switch_at(&ups, site.base + 5000);
    let everything = all(&ups);
    assert!(
        everything.iter().all(|s| !s.topic.contains("/late/")),
        "late output"
    );
    assert!(
        everything
            .iter()
            .filter(|s| s.topic.starts_with("tidemark/gw/alerts/"))
            .all(|s| s.json()["type"] != "offline"),
        "offline alert"
    );
    assert!(
        matches!(gw.child.try_wait(), Ok(None)),
        "the gateway is running"
    );
    assert_eq!(gw.child.id(), pid);
    let log = site.log_text();
    assert_eq!(
        log.matches("tidemark running").count(),
        1,
        "one start\n{log}"
    );
    // /metrics-side numbers on P/metrics: the hash and the reload counters.
    let last = c2.on("tidemark/gw/metrics").last().map(Seen::json).unwrap();
    assert_eq!(last["config_hash"], applied[0]["hash"]);
    assert_eq!(
        last["reloads"],
        serde_json::json!({"applied": 3, "rejected": 2})
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn reloads_apply_in_place_under_a_v5_source() {
    reloads_apply_in_place("v5");
}

#[test]
fn reloads_apply_in_place_under_a_v311_source() {
    reloads_apply_in_place("v311");
}

#[test]
fn a_kill_right_after_a_window_rule_reload_counts_every_reading_once_under_its_rule() {
    let site = Site::new("v5");
    let up = Mosquitto::stock();
    let c = Collector::start(up.port, "tidemark/#", "up");
    let ups = [&c];
    site.write(&up, 2000, &["sensors/fleet/+/+"], "");
    let gw = Gateway::start(&site.config, &site.log);
    let mut p = Publisher::connect(site.src.port, "fleet-kill");
    let mut sent = site.send(&mut p, "fleet", DEVICES, 0..30);
    p.flush();
    wait_received(&ups, sent, &site);
    site.write(&up, 5000, &["sensors/fleet/+/+"], "");
    signal(&gw.child, "HUP");
    // The notice follows the reload into the core's queue: what is sent now comes after it.
    wait_notices(&ups, "config_applied", 1, &site);
    // Readings on their way, and the reload perhaps not yet committed, when the gateway dies.
    sent += site.send(&mut p, "fleet", DEVICES, 30..60);
    std::thread::sleep(Duration::from_millis(20));
    gw.kill9();
    p.flush();
    let gw = Gateway::start(&site.config, &site.log);
    sent += site.send(&mut p, "fleet", DEVICES, 60..90);
    p.flush();
    wait_counted_once(&ups, sent, &site);
    assert_windows_switch_at(&ups, site.base + 5000);
    assert!(
        all(&ups).iter().all(|s| !s.topic.contains("/late/")),
        "late output"
    );
    let _ = gw.terminate();
}
