//! Per-device clock-offset estimation (SPEC §4), pure.
//!
//! offset sample = arrival − device_ts. Samples fall into one-second buckets
//! of arrival time, each keeping its smallest sample; the estimate is the
//! minimum over the last `skew_window` buckets (the least-delayed sample is
//! closest to the true offset).
//!
//! Design: the min filter is exact for every sample at or above the estimate
//! (queueing only adds delay, so such samples can never pull the estimate
//! away from the least-delayed one). A step detector runs beside it and
//! judges divergence on the device's own evidence:
//! - jitter `J` = the largest excess over the estimate among the ordinary
//!   (non-candidate) samples of the window — the delay spread the link shows,
//!   learnt over the first 16 buckets, during which every sample above the
//!   estimate is taken, and every one below it unless it is more than a minute
//!   below (from the third bucket on: one hostile far-future timestamp);
//! - a sample more than `max(1 s, 2·J)` away from the estimate is a step
//!   candidate (samples far *below* are also held out of the buckets once the
//!   estimator is established, so one hostile far-future timestamp cannot drag
//!   the minimum);
//! - divergent samples stay out of the buckets; a step is confirmed (fast)
//!   when every sample for [`STEP_CONFIRM_MS`] of arrival time and at least
//!   [`STEP_MIN_SAMPLES`] samples diverged the same way and stayed within
//!   `max(J, 20 ms)` of each other. After a real step the device's delays keep
//!   their usual spread; a burst of delayed messages (retries) spreads far
//!   wider than the calm link it interrupts, and a draining backlog keeps
//!   falling, so neither confirms;
//! - (slow) a divergence whose minimum has not fallen by more than that
//!   tolerance for `skew_window` seconds is adopted whatever its spread — the
//!   time the min filter itself would take to forget the old offset.
//!
//! A step no larger than the threshold is taken as ordinary samples and
//! adopted by the min filter once the pre-step buckets age out.

use super::buckets::{Bucket, Buckets, NONE};

use serde::{Deserialize, Serialize};

use crate::model::Millis;

/// Floor of the divergence threshold.
pub const MIN_THRESHOLD_MS: i64 = 1_000;
/// Divergence threshold in multiples of the observed jitter.
pub const JITTER_FACTOR: i64 = 2;
/// Arrival time over which every sample must diverge before a step is accepted.
pub const STEP_CONFIRM_MS: i64 = 3_000;
/// Divergent samples needed (besides the time span) to accept a step.
pub const STEP_MIN_SAMPLES: u32 = 4;
/// Floor of the spread tolerated among a step's samples (timestamp resolution).
pub const MIN_SPREAD_MS: i64 = 20;
/// Below this many buckets the estimator takes every sample (it follows lower
/// ones at once and learns the link's jitter); longer than a retry burst lasts.
const ESTABLISHED_BUCKETS: usize = 16;
/// From this many buckets on, a young estimator holds out samples more than
/// [`YOUNG_DOWN_MS`] below its estimate (before, it follows every lower sample).
const YOUNG_GUARD_BUCKETS: usize = 3;
/// How far below a young estimate a sample may be and still be taken at once.
pub const YOUNG_DOWN_MS: i64 = 60_000;
/// Bucket capacity (the largest allowed `skew_window`).
pub const MAX_BUCKETS: usize = 64;

/// A bucket as state written before the packed form stored it: one map per bucket.
#[derive(Deserialize)]
struct BucketRepr {
    sec: i64,
    min: Option<Millis>,
    /// Absent in state written before it existed.
    #[serde(default)]
    hi: Option<Millis>,
}

impl BucketRepr {
    fn bucket(&self) -> Bucket {
        let mut b = Bucket::new(self.min);
        b.hi = self.hi.map_or(NONE, |o| o.max(NONE + 1));
        b
    }
}

/// The buckets as persisted: each bucket's `min` less the previous one's, then
/// its `hi` less its `min`, as zigzag varints (wrapping, so exact for every
/// value): 3-6 bytes a bucket instead of a ~30-byte map.
fn pack(buckets: &Buckets) -> Vec<u8> {
    let mut out = Vec::with_capacity(buckets.len() * 6);
    let mut prev: Millis = 0;
    for b in buckets.iter() {
        put_varint(&mut out, zigzag(b.min.wrapping_sub(prev)));
        put_varint(&mut out, zigzag(b.hi.wrapping_sub(b.min)));
        prev = b.min;
    }
    out
}

fn unpack(bytes: &[u8]) -> Option<Buckets> {
    let mut out = Buckets::default();
    let (mut at, mut prev) = (0usize, 0 as Millis);
    while at < bytes.len() {
        if out.len() == MAX_BUCKETS {
            return None;
        }
        let min = prev.wrapping_add(unzigzag(get_varint(bytes, &mut at)?));
        let hi = min.wrapping_add(unzigzag(get_varint(bytes, &mut at)?));
        out.push_back(Bucket { min, hi });
        prev = min;
    }
    Some(out)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Candidate {
    /// Divergence above the estimate (a clock stepped back) or below it.
    up: bool,
    /// Smallest divergent offset of the candidacy, and when it last fell by more than the tolerance.
    lo: Millis,
    settled_at: Millis,
    /// Divergent samples of the candidacy.
    samples: u32,
    /// The current tight run: its extremes, start and length.
    run_lo: Millis,
    run_hi: Millis,
    run_since: Millis,
    run_samples: u32,
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkewEstimator {
    /// Oldest first; at most `skew_window` entries.
    /// On the heap, grown up to `skew_window` entries (32 by default) rather than
    /// inline at the 64 maximum: 2.5 KiB per device, most of it never used.
    buckets: Buckets,
    /// Second (of the raw wall clock) of the newest bucket.
    sec: i64,
    /// Step candidate. Boxed: rare, and 56 bytes inline in every device.
    step: Option<Box<Candidate>>,
    /// Minimum over `buckets`, kept with them (read on every message).
    est: Option<Millis>,
    /// Largest ordinary sample over `buckets`.
    hi: Option<Millis>,
}

/// The persisted form, written packed (see [`pack`]).
#[derive(Serialize)]
struct SkewOut<'a> {
    /// Empty: a binary from before the packed form (a rollback) reads the
    /// estimator without its history and learns it again, instead of refusing the state.
    buckets: &'static [u8],
    #[serde(with = "serde_bytes")]
    packed: Vec<u8>,
    sec: i64,
    step: &'a Option<Box<Candidate>>,
    est: Option<Millis>,
    hi: Option<Millis>,
}

/// The persisted form as read: packed, or one map per bucket (state written before).
#[derive(Deserialize)]
struct SkewIn {
    #[serde(default, with = "serde_bytes")]
    packed: Option<Vec<u8>>,
    #[serde(default)]
    sec: i64,
    #[serde(default)]
    buckets: Vec<BucketRepr>,
    /// Renamed from an earlier format; an old one is dropped.
    #[serde(default)]
    step: Option<Box<Candidate>>,
    est: Option<Millis>,
    #[serde(default)]
    hi: Option<Millis>,
}

impl Serialize for SkewEstimator {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        SkewOut {
            buckets: &[],
            packed: pack(&self.buckets),
            sec: self.sec,
            step: &self.step,
            est: self.est,
            hi: self.hi,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for SkewEstimator {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = SkewIn::deserialize(d)?;
        let (buckets, sec) = match &r.packed {
            Some(p) => (
                unpack(p).ok_or_else(|| serde::de::Error::custom("bad packed clock buckets"))?,
                r.sec,
            ),
            None => (
                r.buckets.iter().map(BucketRepr::bucket).collect(),
                r.buckets.last().map_or(0, |b| b.sec),
            ),
        };
        Ok(Self {
            buckets,
            sec,
            step: r.step,
            est: r.est,
            hi: r.hi,
        })
    }
}

impl SkewEstimator {
    /// Current estimate (arrival − device time), if any sample was taken.
    pub fn estimate(&self) -> Option<Millis> {
        self.est
    }

    /// The second (of the raw wall clock) of the last sample, taken or held out.
    pub fn last_second(&self) -> Option<i64> {
        (!self.buckets.is_empty()).then_some(self.sec)
    }

    /// Delay spread the device has shown: largest excess of an ordinary sample over the estimate.
    pub fn jitter(&self) -> Millis {
        match (self.hi, self.est) {
            (Some(h), Some(e)) => h.saturating_sub(e).max(0),
            _ => 0,
        }
    }

    /// Divergence from the estimate that makes a sample a step candidate.
    pub fn threshold(&self) -> Millis {
        MIN_THRESHOLD_MS.max(self.jitter().saturating_mul(JITTER_FACTOR))
    }

    /// The gateway's wall clock stepped by `delta`: every offset and arrival
    /// second moves with it, so the next samples continue the same estimate.
    pub fn rebase(&mut self, delta: Millis) {
        let shift = |v: &mut Millis| {
            if *v != NONE {
                *v = v.saturating_add(delta).max(NONE + 1);
            }
        };
        self.sec = self.sec.saturating_add(delta.div_euclid(1000));
        self.buckets.shift(delta);
        if let Some(c) = &mut self.step {
            for v in [
                &mut c.lo,
                &mut c.settled_at,
                &mut c.run_lo,
                &mut c.run_hi,
                &mut c.run_since,
            ] {
                shift(v);
            }
        }
        self.est = self.est.map(|e| e.saturating_add(delta));
        self.hi = self.hi.map(|e| e.saturating_add(delta));
    }

    /// Feeds one sample; `window` is `time.skew_window` (1..=64).
    pub fn observe(&mut self, arrival: Millis, device_ts: Millis, window: usize) -> Sample {
        let offset = arrival.saturating_sub(device_ts);
        let Some(est) = self.est else {
            self.put(arrival, Some(offset), window);
            return Sample::Taken;
        };
        let (up, down) = if self.buckets.len() < ESTABLISHED_BUCKETS.min(window) {
            // Young: still learning the link's jitter, so every sample above is taken, and
            // every one below too unless it is too far below for any queueing delay of the
            // first samples to explain (one hostile far-future timestamp).
            let young = self.buckets.len() >= YOUNG_GUARD_BUCKETS.min(window);
            let limit = self.threshold().max(YOUNG_DOWN_MS);
            (false, young && offset < est.saturating_sub(limit))
        } else {
            let threshold = self.threshold();
            (
                offset > est.saturating_add(threshold),
                offset < est.saturating_sub(threshold),
            )
        };
        if !(up || down) {
            self.step = None;
            self.put(arrival, Some(offset), window);
            return Sample::Taken;
        }
        let tolerance = self.jitter().max(MIN_SPREAD_MS);
        let c = match self.step.as_deref() {
            Some(&c) if c.up == up => c.next(offset, arrival, tolerance),
            _ => Candidate::start(up, offset, arrival),
        };
        if c.confirmed(arrival, window) {
            self.buckets.clear();
            self.step = None;
            self.put(arrival, Some(c.lo), window);
            if let Some(mut b) = self.buckets.back() {
                b.hi = c.run_hi.max(NONE + 1);
                self.buckets.set_back(b);
            }
            self.hi = Some(c.run_hi);
            return Sample::Reset;
        }
        match &mut self.step {
            Some(b) => **b = c,
            None => self.step = Some(Box::new(c)),
        }
        // Held out, but its second still counts, so the window spans what the min filter's would.
        self.put(arrival, None, window);
        Sample::Divergent
    }

    fn put(&mut self, arrival: Millis, offset: Option<Millis>, window: usize) {
        let sec = arrival.div_euclid(1000);
        match self.buckets.back() {
            // Same second, or a stepped wall clock running backwards: fold into the newest bucket.
            Some(mut last) if sec <= self.sec => {
                let b = Bucket::new(offset);
                last.min = min_some(last.min(), b.min()).unwrap_or(NONE);
                last.hi = last.hi.max(b.hi);
                self.buckets.set_back(last);
            }
            _ => {
                let window = window.clamp(1, MAX_BUCKETS);
                while self.buckets.len() >= window {
                    self.buckets.pop_front();
                }
                if self.buckets.len() == self.buckets.capacity() {
                    // Doubling up to the window, never past it: a device heard from a few
                    // times keeps a few buckets (10 000 of them: 7 MiB at a full window).
                    let room = self.buckets.len().max(2);
                    self.buckets
                        .reserve_exact(room.min(window.saturating_sub(self.buckets.len())));
                }
                self.buckets.push_back(Bucket::new(offset));
                self.sec = sec;
            }
        }
        // A window of held-out samples only (a long unconfirmed divergence) keeps the estimate.
        if let Some(m) = self.buckets.iter().filter_map(|b| b.min()).min() {
            self.est = Some(m);
        }
        self.hi = self.buckets.iter().filter_map(|b| b.hi()).max();
    }
}

fn min_some(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

impl Candidate {
    fn start(up: bool, offset: Millis, arrival: Millis) -> Self {
        Self {
            up,
            lo: offset,
            settled_at: arrival,
            samples: 1,
            run_lo: offset,
            run_hi: offset,
            run_since: arrival,
            run_samples: 1,
        }
    }

    fn next(self, offset: Millis, arrival: Millis, tolerance: Millis) -> Self {
        let mut c = self;
        c.samples = c.samples.saturating_add(1);
        if offset < c.lo.saturating_sub(tolerance) {
            // Still falling (a draining backlog): not settled.
            c.settled_at = arrival;
        }
        c.lo = c.lo.min(offset);
        let (lo, hi) = (c.run_lo.min(offset), c.run_hi.max(offset));
        if hi.saturating_sub(lo) > tolerance {
            // Wider than the link's own jitter (a burst, a backlog): a new run starts here.
            (c.run_lo, c.run_hi, c.run_since, c.run_samples) = (offset, offset, arrival, 1);
        } else {
            (c.run_lo, c.run_hi) = (lo, hi);
            c.run_samples += 1;
        }
        c
    }

    /// Fast: a tight run long enough. Slow: the candidacy's minimum has stayed put
    /// for as long as the min filter's own horizon (whatever the spread).
    fn confirmed(&self, arrival: Millis, window: usize) -> bool {
        let fast = self.run_samples >= STEP_MIN_SAMPLES
            && arrival.saturating_sub(self.run_since) >= STEP_CONFIRM_MS;
        let horizon = i64::try_from(window)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000);
        let slow =
            self.samples >= STEP_MIN_SAMPLES && arrival.saturating_sub(self.settled_at) >= horizon;
        fast || slow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_764_480_000_000;

    #[test]
    fn persisted_form_keeps_every_bucket_and_absent_samples() {
        let mut e = SkewEstimator::default();
        for i in 0..40 {
            e.observe(T0 + i * 700, T0 + i * 700 - 50 - (i % 3) * 10, 32);
        }
        // Held out: a step candidate leaves its second's bucket without a sample.
        e.observe(T0 + 40 * 700, T0 + 40 * 700 - 600_000, 32);
        assert!(e.buckets.iter().any(|b| b.min().is_none()));
        let mut buf = Vec::new();
        ciborium::ser::into_writer(&e, &mut buf).unwrap();
        let back: SkewEstimator = ciborium::de::from_reader(&buf[..]).unwrap();
        assert_eq!(back, e);
        assert!(
            buf.len() < 400,
            "packed: {} bytes for {} buckets",
            buf.len(),
            e.buckets.len()
        );
    }

    #[test]
    fn state_written_with_one_map_per_bucket_still_reads() {
        // The form before the packed one; its first bucket from before `hi` existed.
        let old = serde_json::json!({
            "buckets": [
                { "sec": 7, "min": 40 },
                { "sec": 8, "min": null, "hi": null },
                { "sec": 9, "min": 35, "hi": 90 },
            ],
            "est": 35,
            "hi": 90,
        });
        let mut buf = Vec::new();
        ciborium::ser::into_writer(&old, &mut buf).unwrap();
        let e: SkewEstimator = ciborium::de::from_reader(&buf[..]).unwrap();
        let b: Vec<_> = e.buckets.iter().map(|b| (b.min(), b.hi())).collect();
        assert_eq!(b, [(Some(40), None), (None, None), (Some(35), Some(90))]);
        assert_eq!(
            (e.last_second(), e.estimate(), e.jitter()),
            (Some(9), Some(35), 55)
        );
    }

    #[test]
    fn packed_buckets_round_trip_every_value() {
        use proptest::prelude::*;
        let value = prop_oneof![
            Just(NONE),
            Just(NONE + 1),
            Just(Millis::MAX),
            any::<i64>(),
            -100_000i64..100_000
        ];
        proptest!(|(v in proptest::collection::vec((value.clone(), value), 0..=MAX_BUCKETS))| {
            let buckets: Buckets = v.iter().map(|&(min, hi)| Bucket { min, hi }).collect();
            prop_assert_eq!(unpack(&pack(&buckets)), Some(buckets));
        });
        // Truncated or overlong input is refused, not misread.
        let b: Buckets = [Bucket { min: 5, hi: 300 }].into_iter().collect();
        let p = pack(&b);
        assert_eq!(unpack(&p[..p.len() - 1]), None);
        assert_eq!(unpack(&[0xff; 11]), None);
    }

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
    fn step_on_a_link_with_a_second_and_a_half_of_jitter_is_still_recovered() {
        let delay = |k: i64| 10 + ((k + 3) * 7919) % 1_500;
        let mut e = SkewEstimator::default();
        for k in 0..120i64 {
            let t = T0 + k * 500;
            e.observe(t + delay(k), t, 32);
        }
        assert!(e.jitter() > 1_000, "jitter {}", e.jitter());
        let step = 17 * 60_000;
        let mut reset = None;
        for k in 120..160i64 {
            let t = T0 + k * 500;
            if e.observe(t + delay(k), t - step, 32) == Sample::Reset {
                reset = Some(k - 120);
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
    fn step_whose_jitter_outgrows_the_old_link_is_adopted_over_the_filter_horizon() {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 60_000, 1_000, 0, 10);
        let step = 17 * 60_000;
        let mut reset = None;
        for k in 0..120i64 {
            let t = T0 + 60_000 + k * 500;
            let delay = 10 + ((k + 3) * 7919) % 1_500;
            if e.observe(t + delay, t - step, 32) == Sample::Reset {
                reset = Some(k * 500);
                break;
            }
        }
        // The candidates' minimum settles (within 20 ms) after ~20 s, then the 32 s horizon runs.
        assert!(reset.is_some_and(|ms| ms <= 60_000), "{reset:?}");
        assert!(
            e.estimate()
                .is_some_and(|o| (step..step + 100).contains(&o))
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
    fn a_rebased_estimator_continues_across_a_gateway_step_without_a_candidate() {
        for delta in [-3 * 3_600_000, -600_000, 600_000, 86_400_000] {
            let mut e = SkewEstimator::default();
            feed(&mut e, T0, T0 + 40_000, 500, 0, 20);
            e.rebase(delta);
            assert_eq!(e.estimate(), Some(20 + delta));
            // Samples on the stepped clock are ordinary ones, and buckets keep aging.
            for k in 0..80i64 {
                let t = T0 + 40_000 + k * 500;
                assert_eq!(e.observe(t + 20 + delta, t, 32), Sample::Taken, "{delta}");
            }
            assert_eq!(e.estimate(), Some(20 + delta));
            assert!(e.buckets.len() <= 32);
        }
    }

    #[test]
    fn old_buckets_age_out_so_drift_is_followed() {
        let mut e = SkewEstimator::default();
        feed(&mut e, T0, T0 + 40_000, 1_000, 0, 5);
        feed(&mut e, T0 + 40_000, T0 + 80_000, 1_000, 800, 5);
        assert_eq!(e.estimate(), Some(805));
    }
}
