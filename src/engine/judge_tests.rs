//! The judge against a model: whatever order windows and their revisions come
//! in, the transitions standing (emitted, not retracted) are those the known
//! windows make when judged in event-time order from the start.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn verdict(start: Millis, value: i32, has_clear: bool) -> Verdict {
    let when = value > 0;
    Verdict {
        start,
        end: start + 10,
        when,
        clear: if has_clear { value < 0 } else { !when },
    }
}

/// Updates: (window index, value); a window may come again (a revision).
fn updates() -> impl Strategy<Value = Vec<(i64, i32)>> {
    prop::collection::vec((0i64..30, -2i32..3), 1..120)
}

proptest! {
    #[test]
    fn standing_transitions_are_those_of_the_known_windows_in_event_time_order(
        for_windows in 1u32..5,
        sessions in any::<bool>(),
        has_clear in any::<bool>(),
        ups in updates(),
        settle_every in 5usize..40,
    ) {
        let rule = Rule { for_windows, step: (!sessions).then_some(10) };
        let mut judge = Judge::<()>::default();
        let mut known: BTreeMap<Millis, Verdict> = BTreeMap::new();
        let mut standing: BTreeSet<Transition> = BTreeSet::new();
        let mut settled: BTreeSet<Transition> = BTreeSet::new();
        let mut horizon = Millis::MIN;
        let mut events = Vec::new();
        for (n, (k, value)) in ups.iter().enumerate() {
            let start = k * 10;
            if start < horizon {
                continue;
            }
            let v = verdict(start, *value, has_clear);
            known.insert(start, v);
            events.clear();
            judge.window(rule, v, (), &mut events);
            for e in &events {
                match e {
                    Event::Emit(t, ()) => prop_assert!(standing.insert(*t), "emitted twice: {t:?}"),
                    Event::Retract(t, ()) => prop_assert!(standing.remove(t), "retracted, never standing: {t:?}"),
                }
            }
            let want: BTreeSet<Transition> =
                transitions(rule, Base::default(), known.values().copied()).into_iter().collect();
            let have: BTreeSet<Transition> = standing.union(&settled).copied().collect();
            prop_assert_eq!(&have, &want);
            if n % settle_every == settle_every - 1 {
                // Everything before the latest window but two can no longer change.
                horizon = known.keys().rev().nth(2).copied().unwrap_or(Millis::MIN);
                judge.settle(rule, horizon);
                let moved: Vec<Transition> = standing.iter().filter(|t| t.start < horizon).copied().collect();
                for t in moved {
                    standing.remove(&t);
                    settled.insert(t);
                }
            }
        }
    }

    #[test]
    fn the_same_input_gives_the_same_events(for_windows in 1u32..5, ups in updates()) {
        let rule = Rule { for_windows, step: Some(10) };
        let run = || {
            let mut j = Judge::<()>::default();
            let mut all = Vec::new();
            for (k, v) in &ups {
                j.window(rule, verdict(k * 10, *v, false), (), &mut all);
            }
            all
        };
        prop_assert_eq!(run(), run());
    }
}

#[test]
fn a_late_reading_that_lowers_a_window_retracts_the_raise_it_completed() {
    let rule = Rule {
        for_windows: 2,
        step: Some(10),
    };
    let mut j = Judge::<()>::default();
    let mut ev = Vec::new();
    j.window(rule, verdict(0, 1, false), (), &mut ev);
    j.window(rule, verdict(10, 1, false), (), &mut ev);
    let raised = Transition {
        start: 10,
        end: 20,
        state: State::Raised,
    };
    assert_eq!(ev, vec![Event::Emit(raised, ())]);
    ev.clear();
    // Window 0 revised: `when` no longer holds there; the raise is unsupported.
    j.window(rule, verdict(0, 0, false), (), &mut ev);
    assert_eq!(ev, vec![Event::Retract(raised, ())]);
    ev.clear();
    // Window 20 holds: 10 and 20 now make the raise, at 20.
    j.window(rule, verdict(20, 2, false), (), &mut ev);
    assert_eq!(
        ev,
        vec![Event::Emit(
            Transition {
                start: 20,
                end: 30,
                state: State::Raised
            },
            ()
        )]
    );
}

#[test]
fn a_gap_breaks_a_run_and_clear_needs_its_own_run() {
    let rule = Rule {
        for_windows: 2,
        step: Some(10),
    };
    let mut j = Judge::<()>::default();
    let mut ev = Vec::new();
    for (s, v) in [
        (0, 1),
        (20, 1),
        (30, 1),
        (40, -1),
        (50, 0),
        (60, -1),
        (70, -1),
    ] {
        j.window(rule, verdict(s, v, true), (), &mut ev);
    }
    let starts: Vec<(Millis, State)> = ev
        .iter()
        .map(|e| match e {
            Event::Emit(t, ()) | Event::Retract(t, ()) => (t.start, t.state),
        })
        .collect();
    // 0 then a gap: the run restarts at 20; cleared needs -1 twice in a row (60, 70).
    assert_eq!(starts, vec![(30, State::Raised), (70, State::Cleared)]);
    j.settle(rule, 60);
    assert!(j.base().raised);
    assert_eq!(j.kept(), 2);
}
