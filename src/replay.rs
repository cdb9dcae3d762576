//! `tidemark replay`: the engine on a recorded capture, with a virtual clock
//! driven by the arrival times (SPEC §1). Same input, same output, byte for byte.

use std::io::{BufRead, Write};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::engine::{Engine, Now};
use crate::model::Millis;
use crate::output::{Output, PayloadRef};

/// One capture line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record<'a> {
    /// Gateway wall clock at arrival, epoch ms.
    pub arrival: Millis,
    /// MQTT topic.
    pub topic: String,
    /// Payload as JSON (its exact text is the payload).
    #[serde(borrow, default)]
    pub payload: Option<&'a RawValue>,
    /// Raw payload bytes, base64.
    #[serde(default)]
    pub payload_b64: Option<String>,
}

/// One output line.
#[derive(Serialize)]
struct Line<'a> {
    topic: String,
    payload: PayloadRef<'a>,
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
    #[error("input line {line}: {msg}")]
    BadRecord {
        /// 1-based line number.
        line: u64,
        /// Cause.
        msg: String,
    },
}

/// What a replay did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Records replayed.
    pub records: u64,
    /// Output lines written.
    pub outputs: u64,
    /// Virtual ticks run.
    pub ticks: u64,
}

/// Drives an engine through a capture on a virtual clock.
pub struct Replayer<W: Write> {
    engine: Engine,
    out: W,
    prefix: String,
    tick_ms: Millis,
    next_tick: Option<Millis>,
    buf: Vec<Output>,
    summary: Summary,
}

impl<W: Write> Replayer<W> {
    /// A replayer writing JSON lines to `out`.
    pub fn new(engine: Engine, prefix: String, tick_ms: Millis, out: W) -> Self {
        Self {
            engine,
            out,
            prefix,
            tick_ms,
            next_tick: None,
            buf: Vec::new(),
            summary: Summary::default(),
        }
    }

    /// Feeds one record: first every tick due at or before its arrival, then the record.
    pub fn record(&mut self, arrival: Millis, topic: &str, payload: &[u8]) -> std::io::Result<()> {
        if self.next_tick.is_none() {
            self.engine.restart_idleness(Now::at(arrival));
            self.next_tick = Some(arrival + self.tick_ms);
        }
        self.ticks_until(arrival)?;
        self.engine
            .on_message(topic, payload, Now::at(arrival), &mut self.buf);
        self.summary.records += 1;
        self.flush_outputs()
    }

    /// Runs every tick due at or before `t`.
    pub fn ticks_until(&mut self, t: Millis) -> std::io::Result<()> {
        while let Some(tick) = self.next_tick.filter(|&n| n <= t) {
            self.engine.on_tick(Now::at(tick), &mut self.buf);
            self.summary.ticks += 1;
            self.next_tick = Some(tick + self.tick_ms);
            self.flush_outputs()?;
        }
        Ok(())
    }

    /// Virtual time of the last record or tick handled.
    pub fn last_tick(&self) -> Option<Millis> {
        self.next_tick.map(|n| n - self.tick_ms)
    }

    fn flush_outputs(&mut self) -> std::io::Result<()> {
        for o in self.buf.drain(..) {
            let line = Line {
                topic: o.topic(&self.prefix),
                payload: o.payload(),
                retain: o.retain(),
            };
            serde_json::to_writer(&mut self.out, &line)?;
            self.out.write_all(b"\n")?;
            self.summary.outputs += 1;
        }
        Ok(())
    }

    /// Finishes: flushes the writer and returns the engine and summary.
    pub fn finish(mut self) -> std::io::Result<(Engine, Summary)> {
        self.out.flush()?;
        Ok((self.engine, self.summary))
    }
}

/// Decodes a record's payload bytes.
pub fn payload_bytes(r: &Record<'_>) -> Result<Vec<u8>, String> {
    match (&r.payload, &r.payload_b64) {
        (Some(p), None) => Ok(p.get().as_bytes().to_vec()),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| format!("payload_b64: {e}")),
        (None, None) => Err("needs \"payload\" or \"payload_b64\"".into()),
        (Some(_), Some(_)) => Err("has both \"payload\" and \"payload_b64\"".into()),
    }
}

/// Replays every line of `input` into `replayer`, then ticks `drain_ms` past the last record.
pub fn replay_all<R: BufRead, W: Write>(
    input: R,
    replayer: &mut Replayer<W>,
    drain_ms: Millis,
) -> Result<(), ReplayError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ReplayError::Io { what, source }
    };
    let mut last_arrival = None;
    for (n, line) in input.lines().enumerate() {
        let line_no = n as u64 + 1;
        let line = line.map_err(io("reading input"))?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: Record<'_> = serde_json::from_str(&line).map_err(|e| ReplayError::BadRecord {
            line: line_no,
            msg: e.to_string(),
        })?;
        let bytes =
            payload_bytes(&rec).map_err(|msg| ReplayError::BadRecord { line: line_no, msg })?;
        replayer
            .record(rec.arrival, &rec.topic, &bytes)
            .map_err(io("writing output"))?;
        last_arrival = Some(last_arrival.map_or(rec.arrival, |l: Millis| l.max(rec.arrival)));
    }
    if let Some(last) = last_arrival {
        replayer
            .ticks_until(last.saturating_add(drain_ms))
            .map_err(io("writing output"))?;
    }
    Ok(())
}
