//! Duplicate suppression by per-device sequence number (docs/reference.md#time), pure.
//!
//! A sliding window of the last [`SEQ_WINDOW`] numbers below the highest seen,
//! as a bitmap: bounded memory, tolerant of reordering inside the window. A
//! number far below the window (a device reboot restarting its counter) starts
//! a fresh window instead of being dropped, and so does a number already seen
//! whose device timestamp is later than every timestamp seen in the window: a
//! redelivery carries its original's timestamp, which was seen, so that is a
//! counter restarted by a reboot before it reached the window's size.

use serde::{Deserialize, Serialize};

use crate::model::{Millis, OptMillis};

/// Numbers remembered below the highest one.
pub const SEQ_WINDOW: u64 = 1024;
const WORDS: usize = (SEQ_WINDOW / 64) as usize;

/// A forward jump larger than this is taken for a counter that was reset or
/// re-based (not a gap): one bad number must not swamp the missing count.
pub const MAX_GAP: u64 = 1_000_000;

/// What one sequence number says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Already applied.
    Duplicate,
    /// New; `missing` is the change of the device's missing count: the
    /// numbers it skipped over, or -1 when it fills an earlier gap.
    New {
        /// Change of the missing count.
        missing: i64,
    },
}

/// Sliding duplicate filter.
///
/// The bitmap is kept only while it differs from an in-order stream's (every
/// number from `lo` to `hi` seen): a gap, a reordering or state from before `lo`.
/// Most devices send in order, so most hold no bitmap (128 bytes each).
#[derive(Clone, Default)]
pub struct SeqWindow {
    /// Highest number seen; `None` before the first.
    hi: Option<u64>,
    /// Bit `d` set: number `hi - d` was seen (`d < SEQ_WINDOW`); `None`: the
    /// in-order pattern of `hi` and `lo` ([`SeqWindow::in_order`]).
    bits: Option<Box<[u64; WORDS]>>,
    /// First number of the stream since the last (re)start: numbers below it
    /// were never counted missing, so their arrival takes nothing back.
    /// `None` in state written before missing readings were counted.
    lo: Option<u64>,
    /// Latest device timestamp seen since the window (re)started (None: none).
    max_ts: OptMillis,
}

/// The stored form: the bitmap always written out, as before it was elided.
#[derive(Serialize, Deserialize)]
struct Repr {
    hi: Option<u64>,
    bits: [u64; WORDS],
    #[serde(default)]
    lo: Option<u64>,
    #[serde(default)]
    max_ts: Option<Millis>,
}

impl Serialize for SeqWindow {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.repr().serialize(s)
    }
}

impl<'de> Deserialize<'de> for SeqWindow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = Repr::deserialize(d)?;
        let mut w = Self {
            hi: r.hi,
            bits: Some(Box::new(r.bits)),
            lo: r.lo,
            max_ts: r.max_ts.into(),
        };
        w.settle();
        Ok(w)
    }
}

impl PartialEq for SeqWindow {
    fn eq(&self, other: &Self) -> bool {
        (self.hi, self.lo, self.max_ts, self.words())
            == (other.hi, other.lo, other.max_ts, other.words())
    }
}

impl Eq for SeqWindow {}

impl std::fmt::Debug for SeqWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqWindow")
            .field("hi", &self.hi)
            .field("bits", &self.words())
            .field("lo", &self.lo)
            .field("max_ts", &self.max_ts)
            .finish()
    }
}

impl SeqWindow {
    /// Records `seq`; false if it was already seen (a duplicate).
    pub fn check_and_insert(&mut self, seq: u64) -> bool {
        self.observe(seq) != Seen::Duplicate
    }

    /// Records `seq` of a reading without a device timestamp (see [`SeqWindow::observe_at`]).
    pub fn observe(&mut self, seq: u64) -> Seen {
        self.observe_at(seq, None)
    }

    /// Records `seq` of a reading stamped `ts` by the device: a duplicate, or
    /// new with the gap it opens or closes (docs/reference.md#time "Missing readings").
    pub fn observe_at(&mut self, seq: u64, ts: Option<Millis>) -> Seen {
        let seen = self.apply(seq, ts);
        if self.bits.is_some() {
            self.settle();
        }
        seen
    }

    fn apply(&mut self, seq: u64, ts: Option<Millis>) -> Seen {
        let Some(hi) = self.hi else {
            self.restart(seq, ts);
            return Seen::New { missing: 0 };
        };
        let lo = *self.lo.get_or_insert(hi);
        if seq > hi {
            let gap = seq - hi - 1;
            if gap > 0 || self.bits.is_some() {
                self.shift(seq - hi);
                self.set(0);
            }
            // In order with no bitmap: the next number keeps the in-order pattern.
            self.hi = Some(seq);
            self.note_ts(ts);
            let missing = if gap > MAX_GAP { 0 } else { gap as i64 };
            return Seen::New { missing };
        }
        let d = hi - seq;
        if d >= SEQ_WINDOW {
            self.restart(seq, ts);
            return Seen::New { missing: 0 };
        }
        if self.get(d) {
            // Seen, but stamped after everything seen: not a redelivery.
            if matches!((ts, self.max_ts.get()), (Some(t), Some(m)) if t > m) {
                self.restart(seq, ts);
                return Seen::New { missing: 0 };
            }
            return Seen::Duplicate;
        }
        self.note_ts(ts);
        self.set(d);
        Seen::New {
            missing: if seq > lo { -1 } else { 0 },
        }
    }

    fn note_ts(&mut self, ts: Option<Millis>) {
        if let Some(t) = ts {
            self.max_ts = OptMillis::some(self.max_ts.get().map_or(t, |m| m.max(t)));
        }
    }

    fn restart(&mut self, seq: u64, ts: Option<Millis>) {
        self.hi = Some(seq);
        self.max_ts = ts.into();
        self.lo = Some(seq);
        self.bits = None;
    }

    /// The bitmap of an in-order stream: numbers `lo..=hi` seen (all zero before
    /// the first number). `None` where there is none: no `lo` (older state).
    fn in_order(hi: Option<u64>, lo: Option<u64>) -> Option<[u64; WORDS]> {
        let mut bits = [0; WORDS];
        let Some(hi) = hi else {
            return Some(bits);
        };
        let n = hi.checked_sub(lo?)?.saturating_add(1).min(SEQ_WINDOW);
        for (i, w) in bits.iter_mut().enumerate() {
            let below = n.saturating_sub(64 * i as u64).min(64);
            *w = if below == 64 {
                u64::MAX
            } else {
                (1 << below) - 1
            };
        }
        Some(bits)
    }

    /// The bitmap, written out.
    fn words(&self) -> [u64; WORDS] {
        match &self.bits {
            Some(b) => **b,
            // The pattern exists whenever the bitmap is elided.
            None => Self::in_order(self.hi, self.lo).unwrap_or_default(),
        }
    }

    fn repr(&self) -> Repr {
        Repr {
            hi: self.hi,
            bits: self.words(),
            lo: self.lo,
            max_ts: self.max_ts.get(),
        }
    }

    /// Drops the bitmap once it is the in-order pattern again.
    fn settle(&mut self) {
        if let Some(b) = &self.bits
            && Self::in_order(self.hi, self.lo).is_some_and(|p| p == **b)
        {
            self.bits = None;
        }
    }

    fn map(&mut self) -> &mut [u64; WORDS] {
        let (hi, lo) = (self.hi, self.lo);
        self.bits
            .get_or_insert_with(|| Box::new(Self::in_order(hi, lo).unwrap_or_default()))
    }

    fn get(&self, d: u64) -> bool {
        match &self.bits {
            Some(b) => b[(d / 64) as usize] >> (d % 64) & 1 == 1,
            None => match (self.hi, self.lo) {
                (Some(hi), Some(lo)) => d <= hi.saturating_sub(lo),
                _ => false,
            },
        }
    }

    fn set(&mut self, d: u64) {
        self.map()[(d / 64) as usize] |= 1 << (d % 64);
    }

    /// Moves every bit `n` positions further from `hi`.
    fn shift(&mut self, n: u64) {
        let bits = self.map();
        if n >= SEQ_WINDOW {
            *bits = [0; WORDS];
            return;
        }
        let words = (n / 64) as usize;
        let by = n % 64;
        for i in (0..WORDS).rev() {
            let src = i.checked_sub(words);
            let lo = src.map_or(0, |s| bits[s]);
            let carry = src.and_then(|s| s.checked_sub(1)).map_or(0, |s| bits[s]);
            bits[i] = if by == 0 {
                lo
            } else {
                (lo << by) | (carry >> (64 - by))
            };
        }
    }
}

/// The filter as it was before the bitmap could be elided, kept as the reference
/// the elided one must agree with, step by step and byte for byte.
#[cfg(test)]
mod plain {
    use super::{MAX_GAP, SEQ_WINDOW, Seen, WORDS};
    use crate::model::Millis;
    use serde::{Deserialize, Serialize};

    /// Sliding duplicate filter.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Plain {
        /// Highest number seen; `None` before the first.
        hi: Option<u64>,
        /// Bit `d` set: number `hi - d` was seen (`d < SEQ_WINDOW`).
        bits: [u64; WORDS],
        /// First number of the stream since the last (re)start: numbers below it
        /// were never counted missing, so their arrival takes nothing back.
        /// `None` in state written before missing readings were counted.
        #[serde(default)]
        lo: Option<u64>,
        /// Latest device timestamp seen since the window (re)started (None: none).
        #[serde(default)]
        max_ts: Option<Millis>,
    }

    impl Plain {
        /// Records `seq` of a reading stamped `ts` by the device: a duplicate, or
        /// new with the gap it opens or closes (docs/reference.md#time "Missing readings").
        pub fn observe_at(&mut self, seq: u64, ts: Option<Millis>) -> Seen {
            let Some(hi) = self.hi else {
                self.restart(seq, ts);
                return Seen::New { missing: 0 };
            };
            let lo = *self.lo.get_or_insert(hi);
            if seq > hi {
                let gap = seq - hi - 1;
                self.shift(seq - hi);
                self.hi = Some(seq);
                self.note_ts(ts);
                self.set(0);
                let missing = if gap > MAX_GAP { 0 } else { gap as i64 };
                return Seen::New { missing };
            }
            let d = hi - seq;
            if d >= SEQ_WINDOW {
                self.restart(seq, ts);
                return Seen::New { missing: 0 };
            }
            if self.get(d) {
                // Seen, but stamped after everything seen: not a redelivery.
                if matches!((ts, self.max_ts), (Some(t), Some(m)) if t > m) {
                    self.restart(seq, ts);
                    return Seen::New { missing: 0 };
                }
                return Seen::Duplicate;
            }
            self.note_ts(ts);
            self.set(d);
            Seen::New {
                missing: if seq > lo { -1 } else { 0 },
            }
        }

        fn note_ts(&mut self, ts: Option<Millis>) {
            if let Some(t) = ts {
                self.max_ts = Some(self.max_ts.map_or(t, |m| m.max(t)));
            }
        }

        fn restart(&mut self, seq: u64, ts: Option<Millis>) {
            self.hi = Some(seq);
            self.max_ts = ts;
            self.lo = Some(seq);
            self.bits = [0; WORDS];
            self.set(0);
        }

        fn get(&self, d: u64) -> bool {
            self.bits[(d / 64) as usize] >> (d % 64) & 1 == 1
        }

        fn set(&mut self, d: u64) {
            self.bits[(d / 64) as usize] |= 1 << (d % 64);
        }

        /// Moves every bit `n` positions further from `hi`.
        fn shift(&mut self, n: u64) {
            if n >= SEQ_WINDOW {
                self.bits = [0; WORDS];
                return;
            }
            let words = (n / 64) as usize;
            let bits = n % 64;
            for i in (0..WORDS).rev() {
                let src = i.checked_sub(words);
                let lo = src.map_or(0, |s| self.bits[s]);
                let carry = src
                    .and_then(|s| s.checked_sub(1))
                    .map_or(0, |s| self.bits[s]);
                self.bits[i] = if bits == 0 {
                    lo
                } else {
                    (lo << bits) | (carry >> (64 - bits))
                };
            }
        }
    }
}

#[cfg(test)]
#[path = "seq_tests.rs"]
mod tests;
