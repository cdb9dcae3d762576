//! `tidemark replay`: the engine on a recorded capture, with a virtual clock
//! driven by the arrival times (SPEC §1). Same input, same output, byte for byte.
//!
//! In memory by default; with a state dir the durable store is used exactly
//! as the gateway uses it: state, outputs (into the outbox) and the input
//! position are committed together every `commit_interval_ms` of virtual
//! time, and an output leaves the outbox once the output file is flushed.
//! Re-running the same command after a crash resumes from the last commit.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::config::Config;
use crate::driver::Driver;
use crate::engine::{Engine, Now};
use crate::model::Millis;
use crate::output::PayloadRef;
use crate::output::SinkFormat;
use crate::store::StoreError;

mod durable;
use durable::run_durable;

/// One capture line, as `capture` writes it and `replay` reads it. Unknown
/// fields (e.g. `qos` from another recorder) are ignored.
#[derive(Debug, Serialize, Deserialize)]
pub struct Record<'a> {
    /// Gateway wall clock at arrival, epoch ms.
    #[serde(deserialize_with = "epoch_ms")]
    pub arrival: Millis,
    /// The recording gateway's monotonic clock at arrival, ms (SPEC §4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mono: Option<Millis>,
    /// Payload as JSON (its exact text is the payload, even `null` or a non-object).
    #[serde(
        borrow,
        default,
        deserialize_with = "raw_present",
        skip_serializing_if = "Option::is_none"
    )]
    pub payload: Option<&'a RawValue>,
    /// Raw payload bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_b64: Option<String>,
    /// The kernel reported the wall clock synchronized (absent: yes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced: Option<bool>,
    /// MQTT topic.
    #[serde(borrow)]
    pub topic: std::borrow::Cow<'a, str>,
}

impl<'a> Record<'a> {
    /// The record of a message that arrived at `now`: the payload as JSON when
    /// it is JSON on one line (kept byte for byte), else as base64.
    pub fn of(now: Now, topic: &'a str, payload: &'a [u8]) -> Self {
        let json = serde_json::from_slice::<&RawValue>(payload)
            .ok()
            .filter(|_| !payload.iter().any(|&b| b == b'\n' || b == b'\r'));
        Self {
            arrival: now.wall,
            mono: Some(now.mono),
            payload: json,
            payload_b64: json
                .is_none()
                .then(|| base64::engine::general_purpose::STANDARD.encode(payload)),
            synced: Some(now.synced),
            topic: std::borrow::Cow::Borrowed(topic),
        }
    }

    /// The line (without its newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The payload's bytes.
    pub fn payload_bytes(&self) -> Result<Vec<u8>, String> {
        match (&self.payload, &self.payload_b64) {
            (Some(p), None) => Ok(p.get().as_bytes().to_vec()),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| format!("payload_b64: {e}")),
            (None, None) => Err("needs \"payload\" or \"payload_b64\"".into()),
            (Some(_), Some(_)) => Err("has both \"payload\" and \"payload_b64\"".into()),
        }
    }
}

/// Maps the monotonic readings of capture lines onto one virtual monotonic
/// clock: a line without `"mono"` ticks at its arrival (as replay always did);
/// lines with it advance by their own monotonic differences, so a step of the
/// recorded wall clock shows as one; a recorder's new origin (its readings
/// going back) advances by the wall clock instead.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct VirtualMono {
    /// (arrival, its `mono`, its virtual time) of the last line.
    prev: Option<(Millis, Option<Millis>, Millis)>,
}

impl VirtualMono {
    fn map(&mut self, wall: Millis, mono: Option<Millis>) -> Millis {
        let v = match (mono, self.prev) {
            (None, _) | (Some(_), None) => wall,
            (Some(m), Some((_, Some(pm), pv))) if m >= pm => pv.saturating_add(m - pm),
            (Some(_), Some((pw, _, pv))) => pv.saturating_add(wall.saturating_sub(pw).max(0)),
        };
        self.prev = Some((wall, mono, v));
        v
    }
}

fn raw_present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

fn epoch_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Millis, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    n.as_i64()
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && f.abs() < 9e15)
                .map(|f| f.round() as i64)
        })
        .ok_or_else(|| serde::de::Error::custom(format_args!("arrival {n} is not an epoch in ms")))
}

#[derive(Serialize)]
struct Line<'a, P: Serialize> {
    topic: &'a str,
    payload: P,
    retain: bool,
}

/// Replay failures (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Reading input or writing output failed.
    #[error("{what}: {source}")]
    Io {
        /// Which file and operation.
        what: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A capture line is not a record.
    #[error("input line {line}: {source}")]
    BadRecord {
        /// 1-based line number.
        line: u64,
        /// Cause: the JSON error, or what is wrong with the record.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ReplayError {
    let what = what.into();
    move |source| ReplayError::Io { what, source }
}

/// What a replay did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Records replayed (this run).
    pub records: u64,
    /// Output lines written (this run).
    pub outputs: u64,
    /// Store commits (durable mode).
    pub commits: u64,
}

/// Largest arrival accepted in a capture (year 2255): keeps virtual-clock arithmetic in range.
const MAX_ARRIVAL: Millis = 9_000_000_000_000;

/// Reads capture lines, remembering the byte offset after each.
struct Input<R: BufRead> {
    r: R,
    line: String,
    offset: u64,
    line_no: u64,
    mono: VirtualMono,
}

impl<R: BufRead> Input<R> {
    /// The next record as (gateway clocks, topic, payload), or None at the end.
    fn next(&mut self) -> Result<Option<(Now, String, Vec<u8>)>, ReplayError> {
        loop {
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
            if !(0..=MAX_ARRIVAL).contains(&rec.arrival) {
                return Err(bad(format!(
                    "arrival {} is outside 0..={MAX_ARRIVAL}",
                    rec.arrival
                )
                .into()));
            }
            if rec.mono.is_some_and(|m| !(0..=MAX_ARRIVAL).contains(&m)) {
                return Err(bad(format!("mono is outside 0..={MAX_ARRIVAL}").into()));
            }
            let bytes = rec.payload_bytes().map_err(|e| bad(e.into()))?;
            let now = Now {
                wall: rec.arrival,
                mono: self.mono.map(rec.arrival, rec.mono),
                synced: rec.synced.unwrap_or(true),
            };
            return Ok(Some((now, rec.topic.into_owned(), bytes)));
        }
    }
}

/// One capture record: gateway clocks, topic, payload.
type Item = (Now, String, Vec<u8>);

/// Records read ahead in batches; a bad line's error follows the records before it.
fn read_ahead<R: BufRead>(
    mut input: Input<R>,
    tx: &std::sync::mpsc::SyncSender<Result<Vec<Item>, ReplayError>>,
) {
    const BATCH: usize = 1024;
    loop {
        let mut batch = Vec::with_capacity(BATCH);
        let end = loop {
            match input.next() {
                Ok(Some(item)) => {
                    batch.push(item);
                    if batch.len() == BATCH {
                        break Ok(false);
                    }
                }
                Ok(None) => break Ok(true),
                Err(e) => break Err(e),
            }
        };
        // A closed channel: the replay stopped on its own error.
        if !batch.is_empty() && tx.send(Ok(batch)).is_err() {
            return;
        }
        match end {
            Ok(false) => {}
            Ok(true) => return,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

/// Options of one replay.
pub struct Options<'a> {
    /// Capture file.
    pub input: &'a Path,
    /// Output file (appended to in durable mode); standard output when None.
    pub output: Option<&'a Path>,
    /// Virtual time to keep ticking past the last record.
    pub drain_ms: Millis,
    /// Durable state directory.
    pub state_dir: Option<&'a Path>,
    /// At the end, emit every open window (a final watermark at +∞).
    pub flush: bool,
}

/// Runs a replay per `opts`.
pub fn run(cfg: &Config, opts: &Options<'_>) -> Result<(Engine, Summary), ReplayError> {
    let file = File::open(opts.input).map_err(io(format!("opening {}", opts.input.display())))?;
    match opts.state_dir {
        None => {
            let out: Box<dyn Write> = match opts.output {
                None => Box::new(std::io::stdout().lock()),
                Some(p) => {
                    Box::new(File::create(p).map_err(io(format!("creating {}", p.display())))?)
                }
            };
            run_memory_with(
                cfg,
                BufReader::new(file),
                std::io::BufWriter::new(out),
                opts.drain_ms,
                opts.flush,
            )
        }
        Some(dir) => run_durable(cfg, file, opts.output, dir, opts.drain_ms, opts.flush),
    }
}

/// In-memory replay into any writer.
pub fn run_memory<R: BufRead + Send, W: Write>(
    cfg: &Config,
    input: R,
    out: W,
    drain_ms: Millis,
) -> Result<(Engine, Summary), ReplayError> {
    run_memory_with(cfg, input, out, drain_ms, false)
}

/// In-memory replay; `flush` emits every open window at the end.
pub fn run_memory_with<R: BufRead + Send, W: Write>(
    cfg: &Config,
    input: R,
    mut out: W,
    drain_ms: Millis,
    flush: bool,
) -> Result<(Engine, Summary), ReplayError> {
    let mut rp = Driver::new(Engine::new(&cfg.engine()), cfg, SinkFormat::Json, None);
    let input = Input {
        r: input,
        line: String::new(),
        offset: 0,
        line_no: 0,
        mono: VirtualMono::default(),
    };
    let mut summary = Summary::default();
    let mut last: Option<Now> = None;
    let mut line = Vec::new();
    let mut write = |rp: &mut Driver, summary: &mut Summary| -> Result<(), ReplayError> {
        for o in rp.outputs.drain(..) {
            line.clear();
            let topic = o.topic(&cfg.topic_prefix);
            serde_json::to_writer(
                &mut line,
                &Line {
                    topic: &topic,
                    payload: PayloadRef::from(&o),
                    retain: o.retain(),
                },
            )
            .map_err(|e| io("rendering output")(e.into()))?;
            line.push(b'\n');
            out.write_all(&line).map_err(io("writing output"))?;
            summary.outputs += 1;
        }
        Ok(())
    };
    std::thread::scope(|s| {
        // The capture is read and parsed a batch ahead on a second thread (a fifth of
        // replay's work); records and a bad line's error arrive in input order.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Item>, ReplayError>>(4);
        s.spawn(move || read_ahead(input, &tx));
        for batch in rx {
            for (now, topic, payload) in batch? {
                rp.message(now, &topic, &payload);
                // Replay has no site broker to ask for rebirths.
                rp.engine_mut().take_commands();
                summary.records += 1;
                last = Some(last.map_or(now, |l| Now {
                    wall: l.wall.max(now.wall),
                    mono: l.mono.max(now.mono),
                    synced: now.synced,
                }));
                write(&mut rp, &mut summary)?;
            }
        }
        Ok::<(), ReplayError>(())
    })?;
    if let Some(last) = last {
        rp.ticks_until(Now {
            wall: last.wall.saturating_add(drain_ms),
            mono: last.mono.saturating_add(drain_ms),
            synced: last.synced,
        });
        if flush {
            rp.flush();
        }
        write(&mut rp, &mut summary)?;
    }
    out.flush().map_err(io("writing output"))?;
    Ok((rp.into_engine(), summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_line_gives_back_the_exact_payload_bytes() {
        let now = Now {
            wall: 1_764_480_000_123,
            mono: 42,
            synced: false,
        };
        let cases: [&[u8]; 5] = [
            br#"{"ts": 1764480000000,  "temp": 21.50}"#,
            b"{\"ts\": 1,\n \"temp\": 2}",
            b"null",
            &[0x08, 0x00, 0xff, 0x10],
            b"",
        ];
        for payload in cases {
            let line = Record::of(now, "spBv1.0/g/DDATA/n/d", payload).to_line();
            assert!(!line.contains('\n'), "{line}");
            let back: Record<'_> = serde_json::from_str(&line).expect(&line);
            assert_eq!(back.payload_bytes().unwrap(), payload, "{line}");
            assert_eq!(
                (back.arrival, back.mono, back.synced, back.topic.as_ref()),
                (now.wall, Some(42), Some(false), "spBv1.0/g/DDATA/n/d")
            );
        }
    }
}
