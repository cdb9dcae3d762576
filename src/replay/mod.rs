//! `tidemark replay`: the engine on a recorded capture, with a virtual clock
//! driven by the arrival times (docs/reference.md#command-line). Same input, same output, byte for byte.
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

use crate::codec::{DecodeError, Decoded, Decoder, DeviceTs, MetricName};
use crate::config::Config;
use crate::driver::Driver;
use crate::engine::{Engine, Known, Now};
use crate::model::Millis;
use crate::output::{Output, json};
use crate::store::StoreError;

mod durable;
mod line;
use durable::run_durable;
use line::Input;

/// One capture line, as `capture` writes it and `replay` reads it. Unknown
/// fields (e.g. `qos` from another recorder) are ignored.
#[derive(Debug, Serialize, Deserialize)]
pub struct Record<'a> {
    /// Gateway wall clock at arrival, epoch ms.
    #[serde(deserialize_with = "epoch_ms")]
    pub arrival: Millis,
    /// The recording gateway's monotonic clock at arrival, ms (docs/reference.md#time).
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

    /// Appends the payload's bytes to `buf`.
    pub fn payload_into(&self, buf: &mut Vec<u8>) -> Result<(), String> {
        match (&self.payload, &self.payload_b64) {
            (Some(p), None) => {
                buf.extend_from_slice(p.get().as_bytes());
                Ok(())
            }
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode_vec(b, buf)
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

/// One output line, `{"topic":…,"payload":…,"retain":…[,"at":…]}` and its newline,
/// as serde writes the fields (crate::output::json); `payload` writes the payload.
/// `at`: the output's virtual time (`--timed`), the arrival of the record it came
/// with or the end of the drain.
fn line_into(
    line: &mut Vec<u8>,
    topic: &str,
    payload: impl FnOnce(&mut Vec<u8>),
    retain: bool,
    at: Option<Millis>,
) {
    line.extend_from_slice(b"{\"topic\":");
    json::str_into(line, topic);
    line.extend_from_slice(b",\"payload\":");
    payload(line);
    line.extend_from_slice(if retain {
        b",\"retain\":true"
    } else {
        b",\"retain\":false"
    });
    if let Some(at) = at {
        line.extend_from_slice(b",\"at\":");
        json::int_into(line, at);
    }
    line.extend_from_slice(b"}\n");
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

/// The error of a failed `what`; a `&'static str` is copied only on failure (reads and
/// writes of every line build one).
fn io<W: Into<String>>(what: W) -> impl FnOnce(std::io::Error) -> ReplayError {
    move |source| ReplayError::Io {
        what: what.into(),
        source,
    }
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

/// Capture records read ahead: topics and payloads each in one buffer (no
/// allocation per record), payloads decoded with the engine's decoder.
#[derive(Default)]
struct Batch {
    topics: String,
    payloads: Vec<u8>,
    metrics: Vec<(MetricName, f64)>,
    items: Vec<Ahead>,
}

/// One record of a [`Batch`]; its parts end where the next one's begin.
struct Ahead {
    now: Now,
    topic_end: usize,
    payload_end: usize,
    /// None: left to the engine (a Sparkplug topic).
    decoded: Option<Result<Lite, DecodeError>>,
}

/// A decoded payload whose metrics are in the batch's list.
struct Lite {
    ts: DeviceTs,
    seq: Option<u64>,
    metrics_end: usize,
}

impl Batch {
    fn clear(&mut self) {
        self.topics.clear();
        self.payloads.clear();
        self.metrics.clear();
        self.items.clear();
    }

    /// Reads the next record into the batch; false at the end of the input.
    fn read<R: BufRead>(
        &mut self,
        input: &mut Input<R>,
        decoder: &Decoder,
        scratch: &mut Decoded,
    ) -> Result<bool, ReplayError> {
        let (topic_start, payload_start) = (self.topics.len(), self.payloads.len());
        let Some((now, done)) = input.next_line(
            &mut self.topics,
            &mut self.payloads,
            Some((decoder, &mut *scratch)),
        )?
        else {
            return Ok(false);
        };
        let topic = &self.topics[topic_start..];
        let decoded = (!crate::sparkplug::is_sparkplug(topic)).then(|| {
            if done {
                Ok(())
            } else {
                decoder.decode_into(&self.payloads[payload_start..], scratch)
            }
            .map(|()| {
                self.metrics.extend(scratch.metrics.iter().cloned());
                Lite {
                    ts: scratch.ts,
                    seq: scratch.seq,
                    metrics_end: self.metrics.len(),
                }
            })
        });
        self.items.push(Ahead {
            now,
            topic_end: self.topics.len(),
            payload_end: self.payloads.len(),
            decoded,
        });
        Ok(true)
    }
}

/// Records read ahead in batches; a bad line's error follows the records before it.
/// Batches the engine is done with come back on `free`.
fn read_ahead<R: BufRead>(
    mut input: Input<R>,
    decoder: &Decoder,
    tx: &std::sync::mpsc::SyncSender<Result<Batch, ReplayError>>,
    free: &std::sync::mpsc::Receiver<Batch>,
) {
    // Batches of 4 096: fewer hand-overs between the threads, each a wake-up.
    const BATCH: usize = 4096;
    let mut scratch = Decoded::default();
    loop {
        let mut batch = free.try_recv().unwrap_or_default();
        batch.clear();
        let end = loop {
            match batch.read(&mut input, decoder, &mut scratch) {
                Ok(true) if batch.items.len() == BATCH => break Ok(false),
                Ok(true) => {}
                Ok(false) => break Ok(true),
                Err(e) => break Err(e),
            }
        };
        // A closed channel: the replay stopped on its own error.
        if !batch.items.is_empty() && tx.send(Ok(batch)).is_err() {
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

/// The devices of a batch's next records fetched into the cache, one step of the
/// chain (slot, its windows, their blocks) a record: the first touch of each was
/// a quarter of replay's CPU time. Hints only (the engine checks a slot before it
/// uses it): no output changes.
#[derive(Default)]
struct LookAhead([Option<u32>; 4]);

impl LookAhead {
    /// Record `j`'s slot as [`LookAhead::step`] found it three records before.
    fn slot(&self, j: usize) -> Option<u32> {
        self.0[j % 4].filter(|_| j >= 3)
    }

    /// Before record `j`: the slot of `j + 3`, the windows of `j + 2`, the blocks of `j + 1`.
    fn step(&mut self, e: &Engine, batch: &Batch, j: usize) {
        let n = batch.items.len();
        if j + 3 < n {
            let start = batch.items[j + 2].topic_end;
            let topic = &batch.topics[start..batch.items[j + 3].topic_end];
            self.0[(j + 3) % 4] = e.prefetch_slot(topic);
        }
        if let Some(i) = self.0[(j + 2) % 4].filter(|_| j >= 1 && j + 2 < n) {
            e.prefetch_windows(i);
        }
        if let Some(i) = self.0[(j + 1) % 4].filter(|_| j >= 2 && j + 1 < n) {
            e.prefetch_blocks(i);
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
    /// Each output line carries `"at"`, its virtual time (in-memory replays).
    pub timed: bool,
}

/// How an in-memory replay ends and writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Finish {
    /// Emit every open window at the end.
    pub flush: bool,
    /// Give each output line its virtual time.
    pub timed: bool,
}

/// Runs a replay per `opts`.
pub fn run(cfg: &Config, opts: &Options<'_>) -> Result<(Engine, Summary), ReplayError> {
    let file = File::open(opts.input).map_err(io(format!("opening {}", opts.input.display())))?;
    match opts.state_dir {
        None => {
            let out: Box<dyn Write + Send> = match opts.output {
                None => Box::new(std::io::stdout()),
                Some(p) => {
                    Box::new(File::create(p).map_err(io(format!("creating {}", p.display())))?)
                }
            };
            run_memory_with(
                cfg,
                // Reads of 256 KiB: at 8 KiB the kernel's per-read cost showed in the profile.
                BufReader::with_capacity(1 << 18, file),
                std::io::BufWriter::new(out),
                opts.drain_ms,
                Finish {
                    flush: opts.flush,
                    timed: opts.timed,
                },
            )
        }
        Some(dir) => run_durable(cfg, file, opts.output, dir, opts.drain_ms, opts.flush),
    }
}

/// In-memory replay into any writer.
pub fn run_memory<R: BufRead + Send, W: Write + Send>(
    cfg: &Config,
    input: R,
    out: W,
    drain_ms: Millis,
) -> Result<(Engine, Summary), ReplayError> {
    run_memory_with(cfg, input, out, drain_ms, Finish::default())
}

/// In-memory replay, ending and writing as `finish` says.
pub fn run_memory_with<R: BufRead + Send, W: Write + Send>(
    cfg: &Config,
    input: R,
    mut out: W,
    drain_ms: Millis,
    finish: Finish,
) -> Result<(Engine, Summary), ReplayError> {
    let Finish { flush, timed } = finish;
    let mut rp = Driver::json(cfg);
    let decoder = rp.engine().decoder().clone();
    let input = Input::new(input);
    let mut records = 0;
    let mut last: Option<Now> = None;
    let prefix = cfg.sink.prefix.as_str();
    let outputs = std::thread::scope(|s| {
        // Three stages on their own threads, in input order: the capture read,
        // parsed and its payloads decoded a batch ahead; the engine; its outputs
        // rendered and written.
        // Room for as many records between the threads as at 1 024 a batch (4 and 8
        // batches): deeper queues of 4 096 held ~5 MiB more for no speed.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Batch, ReplayError>>(1);
        let (free_tx, free_rx) = std::sync::mpsc::sync_channel::<Batch>(2);
        s.spawn(move || read_ahead(input, &decoder, &tx, &free_rx));
        let (out_tx, out_rx) = std::sync::mpsc::sync_channel::<(Vec<Output>, Vec<Millis>)>(1);
        let writer = s.spawn(move || write_outputs(prefix, &out_rx, &mut out));
        // Virtual times of the outputs not sent yet (`--timed`).
        let mut times: Vec<Millis> = Vec::new();
        // A batch's outputs go at once. A closed channel: the writer stopped on an
        // error, which its join reports.
        let send = |rp: &mut Driver, times: &mut Vec<Millis>| {
            rp.outputs().is_empty()
                || out_tx
                    .send((rp.take_outputs(), std::mem::take(times)))
                    .is_ok()
        };
        let mut decoded = Decoded::default();
        let read = (|| {
            for batch in rx {
                let batch = batch?;
                let (mut t0, mut p0, mut m0) = (0, 0, 0);
                let mut look = LookAhead::default();
                for (j, a) in batch.items.iter().enumerate() {
                    look.step(rp.engine(), &batch, j);
                    let topic = &batch.topics[t0..a.topic_end];
                    let payload = &batch.payloads[p0..a.payload_end];
                    (t0, p0) = (a.topic_end, a.payload_end);
                    let ahead = a.decoded.as_ref().map(|d| {
                        d.as_ref().map(|l| {
                            decoded.ts = l.ts;
                            decoded.seq = l.seq;
                            decoded.metrics.clear();
                            for m in &batch.metrics[m0..l.metrics_end] {
                                let _ = decoded.metrics.push(m.clone());
                            }
                            m0 = l.metrics_end;
                            &decoded
                        })
                    });
                    let now = a.now;
                    let known = Known {
                        decoded: ahead,
                        slot: look.slot(j),
                    };
                    rp.message_decoded(now, topic, payload, known);
                    if timed {
                        times.resize(rp.outputs().len(), now.wall);
                    }
                    // Replay has no site broker to ask for rebirths.
                    rp.engine_mut().take_commands();
                    records += 1;
                    last = Some(last.map_or(now, |l| Now {
                        wall: l.wall.max(now.wall),
                        mono: l.mono.max(now.mono),
                        synced: now.synced,
                    }));
                }
                let _ = free_tx.try_send(batch);
                if !send(&mut rp, &mut times) {
                    return Ok(());
                }
            }
            if let Some(last) = last {
                let end = last.wall.saturating_add(drain_ms);
                rp.ticks_until(Now {
                    wall: end,
                    mono: last.mono.saturating_add(drain_ms),
                    synced: last.synced,
                });
                if flush {
                    rp.flush();
                }
                if timed {
                    times.resize(rp.outputs().len(), end);
                }
                send(&mut rp, &mut times);
            }
            Ok::<(), ReplayError>(())
        })();
        drop(out_tx);
        let written = writer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        read.and(written)
    })?;
    Ok((
        rp.into_engine(),
        Summary {
            records,
            outputs,
            commits: 0,
        },
    ))
}

/// Renders and writes outputs as they come, in order; how many it wrote.
fn write_outputs<W: Write>(
    prefix: &str,
    rx: &std::sync::mpsc::Receiver<(Vec<Output>, Vec<Millis>)>,
    out: &mut W,
) -> Result<u64, ReplayError> {
    let (mut line, mut topic) = (Vec::new(), String::new());
    let mut n = 0;
    for (outputs, times) in rx {
        for (i, o) in outputs.into_iter().enumerate() {
            line.clear();
            topic.clear();
            o.topic_into(prefix, &mut topic);
            line_into(
                &mut line,
                &topic,
                |l| json::payload_into(l, &o),
                o.retain(),
                times.get(i).copied(),
            );
            out.write_all(&line).map_err(io("writing output"))?;
            n += 1;
        }
    }
    out.flush().map_err(io("writing output"))?;
    Ok(n)
}

#[cfg(test)]
mod tests;
