//! The aggregates a group adds to the seven of every window result
//! (docs/reference.md#group_defaults-and-groupsname): spread, p-values, rate
//! and delta. Their state is kept per metric of a window only where a group
//! asks for them, so a window of a group without them costs one pointer.

use serde::{Deserialize, Serialize};

use super::moments::Moments;
use super::sketch::Sketch;

/// A metric's index (the window's `MetricIdx`).
type MetricIdx = u16;

/// Names, in the order of [`Extras::aggs`] bits and of a result's fields.
pub const NAMES: [&str; 9] = [
    "stddev", "variance", "p50", "p90", "p95", "p99", "p999", "rate", "delta",
];

/// The quantile of each p-value (bits 2..=6).
const QUANTILES: [f64; 5] = [0.5, 0.9, 0.95, 0.99, 0.999];

const SPREAD: u16 = 0b11;
const PVALUES: u16 = 0b111_1100;

/// What a group adds: `aggregates` and `quantile_accuracy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Extras {
    /// Bits of [`NAMES`].
    pub aggs: u16,
    /// `quantile_accuracy` in millionths.
    pub accuracy_ppm: u32,
}

impl Extras {
    /// From names (each one of [`NAMES`]; others are the caller's error) and α.
    pub fn of(names: &[String], accuracy: f64) -> Self {
        let aggs = names
            .iter()
            .filter_map(|n| NAMES.iter().position(|k| k == n))
            .fold(0u16, |b, i| b | (1 << i));
        // Without aggregates the accuracy means nothing: one form of "none", so rules compare equal.
        Self {
            aggs,
            accuracy_ppm: if aggs == 0 {
                0
            } else {
                (accuracy.clamp(0.0, 1.0) * 1_000_000.0).round() as u32
            },
        }
    }

    /// None asked for.
    pub fn is_none(&self) -> bool {
        self.aggs == 0
    }

    /// `name` asked for.
    pub fn has(&self, name: &str) -> bool {
        NAMES
            .iter()
            .position(|k| *k == name)
            .is_some_and(|i| self.aggs & (1 << i) != 0)
    }

    fn alpha(&self) -> f64 {
        f64::from(self.accuracy_ppm) / 1_000_000.0
    }

    /// The names asked for, in result order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.aggs & (1 << i) != 0)
            .map(|(_, n)| *n)
    }
}

/// One metric's extra state in one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricExtra {
    /// The metric.
    #[serde(rename = "m")]
    pub metric: MetricIdx,
    /// For stddev and variance (boxed: 48 bytes a group asking only for p-values does not carry).
    #[serde(rename = "v", default, skip_serializing_if = "Option::is_none")]
    pub moments: Option<Box<Moments>>,
    /// For the p-values.
    #[serde(rename = "q", default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<Sketch>,
}

/// The extra state of a window's metrics, sorted by metric.
pub type WindowExtras = Vec<MetricExtra>;

/// Adds a reading's metrics to `list` as `extras` asks.
pub fn add(list: &mut WindowExtras, extras: Extras, metrics: &[(MetricIdx, f64)]) {
    let (spread, pvalues) = (extras.aggs & SPREAD != 0, extras.aggs & PVALUES != 0);
    if !spread && !pvalues {
        return;
    }
    let inv_lg = Sketch::new(extras.alpha()).inv_ln_gamma();
    for &(m, v) in metrics {
        let i = match list.binary_search_by_key(&m, |e| e.metric) {
            Ok(i) => i,
            Err(i) => {
                // Exactly sized: a first push would make room for four (~350 bytes a window).
                list.reserve_exact(1);
                list.insert(
                    i,
                    MetricExtra {
                        metric: m,
                        moments: None,
                        sketch: None,
                    },
                );
                i
            }
        };
        let e = &mut list[i];
        if spread {
            e.moments.get_or_insert_with(Box::default).add(v);
        }
        if pvalues {
            e.sketch
                .get_or_insert_with(|| Sketch::new(extras.alpha()))
                .add_with(v, inv_lg);
        }
    }
}

/// A fired window's state without spare room: it is kept for lateness, and
/// late readings are few.
pub fn shrink(list: &mut WindowExtras) {
    for e in list.iter_mut() {
        if let Some(s) = e.sketch.as_mut() {
            s.shrink();
        }
    }
}

/// Folds `o` into `list` (merged sessions).
pub fn merge(list: &mut WindowExtras, o: WindowExtras) {
    for e in o {
        match list.binary_search_by_key(&e.metric, |x| x.metric) {
            Err(i) => {
                list.reserve_exact(1);
                list.insert(i, e);
            }
            Ok(i) => {
                let x = &mut list[i];
                match (&mut x.moments, e.moments) {
                    (Some(a), Some(b)) => a.merge(&b),
                    (a @ None, b) => *a = b,
                    _ => {}
                }
                match (&mut x.sketch, e.sketch) {
                    (Some(a), Some(b)) => a.merge(&b),
                    (a @ None, b) => *a = b,
                    _ => {}
                }
            }
        }
    }
}

/// The extra fields of one metric of a result, in [`NAMES`] order; absent ones left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtraOut(pub Vec<(&'static str, f64)>);

/// The fields `extras` asks for, from the metric's state and its delta and event-time span.
pub fn out(
    extras: Extras,
    state: Option<&MetricExtra>,
    (delta, span_ms): (f64, i64),
) -> Option<Box<ExtraOut>> {
    if extras.is_none() {
        return None;
    }
    let mut o = Vec::new();
    let moments = state.and_then(|s| s.moments.as_deref());
    let sketch = state.and_then(|s| s.sketch.as_ref());
    for (i, name) in NAMES.iter().enumerate() {
        if extras.aggs & (1 << i) == 0 {
            continue;
        }
        let v = match i {
            0 => moments.and_then(Moments::stddev),
            1 => moments.and_then(Moments::variance),
            2..=6 => sketch.and_then(|s| s.quantile(QUANTILES[i - 2])),
            // rate: absent when the first and the last reading share one event time.
            7 => (span_ms > 0).then(|| delta / (span_ms as f64 / 1000.0)),
            _ => Some(delta),
        };
        if let Some(v) = v.filter(|v| v.is_finite()) {
            o.push((*name, v));
        }
    }
    Some(Box::new(ExtraOut(o)))
}
