//! "auto" bound and lateness (docs/reference.md#group_defaults-and-groupsname) over random streams: delays of every
//! size, silences followed by their backlog, several window shapes and adaptive
//! settings. The watermark never moves back, the values in force stay within
//! [min_ms, max_ms], no window id is ever published with two contents (a
//! lateness that rises must not bring back a window already gone), every
//! reading is accepted or published late, and the same input gives the same
//! output.

mod support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use support::engine::{Sim, T0};
use tidemark::engine::Now;
use tidemark::output::Output;

#[derive(Debug, Clone)]
struct Msg {
    gap: i64,
    group: usize,
    device: usize,
    delay: i64,
    /// The device was silent this long and sends its backlog first (ms).
    silence: i64,
}

fn msg() -> impl Strategy<Value = Msg> {
    (
        prop_oneof![8 => 0i64..1500, 1 => 5_000i64..60_000],
        0usize..2,
        0usize..4,
        prop_oneof![6 => 0i64..300, 2 => 300i64..5_000, 1 => 5_000i64..40_000, 1 => 40_000i64..200_000],
        prop_oneof![12 => Just(0i64), 1 => 10_000i64..400_000],
    )
        .prop_map(|(gap, group, device, delay, silence)| Msg {
            gap: gap / 250 * 250,
            group,
            device,
            delay: delay / 250 * 250,
            silence: silence / 1000 * 1000,
        })
}

fn config(window: &str, idle: i64, (q, min, max, horizon): (f64, i64, i64, i64)) -> String {
    format!(
        "tick_interval_ms = 1000\n[time]\npolicy = \"device\"\n[group_defaults]\n\
         out_of_orderness_ms = \"auto\"\nallowed_lateness_ms = \"auto\"\n\
         adaptive = {{ quantile = {q}, min_ms = {min}, max_ms = {max}, horizon_s = {horizon} }}\n\
         idle_timeout_ms = {idle}\nheartbeat_timeout_ms = 100000000\nwindow = {window}\n"
    )
}

/// Runs the stream; returns the outputs' window results as (id, content).
fn run(
    cfg: &str,
    msgs: &[Msg],
    (min, max): (i64, i64),
) -> Result<(Vec<(String, String)>, u64), TestCaseError> {
    let mut sim = Sim::new(cfg, T0);
    let mut at = T0;
    let mut seq: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    let mut last_wm: BTreeMap<String, i64> = BTreeMap::new();
    let mut sent = 0u64;
    let mut check = |sim: &Sim, at: i64| -> Result<(), TestCaseError> {
        for g in sim.engine().group_stats(Now::at(at)) {
            prop_assert!(
                (min..=max).contains(&g.bound_ms),
                "bound {} of {}",
                g.bound_ms,
                g.name
            );
            prop_assert!(
                (min..=max).contains(&g.lateness_ms),
                "lateness {} of {}",
                g.lateness_ms,
                g.name
            );
            if let Some(w) = g.watermark {
                let prev = last_wm.insert(g.name.to_string(), w);
                prop_assert!(
                    prev.is_none_or(|p| p <= w),
                    "watermark of {} went back",
                    g.name
                );
            }
        }
        Ok(())
    };
    for m in msgs {
        at += m.gap;
        sim.advance(at);
        check(&sim, at)?;
        let (group, device) = (format!("g{}", m.group), format!("d{}", m.device));
        let k = seq.entry((m.group, m.device)).or_insert(0);
        if m.silence > 0 {
            // The readings it kept while silent, oldest first, 1 s apart.
            let from = at - m.silence;
            for j in 0..(m.silence / 1000).min(120) {
                *k += 1;
                let t = from + j * 1000;
                sim.reading(at, &group, &device, t, 1.0);
                sent += 1;
            }
            check(&sim, at)?;
        }
        *k += 1;
        sim.reading(at, &group, &device, at - m.delay, 1.0);
        sent += 1;
    }
    sim.advance(at + 1_000_000);
    check(&sim, at + 1_000_000)?;
    let c = sim.engine().counters();
    prop_assert_eq!(c.received, sent);
    prop_assert_eq!(
        c.accepted + c.late,
        sent,
        "every reading accepted or published late"
    );
    prop_assert_eq!(sim.late().len() as u64, c.late);
    let windows = sim
        .out()
        .iter()
        .filter_map(|o| match o {
            Output::Window(w) => Some((
                w.id.clone(),
                format!("{} {} {} {}", w.end, w.count, w.heartbeats, w.metrics.len()),
            )),
            _ => None,
        })
        .collect();
    Ok((windows, c.accepted))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn adaptive_watermarks_keep_their_invariants(
        msgs in prop::collection::vec(msg(), 1..250),
        window in prop::sample::select(vec![
            "{ kind = \"tumbling\", size_ms = 1000 }",
            "{ kind = \"tumbling\", size_ms = 10000 }",
            "{ kind = \"hopping\", size_ms = 6000, slide_ms = 2000 }",
            "{ kind = \"session\", gap_ms = 3000 }",
        ]),
        idle in prop::sample::select(vec![3_000i64, 30_000]),
        q in prop::sample::select(vec![0.5f64, 0.9, 0.999]),
        min in prop::sample::select(vec![0i64, 100, 2_000]),
        max in prop::sample::select(vec![2_000i64, 60_000, 600_000]),
        horizon in prop::sample::select(vec![5i64, 60, 900]),
    ) {
        let cfg = config(window, idle, (q, min, max, horizon));
        let (windows, accepted) = run(&cfg, &msgs, (min, max))?;
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (id, content) in &windows {
            let prev = seen.insert(id, content);
            prop_assert!(prev.is_none_or(|p| p == content), "window {} published with two contents", id);
        }
        // Every accepted reading is in the final revision of its window (tumbling: one each).
        if window.contains("tumbling") {
            let mut finals: BTreeMap<String, u64> = BTreeMap::new();
            for (id, content) in &windows {
                let (key, _) = id.rsplit_once('/').unwrap();
                let count: u64 = content.split(' ').nth(1).unwrap().parse().unwrap();
                finals.insert(key.to_owned(), count);
            }
            prop_assert_eq!(finals.values().sum::<u64>(), accepted);
        }
        // Deterministic: the same input, the same output.
        let (again, _) = run(&cfg, &msgs, (min, max))?;
        prop_assert_eq!(windows, again);
    }
}

const FIXED: &str = "[time]\npolicy = \"device\"\n[group_defaults]\nout_of_orderness_ms = 2000\n\
    allowed_lateness_ms = 30000\nwindow = { kind = \"tumbling\", size_ms = 10000 }\n";

fn group(sim: &Sim, at: i64) -> tidemark::engine::GroupStats {
    sim.engine().group_stats(Now::at(at)).remove(0)
}

/// Four devices, one reading per second each, every `disorder`-th one `late_by` ms
/// behind its device's latest; from `from` for `seconds`.
fn stream(sim: &mut Sim, from: i64, seconds: i64, late_by: i64) -> i64 {
    let mut at = from;
    for s in 0..seconds {
        for d in 0..4 {
            at = from + s * 1000 + d * 10;
            let t = if late_by > 0 && s % 10 == 5 {
                at - late_by
            } else {
                at - 50
            };
            sim.reading(at, "g", &format!("d{d}"), t, 1.0);
        }
    }
    at
}

#[test]
fn the_bound_rises_with_the_first_disorder_falls_back_and_a_reload_switches_fixed_and_auto() {
    let mut sim = Sim::new(FIXED, T0);
    let mut at = stream(&mut sim, T0, 30, 0);
    assert_eq!(
        (group(&sim, at).bound_ms, group(&sim, at).lateness_ms),
        (2000, 30000)
    );
    let auto = FIXED
        .replace(
            "out_of_orderness_ms = 2000",
            "out_of_orderness_ms = \"auto\"",
        )
        .replace(
            "allowed_lateness_ms = 30000",
            "allowed_lateness_ms = \"auto\"\nadaptive = { horizon_s = 120 }",
        );
    let text = format!("[gateway]\nid = \"gw\"\n{auto}");
    let cfg = tidemark::config::load_str(&text, &BTreeMap::new()).unwrap();
    sim.engine_mut().reconfigure(&cfg.engine);
    // In order: the lower clamp.
    at = stream(&mut sim, at + 1000, 30, 0);
    sim.advance(at + 500);
    assert_eq!(
        (group(&sim, at).bound_ms, group(&sim, at).lateness_ms),
        (100, 100)
    );
    let wm_before = group(&sim, at).watermark.unwrap();
    // Readings 5.95 s behind their device's latest: the bound takes that at once
    // (within its histogram bucket, 5 %), W holds.
    at = stream(&mut sim, at + 1000, 6, 7_000);
    sim.advance(at + 300);
    let g = group(&sim, at);
    assert!(
        (5_950..=5_950 * 105 / 100).contains(&g.bound_ms),
        "{}",
        g.bound_ms
    );
    assert!(g.watermark.unwrap() >= wm_before);
    // In order again: back to the clamp within the horizon (event time).
    at = stream(&mut sim, at + 1000, 120, 0);
    sim.advance(at + 300);
    assert_eq!(group(&sim, at).bound_ms, 100);
    // A device silent for 5 minutes comes back with its backlog: the lateness
    // learns how far behind it was, and its readings are first results.
    let late_before = sim.engine().counters().late;
    let silent_from = at;
    for s in 0..300 {
        for d in 0..3 {
            at = silent_from + s * 1000 + d * 10;
            sim.reading(at, "g", &format!("d{d}"), at - 50, 1.0);
        }
    }
    for k in 0..300 {
        sim.reading(at + 5, "g", "d3", silent_from + k * 1000, 1.0);
    }
    sim.advance(at + 1000);
    let g = group(&sim, at + 1000);
    assert!(g.lateness_ms > 250_000, "{}", g.lateness_ms);
    // Only the readings of the window it went silent in can be late: that window
    // was fired and gone (a lateness of 100 ms then); every later one is new.
    let late = sim.engine().counters().late - late_before;
    assert!(late <= 10, "{late} of the backlog late");
    // Back to fixed values: the group's learning is dropped, the values are the config's.
    let cfg = tidemark::config::load_str(
        &format!("[gateway]\nid = \"gw\"\n{FIXED}"),
        &BTreeMap::new(),
    )
    .unwrap();
    sim.engine_mut().reconfigure(&cfg.engine);
    at = stream(&mut sim, at + 2000, 5, 0);
    assert_eq!(
        (group(&sim, at).bound_ms, group(&sim, at).lateness_ms),
        (2000, 30000)
    );
    assert!(sim.engine().groups().all(|g| g.adaptive.is_none()));
}

/// Windows gone under fixed values carry no per-device mark: after a reload to
/// "auto" lateness, an event for one is late, never a second first result.
#[test]
fn a_reload_to_auto_lateness_never_brings_back_a_window_gone_before_it() {
    let fixed = FIXED.replace("allowed_lateness_ms = 30000", "allowed_lateness_ms = 1000");
    let mut sim = Sim::new(&fixed, T0);
    let at = stream(&mut sim, T0, 40, 0);
    sim.advance(at + 500);
    let first: Vec<String> = sim.windows().iter().map(|w| w.id.clone()).collect();
    assert!(
        first.iter().any(|id| id.ends_with(&format!("d0/{T0}/0"))),
        "{first:?}"
    );
    let auto = fixed.replace(
        "allowed_lateness_ms = 1000",
        "allowed_lateness_ms = \"auto\"",
    );
    let cfg =
        tidemark::config::load_str(&format!("[gateway]\nid = \"gw\"\n{auto}"), &BTreeMap::new())
            .unwrap();
    sim.engine_mut().reconfigure(&cfg.engine);
    let late = sim.engine().counters().late;
    // A reading for d0's first window, long fired and gone.
    sim.reading(at + 600, "g", "d0", T0 + 5_000, 1.0);
    sim.advance(at + 2_000);
    assert_eq!(sim.engine().counters().late, late + 1);
    let ids: Vec<&str> = sim.windows().iter().map(|w| w.id.as_str()).collect();
    let first_id = format!("g/d0/{T0}/0");
    assert_eq!(ids.iter().filter(|i| **i == first_id).count(), 1, "{ids:?}");
}
