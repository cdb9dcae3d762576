use super::*;
use crate::pair::{Change, Gate, Kind, PeerState, Seen, frames};

const TAKEOVER: Millis = 10_000;

fn claim(node: &str, epoch: u64) -> Claim {
    Claim {
        node: node.into(),
        epoch,
        at: 0,
    }
}

fn beat(node: &str, inst: u64, pos: u64, dead: bool) -> Beat {
    Beat {
        node: node.into(),
        role: Role::Active,
        epoch: 1,
        pos,
        inst,
        dead,
        sent: 0,
    }
}

fn frame(kind: Kind, stream: u64, pos: u64) -> Vec<u8> {
    frames(kind, 1, stream, pos, b"x").remove(0)
}

/// A standby "b" (inst 7) following "a" (epoch 1), its snapshot at 10 on stream 5 installed at 0.
fn synced() -> Follower {
    let mut f = Follower::new("b", 7, TAKEOVER, 1 << 20, Some(claim("a", 1)), None, 0);
    let out = f.frame(&frame(Kind::Snapshot, 5, 10), 0, 0);
    let [Action::Install(item)] = &out[..] else {
        panic!("{out:?}")
    };
    let out = f.installed(item, true);
    assert!(matches!(out[0], Action::MarkSynced(p) if p.pos == 10 && p.stream == 5));
    assert!(matches!(&out[1], Action::Report(r) if !r.want && r.pos == 10));
    f
}

fn claims(out: &[Action]) -> Vec<Claim> {
    out.iter()
        .filter_map(|a| match a {
            Action::Claim(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// Ticks every 200 ms from `from` to `to`, this board's own beat echoed at each.
fn run(f: &mut Follower, from: Millis, to: Millis) -> Vec<Action> {
    let mut out = Vec::new();
    let mut t = from;
    while t <= to {
        f.beat("b", &beat("b", 7, 0, false), t, t);
        out.extend(f.tick(t, t));
        t += 200;
    }
    out
}

#[test]
fn silence_past_takeover_s_claims_the_next_epoch_and_takes_over_once_held() {
    let mut f = synced();
    f.beat("a", &beat("a", 1, 10, false), 1_000, 1_000);
    assert!(
        claims(&run(&mut f, 1_000, 10_800)).is_empty(),
        "silent < takeover_s"
    );
    assert_eq!(f.status(10_800, 0).peer.state, PeerStateName::Synced);
    let out = run(&mut f, 11_000, 11_000);
    assert_eq!(
        claims(&out),
        vec![Claim {
            at: 11_000,
            ..claim("b", 2)
        }]
    );
    assert_eq!(f.status(11_000, 0).peer.state, PeerStateName::Lost);
    let out = f.claimed(claims(&out)[0].clone(), Claimed::Held, 11_100);
    assert_eq!(
        out,
        vec![Action::TakeOver(
            Claim {
                at: 11_000,
                ..claim("b", 2)
            },
            "a".into(),
            10
        )]
    );
}

#[test]
fn silence_without_a_proven_path_or_the_state_is_no_takeover() {
    // No echo of its own beat: the silence may be this board's own.
    let mut f = synced();
    let mut out = Vec::new();
    for t in (0..30_000).step_by(200) {
        out.extend(f.tick(t, t));
    }
    assert!(claims(&out).is_empty());
    // Never caught up: it says why, once per takeover_s, and does not claim.
    let mut f = Follower::new("b", 7, TAKEOVER, 1 << 20, Some(claim("a", 1)), None, 0);
    let out = run(&mut f, 0, 30_000);
    assert!(claims(&out).is_empty());
    let said = out
        .iter()
        .filter(|a| matches!(a, Action::Say(Note::CannotTakeOver(n)) if n == "a"))
        .count();
    assert_eq!(said, 3, "at 10, 20 and 30 s: {out:?}");
}

#[test]
fn a_stall_of_the_board_itself_restarts_the_silence() {
    let mut f = synced();
    run(&mut f, 0, 4_000);
    // 9 s without a tick: the board was paused, not the active silent.
    let out = f.tick(13_000, 13_000);
    assert!(out.contains(&Action::Say(Note::Stalled(9_000))));
    assert!(claims(&out).is_empty());
    assert!(claims(&run(&mut f, 13_200, 22_800)).is_empty());
    assert_eq!(claims(&run(&mut f, 23_000, 23_000)).len(), 1);
}

#[test]
fn a_will_of_the_active_takes_over_at_once_and_anothers_does_not() {
    let mut f = synced();
    run(&mut f, 0, 1_000);
    assert!(f.beat("c", &beat("c", 3, 0, true), 1_100, 1_100).is_empty());
    assert!(claims(&run(&mut f, 1_200, 1_200)).is_empty());
    let out = f.beat("a", &beat("a", 1, 0, true), 1_300, 1_300);
    assert_eq!(out, vec![Action::Say(Note::ActiveGone("a".into()))]);
    assert_eq!(claims(&run(&mut f, 1_400, 1_400)).len(), 1);
    // A beat of the active after its will: it lives.
    f.beat("a", &beat("a", 1, 10, false), 1_500, 1_500);
    assert!(claims(&run(&mut f, 1_600, 1_600)).is_empty());
}

#[test]
fn a_rival_claim_within_the_settle_time_wins_and_one_after_it_does_not() {
    let mine = claim("b", 2);
    let rival = claim("c", 2);
    let mut race = ClaimRace::new(mine.clone(), 0);
    assert_eq!(race.outcome(100, false), None);
    race.seen(mine.clone(), 100);
    race.seen(claim("a", 1), 150);
    assert_eq!(race.deadline(), 100 + CLAIM_SETTLE_MS);
    race.seen(rival.clone(), 400);
    assert_eq!(
        race.outcome(600, false),
        Some(Claimed::Superseded(rival.clone()))
    );
    // The same rival after the settle time: the claim is held.
    let mut race = ClaimRace::new(mine.clone(), 0);
    race.seen(mine.clone(), 100);
    assert_eq!(race.outcome(600, false), Some(Claimed::Held));
    // Never echoed.
    let race = ClaimRace::new(mine.clone(), 0);
    assert_eq!(race.outcome(CLAIM_ECHO_MS - 1, false), None);
    assert_eq!(race.outcome(CLAIM_ECHO_MS, false), Some(Claimed::NoEcho));
    // The standby follows the winner: its silence starts again.
    let mut f = synced();
    let out = f.claimed(mine, Claimed::Superseded(rival.clone()), 20_000);
    assert_eq!(out, vec![Action::Say(Note::Superseded(rival.clone()))]);
    assert_eq!(f.claim(), Some(&rival));
    assert!(!f.silent(20_000));
    assert!(claims(&run(&mut f, 20_000, 29_800)).is_empty());
    assert_eq!(
        claims(&run(&mut f, 30_000, 30_000)),
        vec![Claim {
            at: 30_000,
            ..claim("b", 3)
        }]
    );
}

#[test]
fn a_higher_epoch_seen_while_active_deposes_and_an_older_one_is_overwritten() {
    let own = claim("a", 3);
    assert_eq!(own.judge(Some(claim("b", 4))), Seen::Deposed(claim("b", 4)));
    assert_eq!(own.judge(Some(claim("b", 3))), Seen::Deposed(claim("b", 3)));
    assert_eq!(own.judge(Some(claim("b", 2))), Seen::Overwritten);
    assert_eq!(own.judge(None), Seen::Overwritten);
    assert_eq!(own.judge(Some(claim("a", 3))), Seen::Own);
    // The standby: a replayed older claim never replaces the one known.
    let mut f = synced();
    f.state(claim("c", 4), 0);
    f.state(claim("a", 1), 0);
    assert_eq!(f.claim(), Some(&claim("c", 4)));
}

#[test]
fn a_report_for_an_old_stream_releases_the_acks_and_asks_for_a_snapshot() {
    let report = |stream, pos| Report {
        node: "b".into(),
        stream,
        pos,
        want: false,
    };
    let mut g: Gate<u32> = Gate::new(2, TAKEOVER);
    g.report(
        &Report {
            want: true,
            ..report(0, 0)
        },
        0,
        0,
    );
    g.snapshot_sent(1, 0);
    g.report(&report(2, 1), 0, 0);
    assert_eq!(g.peer(), PeerState::Synced);
    assert!(g.committed(2, vec![9], 0).is_empty());
    // The standby still reports the stream of the active before this one.
    let (released, change, snapshot) = g.report(&report(1, 50), 100, 100);
    assert_eq!(released, vec![9]);
    assert_eq!(change, Some(Change::Lost("b".into())));
    assert!(snapshot);
    assert_eq!(g.peer(), PeerState::CatchingUp);
    // Asked again only after the retry time.
    assert!(!g.report(&report(1, 50), 200, 200).2);
    // The standby's side: a record of another stream is a gap.
    let mut f = synced();
    let out = f.frame(&frame(Kind::Record, 4, 11), 0, 0);
    assert!(out.contains(&Action::Unmark));
    assert!(matches!(out.last(), Some(Action::Report(r)) if r.want && r.stream == 5));
}

#[test]
fn a_gap_asks_for_a_snapshot_once_and_records_in_order_apply() {
    let mut f = synced();
    let out = f.frame(&frame(Kind::Record, 5, 11), 10, 10);
    let [Action::Apply(item)] = &out[..] else {
        panic!("{out:?}")
    };
    let out = f.applied(item, true, 10);
    assert!(matches!(&out[..], [Action::Report(r)] if r.pos == 11 && !r.want));
    assert!(
        f.frame(&frame(Kind::Record, 5, 11), 20, 20).is_empty(),
        "had it"
    );
    let out = f.frame(&frame(Kind::Record, 5, 13), 30, 30);
    assert_eq!(out[0], Action::Say(Note::Gap(13)));
    assert_eq!(out[1], Action::Unmark);
    assert!(matches!(&out[2], Action::Report(r) if r.want && r.pos == 11));
    // Asking again says nothing new.
    let out = f.frame(&frame(Kind::Record, 5, 14), 40, 40);
    assert!(matches!(&out[..], [Action::Report(r)] if r.want));
    assert_eq!(f.status(40, 0).peer.state, PeerStateName::CatchingUp);
    // A record that does not apply asks for a snapshot too.
    let mut f = synced();
    let out = f.frame(&frame(Kind::Record, 5, 11), 10, 10);
    let [Action::Apply(item)] = &out[..] else {
        panic!("{out:?}")
    };
    assert!(
        matches!(&f.applied(item, false, 10)[..], [Action::Unmark, Action::Report(r)] if r.want)
    );
}

#[test]
fn a_replica_in_sync_at_stop_takes_over_while_the_active_stays_silent() {
    let at = Position {
        stream: 0,
        pos: 40,
        epoch: 3,
    };
    let mut f = Follower::new("b", 7, TAKEOVER, 1 << 20, Some(claim("a", 3)), Some(at), 0);
    let out = run(&mut f, 0, 10_000);
    assert_eq!(
        claims(&out),
        vec![Claim {
            at: 10_000,
            ..claim("b", 4)
        }]
    );
    // Once the active is heard, the disk's replica is behind it: no takeover from it.
    let mut f = Follower::new("b", 7, TAKEOVER, 1 << 20, Some(claim("a", 3)), Some(at), 0);
    f.beat("a", &beat("a", 1, 41, false), 100, 100);
    assert_eq!(f.status(100, 0).lag_records, 1);
    assert!(claims(&run(&mut f, 200, 30_000)).is_empty());
}
