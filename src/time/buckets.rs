//! The clock estimator's one-second buckets, 8 bytes each where they can be.
//!
//! A device's offsets sit within days of each other, so the buckets keep them
//! as 32-bit differences from one base: 256 bytes for a full 32-bucket window
//! instead of 512. A value that does not fit (a hostile timestamp years off)
//! turns the device's buckets into full 64-bit ones until they are cleared, so
//! every value is kept exactly.

use std::collections::VecDeque;

use crate::model::Millis;

/// No sample (offsets are differences of plausible clocks, never this).
pub const NONE: Millis = Millis::MIN;

/// One second of samples: smallest and largest ordinary sample, or [`NONE`] each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Smallest ordinary sample of the second; [`NONE`] when every sample of it was held out.
    pub min: Millis,
    /// Largest ordinary sample, or [`NONE`].
    pub hi: Millis,
}

impl Bucket {
    pub fn new(offset: Option<Millis>) -> Self {
        let v = offset.map_or(NONE, |o| o.max(NONE + 1));
        Self { min: v, hi: v }
    }

    pub fn min(&self) -> Option<Millis> {
        (self.min != NONE).then_some(self.min)
    }

    pub fn hi(&self) -> Option<Millis> {
        (self.hi != NONE).then_some(self.hi)
    }
}

/// [`NONE`] in the narrow form.
const NARROW_NONE: i32 = i32::MIN;

#[derive(Debug, Clone)]
enum Form {
    /// Differences from `base`.
    Narrow {
        base: Millis,
        v: VecDeque<[i32; 2]>,
    },
    Wide(VecDeque<Bucket>),
}

/// Buckets, oldest first.
#[derive(Clone)]
pub struct Buckets(Form);

/// The values, whatever the form (state is compared by its printed form in tests).
impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|b| (b.min, b.hi)))
            .finish()
    }
}

impl Default for Buckets {
    fn default() -> Self {
        Self(Form::Narrow {
            base: 0,
            v: VecDeque::new(),
        })
    }
}

impl PartialEq for Buckets {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Buckets {}

fn narrow(base: Millis, x: Millis) -> Option<i32> {
    if x == NONE {
        return Some(NARROW_NONE);
    }
    let d = i32::try_from(x.checked_sub(base)?).ok()?;
    (d != NARROW_NONE).then_some(d)
}

fn wide(base: Millis, d: i32) -> Millis {
    if d == NARROW_NONE {
        NONE
    } else {
        base + Millis::from(d)
    }
}

impl Buckets {
    pub fn len(&self) -> usize {
        match &self.0 {
            Form::Narrow { v, .. } => v.len(),
            Form::Wide(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        match &self.0 {
            Form::Narrow { v, .. } => v.capacity(),
            Form::Wide(v) => v.capacity(),
        }
    }

    pub fn reserve_exact(&mut self, n: usize) {
        match &mut self.0 {
            Form::Narrow { v, .. } => v.reserve_exact(n),
            Form::Wide(v) => v.reserve_exact(n),
        }
    }

    pub fn pop_front(&mut self) {
        match &mut self.0 {
            Form::Narrow { v, .. } => {
                v.pop_front();
            }
            Form::Wide(v) => {
                v.pop_front();
            }
        }
    }

    pub fn clear(&mut self) {
        match &mut self.0 {
            Form::Narrow { v, .. } => v.clear(),
            // Back to the narrow form, keeping the room already taken.
            Form::Wide(v) => {
                let room = v.capacity();
                self.0 = Form::Narrow {
                    base: 0,
                    v: VecDeque::with_capacity(room),
                };
            }
        }
    }

    pub fn back(&self) -> Option<Bucket> {
        match &self.0 {
            Form::Narrow { base, v } => v.back().map(|&[a, b]| Bucket {
                min: wide(*base, a),
                hi: wide(*base, b),
            }),
            Form::Wide(v) => v.back().copied(),
        }
    }

    /// The bucket at `i` (oldest first).
    pub fn get(&self, i: usize) -> Option<Bucket> {
        match &self.0 {
            Form::Narrow { base, v } => v.get(i).map(|&[a, b]| Bucket {
                min: wide(*base, a),
                hi: wide(*base, b),
            }),
            Form::Wide(v) => v.get(i).copied(),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Bucket> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// Makes `b`'s values representable, widening the form if needed; the
    /// first value of an empty narrow form sets its base.
    fn fit(&mut self, b: Bucket) {
        let Form::Narrow { base, v } = &mut self.0 else {
            return;
        };
        if v.is_empty() {
            *base = if b.min != NONE { b.min } else { b.hi.max(0) };
        }
        if narrow(*base, b.min).is_some() && narrow(*base, b.hi).is_some() {
            return;
        }
        self.widen();
    }

    fn widen(&mut self) {
        if let Form::Narrow { base, v } = &self.0 {
            let mut w = VecDeque::with_capacity(v.capacity());
            w.extend(v.iter().map(|&[a, b]| Bucket {
                min: wide(*base, a),
                hi: wide(*base, b),
            }));
            self.0 = Form::Wide(w);
        }
    }

    pub fn push_back(&mut self, b: Bucket) {
        self.fit(b);
        match &mut self.0 {
            Form::Narrow { base, v } => {
                v.push_back([
                    narrow(*base, b.min).unwrap_or(NARROW_NONE),
                    narrow(*base, b.hi).unwrap_or(NARROW_NONE),
                ]);
            }
            Form::Wide(v) => v.push_back(b),
        }
    }

    /// Replaces the newest bucket (none: nothing happens).
    pub fn set_back(&mut self, b: Bucket) {
        if self.is_empty() {
            return;
        }
        self.fit(b);
        match &mut self.0 {
            Form::Narrow { base, v } => {
                if let Some(x) = v.back_mut() {
                    *x = [
                        narrow(*base, b.min).unwrap_or(NARROW_NONE),
                        narrow(*base, b.hi).unwrap_or(NARROW_NONE),
                    ];
                }
            }
            Form::Wide(v) => {
                if let Some(x) = v.back_mut() {
                    *x = b;
                }
            }
        }
    }

    /// Applies `f` to every value that is not [`NONE`] (a gateway clock step).
    pub fn shift(&mut self, delta: Millis) {
        let f = |v: Millis| {
            if v == NONE {
                v
            } else {
                v.saturating_add(delta).max(NONE + 1)
            }
        };
        if let Form::Narrow { base, v } = &mut self.0 {
            // Exact as one move of the base while no value saturates.
            let (lo, hi) = v
                .iter()
                .flatten()
                .filter(|&&d| d != NARROW_NONE)
                .fold((0i32, 0i32), |(l, h), &d| (l.min(d), h.max(d)));
            let moved = base.checked_add(delta).filter(|b| {
                b.checked_add(Millis::from(lo)).is_some_and(|x| x > NONE)
                    && b.checked_add(Millis::from(hi)).is_some()
            });
            if let Some(b) = moved {
                *base = b;
                return;
            }
            self.widen();
        }
        if let Form::Wide(v) = &mut self.0 {
            for b in v.iter_mut() {
                b.min = f(b.min);
                b.hi = f(b.hi);
            }
        }
    }
}

impl FromIterator<Bucket> for Buckets {
    fn from_iter<I: IntoIterator<Item = Bucket>>(it: I) -> Self {
        let mut out = Self::default();
        for b in it {
            out.push_back(b);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = Millis> {
        prop_oneof![
            Just(NONE),
            Just(NONE + 1),
            Just(Millis::MAX),
            any::<i64>(),
            -100_000i64..100_000,
            1_700_000_000_000i64..1_700_100_000_000,
        ]
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(Millis, Millis),
        SetBack(Millis, Millis),
        Pop,
        Clear,
        Shift(Millis),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (value(), value()).prop_map(|(a, b)| Op::Push(a, b)),
            2 => (value(), value()).prop_map(|(a, b)| Op::SetBack(a, b)),
            1 => Just(Op::Pop),
            1 => Just(Op::Clear),
            1 => prop_oneof![any::<i64>(), -86_400_000i64..86_400_000].prop_map(Op::Shift),
        ]
    }

    proptest! {
        /// Every sequence of operations keeps exactly the values a plain list of
        /// 64-bit buckets keeps.
        #[test]
        fn same_values_as_a_plain_list(ops in proptest::collection::vec(op(), 0..80)) {
            let mut b = Buckets::default();
            let mut plain: VecDeque<Bucket> = VecDeque::new();
            for o in ops {
                match o {
                    Op::Push(a, h) => {
                        b.push_back(Bucket { min: a, hi: h });
                        plain.push_back(Bucket { min: a, hi: h });
                    }
                    Op::SetBack(a, h) => {
                        b.set_back(Bucket { min: a, hi: h });
                        if let Some(x) = plain.back_mut() {
                            *x = Bucket { min: a, hi: h };
                        }
                    }
                    Op::Pop => {
                        b.pop_front();
                        plain.pop_front();
                    }
                    Op::Clear => {
                        b.clear();
                        plain.clear();
                    }
                    Op::Shift(d) => {
                        b.shift(d);
                        for x in plain.iter_mut() {
                            for v in [&mut x.min, &mut x.hi] {
                                if *v != NONE {
                                    *v = v.saturating_add(d).max(NONE + 1);
                                }
                            }
                        }
                    }
                }
                prop_assert_eq!(b.iter().collect::<Vec<_>>(), plain.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(b.back(), plain.back().copied());
            }
        }
    }

    #[test]
    fn a_device_clock_keeps_the_narrow_form() {
        let mut b = Buckets::default();
        for i in 0..32 {
            b.push_back(Bucket::new(Some(1_020_000 + i * 7)));
        }
        b.shift(-3 * 3_600_000);
        assert!(matches!(b.0, Form::Narrow { .. }));
        // One value years away: exact, in the wide form.
        b.push_back(Bucket::new(Some(50 * 365 * 86_400_000)));
        assert!(matches!(b.0, Form::Wide(_)));
        assert_eq!(b.back().unwrap().min, 50 * 365 * 86_400_000);
        b.clear();
        assert!(matches!(b.0, Form::Narrow { .. }));
    }
}
