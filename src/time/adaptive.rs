//! Adaptive watermark bound and lateness (docs/reference.md#group_defaults-and-groupsname), pure: the recent
//! distribution of a group's samples in a small log-scale histogram per slice
//! of the horizon, its quantile, and a peak that rises at once on evidence and
//! falls back over the horizon. Integer arithmetic only, so replay and journal
//! recovery compute the same values on every board.

use serde::{Deserialize, Serialize};

use crate::model::Millis;

/// Slices of `horizon / SLOTS` kept: the one being filled and the six before it
/// count (the oldest is the next to be filled), so a sample counts for 6/8 to
/// 7/8 of the horizon and a value that rose is back within it.
pub const SLOTS: usize = 8;

/// Upper edges of the histogram's buckets (ms): 0, then +1 ms steps while 5 %
/// is less than that, then 5 % apart, up to a day (a value in force is at most
/// 5 % above the quantile it stands for).
pub const EDGES: [Millis; BUCKETS] = edges();

/// Buckets in the histogram.
pub const BUCKETS: usize = bucket_count();

const TOP: Millis = 86_400_000;

const fn next_edge(e: Millis) -> Millis {
    let grown = e * 105 / 100;
    if grown > e + 1 { grown } else { e + 1 }
}

const fn bucket_count() -> usize {
    let (mut n, mut e) = (1, 0);
    while e < TOP {
        e = next_edge(e);
        n += 1;
    }
    n
}

const fn edges() -> [Millis; BUCKETS] {
    let mut out = [0; BUCKETS];
    let mut i = 1;
    while i < BUCKETS {
        out[i] = next_edge(out[i - 1]);
        i += 1;
    }
    out
}

/// The bucket of a sample: the first whose upper edge is at or above it.
pub fn bucket(v: Millis) -> usize {
    EDGES.partition_point(|&e| e < v).min(BUCKETS - 1)
}

/// `adaptive = { quantile, min_ms, max_ms, horizon_s }` of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptiveConfig {
    /// `out_of_orderness_ms = "auto"`.
    pub bound: bool,
    /// `allowed_lateness_ms = "auto"`.
    pub lateness: bool,
    /// The quantile, in millionths (0.999 → 999 000).
    pub quantile_ppm: u32,
    /// Lower clamp.
    pub min_ms: Millis,
    /// Upper clamp.
    pub max_ms: Millis,
    /// How long evidence counts.
    pub horizon_ms: Millis,
}

impl AdaptiveConfig {
    /// `v` within [min, max].
    pub fn clamp(&self, v: Millis) -> Millis {
        v.clamp(self.min_ms, self.max_ms.max(self.min_ms))
    }
}

/// One estimate: a histogram per slice of the horizon (in the group's event
/// time), their sum, and the peak of the evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Estimator {
    /// Counts per bucket, `SLOTS` slices back to back; empty until the first sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    slots: Vec<u32>,
    /// The slice being filled.
    cur: u8,
    /// Event time at which the current slice began.
    slot_from: Millis,
    /// The largest sample above the value in force, and when it came.
    peak: Millis,
    peak_at: Millis,
    /// The value in force (clamped), as of the last [`Estimator::refresh`].
    pub value: Millis,
    /// The quantile part of it alone (clamped), as of the last refresh.
    #[serde(default)]
    pub bulk: Millis,
}

impl Estimator {
    /// No evidence yet: the lower clamp.
    pub fn new(cfg: &AdaptiveConfig) -> Self {
        Self {
            slots: Vec::new(),
            cur: 0,
            slot_from: Millis::MIN,
            peak: 0,
            peak_at: Millis::MIN,
            value: cfg.clamp(0),
            bulk: cfg.clamp(0),
        }
    }

    fn slot_len(cfg: &AdaptiveConfig) -> Millis {
        (cfg.horizon_ms / SLOTS as Millis).max(1)
    }

    /// Moves the slices on to event time `t`: each slice that ended is dropped.
    fn rotate(&mut self, t: Millis, cfg: &AdaptiveConfig) {
        let len = Self::slot_len(cfg);
        if self.slot_from == Millis::MIN {
            self.slot_from = t;
            return;
        }
        if t < self.slot_from.saturating_add(len) {
            return;
        }
        let steps = (t - self.slot_from) / len;
        let clear = usize::try_from(steps).unwrap_or(SLOTS).min(SLOTS);
        for _ in 0..clear {
            self.cur = ((usize::from(self.cur) + 1) % SLOTS) as u8;
            if !self.slots.is_empty() {
                let at = usize::from(self.cur) * BUCKETS;
                self.slots[at..at + BUCKETS].fill(0);
            }
        }
        self.slot_from = self.slot_from.saturating_add(steps.saturating_mul(len));
    }

    /// One sample at event time `t`. True when it is above the value in force
    /// (the value then rises at once: see [`Estimator::refresh`]).
    pub fn observe(&mut self, sample: Millis, t: Millis, cfg: &AdaptiveConfig) -> bool {
        self.rotate(t, cfg);
        if self.slots.is_empty() {
            self.slots = vec![0; SLOTS * BUCKETS];
        }
        let b = usize::from(self.cur) * BUCKETS + bucket(sample.max(0));
        self.slots[b] = self.slots[b].saturating_add(1);
        sample > self.value && self.raise(sample, t, cfg)
    }

    /// Evidence that the value in force is too small, now: it takes `sample` at
    /// once, and lets it fall back over half the horizon.
    pub fn raise(&mut self, sample: Millis, t: Millis, cfg: &AdaptiveConfig) -> bool {
        if sample <= self.decayed_peak(t, cfg) {
            return false;
        }
        self.peak = sample;
        self.peak_at = t;
        self.value = cfg.clamp(sample).max(self.value);
        true
    }

    /// The peak, falling back linearly to nothing over half the horizon (the
    /// quantile keeps what the evidence in bulk says for longer).
    fn decayed_peak(&self, t: Millis, cfg: &AdaptiveConfig) -> Millis {
        let span = cfg.horizon_ms / 2;
        if self.peak_at == Millis::MIN || span <= 0 {
            return 0;
        }
        let gone = t.saturating_sub(self.peak_at).clamp(0, span);
        // i128: peak × horizon does not fit i64 for long horizons.
        let left = i128::from(self.peak) * i128::from(span - gone) / i128::from(span);
        Millis::try_from(left).unwrap_or(Millis::MAX)
    }

    /// The quantile of the samples in the slices that count, placed within its
    /// bucket by its rank there.
    pub fn quantile(&self, cfg: &AdaptiveConfig) -> Option<Millis> {
        if self.slots.is_empty() {
            return None;
        }
        let oldest = (usize::from(self.cur) + 1) % SLOTS;
        let mut sum = [0u64; BUCKETS];
        let mut n = 0u64;
        for (i, s) in self.slots.chunks_exact(BUCKETS).enumerate() {
            if i == oldest {
                continue;
            }
            for (t, &c) in sum.iter_mut().zip(s) {
                *t += u64::from(c);
                n += u64::from(c);
            }
        }
        if n == 0 {
            return None;
        }
        // The k-th smallest, k = ceil(q·n).
        let k = (u128::from(n) * u128::from(cfg.quantile_ppm)).div_ceil(1_000_000);
        let k = u64::try_from(k).unwrap_or(n).clamp(1, n);
        let mut cum = 0u64;
        for (b, &c) in sum.iter().enumerate() {
            if cum + c >= k {
                if b == 0 {
                    return Some(0);
                }
                let (lo, hi) = (EDGES[b - 1], EDGES[b]);
                let r = i128::from(k - cum);
                let v = i128::from(lo) + i128::from(hi - lo) * r / i128::from(c);
                return Some(Millis::try_from(v).unwrap_or(hi));
            }
            cum += c;
        }
        Some(EDGES[BUCKETS - 1])
    }

    /// The value at event time `t`: the larger of the quantile over the horizon
    /// and the peak falling back over it, clamped.
    pub fn refresh(&mut self, t: Millis, cfg: &AdaptiveConfig) -> Millis {
        self.rotate(t, cfg);
        let q = self.quantile(cfg).unwrap_or(0);
        self.bulk = cfg.clamp(q);
        self.value = cfg.clamp(q.max(self.decayed_peak(t, cfg)));
        self.value
    }

    /// Bytes of heap it holds.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<u32>()
    }
}

/// A group's adaptive state, persisted with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptiveState {
    /// The watermark bound (`out_of_orderness_ms = "auto"`).
    pub bound: Estimator,
    /// The allowed lateness (`allowed_lateness_ms = "auto"`).
    pub lateness: Estimator,
    /// Fired windows ending at or before this are gone, and events for them late
    /// (the largest W − lateness so far: a lateness that rises never brings a
    /// purged window back, so a window id never gets two contents).
    pub frontier: Option<Millis>,
    /// The watermark when "auto" lateness began (a reload from fixed values): the
    /// windows gone before ended by then, and the devices kept no mark of them, so
    /// only windows starting after it count as never having existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<Millis>,
}

impl AdaptiveState {
    /// No evidence yet.
    pub fn new(cfg: &AdaptiveConfig) -> Self {
        Self {
            bound: Estimator::new(cfg),
            lateness: Estimator::new(cfg),
            frontier: None,
            floor: None,
        }
    }

    /// The values in force at event time `t`.
    pub fn refresh(&mut self, t: Millis, cfg: &AdaptiveConfig) {
        self.bound.refresh(t, cfg);
        self.lateness.refresh(t, cfg);
    }

    /// The frontier after the watermark moved to `wm`.
    pub fn advance(&mut self, wm: Option<Millis>) {
        if let Some(w) = wm {
            let f = w.saturating_sub(self.lateness.value);
            self.frontier = Some(self.frontier.map_or(f, |p| p.max(f)));
        }
    }

    /// What a refresh may change, in a few words: compared to tell whether the
    /// group must be written again (a silent fleet writes nothing).
    pub fn signature(&self) -> [Millis; 9] {
        let e = |e: &Estimator| [e.value, e.bulk, Millis::from(e.cur), e.slot_from];
        let (b, l) = (e(&self.bound), e(&self.lateness));
        [
            b[0],
            b[1],
            b[2],
            b[3],
            l[0],
            l[1],
            l[2],
            l[3],
            self.frontier.unwrap_or(Millis::MIN),
        ]
    }

    /// Bytes of heap it holds.
    pub fn heap_bytes(&self) -> usize {
        self.bound.heap_bytes() + self.lateness.heap_bytes()
    }

    /// The lateness that, at watermark `wm`, keeps exactly the windows ending
    /// after the frontier: `wm − frontier` (0 before any watermark).
    pub fn lateness_at(&self, wm: Option<Millis>) -> Millis {
        match (wm, self.frontier) {
            (Some(w), Some(f)) => w.saturating_sub(f).max(0),
            _ => self.lateness.value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: AdaptiveConfig = AdaptiveConfig {
        bound: true,
        lateness: true,
        quantile_ppm: 999_000,
        min_ms: 100,
        max_ms: 600_000,
        horizon_ms: 900_000,
    };

    #[test]
    fn edges_rise_by_at_most_five_percent_and_reach_a_day() {
        assert_eq!(EDGES[0], 0);
        assert!(EDGES[BUCKETS - 1] >= TOP);
        const { assert!(BUCKETS < 400) };
        for w in EDGES.windows(2) {
            assert!(w[1] > w[0] && (w[1] - w[0] == 1 || w[1] * 100 <= w[0] * 105 + 100));
        }
        for v in [0, 1, 2, 7, 99, 100, 101, 5_000, 599_999, TOP, Millis::MAX] {
            let b = bucket(v);
            assert!(EDGES[b] >= v.min(EDGES[BUCKETS - 1]));
            assert!(b == 0 || EDGES[b - 1] < v);
        }
    }

    #[test]
    fn the_value_is_the_quantile_rises_at_once_and_falls_back_over_the_horizon() {
        let mut e = Estimator::new(&CFG);
        assert_eq!(e.value, 100);
        // 10 000 samples of 0..=50 ms: the quantile is within the clamp.
        for i in 0..10_000 {
            e.observe(i % 51, i, &CFG);
        }
        assert_eq!(e.refresh(10_000, &CFG), 100);
        // One sample of 20 s: at once.
        assert!(e.observe(20_000, 10_001, &CFG));
        assert_eq!(e.value, 20_000);
        // A quarter of the horizon on, half of it; gone after half the horizon
        // (one sample in 10 001 is not the quantile).
        assert_eq!(e.refresh(10_001 + 225_000, &CFG), 10_000);
        assert_eq!(e.refresh(10_001 + 450_000, &CFG), 100);
        // Evidence in bulk holds the quantile up until its slice no longer counts:
        // 7/8 of the horizon after its slice began (slices start every 112.5 s from 0).
        for i in 0..1_000 {
            e.observe(5_000 + i, 1_000_000 + i, &CFG);
        }
        let v = e.refresh(1_001_000, &CFG);
        assert!((5_990..=5_999 * 105 / 100).contains(&v), "{v}");
        assert_eq!(e.refresh(1_600_000, &CFG), v);
        assert_eq!(e.refresh(900_000 + 7 * 112_500 - 1, &CFG), v);
        assert_eq!(e.refresh(900_000 + 7 * 112_500, &CFG), 100);
    }

    #[test]
    fn clamps_and_the_frontier_never_moves_back() {
        let mut s = AdaptiveState::new(&CFG);
        s.lateness.observe(10_000_000, 0, &CFG);
        assert_eq!(s.lateness.value, 600_000);
        s.refresh(0, &CFG);
        s.advance(Some(1_000_000));
        assert_eq!(s.bound.value, 100);
        assert_eq!(s.frontier, Some(400_000));
        assert_eq!(s.lateness_at(Some(1_000_000)), 600_000);
        // The lateness falls: the frontier moves up; it never comes back down.
        s.refresh(900_000, &CFG);
        s.advance(Some(2_000_000));
        assert_eq!(s.frontier, Some(2_000_000 - 100));
        s.lateness.observe(300_000, 900_001, &CFG);
        s.refresh(900_001, &CFG);
        s.advance(Some(2_000_001));
        assert_eq!(s.frontier, Some(2_000_000 - 100));
        assert_eq!(s.lateness_at(Some(2_000_001)), 101);
    }
}
