//! A window's per-metric aggregates in one exactly sized block, a metric of one
//! reading in 19 bytes instead of 64 (two of one reading in 30, held inline): with short windows and
//! lateness most of a device's windows hold one reading a metric (BENCHMARKS 4b).

use super::varint;
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
/// its value alone (the time of the last such entry before it: the metrics of
/// one reading share their time), or the count and the whole aggregate.
const HEAD: usize = 3;
const ONE: usize = HEAD + 16;
const SAME: usize = HEAD + 8;
const FULL: usize = HEAD + 4 + 56;
const FORM_ONE: u8 = 0;
const FORM_FULL: u8 = 1;
const FORM_SAME: u8 = 2;
/// Packed fired windows only ([`Metrics::packed_into`]): a whole aggregate whose
/// count and times are the last whole entry's (a reading carries every metric).
const FORM_LIKE: u8 = 3;
const LIKE: usize = HEAD + 40;
/// Packed fired windows only: a whole aggregate, its five values, then varints
/// of its count, its first time after the window's start and its last after its first.
const FORM_NEAR: u8 = 4;

/// The aggregates of a window's metrics, sorted by metric index, each entry
/// little-endian: `metric u16, form u8`, then `value f64, time i64` for one
/// reading's aggregate, `value f64` for one reading's at the time of the last
/// such entry before it, else `count u32, sum, min, max, first, last, first_t,
/// last_t`. The encoding of a list of aggregates is canonical (one form each).
#[derive(Clone, Default, PartialEq)]
pub struct Metrics(Block);

/// Bytes kept in the value itself: two metrics of one reading (30), the
/// commonest window at 100 000 devices, then need no allocation (their block
/// took a 48-byte heap chunk besides the 16-byte pointer).
const INLINE: usize = ONE + SAME;

/// The entries' bytes: inline when they fit, else one exactly sized allocation.
#[derive(Clone)]
enum Block {
    Inline(u8, [u8; INLINE]),
    Heap(Box<[u8]>),
}

impl Default for Block {
    fn default() -> Self {
        Block::Inline(0, [0; INLINE])
    }
}

impl PartialEq for Block {
    fn eq(&self, o: &Self) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl Block {
    fn as_slice(&self) -> &[u8] {
        match self {
            Block::Inline(n, a) => &a[..usize::from(*n)],
            Block::Heap(b) => b,
        }
    }
}

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

/// The entries of a block in order: `(offset, aggregate)`.
#[derive(Clone)]
struct Entries<'a> {
    b: &'a [u8],
    at: usize,
    /// Time of the last one-reading entry with its time.
    shared: Millis,
    /// Count and times of the last whole entry.
    full: (u32, Millis, Millis),
    /// The window's start, for packed entries' times.
    base: Millis,
}

impl<'a> Entries<'a> {
    fn new(b: &'a [u8]) -> Self {
        Self::packed(b, 0)
    }

    fn packed(b: &'a [u8], base: Millis) -> Self {
        Self {
            b,
            at: 0,
            shared: 0,
            full: (0, 0, 0),
            base,
        }
    }
}

impl Entries<'_> {
    /// The next entry's offset, metric and form, without decoding it.
    fn head(&mut self) -> Option<(usize, MetricIdx, u8)> {
        let (b, at) = (self.b, self.at);
        if at >= b.len() {
            return None;
        }
        let form = b[at + 2];
        self.at += match form {
            FORM_ONE => {
                self.shared = i64_at(b, at + HEAD + 8);
                ONE
            }
            FORM_SAME => SAME,
            FORM_LIKE => LIKE,
            FORM_NEAR => {
                let mut i = at + LIKE;
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                let (count, first, span) = (
                    varint::read(b, &mut i) as u32,
                    varint::read(b, &mut i) as i64,
                    varint::read(b, &mut i) as i64,
                );
                let first_t = self.base.wrapping_add(first);
                self.full = (count, first_t, first_t.wrapping_add(span));
                i - at
            }
            _ => {
                let mut c = [0u8; 4];
                c.copy_from_slice(&b[at + HEAD..at + HEAD + 4]);
                let d = at + HEAD + 4;
                self.full = (u32::from_le_bytes(c), i64_at(b, d + 40), i64_at(b, d + 48));
                FULL
            }
        };
        Some((at, u16::from_le_bytes([b[at], b[at + 1]]), form))
    }

    /// The aggregate of the entry `head` returned last.
    fn stats(&self, at: usize, metric: MetricIdx, form: u8) -> Stats {
        let (b, d) = (self.b, at + HEAD);
        let d = match form {
            FORM_FULL => d + 4,
            FORM_LIKE | FORM_NEAR => d,
            _ => return Stats::new(metric, self.shared, f64_at(b, d)),
        };
        let (count, first_t, last_t) = self.full;
        Stats {
            sum: f64_at(b, d),
            min: f64_at(b, d + 8),
            max: f64_at(b, d + 16),
            first: f64_at(b, d + 24),
            last: f64_at(b, d + 32),
            first_t,
            last_t,
            count,
            metric,
        }
    }
}

impl Iterator for Entries<'_> {
    type Item = (usize, Stats);

    fn next(&mut self) -> Option<(usize, Stats)> {
        let (at, m, form) = self.head()?;
        Some((at, self.stats(at, m, form)))
    }
}

/// The entry of `s` into `out` given the time the entries before it share
/// (updated); its length.
fn encode(s: &Stats, shared: &mut Option<Millis>, out: &mut [u8; FULL]) -> usize {
    out[..2].copy_from_slice(&s.metric.to_le_bytes());
    if single(s) {
        out[HEAD..HEAD + 8].copy_from_slice(&s.sum.to_le_bytes());
        if *shared == Some(s.first_t) {
            out[2] = FORM_SAME;
            return SAME;
        }
        *shared = Some(s.first_t);
        out[2] = FORM_ONE;
        out[HEAD + 8..ONE].copy_from_slice(&s.first_t.to_le_bytes());
        return ONE;
    }
    out[2] = FORM_FULL;
    put_full(&mut out[HEAD..], s);
    FULL
}

/// A whole entry's bytes after its head: `count u32`, the five values, the two times.
fn put_full(d: &mut [u8], s: &Stats) {
    d[..4].copy_from_slice(&s.count.to_le_bytes());
    for (i, x) in [s.sum, s.min, s.max, s.first, s.last].iter().enumerate() {
        d[4 + 8 * i..12 + 8 * i].copy_from_slice(&x.to_le_bytes());
    }
    d[44..52].copy_from_slice(&s.first_t.to_le_bytes());
    d[52..60].copy_from_slice(&s.last_t.to_le_bytes());
}

/// The aggregate of metric `m` in a whole entry's bytes after its head ([`put_full`]).
fn full_at(d: &[u8], metric: MetricIdx) -> Stats {
    let mut c = [0u8; 4];
    c.copy_from_slice(&d[..4]);
    Stats {
        sum: f64_at(d, 4),
        min: f64_at(d, 12),
        max: f64_at(d, 20),
        first: f64_at(d, 28),
        last: f64_at(d, 36),
        first_t: i64_at(d, 44),
        last_t: i64_at(d, 52),
        count: u32::from_le_bytes(c),
        metric,
    }
}

/// The canonical block of aggregates sorted by metric, exactly sized: a first
/// pass counts the bytes.
fn encode_all(list: impl Iterator<Item = Stats> + Clone) -> Block {
    let mut e = [0u8; FULL];
    let mut shared = None;
    let len: usize = list.clone().map(|s| encode(&s, &mut shared, &mut e)).sum();
    let mut shared = None;
    if len <= INLINE {
        let mut a = [0u8; INLINE];
        let mut at = 0;
        for s in list {
            let n = encode(&s, &mut shared, &mut e);
            a[at..at + n].copy_from_slice(&e[..n]);
            at += n;
        }
        #[allow(clippy::cast_possible_truncation)]
        return Block::Inline(len as u8, a);
    }
    let mut v = Vec::with_capacity(len);
    for s in list {
        let n = encode(&s, &mut shared, &mut e);
        v.extend_from_slice(&e[..n]);
    }
    Block::Heap(v.into_boxed_slice())
}

/// A block's aggregates with `new` in place of its metric's entry, in order.
#[derive(Clone)]
struct Replaced<'a> {
    old: Entries<'a>,
    new: Option<Stats>,
}

impl Iterator for Replaced<'_> {
    type Item = Stats;

    fn next(&mut self) -> Option<Stats> {
        loop {
            let mut ahead = self.old.clone();
            let next = ahead.next().map(|(_, s)| s);
            match (next, self.new) {
                (Some(s), Some(n)) if s.metric == n.metric => self.old = ahead,
                (Some(s), Some(n)) if s.metric > n.metric => return self.new.take(),
                (Some(s), _) => {
                    self.old = ahead;
                    return Some(s);
                }
                (None, _) => return self.new.take(),
            }
        }
    }
}

impl Metrics {
    /// A block kept apart fetched into the cache ahead of use (one inline is the window's).
    pub fn prefetch(&self) {
        if let Block::Heap(b) = &self.0 {
            crate::hint::prefetch(&**b);
        }
    }

    /// The aggregates, by metric index.
    pub fn iter(&self) -> impl Iterator<Item = Stats> + '_ {
        Entries::new(self.0.as_slice()).map(|(_, s)| s)
    }

    /// Number of metrics.
    pub fn len(&self) -> usize {
        Entries::new(self.0.as_slice()).count()
    }

    /// No metric.
    pub fn is_empty(&self) -> bool {
        self.0.as_slice().is_empty()
    }

    /// Bytes of the entries (held inline up to 30, else exactly sized on the heap).
    pub fn bytes(&self) -> usize {
        self.0.as_slice().len()
    }

    /// Whether the entries are held inline (no allocation).
    pub fn inline(&self) -> bool {
        matches!(self.0, Block::Inline(..))
    }

    /// The entry of `m` and its offset.
    fn find(&self, m: MetricIdx) -> Option<(usize, Stats)> {
        let mut e = Entries::new(self.0.as_slice());
        while let Some((at, k, form)) = e.head() {
            if k == m {
                return Some((at, e.stats(at, k, form)));
            }
            if k > m {
                return None;
            }
        }
        None
    }

    /// Sets the aggregate of `s.metric` to `s` (`at`: its whole entry's offset,
    /// kept in place when it stays whole); otherwise the block is re-encoded.
    fn set(&mut self, at: Option<usize>, s: Stats) {
        if let (Some(at), Block::Heap(b)) = (at, &mut self.0)
            && b[at + 2] == FORM_FULL
            && !single(&s)
        {
            let mut e = [0u8; FULL];
            encode(&s, &mut None, &mut e);
            b[at..at + FULL].copy_from_slice(&e);
            return;
        }
        let list = Replaced {
            old: Entries::new(self.0.as_slice()),
            new: Some(s),
        };
        self.0 = encode_all(list);
    }

    /// Adds a reading of metric `m`.
    pub fn add(&mut self, m: MetricIdx, t: Millis, v: f64) {
        // A whole entry kept apart (a window's second reading on) is updated where it
        // lies: decoding it and encoding it again was most of a reading's cost here.
        if let Block::Heap(b) = &mut self.0 {
            // Entries stepped over by their form alone (a window's block holds the
            // three plain forms; anything else goes the decoding way).
            let mut at = 0;
            while let Some(&[lo, hi, form]) = b.get(at..at + HEAD) {
                let k = u16::from_le_bytes([lo, hi]);
                if k == m && form == FORM_FULL {
                    return add_in_place(&mut b[at + HEAD..at + FULL], m, t, v);
                }
                at += match form {
                    FORM_ONE if k < m => ONE,
                    FORM_SAME if k < m => SAME,
                    FORM_FULL if k < m => FULL,
                    _ => break,
                };
            }
        }
        match self.find(m) {
            Some((at, mut s)) => {
                s.add(t, v);
                self.set(Some(at), s);
            }
            None => self.set(None, Stats::new(m, t, v)),
        }
    }

    /// Merges another window's aggregate of the same metric (sessions).
    pub fn merge(&mut self, o: &Stats) {
        match self.find(o.metric) {
            Some((at, mut s)) => {
                s.merge(o);
                self.set(Some(at), s);
            }
            None => self.set(None, *o),
        }
    }
}

/// A reading added to a whole entry's bytes after its head, where they lie (a
/// whole entry stays whole: its count is above one).
fn add_in_place(d: &mut [u8], m: MetricIdx, t: Millis, v: f64) {
    let mut s = full_at(d, m);
    s.add(t, v);
    put_full(d, &s);
}

/// The aggregates of a block [`Metrics::as_bytes`] or [`Metrics::packed_into`]
/// (for a window starting at `base`) gave, by metric index.
pub(crate) fn stats_in(b: &[u8], base: Millis) -> impl Iterator<Item = Stats> + Clone + '_ {
    Entries::packed(b, base).map(|(_, s)| s)
}

impl Metrics {
    /// The canonical bytes of the entries.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_slice()
    }

    /// The bytes of a packed fired window starting at `base`: the canonical ones,
    /// but that a whole entry keeps its count and times as varints after its
    /// values (48 bytes instead of 63 for ten readings in 10 s), or none with the
    /// count and times of the whole one before it (a reading carries every metric:
    /// 43 bytes). Appended to `out`; their length.
    pub(crate) fn packed_into(&self, base: Millis, out: Option<&mut Vec<u8>>) -> usize {
        let b = self.0.as_slice();
        let mut e = Entries::new(b);
        let mut last: Option<(u32, Millis, Millis)> = None;
        let (mut n, mut out) = (0, out);
        while let Some((at, _, form)) = e.head() {
            let len = match form {
                FORM_FULL => FULL,
                FORM_SAME => SAME,
                _ => ONE,
            };
            if form != FORM_FULL {
                n += len;
                if let Some(o) = out.as_deref_mut() {
                    o.extend_from_slice(&b[at..at + len]);
                }
                continue;
            }
            let (count, first_t, last_t) = e.full;
            let like = last == Some(e.full);
            last = Some(e.full);
            #[allow(clippy::cast_sign_loss)]
            let near = (first_t >= base && last_t >= first_t).then(|| {
                [
                    u64::from(count),
                    first_t.wrapping_sub(base) as u64,
                    last_t.wrapping_sub(first_t) as u64,
                ]
            });
            n += match (like, near) {
                (true, _) => LIKE,
                (false, Some(v)) => LIKE + v.iter().map(|&x| varint::len(x)).sum::<usize>(),
                (false, None) => FULL,
            };
            let Some(o) = out.as_deref_mut() else {
                continue;
            };
            match (like, near) {
                (false, None) => o.extend_from_slice(&b[at..at + FULL]),
                (like, near) => {
                    o.extend_from_slice(&b[at..at + 2]);
                    o.push(if like { FORM_LIKE } else { FORM_NEAR });
                    o.extend_from_slice(&b[at + HEAD + 4..at + HEAD + 44]);
                    for x in near.filter(|_| !like).into_iter().flatten() {
                        varint::put(o, x);
                    }
                }
            }
        }
        n
    }

    /// From bytes [`Metrics::as_bytes`] or [`Metrics::packed_into`] (of a window
    /// starting at `base`) gave.
    pub(crate) fn from_bytes(b: &[u8], base: Millis) -> Self {
        let mut e = Entries::new(b);
        if std::iter::from_fn(|| e.head()).any(|(_, _, f)| f == FORM_LIKE || f == FORM_NEAR) {
            return Self::from_sorted(stats_in(b, base));
        }
        if b.len() > INLINE {
            return Self(Block::Heap(b.into()));
        }
        let mut a = [0u8; INLINE];
        a[..b.len()].copy_from_slice(b);
        #[allow(clippy::cast_possible_truncation)]
        Self(Block::Inline(b.len() as u8, a))
    }

    /// From aggregates sorted by metric index (a stored window's), read twice
    /// (the block's length, then its bytes) instead of collected.
    pub fn from_sorted(list: impl Iterator<Item = Stats> + Clone) -> Self {
        Self(encode_all(list))
    }
}

/// From aggregates sorted by metric index.
impl FromIterator<Stats> for Metrics {
    fn from_iter<I: IntoIterator<Item = Stats>>(it: I) -> Self {
        let list: Vec<Stats> = it.into_iter().collect();
        Self::from_sorted(list.into_iter())
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
