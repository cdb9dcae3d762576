//! `tidemark run` under faults, counted exactly: kill -9 at moments of progress,
//! a graceful stop, the gateway in-process, site-broker restarts, an upstream
//! outage, MQTT 3.1.1 sessions.
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::fleet::*;
use support::{Collector, Gateway, Mosquitto, Publisher, retained, wait_until};

#[test]
fn kill_9_at_moments_of_progress_loses_and_double_counts_nothing() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/windows/#", "kill-collector");
    let mut publisher = Publisher::connect(broker.port, "kill-fleet");
    let mut fleet = Fleet::new(20, 400);
    let mut gw = Gateway::start(&config, &log);
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut kills = 0;
    let mut more = true;
    while kills < 12 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Kill after the fleet moved on by a random share and the gateway delivered something new.
        let step = fleet.total() / 24 + rng % (fleet.total() / 24);
        let windows_before = up.all().len();
        let target = fleet.next + step;
        while more && fleet.next < target {
            more = fleet.send(&mut publisher, 20);
            std::thread::sleep(Duration::from_millis(10));
        }
        wait_until(MIN, "progress upstream since the restart", || {
            up.all().len() > windows_before
        });
        gw.kill9();
        kills += 1;
        gw = Gateway::start(&config, &log);
    }
    while fleet.send(&mut publisher, 20) {}
    publisher.flush();
    wait_counted(&fleet, &up, &log, 2 * MIN);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
    eprintln!("{kills} kill -9 rounds over {} readings", fleet.total());
}

#[test]
fn graceful_stop_exits_promptly_goes_offline_and_resumes_exactly() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/windows/#", "stop-collector");
    let mut publisher = Publisher::connect(broker.port, "stop-fleet");
    let mut fleet = Fleet::new(10, 400);
    let gw = Gateway::start(&config, &log);
    // Stop in the middle of the stream.
    while fleet.next < fleet.total() / 2 {
        fleet.send(&mut publisher, 10);
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_until(MIN, "first results", || !up.all().is_empty());
    let (code, took) = gw.terminate();
    assert_eq!(
        code,
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(took < Duration::from_secs(5), "stop took {took:?}");
    let status = retained(broker.port, "tidemark/gw/status");
    assert_eq!(status.len(), 1, "{status:?}");
    assert_eq!(status[0].json()["state"], "offline");
    assert!(status[0].retain);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("stopped"), "{text}");
    // The rest while it is down, then a new start.
    while fleet.send(&mut publisher, 10) {}
    publisher.flush();
    let gw = Gateway::start(&config, &log);
    wait_counted(&fleet, &up, &log, 2 * MIN);
    let status = retained(broker.port, "tidemark/gw/status");
    assert_eq!(status[0].json()["state"], "online");
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
}

/// `run::serve` on a runtime of this test's own, stopped by a channel instead of a signal.
fn serve_in_process(
    cfg: &tidemark::config::Config,
) -> (
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<Result<(), tidemark::run::RunError>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cfg = cfg.clone();
    let gateway = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        // No reloads: the sender is dropped, so the stream ends at once.
        let (_, hangups) = tokio::sync::mpsc::unbounded_channel();
        rt.block_on(tidemark::run::serve(
            &cfg,
            tidemark::run::ReloadOptions::default(),
            tidemark::sys::clock::SystemClock::new(),
            async {
                let _ = stopped.await;
            },
            hangups,
        ))
    });
    (stop, gateway)
}

#[test]
fn serve_in_process_stops_on_its_shutdown_future_and_resumes_exactly() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let http = support::free_port();
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text.replace(
        "[metrics]\n",
        &format!("[metrics]\nlisten = \"127.0.0.1:{http}\"\n"),
    );
    std::fs::write(&config, text).expect("config");
    let cfg = tidemark::config::load(&[config]).expect("config");
    let up = Collector::start(broker.port, "tidemark/gw/#", "serve-collector");
    let mut publisher = Publisher::connect(broker.port, "serve-fleet");
    let mut fleet = Fleet::new(5, 400);
    let (stop, gateway) = serve_in_process(&cfg);
    wait_until(MIN, "/readyz", || support::ready(http));
    while fleet.next < fleet.total() / 2 {
        fleet.send(&mut publisher, 10);
    }
    wait_until(MIN, "first results", || !up.on("/windows/").is_empty());
    stop.send(()).expect("gateway running");
    gateway
        .join()
        .expect("gateway thread")
        .expect("serve returns Ok");
    assert_eq!(
        retained(broker.port, "tidemark/gw/status")[0].json()["state"],
        "offline"
    );
    // The rest while it is stopped, then the same state dir again.
    while fleet.send(&mut publisher, 10) {}
    publisher.flush();
    let (stop, gateway) = serve_in_process(&cfg);
    wait_until(MIN, "/readyz", || support::ready(http));
    wait_counted(&fleet, &up, &dir.path().join("no-log"), 2 * MIN);
    stop.send(()).expect("gateway running");
    gateway
        .join()
        .expect("gateway thread")
        .expect("serve returns Ok");
    assert_exact(&fleet, &up);
}

#[test]
fn source_broker_restart_mid_stream_loses_no_acknowledged_message() {
    let source = Mosquitto::start(true);
    let mut source = source;
    let upstream = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &source, &upstream, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(upstream.port, "tidemark/gw/windows/#", "restart-collector");
    let mut fleet = Fleet::new(10, 600);
    let gw = Gateway::start(&config, &log);
    let mut publisher = Publisher::connect(source.port, "restart-fleet");
    while fleet.next < fleet.total() / 2 {
        fleet.send(&mut publisher, 50);
        std::thread::sleep(Duration::from_millis(5));
    }
    // Restart while the fleet publishes and the gateway works through its queue.
    source.restart();
    while fleet.send(&mut publisher, 50) {
        std::thread::sleep(Duration::from_millis(5));
    }
    publisher.flush();
    wait_counted(&fleet, &up, &log, 2 * MIN);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("source disconnected"), "{text}");
    assert!(text.matches("source connected").count() >= 2, "{text}");
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
}

#[test]
fn upstream_outage_of_30_s_under_load_delivers_everything_in_order() {
    let source = Mosquitto::start(false);
    let mut upstream = Mosquitto::start(true);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &source, &upstream, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(upstream.port, "tidemark/gw/windows/#", "outage-collector");
    let mut publisher = Publisher::connect(source.port, "outage-fleet");
    let mut fleet = Fleet::new(10, 3000);
    let gw = Gateway::start(&config, &log);
    while fleet.next < fleet.total() / 10 {
        fleet.send(&mut publisher, 10);
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_until(MIN, "first results", || !up.all().is_empty());
    upstream.stop();
    // 30 s of load while the uplink is down.
    let per_tick = (fleet.total() * 8 / 10) / 3000;
    for _ in 0..3000 {
        fleet.send(&mut publisher, per_tick.max(1));
        std::thread::sleep(Duration::from_millis(10));
    }
    upstream.restart();
    while fleet.send(&mut publisher, 50) {}
    publisher.flush();
    wait_counted(&fleet, &up, &log, 3 * MIN);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    // Ingest went on during the outage: the outbox grew while the sink was down.
    let max_depth = text
        .lines()
        .filter(|l| l.contains("sink disconnected"))
        .filter_map(|l| l.split("outbox_depth=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    assert!(
        max_depth > 100,
        "outbox depth during the outage: {max_depth}\n{text}"
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
    // Per-topic order: first deliveries of each device's results come in window order.
    let mut last: BTreeMap<String, (i64, u64)> = BTreeMap::new();
    let mut seen_ids = std::collections::BTreeSet::new();
    for s in up.all() {
        let v = s.json();
        if !seen_ids.insert(v["id"].as_str().unwrap_or("").to_string()) {
            continue;
        }
        let key = (
            v["start"].as_i64().unwrap_or(0),
            v["revision"].as_u64().unwrap_or(0),
        );
        if let Some(prev) = last.insert(s.topic.clone(), key) {
            assert!(prev < key, "{}: {prev:?} then {key:?}", s.topic);
        }
    }
}

#[test]
fn mqtt_3_1_1_links_resume_the_session_and_count_exactly() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text
        .replace("[source]\n", "[source]\nprotocol = \"v311\"\n")
        .replace("[sink]\n", "[sink]\nprotocol = \"v311\"\n");
    std::fs::write(&config, text).expect("config");
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/windows/#", "v311-collector");
    let mut publisher = Publisher::connect(broker.port, "v311-fleet");
    let mut fleet = Fleet::new(5, 200);
    let gw = Gateway::start(&config, &log);
    fleet.send(&mut publisher, fleet.total() / 2);
    publisher.flush();
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    while fleet.send(&mut publisher, 100) {}
    publisher.flush();
    let gw = Gateway::start(&config, &log);
    assert!(
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("session resumed")
    );
    wait_counted(&fleet, &up, &log, 2 * MIN);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
}

/// A stock mosquitto upstream takes 20 unacknowledged publishes from an MQTT 5 client
/// (its Receive Maximum): a burst of 3 000 results reaches it exactly, the uplink's
/// window narrowed to that limit, which the log reports.
#[test]
fn a_burst_of_results_drains_to_a_stock_upstream_within_its_receive_maximum() {
    let source = Mosquitto::start(false);
    let upstream = Mosquitto::stock();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &source, &upstream, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(upstream.port, "tidemark/gw/windows/#", "stock-up-collector");
    let mut publisher = Publisher::connect(source.port, "stock-up-fleet");
    // 300 devices x 200 readings, 20 to a window: 3 000 results in a few seconds.
    let mut fleet = Fleet::new(300, 200);
    let gw = Gateway::start(&config, &log);
    while fleet.send(&mut publisher, 100) {}
    publisher.flush();
    wait_counted(&fleet, &up, &log, MIN);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("broker_receive_maximum=20"),
        "the broker's limit is reported at connect:\n{text}"
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
}

#[test]
fn sigterm_during_an_outage_of_both_brokers_stops_at_once_with_nothing_pending() {
    let mut broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let log = dir.path().join("gw.log");
    let gw = Gateway::start(&config, &log);
    broker.kill();
    support::wait_or_explain(
        MIN,
        || {
            let l = gw.log_text();
            l.contains("source disconnected") && l.contains("sink disconnected")
        },
        || gw.log_text(),
    );
    // Deep into the sink's reconnect backoff: its sixth wait is 4.8-8 s, longer than
    // the whole stop may take.
    support::wait_or_explain(
        MIN,
        || gw.log_text().matches("sink disconnected").count() >= 6,
        || gw.log_text(),
    );
    let (code, took) = gw.terminate();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        !text.contains("shutdown took too long"),
        "stop took {took:?}\n{text}"
    );
}

#[test]
fn inspect_points_to_status_while_the_gateway_runs_and_reads_plainly_after() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let log = dir.path().join("gw.log");
    let gw = Gateway::start(&config, &log);
    let up = Collector::start(broker.port, "tidemark/#", "inspect-up");
    let mut p = Publisher::connect(broker.port, "inspect-fleet");
    p.send(
        "sensors/fleet/d0/reading",
        &reading(support::now_ms(), 1, 1.0),
    );
    p.send("sensors/fleet/d0/bogus", b"{}");
    p.flush();
    // Both taken and committed: the rejection is published after its commit.
    wait_until(MIN, "the rejection upstream", || {
        !up.on("/rejected").is_empty()
    });
    let inspect = |json: bool| {
        let mut cmd = support::tidemark();
        cmd.args(["inspect", "--state-dir"])
            .arg(dir.path().join("state"));
        if json {
            cmd.arg("--json");
        }
        cmd.output().expect("inspect")
    };
    let out = inspect(false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("running gateway") && err.contains("tidemark status"),
        "{err}"
    );
    let _ = gw.terminate();
    let out = inspect(true);
    assert_eq!(out.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["counters"]["rejected"]["bad_topic"], 1, "{doc}");
    assert_eq!(doc["counters"]["rejected"]["too_old"], 0, "{doc}");
    let utc = doc["devices"][0]["last_seen_utc"].as_str().expect("utc");
    assert!(utc.ends_with('Z') && utc.len() == 24, "{utc}");
    let text = String::from_utf8_lossy(&inspect(false).stdout).into_owned();
    assert!(text.contains("bad_topic 1"), "{text}");
}
