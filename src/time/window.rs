//! Event-time windows per (group, device) (docs/reference.md#group_defaults-and-groupsname), pure.

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

impl WindowSpec {
    /// A window's length; for sessions the gap.
    pub fn span_ms(self) -> Millis {
        match self {
            WindowSpec::Tumbling { size_ms } | WindowSpec::Hopping { size_ms, .. } => size_ms,
            WindowSpec::Session { gap_ms } => gap_ms,
        }
    }

    /// Starts of consecutive windows lie this far apart; None: sessions.
    pub fn step_ms(self) -> Option<Millis> {
        match self {
            WindowSpec::Tumbling { size_ms } => Some(size_ms),
            WindowSpec::Hopping { slide_ms, .. } => Some(slide_ms),
            WindowSpec::Session { .. } => None,
        }
    }
}

pub use super::metrics::{MetricIdx, Metrics, Stats};

/// A window's metrics as stored: `(index, {count, sum, min, max, first, last,
/// first_t, last_t})` pairs, the shape of the records written before the
/// aggregate was packed (records stay readable both ways).
#[derive(Serialize, Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct StatsRecord {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    first: f64,
    last: f64,
    first_t: Millis,
    last_t: Millis,
}

impl From<&Stats> for StatsRecord {
    fn from(m: &Stats) -> Self {
        Self {
            count: u64::from(m.count),
            sum: m.sum,
            min: m.min,
            max: m.max,
            first: m.first,
            last: m.last,
            first_t: m.first_t,
            last_t: m.last_t,
        }
    }
}

/// A block of aggregates ([`Metrics::as_bytes`]) as stored.
struct MetricsView<'a>(&'a [u8], Millis);

impl Serialize for MetricsView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        // A definite length, as the records written from a slice have.
        let mut seq = s.serialize_seq(Some(super::metrics::stats_in(self.0, self.1).count()))?;
        for m in super::metrics::stats_in(self.0, self.1) {
            seq.serialize_element(&(m.metric, StatsRecord::from(&m)))?;
        }
        seq.end()
    }
}

/// A window's fields as stored, from a [`Window`] or a packed one.
pub(super) struct Fields<'a> {
    pub start: Millis,
    pub end: Millis,
    /// Revision + 1; 0: never emitted.
    pub emitted: u32,
    pub dirty: bool,
    pub count: u32,
    pub heartbeats: u32,
    pub block: &'a [u8],
    pub last_event: Millis,
    pub extra: Option<&'a super::extras::WindowExtras>,
}

impl Serialize for Fields<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Window", 8 + usize::from(self.extra.is_some()))?;
        st.serialize_field("start", &self.start)?;
        st.serialize_field("end", &self.end)?;
        st.serialize_field("emitted", &self.emitted.checked_sub(1))?;
        st.serialize_field("dirty", &self.dirty)?;
        st.serialize_field("count", &u64::from(self.count))?;
        st.serialize_field("heartbeats", &u64::from(self.heartbeats))?;
        st.serialize_field("metrics", &MetricsView(self.block, self.start))?;
        st.serialize_field("last_event", &self.last_event)?;
        if let Some(x) = self.extra {
            st.serialize_field("extra", x)?;
        }
        st.end()
    }
}

/// Inserts with the capacity at most the most windows the device held at once:
/// `Vec`'s doubling (or half again) left one or two empty 64-byte slots in most
/// devices' lists, which live as long as the device. Growing by one costs a copy
/// of a few windows, and only until a device's list has its steady length.
pub(super) fn insert_tight<T>(v: &mut Vec<T>, i: usize, x: T) {
    if v.len() == v.capacity() {
        v.reserve_exact(1);
    }
    v.insert(i, x);
}

/// One open window of one device: 80 bytes, two metrics of one reading inside ([`Metrics`]; several per
/// device with short windows and lateness; BENCHMARKS 4b).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "WindowRecord")]
pub struct Window {
    /// Inclusive start.
    pub start: Millis,
    /// Exclusive end.
    pub end: Millis,
    /// Session windows: the latest event time (end = last + gap).
    pub last_event: Millis,
    /// Per-metric aggregates, sorted by metric index.
    pub metrics: Metrics,
    /// Readings (saturating).
    pub count: u32,
    /// Heartbeats (saturating).
    pub heartbeats: u32,
    /// Revision of the last emitted result + 1; 0 before the first emission.
    pub(super) emitted: u32,
    /// Changed since the last emission.
    pub dirty: bool,
    /// The group's extra aggregates' state (docs/reference.md#group_defaults-and-groupsname); None without them.
    pub extra: Option<Box<super::extras::WindowExtras>>,
}

/// A window as stored (the field order and types of the records written
/// before the window was packed).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize, Debug, PartialEq))]
struct WindowRecord {
    start: Millis,
    end: Millis,
    emitted: Option<u32>,
    dirty: bool,
    count: u64,
    heartbeats: u64,
    metrics: Vec<(MetricIdx, StatsRecord)>,
    last_event: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    extra: Option<super::extras::WindowExtras>,
}

fn sat32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl From<WindowRecord> for Window {
    fn from(r: WindowRecord) -> Self {
        let mut w = Window {
            start: r.start,
            end: r.end,
            last_event: r.last_event,
            metrics: Metrics::from_sorted(r.metrics.iter().map(|&(metric, ref s)| Stats {
                sum: s.sum,
                min: s.min,
                max: s.max,
                first: s.first,
                last: s.last,
                first_t: s.first_t,
                last_t: s.last_t,
                count: sat32(s.count),
                metric,
            })),
            count: sat32(r.count),
            heartbeats: sat32(r.heartbeats),
            emitted: 0,
            dirty: r.dirty,
            extra: r.extra.map(Box::new),
        };
        w.set_emitted(r.emitted);
        w
    }
}

impl Serialize for Window {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Fields {
            start: self.start,
            end: self.end,
            emitted: self.emitted,
            dirty: self.dirty,
            count: self.count,
            heartbeats: self.heartbeats,
            block: self.metrics.as_bytes(),
            last_event: self.last_event,
            extra: self.extra.as_deref(),
        }
        .serialize(s)
    }
}

impl Window {
    pub(super) fn new(start: Millis, end: Millis) -> Self {
        Self {
            start,
            end,
            last_event: start,
            metrics: Metrics::default(),
            count: 0,
            heartbeats: 0,
            emitted: 0,
            dirty: true,
            extra: None,
        }
    }

    /// Revision of the last emitted result; `None` before the first emission.
    pub fn emitted(&self) -> Option<u32> {
        self.emitted.checked_sub(1)
    }

    /// Records the revision last emitted.
    pub fn set_emitted(&mut self, revision: Option<u32>) {
        self.emitted = revision.map_or(0, |r| r.saturating_add(1));
    }

    /// Adds an event; `metrics` empty for a heartbeat.
    pub fn add(&mut self, t: Millis, heartbeat: bool, metrics: &[(MetricIdx, f64)]) {
        self.dirty = true;
        self.last_event = self.last_event.max(t);
        if heartbeat {
            self.heartbeats = self.heartbeats.saturating_add(1);
            return;
        }
        self.count = self.count.saturating_add(1);
        for &(m, v) in metrics {
            self.metrics.add(m, t, v);
        }
    }

    /// Adds a reading's metrics to the extra aggregates' state `extras` asks for.
    pub fn add_extra(&mut self, extras: super::extras::Extras, metrics: &[(MetricIdx, f64)]) {
        if extras.is_none() || metrics.is_empty() {
            return;
        }
        let list = self.extra.get_or_insert_with(Box::default);
        super::extras::add(list, extras, metrics);
    }

    fn absorb(&mut self, o: Window) {
        if let Some(x) = o.extra {
            let list = self.extra.get_or_insert_with(Box::default);
            super::extras::merge(list, *x);
        }
        self.start = self.start.min(o.start);
        self.end = self.end.max(o.end);
        self.last_event = self.last_event.max(o.last_event);
        // 0 is "never emitted", so the larger encoding is the later revision.
        self.emitted = self.emitted.max(o.emitted);
        self.dirty = true;
        self.count = self.count.saturating_add(o.count);
        self.heartbeats = self.heartbeats.saturating_add(o.heartbeats);
        for s in o.metrics.iter() {
            self.metrics.merge(&s);
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

/// The event-time span `[from, until)` one window rule governs (docs/reference.md#reload-sighup-systemctl-reload-tidemark: a
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
/// `old` window holding `latest` (docs/reference.md#reload-sighup-systemctl-reload-tidemark). Sessions have no boundaries.
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
    /// The group's extra aggregates.
    pub extras: super::extras::Extras,
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
        extras,
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
        if !heartbeat {
            merged.add_extra(extras, metrics);
        }
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
        if !heartbeat {
            windows[i].add_extra(extras, metrics);
        }
    }
    any
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
