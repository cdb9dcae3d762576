use super::*;
use crate::engine::{Engine, Now};
use crate::output::Output;
use std::collections::BTreeMap as Map;

const T0: i64 = 1_764_480_000_000;

fn build_config() -> crate::config::Config {
    crate::config::load_str("[gateway]\nid = \"gw\"\n", &Map::new()).unwrap()
}

fn batch_of(e: &mut Engine) -> Batch {
    Batch {
        changes: e.take_changes(),
        ..Batch::default()
    }
}

fn entry(i: u64) -> OutboxEntry {
    OutboxEntry {
        topic: format!("t/{i}"),
        payload: vec![u8::try_from(i % 256).unwrap()].into(),
        retain: false,
        at: T0,
        report: false,
    }
}

/// A new engine on what `store` holds (as a restart reads it).
fn reopened(store: &Store, cfg: &crate::config::Config) -> Engine {
    let snap = read_snapshot(&*store.db.get().unwrap(), store.path(), true).unwrap();
    let mut b = Engine::new(&cfg.engine);
    b.restore(snap.groups, snap.devices, snap.metric_names, snap.counters);
    b.restore_clock(snap.gateway_clock);
    b.restore_sparkplug(snap.sparkplug);
    b
}

fn feed(e: &mut Engine, from: i64, to: i64, out: &mut Vec<Output>) {
    for s in from..to {
        let t = T0 + s * 1000;
        for d in 0..4 {
            let p = format!(r#"{{"ts": {t}, "seq": {s}, "temp": {d}.5}}"#);
            e.on_message(
                &format!("sensors/g{}/d{d}/reading", d % 2),
                p.as_bytes(),
                Now::at(t + 30),
                out,
            );
        }
        e.on_tick(Now::at(t + 500), out);
    }
}

#[test]
fn restored_engine_continues_exactly_like_the_original() {
    let cfg = build_config();
    let (mut store, snap) = Store::in_memory(1000).unwrap();
    assert!(snap.devices.is_empty());
    let mut a = Engine::new(&cfg.engine);
    a.restart_idleness(Now::at(T0));
    let mut out = Vec::new();
    feed(&mut a, 0, 90, &mut out);
    store.commit(&batch_of(&mut a)).unwrap();
    // Reopen the same database: read everything back.
    let snap = read_snapshot(&*store.db.get().unwrap(), store.path(), true).unwrap();
    assert_eq!(snap.devices.len(), 4);
    assert_eq!(snap.counters, *a.counters());
    let mut b = Engine::new(&cfg.engine);
    b.restore(snap.groups, snap.devices, snap.metric_names, snap.counters);
    b.restore_clock(snap.gateway_clock);
    b.restore_sparkplug(snap.sparkplug);
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    feed(&mut a, 90, 300, &mut out_a);
    feed(&mut b, 90, 300, &mut out_b);
    assert!(!out_a.is_empty());
    assert_eq!(out_a, out_b);
    assert_eq!(a.counters(), b.counters());
}

/// Ten true-clock devices behind an unsynchronized gateway a day ahead, from `from` to `to` s.
fn feed_day_ahead(e: &mut Engine, from: i64, to: i64, out: &mut Vec<Output>) {
    for s in from..to {
        let t = T0 + s * 1000;
        for d in 0..10 {
            let p = format!(r#"{{"ts": {t}, "temp": {d}}}"#);
            let now = Now {
                wall: t + 40 + d * 7 + 86_400_000,
                mono: 3 * 86_400_000 + s * 1000 + 40 + d * 7,
                synced: false,
            };
            e.on_message(&format!("sensors/g/d{d}/reading"), p.as_bytes(), now, out);
        }
    }
}

#[test]
fn readings_waiting_for_the_gateway_clock_verdict_survive_a_checkpoint() {
    let cfg = build_config();
    let (mut store, _) = Store::in_memory(1000).unwrap();
    let mut a = Engine::new(&cfg.engine);
    let mut out = Vec::new();
    // The first readings arrive in doubt: they wait, nothing is output for them.
    let p = format!(r#"{{"ts": {T0}, "temp": 1}}"#);
    let now = Now {
        wall: T0 + 86_400_040,
        mono: 3 * 86_400_000,
        synced: false,
    };
    a.on_message("sensors/g/d0/reading", p.as_bytes(), now, &mut out);
    assert_eq!(a.gateway_clock().waiting.len(), 1);
    assert!(out.is_empty(), "{out:?}");
    store.commit(&batch_of(&mut a)).unwrap();
    let mut b = reopened(&store, &cfg);
    assert_eq!(b.gateway_clock(), a.gateway_clock());
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    feed_day_ahead(&mut a, 1, 120, &mut out_a);
    feed_day_ahead(&mut b, 1, 120, &mut out_b);
    assert_eq!(out_a, out_b);
    // The verdict came, the waiting readings were placed: nothing late or rejected.
    assert!(a.gateway_clock().waiting.is_empty());
    assert_eq!(
        a.gateway_clock().verdict,
        crate::time::gateway::Verdict::Wrong
    );
    assert_eq!(a.counters().late, 0);
    assert_eq!(a.counters().rejected.iter().sum::<u64>(), 0);
    assert_eq!(a.counters().accepted, 1 + 119 * 10);
}

#[test]
fn revision_pending_at_commit_is_emitted_after_restore_without_watermark_advance() {
    let cfg = build_config();
    let (mut store, _) = Store::in_memory(1000).unwrap();
    let mut a = Engine::new(&cfg.engine);
    a.restart_idleness(Now::at(T0));
    let mut out = Vec::new();
    feed(&mut a, 0, 70, &mut out);
    // A late reading within lateness revises the fired first window; commit before the tick.
    let late = format!(r#"{{"ts": {}, "temp": 9}}"#, T0 + 5_000);
    let at = T0 + 69_600;
    a.on_message(
        "sensors/g0/d0/reading",
        late.as_bytes(),
        Now::at(at),
        &mut out,
    );
    store.commit(&batch_of(&mut a)).unwrap();
    let mut b = reopened(&store, &cfg);
    // Same instant as the last tick: the watermark does not move.
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    a.on_tick(Now::at(T0 + 69_500), &mut out_a);
    b.on_tick(Now::at(T0 + 69_500), &mut out_b);
    assert!(
        matches!(&out_a[..], [Output::Window(w)] if w.revision == 1),
        "{out_a:?}"
    );
    assert_eq!(out_a, out_b);
}

#[test]
fn outbox_is_fifo_bounded_and_counts_what_it_drops() {
    let cfg = build_config();
    let mut e = Engine::new(&cfg.engine);
    let (mut store, _) = Store::in_memory(5).unwrap();
    let batch: Vec<_> = (0..8).map(entry).collect();
    let stats = store
        .commit(&Batch {
            outputs: batch,
            ..batch_of(&mut e)
        })
        .unwrap();
    assert_eq!(stats.dropped, 3);
    assert_eq!(store.outbox_depth().unwrap(), 5);
    assert_eq!(store.outbox_dropped(), 3);
    let got = store.outbox_after(None, 100).unwrap();
    let topics: Vec<_> = got.iter().map(|(_, e)| e.topic.as_str()).collect();
    assert_eq!(topics, vec!["t/3", "t/4", "t/5", "t/6", "t/7"]);
    // Delivered entries leave the outbox only on a later commit.
    let upto = got[1].0;
    store
        .commit(&Batch {
            outputs: vec![entry(8)],
            delivered: Some(upto),
            ..batch_of(&mut e)
        })
        .unwrap();
    let left: Vec<_> = store
        .outbox_after(None, 100)
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.topic)
        .collect();
    assert_eq!(left, vec!["t/5", "t/6", "t/7", "t/8"]);
    let snap = read_snapshot(&*store.db.get().unwrap(), store.path(), true).unwrap();
    assert_eq!((snap.outbox_depth, snap.outbox_dropped), (4, 3));
}

/// The byte bound drops oldest first, the byte count follows deliveries, and it
/// survives a restart; a file written before the count existed is counted at open.
#[test]
fn outbox_byte_bound_drops_oldest_and_its_count_survives_restarts() {
    let cfg = build_config();
    let mut e = Engine::new(&cfg.engine);
    let dir = tempfile::tempdir().unwrap();
    let big = |i: u64| OutboxEntry {
        topic: format!("t/{i:03}"),
        payload: vec![7; 1000].into(),
        ..entry(i)
    };
    let size = {
        let mut b = Vec::new();
        cbor(&big(0), &mut b);
        b.len() as u64
    };
    let (mut store, _) = Store::open(dir.path(), 1000).unwrap();
    store.set_max_bytes(10 * size + size / 2);
    let stats = store
        .commit(&Batch {
            outputs: (0..25).map(big).collect(),
            ..batch_of(&mut e)
        })
        .unwrap();
    assert_eq!((stats.dropped, stats.depth), (15, 10));
    assert_eq!(store.outbox_bytes(), 10 * size);
    let first = store.outbox_after(None, 1).unwrap()[0].0;
    assert_eq!(store.outbox_after(None, 1).unwrap()[0].1.topic, "t/015");
    store
        .commit(&Batch {
            delivered: Some(first + 3),
            ..batch_of(&mut e)
        })
        .unwrap();
    assert_eq!(store.outbox_bytes(), 6 * size);
    drop(store);
    let (store, _) = Store::open(dir.path(), 1000).unwrap();
    assert_eq!(store.outbox_bytes(), 6 * size);
    assert_eq!(store.outbox_dropped(), 15);
    // As an older build wrote it: no byte count in the outbox meta.
    {
        let db = store.db.get().unwrap();
        drop(store);
        let db = std::sync::Arc::try_unwrap(db).ok().unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut m = txn.open_table(META).unwrap();
            let mut old = std::collections::BTreeMap::new();
            old.insert("next_seq", first + 10);
            old.insert("dropped", 15);
            let mut b = Vec::new();
            cbor(&old, &mut b);
            m.insert(K_OUTBOX, b.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let (store, _) = Store::open(dir.path(), 1000).unwrap();
    assert_eq!(store.outbox_bytes(), 6 * size);
    assert_eq!(store.next_seq(), first + 10);
}

#[test]
fn a_state_file_of_another_schema_version_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = Store::file(dir.path());
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(K_SCHEMA, &99u32.to_be_bytes()[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = Store::open(dir.path(), 10).err().expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("schema version 99") && msg.contains("tidemark.redb"),
        "{msg}"
    );
    assert!(
        std::fs::read(&path).unwrap() == before,
        "refused file was modified"
    );
    assert!(inspect(dir.path()).is_err());
}
