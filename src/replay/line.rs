//! A capture line as `capture` writes it (compact, a JSON object payload) read
//! in one pass, its payload decoded on the way. Any other shape gives `None`
//! and the line goes the serde path, which reads the same record.

use std::io::BufRead;
use std::ops::Range;

use super::{Record, ReplayError, VirtualMono, io};
use crate::codec::{Decoded, Decoder};
use crate::engine::Now;
use crate::model::Millis;

/// What one pass found.
pub(super) struct Scanned {
    pub arrival: Millis,
    pub mono: Option<Millis>,
    pub synced: Option<bool>,
    pub topic: Range<usize>,
    pub payload: Range<usize>,
}

/// Reads `line`, its payload into `out` as `decoder` would decode the payload's bytes.
pub(super) fn scan(text: &str, decoder: &Decoder, out: &mut Decoded) -> Option<Scanned> {
    let line = text.as_bytes();
    let (mut arrival, mut mono, mut synced) = (None, None, None);
    let (mut topic, mut payload) = (None, None);
    let mut at = 1;
    if line.first() != Some(&b'{') {
        return None;
    }
    loop {
        let (key, next) = key(line, at)?;
        at = next;
        match key {
            b"arrival" if arrival.is_none() => {
                (arrival, at) = int(line, at).map(|(v, a)| (Some(v), a))?
            }
            b"mono" if mono.is_none() => (mono, at) = int(line, at).map(|(v, a)| (Some(v), a))?,
            b"synced" if synced.is_none() => {
                (synced, at) = if line[at..].starts_with(b"true") {
                    (Some(true), at + 4)
                } else if line[at..].starts_with(b"false") {
                    (Some(false), at + 5)
                } else {
                    return None;
                };
            }
            b"topic" if topic.is_none() => {
                if line.get(at) != Some(&b'"') {
                    return None;
                }
                let end = at + 1 + crate::scan::plain_run(&line[at + 1..]);
                if line.get(end) != Some(&b'"') {
                    return None;
                }
                topic = Some(at + 1..end);
                at = end + 1;
            }
            b"payload" if payload.is_none() => {
                let n = decoder.decode_json_prefix(text.get(at..)?, out)?;
                payload = Some(at..at + n);
                at += n;
            }
            _ => return None,
        }
        match line.get(at) {
            Some(b',') => at += 1,
            Some(b'}') => break,
            _ => return None,
        }
    }
    if !line[at + 1..].iter().all(|&c| c == b'\n' || c == b'\r') {
        return None;
    }
    Some(Scanned {
        arrival: arrival?,
        mono,
        synced,
        topic: topic?,
        payload: payload?,
    })
}

/// `"name":` at `at`: the name and the offset after the colon.
fn key(line: &[u8], at: usize) -> Option<(&[u8], usize)> {
    if line.get(at) != Some(&b'"') {
        return None;
    }
    // The names `capture` writes, told apart by their first letter.
    let known: &[u8] = match line.get(at + 1)? {
        b'a' => b"arrival\":",
        b't' => b"topic\":",
        b'p' => b"payload\":",
        b'm' => b"mono\":",
        b's' => b"synced\":",
        _ => b"",
    };
    if !known.is_empty() && line[at + 1..].starts_with(known) {
        let end = at + known.len() - 1;
        return Some((&line[at + 1..end], end + 2));
    }
    let end = at + 1 + line[at + 1..].iter().position(|&c| c == b'"')?;
    (line.get(end + 1) == Some(&b':')).then(|| (&line[at + 1..end], end + 2))
}

/// An integer of at most 18 digits (others go the serde path).
fn int(line: &[u8], mut at: usize) -> Option<(Millis, usize)> {
    let neg = line.get(at) == Some(&b'-');
    if neg {
        at += 1;
    }
    let start = at;
    let mut v: Millis = 0;
    while let Some(e) = line.get(at..at + 8).and_then(crate::codec::eight_digits) {
        if at - start + 8 > 18 {
            break;
        }
        v = v * 100_000_000 + Millis::try_from(e).ok()?;
        at += 8;
    }
    while let Some(d @ b'0'..=b'9') = line.get(at) {
        if at - start == 18 {
            return None;
        }
        v = v * 10 + Millis::from(d - b'0');
        at += 1;
    }
    let n = at - start;
    // "-0" is a float to serde_json.
    if (neg && v == 0)
        || n == 0
        || (n > 1 && line[start] == b'0')
        || matches!(line.get(at), Some(b'.' | b'e' | b'E'))
    {
        return None;
    }
    Some((if neg { -v } else { v }, at))
}

/// Largest arrival accepted in a capture (year 2255): keeps virtual-clock arithmetic in range.
const MAX_ARRIVAL: Millis = 9_000_000_000_000;

/// Reads capture lines, remembering the byte offset after each.
pub(super) struct Input<R: BufRead> {
    pub(super) r: R,
    pub(super) line: String,
    pub(super) offset: u64,
    pub(super) line_no: u64,
    pub(super) mono: VirtualMono,
}

impl<R: BufRead> Input<R> {
    /// A capture read from its start.
    pub(super) fn new(r: R) -> Self {
        Self {
            r,
            line: String::new(),
            offset: 0,
            line_no: 0,
            mono: VirtualMono::default(),
        }
    }

    /// The next record's gateway clocks, its topic and payload appended to
    /// `topics` and `payloads`; None at the end.
    pub(super) fn next_into(
        &mut self,
        topics: &mut String,
        payloads: &mut Vec<u8>,
    ) -> Result<Option<Now>, ReplayError> {
        Ok(self.next_line(topics, payloads, None)?.map(|(now, _)| now))
    }

    /// [`Input::next_into`]; with a decoder, a line as `capture` writes it is read in
    /// one pass, its payload decoded into the scratch value (then true).
    pub(super) fn next_line(
        &mut self,
        topics: &mut String,
        payloads: &mut Vec<u8>,
        mut decode: Option<(&Decoder, &mut Decoded)>,
    ) -> Result<Option<(Now, bool)>, ReplayError> {
        loop {
            if let Some((decoder, out)) = decode.as_mut()
                && let Some(now) = self.in_buffer(topics, payloads, decoder, out)?
            {
                return Ok(Some((now, true)));
            }
            self.line.clear();
            let n = self
                .r
                .read_line(&mut self.line)
                .map_err(io("reading input"))?;
            if n == 0 {
                return Ok(None);
            }
            self.offset += n as u64;
            self.line_no += 1;
            if self.line.trim().is_empty() {
                continue;
            }
            if let Some((decoder, out)) = decode
                && let Some(f) = scan(&self.line, decoder, out)
            {
                let now = clocks(&mut self.mono, self.line_no, f.arrival, f.mono, f.synced)?;
                payloads.extend_from_slice(&self.line.as_bytes()[f.payload]);
                topics.push_str(&self.line[f.topic]);
                return Ok(Some((now, true)));
            }
            let line = self.line_no;
            let bad = |source: Box<dyn std::error::Error + Send + Sync>| ReplayError::BadRecord {
                line,
                source,
            };
            let rec: Record<'_> = match serde_json::from_str(&self.line) {
                Ok(r) => r,
                // A capture killed mid-write: its last line has no newline. Report and skip it.
                Err(e) if !self.line.ends_with('\n') => {
                    tracing::warn!(line = self.line_no, error = %e, "skipping a torn last line");
                    return Ok(None);
                }
                Err(e) => return Err(bad(e.into())),
            };
            let now = clocks(
                &mut self.mono,
                self.line_no,
                rec.arrival,
                rec.mono,
                rec.synced,
            )?;
            let start = payloads.len();
            if let Err(e) = rec.payload_into(payloads) {
                payloads.truncate(start);
                return Err(bad(e.into()));
            }
            topics.push_str(&rec.topic);
            return Ok(Some((now, false)));
        }
    }
}

impl<R: BufRead> Input<R> {
    /// The next line read where it lies in the read buffer, when all of it is there
    /// (nearly always) and it is one [`scan`] reads; else None and nothing consumed.
    /// Saves the copy into `line` and its UTF-8 check, both in the profile.
    fn in_buffer(
        &mut self,
        topics: &mut String,
        payloads: &mut Vec<u8>,
        decoder: &Decoder,
        out: &mut Decoded,
    ) -> Result<Option<Now>, ReplayError> {
        let buf = self.r.fill_buf().map_err(io("reading input"))?;
        let Some(end) = memchr::memchr(b'\n', buf) else {
            return Ok(None);
        };
        // A line read_line would refuse as UTF-8 goes its way, for the same error.
        let Ok(line) = std::str::from_utf8(&buf[..=end]) else {
            return Ok(None);
        };
        let Some(f) = scan(line, decoder, out) else {
            return Ok(None);
        };
        // Between quotes: whole characters.
        let Some(topic) = line.get(f.topic) else {
            return Ok(None);
        };
        let now = clocks(
            &mut self.mono,
            self.line_no + 1,
            f.arrival,
            f.mono,
            f.synced,
        )?;
        payloads.extend_from_slice(&line.as_bytes()[f.payload]);
        topics.push_str(topic);
        let n = line.len();
        self.line_no += 1;
        self.offset += n as u64;
        self.r.consume(n);
        Ok(Some(now))
    }
}

/// The line's gateway clocks, checked.
fn clocks(
    virt: &mut VirtualMono,
    line: u64,
    arrival: Millis,
    mono: Option<Millis>,
    synced: Option<bool>,
) -> Result<Now, ReplayError> {
    let bad = |what: String| ReplayError::BadRecord {
        line,
        source: what.into(),
    };
    if !(0..=MAX_ARRIVAL).contains(&arrival) {
        return Err(bad(format!(
            "arrival {arrival} is outside 0..={MAX_ARRIVAL}"
        )));
    }
    if mono.is_some_and(|m| !(0..=MAX_ARRIVAL).contains(&m)) {
        return Err(bad(format!("mono is outside 0..={MAX_ARRIVAL}")));
    }
    Ok(Now {
        wall: arrival,
        mono: virt.map(arrival, mono),
        synced: synced.unwrap_or(true),
    })
}
