//! The clock-free driving loop shared by `run`, `replay` and the tests: which
//! ticks are due before a message, when a commit is due, and what a commit
//! carries. Time comes in as values; nothing here reads a clock or does I/O
//! (the shape of rumqttc's `MqttState` beside its `EventLoop`).

use crate::config::Config;
use crate::engine::{Engine, Now};
use crate::model::Millis;
use crate::output::Output;
use crate::output::SinkFormat;
use crate::store::{Batch, OutboxEntry};

/// Drives one engine: ticks every `tick_interval_ms` of monotonic time and
/// cuts a [`Batch`] every `commit_interval_ms`.
pub struct Driver {
    engine: Engine,
    tick_ms: Millis,
    commit_ms: Millis,
    next_tick: Option<Millis>,
    last_commit: Option<Millis>,
    prefix: String,
    format: SinkFormat,
    /// Outputs since the last batch, in emission order.
    pub outputs: Vec<Output>,
}

fn ms(v: u64) -> Millis {
    Millis::try_from(v).unwrap_or(Millis::MAX).max(1)
}

impl Driver {
    /// A driver for `engine`; `next_tick` resumes a virtual clock (replay), None starts fresh.
    pub fn new(
        engine: Engine,
        cfg: &Config,
        format: SinkFormat,
        next_tick: Option<Millis>,
    ) -> Self {
        Self {
            engine,
            tick_ms: ms(cfg.tick_interval_ms),
            commit_ms: ms(cfg.commit_interval_ms),
            next_tick,
            last_commit: None,
            prefix: cfg.topic_prefix.clone(),
            format,
            outputs: Vec::new(),
        }
    }

    /// Starts (or restarts, on a source reconnect) the processing clock at `now`:
    /// idleness is measured from here and the next tick is one interval away.
    pub fn start(&mut self, now: Now) {
        self.engine.restart_idleness(now);
        self.next_tick = Some(now.mono.saturating_add(self.tick_ms));
    }

    /// Whether [`Driver::start`] (or a resumed clock) has set the processing clock.
    pub fn started(&self) -> bool {
        self.next_tick.is_some()
    }

    /// One input message: every tick due at or before it first, then the message.
    pub fn message(&mut self, now: Now, topic: &str, payload: &[u8]) {
        if !self.started() {
            self.start(now);
        }
        self.ticks_until(now);
        self.engine
            .on_message(topic, payload, now, &mut self.outputs);
    }

    /// Runs every tick due at or before `now`, each at its own instant.
    pub fn ticks_until(&mut self, now: Now) {
        while let Some(tick) = self.next_tick.filter(|&t| t <= now.mono) {
            let at = Now {
                wall: now.wall.saturating_sub(now.mono - tick),
                mono: tick,
            };
            self.engine.on_tick(at, &mut self.outputs);
            self.next_tick = Some(tick.saturating_add(self.tick_ms));
        }
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
        self.engine.flush(&mut self.outputs);
    }

    /// The next scheduled tick (monotonic ms).
    pub fn next_tick(&self) -> Option<Millis> {
        self.next_tick
    }

    /// Whether a commit is due at monotonic time `mono`.
    pub fn commit_due(&self, mono: Millis) -> bool {
        self.last_commit
            .is_none_or(|c| mono.saturating_sub(c) >= self.commit_ms)
    }

    /// When the next commit is due (monotonic ms).
    pub fn commit_at(&self) -> Option<Millis> {
        self.last_commit.map(|c| c.saturating_add(self.commit_ms))
    }

    /// Cuts a batch: the changed state and every output since the last one,
    /// encoded for the outbox. The caller adds positions and delivered marks.
    pub fn take_batch(&mut self, now: Now) -> Batch {
        self.last_commit = Some(now.mono);
        let outputs = self
            .outputs
            .drain(..)
            .map(|o| OutboxEntry {
                topic: o.topic(&self.prefix),
                payload: o.encode(self.format),
                retain: o.retain(),
                at: now.wall,
            })
            .collect();
        Batch {
            changes: self.engine.take_changes(),
            outputs,
            meta: Vec::new(),
            delivered: None,
        }
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
