//! The clock estimator's one-second buckets, 4 bytes each where they can be.
//!
//! A device's offsets in one window sit within seconds of each other, so the
//! buckets keep them as 16-bit differences from one base: 128 bytes for a full
//! 32-bucket window instead of 512 (1.2 MiB at 10 000 devices, 12 MiB at
//! 100 000). A value 16 bits cannot reach moves the base when the window's
//! values all fit around a new one (a clock's drift over days), else turns the
//! buckets into 32-bit differences, and one those cannot reach (a hostile
//! timestamp years off) into full 64-bit values until they are cleared, so
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

/// A difference from the base in fewer bits; its smallest value stands for [`NONE`].
trait Lane: Copy {
    const NONE: Self;
    fn of(d: i64) -> Option<Self>;
    fn get(self) -> i64;
}

/// The lanes: 16 bits while a window's values sit within ±32 s of the base, else 32.
macro_rules! lane {
    ($($t:ty),*) => {$(
        impl Lane for $t {
            const NONE: Self = <$t>::MIN;
            fn of(d: i64) -> Option<Self> {
                <$t>::try_from(d).ok().filter(|&x| x != Self::NONE)
            }
            fn get(self) -> i64 {
                i64::from(self)
            }
        }
    )*};
}

lane!(i16, i32);

/// Buckets as differences from `base`.
#[derive(Debug, Clone)]
struct Narrow<L> {
    base: Millis,
    v: VecDeque<[L; 2]>,
}

impl<L: Lane> Narrow<L> {
    fn with_capacity(room: usize) -> Self {
        Self {
            base: 0,
            v: VecDeque::with_capacity(room),
        }
    }

    fn lane(&self, x: Millis) -> Option<L> {
        if x == NONE {
            return Some(L::NONE);
        }
        L::of(x.checked_sub(self.base)?)
    }

    fn wide(&self, d: L) -> Millis {
        if d.get() == L::NONE.get() {
            NONE
        } else {
            self.base + d.get()
        }
    }

    fn bucket(&self, [a, b]: [L; 2]) -> Bucket {
        Bucket {
            min: self.wide(a),
            hi: self.wide(b),
        }
    }

    /// `b` in this form, if it fits.
    fn fit(&self, b: Bucket) -> Option<[L; 2]> {
        Some([self.lane(b.min)?, self.lane(b.hi)?])
    }

    /// This form holding `values` around a base in the middle of theirs and
    /// `extra`'s, if they all fit; room for `room` buckets.
    fn around(values: &[Bucket], extra: Bucket, room: usize) -> Option<Self> {
        let (lo, hi) = values
            .iter()
            .chain([&extra])
            .flat_map(|b| [b.min, b.hi])
            .filter(|&x| x != NONE)
            .fold((Millis::MAX, Millis::MIN), |(l, h), x| (l.min(x), h.max(x)));
        let mut n = Self::with_capacity(room.max(values.len()));
        n.base = if lo > hi { 0 } else { lo.midpoint(hi) };
        n.fit(extra)?;
        for &b in values {
            let x = n.fit(b)?;
            n.v.push_back(x);
        }
        Some(n)
    }

    /// Moves every value by `delta` as one move of the base; false if a value
    /// would leave the 64-bit range.
    fn shift(&mut self, delta: Millis) -> bool {
        let (lo, hi) = self
            .v
            .iter()
            .flatten()
            .filter(|d| d.get() != L::NONE.get())
            .fold((0, 0), |(l, h): (i64, i64), d| {
                (l.min(d.get()), h.max(d.get()))
            });
        let moved = self
            .base
            .checked_add(delta)
            .filter(|b| b.checked_add(lo).is_some_and(|x| x > NONE) && b.checked_add(hi).is_some());
        if let Some(b) = moved {
            self.base = b;
        }
        moved.is_some()
    }
}

/// The narrow form inline (40 bytes, as one form was before); the rare wider
/// ones behind a box, so the three fit where one did.
#[derive(Debug, Clone)]
enum Form {
    N16(Narrow<i16>),
    Wider(Box<Wider>),
}

#[derive(Debug, Clone)]
enum Wider {
    N32(Narrow<i32>),
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
        Self(Form::N16(Narrow::with_capacity(0)))
    }
}

impl PartialEq for Buckets {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Buckets {}

/// `$body` with `$v` bound to the form's list, whichever it is.
macro_rules! each {
    (&mut $form:expr, $v:ident => $body:expr) => {
        match &mut $form {
            Form::N16(Narrow { v: $v, .. }) => $body,
            Form::Wider(w) => match &mut **w {
                Wider::N32(Narrow { v: $v, .. }) => $body,
                Wider::Wide($v) => $body,
            },
        }
    };
    (& $form:expr, $v:ident => $body:expr) => {
        match &$form {
            Form::N16(Narrow { v: $v, .. }) => $body,
            Form::Wider(w) => match &**w {
                Wider::N32(Narrow { v: $v, .. }) => $body,
                Wider::Wide($v) => $body,
            },
        }
    };
}

impl Buckets {
    pub fn len(&self) -> usize {
        each!(&self.0, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        each!(&self.0, v => v.capacity())
    }

    pub fn reserve_exact(&mut self, n: usize) {
        each!(&mut self.0, v => v.reserve_exact(n));
    }

    pub fn pop_front(&mut self) {
        each!(&mut self.0, v => {
            v.pop_front();
        });
    }

    pub fn clear(&mut self) {
        // Back to the narrowest form, keeping the room already taken.
        let room = self.capacity();
        if let Form::N16(n) = &mut self.0 {
            n.v.clear();
        } else {
            self.0 = Form::N16(Narrow::with_capacity(room));
        }
    }

    /// The bucket at `i` (oldest first).
    pub fn get(&self, i: usize) -> Option<Bucket> {
        match &self.0 {
            Form::N16(n) => n.v.get(i).map(|&x| n.bucket(x)),
            Form::Wider(w) => match &**w {
                Wider::N32(n) => n.v.get(i).map(|&x| n.bucket(x)),
                Wider::Wide(v) => v.get(i).copied(),
            },
        }
    }

    pub fn back(&self) -> Option<Bucket> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    pub fn iter(&self) -> impl Iterator<Item = Bucket> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// Makes `b`'s values representable beside the buckets kept: the first
    /// value of an empty narrow form sets its base; one that does not fit moves
    /// the base if all fit around another, else the form widens.
    fn fit(&mut self, b: Bucket) {
        let first = if b.min != NONE { b.min } else { b.hi.max(0) };
        let fits = match &mut self.0 {
            Form::N16(n) => {
                if n.v.is_empty() {
                    n.base = first;
                }
                n.fit(b).is_some()
            }
            Form::Wider(w) => match &mut **w {
                Wider::N32(n) => {
                    if n.v.is_empty() {
                        n.base = first;
                    }
                    n.fit(b).is_some()
                }
                Wider::Wide(_) => true,
            },
        };
        if fits {
            return;
        }
        let all: Vec<Bucket> = self.iter().collect();
        let room = self.capacity();
        let n16 = matches!(self.0, Form::N16(_));
        self.0 = match n16.then(|| Narrow::around(&all, b, room)).flatten() {
            Some(n) => Form::N16(n),
            None => Form::Wider(Box::new(match Narrow::around(&all, b, room) {
                Some(n) => Wider::N32(n),
                None => {
                    let mut w = VecDeque::with_capacity(room.max(all.len()));
                    w.extend(all);
                    Wider::Wide(w)
                }
            })),
        };
    }

    fn widen(&mut self) {
        if let Form::Wider(w) = &self.0
            && let Wider::Wide(_) = **w
        {
            return;
        }
        let all: Vec<Bucket> = self.iter().collect();
        let mut w = VecDeque::with_capacity(self.capacity().max(all.len()));
        w.extend(all);
        self.0 = Form::Wider(Box::new(Wider::Wide(w)));
    }

    /// The newest bucket, or a new one after it, set to `b`.
    fn put(&mut self, b: Bucket, new: bool) {
        if !new && self.is_empty() {
            return;
        }
        self.fit(b);
        match &mut self.0 {
            Form::N16(n) => {
                let x = n.fit(b).unwrap_or([i16::NONE; 2]);
                put(&mut n.v, x, new);
            }
            Form::Wider(w) => match &mut **w {
                Wider::N32(n) => {
                    let x = n.fit(b).unwrap_or([i32::NONE; 2]);
                    put(&mut n.v, x, new);
                }
                Wider::Wide(v) => put(v, b, new),
            },
        }
    }

    pub fn push_back(&mut self, b: Bucket) {
        self.put(b, true);
    }

    /// Replaces the newest bucket (none: nothing happens).
    pub fn set_back(&mut self, b: Bucket) {
        self.put(b, false);
    }

    /// Applies `f` to every value that is not [`NONE`] (a gateway clock step).
    pub fn shift(&mut self, delta: Millis) {
        // Exact as one move of the base while no value saturates.
        let moved = match &mut self.0 {
            Form::N16(n) => n.shift(delta),
            Form::Wider(w) => match &mut **w {
                Wider::N32(n) => n.shift(delta),
                Wider::Wide(_) => false,
            },
        };
        if moved {
            return;
        }
        self.widen();
        if let Form::Wider(w) = &mut self.0
            && let Wider::Wide(v) = &mut **w
        {
            for b in v.iter_mut() {
                for x in [&mut b.min, &mut b.hi] {
                    if *x != NONE {
                        *x = x.saturating_add(delta).max(NONE + 1);
                    }
                }
            }
        }
    }
}

fn put<T>(v: &mut VecDeque<T>, x: T, new: bool) {
    if new {
        v.push_back(x);
    } else if let Some(last) = v.back_mut() {
        *last = x;
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
            -40_000i64..40_000,
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
        assert!(matches!(b.0, Form::N16(_)));
        // One value years away: exact, in the wide form.
        b.push_back(Bucket::new(Some(50 * 365 * 86_400_000)));
        assert!(matches!(&b.0, Form::Wider(w) if matches!(**w, Wider::Wide(_))));
        assert_eq!(b.back().unwrap().min, 50 * 365 * 86_400_000);
        b.clear();
        assert!(matches!(b.0, Form::N16(_)));
    }

    /// A clock drifting for days moves the base and keeps 16 bits; a window
    /// whose values spread wider than 16 bits reach takes 32.
    #[test]
    fn a_drifting_clock_moves_the_base_and_a_wide_spread_takes_32_bits() {
        let mut b = Buckets::default();
        let mut plain = Vec::new();
        // 100 ppm of drift: 8.6 s a day, one bucket a minute for a week.
        for i in 0..7 * 24 * 60i64 {
            if b.len() == 32 {
                b.pop_front();
                plain.remove(0);
            }
            let x = Bucket::new(Some(5_000 + i * 6));
            b.push_back(x);
            plain.push(x);
        }
        assert!(matches!(b.0, Form::N16(_)));
        assert_eq!(b.iter().collect::<Vec<_>>(), plain);
        b.push_back(Bucket::new(Some(plain[0].min + 70_000)));
        assert!(matches!(&b.0, Form::Wider(w) if matches!(**w, Wider::N32(_))));
        assert_eq!(b.back().unwrap().min, plain[0].min + 70_000);
        assert_eq!(b.iter().take(32).collect::<Vec<_>>(), plain);
    }
}
