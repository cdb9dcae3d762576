//! A flapping link to the site broker: the source connection cut every 1–3 s
//! while a fleet publishes at QoS 1. Nothing is lost and nothing is counted
//! twice: acks held across a cut are dropped as stale, the broker redelivers,
//! and the redelivered readings are duplicates by `seq`.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::{Collector, Gateway, Mosquitto, Proxy, Publisher, now_ms, wait_or_explain};

fn config(dir: &Path, source_port: u16, broker: &Mosquitto, http: u16) -> std::path::PathBuf {
    support::gateway_config(
        dir,
        &dir.join("state"),
        source_port,
        broker,
        http,
        "commit_interval_ms = 200\ntick_interval_ms = 100",
        "keep_alive_s = 5\n[group_defaults]\nout_of_orderness_ms = 2000\nidle_timeout_ms = 3000\n\
         allowed_lateness_ms = 60000\nheartbeat_timeout_ms = 600000\n\
         window = { kind = \"tumbling\", size_ms = 5000 }",
    )
}

fn metric(port: u16, name: &str) -> u64 {
    support::total(&support::metrics(port), name)
}

#[test]
fn a_source_link_cut_every_few_seconds_loses_nothing_and_counts_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Mosquitto::stock();
    let proxy = Proxy::start(broker.port);
    let up = Collector::start(broker.port, "tidemark/gw/windows/#", "flap-upstream");
    let http = support::free_port();
    let cfg = config(dir.path(), proxy.port, &broker, http);
    let log = dir.path().join("gw.log");
    let gw = Gateway::start(&cfg, &log);

    // Cuts at pseudo-random 1-3 s intervals while the fleet publishes.
    let cutting = Arc::new(AtomicBool::new(true));
    let (c, proxy) = (cutting.clone(), Arc::new(proxy));
    let cutter = {
        let proxy = proxy.clone();
        std::thread::spawn(move || {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            while c.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                std::thread::sleep(Duration::from_millis(1000 + x % 2000));
                proxy.cut();
            }
        })
    };
    let mut p = Publisher::connect(broker.port, "flap-fleet");
    let devices = 20u64;
    let mut sent = 0u64;
    // 40 s of 100 readings a second, paced by the clock of the messages themselves.
    let start = now_ms();
    let mut seq = 0u64;
    while now_ms() - start < 40_000 {
        for d in 0..devices {
            let body = format!(r#"{{"ts": {}, "seq": {seq}, "v": 1}}"#, now_ms());
            p.send(&format!("sensors/g{}/d{d}/reading", d % 3), body.as_bytes());
            sent += 1;
        }
        seq += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    p.flush();
    cutting.store(false, Ordering::Relaxed);
    let _ = cutter.join();
    let cuts = proxy.cuts.load(Ordering::Relaxed);
    assert!(cuts >= 10, "only {cuts} cuts");

    let counted = || support::window_readings(&up.all());
    wait_or_explain(
        Duration::from_secs(120),
        || metric(http, "tidemark_accepted_total") == sent && counted() == sent,
        || {
            format!(
                "accepted {} windows {} of {sent} after {cuts} cuts\n{}",
                metric(http, "tidemark_accepted_total"),
                counted(),
                gw.log_text()
            )
        },
    );
    assert_eq!(metric(http, "tidemark_late_total"), 0);
    assert_eq!(metric(http, "tidemark_readings_missing_total"), 0);
    let dups = metric(http, "tidemark_duplicates_total");
    eprintln!(
        "{sent} readings, {cuts} cuts, {dups} redelivered duplicates, received {}",
        metric(http, "tidemark_received_total")
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0), "{}", gw_log(&log));
}

fn gw_log(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}
