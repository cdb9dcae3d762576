//! The engine against a brute-force reference model on random multi-device
//! streams with disorder, lateness, idleness and garbage.

mod support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use support::engine::{Sim, T0};
use tidemark::output::Output;

#[derive(Debug, Clone)]
struct Msg {
    gap: i64,
    group: usize,
    device: usize,
    delay: i64,
    value: i32,
    garbage: bool,
}

fn msg() -> impl Strategy<Value = Msg> {
    (
        prop_oneof![8 => 0i64..1500, 1 => 5_000i64..60_000],
        0usize..2,
        0usize..3,
        prop_oneof![8 => 0i64..2500, 1 => 2_500i64..20_000, 1 => 20_000i64..120_000],
        -50i32..50,
        prop::bool::weighted(0.03),
    )
        // Coarse time steps make window, lateness and idleness boundaries coincide often.
        .prop_map(|(gap, group, device, delay, value, garbage)| Msg {
            gap: gap / 250 * 250,
            group,
            device,
            delay: delay / 250 * 250,
            value,
            garbage,
        })
}

#[derive(Debug, Clone, Copy)]
enum Spec {
    Tumbling(i64),
    Hopping(i64, i64),
    Session(i64),
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        prop::sample::select(vec![1_000i64, 5_000, 60_000]).prop_map(Spec::Tumbling),
        prop::sample::select(vec![(10_000i64, 5_000i64), (6_000, 4_000), (3_000, 1_000)])
            .prop_map(|(s, l)| Spec::Hopping(s, l)),
        prop::sample::select(vec![1_000i64, 3_000, 20_000]).prop_map(Spec::Session),
    ]
}

#[derive(Default)]
struct MWindow {
    end: i64,
    values: Vec<f64>,
    /// Sessions: latest event time.
    last: i64,
    emitted: Option<u32>,
    dirty: bool,
}

#[derive(Default)]
struct MDevice {
    max_event: Option<i64>,
    last_arrival: i64,
    windows: BTreeMap<i64, MWindow>,
}

#[derive(Default)]
struct MGroup {
    wm: Option<i64>,
    max_event: Option<i64>,
    last_arrival: i64,
    devices: BTreeMap<String, MDevice>,
}

struct Model {
    spec: Spec,
    ooo: i64,
    idle: i64,
    lateness: i64,
    groups: BTreeMap<String, MGroup>,
    /// (group, device, start, end, revision, count, sum)
    emitted: Vec<(String, String, i64, i64, u32, u64, i64)>,
    accepted: u64,
    late: u64,
    /// Sum over accepted events of the windows each joined.
    memberships: u64,
}

impl Model {
    fn windows_of(&self, t: i64) -> Vec<(i64, i64)> {
        let (size, slide) = match self.spec {
            Spec::Tumbling(s) => (s, s),
            Spec::Hopping(s, l) => (s, l),
            Spec::Session(gap) => return vec![(t, t + gap)],
        };
        // Every multiple of slide in a generous range, filtered by containment.
        let mut out = Vec::new();
        let mut s = (t - size - slide).div_euclid(slide) * slide;
        while s <= t {
            if s <= t && t < s + size {
                out.push((s, s + size));
            }
            s += slide;
        }
        out
    }

    fn message(&mut self, at: i64, group: &str, device: &str, t: i64, v: f64) {
        let wm = self.groups.get(group).and_then(|g| g.wm);
        let open: Vec<_> = self
            .windows_of(t)
            .into_iter()
            .filter(|&(_, e)| wm.is_none_or(|w| e + self.lateness > w))
            .collect();
        let g = self.groups.entry(group.to_string()).or_default();
        let d = g.devices.entry(device.to_string()).or_default();
        if open.is_empty() {
            self.late += 1;
            return;
        }
        self.accepted += 1;
        self.memberships += open.len() as u64;
        if let Spec::Session(gap) = self.spec {
            // Every session closer than the gap merges with the event.
            let touching: Vec<i64> = d
                .windows
                .iter()
                .filter(|(s, w)| w.end > t && **s < t + gap)
                .map(|(s, _)| *s)
                .collect();
            let mut merged = MWindow {
                end: 0,
                values: vec![v],
                last: t,
                emitted: None,
                dirty: true,
            };
            let mut start = t;
            for s in touching {
                let w = d.windows.remove(&s).unwrap();
                start = start.min(s);
                merged.last = merged.last.max(w.last);
                merged.values.extend(w.values);
                merged.emitted = merged.emitted.max(w.emitted);
            }
            merged.end = merged.last + gap;
            d.windows.insert(start, merged);
        }
        for (s, e) in open
            .into_iter()
            .filter(|_| !matches!(self.spec, Spec::Session(_)))
        {
            let w = d.windows.entry(s).or_insert_with(|| MWindow {
                end: e,
                ..Default::default()
            });
            w.values.push(v);
            w.dirty = true;
            w.last = w.last.max(t);
        }
        d.max_event = Some(d.max_event.map_or(t, |m| m.max(t)));
        d.last_arrival = at;
        g.max_event = Some(g.max_event.map_or(t, |m| m.max(t)));
        g.last_arrival = g.last_arrival.max(at);
    }

    fn tick(&mut self, now: i64) {
        for (gname, g) in &mut self.groups {
            let active: Vec<i64> = g
                .devices
                .values()
                .filter(|d| now - d.last_arrival < self.idle)
                .filter_map(|d| d.max_event)
                .collect();
            let cand = if let Some(m) = active.iter().min() {
                Some(m - self.ooo)
            } else {
                g.max_event
                    .map(|m| m + (now - g.last_arrival) - self.idle - self.ooo)
            };
            g.wm = match (g.wm, cand) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            let Some(wm) = g.wm else { continue };
            for (dname, d) in &mut g.devices {
                for (&s, w) in &mut d.windows {
                    if w.dirty && wm >= w.end {
                        let rev = w.emitted.map_or(0, |r| r + 1);
                        w.emitted = Some(rev);
                        w.dirty = false;
                        let sum: f64 = w.values.iter().sum();
                        self.emitted.push((
                            gname.clone(),
                            dname.clone(),
                            s,
                            w.end,
                            rev,
                            w.values.len() as u64,
                            sum as i64,
                        ));
                    }
                }
                let lateness = self.lateness;
                d.windows.retain(|_, w| wm < w.end + lateness);
            }
        }
    }
}

fn config(spec: Spec, ooo: i64, idle: i64, lateness: i64) -> String {
    let window = match spec {
        Spec::Tumbling(s) => format!("{{ kind = \"tumbling\", size_ms = {s} }}"),
        Spec::Hopping(s, l) => format!("{{ kind = \"hopping\", size_ms = {s}, slide_ms = {l} }}"),
        Spec::Session(gap) => format!("{{ kind = \"session\", gap_ms = {gap} }}"),
    };
    format!(
        "tick_interval_ms = 200\n[time]\npolicy = \"device\"\n[group_defaults]\nout_of_orderness_ms = {ooo}\n\
         idle_timeout_ms = {idle}\nheartbeat_timeout_ms = 100000000\nallowed_lateness_ms = {lateness}\nwindow = {window}\n"
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_reference_model(
        msgs in prop::collection::vec(msg(), 1..300),
        spec in spec(),
        ooo in prop::sample::select(vec![0i64, 500, 2_000]),
        idle in prop::sample::select(vec![3_000i64, 30_000]),
        lateness in prop::sample::select(vec![0i64, 3_000, 30_000]),
    ) {
        let mut sim = Sim::new(&config(spec, ooo, idle, lateness), T0);
        let mut model = Model { spec, ooo, idle, lateness, groups: BTreeMap::new(), emitted: Vec::new(), accepted: 0, late: 0, memberships: 0 };
        let tick = 200;
        let mut next_tick = T0 + tick;
        let mut at = T0;
        let mut last_wm: BTreeMap<String, i64> = BTreeMap::new();
        let mut garbage = 0u64;
        for m in &msgs {
            at += m.gap;
            while next_tick <= at {
                model.tick(next_tick);
                next_tick += tick;
            }
            sim.advance(at);
            for (g, w) in sim.engine().groups().filter_map(|g| g.wm.map(|w| (g.name.to_string(), w))) {
                let prev = last_wm.insert(g.clone(), w);
                prop_assert!(prev.is_none_or(|p| p <= w), "watermark of {} went back", g);
            }
            let group = format!("g{}", m.group);
            let device = format!("d{}", m.device);
            if m.garbage {
                garbage += 1;
                sim.send(at, &format!("sensors/{group}/{device}/reading"), "{\"ts\": [");
                continue;
            }
            let t = at - m.delay;
            sim.reading(at, &group, &device, t, f64::from(m.value));
            model.message(at, &group, &device, t, f64::from(m.value));
        }
        let end = at + 400_000;
        while next_tick <= end {
            model.tick(next_tick);
            next_tick += tick;
        }
        sim.advance(end);

        let got: Vec<_> = sim.out().iter().filter_map(|o| match o {
            Output::Window(w) => Some((w.group.to_string(), w.device.to_string(), w.start, w.end, w.revision, w.count,
                w.metrics.get("temp").map_or(0, |m| m.sum as i64))),
            _ => None,
        }).collect();
        prop_assert_eq!(&got, &model.emitted);

        let c = sim.engine().counters();
        prop_assert_eq!(c.accepted, model.accepted);
        prop_assert_eq!(c.late, model.late);
        prop_assert_eq!(sim.late().len() as u64, model.late, "every late event is published");
        prop_assert_eq!(sim.rejected().len() as u64, garbage, "every bad input is published");
        prop_assert_eq!(c.received, c.accepted + c.late + garbage);

        // Every accepted reading is counted exactly once in each of its windows:
        // the final revisions add up to accepted × windows per event.
        let mut finals: BTreeMap<(String, String, i64), u64> = BTreeMap::new();
        for (g, d, s, _, _, n, _) in &got {
            finals.insert((g.clone(), d.clone(), *s), *n);
        }
        let total: u64 = finals.values().sum();
        // Sessions merge under new starts, so only fixed windows add up this way.
        if !matches!(spec, Spec::Session(_)) {
            prop_assert_eq!(total, model.memberships);
        }
    }
}
