//! A device's windows: those that can still change as [`Window`]s, those fired
//! and unchanged since packed into one byte buffer. With short windows and
//! lateness most of a device's windows are fired ones kept for a late reading
//! (BENCHMARKS 4b): packed, one is its aggregates' bytes and ~16 bytes of
//! header instead of an 80-byte window and a heap block of its own.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::metrics::Metrics;
use super::window::{Rule, Window, WindowSpec, apply, assign};
use crate::model::Millis;

/// Open windows sorted by start, and the fired ones packed (`Packed`). A window
/// is fired when it was emitted, is unchanged since and has no extra
/// aggregates' state; a reading that falls into it unpacks it first.
#[derive(Clone, Default)]
pub struct Windows {
    open: Vec<Window>,
    fired: Packed,
}

/// The smallest end of the entries (i64), then the entries, newest start
/// first: `start i64`, then varints `end − start`, `last_event − start`,
/// `count`, `heartbeats`, `emitted` (revision + 1), the length of the
/// aggregates' block and the block ([`Metrics::as_bytes`]). Empty: none.
#[derive(Clone, Default)]
struct Packed(Box<[u8]>);

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

fn put_varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        #[allow(clippy::cast_possible_truncation)]
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)]
    out.push(x as u8);
}

fn varint(b: &[u8], at: &mut usize) -> u64 {
    let mut x = 0u64;
    let mut shift = 0;
    loop {
        let byte = b[*at];
        *at += 1;
        x |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return x;
        }
        shift += 7;
    }
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    i64::from_le_bytes(x)
}

#[allow(clippy::cast_sign_loss)]
fn put_window(out: &mut Vec<u8>, w: &Window) {
    out.extend_from_slice(&w.start.to_le_bytes());
    put_varint(out, w.end.wrapping_sub(w.start) as u64);
    put_varint(out, w.last_event.wrapping_sub(w.start) as u64);
    put_varint(out, u64::from(w.count));
    put_varint(out, u64::from(w.heartbeats));
    put_varint(out, u64::from(w.emitted));
    let block = w.metrics.as_bytes();
    put_varint(out, block.len() as u64);
    out.extend_from_slice(block);
}

#[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
fn head(b: &[u8], at: usize) -> (Head, usize) {
    let start = i64_at(b, at);
    let mut i = at + 8;
    let end = start.wrapping_add(varint(b, &mut i) as i64);
    let last_event = start.wrapping_add(varint(b, &mut i) as i64);
    let count = varint(b, &mut i) as u32;
    let heartbeats = varint(b, &mut i) as u32;
    let emitted = varint(b, &mut i) as u32;
    let len = varint(b, &mut i) as usize;
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
        w.metrics = Metrics::from_bytes(&self.0[h.block.0..h.block.1]);
        w
    }
}

/// The buffer of `entries` (byte ranges of `src`, or packed anew), newest
/// first, headed by their smallest end.
fn build(entries: &[Entry<'_>], src: &[u8]) -> Packed {
    let Some(min_end) = entries.iter().map(|e| e.end).min() else {
        return Packed::default();
    };
    let mut out = Vec::new();
    out.extend_from_slice(&min_end.to_le_bytes());
    for e in entries {
        match e.from {
            Source::Kept(a, b) => out.extend_from_slice(&src[a..b]),
            Source::New(w) => put_window(&mut out, w),
        }
    }
    Packed(out.into_boxed_slice())
}

/// An entry of a buffer being rebuilt: its start and end, and the bytes it
/// keeps or the window packed anew.
struct Entry<'a> {
    start: Millis,
    end: Millis,
    from: Source<'a>,
}

enum Source<'a> {
    Kept(usize, usize),
    New(&'a Window),
}

impl Packed {
    /// The entries as they are, newest first, each with the header `keep` sees.
    fn entries(&self, mut keep: impl FnMut(&Head) -> bool) -> Vec<Entry<'static>> {
        self.heads()
            .filter(|(_, h)| keep(h))
            .map(|(at, h)| Entry {
                start: h.start,
                end: h.end,
                from: Source::Kept(at, h.block.1),
            })
            .collect()
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
        let mut fired: Vec<Head> = self.fired.heads().map(|(_, h)| h).collect();
        let mut open = self.open.iter().peekable();
        std::iter::from_fn(move || {
            let f = fired.last().map(|h| h.start);
            match (open.peek().map(|w| w.start), f) {
                (Some(o), Some(f)) if f < o => {
                    fired.pop().map(|h| Cow::Owned(self.fired.window(&h)))
                }
                (Some(_), _) => open.next().map(Cow::Borrowed),
                (None, Some(_)) => fired.pop().map(|h| Cow::Owned(self.fired.window(&h))),
                (None, None) => None,
            }
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

    /// Packs the open windows that are fired (after an emission).
    pub fn pack_fired(&mut self) {
        let fired = |w: &Window| w.emitted != 0 && !w.dirty && w.extra.is_none();
        if !self.open.iter().any(fired) {
            return;
        }
        let (new, open): (Vec<Window>, Vec<Window>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|w| fired(w));
        self.open = open;
        let mut entries = self.fired.entries(|_| true);
        entries.extend(new.iter().map(|w| Entry {
            start: w.start,
            end: w.end,
            from: Source::New(w),
        }));
        entries.sort_by_key(|e| std::cmp::Reverse(e.start));
        self.fired = build(&entries, &self.fired.0);
    }

    /// Unpacks the fired windows `pick(start, end)` selects into the open ones.
    fn unpack_where(&mut self, mut pick: impl FnMut(Millis, Millis) -> bool) {
        let mut taken = false;
        let entries = self.fired.entries(|h| {
            if !pick(h.start, h.end) {
                return true;
            }
            let w = self.fired.window(h);
            let i = self.open.partition_point(|o| o.start < w.start);
            self.open.insert(i, w);
            taken = true;
            false
        });
        if taken {
            self.fired = build(&entries, &self.fired.0);
        }
    }

    /// Drops the windows `keep(start, end)` rejects; whether any went.
    pub fn retain(&mut self, mut keep: impl FnMut(Millis, Millis) -> bool) -> bool {
        let before = self.open.len();
        self.open.retain(|w| keep(w.start, w.end));
        let gone = self.open.len() != before;
        let mut purged = false;
        if !self.fired.0.is_empty() {
            let kept = self.fired.entries(|h| {
                let k = keep(h.start, h.end);
                purged |= !k;
                k
            });
            if purged {
                self.fired = build(&kept, &self.fired.0);
            }
        }
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
        if let Some(newest) = self.fired.newest_start() {
            if let WindowSpec::Session { gap_ms } = rule.spec {
                let hi = t.saturating_add(gap_ms).min(rule.span.until);
                self.unpack_where(|s, e| e > t && s < hi);
            } else {
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

/// Stored as the list of windows it replaced (records stay readable both ways).
impl Serialize for Windows {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for w in self.iter() {
            seq.serialize_element(w.as_ref())?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Windows {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self::from(Vec::<Window>::deserialize(d)?))
    }
}

impl From<Vec<Window>> for Windows {
    fn from(mut open: Vec<Window>) -> Self {
        open.sort_by_key(|w| w.start);
        let mut w = Self {
            open,
            fired: Packed::default(),
        };
        w.pack_fired();
        w
    }
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
