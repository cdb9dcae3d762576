//! Hot standby (docs/reference.md#standby--two-boards-one-gateway): two gateway processes, one `gateway.id`, their own
//! state dirs, on a real site broker. The active is killed (SIGKILL), wiped
//! (its state dir deleted, a fresh board in its place) and hung (SIGSTOP past
//! `takeover_s`); every reading is counted exactly once upstream.
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::fleet::*;
use support::pair::*;
use support::{Collector, Mosquitto, Publisher, signal, wait_or_explain};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// SIGTERM: a planned stop hands over at once.
    Term,
    Kill,
    KillAndWipe,
    Hang,
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn a_pair_survives_kills_a_wiped_board_and_a_hang_counting_every_reading_once() {
    // Stock brokers: 20 in flight, 1 000 queued per session, as a site runs them.
    let site = Mosquitto::stock();
    let up_broker = Mosquitto::stock();
    let scratch = support::Scratch::new();
    let dir = scratch.path();
    let takeover_s = 10;
    let mut boards = [
        Board::new(dir, "a", &site, &up_broker, takeover_s),
        Board::new(dir, "b", &site, &up_broker, takeover_s),
    ];
    let up = Collector::start(up_broker.port, "tidemark/gw/#", "pair-collector");
    let mut publisher = Publisher::connect(site.port, "pair-fleet");
    let mut fleet = Fleet::new(20, 600);
    boards[0].start();
    wait_line(&boards[0], ACTIVE, 0, MIN);
    boards[0].gw.as_ref().expect("a").wait_ready();
    boards[1].start();
    wait_line(&boards[0], JOINED, 0, MIN);
    // Both boards show the pair: the active its synced standby, the standby its active.
    wait_or_explain(
        MIN,
        || {
            let (a, b) = (boards[0].pair(), boards[1].pair());
            a["role"] == "active"
                && a["peer"]["node"] == "b"
                && a["peer"]["state"] == "synced"
                && b["role"] == "standby"
                && b["peer"]["node"] == "a"
                && b["peer"]["state"] == "synced"
                && a["epoch"] == 1
                && b["epoch"] == 1
                && b["peer"]["last_seen"].is_u64()
        },
        || format!("pair status: a {} b {}", boards[0].pair(), boards[1].pair()),
    );
    let text = support::metrics(boards[1].http);
    assert!(
        text.contains(
            "tidemark_pair_info{node=\"b\",role=\"standby\",peer=\"a\",peer_state=\"synced\"} 1"
        ),
        "{text}"
    );
    wait_or_explain(
        MIN,
        || {
            up.on("/metrics")
                .iter()
                .any(|m| m.json()["pair"]["peer"]["state"] == "synced")
        },
        || "P/metrics without the pair".into(),
    );
    let text = support::tidemark()
        .args([
            "status",
            "--url",
            &format!("http://127.0.0.1:{}", boards[1].http),
        ])
        .output()
        .expect("tidemark status");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("pair    node b standby, epoch 1  peer a synced"),
        "{text}"
    );
    // Acks wait for the standby: with it stopped the active's acks are held, until
    // takeover_s passes and the active runs alone (standby_lost); the standby, resumed,
    // catches up again (standby_joined) and does not take over.
    let slow_before = boards[0].slow_acks();
    let (lost, joined) = (boards[0].count(LOST), boards[0].count(JOINED));
    let g = boards[1].gw.take().expect("b");
    signal(&g.child, "STOP");
    for _ in 0..50 {
        fleet.send(&mut publisher, 2);
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_line(&boards[0], LOST, lost, MIN);
    signal(&g.child, "CONT");
    boards[1].gw = Some(g);
    wait_or_explain(
        MIN,
        || boards[0].slow_acks() >= slow_before + 20,
        || {
            format!(
                "acks did not wait for the stopped standby: {} slow\n{}",
                boards[0].slow_acks(),
                boards[0].log_text()
            )
        },
    );
    wait_line(&boards[0], JOINED, joined, MIN);
    assert_eq!(boards[1].count(TAKEOVER), 0, "{}", boards[1].log_text());
    let alerts = |kind: &str| {
        up.on("/alerts")
            .into_iter()
            .filter(|s| s.topic.ends_with("/alerts") && s.json()["type"] == kind)
            .count()
    };
    wait_or_explain(
        MIN,
        || alerts("standby_lost") == 1 && alerts("standby_joined") == 2,
        || {
            format!(
                "alerts: {:?}",
                up.on("/alerts")
                    .iter()
                    .map(|s| s.json())
                    .collect::<Vec<_>>()
            )
        },
    );
    let faults = [
        Fault::Kill,
        Fault::Kill,
        Fault::KillAndWipe,
        Fault::Kill,
        Fault::Hang,
        Fault::Kill,
        Fault::Term,
    ];
    let mut active = 0usize;
    let mut takeovers = Vec::new();
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    let share = fleet.total() / (faults.len() as u64 + 2);
    for fault in faults {
        let standby = 1 - active;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // ≥ 200 readings/s for a random share of the fleet, then the fault.
        let target = fleet.next + share / 2 + rng % share;
        let windows_before = up.on("/windows/").len();
        while fleet.next < target {
            fleet.send(&mut publisher, 10);
            std::thread::sleep(Duration::from_millis(20));
        }
        wait_or_explain(
            MIN,
            || up.on("/windows/").len() > windows_before,
            || format!("no progress upstream:\n{}", boards[active].log_text()),
        );
        let took_before = boards[standby].count(TAKEOVER);
        let t0 = support::now_ms();
        let hung = match fault {
            Fault::Term => {
                let (code, _) = boards[active]
                    .gw
                    .take()
                    .expect("active running")
                    .terminate();
                assert_eq!(code, Some(0), "{}", boards[active].log_text());
                None
            }
            Fault::Kill => {
                boards[active].kill9();
                None
            }
            Fault::KillAndWipe => {
                boards[active].kill9();
                std::fs::remove_dir_all(&boards[active].state).expect("wipe the dead board");
                None
            }
            Fault::Hang => {
                let g = boards[active].gw.take().expect("active running");
                signal(&g.child, "STOP");
                Some(g)
            }
        };
        // The fleet goes on during the takeover.
        let mut sent = 0;
        while sent < 200 && fleet.send(&mut publisher, 10) {
            sent += 10;
            std::thread::sleep(Duration::from_millis(20));
        }
        wait_line(&boards[standby], TAKEOVER, took_before, MIN);
        // A result after the takeover line: the new active's (an upper bound of the takeover).
        let results_before = up.on("/windows/").len();
        wait_or_explain(
            MIN,
            || up.on("/windows/").len() > results_before,
            || {
                format!(
                    "no result from the new active:\n{}",
                    boards[standby].log_text()
                )
            },
        );
        let first = up.on("/windows/")[results_before].at;
        takeovers.push(Duration::from_millis(
            u64::try_from(first - t0).unwrap_or(0),
        ));
        if let Some(g) = hung {
            std::thread::sleep(Duration::from_secs(2));
            let deposed = boards[active].count(DEPOSED);
            let links = boards[active].count("sink connected");
            signal(&g.child, "CONT");
            wait_line(&boards[active], DEPOSED, deposed, MIN);
            // The resumed board stood down without connecting upstream again.
            assert_eq!(
                boards[active].count("sink connected"),
                links,
                "{}",
                boards[active].log_text()
            );
            boards[active].gw = Some(g);
        } else {
            boards[active].start();
        }
        let joined = boards[standby].count(JOINED);
        wait_line(&boards[standby], JOINED, joined, MIN);
        active = standby;
    }
    while fleet.send(&mut publisher, 10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    publisher.flush();
    wait_counted(&fleet, &up, &boards[active].log, 3 * MIN);
    assert_exact(&fleet, &up);
    // No window id published with two different contents.
    let mut by_id: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for s in up.on("/windows/") {
        let v = s.json();
        let id = v["id"].as_str().expect("id").to_string();
        if let Some(old) = by_id.get(&id) {
            assert_eq!(old, &v, "window {id} published with two contents");
        }
        by_id.insert(id, v);
    }
    assert!(
        up.on("/late/").is_empty(),
        "late output: {:?}",
        up.on("/late/").first().map(|s| s.json())
    );
    let offline: Vec<_> = up
        .on("/alerts/")
        .into_iter()
        .map(|s| s.json())
        .filter(|v| v["type"] == "offline")
        .collect();
    assert!(offline.is_empty(), "false offline alerts: {offline:?}");
    let takeover_alerts = up
        .on("/alerts")
        .into_iter()
        .filter(|s| s.json()["type"] == "takeover")
        .count();
    assert!(
        takeover_alerts >= faults.len(),
        "takeover alerts: {takeover_alerts}"
    );
    let status = support::retained(up_broker.port, "tidemark/gw/status");
    let st = status.last().expect("P/status").json();
    assert_eq!(st["node"], boards[active].name, "{st}");
    assert_eq!(st["epoch"].as_u64(), Some(faults.len() as u64 + 1), "{st}");
    for b in &mut boards {
        if let Some(g) = b.gw.take() {
            let (code, _) = g.terminate();
            assert_eq!(code, Some(0), "{}", b.log_text());
        }
    }
    eprintln!(
        "takeovers (death -> first result of the new active): {:?}; {} readings",
        takeovers,
        fleet.total()
    );
}

#[test]
fn two_fresh_boards_started_together_agree_on_one_active() {
    for round in 0..3 {
        // A fresh site each round: no claim retained.
        let site = Mosquitto::start(false);
        let up_broker = Mosquitto::start(false);
        let dir = tempfile::tempdir().expect("tempdir");
        let mut boards = [
            Board::new(dir.path(), "a", &site, &up_broker, 10),
            Board::new(dir.path(), "b", &site, &up_broker, 10),
        ];
        boards[0].start();
        boards[1].start();
        wait_or_explain(
            MIN,
            || boards.iter().any(|b| b.count(JOINED) > 0),
            || {
                format!(
                    "no standby joined:\na:\n{}\nb:\n{}",
                    boards[0].log_text(),
                    boards[1].log_text()
                )
            },
        );
        let active: Vec<&str> = boards
            .iter()
            .filter(|b| b.count(ACTIVE) > 0)
            .map(|b| b.name)
            .collect();
        let following: Vec<&str> = boards
            .iter()
            .filter(|b| b.count("this one follows it as standby") > 0)
            .map(|b| b.name)
            .collect();
        assert!(
            active.len() == 1 && following.len() == 1 && active != following,
            "round {round}: active {active:?}, standby {following:?}\na:\n{}\nb:\n{}",
            boards[0].log_text(),
            boards[1].log_text()
        );
        for b in &mut boards {
            b.kill9();
        }
    }
}

/// The finding's timeline: the active hangs (SIGSTOP) past `takeover_s` while a
/// QoS 1 fleet publishes, the standby takes over, the hung board resumes with the
/// fleet still publishing. The resumed board must take no session, ack nothing
/// and publish nothing before it reads the newer claim; every reading counts once.
#[test]
fn a_hung_active_resumed_mid_stream_takes_no_session_and_loses_nothing() {
    let site = Mosquitto::stock();
    let up_broker = Mosquitto::stock();
    let scratch = support::Scratch::new();
    let dir = scratch.path().to_path_buf();
    let takeover_s = 3;
    // Links the broker gives up on within 7.5 s: the hung board's sessions are
    // gone when it resumes, as on a site whose broker keeps the default keepalive.
    let short = "[source]\nkeep_alive_s = 5\n[sink]\nkeep_alive_s = 5\n";
    let mut boards = [
        Board::with(&dir, "a", (&site, &up_broker), takeover_s, short),
        Board::with(&dir, "b", (&site, &up_broker), takeover_s, short),
    ];
    let up = Collector::start(up_broker.port, "tidemark/gw/#", "resume-collector");
    pair_up(&mut boards);
    // QoS 1 at ~250 readings/s from before the hang until after the resume.
    let (stop, pump) = pump(site.port, "resume-fleet", Fleet::new(40, 150));
    std::thread::sleep(Duration::from_secs(2));
    let g = boards[0].gw.take().expect("a running");
    signal(&g.child, "STOP");
    let stopped = support::now_ms();
    wait_line(&boards[1], TAKEOVER, 0, MIN);
    // Resumed past the broker's keepalive expiry of the hung board's links.
    let resume_at = stopped + 12_000;
    while support::now_ms() < resume_at {
        std::thread::sleep(Duration::from_millis(100));
    }
    let sessions = |b: &Board| b.count("source connected") + b.count("sink connected");
    let (before, deposed) = (sessions(&boards[0]), boards[0].count(DEPOSED));
    signal(&g.child, "CONT");
    boards[0].gw = Some(g);
    wait_line(&boards[0], DEPOSED, deposed, MIN);
    assert_eq!(
        sessions(&boards[0]),
        before,
        "the resumed board connected before it read the newer claim:\n{}",
        boards[0].log_text()
    );
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut publisher, mut fleet) = pump.join().expect("fleet thread");
    while fleet.send(&mut publisher, 10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    publisher.flush();
    wait_counted(&fleet, &up, &boards[1].log, 3 * MIN);
    assert_exact(&fleet, &up);
    for b in &mut boards {
        if let Some(g) = b.gw.take() {
            let (code, _) = g.terminate();
            assert_eq!(code, Some(0), "{}", b.log_text());
        }
    }
}

/// A power cut takes both boards at once and only the former standby comes
/// back: it takes over from its own disk within `takeover_s` (+ connect time) and
/// every reading counts once; the other board, back later, follows it.
#[test]
fn after_both_boards_die_together_the_former_standby_alone_takes_over() {
    let site = Mosquitto::stock();
    let up_broker = Mosquitto::stock();
    let scratch = support::Scratch::new();
    let dir = scratch.path().to_path_buf();
    let takeover_s = 3;
    let mut boards = [
        Board::new(&dir, "a", &site, &up_broker, takeover_s),
        Board::new(&dir, "b", &site, &up_broker, takeover_s),
    ];
    let up = Collector::start(up_broker.port, "tidemark/gw/#", "cut-collector");
    pair_up(&mut boards);
    let (stop, pump) = pump(site.port, "cut-fleet", Fleet::new(40, 100));
    std::thread::sleep(Duration::from_secs(2));
    let (a, b) = (
        boards[0].gw.take().expect("a"),
        boards[1].gw.take().expect("b"),
    );
    signal(&a.child, "KILL");
    signal(&b.child, "KILL");
    drop((a, b));
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut publisher, mut fleet) = pump.join().expect("fleet thread");
    let t0 = support::now_ms();
    boards[1].start();
    wait_line(
        &boards[1],
        TAKEOVER,
        0,
        Duration::from_secs(takeover_s + 15),
    );
    eprintln!(
        "the former standby took over {} ms after it started alone",
        support::now_ms() - t0
    );
    while fleet.send(&mut publisher, 10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    publisher.flush();
    wait_counted(&fleet, &up, &boards[1].log, 3 * MIN);
    assert_exact(&fleet, &up);
    let joined = boards[1].count(JOINED);
    boards[0].start();
    wait_line(&boards[1], JOINED, joined, MIN);
    assert!(
        boards[0].count("this one follows it as standby") > 0,
        "{}",
        boards[0].log_text()
    );
    for b in &mut boards {
        if let Some(g) = b.gw.take() {
            let (code, _) = g.terminate();
            assert_eq!(code, Some(0), "{}", b.log_text());
        }
    }
}

/// `tidemark fleet push` of `doc` as document `id` to the pair's gateway: (exit code, result).
fn push(up: &Mosquitto, key: &Path, id: u64, doc: &Path) -> (i32, serde_json::Value) {
    let o = support::tidemark()
        .args(["fleet", "push", "--url", &up.url(), "--key"])
        .arg(key)
        .args([
            "--gateway",
            "gw",
            "--id",
            &id.to_string(),
            "--timeout-s",
            "30",
        ])
        .arg(doc)
        .output()
        .expect("tidemark fleet push");
    let r = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (o.status.code().unwrap_or(-1), r)
}

/// The last remote document id is replicated state (docs/reference.md#remote-configuration-fleet): applied on the
/// active, it is still taken on the board that takes over, so an older signed
/// document is refused there too.
#[test]
fn a_takeover_keeps_the_last_remote_document_id() {
    let site = Mosquitto::start(false);
    let up_broker = Mosquitto::start(false);
    let scratch = support::Scratch::new();
    let dir = scratch.path().to_path_buf();
    let signing = dir.join("fleet.key");
    support::fleet::keygen(&signing);
    let fleet_keys = format!(
        "[fleet]\nenabled = true\ntrusted_keys = [{:?}]\nconfirm_s = 30\n",
        format!("{}.pub", signing.display())
    );
    let mut boards = [
        Board::with(&dir, "a", (&site, &up_broker), 3, &fleet_keys),
        Board::with(&dir, "b", (&site, &up_broker), 3, &fleet_keys),
    ];
    boards[0].start();
    wait_line(&boards[0], ACTIVE, 0, MIN);
    boards[0].gw.as_ref().expect("a").wait_ready();
    boards[1].start();
    wait_line(&boards[0], JOINED, 0, MIN);
    let doc = dir.join("doc.toml");
    std::fs::write(&doc, "[log]\nlevel = \"debug\"\n").unwrap();
    let (code, r) = push(&up_broker, &signing, 6, &doc);
    assert_eq!(
        (code, &r["result"]),
        (0, &serde_json::Value::from("applied")),
        "{r}"
    );
    // Replicated before the active dies: the standby reports every record.
    std::thread::sleep(Duration::from_secs(2));
    boards[0].kill9();
    wait_line(&boards[1], TAKEOVER, 0, MIN);
    boards[1].gw.as_ref().expect("b").wait_ready();
    for stale in [5, 6] {
        let (code, r) = push(&up_broker, &signing, stale, &doc);
        assert_eq!(
            (code, r["errors"][0].as_str()),
            (1, Some("stale_id")),
            "document {stale} after the takeover: {r}\n{}",
            boards[1].log_text()
        );
    }
    let (code, r) = push(&up_broker, &signing, 7, &doc);
    assert_eq!(
        (code, &r["result"]),
        (0, &serde_json::Value::from("applied")),
        "{r}"
    );
    if let Some(g) = boards[1].gw.take() {
        let _ = g.terminate();
    }
}
