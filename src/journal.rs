//! What the engine was given, as a replayable record: the input of the
//! write-ahead journal ([`crate::store::wal`]).
//!
//! The engine is deterministic, so the state after a checkpoint plus the
//! messages, ticks and idleness restarts it was handed since (each with its
//! instant) rebuilds exactly the state that was committed: a few dozen bytes
//! per reading instead of the device records it touched.
//!
//! Ticks between two inputs collapse into the last one. With no input in
//! between, a tick's watermark is a non-decreasing function of its instant
//! (members only go idle, the all-idle formula grows with time), and closing
//! windows at W1 then at W2 >= W1 leaves the same state as closing at W2 once;
//! only the outputs differ, and replayed outputs are discarded (they are in
//! the outbox already). So a silent fleet's journal does not grow.

use serde::{Deserialize, Serialize};

use crate::engine::{Engine, Now};
use crate::model::Millis;
use crate::output::Discard;

/// `M` is a message while the kernel reports the clock synchronized, `U` one
/// while it does not; `O` a new monotonic origin (a new process); `R` a reload's
/// engine settings (an [`crate::engine::EngineConfig::record`]); `C` the same as a
/// TOML document, as journals before 2026-12 hold it (read, never written).
#[derive(Serialize)]
enum OpRef<'a> {
    S(Millis, Millis),
    T(Millis, Millis),
    M(
        Millis,
        Millis,
        &'a str,
        #[serde(with = "serde_bytes")] &'a [u8],
    ),
    U(
        Millis,
        Millis,
        &'a str,
        #[serde(with = "serde_bytes")] &'a [u8],
    ),
    O,
    R(#[serde(with = "serde_bytes")] &'a [u8]),
    F(u64),
    B(u64),
    P(u8, u64, u64, u64),
    K(Millis, Millis),
}

#[derive(Deserialize)]
enum Op {
    S(Millis, Millis),
    T(Millis, Millis),
    M(
        Millis,
        Millis,
        String,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    U(
        Millis,
        Millis,
        String,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    O,
    C(String),
    R(#[serde(with = "serde_bytes")] Vec<u8>),
    F(u64),
    B(u64),
    P(u8, u64, u64, u64),
    K(Millis, Millis),
}

/// State outside the windows that must survive a crash and reach a standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The highest remote document id taken (replay protection, docs/reference.md#remote-configuration-fleet).
    FleetId(u64),
    /// The Sparkplug edge node's next session counter (`bdSeq` = it mod 256).
    BdSeq(u64),
    /// A database output's cursor and totals (docs/reference.md#sinkpostgres-and-sinkinflux).
    Output(crate::model::OutputKind, OutputMark),
}

pub use crate::model::OutputMark;

impl Mark {
    /// Into `engine`'s state (each only ever rises).
    pub fn apply(self, engine: &mut Engine) {
        match self {
            Mark::FleetId(id) => engine.take_fleet_id(id),
            Mark::BdSeq(next) => engine.take_bd_seq(next),
            Mark::Output(o, m) => engine.take_output_mark(o, m),
        }
    }

    /// It would move `engine`'s state on.
    pub fn moves(self, engine: &Engine) -> bool {
        match self {
            Mark::FleetId(v) => v > engine.fleet_last_id(),
            Mark::BdSeq(v) => v > engine.bd_seq(),
            Mark::Output(o, m) => m.max(engine.output_mark(o)) != engine.output_mark(o),
        }
    }
}

/// The ops since the last cut, encoded.
#[derive(Debug, Default)]
pub struct Journal {
    buf: Vec<u8>,
    /// Offset of a trailing tick (collapsed into the next one).
    tick_at: Option<usize>,
}

impl Journal {
    /// The processing clock (re)started at `now` (idleness restart).
    pub fn start(&mut self, now: Now) {
        self.push(&OpRef::S(now.wall, now.mono));
        self.tick_at = None;
    }

    /// A tick that ran (a held tick changes nothing and is not recorded).
    pub fn tick(&mut self, at: Now) {
        if let Some(o) = self.tick_at {
            self.buf.truncate(o);
        }
        let o = self.buf.len();
        self.push(&OpRef::T(at.wall, at.mono));
        self.tick_at = Some(o);
    }

    /// One slice of a tick ([`Engine::tick_slice`]) that started or ended with a
    /// backlog: replayed as that slice, never collapsed with another tick.
    pub fn tick_slice(&mut self, at: Now) {
        self.push(&OpRef::K(at.wall, at.mono));
        self.tick_at = None;
    }

    /// A message handed to the engine at `now`.
    pub fn message(&mut self, now: Now, topic: &str, payload: &[u8]) {
        let op = if now.synced {
            OpRef::M(now.wall, now.mono, topic, payload)
        } else {
            OpRef::U(now.wall, now.mono, topic, payload)
        };
        self.push(&op);
        self.tick_at = None;
    }

    /// A new monotonic origin (see [`Engine::new_clock_origin`]).
    pub fn new_origin(&mut self) {
        self.push(&OpRef::O);
        self.tick_at = None;
    }

    /// A reload's engine settings, in order with the messages around it.
    pub fn reconfigure(&mut self, record: &[u8]) {
        self.push(&OpRef::R(record));
        self.tick_at = None;
    }

    /// A mark of state outside the windows ([`Mark`]).
    pub fn mark(&mut self, m: Mark) {
        self.push(&match m {
            Mark::FleetId(id) => OpRef::F(id),
            Mark::BdSeq(next) => OpRef::B(next),
            Mark::Output(o, m) => OpRef::P(o as u8, m.upto, m.written, m.refused),
        });
        self.tick_at = None;
    }

    fn push(&mut self, op: &OpRef<'_>) {
        // Writing plain data into a Vec cannot fail.
        let _ = ciborium::ser::into_writer(op, &mut self.buf);
    }

    /// Bytes recorded since the last cut.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Nothing recorded since the last cut.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Takes the ops recorded so far (the next batch starts with room for as many).
    pub fn cut(&mut self) -> Vec<u8> {
        self.tick_at = None;
        let room = self.buf.len();
        std::mem::replace(&mut self.buf, Vec::with_capacity(room))
    }
}

/// Error replaying a journal record.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The record is not ours.
    #[error("journal record does not decode: {0}")]
    Decode(#[from] ciborium::de::Error<std::io::Error>),
    /// A reload's settings no longer validate (written by another version?).
    #[error("journal reload record: {0}")]
    Config(#[from] crate::config::ConfigError),
}

/// Hands the ops of one record to `engine` again; their outputs are dropped.
/// Returns the engine settings of the record's last reload, if it has one.
pub fn apply(engine: &mut Engine, mut ops: &[u8]) -> Result<Option<Vec<u8>>, ReplayError> {
    let mut reloaded = None;
    while !ops.is_empty() {
        let op: Op = ciborium::de::from_reader(&mut ops)?;
        match op {
            Op::S(wall, mono) => engine.restart_idleness(now(wall, mono, true)),
            Op::T(wall, mono) => engine.on_tick(now(wall, mono, true), &mut Discard),
            Op::K(wall, mono) => {
                engine.tick_slice(now(wall, mono, true), &mut Discard);
            }
            Op::M(wall, mono, topic, payload) => {
                engine.on_message(&topic, &payload, now(wall, mono, true), &mut Discard);
            }
            Op::U(wall, mono, topic, payload) => {
                engine.on_message(&topic, &payload, now(wall, mono, false), &mut Discard);
            }
            Op::O => engine.new_clock_origin(),
            Op::C(doc) => {
                let rules = crate::config::engine_from_record(doc.as_bytes())?;
                engine.reconfigure(&rules);
                reloaded = Some(rules.record());
            }
            Op::F(id) => Mark::FleetId(id).apply(engine),
            Op::B(next) => Mark::BdSeq(next).apply(engine),
            Op::P(o, upto, written, refused) => {
                if let Some(o) = crate::model::OutputKind::from_index(o) {
                    let m = OutputMark {
                        upto,
                        written,
                        refused,
                    };
                    Mark::Output(o, m).apply(engine);
                }
            }
            Op::R(record) => {
                engine.reconfigure(&crate::config::engine_from_record(&record)?);
                reloaded = Some(record);
            }
        }
    }
    Ok(reloaded)
}

fn now(wall: Millis, mono: Millis, synced: bool) -> Now {
    Now { wall, mono, synced }
}
