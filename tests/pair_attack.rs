//! Only the pair moves the pair (docs/reference.md#standby--two-boards-one-gateway): an attacker with every right on the
//! site broker and no pair key forges records, dead beats, beats, retained claims
//! (a higher epoch, `u64::MAX`), a report at `u64::MAX`, garbage and oversized
//! frames, and replays real pair messages it captured. Nothing moves: no takeover,
//! no deposition, acks still wait for the real standby, the standby's state stays
//! its own, every forgery is counted, and every reading of the fleet beside it
//! counts once. Then both boards restart over a garbage retained claim and one
//! of them is active within `takeover_s` + 15 s.
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{Client, Event, MqttOptions, Packet, QoS};
use support::fleet::*;
use support::pair::*;
use support::{Collector, Mosquitto, Publisher, signal, wait_or_explain};

const TAKEOVER_S: u64 = 3;

/// `pair.rejected` of a board's status.
fn rejected(b: &Board) -> u64 {
    b.pair()["rejected"].as_u64().expect("pair.rejected")
}

/// A message seen on the pair's topics: topic, bytes, retained.
type Captured = (String, Vec<u8>, bool);

/// A client with every right on the site broker and no pair key.
struct Attacker {
    client: Client,
    seen: Arc<Mutex<Vec<Captured>>>,
}

impl Attacker {
    fn connect(port: u16) -> Self {
        let mut o = MqttOptions::new("attacker", "127.0.0.1", port);
        o.set_keep_alive(Duration::from_secs(30))
            .set_max_packet_size(64 << 20, 64 << 20);
        let (client, mut conn) = Client::new(o, 1000);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for ev in conn.iter() {
                match ev {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        s.lock()
                            .unwrap()
                            .push((p.topic.clone(), p.payload.to_vec(), p.retain))
                    }
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        });
        client
            .subscribe("tidemark/gw/pair/#", QoS::AtLeastOnce)
            .expect("subscribe");
        Self { client, seen }
    }
    fn send(&self, topic: &str, payload: Vec<u8>, retain: bool) {
        self.client
            .publish(topic, QoS::AtLeastOnce, retain, payload)
            .expect("publish");
    }
}

fn frame(epoch: u64, stream: u64, pos: u64, data: &[u8]) -> Vec<u8> {
    let f = tidemark::pair::Frame {
        kind: tidemark::pair::Kind::Record,
        epoch,
        stream,
        pos,
        part: 0,
        parts: 1,
        data: data.to_vec(),
    };
    let mut out = Vec::new();
    ciborium::ser::into_writer(&f, &mut out).unwrap();
    out
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn an_attacker_on_the_site_broker_without_the_key_moves_nothing() {
    let site = Mosquitto::start(false);
    let up_broker = Mosquitto::start(false);
    let scratch = support::Scratch::new();
    let dir = scratch.path().to_path_buf();
    let mut boards = [
        Board::new(&dir, "a", &site, &up_broker, TAKEOVER_S),
        Board::new(&dir, "b", &site, &up_broker, TAKEOVER_S),
    ];
    let up = Collector::start(up_broker.port, "tidemark/#", "attack-up");
    let mut publisher = Publisher::connect(site.port, "attack-fleet");
    let mut fleet = Fleet::new(20, 200);
    pair_up(&mut boards);
    let attacker = Attacker::connect(site.port);
    // Real traffic to capture: the fleet flows, both boards beat and report.
    for _ in 0..40 {
        fleet.send(&mut publisher, 10);
        std::thread::sleep(Duration::from_millis(50));
    }
    let captured: Vec<Captured> = attacker.seen.lock().unwrap().clone();
    assert!(
        captured.iter().any(|(t, _, _)| t.ends_with("/stream")),
        "no record captured"
    );
    let (ra, rb) = (rejected(&boards[0]), rejected(&boards[1]));
    let p = "tidemark/gw/pair";
    // What each board subscribes to: the active state/beats/reports, the standby state/beats/stream.
    let (mut to_a, mut to_b) = (0u64, 0u64);
    let mut forge = |topic: String, payload: Vec<u8>, retain: bool| {
        let (a, b) = if topic.ends_with("/state") || topic.contains("/beat/") {
            (1, 1)
        } else if topic.contains("/report/") {
            (1, 0)
        } else {
            (0, 1)
        };
        to_a += a;
        to_b += b;
        attacker.send(&topic, payload, retain);
    };
    // A record whose output would go upstream retained, then the active's death.
    let injected = br#"{"ts":1,"seq":1,"temp":1}"#;
    for pos in [1_000, u64::MAX] {
        forge(format!("{p}/stream"), frame(1, 7, pos, injected), false);
    }
    for node in ["a", "b"] {
        let dead = format!(
            r#"{{"node":"{node}","role":"active","epoch":1,"pos":1,"inst":1,"dead":true}}"#
        );
        forge(format!("{p}/beat/{node}"), dead.into_bytes(), false);
        let alive = format!(r#"{{"node":"{node}","role":"active","epoch":9,"pos":99,"inst":1}}"#);
        forge(format!("{p}/beat/{node}"), alive.into_bytes(), false);
    }
    forge(
        format!("{p}/state"),
        br#"{"node":"x","epoch":99,"at":0}"#.to_vec(),
        true,
    );
    forge(
        format!("{p}/state"),
        format!(r#"{{"node":"x","epoch":{},"at":0}}"#, u64::MAX).into_bytes(),
        true,
    );
    forge(
        format!("{p}/report/b"),
        format!(
            r#"{{"node":"b","stream":1,"pos":{},"want":false}}"#,
            u64::MAX
        )
        .into_bytes(),
        false,
    );
    // Garbage, a truncated real frame, a frame of 900 KB.
    forge(format!("{p}/stream"), vec![0x5a; 300], false);
    if let Some((t, bytes, _)) = captured.iter().find(|(t, _, _)| t.ends_with("/stream")) {
        forge(t.clone(), bytes[..bytes.len() / 2].to_vec(), false);
    }
    forge(format!("{p}/stream"), vec![7u8; 900 * 1024], false);
    // Real messages replayed: stale counters and sessions (retained claims aside:
    // an authentic claim of the current epoch changes nothing and is not refused).
    for (t, bytes, _) in captured.iter().filter(|(t, _, _)| !t.ends_with("/state")) {
        forge(t.clone(), bytes.clone(), false);
    }
    // A 50 MB frame: the pair's links announce their packet bound, the broker drops it.
    attacker.send(&format!("{p}/stream"), vec![1u8; 50 << 20], false);
    wait_or_explain(
        Duration::from_secs(30),
        || rejected(&boards[0]) >= ra + to_a && rejected(&boards[1]) >= rb + to_b,
        || {
            format!(
                "rejected: a {} (want {}), b {} (want {})\n{}\n{}",
                rejected(&boards[0]),
                ra + to_a,
                rejected(&boards[1]),
                rb + to_b,
                boards[0].log_text(),
                boards[1].log_text()
            )
        },
    );
    let metrics = support::metrics(boards[1].http);
    assert!(
        support::total(&metrics, "tidemark_pair_rejected_total") >= rb + to_b,
        "{metrics}"
    );
    // The forged retained claims did not stay: the active published its own again.
    wait_or_explain(
        Duration::from_secs(10),
        || {
            support::retained(site.port, &format!("{p}/state"))
                .last()
                .is_some_and(|m| {
                    m.payload.starts_with(b"TMp1")
                        && String::from_utf8_lossy(&m.payload).contains(r#""node":"a""#)
                })
        },
        || format!("retained claim not restored:\n{}", boards[0].log_text()),
    );
    // Past takeover_s: nobody took over, nobody was deposed, both still synced.
    std::thread::sleep(Duration::from_secs(TAKEOVER_S + 2));
    assert_eq!(boards[1].count(TAKEOVER), 0, "{}", boards[1].log_text());
    assert_eq!(boards[0].count(DEPOSED), 0, "{}", boards[0].log_text());
    assert_eq!(
        boards[0].pair()["peer"]["state"],
        "synced",
        "{}",
        boards[0].pair()
    );
    assert_eq!(
        boards[1].pair()["peer"]["state"],
        "synced",
        "{}",
        boards[1].pair()
    );
    assert_eq!(
        boards[1].count("installing the active's snapshot"),
        1,
        "{}",
        boards[1].log_text()
    );
    assert_eq!(boards[1].count("not a state file"), 0);
    // The forged report confirmed nothing: with the real standby stopped, acks wait for it
    // (until takeover_s declares it lost) instead of going at once.
    // Acks normally go within a commit interval (1 s); waiting for a standby that
    // reported up to a beat before it stopped, they take 2-3 s: 1.5 s tells them apart.
    let slow = |b: &Board| b.acks_over(1.5);
    let (slow_before, lost) = (slow(&boards[0]), boards[0].count(LOST));
    let status_before = boards[0].pair();
    let g = boards[1].gw.take().unwrap();
    signal(&g.child, "STOP");
    fleet.send(&mut publisher, 40);
    // The stopped standby is lost after takeover_s; the acks of meanwhile waited for it.
    wait_line(&boards[0], LOST, lost, MIN);
    wait_or_explain(
        MIN,
        || slow(&boards[0]) >= slow_before + 20,
        || {
            format!(
                "acks went before the real standby's sync: {} slow, {slow_before} before; pair before the stop {status_before}\n{}",
                slow(&boards[0]),
                boards[0].log_text()
            )
        },
    );
    signal(&g.child, "CONT");
    boards[1].gw = Some(g);
    assert!(
        boards[1].rss_kib() < 128 * 1024,
        "standby RSS {} KiB",
        boards[1].rss_kib()
    );
    while fleet.send(&mut publisher, 10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    publisher.flush();
    wait_counted(&fleet, &up, &boards[0].log, 2 * MIN);
    assert_exact(&fleet, &up);
    assert!(
        up.all().iter().all(|s| s.topic.starts_with("tidemark/gw/")),
        "{:?}",
        up.all().iter().map(|s| &s.topic).collect::<Vec<_>>()
    );

    // Both boards down, garbage retained as the claim, both back: one is active.
    for b in &mut boards {
        if let Some(g) = b.gw.take() {
            g.kill9();
        }
    }
    attacker.send(
        &format!("{p}/state"),
        b"garbage, not a claim".to_vec(),
        true,
    );
    std::thread::sleep(Duration::from_millis(300));
    let before: Vec<usize> = boards.iter().map(|b| b.count(ACTIVE)).collect();
    let t0 = support::now_ms();
    for b in &mut boards {
        b.start();
    }
    wait_or_explain(
        Duration::from_secs(TAKEOVER_S + 15),
        || {
            boards
                .iter()
                .zip(&before)
                .any(|(b, n)| b.count(ACTIVE) > *n)
        },
        || {
            format!(
                "no board active:\na:\n{}\nb:\n{}",
                boards[0].log_text(),
                boards[1].log_text()
            )
        },
    );
    eprintln!(
        "active {} ms after both boards started over a garbage claim",
        support::now_ms() - t0
    );
    for b in &mut boards {
        if let Some(g) = b.gw.take() {
            let (code, _) = g.terminate();
            assert_eq!(code, Some(0), "{}", b.log_text());
        }
    }
}
