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

/// Sliding duplicate filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqWindow {
    /// Highest number seen; `None` before the first.
    hi: Option<u64>,
    /// Bit `d` set: number `hi - d` was seen (`d < SEQ_WINDOW`).
    bits: [u64; WORDS],
}

impl SeqWindow {
    /// Records `seq`; false if it was already seen (a duplicate).
    pub fn check_and_insert(&mut self, seq: u64) -> bool {
        let Some(hi) = self.hi else {
            self.restart(seq);
            return true;
        };
        if seq > hi {
            self.shift(seq - hi);
            self.hi = Some(seq);
            self.set(0);
            return true;
        }
        let d = hi - seq;
        if d >= SEQ_WINDOW {
            self.restart(seq);
            return true;
        }
        if self.get(d) {
            return false;
        }
        self.set(d);
        true
    }

    fn restart(&mut self, seq: u64) {
        self.hi = Some(seq);
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
