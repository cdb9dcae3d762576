//! The extra aggregates of a window result (docs/reference.md#group_defaults-and-groupsname)
//! against a model, over families of readings and the three window kinds:
//! stddev and variance to 1e-9 relative, p-values within `quantile_accuracy`
//! of the exact rank value, delta and rate by event time.

mod support;

use proptest::prelude::*;
use support::engine::{Sim, T0};
use tidemark::time::moments::Dd;

const ALPHA: f64 = 0.01;
const QS: [(&str, f64); 5] = [
    ("p50", 0.5),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p999", 0.999),
];

fn config(window: &str) -> String {
    format!(
        "[time]\npolicy = \"device\"\n[group_defaults]\nwindow = {window}\n\
         out_of_orderness_ms = 0\nidle_timeout_ms = 1000\nallowed_lateness_ms = 0\n\
         aggregates = [\"stddev\", \"variance\", \"p50\", \"p90\", \"p95\", \"p99\", \"p999\", \"rate\", \"delta\"]\n\
         quantile_accuracy = {ALPHA}\n"
    )
}

fn family() -> impl Strategy<Value = Vec<f64>> {
    let n = 1usize..60;
    prop_oneof![
        prop::collection::vec(-1.0e3f64..1.0e3, n.clone()),
        prop::collection::vec(0.0001f64..1.0, n.clone())
            .prop_map(|v| v.into_iter().map(|u| u.powf(-1.0 / 1.1)).collect()),
        (any::<i16>(), n.clone()).prop_map(|(c, n)| vec![f64::from(c) / 4.0; n]),
        prop::collection::vec(1.0e12f64..1.0e12 + 100.0, n.clone()),
        prop::collection::vec(-1.0e12f64..1.0e12, n),
        (-1.0e6f64..1.0e6).prop_map(|x| vec![x]),
    ]
}

fn variance(v: &[f64]) -> f64 {
    let n = v.len() as f64;
    let mean = v
        .iter()
        .fold(Dd::default(), |a, x| a.plus(Dd(*x, 0.0)))
        .over(n);
    v.iter()
        .fold(Dd::default(), |a, x| {
            let d = Dd(*x, 0.0).plus(Dd(-mean.0, -mean.1));
            a.plus(d.times(d))
        })
        .over(n)
        .value()
}

fn close(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * want.abs() + 1e-300
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn extra_aggregates_match_the_model(
        values in family(),
        step in 50i64..2500,
        kind in 0usize..3,
    ) {
        let window = [
            "{ kind = \"tumbling\", size_ms = 10000 }",
            "{ kind = \"hopping\", size_ms = 10000, slide_ms = 5000 }",
            "{ kind = \"session\", gap_ms = 3000 }",
        ][kind];
        let mut sim = Sim::new(&config(window), T0);
        let readings: Vec<(i64, f64)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (T0 + 100 + step * i as i64, *v))
            .collect();
        for (ts, v) in &readings {
            sim.send(*ts, "sensors/g/d/reading", &format!(r#"{{"ts": {ts}, "temp": {v:?}}}"#));
        }
        let last = readings.last().map_or(T0, |r| r.0);
        sim.advance(last + 60_000);
        let windows = sim.windows();
        prop_assert!(!windows.is_empty());
        let mut seen = 0;
        for w in windows {
            let inside: Vec<(i64, f64)> = readings
                .iter()
                .filter(|(t, _)| *t >= w.start && *t < w.end)
                .copied()
                .collect();
            prop_assert_eq!(w.count, inside.len() as u64, "window {}..{}", w.start, w.end);
            seen += inside.len();
            let m = serde_json::to_value(&w.metrics["temp"]).unwrap();
            let vals: Vec<f64> = inside.iter().map(|r| r.1).collect();
            let var = variance(&vals);
            prop_assert!(close(m["variance"].as_f64().unwrap(), var, 1e-9), "variance {} vs {var}", m["variance"]);
            prop_assert!(close(m["stddev"].as_f64().unwrap(), var.sqrt(), 1e-9), "stddev");
            let mut sorted = vals.clone();
            sorted.sort_by(f64::total_cmp);
            for (name, q) in QS {
                let want = sorted[(q * (sorted.len() - 1) as f64) as usize];
                let got = m[name].as_f64().unwrap();
                prop_assert!((got - want).abs() <= ALPHA * want.abs() * (1.0 + 1e-9) + 1e-300,
                    "{name}: {got} vs {want}");
            }
            let (first, last) = (inside[0], inside[inside.len() - 1]);
            let delta = last.1 - first.1;
            prop_assert_eq!(m["delta"].as_f64().unwrap(), delta);
            if last.0 > first.0 {
                let rate = delta / ((last.0 - first.0) as f64 / 1000.0);
                prop_assert!(close(m["rate"].as_f64().unwrap(), rate, 1e-12), "rate");
            } else {
                prop_assert!(m.get("rate").is_none(), "rate with one event time: {m}");
            }
        }
        // Hopping windows overlap: each reading is in two.
        prop_assert_eq!(seen, values.len() * if kind == 1 { 2 } else { 1 });
    }
}

#[test]
fn without_aggregates_a_result_carries_the_seven_only() {
    let mut sim = Sim::new(
        "[time]\npolicy = \"device\"\n[group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 10000 }\n\
         out_of_orderness_ms = 0\nidle_timeout_ms = 1000\n",
        T0,
    );
    sim.reading(T0 + 100, "g", "d", T0 + 100, 1.5);
    sim.advance(T0 + 120_000);
    let m = serde_json::to_value(&sim.windows()[0].metrics["temp"]).unwrap();
    let keys: Vec<&str> = m.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 7, "{keys:?}");
}
