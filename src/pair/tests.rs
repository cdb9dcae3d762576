use super::*;

fn report(pos: u64, stream: u64, want: bool) -> Report {
    Report {
        node: "b".into(),
        stream,
        pos,
        want,
    }
}

/// A gate on stream 1 whose standby "b" joined, installed the snapshot at 1 and reported it at `at`.
fn synced(at: i64) -> Gate<u32> {
    let mut g: Gate<u32> = Gate::new(1, 10_000);
    g.report(&report(0, 0, true), 0, 0);
    g.snapshot_sent(1, 0);
    g.report(&report(1, 1, false), at, 0);
    assert_eq!(g.peer(), PeerState::Synced);
    g
}

#[test]
fn frames_of_any_size_reassemble_in_order() {
    for size in [
        0,
        1,
        FRAME_BYTES - 1,
        FRAME_BYTES,
        FRAME_BYTES + 1,
        3 * FRAME_BYTES + 17,
    ] {
        let body: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let mut a = Assembler::default();
        let fs = frames(Kind::Snapshot, 3, 9, 42, &body);
        assert_eq!(fs.len(), size.div_ceil(FRAME_BYTES).max(1));
        let mut got = None;
        for (i, f) in fs.iter().enumerate() {
            let r = a.push(f);
            assert_eq!(r.is_some(), i + 1 == fs.len(), "size {size} part {i}");
            got = got.or(r);
        }
        let item = got.unwrap();
        assert_eq!(
            (item.kind, item.epoch, item.stream, item.pos),
            (Kind::Snapshot, 3, 9, 42)
        );
        assert_eq!(item.data, body);
    }
}

#[test]
fn a_lost_piece_drops_the_item_and_the_next_one_still_arrives() {
    let big: Vec<u8> = vec![5; 2 * FRAME_BYTES + 1];
    let mut a = Assembler::default();
    let fs = frames(Kind::Record, 1, 1, 7, &big);
    assert!(a.push(&fs[0]).is_none());
    // fs[1] lost
    assert!(a.push(&fs[2]).is_none());
    let next = frames(Kind::Record, 1, 1, 8, b"x");
    let item = a.push(&next[0]).unwrap();
    assert_eq!(item.pos, 8);
    assert!(a.push(b"not cbor").is_none());
}

#[test]
fn the_standby_applies_records_in_order_and_asks_for_a_snapshot_at_a_gap() {
    let item = |kind, stream, pos| Item {
        kind,
        epoch: 2,
        stream,
        pos,
        data: Vec::new(),
    };
    let mut p = Position::default();
    assert_eq!(
        p.step(&item(Kind::Record, 5, 1)),
        Step::Gap,
        "nothing to apply it to"
    );
    let snap = item(Kind::Snapshot, 5, 10);
    assert_eq!(p.step(&snap), Step::Install);
    p.done(&snap);
    assert_eq!(p.step(&item(Kind::Record, 5, 9)), Step::Skip);
    assert_eq!(p.step(&item(Kind::Record, 5, 10)), Step::Skip);
    assert_eq!(p.step(&item(Kind::Record, 5, 11)), Step::Apply);
    p.done(&item(Kind::Record, 5, 11));
    assert_eq!(p.step(&item(Kind::Record, 5, 13)), Step::Gap);
    assert_eq!(
        p.step(&item(Kind::Record, 6, 12)),
        Step::Gap,
        "another active's stream"
    );
    assert_eq!(p.epoch, 2);
}

#[test]
fn acks_wait_for_a_synced_standby_and_only_for_it() {
    let mut g: Gate<u32> = Gate::new(77, 10_000);
    // Alone: acks go at once, nothing published.
    assert!(!g.publishing());
    assert_eq!(g.committed(1, vec![1, 2], 0), vec![1, 2]);
    // A standby joins: it wants a snapshot.
    let (rel, ch, snap) = g.report(&report(0, 0, true), 100, 1);
    assert!(rel.is_empty() && ch.is_none() && snap);
    assert_eq!(g.peer(), PeerState::CatchingUp);
    assert!(g.publishing());
    // While it catches up acks still go at once.
    assert_eq!(g.committed(2, vec![3], 150), vec![3]);
    g.snapshot_sent(2, 200);
    assert_eq!(g.committed(3, vec![4], 250), vec![4]);
    // Asking again soon after does not make a second snapshot.
    let (_, _, again) = g.report(&report(0, 0, true), 300, 1);
    assert!(!again);
    // It installed the snapshot at 2 and synced 3: synced.
    let (rel, ch, _) = g.report(&report(3, 77, false), 400, 1);
    assert!(rel.is_empty());
    assert_eq!(ch, Some(Change::Joined("b".into())));
    assert_eq!(g.peer(), PeerState::Synced);
    // Now acks wait for its report.
    assert!(g.committed(4, vec![5], 500).is_empty());
    assert!(g.committed(5, vec![6, 7], 600).is_empty());
    assert_eq!(g.lag_records(), 2);
    assert_eq!(g.lag_ms(700), 200);
    assert_eq!(g.report(&report(4, 77, false), 700, 1).0, vec![5]);
    assert_eq!(g.report(&report(5, 77, false), 800, 1).0, vec![6, 7]);
    assert_eq!(g.lag_records(), 0);
}

#[test]
fn a_silent_standby_is_lost_after_takeover_s_and_its_held_acks_go() {
    let mut g = synced(1_000);
    assert!(g.committed(2, vec![9], 2_000).is_empty());
    // Beats of another node do not keep it alive.
    g.heard("c", 9_000, 0);
    assert_eq!(g.tick(10_999), (vec![], None));
    g.heard("b", 10_999, 0);
    assert_eq!(g.tick(20_998), (vec![], None));
    let (rel, ch) = g.tick(20_999);
    assert_eq!(rel, vec![9]);
    assert_eq!(ch, Some(Change::Lost("b".into())));
    assert_eq!(g.peer(), PeerState::Lost);
    assert_eq!(g.committed(3, vec![10], 21_000), vec![10]);
    // It comes back on our stream: it missed records, so a snapshot again.
    let (_, _, snap) = g.report(&report(2, 1, false), 30_000, 0);
    assert!(snap);
    assert_eq!(g.peer(), PeerState::CatchingUp);
}

#[test]
fn a_synced_standby_that_falls_behind_releases_the_acks_and_catches_up() {
    let mut g = synced(0);
    assert!(g.committed(2, vec![1], 0).is_empty());
    let (rel, ch, snap) = g.report(&report(1, 1, true), 20_000, 0);
    assert_eq!(rel, vec![1]);
    assert_eq!(ch, Some(Change::Lost("b".into())));
    assert!(snap);
}

#[test]
fn claims_order_by_epoch_then_node() {
    let c = |node: &str, epoch| Claim {
        node: node.into(),
        epoch,
        at: 0,
    };
    assert!(c("a", 3).beats(&c("b", 2)));
    assert!(c("b", 2).beats(&c("a", 2)));
    assert!(!c("a", 2).beats(&c("a", 2)));
    let t = Topics::new("gw");
    assert_eq!(t.node_of(&t.beat("a")), Some("a"));
    assert_eq!(t.node_of(&t.report("b")), Some("b"));
    assert_eq!(t.node_of(&t.stream()), None);
}

#[test]
fn the_standbys_will_loses_it_at_once_and_anothers_does_not() {
    let mut g = synced(0);
    assert!(g.committed(2, vec![4], 0).is_empty());
    assert_eq!(g.gone("c"), (vec![], None));
    assert_eq!(g.peer(), PeerState::Synced);
    assert_eq!(g.gone("b"), (vec![4], Some(Change::Lost("b".into()))));
    assert_eq!(g.peer(), PeerState::Lost);
    assert_eq!(g.gone("b"), (vec![], None));
}

#[test]
fn items_over_the_bound_are_dropped_and_the_next_one_still_arrives() {
    let mut a = Assembler::bounded(2 * FRAME_BYTES);
    let big = vec![1u8; 2 * FRAME_BYTES + 1];
    for f in frames(Kind::Snapshot, 1, 1, 1, &big) {
        assert!(
            a.push(&f).is_none(),
            "an item over the bound never completes"
        );
    }
    // Announcing a million parts is refused at the first frame.
    let mut lie =
        ciborium::de::from_reader::<Frame, _>(&frames(Kind::Record, 1, 1, 2, b"x")[0][..]).unwrap();
    lie.parts = 1_000_000;
    let mut bytes = Vec::new();
    ciborium::ser::into_writer(&lie, &mut bytes).unwrap();
    assert!(a.push(&bytes).is_none());
    let ok = vec![2u8; 2 * FRAME_BYTES];
    let mut got = None;
    for f in frames(Kind::Snapshot, 1, 1, 3, &ok) {
        got = got.or(a.push(&f));
    }
    assert_eq!(got.map(|i| i.data), Some(ok));
}

#[test]
fn a_report_beyond_what_was_sent_releases_only_what_was_sent() {
    let mut g = synced(0);
    assert_eq!(g.committed(2, vec![20], 0), Vec::<u32>::new());
    // A report naming u64::MAX confirms commit 2 at most: commit 3's acks still wait.
    let (released, _, _) = g.report(&report(u64::MAX, 1, false), 10, 10);
    assert_eq!(released, vec![20]);
    assert_eq!(g.committed(3, vec![30], 20), Vec::<u32>::new());
    assert_eq!(g.lag_records(), 1);
    let (released, _, _) = g.report(&report(3, 1, false), 30, 30);
    assert_eq!(released, vec![30]);
}
