//! Per-device clock-offset estimation (SPEC §4), pure.
//!
//! offset sample = arrival − device_ts. Samples fall into one-second buckets
//! of arrival time, each keeping its smallest sample; the estimate is the
//! minimum over the last `skew_window` buckets (the least-delayed sample is
//! closest to the true offset).
//!
//! Design: a sample that diverges from an established estimate by more than
//! [`STEP_THRESHOLD_MS`] does not enter the buckets. It becomes a step
//! *candidate*; the estimator is reset to the candidate's minimum only when
//! that minimum has been stable (not fallen by more than [`STABLE_MS`]) for
//! [`STEP_CONFIRM_MS`] of arrival time and [`STEP_MIN_SAMPLES`] samples. After
//! a real clock step the minimum settles at once (network jitter only adds
//! delay); while a buffered backlog drains, each message is less delayed than
//! the one before, so the minimum keeps falling and the burst is never taken
//! for a step — and live samples, back near the estimate, cancel the
//! candidate. The same rule keeps one hostile far-future timestamp from
//! dragging the minimum down.

use serde::{Deserialize, Serialize};

use crate::model::Millis;

/// Divergence from the estimate that makes a sample a step candidate.
pub const STEP_THRESHOLD_MS: i64 = 1_000;
/// Arrival time over which the divergent minimum must be stable before a step is accepted.
pub const STEP_CONFIRM_MS: i64 = 3_000;
/// A candidate minimum falling by more than this is still settling (a draining backlog).
pub const STABLE_MS: i64 = 200;
/// Divergent samples needed (besides the time span) to accept a step.
pub const STEP_MIN_SAMPLES: u32 = 3;
/// An estimate built from fewer buckets than this follows lower samples at once.
const ESTABLISHED_BUCKETS: usize = 3;
/// Bucket capacity (the largest allowed `skew_window`).
pub const MAX_BUCKETS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Bucket {
    sec: i64,
    min: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Candidate {
    /// Smallest divergent offset so far.
    min: Millis,
    /// `min` when it last fell by more than the threshold, and when.
    anchor: Millis,
    anchor_at: Millis,
    /// Divergent samples since the anchor.
    samples: u32,
}

/// What the estimator concluded from one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    /// The sample was taken into the buckets.
    Taken,
    /// The sample diverges and is held as a step candidate (estimate unchanged).
    Divergent,
    /// A persistent step was confirmed; the estimator was reset.
    Reset,
}

/// Min-filter offset estimator over one-second buckets of arrival time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkewEstimator {
    /// Oldest first; at most `skew_window` entries.
    buckets: heapless::Deque<Bucket, MAX_BUCKETS>,
    candidate: Option<Candidate>,
    /// Minimum over `buckets`, kept with them (read on every message).
    est: Option<Millis>,
}

impl Default for SkewEstimator {
    fn default() -> Self {
        Self {
            buckets: heapless::Deque::new(),
            candidate: None,
            est: None,
        }
    }
}

impl SkewEstimator {
    /// Current estimate (arrival − device time), if any sample was taken.
    pub fn estimate(&self) -> Option<Millis> {
        self.est
    }

    /// Feeds one sample; `window` is `time.skew_window` (1..=64).
    pub fn observe(&mut self, arrival: Millis, device_ts: Millis, window: usize) -> Sample {
        let offset = arrival.saturating_sub(device_ts);
        let Some(est) = self.estimate() else {
            self.put(arrival, offset, window);
            return Sample::Taken;
        };
        let established = self.buckets.len() >= ESTABLISHED_BUCKETS.min(window);
        let divergent =
            offset > est + STEP_THRESHOLD_MS || (established && offset < est - STEP_THRESHOLD_MS);
        if !divergent {
            self.candidate = None;
            self.put(arrival, offset, window);
            return Sample::Taken;
        }
        let c = match self.candidate {
            Some(mut c) => {
                c.min = c.min.min(offset);
                if c.min < c.anchor - STABLE_MS {
                    // Still falling (a draining backlog): not settled yet.
                    c.anchor = c.min;
                    c.anchor_at = arrival;
                    c.samples = 1;
                } else {
                    c.samples += 1;
                }
                c
            }
            None => Candidate {
                min: offset,
                anchor: offset,
                anchor_at: arrival,
                samples: 1,
            },
        };
        if c.samples >= STEP_MIN_SAMPLES && arrival - c.anchor_at >= STEP_CONFIRM_MS {
            self.buckets.clear();
            self.candidate = None;
            self.put(arrival, c.min, window);
            return Sample::Reset;
        }
        self.candidate = Some(c);
        Sample::Divergent
    }

    fn put(&mut self, arrival: Millis, offset: Millis, window: usize) {
        let sec = arrival.div_euclid(1000);
        match self.buckets.back_mut() {
            // Same second, or a stepped wall clock running backwards: fold into the newest bucket.
            Some(last) if sec <= last.sec => last.min = last.min.min(offset),
            _ => {
                while self.buckets.len() >= window.clamp(1, MAX_BUCKETS) {
                    self.buckets.pop_front();
                }
                // Capacity is MAX_BUCKETS >= window, so this cannot fail after the pops above.
                let _ = self.buckets.push_back(Bucket { sec, min: offset });
            }
        }
        self.est = self.buckets.iter().map(|b| b.min).min();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_764_480_000_000;

    /// A device whose clock is `offset` behind the gateway, sending every `every` ms with `delay`.
    fn feed(
        e: &mut SkewEstimator,
        from: i64,
        to: i64,
        every: i64,
        offset: i64,
        delay: i64,
    ) -> Vec<Sample> {
        let mut out = Vec::new();
        let mut t = from;
        while t < to {
            out.push(e.observe(t + delay, t - offset, 32));
            t += every;
        }
        out
    }

    #[test]
    fn estimate_is_the_least_delayed_sample() {
        let mut e = SkewEstimator::default();
        e.observe(T0 + 300, T0 - 180_000, 32);
        e.observe(T0 + 1_050, T0 + 1_000 - 180_000, 32);
        e.observe(T0 + 2_500, T0 + 2_000 - 180_000, 32);
        assert_eq!(e.estimate(), Some(180_050));
    }

    #[test]
    fn backlog_burst_does_not_flush_good_samples_nor_count_as_a_step() {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 60_000, 1_000, 42_000, 20);
        assert_eq!(e.estimate(), Some(42_020));
        // 5 minutes of buffered readings (one per 100 ms) arrive over 6 seconds.
        let burst_start = T0 + 360_000;
        for i in 0..3000i64 {
            let device_t = T0 + 60_000 + i * 100 - 42_000;
            let arrival = burst_start + i * 2;
            let s = e.observe(arrival, device_t, 32);
            assert_ne!(s, Sample::Reset, "burst sample {i} taken for a step");
        }
        assert_eq!(e.estimate(), Some(42_020));
        feed(&mut e, T0 + 366_000, T0 + 380_000, 1_000, 42_000, 15);
        assert_eq!(e.estimate(), Some(42_015));
    }

    #[test]
    fn backward_device_clock_step_is_recovered_within_seconds() {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 60_000, 1_000, 0, 10);
        // Device clock steps back 17 minutes: offsets rise by 17 min.
        let step = 17 * 60_000;
        let samples = feed(&mut e, T0 + 60_000, T0 + 66_000, 500, step, 10);
        let reset_at = samples
            .iter()
            .position(|s| *s == Sample::Reset)
            .expect("step recognised");
        assert!(reset_at * 500 <= 4_000, "took {} ms", reset_at * 500);
        assert_eq!(e.estimate(), Some(step + 10));
    }

    #[test]
    fn step_with_a_second_and_a_half_of_jitter_is_still_recovered() {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 60_000, 1_000, 0, 10);
        let step = 17 * 60_000;
        let mut reset = None;
        for k in 0..20i64 {
            let t = T0 + 60_000 + k * 500;
            let delay = 10 + ((k + 3) * 7919) % 1_500;
            if e.observe(t + delay, t - step, 32) == Sample::Reset {
                reset = Some(k);
                break;
            }
        }
        assert!(reset.is_some_and(|k| k * 500 <= 5_000), "{reset:?}");
        assert!(
            e.estimate()
                .is_some_and(|o| (step..step + 1_500).contains(&o))
        );
    }

    #[test]
    fn backlog_drained_slightly_faster_than_real_time_is_not_a_step() {
        for send_every in [500i64, 900] {
            let mut e = SkewEstimator::default();
            feed(&mut e, T0, T0 + 60_000, 1_000, 0, 20);
            // Ten minutes buffered (one reading a second), then sent one every `send_every` ms.
            for i in 0..600i64 {
                let s = e.observe(T0 + 660_000 + i * send_every, T0 + 60_000 + i * 1_000, 32);
                assert_ne!(s, Sample::Reset, "every {send_every} ms: sample {i}");
            }
            assert_eq!(e.estimate(), Some(20));
        }
    }

    #[test]
    fn forward_step_needs_confirmation_but_one_wild_sample_is_ignored() {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 30_000, 1_000, 0, 10);
        assert_eq!(
            e.observe(T0 + 30_000, T0 + 30_000 + 3_600_000, 32),
            Sample::Divergent
        );
        feed(&mut e, T0 + 31_000, T0 + 40_000, 1_000, 0, 10);
        assert_eq!(e.estimate(), Some(10));
        // A real forward step of 17 minutes persists and is taken.
        let samples = feed(&mut e, T0 + 40_000, T0 + 50_000, 1_000, -17 * 60_000, 10);
        assert!(samples.contains(&Sample::Reset));
        assert_eq!(e.estimate(), Some(-17 * 60_000 + 10));
    }

    #[test]
    fn young_estimator_follows_lower_samples_at_once() {
        let mut e = SkewEstimator::default();
        e.observe(T0, T0 - 90_000, 32); // first sample came out of a queue, 90 s late
        assert_eq!(e.observe(T0 + 10, T0, 32), Sample::Taken);
        assert_eq!(e.estimate(), Some(10));
    }

    #[test]
    fn old_buckets_age_out_so_drift_is_followed() {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 40_000, 1_000, 0, 5);
        feed(&mut e, T0 + 40_000, T0 + 80_000, 1_000, 800, 5);
        assert_eq!(e.estimate(), Some(805));
    }
}
