//! A mergeable quantile sketch with a relative-error guarantee and a bounded
//! size (DDSketch: Masson, Rim, Lee, VLDB 2019), for the p-values of a window
//! (docs/reference.md#group_defaults-and-groupsname).
//!
//! A value x > 0 falls in bucket k = ⌈log_γ x⌉ with γ = (1 + α) / (1 − α); the
//! bucket answers 2γᵏ / (γ + 1), within α of every value in (γᵏ⁻¹, γᵏ]. Negative
//! values mirror into their own buckets, exact zeros are counted apart. The
//! q-quantile is the value at rank ⌊q·(n − 1)⌋ of the sorted readings, answered
//! within α relative error. Buckets are kept sparse (a window holds few
//! readings) and at most [`MAX_BINS`]: past it the buckets nearest zero on each
//! side are folded together, so the high quantiles keep their guarantee.

use serde::{Deserialize, Serialize};

/// Buckets at most per side (a sketch is then at most ~16 KiB).
pub const MAX_BINS: usize = 1024;

/// One side's buckets: (key, count), keys ascending.
type Bins = Vec<(i32, u32)>;

/// The readings of one metric in one window, sketched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sketch {
    /// α, the relative error bound the sketch was built with.
    #[serde(rename = "a")]
    alpha: f32,
    /// Positive values.
    #[serde(rename = "p", default, skip_serializing_if = "Vec::is_empty")]
    pos: Bins,
    /// Negative values, keyed by their magnitude.
    #[serde(rename = "n", default, skip_serializing_if = "Vec::is_empty")]
    neg: Bins,
    /// Exact zeros.
    #[serde(rename = "z", default, skip_serializing_if = "is_zero")]
    zeros: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// ln γ of a relative error α.
fn ln_gamma(alpha: f64) -> f64 {
    ((1.0 + alpha) / (1.0 - alpha)).ln()
}

fn add_key(bins: &mut Bins, key: i32, n: u32) {
    match bins.binary_search_by_key(&key, |b| b.0) {
        Ok(i) => bins[i].1 = bins[i].1.saturating_add(n),
        Err(i) => {
            bins.insert(i, (key, n));
            if bins.len() > MAX_BINS {
                // The two buckets nearest zero become one.
                let (_, c) = bins.remove(0);
                bins[0].1 = bins[0].1.saturating_add(c);
            }
        }
    }
}

impl Sketch {
    /// An empty sketch answering within `alpha` (0 < α < 1) relative error.
    pub fn new(alpha: f64) -> Self {
        Self {
            alpha: alpha as f32,
            pos: Vec::new(),
            neg: Vec::new(),
            zeros: 0,
        }
    }

    /// No room beyond its buckets (a fired window takes few readings more).
    pub fn shrink(&mut self) {
        self.pos.shrink_to_fit();
        self.neg.shrink_to_fit();
    }

    /// The relative error bound it was built with.
    pub fn alpha(&self) -> f64 {
        f64::from(self.alpha)
    }

    /// 1 / ln γ: computed once for many readings ([`Sketch::add_with`]).
    pub fn inv_ln_gamma(&self) -> f64 {
        1.0 / ln_gamma(self.alpha())
    }

    fn key(&self, magnitude: f64) -> i32 {
        Self::key_with(magnitude, self.inv_ln_gamma())
    }

    fn key_with(magnitude: f64, inv_lg: f64) -> i32 {
        let k = (magnitude.ln() * inv_lg).ceil();
        // Finite values give |k| < 2^20 at any α ≥ 0.0001.
        k as i32
    }

    fn value(&self, key: i32) -> f64 {
        let lg = ln_gamma(self.alpha());
        let gamma = lg.exp();
        2.0 * (f64::from(key) * lg).exp() / (gamma + 1.0)
    }

    /// Adds a reading (non-finite values are not readings and are ignored).
    pub fn add(&mut self, v: f64) {
        self.add_with(v, self.inv_ln_gamma());
    }

    /// [`Sketch::add`] with `inv_lg` = [`Sketch::inv_ln_gamma`] computed by the caller.
    pub fn add_with(&mut self, v: f64, inv_lg: f64) {
        if !v.is_finite() {
            return;
        }
        if v > 0.0 {
            add_key(&mut self.pos, Self::key_with(v, inv_lg), 1);
        } else if v < 0.0 {
            add_key(&mut self.neg, Self::key_with(-v, inv_lg), 1);
        } else {
            self.zeros = self.zeros.saturating_add(1);
        }
    }

    /// Readings held.
    pub fn count(&self) -> u64 {
        let side = |b: &Bins| b.iter().map(|(_, c)| u64::from(*c)).sum::<u64>();
        side(&self.pos) + side(&self.neg) + u64::from(self.zeros)
    }

    /// Buckets held (both sides).
    pub fn bins(&self) -> usize {
        self.pos.len() + self.neg.len()
    }

    /// Folds `o` in: the sketch of both windows' readings. A sketch of another α
    /// has its buckets re-keyed (each answer then within both bounds added).
    pub fn merge(&mut self, o: &Sketch) {
        let same = o.alpha == self.alpha;
        for (k, c) in &o.pos {
            let key = if same { *k } else { self.key(o.value(*k)) };
            add_key(&mut self.pos, key, *c);
        }
        for (k, c) in &o.neg {
            let key = if same { *k } else { self.key(o.value(*k)) };
            add_key(&mut self.neg, key, *c);
        }
        self.zeros = self.zeros.saturating_add(o.zeros);
    }

    /// The q-quantile (0 ≤ q ≤ 1): the value at rank ⌊q·(n − 1)⌋ within α; None when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        // Truncation is the floor: the rank is not negative.
        let mut rank = (q * (n - 1) as f64) as u64;
        // Ascending order: negatives from the largest magnitude, zeros, positives.
        for (k, c) in self.neg.iter().rev() {
            if rank < u64::from(*c) {
                return Some(-self.value(*k));
            }
            rank -= u64::from(*c);
        }
        if rank < u64::from(self.zeros) {
            return Some(0.0);
        }
        rank -= u64::from(self.zeros);
        for (k, c) in &self.pos {
            if rank < u64::from(*c) {
                return Some(self.value(*k));
            }
            rank -= u64::from(*c);
        }
        self.pos.last().map(|(k, _)| self.value(*k))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const QS: [f64; 5] = [0.5, 0.9, 0.95, 0.99, 0.999];

    /// The exact value the sketch must answer for: rank ⌊q·(n − 1)⌋ of the sorted values.
    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() - 1) as f64) as usize]
    }

    fn check(values: &[f64], alpha: f64, s: &Sketch) -> Result<(), TestCaseError> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        for q in QS {
            let want = exact(&sorted, q);
            let got = s.quantile(q).expect("not empty");
            // Within α of the exact value (the f64 arithmetic of the bucket bound adds a few ulps).
            let bound = alpha * want.abs() * (1.0 + 1e-9) + f64::MIN_POSITIVE;
            prop_assert!(
                (got - want).abs() <= bound,
                "q {q}: got {got}, exact {want}, α {alpha}, n {}",
                values.len()
            );
        }
        Ok(())
    }

    /// Families of readings: uniform, normal-like, heavy-tailed, constant, signed, near 1e12.
    fn family() -> impl Strategy<Value = Vec<f64>> {
        let n = 1usize..400;
        prop_oneof![
            prop::collection::vec(-1.0e3f64..1.0e3, n.clone()),
            prop::collection::vec((0.0f64..1.0, 0.0f64..1.0, 0.0f64..1.0), n.clone()).prop_map(
                |v| v
                    .into_iter()
                    .map(|(a, b, c)| 20.0 + 10.0 * (a + b + c - 1.5))
                    .collect()
            ),
            // Pareto (α = 1.1): heavy tail.
            prop::collection::vec(0.0001f64..1.0, n.clone())
                .prop_map(|v| v.into_iter().map(|u| u.powf(-1.0 / 1.1)).collect()),
            (any::<i32>(), n.clone()).prop_map(|(c, n)| vec![f64::from(c) / 7.0; n]),
            prop::collection::vec(-1.0e12f64..1.0e12, n.clone()),
            prop::collection::vec(1.0e12f64..1.0e12 + 1000.0, n.clone()),
            (-1.0e6f64..1.0e6).prop_map(|x| vec![x]),
            prop::collection::vec(prop_oneof![Just(0.0), -5.0f64..5.0], n),
        ]
    }

    proptest! {
        #[test]
        fn every_p_value_is_within_the_accuracy_of_the_exact_rank_value(
            values in family(),
            alpha in prop_oneof![Just(0.01), Just(0.05), Just(0.001)],
        ) {
            let mut s = Sketch::new(alpha);
            for v in &values {
                s.add(*v);
            }
            prop_assert_eq!(s.count(), values.len() as u64);
            check(&values, alpha, &s)?;
        }

        #[test]
        fn a_merge_of_split_readings_keeps_the_guarantee(
            values in family(),
            cut in 0usize..400,
            alpha in prop_oneof![Just(0.01), Just(0.05)],
        ) {
            let cut = cut.min(values.len());
            let (mut a, mut b) = (Sketch::new(alpha), Sketch::new(alpha));
            values[..cut].iter().for_each(|v| a.add(*v));
            values[cut..].iter().for_each(|v| b.add(*v));
            a.merge(&b);
            let mut whole = Sketch::new(alpha);
            values.iter().for_each(|v| whole.add(*v));
            prop_assert_eq!(&a, &whole, "merging is adding");
            check(&values, alpha, &a)?;
        }
    }

    #[test]
    fn the_size_is_bounded_and_the_high_quantiles_keep_their_guarantee() {
        let alpha = 0.01;
        let mut s = Sketch::new(alpha);
        // 1e-300 .. 1e300 in 4000 steps: far more buckets than the bound.
        let values: Vec<f64> = (0..4000)
            .map(|i| 10f64.powf(-300.0 + 0.15 * f64::from(i)))
            .collect();
        values.iter().for_each(|v| s.add(*v));
        assert!(s.bins() <= MAX_BINS, "{} buckets", s.bins());
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        for q in [0.9, 0.95, 0.99, 0.999] {
            let (got, want) = (s.quantile(q).unwrap(), exact(&sorted, q));
            assert!(
                (got - want).abs() <= alpha * want * (1.0 + 1e-9),
                "q {q}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn empty_and_stored_forms() {
        let mut s = Sketch::new(0.01);
        assert_eq!(s.quantile(0.5), None);
        for v in [1.0, -2.0, 0.0, 3.5, f64::NAN] {
            s.add(v);
        }
        assert_eq!(s.count(), 4);
        let mut bytes = Vec::new();
        ciborium::ser::into_writer(&s, &mut bytes).unwrap();
        let back: Sketch = ciborium::de::from_reader(bytes.as_slice()).unwrap();
        assert_eq!(back, s);
        assert!(bytes.len() < 64, "{} bytes for four readings", bytes.len());
    }
}
