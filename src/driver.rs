//! The clock-free driving loop shared by `run`, `replay` and the tests: which
//! ticks are due before a message, when a commit is due, and what a commit
//! carries. Time comes in as values; nothing here reads a clock or does I/O
//! (the shape of rumqttc's `MqttState` beside its `EventLoop`).

use crate::config::Config;
use crate::engine::EngineConfig;
use crate::engine::{Engine, Known, Now};
use crate::journal::{Journal, Mark};
use crate::model::Millis;
use crate::output::{Emit, Output, SinkFormat};
use crate::store::{Batch, OutboxEntry};

/// An output as its outbox entry.
fn entry(o: &Output, prefix: &str, format: SinkFormat, at: Millis) -> OutboxEntry {
    let mut payload = o.encode(format);
    // The encoder grows by doubling; a burst's payloads wait in the outbox.
    payload.shrink_to_fit();
    OutboxEntry {
        topic: o.topic(prefix),
        payload: payload.into(),
        retain: o.retain(),
        at,
        report: matches!(
            o,
            Output::Late(_) | Output::Rejected(_) | Output::Refused(_)
        ),
    }
}

/// Encodes outputs as the engine emits them; keeps the alerts as values too.
struct Encoder<'a> {
    entries: &'a mut Vec<OutboxEntry>,
    alerts: &'a mut Vec<Output>,
    prefix: &'a str,
    format: SinkFormat,
}

impl Emit for Encoder<'_> {
    fn emit(&mut self, o: Output) {
        // The batch's time is set when it is cut.
        self.entries.push(entry(&o, self.prefix, self.format, 0));
        if matches!(o, Output::Alert(_) | Output::Gateway(_)) {
            self.alerts.push(o);
        }
    }
}

/// How a driver keeps what the engine did between batches.
enum Mode {
    /// `replay` and the tests: outputs as values, encoded at the cut.
    Replay,
    /// `run`: what the engine was given (the write-ahead journal), and the
    /// outputs encoded for the outbox as they are emitted (under the topic
    /// prefix and format in force then), so a tick that closes every window
    /// holds its burst once.
    Run {
        journal: Journal,
        encoded: Vec<OutboxEntry>,
    },
}

/// Drives one engine: ticks every `tick_interval_ms` of monotonic time and
/// cuts a [`Batch`] every `commit_interval_ms`.
pub struct Driver {
    engine: Engine,
    tick_ms: Millis,
    commit_ms: Millis,
    next_tick: Option<Millis>,
    prefix: String,
    format: SinkFormat,
    /// Outputs not yet taken, in emission order; with [`Driver::with_journal`]
    /// only the alerts (for the log and the API): all of them are in `encoded`.
    outputs: Vec<Output>,
    /// `run` or `replay`.
    mode: Mode,
    /// Monotonic time of the first change since the last batch that must become durable.
    first_durable: Option<Millis>,
    /// Monotonic time of the last batch.
    last_commit: Option<Millis>,
    /// The engine settings in force (an [`EngineConfig::record`]), recorded with each checkpoint.
    rules: Option<Vec<u8>>,
    /// The instant of the tick whose burst goes out in slices.
    backlog_at: Option<Now>,
}

fn ms(v: u64) -> Millis {
    Millis::try_from(v).unwrap_or(Millis::MAX).max(1)
}

impl Driver {
    /// A fresh driver of `cfg`'s engine with JSON outputs (replay, the tests).
    pub fn json(cfg: &Config) -> Self {
        Self::new(
            Engine::new(&cfg.engine),
            &cfg.gateway,
            &cfg.sink.prefix,
            SinkFormat::Json,
            None,
        )
    }

    /// A driver for `engine` ticking and committing at `gateway`'s intervals, its
    /// outputs under `prefix` in `format`; `next_tick` resumes a virtual clock
    /// (replay), None starts fresh.
    pub fn new(
        engine: Engine,
        gateway: &crate::config::Gateway,
        prefix: &str,
        format: SinkFormat,
        next_tick: Option<Millis>,
    ) -> Self {
        Self {
            engine,
            tick_ms: ms(gateway.tick_interval_ms),
            commit_ms: ms(gateway.commit_interval_ms),
            next_tick,
            prefix: prefix.to_owned(),
            format,
            outputs: Vec::new(),
            mode: Mode::Replay,
            first_durable: None,
            last_commit: None,
            rules: None,
            backlog_at: None,
        }
    }

    /// Records what the engine is given, for batches cut with [`Driver::take_journal`].
    #[must_use]
    pub fn with_journal(mut self) -> Self {
        self.mode = Mode::Run {
            journal: Journal::default(),
            encoded: Vec::new(),
        };
        self
    }

    /// Runs `f` on the engine with where its outputs go.
    fn emitting<R>(&mut self, f: impl FnOnce(&mut Engine, &mut dyn Emit) -> R) -> R {
        match &mut self.mode {
            Mode::Run {
                encoded: entries, ..
            } => f(
                &mut self.engine,
                &mut Encoder {
                    entries,
                    alerts: &mut self.outputs,
                    prefix: &self.prefix,
                    format: self.format,
                },
            ),
            Mode::Replay => f(&mut self.engine, &mut self.outputs),
        }
    }

    /// `run`'s journal.
    fn journal_mut(&mut self) -> Option<&mut Journal> {
        match &mut self.mode {
            Mode::Run { journal, .. } => Some(journal),
            Mode::Replay => None,
        }
    }

    /// Outputs since the last batch (alerts count twice with `encoded`).
    fn emitted(&self) -> usize {
        let encoded = match &self.mode {
            Mode::Run { encoded, .. } => encoded.len(),
            Mode::Replay => 0,
        };
        self.outputs.len() + encoded
    }

    /// Starts (or restarts, on a source reconnect) the processing clock at `now`:
    /// idleness is measured from here and the next tick is one interval away.
    pub fn start(&mut self, now: Now) {
        self.engine.restart_idleness(now);
        if let Some(j) = self.journal_mut() {
            j.start(now);
        }
        self.next_tick = Some(now.mono.saturating_add(self.tick_ms));
    }

    /// A new process: the monotonic clock has a new origin (see [`Engine::new_clock_origin`]).
    pub fn new_clock_origin(&mut self) {
        self.engine.new_clock_origin();
        if let Some(j) = self.journal_mut() {
            j.new_origin();
        }
    }

    /// Whether [`Driver::start`] (or a resumed clock) has set the processing clock.
    pub fn started(&self) -> bool {
        self.next_tick.is_some()
    }

    /// One input message: every tick due at or before it first, then the message.
    pub fn message(&mut self, now: Now, topic: &str, payload: &[u8]) {
        self.message_decoded(now, topic, payload, Known::default());
    }

    /// [`Driver::message`] with what a caller reading ahead knows (see [`Engine::on_message_decoded`]).
    pub fn message_decoded(&mut self, now: Now, topic: &str, payload: &[u8], known: Known<'_>) {
        if !self.started() {
            self.start(now);
        }
        self.ticks_until(now);
        self.emitting(|e, out| e.on_message_decoded(topic, payload, known, now, out));
        if let Some(j) = self.journal_mut() {
            // Any payload over the cap is rejected for its size alone: the journal
            // (and a standby's stream) keeps just enough of it to be rejected again.
            let keep = payload.len().min(crate::codec::MAX_PAYLOAD + 1);
            j.message(now, topic, &payload[..keep]);
        }
        self.durable(now.mono);
    }

    /// Notes a change that must become durable at monotonic time `mono`: the
    /// next commit is due at most `commit_interval_ms` later.
    pub fn durable(&mut self, mono: Millis) {
        if self.first_durable.is_none() {
            self.first_durable = Some(mono);
        }
    }

    /// Whether anything must become durable (input, outputs, or [`Driver::durable`]).
    pub fn has_durable(&self) -> bool {
        self.first_durable.is_some() || self.emitted() > 0
    }

    /// Runs every tick due at or before `now`, each at its own instant. Across
    /// a long gap, once nothing can fire any more (see [`Engine::settled`]), the
    /// ticks left run as the last one: it leaves the same state and the skipped
    /// ones would have emitted nothing (a capture with an arrival years ahead
    /// must not take millions of ticks).
    pub fn ticks_until(&mut self, now: Now) {
        let mut ran: u32 = 0;
        while let Some(tick) = self.next_tick.filter(|&t| t <= now.mono) {
            ran = ran.wrapping_add(1);
            if ran.is_multiple_of(1024) {
                let last = tick + (now.mono - tick) / self.tick_ms * self.tick_ms;
                if last > tick && self.engine.settled() {
                    self.next_tick = Some(last);
                    continue;
                }
            }
            let at = Now {
                wall: now.wall.saturating_sub(now.mono - tick),
                mono: tick,
                synced: now.synced,
            };
            self.next_tick = Some(tick.saturating_add(self.tick_ms));
            if !self.slice(at) {
                // The rest goes out through [`Driver::continue_backlog`]; ticks missed
                // meanwhile collapse into the next one (see [`crate::journal`]).
                self.next_tick = Some(now.mono.saturating_add(self.tick_ms));
                return;
            }
        }
    }

    /// One tick at `at`: with the journal (`run`) a slice of at most
    /// [`crate::engine::TICK_SLICE`] changed devices, else whole. False while a
    /// backlog is left: the caller cuts a batch before the next slice.
    fn slice(&mut self, at: Now) -> bool {
        let before = self.emitted();
        let backlog_before = self.engine.backlog();
        let sliced = matches!(self.mode, Mode::Run { .. });
        let backlog = if sliced {
            let left = self.emitting(|e, out| e.tick_slice(at, out));
            // The latest instant: a later tick (a message's) may have moved watermarks on.
            self.backlog_at = Some(at);
            left
        } else {
            self.emitting(|e, out| e.on_tick(at, out));
            false
        };
        let held = self.engine.clock_held();
        if let Some(j) = self.journal_mut()
            && !held
        {
            if backlog || backlog_before {
                j.tick_slice(at);
            } else {
                j.tick(at);
            }
        }
        if self.emitted() > before {
            self.durable(at.mono);
        }
        !backlog
    }

    /// A tick stopped at its budget: the rest of its burst waits for the next slice.
    pub fn backlog(&self) -> bool {
        // An engine restored mid-burst (a journal's last slice) goes on with its next tick.
        self.engine.backlog() && self.backlog_at.is_some()
    }

    /// The next slice of a burst ([`Driver::backlog`]), at the instant of the tick that
    /// began it (its watermarks: nothing new becomes due meanwhile); `run` calls it after
    /// each cut instead of [`Driver::ticks_until`] while a backlog is left.
    pub fn continue_backlog(&mut self) {
        if let Some(at) = self.backlog_at.filter(|_| self.engine.backlog()) {
            self.slice(at);
        }
    }

    /// A reload (docs/reference.md#reload-sighup-systemctl-reload-tidemark): the engine's new rules from the next message on,
    /// journaled in order with the messages; tick, commit and output settings at once.
    pub fn reconfigure(&mut self, now: Now, cfg: &Config) {
        self.ticks_until(now);
        let record = cfg.engine.record();
        self.engine.reconfigure(&cfg.engine);
        if let Some(j) = self.journal_mut() {
            j.reconfigure(&record);
        }
        self.rules = Some(record);
        self.tick_ms = ms(cfg.gateway.tick_interval_ms);
        self.commit_ms = ms(cfg.gateway.commit_interval_ms);
        self.prefix.clone_from(&cfg.sink.prefix);
        self.format = cfg.sink.format;
        self.durable(now.mono);
    }

    /// A mark of state outside the windows (a remote document id taken, the edge
    /// node's next session): durable with the next commit, journaled in order
    /// with the messages so a standby follows it; never moves back.
    pub fn mark(&mut self, now: Now, m: Mark) {
        if !m.moves(&self.engine) {
            return;
        }
        m.apply(&mut self.engine);
        if let Some(j) = self.journal_mut() {
            j.mark(m);
        }
        self.durable(now.mono);
    }

    /// An entry a database output refused: published on `P/rejected` with the
    /// next batch (docs/reference.md#sinkpostgres-and-sinkinflux).
    pub fn set_aside(&mut self, now: Now, r: crate::output::Refused) {
        let o = Output::Refused(r);
        match &mut self.mode {
            Mode::Run { encoded, .. } => encoded.push(entry(&o, &self.prefix, self.format, 0)),
            Mode::Replay => self.outputs.push(o),
        }
        self.durable(now.mono);
    }

    /// Records `rules` as the engine settings in force (restore).
    pub fn set_rules(&mut self, rules: &EngineConfig) {
        self.rules = Some(rules.record());
    }

    /// Live clocks only: after a stall (a suspended board) run one tick at `now`
    /// instead of replaying every missed one.
    pub fn skip_missed_ticks(&mut self, now: Now) {
        if let Some(t) = self.next_tick
            && now.mono.saturating_sub(t) > 10 * self.tick_ms
        {
            self.next_tick = Some(now.mono);
        }
    }

    /// End of a bounded input: every open window emits its result (see [`Engine::flush`]).
    pub fn flush(&mut self) {
        self.emitting(|e, out| e.flush(out));
    }

    /// The next scheduled tick (monotonic ms).
    pub fn next_tick(&self) -> Option<Millis> {
        self.next_tick
    }

    /// Whether a commit of pending durable work is due at monotonic time `mono`:
    /// at once when the last batch is `commit_interval_ms` old (a first reading
    /// after a quiet spell is not kept waiting), else when it gets that old — so
    /// at most one commit per interval, and none later than an interval after
    /// the first durable change. A tick that only moved watermarks or idleness
    /// is not durable work (restore recomputes it).
    pub fn commit_due(&self, mono: Millis) -> bool {
        self.has_durable() && self.interval_elapsed(mono)
    }

    /// Whether `commit_interval_ms` has passed at `mono` since the last batch
    /// (or none was cut yet): the one commit cadence of `run` and `replay`.
    pub fn interval_elapsed(&self, mono: Millis) -> bool {
        self.last_commit
            .is_none_or(|c| mono.saturating_sub(c) >= self.commit_ms)
    }

    /// Resumes the cadence of a run whose last batch was cut at `mono` (durable replay).
    #[must_use]
    pub fn with_last_commit(mut self, mono: Option<Millis>) -> Self {
        self.last_commit = mono;
        self
    }

    /// Monotonic time of the last batch.
    pub fn last_commit(&self) -> Option<Millis> {
        self.last_commit
    }

    /// The journal recorded since the last batch (`run`).
    pub fn journal(&self) -> Option<&Journal> {
        match &self.mode {
            Mode::Run { journal, .. } => Some(journal),
            Mode::Replay => None,
        }
    }

    /// Cuts a batch: the changed state and every output since the last one,
    /// encoded for the outbox. The caller adds positions and delivered marks.
    pub fn take_batch(&mut self, now: Now) -> Batch {
        Batch {
            changes: self.engine.take_changes(),
            ..self.cut(now)
        }
    }

    /// Cuts a journal batch (`run` between checkpoints): the ops the engine was
    /// given and the outputs since the last batch; the engine's changed state
    /// stays marked for the next checkpoint.
    pub fn take_journal(&mut self, now: Now) -> Batch {
        let ops = self.journal_mut().map(Journal::cut).unwrap_or_default();
        Batch {
            journal: Some(ops),
            ..self.cut(now)
        }
    }

    /// Cuts a checkpoint batch: the whole changed state; the journal so far is
    /// covered by it.
    pub fn take_checkpoint(&mut self, now: Now) -> Batch {
        self.take_checkpoint_upto(now, usize::MAX)
    }

    /// [`Driver::take_checkpoint`] with at most `devices` device records; the rest
    /// follow with [`Driver::take_device_slice`] before anything else reaches the engine.
    pub fn take_checkpoint_upto(&mut self, now: Now, devices: usize) -> Batch {
        let covered = self.journal_mut().map(Journal::cut).unwrap_or_default();
        let mut batch = Batch {
            changes: self.engine.take_changes_upto(devices),
            ..self.cut(now)
        };
        batch.covered = covered;
        if let Some(rules) = &self.rules {
            batch
                .meta
                .push((crate::store::schema::K_RULES, rules.clone()));
        }
        batch
    }

    fn cut(&mut self, now: Now) -> Batch {
        self.last_commit = Some(now.mono);
        self.first_durable = None;
        let outputs = match &mut self.mode {
            Mode::Run {
                encoded: entries, ..
            } => {
                self.outputs.clear();
                let mut v = std::mem::take(entries);
                for e in &mut v {
                    e.at = now.wall;
                }
                v
            }
            Mode::Replay => self
                .outputs
                .drain(..)
                .map(|o| entry(&o, &self.prefix, self.format, now.wall))
                .collect(),
        };
        // A tick that closed every window at once is rare: its room is not kept resident.
        crate::sys::memory::shed(&mut self.outputs, 1024);
        Batch {
            outputs,
            ..Batch::default()
        }
    }

    /// The next `n` device records of a streamed checkpoint; empty once all are taken.
    pub fn take_device_slice(&mut self, n: usize) -> crate::engine::DeviceRecords {
        self.engine.take_device_slice(n)
    }

    /// What the engine produced since the last take (or batch): every output,
    /// or with [`Driver::with_journal`] the alerts (the rest is encoded for the batch).
    pub fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outputs)
    }

    /// The outputs not yet taken.
    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, mutably.
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Gives the engine back.
    pub fn into_engine(self) -> Engine {
        self.engine
    }
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
