//! Store costs, printed as a table: group-commit cost by messages per commit,
//! and restore time of a state with 10 000 devices and 100 000 open windows.
//! `cargo bench --bench store`
#![allow(clippy::disallowed_methods)] // a benchmark measures wall time

use std::collections::BTreeMap;
use std::time::Instant;

use tidemark::config;
use tidemark::engine::{Engine, Now};
use tidemark::store::{Batch, OutboxEntry, Store};

const T0: i64 = 1_764_480_000_000;
const DEVICES: usize = 10_000;

fn engine(extra: &str) -> Engine {
    let cfg = config::load_str(
        &format!("[gateway]\nid = \"bench\"\n{extra}"),
        &BTreeMap::new(),
    )
    .unwrap();
    let mut e = Engine::new(&cfg.engine);
    e.restart_idleness(Now::at(T0));
    e
}

/// Feeds `n` readings round-robin over the devices, starting at message `from`.
fn feed(e: &mut Engine, from: usize, n: usize, out: &mut Vec<tidemark::output::Output>) {
    for i in from..from + n {
        let d = i % DEVICES;
        let round = (i / DEVICES) as i64;
        let t = T0 + round * 1000 + (d as i64 * 1000 / DEVICES as i64);
        let p = format!(r#"{{"ts":{t},"seq":{round},"temp":21.5,"hum":40}}"#);
        e.on_message(
            &format!("sensors/g{}/dev{d}/reading", d % 20),
            p.as_bytes(),
            Now::at(t + 40),
            out,
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--restore") {
        restore(std::path::Path::new(&args[i + 1]));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    println!("commit cost (file-backed redb, fsync per commit, 10 000 devices)");
    println!(
        "{:>18} {:>14} {:>16} {:>14}",
        "messages/commit", "ms/commit", "device records", "outputs"
    );
    for &batch in &[1_000usize, 10_000, 50_000] {
        let state = dir.path().join(format!("commit-{batch}"));
        let (mut store, _) = Store::open(&state, 10_000_000).unwrap();
        let mut e = engine("");
        let mut out = Vec::new();
        // Warm up: every device known and persisted once.
        feed(&mut e, 0, DEVICES, &mut out);
        store
            .commit(&Batch {
                changes: e.take_changes(),
                ..Batch::default()
            })
            .unwrap();
        let rounds = 5;
        let mut total = 0.0;
        let mut devices = 0;
        let mut outputs = 0;
        for r in 0..rounds {
            out.clear();
            feed(&mut e, DEVICES + r * batch, batch, &mut out);
            let entries: Vec<OutboxEntry> = out
                .iter()
                .map(|o| OutboxEntry {
                    topic: o.topic("tidemark/bench"),
                    payload: o.encode(tidemark::config::SinkFormat::Json).into(),
                    retain: o.retain(),
                    at: T0,
                    report: false,
                })
                .collect();
            let start = Instant::now();
            // The cut of a batch (the engine's share) counts with the commit.
            let batch = Batch {
                changes: e.take_changes(),
                outputs: entries,
                ..Batch::default()
            };
            let s = store.commit(&batch).unwrap();
            total += start.elapsed().as_secs_f64() * 1000.0;
            devices += s.devices;
            outputs += s.outputs;
        }
        println!(
            "{:>18} {:>14.2} {:>16} {:>14}",
            batch,
            total / rounds as f64,
            devices / rounds,
            outputs / rounds
        );
    }

    println!();
    println!("restore (open + read + rebuild engine)");
    let state = dir.path().join("restore");
    {
        // Hopping 60 s / 6 s: every reading is in 10 windows, so 10 open windows per device.
        let (mut store, _) = Store::open(&state, 10_000_000).unwrap();
        let mut e = engine(HOPPING);
        let mut out = Vec::new();
        feed(&mut e, 0, DEVICES, &mut out);
        store
            .commit(&Batch {
                changes: e.take_changes(),
                ..Batch::default()
            })
            .unwrap();
    }
    // Measured in a fresh process, so RSS is the restored engine's alone.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--restore")
        .arg(&state)
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

const HOPPING: &str =
    "[group_defaults]\nwindow = { kind = \"hopping\", size_ms = 60000, slide_ms = 6000 }\n";

fn restore(state: &std::path::Path) {
    let start = Instant::now();
    let (_store, snap) = Store::open(state, 10_000_000).unwrap();
    let read = start.elapsed();
    let windows: usize = snap.devices.iter().map(|d| d.windows.len()).sum();
    let devices = snap.devices.len();
    let mut e = engine(HOPPING);
    e.restore(snap.groups, snap.devices, snap.metric_names, snap.counters);
    e.restore_clock(snap.gateway_clock);
    e.restore_sparkplug(snap.sparkplug);
    let total = start.elapsed();
    let size = std::fs::metadata(Store::file(state)).unwrap().len();
    println!(
        "{:>10} {:>14} {:>10} {:>10} {:>10} {:>10}",
        "devices", "open windows", "file MiB", "read ms", "total ms", "RSS MiB"
    );
    println!(
        "{:>10} {:>14} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
        devices,
        windows,
        size as f64 / 1048576.0,
        read.as_secs_f64() * 1000.0,
        total.as_secs_f64() * 1000.0,
        rss_mib()
    );
    drop(e);
}

/// Resident set size of this process (Linux), MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}
