//! Conditions (docs/conditions.md) against a model over families of inputs:
//! random values crossing the thresholds, runs of 1..4 windows, with and
//! without `clear`, gaps, late readings that revise windows, on tumbling,
//! hopping and session windows. Whatever order the revisions come in, the
//! transitions standing (emitted, not retracted) are those the final window
//! results make, judged in event-time order from the start.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use support::engine::{Sim, T0};
use tidemark::output::{ConditionOut, ConditionState, Output};

const KINDS: [&str; 3] = [
    "{ kind = \"tumbling\", size_ms = 10000 }",
    "{ kind = \"hopping\", size_ms = 10000, slide_ms = 5000 }",
    "{ kind = \"session\", gap_ms = 3000 }",
];

fn config(kind: usize, for_windows: u32, clear: bool) -> String {
    let clear = if clear {
        "clear = \"temp.mean < 40\"\n"
    } else {
        ""
    };
    format!(
        "[time]\npolicy = \"device\"\n[group_defaults]\nwindow = {}\n\
         out_of_orderness_ms = 0\nidle_timeout_ms = 600000\nallowed_lateness_ms = 30000\n\
         heartbeat_timeout_ms = 600000\n\
         [[group_defaults.conditions]]\nname = \"hot\"\nwhen = \"temp.mean > 50 and count >= 1\"\n\
         for_windows = {for_windows}\n{clear}",
        KINDS[kind]
    )
}

fn conditions(sim: &Sim) -> Vec<&ConditionOut> {
    sim.out()
        .iter()
        .filter_map(|o| match o {
            Output::Condition(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// The transitions the final results make: (completing window start, raised?).
fn model(
    windows: &[(i64, i64, f64)],
    for_windows: u32,
    clear: bool,
    step: Option<i64>,
) -> BTreeSet<(i64, bool)> {
    let (mut raised, mut run, mut last) = (false, 0, None::<i64>);
    let mut out = BTreeSet::new();
    for &(start, _, mean) in windows {
        if step.is_some_and(|s| last.is_some_and(|l| start != l + s)) {
            run = 0;
        }
        last = Some(start);
        let holds = if !raised {
            mean > 50.0
        } else if clear {
            mean < 40.0
        } else {
            mean <= 50.0
        };
        run = if holds { run + 1 } else { 0 };
        if run >= for_windows {
            run = 0;
            raised = !raised;
            out.insert((start, raised));
        }
    }
    out
}

/// Readings of one device: (arrival, event time, value), sorted by arrival.
fn readings() -> impl Strategy<Value = Vec<(i64, i64, f64)>> {
    // Per slot of 4 s: nothing (a gap), or one or two readings, maybe late.
    let slot = prop_oneof![
        1 => Just(None),
        5 => (prop::sample::select(vec![30.0, 45.0, 55.0, 70.0]), 0u8..12, 1usize..3)
            .prop_map(Some),
    ];
    prop::collection::vec(slot, 4..40).prop_map(|slots| {
        let mut out = Vec::new();
        for (k, s) in slots.iter().enumerate() {
            let Some((v, late, n)) = s else { continue };
            for j in 0..*n {
                let ts = T0 + k as i64 * 4000 + j as i64 * 1500;
                // Half arrive 6..36 s late: their windows have fired, some are past lateness.
                let delay = if *late < 6 {
                    6000 + i64::from(*late) * 6000
                } else {
                    10
                };
                out.push((ts + delay, ts, *v));
            }
        }
        out.sort_by_key(|r| (r.0, r.1));
        out
    })
}

/// Standing transitions from the records, checking each one's consistency.
fn standing(records: &[&ConditionOut]) -> Result<BTreeSet<(i64, bool)>, TestCaseError> {
    let mut set = BTreeSet::new();
    for c in records {
        let key = match c.state {
            ConditionState::Raised => (c.window_start, true),
            ConditionState::Cleared => (c.window_start, false),
            ConditionState::Retracted => {
                let k = if set.contains(&(c.window_start, true)) {
                    (c.window_start, true)
                } else {
                    (c.window_start, false)
                };
                prop_assert!(set.remove(&k), "retracted, never standing: {}", c.id());
                continue;
            }
        };
        prop_assert!(set.insert(key), "emitted twice while standing: {}", c.id());
        prop_assert_eq!(
            c.id(),
            format!("g/d/hot/{}/{}", c.window_start, c.state.as_str())
        );
    }
    Ok(set)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn standing_transitions_are_those_the_final_results_make(
        rs in readings(),
        kind in 0usize..3,
        for_windows in 1u32..5,
        clear in any::<bool>(),
    ) {
        let run = || {
            let mut sim = Sim::new(&config(kind, for_windows, clear), T0);
            for (at, ts, v) in &rs {
                sim.send(*at, "sensors/g/d/reading", &format!(r#"{{"ts": {ts}, "temp": {v:?}}}"#));
            }
            // A reading far ahead moves the watermark past every window's lateness.
            let end = rs.iter().map(|r| r.0.max(r.1)).max().unwrap_or(T0) + 200_000;
            sim.send(end, "sensors/g/d/reading", &format!(r#"{{"ts": {end}, "temp": 0}}"#));
            sim.advance(end + 1000);
            sim
        };
        let sim = run();
        // Final results: each window's highest revision, in emission order; a
        // session covering later starts merged them away.
        let mut last: BTreeMap<i64, (i64, f64)> = BTreeMap::new();
        for w in sim.windows() {
            let mean = w.metrics.get("temp").map_or(f64::NAN, |m| m.mean);
            if kind == 2 {
                last.retain(|s, _| *s <= w.start || *s >= w.end);
            }
            last.insert(w.start, (w.end, mean));
        }
        let finals: Vec<(i64, i64, f64)> = last.iter().map(|(s, (e, m))| (*s, *e, *m)).collect();
        let step = [Some(10_000), Some(5000), None][kind];
        let want = model(&finals, for_windows, clear, step);
        let records = conditions(&sim);
        let have = standing(&records)?;
        prop_assert_eq!(&have, &want, "finals {:?}", finals);
        // The values of a raise: what `when` read from the completing window.
        for c in records.iter().filter(|c| c.state == ConditionState::Raised) {
            let names: Vec<&str> = c.values.iter().map(|(k, _)| &**k).collect();
            prop_assert_eq!(names, vec!["temp.mean", "count"]);
            prop_assert!(c.values[0].1.is_some_and(|m| m > 50.0), "{:?}", c.values);
        }
        let counters = sim.engine().counters().conditions;
        let by = |s: ConditionState| records.iter().filter(|c| c.state == s).count() as u64;
        prop_assert_eq!(
            counters,
            [by(ConditionState::Raised), by(ConditionState::Cleared), by(ConditionState::Retracted)]
        );
        // Same input, same output.
        let again = run();
        prop_assert_eq!(sim.out(), again.out());
    }
}

/// The reference's overheat example, step by step: a late reading lowers the
/// window that completed the raise, and the raise is retracted.
#[test]
fn a_late_reading_that_disproves_a_raise_retracts_it() {
    let mut sim = Sim::new(&config(0, 2, true), T0);
    let send = |sim: &mut Sim, at: i64, ts: i64, v: f64| {
        sim.send(
            at,
            "sensors/g/d/reading",
            &format!(r#"{{"ts": {ts}, "temp": {v}}}"#),
        );
    };
    send(&mut sim, T0 + 1000, T0 + 1000, 60.0);
    send(&mut sim, T0 + 11_000, T0 + 11_000, 60.0);
    send(&mut sim, T0 + 21_000, T0 + 21_000, 30.0);
    sim.advance(T0 + 22_000);
    let c = conditions(&sim);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].id(), format!("g/d/hot/{}/raised", T0 + 10_000));
    assert_eq!(c[0].window_end, T0 + 20_000);
    assert_eq!(c[0].values[0], ("temp.mean".into(), Some(60.0)));
    // Late, within lateness: window 10..20 s now has mean 35.
    send(&mut sim, T0 + 23_000, T0 + 12_000, 10.0);
    sim.advance(T0 + 32_000);
    let c = conditions(&sim);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[1].id(), format!("g/d/hot/{}/retracted", T0 + 10_000));
    assert_eq!(c[1].state, ConditionState::Retracted);
    // The values that went out with the raise.
    assert_eq!(c[1].values[0], ("temp.mean".into(), Some(60.0)));
    let json = serde_json::to_value(c[1]).unwrap();
    assert_eq!(json["values"]["temp.mean"], 60.0);
    assert_eq!(json["state"], "retracted");
    assert_eq!(
        sim.out()
            .iter()
            .find(|o| matches!(o, Output::Condition(_)))
            .unwrap()
            .topic("tidemark/gw"),
        "tidemark/gw/conditions/g/d"
    );
}

/// A reload changes conditions from the next window: a changed one goes on from
/// its raised state under the new expression, a new one starts, a removed one stops.
#[test]
fn a_reload_changes_conditions_from_the_next_window() {
    let rules = |conds: &str| {
        format!(
            "[time]\npolicy = \"device\"\n[group_defaults]\nwindow = {}\n\
             out_of_orderness_ms = 0\nidle_timeout_ms = 600000\nallowed_lateness_ms = 0\n{conds}",
            KINDS[0]
        )
    };
    let before = "[[group_defaults.conditions]]\nname = \"hot\"\nwhen = \"temp.mean > 50\"\n\
                  [[group_defaults.conditions]]\nname = \"gone\"\nwhen = \"temp.mean > 0\"\n";
    let after = "[[group_defaults.conditions]]\nname = \"hot\"\nwhen = \"temp.mean > 80\"\n\
                 [[group_defaults.conditions]]\nname = \"new\"\nwhen = \"temp.mean > 55\"\n";
    let mut sim = Sim::new(&rules(before), T0);
    let read = |sim: &mut Sim, k: i64, v: f64| {
        let ts = T0 + k * 10_000 + 1000;
        sim.send(
            ts,
            "sensors/g/d/reading",
            &format!(r#"{{"ts": {ts}, "temp": {v}}}"#),
        );
        sim.advance(ts + 500);
    };
    read(&mut sim, 0, 60.0);
    read(&mut sim, 1, 60.0);
    let names = |sim: &Sim| -> Vec<String> {
        conditions(sim)
            .iter()
            .map(|c| format!("{}:{}", c.name, c.state.as_str()))
            .collect()
    };
    assert_eq!(names(&sim), ["hot:raised", "gone:raised"]);
    let text = format!("[gateway]\nid = \"gw\"\n{}", rules(after));
    let cfg = tidemark::config::load_str(&text, &BTreeMap::new()).unwrap();
    sim.engine_mut().reconfigure(&cfg.engine);
    // Window 1 (mean 60) closes now, judged by the new rules: `hot` no longer
    // holds (60 < 80) and clears; `new` holds and raises; `gone` says nothing.
    read(&mut sim, 2, 60.0);
    assert_eq!(
        names(&sim),
        ["hot:raised", "gone:raised", "hot:cleared", "new:raised"]
    );
    assert!(
        conditions(&sim)
            .iter()
            .all(|c| c.window_start < T0 + 20_000)
    );
}
