//! Duplicate suppression by per-device sequence number (SPEC §4), pure.
//!
//! A sliding window of the last [`SEQ_WINDOW`] numbers below the highest seen,
//! as a bitmap: bounded memory, tolerant of reordering inside the window. A
//! number far below the window (a device reboot restarting its counter) starts
//! a fresh window instead of being dropped.

use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqWindow {
    /// Highest number seen; `None` before the first.
    hi: Option<u64>,
    /// Bit `d` set: number `hi - d` was seen (`d < SEQ_WINDOW`).
    bits: [u64; WORDS],
    /// First number of the stream since the last (re)start: numbers below it
    /// were never counted missing, so their arrival takes nothing back.
    /// `None` in state written before missing readings were counted.
    #[serde(default)]
    lo: Option<u64>,
}

impl SeqWindow {
    /// Records `seq`; false if it was already seen (a duplicate).
    pub fn check_and_insert(&mut self, seq: u64) -> bool {
        self.observe(seq) != Seen::Duplicate
    }

    /// Records `seq`: a duplicate, or new with the gap it opens or closes
    /// (SPEC §4 "Missing readings").
    pub fn observe(&mut self, seq: u64) -> Seen {
        let Some(hi) = self.hi else {
            self.restart(seq);
            return Seen::New { missing: 0 };
        };
        let lo = *self.lo.get_or_insert(hi);
        if seq > hi {
            let gap = seq - hi - 1;
            self.shift(seq - hi);
            self.hi = Some(seq);
            self.set(0);
            let missing = if gap > MAX_GAP { 0 } else { gap as i64 };
            return Seen::New { missing };
        }
        let d = hi - seq;
        if d >= SEQ_WINDOW {
            self.restart(seq);
            return Seen::New { missing: 0 };
        }
        if self.get(d) {
            return Seen::Duplicate;
        }
        self.set(d);
        Seen::New {
            missing: if seq > lo { -1 } else { 0 },
        }
    }

    fn restart(&mut self, seq: u64) {
        self.hi = Some(seq);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn repeats_are_duplicates_and_reordering_within_the_window_is_fine() {
        let mut w = SeqWindow::default();
        assert!(w.check_and_insert(10));
        assert!(!w.check_and_insert(10));
        assert!(w.check_and_insert(12));
        assert!(w.check_and_insert(11));
        assert!(!w.check_and_insert(11));
        assert!(w.check_and_insert(500));
        assert!(w.check_and_insert(9));
        assert!(!w.check_and_insert(12));
    }

    #[test]
    fn counter_restart_after_reboot_opens_a_fresh_window() {
        let mut w = SeqWindow::default();
        for s in 50_000..50_100 {
            assert!(w.check_and_insert(s));
        }
        assert!(w.check_and_insert(0), "reboot restarts at 0");
        assert!(w.check_and_insert(1));
        assert!(!w.check_and_insert(0));
    }

    #[test]
    fn gaps_count_as_missing_and_late_arrivals_take_it_back() {
        let mut w = SeqWindow::default();
        assert_eq!(w.observe(3010), Seen::New { missing: 0 });
        assert_eq!(w.observe(3014), Seen::New { missing: 3 });
        assert_eq!(w.observe(3012), Seen::New { missing: -1 });
        assert_eq!(w.observe(3012), Seen::Duplicate);
        assert_eq!(w.observe(3015), Seen::New { missing: 0 });
        // Below the stream's first number: never counted, nothing to take back.
        assert_eq!(w.observe(3005), Seen::New { missing: 0 });
        // A reboot restarting the counter is not a gap, nor is the new stream's start.
        assert_eq!(w.observe(0), Seen::New { missing: 0 });
        assert_eq!(w.observe(2), Seen::New { missing: 1 });
        // Nor is a wild jump forward.
        assert_eq!(w.observe(MAX_GAP + 100), Seen::New { missing: 0 });
    }

    #[test]
    fn state_written_before_missing_readings_were_counted_reads_and_counts_from_then_on() {
        #[derive(Serialize)]
        struct Before {
            hi: Option<u64>,
            bits: [u64; WORDS],
        }
        let mut bits = [0; WORDS];
        bits[0] = 0b101; // 100 and 98 seen, 99 never came
        let mut buf = Vec::new();
        ciborium::ser::into_writer(
            &Before {
                hi: Some(100),
                bits,
            },
            &mut buf,
        )
        .unwrap();
        let mut w: SeqWindow = ciborium::de::from_reader(buf.as_slice()).unwrap();
        // 99 was never counted missing, so its arrival takes nothing back.
        assert_eq!(w.observe(99), Seen::New { missing: 0 });
        assert_eq!(w.observe(98), Seen::Duplicate);
        assert_eq!(w.observe(103), Seen::New { missing: 2 });
        assert_eq!(w.observe(101), Seen::New { missing: -1 });
    }

    proptest::proptest! {
        /// Over any order of arrival of any subset of 0..n (a lossy, reordering link),
        /// missing = numbers below the highest that never arrived.
        #[test]
        fn missing_is_what_never_arrived_below_the_highest(
            n in 1u64..900,
            keep in proptest::collection::vec(proptest::bool::weighted(0.8), 900),
            order in proptest::collection::vec(0usize..900, 0..900),
            dups in 0usize..50,
        ) {
            let mut sent: Vec<u64> = (0..n).filter(|&s| keep[s as usize]).collect();
            // Reorder within the window (swaps), and redeliver some.
            for (i, &j) in order.iter().enumerate() {
                let len = sent.len();
                if len > 1 { sent.swap(i % len, j % len); }
            }
            let extra: Vec<u64> = sent.iter().take(dups).copied().collect();
            sent.extend(extra);
            let mut w = SeqWindow::default();
            let mut missing = 0i64;
            let mut hi = None;
            for &s in &sent {
                if let Seen::New { missing: m } = w.observe(s) {
                    // The first number is the stream's start: nothing before it counts.
                    missing += m;
                }
                hi = Some(hi.map_or(s, |h: u64| h.max(s)));
            }
            if let (Some(hi), Some(&first)) = (hi, sent.first()) {
                // Numbers between the first received and the highest that never came.
                let got: BTreeSet<u64> = sent.iter().copied().collect();
                let expect = (first..=hi).filter(|s| !got.contains(s)).count() as i64;
                proptest::prop_assert_eq!(missing, expect);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_a_set_inside_the_window(seqs in proptest::collection::vec(0u64..3000, 1..400)) {
            let mut w = SeqWindow::default();
            let mut seen = BTreeSet::new();
            let mut hi: Option<u64> = None;
            for s in seqs {
                let fresh_window = hi.is_some_and(|h| s + SEQ_WINDOW <= h);
                let expect = fresh_window || !seen.contains(&s);
                proptest::prop_assert_eq!(w.check_and_insert(s), expect, "seq {}", s);
                if fresh_window {
                    seen.clear();
                    hi = Some(s);
                } else {
                    hi = Some(hi.map_or(s, |h| h.max(s)));
                }
                seen.insert(s);
                // Forget what fell out of the window.
                let h = hi.unwrap_or(0);
                seen.retain(|x| x + SEQ_WINDOW > h);
            }
        }
    }
}
