//! Clock calibration under network jitter (docs/reference.md#time): over families of delay
//! distributions, rates and offsets the estimate is exactly the min filter's
//! value, and real clock steps are still adopted.

mod support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use support::engine::Rng;
use tidemark::time::skew::{Sample, SkewEstimator};

const T0: i64 = 1_764_480_000_000;
const WINDOW: usize = 32;

#[derive(Debug, Clone, Copy)]
enum Dist {
    /// 20 ms .. 3 s.
    Uniform,
    /// Mean 300 ms, capped at 10 s.
    Exponential,
    /// 95 % of the time 20–80 ms; 5 % retry bursts of 2–6 s delays lasting up to 10 s.
    Bimodal,
    /// Pareto, 20 ms scale, shape 1.5 (heavy tail), capped at 60 s.
    Pareto,
}

const DISTS: [Dist; 4] = [
    Dist::Uniform,
    Dist::Exponential,
    Dist::Bimodal,
    Dist::Pareto,
];

/// Network delay of successive messages sent `every_ms` apart.
struct Delays {
    dist: Dist,
    rng: Rng,
    every_ms: i64,
    burst_until: i64,
}

impl Delays {
    fn new(dist: Dist, seed: u64, every_ms: i64) -> Self {
        Self {
            dist,
            rng: Rng(seed),
            every_ms,
            burst_until: i64::MIN,
        }
    }

    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    fn at(&mut self, sent: i64) -> i64 {
        match self.dist {
            Dist::Uniform => self.rng.range(20, 3_000),
            Dist::Exponential => ((-300.0 * self.rng.unit().ln()) as i64).min(10_000),
            Dist::Bimodal => {
                // Bursts of mean 5.5 s start at a rate that keeps 5 % of the time in them.
                let start_per_ms = 0.05 / (5_500.0 * 0.95);
                if sent >= self.burst_until && self.rng.unit() < start_per_ms * self.every_ms as f64
                {
                    self.burst_until = sent + self.rng.range(1_000, 10_000);
                }
                if sent < self.burst_until {
                    self.rng.range(2_000, 6_000)
                } else {
                    self.rng.range(20, 80)
                }
            }
            Dist::Pareto => ((20.0 * self.rng.unit().powf(-1.0 / 1.5)) as i64).min(60_000),
        }
    }
}

/// (arrival, device_ts, sent) of a device `offset_of(sent)` ms behind the gateway, by arrival.
fn messages(
    delays: &mut Delays,
    from: i64,
    to: i64,
    every_ms: i64,
    offset_of: impl Fn(i64) -> i64,
) -> Vec<(i64, i64, i64)> {
    let mut out = Vec::new();
    let mut t = from;
    while t < to {
        out.push((t + delays.at(t), t - offset_of(t), t));
        t += every_ms;
    }
    out.sort_by_key(|m| m.0);
    out
}

/// The plain min filter: smallest sample over the last `WINDOW` one-second buckets.
#[derive(Default)]
struct MinFilter {
    buckets: BTreeMap<i64, i64>,
}

impl MinFilter {
    fn add(&mut self, arrival: i64, offset: i64) -> i64 {
        let b = self
            .buckets
            .entry(arrival.div_euclid(1000))
            .or_insert(offset);
        *b = (*b).min(offset);
        while self.buckets.len() > WINDOW {
            self.buckets.pop_first();
        }
        *self.buckets.values().min().expect("one bucket at least")
    }
}

const RATES_MS: [i64; 3] = [5_000, 1_000, 200];

proptest! {
    // PROPTEST_CASES raises the case count for a longer soak.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96)
    ))]

    #[test]
    fn jitter_never_resets_and_the_estimate_is_exactly_the_min_filter(
        seed in any::<u64>(),
        dist in 0usize..4,
        rate in 0usize..3,
        offset in -3_600_000i64..=3_600_000,
    ) {
        let every = RATES_MS[rate];
        let mut delays = Delays::new(DISTS[dist], seed, every);
        let span = (every * 600).max(900_000);
        let msgs = messages(&mut delays, T0, T0 + span, every, |_| offset);
        let mut e = SkewEstimator::default();
        let mut reference = MinFilter::default();
        for (i, &(arrival, ts, _)) in msgs.iter().enumerate() {
            let s = e.observe(arrival, ts, WINDOW);
            prop_assert_ne!(s, Sample::Reset, "{:?} every {} ms: reset at message {}", DISTS[dist], every, i);
            let want = reference.add(arrival, arrival - ts);
            prop_assert_eq!(e.estimate(), Some(want), "{:?} every {} ms: message {}", DISTS[dist], every, i);
        }
    }
}

/// Arrival time from the step until the estimate is, for good, closer to the new offset than
/// to the old one; None if that never happens within the run.
fn adoption_ms(dist: Dist, seed: u64, every: i64, step: i64) -> Option<i64> {
    let old = 42_000;
    let new = old + step;
    let step_at = T0 + 300_000;
    let mut delays = Delays::new(dist, seed, every);
    let msgs = messages(&mut delays, T0, step_at + 300_000, every, |t| {
        if t < step_at { old } else { new }
    });
    let mut e = SkewEstimator::default();
    let mut adopted = None;
    for &(arrival, ts, sent) in &msgs {
        e.observe(arrival, ts, WINDOW);
        if sent < step_at {
            continue;
        }
        let est = e.estimate().expect("estimate");
        let near_new = (est - new).abs() < (est - old).abs();
        match (near_new, adopted) {
            (true, None) => adopted = Some(arrival - step_at),
            (false, Some(_)) => adopted = None,
            _ => {}
        }
    }
    adopted
}

#[test]
fn real_steps_are_adopted_under_every_delay_distribution() {
    let steps = [10_000, -10_000, 120_000, -120_000, 1_020_000, -1_020_000];
    let mut table = String::from(
        "seconds from a clock step until the estimate holds the new offset (worst of 8 seeds)\n\
         rate    distribution  |  +10 s  -10 s +2 min -2 min +17 min -17 min\n",
    );
    for (rate, every) in [("0.2 Hz", 5_000), ("1 Hz", 1_000), ("5 Hz", 200)] {
        for dist in DISTS {
            table.push_str(&format!("{rate:<7} {:<13} |", format!("{dist:?}")));
            for step in steps {
                let worst = (0..8u64)
                    .map(|seed| {
                        adoption_ms(dist, seed * 7 + 1, every, step).unwrap_or_else(|| {
                            panic!("{dist:?} at {rate}: step {step} ms never adopted")
                        })
                    })
                    .max()
                    .expect("seeds");
                // At the latest once the min filter's horizon (32 buckets) has passed, plus
                // the time the step's minimum takes to settle.
                let bound = (WINDOW as i64 + 8) * every.max(1_000) + 60_000;
                assert!(
                    worst <= bound,
                    "{dist:?} at {rate}: step {step} ms took {worst} ms"
                );
                #[allow(clippy::cast_precision_loss)]
                table.push_str(&format!(" {:>6.1}", worst as f64 / 1000.0));
            }
            table.push('\n');
        }
    }
    println!("{table}");
}

#[test]
fn satellite_link_with_eight_seconds_of_jitter_never_steps() {
    for seed in 0..20u64 {
        let mut rng = Rng(seed);
        let mut e = SkewEstimator::default();
        let mut t = T0;
        let mut msgs = Vec::new();
        while t < T0 + 1_800_000 {
            msgs.push((t + 550 + rng.range(0, 8_000), t + 3_000));
            t += 1_000;
        }
        msgs.sort_by_key(|m| m.0);
        let mut reference = MinFilter::default();
        for (arrival, ts) in msgs {
            assert_ne!(e.observe(arrival, ts, WINDOW), Sample::Reset, "seed {seed}");
            assert_eq!(e.estimate(), Some(reference.add(arrival, arrival - ts)));
        }
    }
}

/// The recorded site of the issue: three devices at 1 Hz (clocks +0, +17 min, −3 min),
/// network delay uniform 20 ms .. 3 s, readings 500 ms from every window boundary.
#[test]
fn replayed_site_with_busy_backhaul_puts_every_reading_in_its_true_window() {
    let devices = [("d0", 0i64), ("d17", 17 * 60_000), ("dm3", -3 * 60_000)];
    let minutes = 20;
    let mut records = Vec::new();
    let mut truth: BTreeMap<(&str, i64), u64> = BTreeMap::new();
    let mut samples: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for (i, &(name, ahead)) in devices.iter().enumerate() {
        let mut delays = Delays::new(Dist::Uniform, 1000 + i as u64, 1_000);
        for k in 0..minutes * 60 {
            let sent = T0 + k * 1_000 + 500;
            let arrival = sent + delays.at(sent);
            let ts = sent + ahead;
            *truth
                .entry((name, sent - sent.rem_euclid(60_000)))
                .or_default() += 1;
            samples
                .entry(name)
                .or_default()
                .push((arrival, arrival - ts));
            records.push((
                arrival,
                format!(
                    r#"{{"arrival":{arrival},"topic":"sensors/site/{name}/reading","payload":{{"ts":{ts},"seq":{k},"temp":20.5}}}}"#
                ),
            ));
        }
    }
    records.sort_by_key(|r| r.0);
    let input: String = records.iter().map(|r| format!("{}\n", r.1)).collect();
    let cfg = tidemark::config::load_str(
        "[gateway]\nid = \"gw\"\n[time]\nmax_skew_ms = 3600000\n",
        &BTreeMap::new(),
    )
    .expect("config");
    let mut out = Vec::new();
    let (engine, _) =
        tidemark::replay::run_memory(&cfg, input.as_bytes(), &mut out, 300_000).expect("replay");
    // Final revision of every window.
    let mut got: BTreeMap<(String, i64), (u64, u64)> = BTreeMap::new();
    for line in String::from_utf8(out).expect("utf8").lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json line");
        let p = &v["payload"];
        assert!(
            !v["topic"].as_str().unwrap_or("").contains("/late/")
                && !v["topic"].as_str().unwrap_or("").ends_with("/rejected"),
            "{line}"
        );
        if let (Some(dev), Some(start)) = (p["device"].as_str(), p["start"].as_i64())
            && p.get("count").is_some()
        {
            let rev = p["revision"].as_u64().expect("revision");
            let count = p["count"].as_u64().expect("count");
            let e = got.entry((dev.to_string(), start)).or_insert((rev, count));
            if rev >= e.0 {
                *e = (rev, count);
            }
        }
    }
    let got: BTreeMap<(String, i64), u64> = got.into_iter().map(|(k, v)| (k, v.1)).collect();
    let want: BTreeMap<(String, i64), u64> = truth
        .into_iter()
        .map(|((d, s), n)| ((d.to_string(), s), n))
        .collect();
    assert_eq!(got, want, "window counts by (device, true start)");
    for (name, s) in &samples {
        let mut sorted = s.clone();
        sorted.sort_by_key(|x| x.0);
        let mut reference = MinFilter::default();
        let want = sorted.iter().map(|&(a, o)| reference.add(a, o)).last();
        let dev = engine.device("site", name).expect("device state");
        assert_eq!(dev.skew.estimate(), want, "{name}");
    }
}
