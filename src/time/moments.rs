//! A window's spread, streamed and mergeable: population variance and standard
//! deviation to ~1e-9 relative even for readings near 1e12 with a small spread
//! (docs/reference.md#group_defaults-and-groupsname).
//!
//! Plain f64 running sums lose the spread to cancellation (Σx² − (Σx)²/n of
//! values near 1e12; Welford's running mean of them carries an error of ~1e-4,
//! the size of a small spread). Deviations are taken from the first reading,
//! which bounds the cancellation by the count; their sums and the sums of their
//! squares are kept in double-double arithmetic (~106 bits: a deviation is exact
//! as a pair by TwoSum, its square by FMA), so the error stays far below 1e-9
//! whatever the count.

use serde::{Deserialize, Serialize};

/// An unevaluated sum `hi + lo` with |lo| ≤ ulp(hi) / 2.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Dd(pub f64, pub f64);

fn two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    let bb = s - a;
    Dd(s, (a - (s - bb)) + (b - bb))
}

fn fast_two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    Dd(s, b - (s - a))
}

impl Dd {
    /// `self + o`.
    pub fn plus(self, o: Dd) -> Dd {
        let Dd(s, e) = two_sum(self.0, o.0);
        fast_two_sum(s, e + self.1 + o.1)
    }

    /// `self · o`.
    pub fn times(self, o: Dd) -> Dd {
        let p = self.0 * o.0;
        let e = self.0.mul_add(o.0, -p) + self.0 * o.1 + self.1 * o.0;
        fast_two_sum(p, e)
    }

    /// `self / d`.
    pub fn over(self, d: f64) -> Dd {
        let q1 = self.0 / d;
        let r = self.plus(Dd(q1, 0.0).times(Dd(-d, 0.0)));
        fast_two_sum(q1, r.0 / d)
    }

    /// The nearest f64.
    pub fn value(self) -> f64 {
        self.0 + self.1
    }
}

/// Count, and the sums of deviations from `shift` and of their squares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Moments {
    /// The first reading: deviations are taken from it.
    #[serde(rename = "k")]
    shift: f64,
    /// Σ (x − shift).
    #[serde(rename = "s")]
    s1: Dd,
    /// Σ (x − shift)².
    #[serde(rename = "q")]
    s2: Dd,
    /// Readings.
    #[serde(rename = "n")]
    n: u64,
}

impl Moments {
    /// Adds a reading (non-finite values are not readings and are ignored).
    pub fn add(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        if self.n == 0 {
            self.shift = x;
        }
        let d = two_sum(x, -self.shift);
        self.s1 = self.s1.plus(d);
        self.s2 = self.s2.plus(d.times(d));
        self.n += 1;
    }

    /// Folds `o` in: the moments of both windows' readings.
    pub fn merge(&mut self, o: &Moments) {
        if o.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *o;
            return;
        }
        // o's deviations move by δ = o.shift − shift.
        let delta = two_sum(o.shift, -self.shift);
        let n = Dd(o.n as f64, 0.0);
        self.s1 = self.s1.plus(o.s1).plus(delta.times(n));
        let cross = delta.times(o.s1).times(Dd(2.0, 0.0));
        self.s2 = self
            .s2
            .plus(o.s2)
            .plus(cross)
            .plus(delta.times(delta).times(n));
        self.n += o.n;
    }

    /// Readings held.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// Population variance; None without readings.
    pub fn variance(&self) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let n = self.n as f64;
        let mean_dev = self.s1.over(n);
        let v = self
            .s2
            .plus(self.s1.times(mean_dev).times(Dd(-1.0, 0.0)))
            .over(n);
        Some(v.value().max(0.0))
    }

    /// Population standard deviation; None without readings.
    pub fn stddev(&self) -> Option<f64> {
        self.variance().map(f64::sqrt)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The model: two passes in double-double (the exact mean first, then the
    /// squared deviations from it), a different algorithm from the streamed one.
    fn model(v: &[f64]) -> f64 {
        let n = v.len() as f64;
        let sum = v.iter().fold(Dd::default(), |a, x| a.plus(Dd(*x, 0.0)));
        let mean = sum.over(n);
        let ss = v.iter().fold(Dd::default(), |a, x| {
            let d = Dd(*x, 0.0).plus(Dd(-mean.0, -mean.1));
            a.plus(d.times(d))
        });
        ss.over(n).value()
    }

    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= 1e-9 * want.abs() + 1e-300
    }

    fn family() -> impl Strategy<Value = Vec<f64>> {
        let n = 1usize..300;
        prop_oneof![
            prop::collection::vec(-1.0e3f64..1.0e3, n.clone()),
            prop::collection::vec(0.0001f64..1.0, n.clone())
                .prop_map(|v| v.into_iter().map(|u| u.powf(-1.0 / 1.1)).collect()),
            (any::<i32>(), n.clone()).prop_map(|(c, n)| vec![f64::from(c) / 3.0; n]),
            prop::collection::vec(1.0e12f64..1.0e12 + 1.0, n.clone()),
            prop::collection::vec(-1.0e12f64..1.0e12, n.clone()),
            prop::collection::vec(
                prop_oneof![1.0e12f64..1.0e12 + 1000.0, -1.0e12f64..-1.0e12 + 10.0],
                n
            ),
            (-1.0e12f64..1.0e12).prop_map(|x| vec![x]),
        ]
    }

    proptest! {
        #[test]
        fn variance_and_stddev_are_exact_to_1e_9_relative(values in family()) {
            let mut m = Moments::default();
            values.iter().for_each(|x| m.add(*x));
            let want = model(&values);
            let got = m.variance().unwrap();
            prop_assert!(close(got, want), "variance {got} vs {want}");
            prop_assert!(close(m.stddev().unwrap(), want.sqrt()), "stddev");
        }

        #[test]
        fn merged_halves_give_the_same_spread(values in family(), cut in 0usize..300) {
            let cut = cut.min(values.len());
            let (mut a, mut b) = (Moments::default(), Moments::default());
            values[..cut].iter().for_each(|x| a.add(*x));
            values[cut..].iter().for_each(|x| b.add(*x));
            a.merge(&b);
            prop_assert_eq!(a.count(), values.len() as u64);
            prop_assert!(close(a.variance().unwrap(), model(&values)));
        }
    }

    #[test]
    fn plain_running_sums_would_not_do() {
        // 1e12 + {0, 0.25, 0.5, 0.75}: variance 0.078125.
        let v: Vec<f64> = (0..4).map(|i| 1.0e12 + 0.25 * f64::from(i)).collect();
        let mut m = Moments::default();
        v.iter().for_each(|x| m.add(*x));
        assert_eq!(m.variance(), Some(0.078125));
        let n = 4.0;
        let (s, q) = v.iter().fold((0.0, 0.0), |(s, q), x| (s + x, q + x * x));
        let naive = q / n - (s / n) * (s / n);
        assert!((naive - 0.078125).abs() > 0.01, "naive {naive}");
        assert_eq!(Moments::default().variance(), None);
    }
}
