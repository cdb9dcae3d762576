//! The gateway on a board: what it writes to its storage, and the loss it
//! sees before it (readings a stock site broker dropped), against real
//! mosquitto processes.

mod support;

use std::path::Path;
use std::time::Duration;

use support::{
    Collector, Gateway, Mosquitto, Publisher, metrics, now_ms, send_fleet, total, wait_or_explain,
    wait_until,
};

fn config(dir: &Path, broker: &Mosquitto, http: u16, extra: &str) -> std::path::PathBuf {
    support::gateway_config(
        dir,
        &dir.join("state"),
        broker.port,
        broker,
        http,
        "",
        extra,
    )
}

/// Sends every device its next reading until received + missing accounts for all that was
/// sent (a final reading the broker dropped as well is counted once a later one arrives);
/// returns the next sequence number.
fn finish(
    p: &mut Publisher,
    devices: u64,
    mut seq: u64,
    sent: &mut u64,
    http: u16,
    counted: impl Fn(&str) -> u64,
) -> u64 {
    for _ in 0..10 {
        *sent += send_fleet(p, devices, seq..seq + 1);
        seq += 1;
        let settled = (0..60).any(|_| {
            if counted(&metrics(http)) == *sent {
                return true;
            }
            std::thread::sleep(Duration::from_millis(500));
            false
        });
        if settled {
            return seq;
        }
    }
    panic!("received + missing != {sent}:\n{}", metrics(http));
}

/// docs/reference.md#time "Missing readings": a stock mosquitto (max_queued_messages 1000) drops most of
/// a burst queued for a v3.1.1 gateway; the sequence gaps count exactly what it dropped
/// once each device's next reading arrives.
#[test]
fn readings_a_stock_broker_dropped_are_counted_as_missing() {
    let broker = Mosquitto::stock();
    let dir = tempfile::tempdir().expect("tempdir");
    let http = support::free_port();
    let cfg = config(dir.path(), &broker, http, "protocol = \"v311\"");
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/metrics", "missing-metrics");
    let devices = 100;
    // The gateway's session exists (subscribed), then it is away while the burst arrives.
    let gw = Gateway::start(&cfg, &log);
    assert!(
        gw.log_text().contains("source protocol v3.1.1"),
        "a v3.1.1 source is warned about:\n{}",
        gw.log_text()
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    let mut publisher = Publisher::connect(broker.port, "missing-fleet");
    let mut sent = send_fleet(&mut publisher, devices, 0..300);
    let gw = Gateway::start(&cfg, &log);
    let counted = |text: &str| {
        total(text, "tidemark_received_total") + total(text, "tidemark_readings_missing_total")
    };
    // The broker kept 1000 of them (max_queued_messages): let the gateway take those first.
    wait_or_explain(
        Duration::from_secs(120),
        || total(&metrics(http), "tidemark_received_total") >= 1000,
        || metrics(http),
    );
    // Each device's next reading reveals the loss at the end of its stream.
    let next = finish(&mut publisher, devices, 300, &mut sent, http, counted);
    let text = metrics(http);
    let (received, missing) = (
        total(&text, "tidemark_received_total"),
        total(&text, "tidemark_readings_missing_total"),
    );
    eprintln!("queued burst: sent {sent}, received {received}, missing {missing}");
    assert!(
        missing > 20_000,
        "the stock broker keeps about 1000 queued messages: {missing} missing"
    );

    // A burst while the gateway is connected: whatever the broker drops is counted too.
    let before = sent;
    sent += send_fleet(&mut publisher, devices, next..next + 300);
    finish(
        &mut publisher,
        devices,
        next + 300,
        &mut sent,
        http,
        counted,
    );
    let text = metrics(http);
    eprintln!(
        "live burst of {}: received {}, missing {}",
        sent - before,
        total(&text, "tidemark_received_total") - received,
        total(&text, "tidemark_readings_missing_total") - missing
    );
    // P/metrics carries it, per group and in all.
    wait_until(Duration::from_secs(30), "P/metrics with the count", || {
        up.all().iter().rev().take(1).any(|m| {
            let j = m.json();
            let groups: u64 = j["groups"]
                .as_object()
                .map(|g| {
                    g.values()
                        .filter_map(|v| v["readings_missing"].as_u64())
                        .sum()
                })
                .unwrap_or(0);
            j["counters"]["readings_missing"].as_u64() == Some(groups)
                && groups == total(&text, "tidemark_readings_missing_total")
        })
    });
    // Once a minute, a log line names the devices that lost the most.
    wait_or_explain(
        Duration::from_secs(90),
        || {
            gw.log_text()
                .contains("readings missing before the gateway in the last minute")
        },
        || gw.log_text(),
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    let out = support::tidemark()
        .args(["inspect", "--json", "--state-dir"])
        .arg(dir.path().join("state"))
        .output()
        .expect("inspect");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect json");
    let per_device: u64 = doc["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter_map(|d| d["readings_missing"].as_u64())
        .sum();
    assert_eq!(
        per_device,
        doc["counters"]["readings_missing"].as_u64().unwrap()
    );
    assert_eq!(per_device, total(&text, "tidemark_readings_missing_total"));
}

fn files(state: &Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(state)
        .expect("state dir")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                m.len(),
                m.modified().ok()?,
            ))
        })
        .collect();
    v.sort();
    v
}

/// docs/reference.md#guarantees: a gateway with nothing to make durable writes nothing — watermarks keep
/// moving for a silent fleet, but no commit follows and the state files stay untouched.
#[test]
fn a_gateway_with_nothing_to_persist_does_not_commit() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let http = support::free_port();
    let cfg = config(
        dir.path(),
        &broker,
        http,
        "[time]\npolicy = \"device\"\n[group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 1000 }\n\
         out_of_orderness_ms = 0\nidle_timeout_ms = 500\nheartbeat_timeout_ms = 2000\nallowed_lateness_ms = 500\n",
    );
    let log = dir.path().join("gw.log");
    let gw = Gateway::start(&cfg, &log);
    let mut publisher = Publisher::connect(broker.port, "quiet-fleet");
    let sent = send_fleet(&mut publisher, 8, 0..5);
    // Every reading taken, every device offline (its windows fired and purged long before),
    // every output delivered: nothing left that must become durable.
    wait_or_explain(
        Duration::from_secs(60),
        || {
            let t = metrics(http);
            total(&t, "tidemark_received_total") == sent
                && t.contains("tidemark_group_devices{group=\"g0\",state=\"offline\"} 2")
                && total(&t, "tidemark_outbox_depth") == 0
        },
        || metrics(http),
    );
    let commits = |t: &str| total(t, "tidemark_commits_total");
    // The delivered marks of the last outputs make one more commit, at most a commit interval on.
    let settled = {
        let mut last = commits(&metrics(http));
        let mut uptime = total(&metrics(http), "tidemark_uptime_seconds");
        wait_until(Duration::from_secs(60), "commits to settle", || {
            let t = metrics(http);
            let (c, u) = (commits(&t), total(&t, "tidemark_uptime_seconds"));
            if c != last {
                (last, uptime) = (c, u);
            }
            u >= uptime + 2
        });
        last
    };
    let state = dir.path().join("state");
    let before = files(&state);
    let watermark = |t: &str| total(t, "tidemark_group_watermark_seconds");
    let (t0, w0) = {
        let t = metrics(http);
        (total(&t, "tidemark_uptime_seconds"), watermark(&t))
    };
    // Five seconds of gateway time in which the silent groups' watermarks keep advancing.
    wait_until(Duration::from_secs(60), "five seconds of ticks", || {
        total(&metrics(http), "tidemark_uptime_seconds") >= t0 + 5
    });
    let t = metrics(http);
    assert!(
        watermark(&t) > w0,
        "watermarks of the idle groups advance:\n{t}"
    );
    assert_eq!(commits(&t), settled, "no commit without durable work:\n{t}");
    assert_eq!(files(&state), before, "state files untouched");
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}

/// A gateway whose uplink is down, with `bound` in its `[sink]`, fed `steps` readings
/// (with `fields` metrics each) from each of `devices` devices, all of whose windows close.
/// Returns the gateway, its HTTP port and the stopped upstream broker.
fn uplink_down(
    dir: &Path,
    bound: &str,
    devices: i64,
    steps: i64,
    fields: usize,
) -> (Gateway, u16, Mosquitto, Mosquitto) {
    let source = Mosquitto::start(false);
    let mut sink = Mosquitto::start(false);
    sink.stop();
    let http = support::free_port();
    let path = dir.join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "[gateway]\nid = \"gw\"\nstate_dir = \"{state}\"\n\
             [source]\nurl = \"{src}\"\nclient_id = \"gw-in-bound\"\n\
             [sink]\nurl = \"{snk}\"\nclient_id = \"gw-out-bound\"\n{bound}\n\
             [metrics]\ninterval_s = 1\nlisten = \"127.0.0.1:{http}\"\n\
             [time]\npolicy = \"device\"\n\
             [group_defaults]\nwindow = {{ kind = \"tumbling\", size_ms = 1000 }}\n\
             out_of_orderness_ms = 0\nidle_timeout_ms = 500\nallowed_lateness_ms = 0\nheartbeat_timeout_ms = 3600000\n",
            state = dir.join("state").display(),
            src = source.url(),
            snk = sink.url(),
        ),
    )
    .expect("config");
    let gw = Gateway::start(&path, &dir.join("gw.log"));
    let mut p = Publisher::connect(source.port, "bound-fleet");
    let t0 = now_ms() - 120_000;
    let metrics: Vec<String> = (0..fields).map(|f| format!(r#", "m{f}": {f}.5"#)).collect();
    let metrics = metrics.concat();
    for i in 0..steps {
        for d in 0..devices {
            let body = format!(r#"{{"ts": {}, "seq": {i}{metrics}}}"#, t0 + i * 1000);
            p.send(&format!("sensors/g/d{d}/reading"), body.as_bytes());
        }
    }
    p.flush();
    (gw, http, source, sink)
}

/// The outbox bound holds with outputs that sit in the journal between checkpoints:
/// past `outbox_max_messages` the oldest are dropped and counted, the newest delivered.
#[test]
fn the_outbox_bound_holds_while_the_uplink_is_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gw, http, _source, mut sink) =
        uplink_down(dir.path(), "outbox_max_messages = 50", 10, 30, 1);
    // Every reading's window closes (the devices go idle), far more outputs than the bound.
    wait_or_explain(
        Duration::from_secs(60),
        || {
            let t = metrics(http);
            total(&t, "tidemark_windows_emitted_total") == 300
                && total(&t, "tidemark_outbox_depth") == 50
        },
        || metrics(http),
    );
    let t = metrics(http);
    // 300 window results and 10 retained `online` statuses went into the outbox.
    assert_eq!(total(&t, "tidemark_outbox_dropped_total"), 310 - 50, "{t}");
    sink.restart();
    wait_or_explain(
        Duration::from_secs(60),
        || total(&metrics(http), "tidemark_outbox_depth") == 0,
        || metrics(http),
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}

/// `sink.outbox_max_mb`: the same, by the bytes the outputs take in the state file.
#[test]
fn the_outbox_byte_bound_holds_while_the_uplink_is_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 3 000 window results of 6 metrics, each well over 600 bytes stored: about 2 MiB.
    let (gw, http, _source, mut sink) = uplink_down(dir.path(), "outbox_max_mb = 1", 100, 30, 6);
    let outputs = 3000 + 100;
    wait_or_explain(
        Duration::from_secs(120),
        || {
            let t = metrics(http);
            let (depth, dropped) = (
                total(&t, "tidemark_outbox_depth"),
                total(&t, "tidemark_outbox_dropped_total"),
            );
            total(&t, "tidemark_windows_emitted_total") == 3000
                && dropped > 0
                && depth + dropped == outputs
        },
        || metrics(http),
    );
    let depth = total(&metrics(http), "tidemark_outbox_depth");
    eprintln!("outbox_max_mb = 1: {depth} of {outputs} outputs kept");
    assert!(depth * 600 <= 1 << 20, "{depth} outputs kept under 1 MiB");
    sink.restart();
    wait_or_explain(
        Duration::from_secs(60),
        || total(&metrics(http), "tidemark_outbox_depth") == 0,
        || metrics(http),
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}

/// A state disk with little room left: the journal is not preallocated (it would take
/// the room the state file needs) and grows as it is written; the gateway runs.
#[test]
fn a_nearly_full_state_disk_still_runs_without_a_preallocated_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(mnt) = support::Mount::tmpfs(&dir.path().join("small"), "4m") else {
        return;
    };
    let broker = Mosquitto::start(false);
    let http = support::free_port();
    let cfg = support::gateway_config(
        dir.path(),
        &mnt.0.join("state"),
        broker.port,
        &broker,
        http,
        "",
        "",
    );
    let log = dir.path().join("gw.log");
    let gw = Gateway::start(&cfg, &log);
    assert!(
        gw.log_text().contains("the journal is not preallocated"),
        "{}",
        gw.log_text()
    );
    let mut p = Publisher::connect(broker.port, "small-disk-fleet");
    let sent = send_fleet(&mut p, 10, 0..20);
    wait_or_explain(
        Duration::from_secs(60),
        || {
            let t = metrics(http);
            total(&t, "tidemark_received_total") == sent && total(&t, "tidemark_commits_total") > 0
        },
        || format!("{}\n{}", metrics(http), gw.log_text()),
    );
    let (code, _) = gw.terminate();
    assert_eq!(
        code,
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let wal = std::fs::metadata(mnt.0.join("state/tidemark.wal")).expect("journal");
    assert!(wal.len() < 1 << 20, "journal of {} bytes", wal.len());
}
