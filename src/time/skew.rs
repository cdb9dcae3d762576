//! Per-device clock-offset estimation (docs/reference.md#time), pure.
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
use super::varint;

use serde::{Deserialize, Serialize};

use crate::model::{Millis, OptMillis};

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
        varint::put(&mut out, zigzag(b.min.wrapping_sub(prev)));
        varint::put(&mut out, zigzag(b.hi.wrapping_sub(b.min)));
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
        let min = prev.wrapping_add(unzigzag(varint::get(bytes, &mut at)?));
        let hi = min.wrapping_add(unzigzag(varint::get(bytes, &mut at)?));
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
    est: OptMillis,
    /// Largest ordinary sample over `buckets`.
    hi: OptMillis,
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
            est: self.est.get(),
            hi: self.hi.get(),
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
            est: r.est.into(),
            hi: r.hi.into(),
        })
    }
}

impl SkewEstimator {
    /// Current estimate (arrival − device time), if any sample was taken.
    pub fn estimate(&self) -> Option<Millis> {
        self.est.get()
    }

    /// The second (of the raw wall clock) of the last sample, taken or held out.
    pub fn last_second(&self) -> Option<i64> {
        (!self.buckets.is_empty()).then_some(self.sec)
    }

    /// Delay spread the device has shown: largest excess of an ordinary sample over the estimate.
    pub fn jitter(&self) -> Millis {
        match (self.hi.get(), self.est.get()) {
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
        self.est = self.est.get().map(|e| e.saturating_add(delta)).into();
        self.hi = self.hi.get().map(|e| e.saturating_add(delta)).into();
    }

    /// Feeds one sample; `window` is `time.skew_window` (1..=64).
    pub fn observe(&mut self, arrival: Millis, device_ts: Millis, window: usize) -> Sample {
        let offset = arrival.saturating_sub(device_ts);
        let Some(est) = self.est.get() else {
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
            self.hi = OptMillis::some(c.run_hi);
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
            self.est = OptMillis::some(m);
        }
        self.hi = self.buckets.iter().filter_map(|b| b.hi()).max().into();
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
#[path = "skew_tests.rs"]
mod tests;
