//! A reload that changes the window rule (docs/reference.md#reload-sighup-systemctl-reload-tidemark), over families of inputs:
//! every rule kind to every other, reloads at any moment, events in and out of
//! order, late ones, both signs of disorder. No window crosses a switch point,
//! no reading is counted twice or lost, ids stay unique.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use support::engine::{Sim, T0};
use tidemark::config;

const RULES: [&str; 6] = [
    "{ kind = \"tumbling\", size_ms = 1000 }",
    "{ kind = \"tumbling\", size_ms = 3000 }",
    "{ kind = \"tumbling\", size_ms = 7000 }",
    "{ kind = \"session\", gap_ms = 2000 }",
    "{ kind = \"session\", gap_ms = 500 }",
    "{ kind = \"hopping\", size_ms = 4000, slide_ms = 1000 }",
];

fn toml(rule: usize, lateness: i64) -> String {
    format!(
        "[time]\npolicy = \"device\"\n[group_defaults]\nout_of_orderness_ms = 300\n\
         idle_timeout_ms = 60000\nheartbeat_timeout_ms = 3600000\nallowed_lateness_ms = {lateness}\n\
         window = {}\n",
        RULES[rule]
    )
}

fn reconfigure(sim: &mut Sim, rule: usize, lateness: i64) {
    let text = format!("[gateway]\nid = \"gw\"\n{}", toml(rule, lateness));
    let cfg = config::load_str(&text, &BTreeMap::new()).expect("valid");
    let now = tidemark::engine::Now::at(sim.now);
    sim.driver.reconfigure(now, &cfg);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn windows_never_cross_a_switch_point_and_every_reading_counts_once(
        events in prop::collection::vec((0i64..700, -1500i64..1500, 0usize..3), 20..250),
        reloads in prop::collection::vec((0usize..120, 0usize..RULES.len()), 1..5),
        first in 0usize..RULES.len(),
        tumbling_only in any::<bool>(),
        lateness in prop::sample::select(vec![0i64, 2_000, 600_000]),
    ) {
        // Half the cases switch between tumbling rules only, so counts can be checked exactly.
        let pick = |r: usize| if tumbling_only { r % 3 } else { r };
        let first = pick(first);
        let mut sim = Sim::new(&toml(first, lateness), T0);
        let mut rules = vec![first];
        let mut switch_points = BTreeSet::new();
        let mut at = T0;
        let mut reload_at: BTreeMap<usize, usize> = reloads.into_iter().collect();
        for (i, (gap, disorder, device)) in events.iter().enumerate() {
            if let Some(rule) = reload_at.remove(&i).map(pick) {
                reconfigure(&mut sim, rule, lateness);
                rules.push(rule);
                for e in sim.engine().group_rules_of("g") {
                    if e.from != i64::MIN {
                        switch_points.insert(e.from);
                    }
                }
            }
            at += gap;
            sim.reading(at, "g", &format!("d{device}"), at + disorder, 1.0);
        }
        sim.advance(at + 5_000);
        sim.driver.flush();
        // The last revision of each window, by id's (device, start).
        let mut last: BTreeMap<(String, i64), (i64, u64, u32)> = BTreeMap::new();
        let mut ids = BTreeSet::new();
        for w in sim.windows() {
            prop_assert!(ids.insert(w.id.clone()), "id {} emitted twice", w.id);
            let k = (w.device.to_string(), w.start);
            if last.get(&k).is_none_or(|&(_, _, r)| r < w.revision) {
                last.insert(k, (w.end, w.count, w.revision));
            }
        }
        for ((d, start), (end, _, _)) in &last {
            for &t in &switch_points {
                prop_assert!(
                    !(*start < t && t < *end),
                    "window {d} [{start}, {end}) crosses the switch point {t}"
                );
            }
        }
        // Tumbling rules only: each accepted reading is in exactly one window (a session
        // that grows backwards supersedes a result under another start; hopping windows overlap).
        if rules.iter().all(|&r| r <= 2) {
            let counted: u64 = last.values().map(|&(_, c, _)| c).sum();
            let c = sim.engine().counters();
            prop_assert_eq!(counted, c.accepted);
            prop_assert_eq!(c.accepted + c.late, events.len() as u64);
            // Windows of one device never overlap (while none is purged: a session
            // re-opened by an event after its merged session was purged may, rule or not).
            let mut by_device: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
            for ((d, s), (e, _, _)) in &last {
                by_device.entry(d.as_str()).or_default().push((*s, *e));
            }
            for (d, mut spans) in by_device.into_iter().filter(|_| lateness == 600_000) {
                spans.sort_unstable();
                for pair in spans.windows(2) {
                    prop_assert!(pair[0].1 <= pair[1].0, "{d}: {:?} overlaps {:?}", pair[0], pair[1]);
                }
            }
        }
    }
}

#[test]
fn readings_before_the_switch_point_stay_in_old_rule_windows_and_the_one_across_it_ends_there() {
    // 10 s windows; the latest event is at T0 + 4.5 s, so the switch to 3 s windows is at
    // the first 3 s boundary at or after T0 + 10 s: T0 + 12 s.
    let mut sim = Sim::new(
        &toml(0, 600_000).replace("size_ms = 1000", "size_ms = 10000"),
        T0,
    );
    for k in 0..10 {
        sim.reading(T0 + k * 500, "g", "d", T0 + k * 500, 1.0);
    }
    reconfigure(&mut sim, 1, 600_000);
    let rules = sim.engine().group_rules_of("g");
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[1].from, T0 + 12_000);
    // Readings before the switch go to the old window (ending at the switch), after it to 3 s ones.
    for k in 10..40 {
        sim.reading(T0 + k * 500, "g", "d", T0 + k * 500, 1.0);
    }
    sim.driver.flush();
    let mut last: BTreeMap<i64, (u32, i64, u64)> = BTreeMap::new();
    for w in sim.windows() {
        let e = last
            .entry(w.start - T0)
            .or_insert((w.revision, w.end - T0, w.count));
        if w.revision >= e.0 {
            *e = (w.revision, w.end - T0, w.count);
        }
    }
    let spans: Vec<(i64, i64, u64)> = last.iter().map(|(s, &(_, e, c))| (*s, e, c)).collect();
    assert_eq!(
        spans,
        vec![
            (0, 10_000, 20),
            (10_000, 12_000, 4),
            (12_000, 15_000, 6),
            (15_000, 18_000, 6),
            (18_000, 21_000, 4),
        ]
    );
}
