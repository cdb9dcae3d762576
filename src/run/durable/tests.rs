use super::*;
use crate::driver::Driver;
use crate::engine::Now;
use crate::journal::Mark;
use crate::output::SinkFormat;
use proptest::prelude::*;
use std::collections::BTreeMap;

const T0: i64 = 1_764_480_000_000;

#[derive(Debug, Clone)]
enum Step {
    /// (device, seq, event offset from arrival, gap before it)
    Msg(u8, u16, i64, i64),
    /// Quiet time: ticks only.
    Quiet(i64),
    /// Source reconnect: idleness restart.
    Reconnect,
    Commit,
    Checkpoint,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0u8..6, 0u16..40, -90_000i64..3_000, 0i64..3_000)
            .prop_map(|(d, s, o, g)| Step::Msg(d, s, o, g)),
        2 => (0i64..200_000).prop_map(Step::Quiet),
        1 => Just(Step::Reconnect),
        3 => Just(Step::Commit),
        1 => Just(Step::Checkpoint),
    ]
}

fn cfg() -> crate::config::Config {
    crate::config::load_str(
        "[gateway]\nid = \"gw\"\ncommit_interval_ms = 1000\n[group_defaults]\nidle_timeout_ms = 5000\nheartbeat_timeout_ms = 20000\nallowed_lateness_ms = 10000\nwindow = { kind = \"tumbling\", size_ms = 10000 }\n[groups.g1]\nwindow = { kind = \"session\", gap_ms = 4000 }\n",
        &BTreeMap::new(),
    )
    .unwrap()
}

fn open(dir: &std::path::Path, cfg: &crate::config::Config) -> (Durable, Driver, usize) {
    let (store, snap) = Store::open(dir, 1000).unwrap();
    // Slices of two devices: bursts go out in slices, and a crash may come between two.
    let mut e = Engine::new(&cfg.engine).with_tick_slice(2);
    e.restore(snap.groups, snap.devices, snap.metric_names, snap.counters);
    e.restore_clock(snap.gateway_clock);
    e.restore_sparkplug(snap.sparkplug);
    e.take_fleet_id(crate::store::schema::fleet_last_id(&snap.meta));
    e.take_bd_seq(crate::store::schema::bd_seq(&snap.meta));
    for (o, mark) in crate::store::schema::output_marks(&snap.meta) {
        e.take_output_mark(o, mark);
    }
    let (d, n, _) = Durable::recover(store, dir, &snap.meta, &mut e, &cfg.engine.record()).unwrap();
    (
        d,
        Driver::new(e, &cfg.gateway, &cfg.sink.prefix, SinkFormat::Json, None).with_journal(),
        n,
    )
}

fn state(e: &Engine) -> String {
    let mut s = format!("{:?}\n{:?}\n", e.counters(), e.metric_names());
    for g in e.groups() {
        s += &format!("{g:?}\n");
        for d in e.group_devices(&g.name) {
            s += &format!("{d:?}\n");
        }
    }
    s
}

/// A standby following the active's records: its store, its driver, the rules in force.
type Follower = (Durable, Driver, Vec<u8>);

/// The directories of an active and its standby, the active (replicating its records)
/// and the standby that follows them.
fn pair(
    cfg: &crate::config::Config,
) -> (
    (tempfile::TempDir, tempfile::TempDir),
    Durable,
    Driver,
    Follower,
) {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (d, drv, _) = open(dirs.0.path(), cfg);
    let (sd, sdrv, _) = open(dirs.1.path(), cfg);
    let standby = (sd, sdrv, cfg.engine.record());
    (dirs, d.replicating(), drv, standby)
}

fn run_steps(d: &mut Durable, drv: &mut Driver, steps: &[Step], at: &mut i64) -> Vec<String> {
    run_followed(d, drv, steps, at, None)
}

fn run_followed(
    d: &mut Durable,
    drv: &mut Driver,
    steps: &[Step],
    at: &mut i64,
    mut standby: Option<&mut Follower>,
) -> Vec<String> {
    let mut out = Vec::new();
    for s in steps {
        match s {
            Step::Msg(dev, seq, off, gap) => {
                *at += gap;
                let p = format!(r#"{{"ts": {}, "seq": {seq}, "v": {dev}}}"#, *at + off);
                let topic = format!("sensors/g{}/d{dev}/reading", dev % 2);
                drv.message(Now::at(*at), &topic, p.as_bytes());
            }
            Step::Quiet(ms) => {
                *at += ms;
                drv.ticks_until(Now::at(*at));
            }
            Step::Reconnect => drv.start(Now::at(*at)),
            Step::Commit | Step::Checkpoint => {
                let mut b = if matches!(s, Step::Commit) {
                    drv.take_journal(Now::at(*at))
                } else {
                    drv.take_checkpoint(Now::at(*at))
                };
                out.extend(
                    b.outputs
                        .iter()
                        .map(|o| format!("{} {:?}", o.topic, o.payload)),
                );
                d.write(&mut b, 0).unwrap();
                if let Some((sd, sdrv, in_force)) = standby.as_deref_mut() {
                    sd.follow(sdrv.engine_mut(), &d.take_body(), in_force)
                        .unwrap();
                }
            }
        }
    }
    out
}

#[test]
fn delivered_outputs_leave_memory_and_the_rest_stay_readable() {
    let cfg = cfg();
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _, _) = open(dir.path(), &cfg);
    let entry = |i: u64| OutboxEntry {
        topic: format!("t/{i}"),
        payload: vec![1].into(),
        retain: false,
        at: T0,
        report: false,
    };
    for b in 0..3u64 {
        let mut batch = Batch {
            outputs: (0..10).map(|i| entry(b * 10 + i)).collect(),
            journal: Some(Vec::new()),
            ..Batch::default()
        };
        d.write(&mut batch, 0).unwrap();
    }
    let first = d.store.next_seq() - 30;
    // The sink acknowledged the first 25.
    d.forget_delivered(first + 25);
    assert_eq!(d.store.unfolded().lock().unwrap().len(), 5);
    let reader = d.store.reader();
    let left = reader.outbox_after(Some(first + 24), 100).unwrap();
    let topics: Vec<_> = left.iter().map(|(_, e)| e.topic.as_str()).collect();
    assert_eq!(topics, ["t/25", "t/26", "t/27", "t/28", "t/29"]);
    drop(reader);
    assert_eq!(d.depth(first + 25).0, 5);
    // A crash now: the journal file still holds them all; the delivered mark written
    // with the next record keeps the acknowledged ones from coming back.
    d.write(
        &mut Batch {
            journal: Some(Vec::new()),
            ..Batch::default()
        },
        first + 25,
    )
    .unwrap();
    drop(d);
    let (d, _, _) = open(dir.path(), &cfg);
    let topics: Vec<_> = d
        .store
        .outbox_after(None, 100)
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.topic)
        .collect();
    assert_eq!(topics, ["t/25", "t/26", "t/27", "t/28", "t/29"]);
}

#[test]
fn a_journal_left_beside_a_new_state_file_is_not_replayed() {
    let cfg = cfg();
    let dir = tempfile::tempdir().unwrap();
    let (mut d, mut drv, _) = open(dir.path(), &cfg);
    drv.start(Now::at(T0));
    let steps: Vec<Step> = (0..40)
        .map(|i| Step::Msg(i % 6, u16::from(i), 0, 500))
        .chain([Step::Commit])
        .collect();
    let mut at = T0;
    run_steps(&mut d, &mut drv, &steps, &mut at);
    drop(d);
    let (_, again, replayed) = open(dir.path(), &cfg);
    assert!(replayed > 0);
    assert_eq!(state(again.engine()), state(drv.engine()));
    // The operator removes the state file but not the journal.
    std::fs::remove_file(Store::file(dir.path())).unwrap();
    let (_, fresh, replayed) = open(dir.path(), &cfg);
    assert_eq!(replayed, 0);
    assert_eq!(fresh.engine().groups().count(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A crash right after any commit (between two slices of a burst, too):
    /// checkpoint + journal rebuild exactly the committed engine state, and the
    /// restored gateway goes on exactly as the original would. A standby that
    /// followed every record holds the same state and, taking over, goes on the same.
    #[test]
    fn journal_replay_after_a_crash_rebuilds_the_committed_state(
        before in prop::collection::vec(step(), 1..120),
        after in prop::collection::vec(step(), 0..60),
    ) {
        let cfg = cfg();
        let ((dir, _standby_dir), mut d, mut drv, mut standby) = pair(&cfg);
        let mut at = T0;
        drv.start(Now::at(at));
        run_followed(&mut d, &mut drv, &before, &mut at, Some(&mut standby));
        // Whatever is not committed yet is lost in the crash (its acks were never sent).
        let mut b = drv.take_journal(Now::at(at));
        d.write(&mut b, 0).unwrap();
        standby.0.follow(standby.1.engine_mut(), &d.take_body(), &mut standby.2).unwrap();
        let committed = state(drv.engine());
        drop(d);
        let (mut d2, mut drv2, _) = open(dir.path(), &cfg);
        prop_assert_eq!(&state(drv2.engine()), &committed);
        let (mut sd, mut sdrv, _) = standby;
        prop_assert_eq!(&state(sdrv.engine()), &committed);
        // The original goes on with the same driver clock as the restored one.
        let dir1 = tempfile::tempdir().unwrap();
        let (mut d1, mut drv1) = {
            let (d1, _, _) = open(dir1.path(), &cfg);
            (d1, drv)
        };
        drv2.start(Now::at(at));
        drv1.start(Now::at(at));
        let mut at1 = at;
        let o1 = run_steps(&mut d1, &mut drv1, &after, &mut at1);
        sdrv.start(Now::at(at));
        let mut at3 = at;
        let o3 = run_steps(&mut sd, &mut sdrv, &after, &mut at3);
        let o2 = run_steps(&mut d2, &mut drv2, &after, &mut at);
        prop_assert_eq!(&o1, &o2);
        prop_assert_eq!(&o1, &o3, "the standby taking over");
        prop_assert_eq!(state(drv1.engine()), state(drv2.engine()));
        prop_assert_eq!(state(drv1.engine()), state(sdrv.engine()));
    }
}

fn cfg_in(dir: &std::path::Path, window_ms: i64) -> crate::config::Config {
    crate::config::load_str(
        &format!(
            "[gateway]\nid = \"gw\"\nstate_dir = \"{}\"\n[time]\npolicy = \"device\"\n\
             [group_defaults]\nout_of_orderness_ms = 0\nidle_timeout_ms = 5000\nallowed_lateness_ms = 600000\n\
             window = {{ kind = \"tumbling\", size_ms = {window_ms} }}\n",
            dir.display()
        ),
        &BTreeMap::new(),
    )
    .unwrap()
}

fn readings(drv: &mut Driver, from: i64, n: i64) {
    for k in from..from + n {
        let at = T0 + k * 500;
        let p = format!(r#"{{"ts": {at}, "seq": {k}, "v": 1}}"#);
        drv.message(Now::at(at), "sensors/g/d/reading", p.as_bytes());
    }
}

#[test]
fn a_crash_after_a_journaled_reload_recovers_each_message_under_its_own_rules() {
    // Reference: the same input, never crashed.
    let ref_dir = tempfile::tempdir().unwrap();
    let (mut rd, mut reference, _) = open(ref_dir.path(), &cfg_in(ref_dir.path(), 10_000));
    let new_rules = cfg_in(ref_dir.path(), 4_000);
    readings(&mut reference, 0, 30);
    reference.reconfigure(Now::at(T0 + 15_000), &new_rules);
    readings(&mut reference, 30, 30);
    rd.write(&mut reference.take_journal(Now::at(T0 + 30_000)), 0)
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (cfg_in(dir.path(), 10_000), cfg_in(dir.path(), 4_000));
    {
        let r = crate::run::durable::restore::restore(&old, SystemClock::new()).unwrap();
        let (mut d, mut drv) = (r.durable, r.driver);
        readings(&mut drv, 0, 30);
        d.write(&mut drv.take_journal(Now::at(T0 + 15_000)), 0)
            .unwrap();
        drv.reconfigure(Now::at(T0 + 15_000), &new);
        readings(&mut drv, 30, 30);
        d.write(&mut drv.take_journal(Now::at(T0 + 30_000)), 0)
            .unwrap();
        // kill -9: no checkpoint, the journal holds both records.
    }
    // Restarted with the file saying either rule: the state is the uncrashed one.
    for file in [&new, &old] {
        let r = crate::run::durable::restore::restore(file, SystemClock::new()).unwrap();
        let e = r.driver.engine();
        let want = reference.engine();
        let windows = |e: &Engine| -> Vec<(i64, i64, u32)> {
            e.device("g", "d")
                .unwrap()
                .windows
                .iter()
                .map(|w| (w.start, w.end, w.count))
                .collect()
        };
        assert_eq!(windows(e), windows(want));
        assert_eq!(e.counters(), want.counters());
        // Latest event at T0 + 14.5 s: the 10 s window ends at T0 + 20 s, a 4 s boundary.
        let rules = want.group_rules_of("g");
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[1].from, T0 + 20_000);
        assert!(
            windows(want)
                .iter()
                .all(|&(s, e, _)| e <= T0 + 20_000 || s >= T0 + 20_000)
        );
        drop(r);
    }
}

/// A restart (gateway start, source reconnect) writes its groups, not every device;
/// a device stored before it restores with the restarted clock, through a stop and
/// through a crash (journal), at any fleet size.
#[test]
fn a_restart_writes_the_groups_and_the_devices_restore_its_clock() {
    for n in [1usize, 37, 2_000] {
        let cfg = cfg();
        let dir = tempfile::tempdir().unwrap();
        let (mut d, mut drv, _) = open(dir.path(), &cfg);
        let mut at = T0;
        drv.start(Now::at(at));
        for i in 0..n {
            let p = format!(r#"{{"ts": {at}, "seq": 1, "v": 1}}"#);
            drv.message(
                Now::at(at),
                &format!("sensors/g{}/d{i}/reading", i % 3),
                p.as_bytes(),
            );
        }
        let mut b = drv.take_checkpoint(Now::at(at));
        assert_eq!(b.changes.devices.len(), n);
        d.write(&mut b, 0).unwrap();
        // Two restarts, later in monotonic time; the first one checkpointed.
        for (k, crash) in [(1, false), (2, true)] {
            at += 60_000;
            drv.start(Now::at(at));
            let mut b = if crash {
                drv.take_journal(Now::at(at))
            } else {
                drv.take_checkpoint(Now::at(at))
            };
            assert_eq!(b.changes.devices.len(), 0, "restart {k} wrote devices");
            assert!(crash || b.changes.groups.len() == 3.min(n));
            d.write(&mut b, 0).unwrap();
        }
        let committed = state(drv.engine());
        drop(d);
        let (_d2, drv2, _) = open(dir.path(), &cfg);
        assert_eq!(state(drv2.engine()), committed);
        for g in drv2.engine().groups() {
            assert_eq!(g.restarted_at, at);
            for dev in drv2.engine().group_devices(&g.name) {
                assert_eq!((dev.last_arrival, dev.restarts), (at, g.restarts));
            }
        }
    }
}

/// The highest remote document id taken and the edge node's session counter are state: kept by a crash (journal), a
/// checkpoint (meta) and a standby following the records, never lowered.
#[test]
fn the_last_remote_id_and_the_bd_seq_survive_a_crash_a_checkpoint_and_reach_a_standby() {
    let cfg = cfg();
    let ((active_dir, _standby_dir), mut d, mut drv, (mut sd, mut sdrv, mut in_force)) = pair(&cfg);
    let at = T0;
    drv.start(Now::at(at));
    drv.mark(Now::at(at), Mark::FleetId(6));
    drv.mark(Now::at(at), Mark::FleetId(5));
    drv.mark(Now::at(at), Mark::BdSeq(300));
    let mut b = drv.take_journal(Now::at(at));
    d.write(&mut b, 0).unwrap();
    sd.follow(sdrv.engine_mut(), &d.take_body(), &mut in_force)
        .unwrap();
    assert_eq!(sdrv.engine().fleet_last_id(), 6, "the standby follows it");
    assert_eq!(
        sdrv.engine().bd_seq(),
        300,
        "and the edge node's session counter"
    );
    drop(d);
    // A crash: the journal holds it.
    let (d, drv2, _) = open(active_dir.path(), &cfg);
    assert_eq!(drv2.engine().fleet_last_id(), 6, "after a crash");
    assert_eq!(drv2.engine().bd_seq(), 300);
    drop(d);
    // A checkpoint (the journal reset): the state file's meta holds it.
    let (mut d, mut drv3, _) = open(active_dir.path(), &cfg);
    drv3.mark(Now::at(at + 1), Mark::FleetId(7));
    let mut b = drv3.take_checkpoint(Now::at(at + 1));
    d.write(&mut b, 0).unwrap();
    drop(d);
    let (_d, drv4, replayed) = open(active_dir.path(), &cfg);
    assert_eq!(
        (drv4.engine().fleet_last_id(), replayed),
        (7, 0),
        "after a checkpoint"
    );
}

/// A tmpfs for one test, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Writes into `path` until the file system refuses.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 16 * 1024];
    while f.write_all(&block).is_ok() && f.sync_data().is_ok() {}
    while f.write_all(&[0u8; 512]).is_ok() && f.sync_data().is_ok() {}
}

/// A checkpoint's records streamed in slices, on a disk that fills up under it: the
/// failed transaction takes the slices it read with it, so the batch is written
/// again as the journal record of what it covers, checkpoints go to the journal until
/// one of all the state comes, and a restart restores exactly the engine's state.
#[test]
fn a_streamed_checkpoint_that_fails_is_journaled_and_a_full_one_follows() {
    let dir = tempfile::tempdir().unwrap();
    let at_dir = dir.path().join("fs");
    std::fs::create_dir_all(&at_dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=6m", "tmpfs"])
        .arg(&at_dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        mounted,
        "mounting a tmpfs needs root (scripts/test.sh runs as root)"
    );
    let _fs = Tmpfs(at_dir.clone());
    let state_dir = at_dir.join("state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let cfg = cfg();
    let (mut d, mut drv, _) = open(&state_dir, &cfg);
    let mut at = T0;
    drv.start(Now::at(at));
    let readings = |drv: &mut Driver, at: &mut i64, n: usize| {
        for i in 0..n {
            *at += 10;
            let p = format!(r#"{{"ts": {}, "v": {i}}}"#, *at);
            drv.message(
                Now::at(*at),
                &format!("sensors/g0/d{i}/reading"),
                p.as_bytes(),
            );
        }
    };
    readings(&mut drv, &mut at, 40);
    let mut b = drv.take_checkpoint(Now::at(at));
    d.write(&mut b, 0).unwrap();
    readings(&mut drv, &mut at, 40);
    let streamed = |drv: &mut Driver, at: i64, full: bool| {
        let mut b = drv.take_checkpoint_upto(Now::at(at), 4);
        let (tx, rx) = std::sync::mpsc::sync_channel(64);
        loop {
            let s = drv.take_device_slice(4);
            if s.is_empty() {
                break;
            }
            tx.send(s).unwrap();
        }
        b.rest = Some(rx);
        b.full = full;
        b
    };
    let filler = at_dir.join("filler");
    fill(&filler);
    let mut b = streamed(&mut drv, at, false);
    assert!(
        d.write(&mut b, 0).is_err(),
        "a full disk fails the checkpoint"
    );
    assert!(
        b.journal.is_some() && b.rest.is_none(),
        "retried as a journal record"
    );
    std::fs::remove_file(&filler).unwrap();
    // As the store thread's outage wait does: redb refuses every call until reopened.
    d.store().reopen().unwrap();
    d.write(&mut b, 0).unwrap();
    // A checkpoint cut before the core heard of it is journaled too.
    readings(&mut drv, &mut at, 3);
    let mut b = streamed(&mut drv, at, false);
    d.write(&mut b, 0).unwrap();
    assert!(d.need_full);
    // A crash here restores the state so far.
    let live = state(drv.engine());
    drop(d);
    let (mut d, mut drv, _) = {
        let (d2, drv2, n) = open(&state_dir, &cfg);
        assert_eq!(
            state(drv2.engine()),
            live,
            "restored after the journaled checkpoints"
        );
        drop((d2, drv2, n));
        // The original goes on: its store reopened as it was, still waiting for a full one.
        let (mut d, _, _) = open(&state_dir, &cfg);
        d.need_full = true;
        (d, drv, ())
    };
    drv.engine_mut().mark_all_changed();
    let mut b = streamed(&mut drv, at, true);
    d.write(&mut b, 0).unwrap();
    assert!(!d.need_full);
    let live = state(drv.engine());
    drop(d);
    drop(drv);
    let (_, drv2, _) = open(&state_dir, &cfg);
    assert_eq!(state(drv2.engine()), live);
}

/// A standby's own checkpoints stream their records too: following the active's records
/// past the journal bound, the standby's state file restores the active's state.
#[test]
fn a_standby_checkpoint_streams_its_records_and_restores_the_active_state() {
    let cfg = cfg();
    let ((_active_dir, standby_dir), mut d, mut drv, (mut sd, mut sdrv, mut in_force)) = pair(&cfg);
    let mut at = T0;
    drv.start(Now::at(at));
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut checkpoints = 0;
    let mut journal = sd.wal.len();
    while checkpoints < 2 {
        for i in 0..400 {
            at += 5;
            // Values that do not compress, so the journal fills.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = format!(
                r#"{{"ts": {at}, "v": {}, "w": {}}}"#,
                x % 1_000_003,
                x >> 40
            );
            drv.message(
                Now::at(at),
                &format!("sensors/g0/d{}/reading", i % 60),
                p.as_bytes(),
            );
        }
        let mut b = drv.take_journal(Now::at(at));
        d.write(&mut b, 0).unwrap();
        sd.follow(sdrv.engine_mut(), &d.take_body(), &mut in_force)
            .unwrap();
        if sd.wal.len() < journal {
            checkpoints += 1;
        }
        journal = sd.wal.len();
    }
    let live = state(drv.engine());
    assert_eq!(state(sdrv.engine()), live);
    drop((sd, sdrv));
    let (_, restored, _) = open(standby_dir.path(), &cfg);
    assert_eq!(state(restored.engine()), live);
}
