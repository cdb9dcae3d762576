//! Event-time windows per (group, device) (SPEC §6), pure.

use serde::{Deserialize, Serialize};

use crate::model::Millis;

/// A validated window shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WindowSpec {
    /// `[k·size, (k+1)·size)`.
    Tumbling {
        /// Length.
        size_ms: i64,
    },
    /// `[k·slide, k·slide + size)`.
    Hopping {
        /// Length.
        size_ms: i64,
        /// Start spacing.
        slide_ms: i64,
    },
    /// `[first, last + gap)`.
    Session {
        /// Inactivity gap.
        gap_ms: i64,
    },
}

/// Index of an interned metric name.
pub type MetricIdx = u16;

/// Aggregate of one metric in one window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Readings carrying the metric.
    pub count: u64,
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
    first_t: Millis,
    last_t: Millis,
}

impl Stats {
    fn new(t: Millis, v: f64) -> Self {
        Self {
            count: 1,
            sum: v,
            min: v,
            max: v,
            first: v,
            last: v,
            first_t: t,
            last_t: t,
        }
    }

    /// Adds a value; arrivals come in arrival order, which settles ties.
    fn add(&mut self, t: Millis, v: f64) {
        self.count += 1;
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

    fn merge(&mut self, o: &Stats) {
        self.count += o.count;
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
        self.sum / self.count as f64
    }
}

/// Inserts with the capacity kept near the length: a device's one or two open
/// windows and its few metrics would otherwise each take `Vec`'s first four slots.
fn insert_tight<T>(v: &mut Vec<T>, i: usize, x: T) {
    if v.len() == v.capacity() {
        v.reserve_exact((v.len() / 2).max(1));
    }
    v.insert(i, x);
}

/// One open window of one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Inclusive start.
    pub start: Millis,
    /// Exclusive end.
    pub end: Millis,
    /// Revision of the last emitted result; `None` before the first emission.
    pub emitted: Option<u32>,
    /// Changed since the last emission.
    pub dirty: bool,
    /// Readings.
    pub count: u64,
    /// Heartbeats.
    pub heartbeats: u64,
    /// Per-metric aggregates, sorted by metric index.
    pub metrics: Vec<(MetricIdx, Stats)>,
    /// Session windows: the latest event time (end = last + gap).
    pub last_event: Millis,
}

impl Window {
    fn new(start: Millis, end: Millis) -> Self {
        Self {
            start,
            end,
            emitted: None,
            dirty: true,
            count: 0,
            heartbeats: 0,
            metrics: Vec::new(),
            last_event: start,
        }
    }

    /// Adds an event; `metrics` empty for a heartbeat.
    pub fn add(&mut self, t: Millis, heartbeat: bool, metrics: &[(MetricIdx, f64)]) {
        self.dirty = true;
        self.last_event = self.last_event.max(t);
        if heartbeat {
            self.heartbeats += 1;
            return;
        }
        self.count += 1;
        for &(m, v) in metrics {
            match self.metrics.binary_search_by_key(&m, |(k, _)| *k) {
                Ok(i) => self.metrics[i].1.add(t, v),
                Err(i) => insert_tight(&mut self.metrics, i, (m, Stats::new(t, v))),
            }
        }
    }

    fn absorb(&mut self, o: Window) {
        self.start = self.start.min(o.start);
        self.end = self.end.max(o.end);
        self.last_event = self.last_event.max(o.last_event);
        self.emitted = match (self.emitted, o.emitted) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.dirty = true;
        self.count += o.count;
        self.heartbeats += o.heartbeats;
        for (m, s) in o.metrics {
            match self.metrics.binary_search_by_key(&m, |(k, _)| *k) {
                Ok(i) => self.metrics[i].1.merge(&s),
                Err(i) => insert_tight(&mut self.metrics, i, (m, s)),
            }
        }
    }
}

/// The windows an event at `t` belongs to, as `(start, end)`, oldest first.
/// Sessions yield the event's own window `[t, t + gap)`.
pub fn assign(spec: WindowSpec, t: Millis, out: &mut heapless::Vec<(Millis, Millis), 64>) {
    out.clear();
    match spec {
        WindowSpec::Tumbling { size_ms } => {
            let s = t.div_euclid(size_ms) * size_ms;
            let _ = out.push((s, s + size_ms));
        }
        WindowSpec::Hopping { size_ms, slide_ms } => {
            let last = t.div_euclid(slide_ms) * slide_ms;
            let mut s = last - (size_ms - 1).div_euclid(slide_ms) * slide_ms;
            while s <= last {
                if s + size_ms > t && out.push((s, s + size_ms)).is_err() {
                    break;
                }
                s += slide_ms;
            }
        }
        WindowSpec::Session { gap_ms } => {
            let _ = out.push((t, t + gap_ms));
        }
    }
}

/// Largest number of hopping windows one event may fall into.
pub const MAX_OVERLAP: i64 = 64;

/// The event-time span `[from, until)` one window rule governs (SPEC §11: a
/// changed rule switches at an event time, so the windows of two rules never overlap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// No window of the rule starts before this.
    pub from: Millis,
    /// No window of the rule ends after this (the one across it ends here).
    pub until: Millis,
}

impl Span {
    /// Every event time.
    pub const ALL: Span = Span {
        from: Millis::MIN,
        until: Millis::MAX,
    };
}

/// Where a group switches from rule `old` to rule `new` when its latest event
/// time is `latest`: the first boundary of `new` at or after the end of the last
/// `old` window holding `latest` (SPEC §11). Sessions have no boundaries.
pub fn switch_point(old: WindowSpec, new: WindowSpec, latest: Millis) -> Millis {
    let mut ws = heapless::Vec::new();
    assign(old, latest, &mut ws);
    let end = ws.iter().map(|&(_, e)| e).max().unwrap_or(latest);
    let step = match new {
        WindowSpec::Tumbling { size_ms } => size_ms,
        WindowSpec::Hopping { slide_ms, .. } => slide_ms,
        WindowSpec::Session { .. } => 1,
    };
    let k = end.div_euclid(step);
    let at = k.saturating_mul(step);
    if at < end {
        at.saturating_add(step)
    } else {
        at
    }
}

/// A window rule as it applies to one event: its shape, the event-time span it
/// governs, and how long its windows accept late events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Window shape.
    pub spec: WindowSpec,
    /// Where the shape governs.
    pub span: Span,
    /// `allowed_lateness_ms`.
    pub lateness: Millis,
    /// Windows that may take events past the lateness ("auto" lateness).
    pub fresh: Option<Fresh>,
}

/// Windows that start after everything a device ever sent never existed: with
/// "auto" lateness they take events up to `reach` behind the watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fresh {
    /// The device's latest event time before this one.
    pub after: Millis,
    /// How far behind the watermark (`adaptive.max_ms`).
    pub reach: Millis,
}

/// Adds an event to a device's open windows (sorted by start), within the
/// rule's span. Returns false if every window of the event is past
/// `end + lateness` (late).
pub fn apply(
    windows: &mut Vec<Window>,
    rule: Rule,
    t: Millis,
    wm: Option<Millis>,
    heartbeat: bool,
    metrics: &[(MetricIdx, f64)],
) -> bool {
    let Rule {
        spec,
        span,
        lateness,
        fresh,
    } = rule;
    let open = |end: Millis| wm.is_none_or(|w| end + lateness > w);
    let new = |start: Millis, end: Millis| {
        fresh.is_some_and(|f| start > f.after && wm.is_none_or(|w| end.saturating_add(f.reach) > w))
    };
    if let WindowSpec::Session { gap_ms } = spec {
        let hi = t.saturating_add(gap_ms).min(span.until);
        if !open(hi) && !new(t, hi) {
            return false;
        }
        let lo = t;
        // Sessions whose span [start, end) touches [t, t + gap) merge with the event.
        let first = windows.partition_point(|w| w.end <= lo);
        let mut last = first;
        while last < windows.len() && windows[last].start < hi {
            last += 1;
        }
        let mut merged = Window::new(lo, hi);
        merged.last_event = t;
        merged.dirty = true;
        for w in windows.drain(first..last) {
            merged.absorb(w);
        }
        merged.end = (merged.last_event + gap_ms).min(span.until);
        merged.add(t, heartbeat, metrics);
        insert_tight(windows, first, merged);
        return true;
    }
    let mut ws = heapless::Vec::new();
    assign(spec, t, &mut ws);
    let mut any = false;
    for &(s, e) in &ws {
        let e = e.min(span.until);
        if s < span.from {
            continue;
        }
        let found = windows.binary_search_by_key(&s, |w| w.start);
        // With "auto" lateness a window still kept takes the event (a revision).
        let kept = fresh.is_some() && found.is_ok();
        if !(open(e) || kept || new(s, e)) {
            continue;
        }
        any = true;
        let i = match found {
            Ok(i) => i,
            Err(i) => {
                insert_tight(windows, i, Window::new(s, e));
                i
            }
        };
        windows[i].add(t, heartbeat, metrics);
    }
    any
}

/// A device's windows: those still open, or changed since their last result,
/// as [`Window`]s; the fired ones (a result out, nothing since), which are only
/// kept for their allowed lateness, packed back to back in one buffer. With 10 s
/// windows and 30 s lateness a device keeps three fired windows beside its open
/// one; unpacked they took ~280 bytes each (the struct, its metrics' block, the
/// vector's slack), packed ~55 + 50 per metric. A late reading unpacks the
/// window it falls into; it is packed again once its revision is out.
/// Serialized as the one sorted list of windows it always was.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Windows {
    open: Vec<Window>,
    fired: Box<[u8]>,
}

fn put_u(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_i(out: &mut Vec<u8>, v: i64) {
    put_u(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads what [`Windows::pack`] wrote (only ever its own bytes).
struct Unpack<'a> {
    b: &'a [u8],
    i: usize,
}

impl Unpack<'_> {
    fn done(&self) -> bool {
        self.i >= self.b.len()
    }

    fn u(&mut self) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        while let Some(&x) = self.b.get(self.i) {
            self.i += 1;
            v |= u64::from(x & 0x7f) << shift;
            if x < 0x80 {
                break;
            }
            shift += 7;
        }
        v
    }

    fn i(&mut self) -> i64 {
        let z = self.u();
        ((z >> 1) as i64) ^ -((z & 1) as i64)
    }

    fn f(&mut self) -> f64 {
        let mut b = [0u8; 8];
        if let Some(s) = self.b.get(self.i..self.i + 8) {
            b.copy_from_slice(s);
        }
        self.i += 8;
        f64::from_le_bytes(b)
    }

    /// A window's start and end, its body skipped.
    fn span(&mut self) -> (Millis, Millis) {
        let start = self.i();
        let end = start.wrapping_add(self.i());
        for _ in 0..4 {
            self.u();
        }
        for _ in 0..self.u() {
            self.u();
            self.u();
            self.i += 40;
            self.u();
            self.u();
        }
        (start, end)
    }

    fn window(&mut self) -> Window {
        let start = self.i();
        let end = start.wrapping_add(self.i());
        let emitted = u32::try_from(self.u()).ok().and_then(|r| r.checked_sub(1));
        let count = self.u();
        let heartbeats = self.u();
        let last_event = start.wrapping_add(self.i());
        let n = usize::try_from(self.u()).unwrap_or(0);
        let mut metrics = Vec::with_capacity(n);
        for _ in 0..n {
            let m = MetricIdx::try_from(self.u()).unwrap_or(MetricIdx::MAX);
            let count = self.u();
            let (sum, min, max, first, last) = (self.f(), self.f(), self.f(), self.f(), self.f());
            let first_t = start.wrapping_add(self.i());
            let last_t = start.wrapping_add(self.i());
            metrics.push((
                m,
                Stats {
                    count,
                    sum,
                    min,
                    max,
                    first,
                    last,
                    first_t,
                    last_t,
                },
            ));
        }
        Window {
            start,
            end,
            emitted,
            dirty: false,
            count,
            heartbeats,
            metrics,
            last_event,
        }
    }
}

/// Bytes before the packed windows: the least and the greatest end among them.
const HEADER: usize = 16;

impl Windows {
    fn pack(w: &Window, out: &mut Vec<u8>) {
        let rel = |t: Millis| t.wrapping_sub(w.start);
        put_i(out, w.start);
        put_i(out, rel(w.end));
        put_u(out, w.emitted.map_or(0, |r| u64::from(r) + 1));
        put_u(out, w.count);
        put_u(out, w.heartbeats);
        put_i(out, rel(w.last_event));
        put_u(out, w.metrics.len() as u64);
        for (m, s) in &w.metrics {
            put_u(out, u64::from(*m));
            put_u(out, s.count);
            for f in [s.sum, s.min, s.max, s.first, s.last] {
                out.extend_from_slice(&f.to_le_bytes());
            }
            put_i(out, rel(s.first_t));
            put_i(out, rel(s.last_t));
        }
    }

    /// The least and greatest end of the fired windows (read without unpacking).
    fn ends(&self) -> Option<(Millis, Millis)> {
        let h = self.fired.get(..HEADER)?;
        let at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            Millis::from_le_bytes(b)
        };
        Some((at(0), at(8)))
    }

    fn reader(&self) -> Unpack<'_> {
        Unpack {
            b: self.fired.get(HEADER..).unwrap_or_default(),
            i: 0,
        }
    }

    fn fired(&self) -> Vec<Window> {
        let mut r = self.reader();
        let mut v = Vec::new();
        while !r.done() {
            v.push(r.window());
        }
        v
    }

    /// Packs `ws` (sorted by start) after the fired windows kept, or instead of them.
    fn set_fired(&mut self, keep: bool, ws: &[Window]) {
        let (mut lo, mut hi) = match self.ends().filter(|_| keep) {
            Some(e) => e,
            None => (Millis::MAX, Millis::MIN),
        };
        if ws.is_empty() && !keep {
            self.fired = Box::default();
            return;
        }
        let mut out = Vec::with_capacity(self.fired.len() + ws.len() * 128);
        out.extend_from_slice(&[0; HEADER]);
        if keep {
            out.extend_from_slice(self.fired.get(HEADER..).unwrap_or_default());
        }
        for w in ws {
            lo = lo.min(w.end);
            hi = hi.max(w.end);
            Self::pack(w, &mut out);
        }
        out[..8].copy_from_slice(&lo.to_le_bytes());
        out[8..HEADER].copy_from_slice(&hi.to_le_bytes());
        self.fired = out.into_boxed_slice();
    }

    /// Packs the windows with a result out and nothing since.
    fn pack_fired(&mut self) {
        if !self.open.iter().any(|w| w.emitted.is_some() && !w.dirty) {
            return;
        }
        let new: Vec<Window> = self
            .open
            .extract_if(.., |w| w.emitted.is_some() && !w.dirty)
            .collect();
        match self.ends() {
            // In order (tumbling windows, sessions): after the others, nothing unpacked.
            Some((_, hi)) if new[0].start >= hi => self.set_fired(true, &new),
            None => self.set_fired(false, &new),
            Some(_) => {
                let mut all = self.fired();
                all.extend(new);
                all.sort_by_key(|w| w.start);
                self.set_fired(false, &all);
            }
        }
        if self.open.capacity() > self.open.len() * 2 {
            self.open.shrink_to_fit();
        }
    }

    /// Unpacks the fired windows `take` selects (by start and end) into the open ones.
    fn unpack_where(&mut self, take: impl Fn(Millis, Millis) -> bool) {
        let mut r = self.reader();
        let mut any = false;
        while !r.done() {
            let (s, e) = r.span();
            any |= take(s, e);
        }
        if !any {
            return;
        }
        let (out, stay): (Vec<Window>, Vec<Window>) =
            self.fired().into_iter().partition(|w| take(w.start, w.end));
        self.set_fired(false, &stay);
        for w in out {
            let i = self.open.partition_point(|o| o.start < w.start);
            insert_tight(&mut self.open, i, w);
        }
    }

    /// Windows kept, open and fired.
    pub fn len(&self) -> usize {
        let mut r = self.reader();
        let mut n = self.open.len();
        while !r.done() {
            r.span();
            n += 1;
        }
        n
    }

    /// No window kept.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.fired.is_empty()
    }

    /// Every window, sorted by start (fired ones unpacked: for display and storage).
    pub fn all(&self) -> Vec<Window> {
        let mut v = self.fired();
        v.extend(self.open.iter().cloned());
        v.sort_by_key(|w| w.start);
        v
    }

    /// [`apply`] to this device's windows.
    pub fn apply(
        &mut self,
        rule: Rule,
        t: Millis,
        wm: Option<Millis>,
        heartbeat: bool,
        metrics: &[(MetricIdx, f64)],
    ) -> bool {
        // An event can only fall into a fired window that ends after it.
        if self.ends().is_some_and(|(_, hi)| t < hi) {
            if let WindowSpec::Session { gap_ms } = rule.spec {
                let hi = t.saturating_add(gap_ms);
                self.unpack_where(|s, e| e > t && s < hi);
            } else {
                let mut ws = heapless::Vec::new();
                assign(rule.spec, t, &mut ws);
                self.unpack_where(|s, _| ws.iter().any(|&(a, _)| a == s));
            }
        }
        let any = apply(&mut self.open, rule, t, wm, heartbeat, metrics);
        self.pack_fired();
        any
    }

    /// Emits each changed window that ends at or before `upto` (in start order)
    /// as `f(window, revision)`; true if any.
    pub fn emit(&mut self, upto: Millis, mut f: impl FnMut(&Window, u32)) -> bool {
        let mut emitted = false;
        for w in self.open.iter_mut().filter(|w| w.dirty && upto >= w.end) {
            let revision = w.emitted.map_or(0, |r| r + 1);
            w.emitted = Some(revision);
            w.dirty = false;
            emitted = true;
            f(w, revision);
        }
        if emitted {
            self.pack_fired();
        }
        emitted
    }

    /// Drops the windows whose lateness has passed at `wm` (`wm >= end + lateness`);
    /// returns whether any went and the latest start of those that did.
    pub fn purge(&mut self, wm: Millis, lateness: Millis) -> (bool, Option<Millis>) {
        let keep = |e: Millis| wm < e + lateness;
        let mut gone = None;
        let before = self.open.len();
        self.open.retain(|w| {
            let k = keep(w.end);
            if !k {
                gone = gone.max(Some(w.start));
            }
            k
        });
        let mut changed = self.open.len() != before;
        // Keeping is monotone in the end: the least end kept keeps them all.
        if self.ends().is_some_and(|(lo, _)| !keep(lo)) {
            changed = true;
            // Usually the windows that go come first: cut them off without unpacking.
            let mut r = self.reader();
            let (mut cut, mut prefix, mut lo) = (0, true, Millis::MAX);
            while !r.done() {
                let (s, e) = r.span();
                if keep(e) {
                    lo = lo.min(e);
                } else {
                    gone = gone.max(Some(s));
                    if lo == Millis::MAX {
                        cut = r.i;
                    } else {
                        prefix = false;
                    }
                }
            }
            if !prefix {
                let stay: Vec<Window> = self.fired().into_iter().filter(|w| keep(w.end)).collect();
                self.set_fired(false, &stay);
            } else if lo == Millis::MAX {
                self.fired = Box::default();
            } else {
                let mut out = Vec::with_capacity(self.fired.len() - cut);
                out.extend_from_slice(&lo.to_le_bytes());
                out.extend_from_slice(&self.fired[8..HEADER]);
                out.extend_from_slice(&self.fired[HEADER + cut..]);
                self.fired = out.into_boxed_slice();
            }
        }
        (changed, gone)
    }

    /// The watermark at which a window next needs a visit: a changed one's end,
    /// any one's end + `lateness` (its purge).
    pub fn deadline(&self, lateness: Millis) -> Option<Millis> {
        let open = self.open.iter().map(|w| {
            let purge = w.end.saturating_add(lateness);
            if w.dirty { w.end.min(purge) } else { purge }
        });
        let fired = self.ends().map(|(lo, _)| lo.saturating_add(lateness));
        open.chain(fired).min()
    }
}

impl From<Vec<Window>> for Windows {
    fn from(open: Vec<Window>) -> Self {
        let mut w = Self {
            open,
            fired: Box::default(),
        };
        w.pack_fired();
        w
    }
}

impl Serialize for Windows {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.fired.is_empty() {
            return self.open.serialize(s);
        }
        self.all().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Windows {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<Window>::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(spec: WindowSpec, lateness: Millis) -> Rule {
        Rule {
            spec,
            span: Span::ALL,
            lateness,
            fresh: None,
        }
    }

    fn starts(spec: WindowSpec, t: Millis) -> Vec<(Millis, Millis)> {
        let mut v = heapless::Vec::new();
        assign(spec, t, &mut v);
        v.to_vec()
    }

    #[test]
    fn tumbling_aligns_to_the_epoch() {
        let s = WindowSpec::Tumbling { size_ms: 60_000 };
        assert_eq!(
            starts(s, 1_764_480_012_345),
            vec![(1_764_480_000_000, 1_764_480_060_000)]
        );
        assert_eq!(starts(s, 60_000), vec![(60_000, 120_000)]);
    }

    #[test]
    fn hopping_windows_cover_every_slide_multiple_containing_t() {
        let s = WindowSpec::Hopping {
            size_ms: 60_000,
            slide_ms: 15_000,
        };
        assert_eq!(
            starts(s, 100_000),
            vec![
                (45_000, 105_000),
                (60_000, 120_000),
                (75_000, 135_000),
                (90_000, 150_000)
            ]
        );
        let odd = WindowSpec::Hopping {
            size_ms: 10_000,
            slide_ms: 4_000,
        };
        assert_eq!(
            starts(odd, 8_000),
            vec![(0, 10_000), (4_000, 14_000), (8_000, 18_000)]
        );
    }

    #[test]
    fn sessions_merge_events_closer_than_the_gap() {
        let spec = WindowSpec::Session { gap_ms: 10_000 };
        let mut ws = Vec::new();
        assert!(apply(&mut ws, rule(spec, 0), 0, None, false, &[(0, 1.0)]));
        assert!(apply(
            &mut ws,
            rule(spec, 0),
            25_000,
            None,
            false,
            &[(0, 2.0)]
        ));
        assert_eq!(ws.len(), 2);
        assert!(apply(
            &mut ws,
            rule(spec, 0),
            9_000,
            None,
            false,
            &[(0, 3.0)]
        ));
        assert_eq!(ws.len(), 2);
        assert_eq!((ws[0].start, ws[0].end, ws[0].count), (0, 19_000, 2));
        // This one bridges both sessions.
        assert!(apply(
            &mut ws,
            Rule {
                spec,
                span: Span::ALL,
                lateness: 0,
                fresh: None,
            },
            18_000,
            None,
            true,
            &[]
        ));
        assert_eq!(ws.len(), 1);
        assert_eq!(
            (ws[0].start, ws[0].end, ws[0].count, ws[0].heartbeats),
            (0, 35_000, 3, 1)
        );
        // Exactly one gap away is not closer than the gap: a new session.
        assert!(apply(
            &mut ws,
            Rule {
                spec,
                span: Span::ALL,
                lateness: 0,
                fresh: None,
            },
            45_000,
            None,
            false,
            &[]
        ));
        assert_eq!(ws.len(), 2);
        assert_eq!(ws[0].metrics[0].1.first, 1.0);
        assert_eq!(ws[0].metrics[0].1.last, 2.0);
    }

    #[test]
    fn first_and_last_follow_event_time_with_arrival_breaking_ties() {
        let mut w = Window::new(0, 100);
        w.add(50, false, &[(0, 5.0)]);
        w.add(10, false, &[(0, 1.0)]);
        w.add(10, false, &[(0, 2.0)]);
        w.add(90, false, &[(0, 9.0)]);
        w.add(90, false, &[(0, 8.0)]);
        let s = w.metrics[0].1;
        assert_eq!(
            (s.first, s.last, s.min, s.max, s.count, s.sum),
            (1.0, 8.0, 1.0, 9.0, 5, 25.0)
        );
        assert_eq!(s.mean(), 5.0);
    }

    #[test]
    fn windows_past_lateness_refuse_the_event() {
        let spec = WindowSpec::Tumbling { size_ms: 1000 };
        let mut ws = Vec::new();
        assert!(apply(&mut ws, rule(spec, 500), 500, Some(1400), false, &[]));
        assert!(!apply(
            &mut ws,
            rule(spec, 500),
            500,
            Some(1500),
            false,
            &[]
        ));
    }

    /// The packed store behaves exactly as the plain list it replaced: the same
    /// results in the same order, the same windows kept, the same bytes stored.
    mod packed {
        use proptest::prelude::*;

        use super::super::*;

        fn reference_emit(ws: &mut [Window], upto: Millis) -> Vec<(Window, u32)> {
            let mut out = Vec::new();
            for w in ws.iter_mut().filter(|w| w.dirty && upto >= w.end) {
                let revision = w.emitted.map_or(0, |r| r + 1);
                w.emitted = Some(revision);
                w.dirty = false;
                out.push((w.clone(), revision));
            }
            out
        }

        fn spec(kind: u8) -> WindowSpec {
            match kind % 3 {
                0 => WindowSpec::Tumbling { size_ms: 10_000 },
                1 => WindowSpec::Hopping {
                    size_ms: 10_000,
                    slide_ms: 5_000,
                },
                _ => WindowSpec::Session { gap_ms: 4_000 },
            }
        }

        proptest! {
            #[test]
            fn same_results_windows_and_bytes_as_a_plain_list(
                kind in 0u8..3,
                lateness in prop_oneof![Just(0i64), 1_000i64..60_000],
                base in prop_oneof![Just(0i64), Just(-1_764_000_000_000i64), Just(1_764_000_000_000i64)],
                steps in proptest::collection::vec(
                    (0i64..120_000, 0u8..4, proptest::collection::vec((0u16..40, -1e9f64..1e9), 0..4), 0i64..3_000),
                    1..150),
            ) {
                let rule = Rule { spec: spec(kind), span: Span::ALL, lateness, fresh: None };
                let mut plain: Vec<Window> = Vec::new();
                let mut packed = Windows::default();
                let mut wm = base;
                for (dt, hb, metrics, advance) in steps {
                    let t = base + dt;
                    let mut m = metrics;
                    m.sort_by_key(|x| x.0);
                    m.dedup_by_key(|x| x.0);
                    let a = apply(&mut plain, rule, t, Some(wm), hb == 0, &m);
                    let b = packed.apply(rule, t, Some(wm), hb == 0, &m);
                    prop_assert_eq!(a, b);
                    wm += advance;
                    let want = reference_emit(&mut plain, wm);
                    let mut got = Vec::new();
                    packed.emit(wm, |w, r| got.push((w.clone(), r)));
                    prop_assert_eq!(&got, &want);
                    let before = plain.len();
                    let mut gone = None;
                    plain.retain(|w| {
                        let k = wm < w.end + lateness;
                        if !k { gone = gone.max(Some(w.start)); }
                        k
                    });
                    prop_assert_eq!(packed.purge(wm, lateness), (plain.len() != before, gone));
                    prop_assert_eq!(packed.all(), plain.clone());
                    prop_assert_eq!(packed.len(), plain.len());
                    let deadline = plain.iter().map(|w| {
                        let p = w.end.saturating_add(lateness);
                        if w.dirty { w.end.min(p) } else { p }
                    }).min();
                    prop_assert_eq!(packed.deadline(lateness), deadline);
                }
                let (mut x, mut y) = (Vec::new(), Vec::new());
                ciborium::ser::into_writer(&packed, &mut x).unwrap();
                ciborium::ser::into_writer(&plain, &mut y).unwrap();
                prop_assert_eq!(&x, &y);
                let back: Windows = ciborium::de::from_reader(x.as_slice()).unwrap();
                prop_assert_eq!(back.all(), plain);
            }
        }

        #[test]
        fn extreme_values_survive_packing() {
            let mut w = Window::new(i64::MIN + 5, i64::MAX);
            w.add(
                i64::MIN + 7,
                false,
                &[(u16::MAX, f64::NAN), (0, -0.0), (3, f64::INFINITY)],
            );
            w.add(i64::MAX - 1, false, &[(3, f64::MIN_POSITIVE)]);
            w.emitted = Some(u32::MAX - 1);
            w.dirty = false;
            let mut out = Vec::new();
            Windows::pack(&w, &mut out);
            assert!(!out.is_empty());
            let back = Unpack { b: &out, i: 0 }.window();
            let bits = |w: &Window| {
                w.metrics
                    .iter()
                    .map(|(m, s)| {
                        (
                            *m,
                            s.count,
                            s.sum.to_bits(),
                            s.min.to_bits(),
                            s.max.to_bits(),
                            s.first.to_bits(),
                            s.last.to_bits(),
                            s.first_t,
                            s.last_t,
                        )
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&back), bits(&w));
            assert_eq!(
                (
                    back.start,
                    back.end,
                    back.emitted,
                    back.count,
                    back.last_event
                ),
                (w.start, w.end, w.emitted, w.count, w.last_event)
            );
        }
    }
}
