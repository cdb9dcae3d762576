//! Duplicate suppression by per-device sequence number (SPEC §4), pure.
//!
//! A sliding window of the last [`SEQ_WINDOW`] numbers below the highest seen,
//! as a bitmap: bounded memory, tolerant of reordering inside the window. A
//! number far below the window (a device reboot restarting its counter) starts
//! a fresh window instead of being dropped, and so does a number already seen
//! whose device timestamp is later than every timestamp seen in the window: a
//! redelivery carries its original's timestamp, which was seen, so that is a
//! counter restarted by a reboot before it reached the window's size.

use serde::{Deserialize, Serialize};

use crate::model::Millis;

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
    /// Latest device timestamp seen since the window (re)started (None: none).
    #[serde(default)]
    max_ts: Option<Millis>,
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
    /// new with the gap it opens or closes (SPEC §4 "Missing readings").
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
    fn a_reboot_before_the_counter_fills_the_window_is_told_by_the_device_time() {
        // 15 readings a minute, then a reboot: the counter starts again at 0.
        for (before, after) in [(1u64, 1u64), (15, 15), (15, 40), (500, 3), (1023, 1023)] {
            let mut w = SeqWindow::default();
            let mut t = 1_000;
            for s in 0..before {
                t += 4_000;
                assert_eq!(w.observe_at(s, Some(t)), Seen::New { missing: 0 });
            }
            let last = t;
            // QoS 1 redeliveries of the old stream are still duplicates.
            for s in 0..before {
                assert_eq!(
                    w.observe_at(s, Some(last - 4_000 * (before - 1 - s) as i64)),
                    Seen::Duplicate
                );
            }
            for s in 0..after {
                t += 4_000;
                assert_eq!(
                    w.observe_at(s, Some(t)),
                    Seen::New { missing: 0 },
                    "{before}/{after}: {s}"
                );
            }
            // The new stream's own redeliveries are duplicates again.
            assert_eq!(w.observe_at(after - 1, Some(t)), Seen::Duplicate);
            assert_eq!(w.observe_at(0, Some(last + 4_000)), Seen::Duplicate);
        }
    }

    #[test]
    fn a_backfilled_reading_with_a_new_number_does_not_turn_redeliveries_into_reboots() {
        let mut w = SeqWindow::default();
        for s in 0..10 {
            assert_eq!(
                w.observe_at(s, Some(100_000 + s as i64 * 1000)),
                Seen::New { missing: 0 }
            );
        }
        // Number 10 carries a reading from long ago (a backfill), then 3 is redelivered.
        assert_eq!(w.observe_at(10, Some(5_000)), Seen::New { missing: 0 });
        assert_eq!(w.observe_at(3, Some(103_000)), Seen::Duplicate);
        assert_eq!(w.observe_at(9, Some(109_000)), Seen::Duplicate);
    }

    #[test]
    fn a_late_reading_inside_the_window_is_not_taken_for_a_reboot() {
        let mut w = SeqWindow::default();
        assert_eq!(w.observe_at(10, Some(10_000)), Seen::New { missing: 0 });
        assert_eq!(w.observe_at(12, Some(12_000)), Seen::New { missing: 1 });
        assert_eq!(w.observe_at(11, Some(11_000)), Seen::New { missing: -1 });
        assert_eq!(w.observe_at(11, Some(11_000)), Seen::Duplicate);
        // Without a device timestamp the window alone decides, as before.
        assert_eq!(w.observe_at(10, None), Seen::Duplicate);
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
        /// Devices rebooting after 1..300 readings (counter back to 0, clock going on),
        /// some readings backfilled from long ago, QoS 1 redeliveries of any reading of
        /// the current run: every redelivery is a duplicate, every first delivery is new.
        #[test]
        fn redeliveries_are_duplicates_and_readings_after_a_reboot_are_not(
            runs in proptest::collection::vec(
                (1u64..300, proptest::collection::vec(proptest::num::u16::ANY, 0..40)), 1..6),
            backfills in proptest::collection::vec(1u64..300, 0..6),
            period in 1i64..60_000,
        ) {
            let mut w = SeqWindow::default();
            let mut t = 1_764_480_000_000i64;
            for (n, redeliver) in runs {
                let mut sent = Vec::new();
                for s in 0..n {
                    t += period;
                    let ts = if backfills.contains(&s) { t - 86_400_000 } else { t };
                    proptest::prop_assert_ne!(w.observe_at(s, Some(ts)), Seen::Duplicate, "first delivery of {}", s);
                    sent.push((s, ts));
                    if let Some(&p) = redeliver.get(s as usize) {
                        let (rs, rts) = sent[p as usize % sent.len()];
                        proptest::prop_assert_eq!(w.observe_at(rs, Some(rts)), Seen::Duplicate, "redelivery of {}", rs);
                    }
                }
                // A reboot: the clock goes on.
                t += 5_000;
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
