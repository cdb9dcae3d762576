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
}
