//! A state disk that fills up (docs/reference.md#guarantees): the gateway stays up, holds its acks,
//! pauses input, says so, and resumes by itself once space returns, losing
//! nothing — against a stock mosquitto and a real (small) tmpfs.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{Collector, Gateway, Mosquitto, Mount, Publisher, send_fleet, wait_or_explain};

/// Writes zeros into `path` until the filesystem refuses (ENOSPC).
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("filler");
    let block = vec![0u8; 64 * 1024];
    loop {
        if f.write_all(&block).is_err() || f.sync_data().is_err() {
            // Leave the last partial block in: nothing is free.
            let small = [0u8; 512];
            while f.write_all(&small).is_ok() && f.sync_data().is_ok() {}
            return;
        }
    }
}

fn config(dir: &Path, state: &Path, source: &Mosquitto, sink: &Mosquitto, http: u16) -> PathBuf {
    support::gateway_config(
        dir,
        state,
        source.port,
        sink,
        http,
        "commit_interval_ms = 100\ntick_interval_ms = 100",
        "keep_alive_s = 5\n[group_defaults]\nout_of_orderness_ms = 0\nidle_timeout_ms = 1500\n\
         allowed_lateness_ms = 0\nheartbeat_timeout_ms = 600000\n\
         window = { kind = \"tumbling\", size_ms = 1000 }",
    )
}

fn metric(port: u16, name: &str) -> u64 {
    support::total(&support::metrics(port), name)
}

/// Until `/healthz` says the state store cannot commit.
fn wait_blocked(http: u16, gw: &Gateway) {
    wait_or_explain(
        Duration::from_secs(60),
        || {
            let (code, body) = support::http_get(http, "/healthz");
            code == 503 && body.contains("state store cannot commit")
        },
        || {
            format!(
                "{:?}\n{}",
                support::http_get(http, "/healthz"),
                gw.log_text()
            )
        },
    );
}

fn alerts(c: &Collector) -> Vec<String> {
    c.all()
        .iter()
        .filter(|s| s.topic == "tidemark/gw/alerts")
        .map(|s| s.json()["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// A gateway with its state on a small tmpfs, a stock site broker, an upstream
/// broker (persistent: its collector's session survives a stop) with a
/// collector, and a fleet that has sent its first readings.
struct Site {
    dir: tempfile::TempDir,
    mnt: Mount,
    broker: Mosquitto,
    sink: Mosquitto,
    up: Collector,
    http: u16,
    cfg: PathBuf,
    gw: Gateway,
    p: Publisher,
    sent: u64,
}

impl Site {
    fn start(name: &str, devices: u64) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = Mount::tmpfs(&dir.path().join("small"), "6m")?;
        let broker = Mosquitto::stock();
        let sink = Mosquitto::start(true);
        let up = Collector::start(sink.port, "tidemark/gw/#", &format!("{name}-upstream"));
        let http = support::free_port();
        let cfg = config(dir.path(), &mnt.0.join("state"), &broker, &sink, http);
        let gw = Gateway::start(&cfg, &dir.path().join("gw.log"));
        let mut p = Publisher::connect(broker.port, &format!("{name}-fleet"));
        let sent = send_fleet(&mut p, devices, 0..20);
        wait_or_explain(
            Duration::from_secs(60),
            || metric(http, "tidemark_received_total") == sent,
            || gw.log_text(),
        );
        Some(Self {
            dir,
            mnt,
            broker,
            sink,
            up,
            http,
            cfg,
            gw,
            p,
            sent,
        })
    }
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
/// The whole docs/reference.md#guarantees promise on a real full filesystem, held long enough that
/// the paused source connection times out and the broker redelivers.
#[test]
fn a_full_state_disk_pauses_input_reports_it_and_resumes_losing_nothing() {
    let Some(Site {
        dir,
        mnt,
        broker,
        sink,
        up,
        http,
        cfg: _,
        gw,
        mut p,
        mut sent,
    }) = Site::start("full", 10)
    else {
        return;
    };
    let devices = 10;

    fill(&mnt.0.join("filler"));
    let before = sent;
    sent += send_fleet(&mut p, devices, 20..60);
    wait_blocked(http, &gw);
    wait_or_explain(
        Duration::from_secs(30),
        || alerts(&up).contains(&"state_store".to_string()),
        || format!("{:?}", alerts(&up)),
    );
    let alert = up
        .all()
        .into_iter()
        .find(|s| s.topic == "tidemark/gw/alerts")
        .expect("alert")
        .json();
    assert!(
        alert["detail"]
            .as_str()
            .is_some_and(|d| d.contains("space")),
        "{alert}"
    );
    assert!(alert["at"].as_i64().is_some(), "{alert}");
    wait_or_explain(
        Duration::from_secs(10),
        || metric(http, "tidemark_state_store_ok") == 0,
        || support::http_get(http, "/metrics").1,
    );
    assert!(
        gw.log_text()
            .contains("state store cannot commit: input paused"),
        "{}",
        gw.log_text()
    );
    // Input is paused: the broker keeps the rest. Long enough for the paused
    // source connection to time out (keep_alive 5 s): the broker then redelivers.
    let received = metric(http, "tidemark_received_total");
    sent += send_fleet(&mut p, devices, 60..80);
    wait_or_explain(
        Duration::from_secs(30),
        || metric(http, r#"tidemark_connected{link="source"}"#) == 0,
        || support::http_get(http, "/metrics").1,
    );
    let client = format!("gw-in-{}", sink.port);
    wait_or_explain(
        Duration::from_secs(60),
        || {
            broker
                .log_text()
                .lines()
                .any(|l| l.contains(&client) && l.contains("exceeded timeout"))
        },
        || broker.log_text(),
    );
    let paused = metric(http, "tidemark_received_total");
    // At most what was already on its way to the core when the pause began.
    assert!(
        paused <= received + 10 && paused < sent,
        "{paused} taken while the store cannot commit ({received} when it failed, {sent} sent)"
    );

    std::fs::remove_file(mnt.0.join("filler")).expect("free the disk");
    wait_or_explain(
        Duration::from_secs(90),
        || alerts(&up).contains(&"state_store_ok".to_string()),
        || format!("{:?}\n{}", alerts(&up), gw.log_text()),
    );
    wait_or_explain(
        Duration::from_secs(60),
        || support::http_get(http, "/healthz").0 == 200,
        || format!("{:?}", support::http_get(http, "/healthz")),
    );
    wait_or_explain(
        Duration::from_secs(10),
        || metric(http, "tidemark_state_store_ok") == 1,
        || support::http_get(http, "/metrics").1,
    );
    // Every reading sent, exactly once in the windows (the redelivered ones are duplicates).
    let counted = || support::window_readings(&up.all());
    wait_or_explain(
        Duration::from_secs(90),
        || counted() == sent,
        || {
            format!(
                "windows count {} of {sent} ({before} before the disk filled)\n{}",
                counted(),
                gw.log_text()
            )
        },
    );
    assert_eq!(metric(http, "tidemark_readings_missing_total"), 0);
    let (code, _) = gw.terminate();
    assert_eq!(
        code,
        Some(0),
        "{}",
        std::fs::read_to_string(dir.path().join("gw.log")).unwrap_or_default()
    );
}

/// Killed while the disk is full and started again before space returns (as
/// systemd would): the start gets as far as the retry loop instead of exiting.
/// The uplink is down too, so the journal holds undelivered window results
/// that the start's checkpoint (failing, and retried) must not lose.
#[test]
fn a_gateway_restarted_on_a_full_disk_waits_for_space_instead_of_exiting() {
    let Some(Site {
        dir,
        mnt,
        broker: _broker,
        mut sink,
        up,
        http,
        cfg,
        gw,
        mut p,
        mut sent,
    }) = Site::start("restart", 6)
    else {
        return;
    };
    let devices = 6;
    sink.stop();
    sent += send_fleet(&mut p, devices, 20..30);
    // The fleet falls silent: its windows close into the journal, undelivered.
    wait_or_explain(
        Duration::from_secs(60),
        || {
            metric(http, "tidemark_received_total") == sent
                && metric(http, "tidemark_outbox_depth") > 0
        },
        || support::metrics(http),
    );
    fill(&mnt.0.join("filler"));
    // Until a commit needs a page the disk no longer has.
    let mut seq = 30;
    let full = (0..60).any(|_| {
        sent += send_fleet(&mut p, devices, seq..seq + 10);
        seq += 10;
        (0..40).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            support::http_get(http, "/healthz").0 == 503
        })
    });
    assert!(full, "{}", gw.log_text());
    gw.kill9();
    let log2 = dir.path().join("gw2.log");
    // Paused from the start: it never subscribes before the disk frees.
    let gw = Gateway::spawn(&cfg, &log2);
    sent += send_fleet(&mut p, devices, seq..seq + 10);
    wait_blocked(http, &gw);
    assert!(
        gw.log_text()
            .contains("checkpoint after journal replay failed"),
        "{}",
        gw.log_text()
    );
    std::fs::remove_file(mnt.0.join("filler")).expect("free the disk");
    sink.restart();
    let counted = || support::window_readings(&up.all());
    wait_or_explain(
        Duration::from_secs(90),
        || counted() == sent,
        || format!("windows count {} of {sent}\n{}", counted(), gw.log_text()),
    );
    let (code, _) = gw.terminate();
    assert_eq!(
        code,
        Some(0),
        "{}",
        std::fs::read_to_string(&log2).unwrap_or_default()
    );
}
