//! A device's windows: those that can still change as [`Window`]s, those fired
//! and unchanged since packed into one byte buffer. With short windows and
//! lateness most of a device's windows are fired ones kept for a late reading
//! (BENCHMARKS 4b): packed, one is its aggregates' bytes and ~16 bytes of
//! header instead of an 80-byte window and a heap block of its own.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::metrics::Metrics;
use super::varint;
use super::window::{Fields, Rule, Window, WindowSpec, apply, assign, insert_tight};
use crate::model::Millis;

/// Open windows sorted by start, and the fired ones packed (`Packed`). A window
/// is fired when it was emitted, is unchanged since and has no extra
/// aggregates' state; it is packed at the device's next event (or on restore),
/// and a reading that falls into it unpacks it first.
#[derive(Clone, Default)]
pub struct Windows {
    open: Vec<Window>,
    fired: Packed,
}

/// The smallest end of the entries (i64), then the entries, newest start
/// first: `start i64`, then varints `end − start`, `last_event − start`,
/// `count`, `heartbeats`, `emitted` (revision + 1), the length of the
/// aggregates' block and the block ([`Metrics::packed_into`]). Empty: none.
#[derive(Clone, Default)]
struct Packed(Vec<u8>);

/// An entry's header and where its block and the next entry are.
#[derive(Clone, Copy)]
struct Head {
    start: Millis,
    end: Millis,
    last_event: Millis,
    count: u32,
    heartbeats: u32,
    emitted: u32,
    block: (usize, usize),
}

const MIN_END: usize = 8;

fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    i64::from_le_bytes(x)
}

#[allow(clippy::cast_sign_loss)]
fn put_window(out: &mut Vec<u8>, w: &Window) {
    out.extend_from_slice(&w.start.to_le_bytes());
    varint::put(out, w.end.wrapping_sub(w.start) as u64);
    varint::put(out, w.last_event.wrapping_sub(w.start) as u64);
    varint::put(out, u64::from(w.count));
    varint::put(out, u64::from(w.heartbeats));
    varint::put(out, u64::from(w.emitted));
    varint::put(out, w.metrics.packed_into(w.start, None) as u64);
    w.metrics.packed_into(w.start, Some(out));
}

#[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
fn head(b: &[u8], at: usize) -> (Head, usize) {
    let start = i64_at(b, at);
    let mut i = at + 8;
    let end = start.wrapping_add(varint::read(b, &mut i) as i64);
    let last_event = start.wrapping_add(varint::read(b, &mut i) as i64);
    let count = varint::read(b, &mut i) as u32;
    let heartbeats = varint::read(b, &mut i) as u32;
    let emitted = varint::read(b, &mut i) as u32;
    let len = varint::read(b, &mut i) as usize;
    let h = Head {
        start,
        end,
        last_event,
        count,
        heartbeats,
        emitted,
        block: (i, i + len),
    };
    (h, i + len)
}

impl Packed {
    /// `(offset, header)` of each entry, newest start first.
    fn heads(&self) -> impl Iterator<Item = (usize, Head)> + '_ {
        let b = &self.0;
        let mut at = MIN_END.min(b.len());
        std::iter::from_fn(move || {
            if at >= b.len() {
                return None;
            }
            let (h, next) = head(b, at);
            let this = at;
            at = next;
            Some((this, h))
        })
    }

    fn min_end(&self) -> Option<Millis> {
        (!self.0.is_empty()).then(|| i64_at(&self.0, 0))
    }

    fn newest_start(&self) -> Option<Millis> {
        (!self.0.is_empty()).then(|| i64_at(&self.0, MIN_END))
    }

    fn window(&self, h: &Head) -> Window {
        let mut w = Window::new(h.start, h.end);
        w.last_event = h.last_event;
        w.count = h.count;
        w.heartbeats = h.heartbeats;
        w.emitted = h.emitted;
        w.dirty = false;
        w.metrics = Metrics::from_bytes(&self.0[h.block.0..h.block.1], h.start);
        w
    }
}

#[allow(clippy::cast_sign_loss)]
fn packed_len(w: &Window) -> usize {
    let block = w.metrics.packed_into(w.start, None);
    8 + [
        w.end.wrapping_sub(w.start) as u64,
        w.last_event.wrapping_sub(w.start) as u64,
        u64::from(w.count),
        u64::from(w.heartbeats),
        u64::from(w.emitted),
        block as u64,
    ]
    .into_iter()
    .map(varint::len)
    .sum::<usize>()
        + block
}

impl Packed {
    /// Adds a window in start order. When the buffer grows it makes room for
    /// `room` entries like this one: a device's buffer is allocated once, and
    /// keeps its room when entries go, a next fired window taking a purged
    /// one's place (buffers grown one entry at a time left holes that other
    /// allocations could not use, BENCHMARKS 4b).
    fn insert(&mut self, w: &Window, room: usize) {
        let n = packed_len(w);
        if self.0.is_empty() {
            self.0.reserve_exact(MIN_END + n * room.max(1));
            self.0.extend_from_slice(&w.end.to_le_bytes());
        } else if self.0.capacity() < self.0.len() + n {
            let count = self.heads().count();
            self.0.reserve_exact(n * room.saturating_sub(count).max(1));
        }
        let at = self
            .heads()
            .find(|(_, h)| h.start < w.start)
            .map_or(self.0.len(), |(at, _)| at);
        let min_end = self.min_end().map_or(w.end, |e| e.min(w.end));
        put_window(&mut self.0, w);
        self.0[at..].rotate_right(n);
        self.0[..MIN_END].copy_from_slice(&min_end.to_le_bytes());
    }

    /// Drops the entries `gone` selects.
    fn remove_where(&mut self, mut gone: impl FnMut(&Head) -> bool) -> bool {
        let (mut any, mut min_end) = (false, None::<Millis>);
        let mut at = MIN_END;
        while at < self.0.len() {
            let (h, next) = head(&self.0, at);
            if gone(&h) {
                self.0.drain(at..next);
                any = true;
            } else {
                min_end = Some(min_end.map_or(h.end, |e| e.min(h.end)));
                at = next;
            }
        }
        if any {
            match min_end {
                Some(e) => self.0[..MIN_END].copy_from_slice(&e.to_le_bytes()),
                None => self.0 = Vec::new(),
            }
        }
        any
    }
}

impl Windows {
    /// Number of windows, open and fired.
    pub fn len(&self) -> usize {
        self.open.len() + self.fired.heads().count()
    }

    /// No window.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.fired.0.is_empty()
    }

    /// Every window, oldest start first (fired ones unpacked).
    pub fn iter(&self) -> impl Iterator<Item = Cow<'_, Window>> + '_ {
        self.ordered().map(|s| match s {
            Slot::Open(w) => Cow::Borrowed(w),
            Slot::Fired(h) => Cow::Owned(self.fired.window(&h)),
        })
    }

    /// Every window, oldest start first, as held (no allocation with up to 32
    /// fired ones: stored records are written from here).
    fn ordered(&self) -> impl Iterator<Item = Slot<'_>> + '_ {
        let mut fired = Offsets::Few(heapless::Vec::new());
        for (at, _) in self.fired.heads() {
            let at = offset(at);
            if let Offsets::Few(few) = &mut fired
                && few.push(at).is_err()
            {
                fired = Offsets::Many(self.fired.heads().map(|(at, _)| offset(at)).collect());
                break;
            }
        }
        let b = &self.fired.0;
        let mut next = fired.pop().map(|at| head(b, at as usize).0);
        let mut open = self.open.iter().peekable();
        std::iter::from_fn(move || match (open.peek(), next) {
            (Some(o), Some(h)) if h.start >= o.start => open.next().map(Slot::Open),
            (_, Some(h)) => {
                next = fired.pop().map(|at| head(b, at as usize).0);
                Some(Slot::Fired(h))
            }
            (Some(_), None) => open.next().map(Slot::Open),
            (None, None) => None,
        })
    }

    /// The windows that may still change (emission visits their dirty ones).
    pub fn open_mut(&mut self) -> &mut Vec<Window> {
        &mut self.open
    }

    /// The smallest start of any window.
    pub fn first_start(&self) -> Option<Millis> {
        let fired = self.fired.heads().map(|(_, h)| h.start).last();
        match (self.open.first().map(|w| w.start), fired) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The watermark at which a window next needs a visit: a changed one's end,
    /// else its end + `lateness` (its purge).
    pub fn deadline(&self, lateness: Millis) -> Option<Millis> {
        let open = self.open.iter().map(|w| {
            let purge = w.end.saturating_add(lateness);
            if w.dirty { w.end.min(purge) } else { purge }
        });
        let fired = self.fired.min_end().map(|e| e.saturating_add(lateness));
        open.chain(fired).min()
    }

    /// Packs the open windows that are fired; `room`: how many fired windows
    /// the device keeps at once, as far as known.
    pub fn pack_fired(&mut self, room: usize) {
        for w in self.open.extract_if(.., |w| is_fired(w)) {
            self.fired.insert(&w, room);
        }
    }

    /// Unpacks the fired windows `pick(start, end)` selects into the open ones.
    fn unpack_where(&mut self, mut pick: impl FnMut(Millis, Millis) -> bool) {
        let open = &mut self.open;
        let fired = &self.fired;
        let mut taken = false;
        for (_, h) in fired.heads() {
            if pick(h.start, h.end) {
                let w = fired.window(&h);
                let i = open.partition_point(|o| o.start < w.start);
                insert_tight(open, i, w);
                taken = true;
            }
        }
        if taken {
            self.fired.remove_where(|h| pick(h.start, h.end));
        }
    }

    /// Drops the windows `keep(start, end)` rejects; whether any went.
    pub fn retain(&mut self, mut keep: impl FnMut(Millis, Millis) -> bool) -> bool {
        let before = self.open.len();
        self.open.retain(|w| keep(w.start, w.end));
        let gone = self.open.len() != before;
        let purged = self.fired.remove_where(|h| !keep(h.start, h.end));
        gone || purged
    }

    /// Adds an event (`window::apply`), unpacking the fired windows it falls into first.
    pub fn apply(
        &mut self,
        rule: Rule,
        t: Millis,
        wm: Option<Millis>,
        heartbeat: bool,
        metrics: &[(super::window::MetricIdx, f64)],
    ) -> bool {
        // Windows fired since the device's last event are packed now, not in the
        // close burst that fired them: an allocation there (a buffer's first, or
        // one grown) sits among the burst's results and keeps their pages
        // resident after they are freed (BENCHMARKS 4b). Before the event is
        // taken: a device that gets the next window's first reading while the
        // last fired one is still open would otherwise hold three windows' room.
        if self.open.iter().any(is_fired) {
            self.pack_fired(room(rule));
        }
        if let Some(newest) = self.fired.newest_start() {
            if let WindowSpec::Session { gap_ms } = rule.spec {
                let hi = t.saturating_add(gap_ms).min(rule.span.until);
                self.unpack_where(|s, e| e > t && s < hi);
            } else if t.saturating_sub(rule.spec.span_ms()) < newest {
                // Fired windows start at or before `newest` and are at most
                // `size` long: an event later than that is in none of them.
                let mut ws = heapless::Vec::new();
                assign(rule.spec, t, &mut ws);
                if ws.iter().any(|&(s, _)| s <= newest) {
                    self.unpack_where(|s, _| ws.iter().any(|&(a, _)| a == s));
                }
            }
        }
        apply(&mut self.open, rule, t, wm, heartbeat, metrics)
    }
}

impl Windows {
    /// The open windows' memory fetched into the cache ahead of a reading.
    pub fn prefetch(&self) {
        for w in self.open.iter().take(2) {
            crate::hint::prefetch(w);
        }
        // The fired ones' head: every reading reads the newest start.
        let fired = &self.fired.0;
        crate::hint::prefetch(&fired[..fired.len().min(32)]);
    }

    /// Their metric blocks, once the windows themselves are in the cache.
    pub fn prefetch_blocks(&self) {
        for w in self.open.iter().take(2) {
            w.metrics.prefetch();
        }
    }
}

/// How many fired windows a device keeps at once under `rule`: lateness / step.
fn room(rule: Rule) -> usize {
    let Some(step) = rule.spec.step_ms() else {
        return 1;
    };
    let step = step.max(1);
    usize::try_from(rule.lateness.saturating_add(step - 1) / step).map_or(1, |k| k.min(MAX_ROOM))
}

/// Room made at most, in entries: a stored list's claimed length does not size
/// an allocation (a damaged record is an error of its own, not an abort).
const MAX_ROOM: usize = 64;

/// A window as held: open, or the header of a packed one.
enum Slot<'a> {
    Open(&'a Window),
    Fired(Head),
}

/// Offsets of packed entries, oldest last.
enum Offsets {
    Few(heapless::Vec<u32, 32>),
    Many(Vec<u32>),
}

/// A buffer of more than 4 GiB is not made: a device's windows are bounded.
fn offset(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}

impl Offsets {
    fn pop(&mut self) -> Option<u32> {
        match self {
            Offsets::Few(v) => v.pop(),
            Offsets::Many(v) => v.pop(),
        }
    }
}

/// Stored as the list of windows it replaced (records stay readable both ways).
impl Serialize for Windows {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for slot in self.ordered() {
            match slot {
                Slot::Open(w) => seq.serialize_element(w)?,
                Slot::Fired(h) => seq.serialize_element(&Fields {
                    start: h.start,
                    end: h.end,
                    emitted: h.emitted,
                    dirty: false,
                    count: h.count,
                    heartbeats: h.heartbeats,
                    block: &self.fired.0[h.block.0..h.block.1],
                    last_event: h.last_event,
                    extra: None,
                })?,
            }
        }
        seq.end()
    }
}

/// Restored as read: a fired window goes into the buffer, sized for the stored
/// list, without a list of every window first (restart time, BENCHMARKS 4b).
impl<'de> Deserialize<'de> for Windows {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Seq;
        impl<'de> serde::de::Visitor<'de> for Seq {
            type Value = Windows;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of windows")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Windows, A::Error> {
                // Stored lists end with the open window(s): one fewer is the fired ones' room.
                let room = a
                    .size_hint()
                    .unwrap_or(2)
                    .saturating_sub(1)
                    .clamp(1, MAX_ROOM);
                let mut w = Windows::default();
                while let Some(x) = a.next_element::<Window>()? {
                    if is_fired(&x) {
                        w.fired.insert(&x, room);
                    } else {
                        let i = w.open.partition_point(|o| o.start <= x.start);
                        insert_tight(&mut w.open, i, x);
                    }
                }
                Ok(w)
            }
        }
        d.deserialize_seq(Seq)
    }
}

fn is_fired(w: &Window) -> bool {
    w.emitted != 0 && !w.dirty && w.extra.is_none()
}

/// The same windows, wherever each is held.
impl PartialEq for Windows {
    fn eq(&self, o: &Self) -> bool {
        self.len() == o.len() && self.iter().zip(o.iter()).all(|(a, b)| a == b)
    }
}

impl std::fmt::Debug for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
#[path = "windows_tests.rs"]
mod tests;
