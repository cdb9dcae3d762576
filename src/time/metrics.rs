//! A window's per-metric aggregates in one exactly sized block, a metric of one
//! reading in 22 bytes instead of 64: with short windows and lateness most of a
//! device's windows hold one reading a metric (BENCHMARKS 4b).

use crate::model::Millis;

/// Index of an interned metric name.
pub type MetricIdx = u16;

/// Aggregate of one metric in one window: 64 bytes with its metric's index, as
/// read out of a window's [`Metrics`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// Sum of values.
    pub sum: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Value of the earliest event (ties: earliest arrival).
    pub first: f64,
    /// Value of the latest event (ties: latest arrival).
    pub last: f64,
    pub(crate) first_t: Millis,
    pub(crate) last_t: Millis,
    /// Readings carrying the metric (saturating).
    pub count: u32,
    /// The metric (index of its interned name).
    pub metric: MetricIdx,
}

impl Stats {
    pub(crate) fn new(metric: MetricIdx, t: Millis, v: f64) -> Self {
        Self {
            sum: v,
            min: v,
            max: v,
            first: v,
            last: v,
            first_t: t,
            last_t: t,
            count: 1,
            metric,
        }
    }

    /// Adds a value; arrivals come in arrival order, which settles ties.
    pub(crate) fn add(&mut self, t: Millis, v: f64) {
        self.count = self.count.saturating_add(1);
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        if t < self.first_t {
            self.first_t = t;
            self.first = v;
        }
        if t >= self.last_t {
            self.last_t = t;
            self.last = v;
        }
    }

    pub(crate) fn merge(&mut self, o: &Stats) {
        self.count = self.count.saturating_add(o.count);
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        if o.first_t < self.first_t {
            self.first_t = o.first_t;
            self.first = o.first;
        }
        if o.last_t >= self.last_t {
            self.last_t = o.last_t;
            self.last = o.last;
        }
    }

    /// Arithmetic mean.
    pub fn mean(&self) -> f64 {
        self.sum / f64::from(self.count)
    }

    /// `last − first`, and the event time between them (ms).
    pub fn delta(&self) -> (f64, Millis) {
        (self.last - self.first, self.last_t - self.first_t)
    }
}

/// Bytes of an entry: metric (2), form (1), then one reading's value and time,
/// or the count and the whole aggregate.
const HEAD: usize = 3;
const ONE: usize = HEAD + 16;
const FULL: usize = HEAD + 4 + 56;
const FORM_ONE: u8 = 0;
const FORM_FULL: u8 = 1;

/// The aggregates of a window's metrics, sorted by metric index, each entry
/// little-endian: `metric u16, form u8`, then `value f64, time i64` for one
/// reading's aggregate, else `count u32, sum, min, max, first, last, first_t, last_t`.
#[derive(Clone, Default, PartialEq)]
pub struct Metrics(Box<[u8]>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One reading's aggregate: every field follows from the value and its time.
fn single(s: &Stats) -> bool {
    let v = s.sum.to_bits();
    s.count == 1
        && s.first_t == s.last_t
        && [s.min, s.max, s.first, s.last]
            .iter()
            .all(|x| x.to_bits() == v)
}

fn f64_at(b: &[u8], at: usize) -> f64 {
    f64::from_bits(u64_at(b, at))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(u64_at(b, at).to_le_bytes())
}

/// Length of the entry starting at `at`.
fn len_at(b: &[u8], at: usize) -> usize {
    if b[at + 2] == FORM_ONE { ONE } else { FULL }
}

fn metric_at(b: &[u8], at: usize) -> MetricIdx {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn decode(b: &[u8], at: usize) -> Stats {
    let metric = metric_at(b, at);
    let d = at + HEAD;
    if b[at + 2] == FORM_ONE {
        return Stats::new(metric, i64_at(b, d + 8), f64_at(b, d));
    }
    let mut c = [0u8; 4];
    c.copy_from_slice(&b[d..d + 4]);
    let d = d + 4;
    Stats {
        sum: f64_at(b, d),
        min: f64_at(b, d + 8),
        max: f64_at(b, d + 16),
        first: f64_at(b, d + 24),
        last: f64_at(b, d + 32),
        first_t: i64_at(b, d + 40),
        last_t: i64_at(b, d + 48),
        count: u32::from_le_bytes(c),
        metric,
    }
}

/// The entry of `s` into `out`; its length.
fn encode(s: &Stats, out: &mut [u8; FULL]) -> usize {
    out[..2].copy_from_slice(&s.metric.to_le_bytes());
    if single(s) {
        out[2] = FORM_ONE;
        out[HEAD..HEAD + 8].copy_from_slice(&s.sum.to_le_bytes());
        out[HEAD + 8..ONE].copy_from_slice(&s.first_t.to_le_bytes());
        return ONE;
    }
    out[2] = FORM_FULL;
    out[HEAD..HEAD + 4].copy_from_slice(&s.count.to_le_bytes());
    let d = HEAD + 4;
    for (i, x) in [s.sum, s.min, s.max, s.first, s.last].iter().enumerate() {
        out[d + 8 * i..d + 8 * i + 8].copy_from_slice(&x.to_le_bytes());
    }
    out[d + 40..d + 48].copy_from_slice(&s.first_t.to_le_bytes());
    out[d + 48..FULL].copy_from_slice(&s.last_t.to_le_bytes());
    FULL
}

impl Metrics {
    /// The aggregates, by metric index.
    pub fn iter(&self) -> impl Iterator<Item = Stats> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            (at < self.0.len()).then(|| {
                let s = decode(&self.0, at);
                at += len_at(&self.0, at);
                s
            })
        })
    }

    /// Number of metrics.
    pub fn len(&self) -> usize {
        self.iter_at().count()
    }

    /// No metric.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes held (the block is exactly sized).
    pub fn bytes(&self) -> usize {
        self.0.len()
    }

    /// Offsets of the entries.
    fn iter_at(&self) -> impl Iterator<Item = usize> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            (at < self.0.len()).then(|| {
                let here = at;
                at += len_at(&self.0, at);
                here
            })
        })
    }

    /// The entry of `m`: `Ok(offset)`, or `Err(offset)` where it would go.
    fn find(&self, m: MetricIdx) -> Result<usize, usize> {
        for at in self.iter_at() {
            let k = metric_at(&self.0, at);
            if k == m {
                return Ok(at);
            }
            if k > m {
                return Err(at);
            }
        }
        Err(self.0.len())
    }

    /// Writes `s` over the `old` bytes at `at` (0: an insertion there); the block
    /// is rebuilt exactly sized when the entry's length changes.
    fn put(&mut self, at: usize, old: usize, s: &Stats) {
        let mut e = [0u8; FULL];
        let n = encode(s, &mut e);
        if n == old {
            self.0[at..at + n].copy_from_slice(&e[..n]);
            return;
        }
        let mut v = Vec::with_capacity(self.0.len() - old + n);
        v.extend_from_slice(&self.0[..at]);
        v.extend_from_slice(&e[..n]);
        v.extend_from_slice(&self.0[at + old..]);
        self.0 = v.into_boxed_slice();
    }

    /// Adds a reading of metric `m`.
    pub fn add(&mut self, m: MetricIdx, t: Millis, v: f64) {
        match self.find(m) {
            Ok(at) => {
                let mut s = decode(&self.0, at);
                s.add(t, v);
                self.put(at, len_at(&self.0, at), &s);
            }
            Err(at) => self.put(at, 0, &Stats::new(m, t, v)),
        }
    }

    /// Merges another window's aggregate of the same metric (sessions).
    pub fn merge(&mut self, o: &Stats) {
        match self.find(o.metric) {
            Ok(at) => {
                let mut s = decode(&self.0, at);
                s.merge(o);
                self.put(at, len_at(&self.0, at), &s);
            }
            Err(at) => self.put(at, 0, o),
        }
    }
}

/// From aggregates sorted by metric index (a stored window's).
impl FromIterator<Stats> for Metrics {
    fn from_iter<I: IntoIterator<Item = Stats>>(it: I) -> Self {
        let mut v = Vec::new();
        let mut e = [0u8; FULL];
        for s in it {
            let n = encode(&s, &mut e);
            v.extend_from_slice(&e[..n]);
        }
        Self(v.into_boxed_slice())
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
