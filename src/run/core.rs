//! The core thread: owns the engine (through the [`Driver`]); messages, reloads
//! and wake-ups in, batches out to the store thread. Reads the clock once per
//! message and once per wake-up. When to cut a batch is [`plan`]'s to say.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use tokio::sync::mpsc::{Receiver, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;

use crate::config::Config;
use crate::driver::Driver;
use crate::model::Millis;
use crate::run::ceiling::{Ceiling, OUTPUT_BYTES};
use crate::run::durable::plan::{self, Cadence, Commit, Pending, STREAM_SLICE};
use crate::run::events::{
    Control, Current, Inbound, OutboxBounds, StoreEvent, StoreJob, StoreState,
};
use crate::run::outputs::mqtt::SinkMsg;
use crate::run::report::Report;
use crate::run::status::api;
use crate::run::status::metrics;
use crate::run::status::registry::Registry;
use crate::sys::clock::SystemClock;
use crate::sys::link::Held;
use std::time::Duration;
use tokio::sync::mpsc::Sender;

/// The core's slice of the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreConfig {
    /// `P/metrics` period.
    pub metrics_every_ms: Millis,
    /// When held acks force a commit (by source protocol).
    pub cadence: Cadence,
    /// The HTTP endpoint is on: keep its Prometheus text fresh.
    pub prometheus: bool,
    /// The source probes its path: processing time runs only up to the last proof (docs/reference.md#group_defaults-and-groupsname).
    pub probing: bool,
    /// `gateway.memory_max_mb` in bytes, 0: the cgroup's (docs/reference.md#memory).
    pub memory_max: u64,
}

impl CoreConfig {
    /// The core's settings in `cfg`.
    pub fn of(cfg: &Config) -> Self {
        Self {
            metrics_every_ms: cfg.metrics.interval_ms(),
            cadence: Cadence::of(cfg.source.v5),
            prometheus: cfg.metrics.listen.is_some(),
            probing: cfg.source.probe.is_some(),
            memory_max: cfg.gateway.memory_max_bytes,
        }
    }
}

/// Messages taken per wake-up before ticks and commits are looked at.
const BURST: usize = 4096;

/// How often freed heap is handed back to the kernel under load (window results
/// pass through in bursts) ...
const GIVE_BACK_MS: Millis = 5_000;
/// ... and how long the input must have been quiet for it to be handed back at once.
const GIVE_BACK_QUIET_MS: Millis = 1_000;

/// What the core thread is wired to.
pub struct Links {
    /// Messages, reloads, wake-ups.
    pub rx: Receiver<Inbound>,
    /// Batches to the store thread (blocks while it writes: backpressure).
    pub store: SyncSender<StoreJob>,
    /// The store thread's commits.
    pub store_events: UnboundedReceiver<StoreEvent>,
    /// The store's health.
    pub store_state: watch::Receiver<StoreState>,
    /// One past the highest outbox entry acknowledged upstream.
    pub delivered: watch::Receiver<u64>,
    /// `P/metrics` to the sink.
    pub sink: UnboundedSender<SinkMsg>,
    /// Sparkplug rebirth requests go to the site broker, not upstream.
    pub commands: watch::Receiver<Current>,
    /// Counters and gauges.
    pub registry: Arc<Registry>,
    /// Snapshots a standby asked for (a count; docs/reference.md#standby--two-boards-one-gateway).
    pub snapshots: watch::Receiver<u64>,
}

/// The core: the driver and what it is wired to.
pub struct Core {
    driver: Driver,
    clock: SystemClock,
    cfg: CoreConfig,
    links: Links,
}

/// The loop's own state between passes.
struct Loop {
    held: Vec<(u64, Held, Millis)>,
    last_message: Millis,
    /// Monotonic time the path from the site broker was last proven (docs/reference.md#group_defaults-and-groupsname).
    proven: Millis,
    source_up: bool,
    next_metrics: Millis,
    next_prometheus: Millis,
    committed_delivered: u64,
    stopping: bool,
    journal_len: u64,
    want_checkpoint: bool,
    bounds: Option<OutboxBounds>,
    next_give_back: Millis,
    last_give_back: Millis,
    /// Wall time of the source's last connect or disconnect (live status).
    source_since: Millis,
    /// Wall time of the last durable commit (live status).
    last_commit_at: Option<Millis>,
    /// A standby waits for a snapshot: the next checkpoint is read for it.
    snapshot: bool,
    /// The memory ceiling (docs/reference.md#memory).
    ceiling: Ceiling,
    /// A close burst's next slice waits for its results in flight to go out.
    paced: bool,
    /// Monotonic time of the last checkpoint cut.
    last_checkpoint: Millis,
    /// Streamed checkpoints the store reported failed.
    redo: u64,
    /// The next checkpoint carries all state (one after a failed streamed one).
    full: bool,
}

impl Core {
    /// A core around `driver`.
    pub fn new(driver: Driver, clock: SystemClock, cfg: CoreConfig, links: Links) -> Self {
        Self {
            driver,
            clock,
            cfg,
            links,
        }
    }

    /// Runs until `Stop` or until every sender is gone.
    pub fn run(mut self) {
        let mono = self.clock.mono();
        let mut st = Loop {
            held: Vec::new(),
            last_message: mono,
            proven: mono,
            source_up: false,
            next_metrics: mono.saturating_add(self.cfg.metrics_every_ms),
            next_prometheus: mono,
            committed_delivered: *self.links.delivered.borrow(),
            stopping: false,
            journal_len: 0,
            want_checkpoint: false,
            bounds: None,
            next_give_back: mono.saturating_add(GIVE_BACK_MS),
            last_give_back: mono,
            source_since: self.clock.now().wall,
            last_commit_at: None,
            snapshot: false,
            ceiling: Ceiling::new(self.cfg.memory_max, &self.links.registry.memory),
            paced: false,
            last_checkpoint: mono,
            redo: 0,
            full: false,
        };
        let mut report = Report::new(mono);
        // Counters are totals since the state was created: rates start from the restored ones.
        report.rates(self.driver.engine(), mono);
        while !st.stopping {
            // A window-close burst goes on slice by slice without waiting for input.
            let mut next = if self.driver.backlog() {
                if st.paced {
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.links.rx.try_recv().ok()
            } else {
                let Some(first) = self.links.rx.blocking_recv() else {
                    break;
                };
                Some(first)
            };
            let mut taken = 0;
            while let Some(msg) = next.take() {
                self.take(msg, &mut st);
                taken += 1;
                if taken < BURST && !st.stopping {
                    next = self.links.rx.try_recv().ok();
                }
            }
            if !self.pass(&mut st, &mut report) {
                break;
            }
        }
    }

    fn take(&mut self, msg: Inbound, st: &mut Loop) {
        let driver = &mut self.driver;
        let registry = &self.links.registry;
        match msg {
            Inbound::Message {
                topic,
                payload,
                held: h,
            } => {
                let now = self.clock.now();
                if !st.source_up {
                    // A message proves the link is up (an ordering race with `Connected`).
                    st.source_up = true;
                    st.source_since = now.wall;
                    registry.health.source(true, now.mono);
                    driver.start(now);
                }
                driver.skip_missed_ticks(now);
                driver.message(now, &topic, &payload);
                for (topic, payload) in driver.engine_mut().take_commands() {
                    let client = self.links.commands.borrow().1.clone();
                    match client.publish(&topic, payload, 0, false) {
                        Ok(()) => tracing::info!(%topic, "Sparkplug rebirth requested"),
                        Err(e) => {
                            tracing::warn!(%topic, error = %e, "Sparkplug rebirth request not sent")
                        }
                    }
                }
                registry.received.fetch_add(1, Ordering::Relaxed);
                st.held.extend(h.map(|(g, t)| (g, t, now.mono)));
                st.last_message = now.mono;
                st.proven = now.mono;
            }
            Inbound::Connected => {
                st.source_up = true;
                let now = self.clock.now();
                st.proven = now.mono;
                st.source_since = now.wall;
                registry.health.source(true, now.mono);
                driver.start(now);
            }
            Inbound::Disconnected => {
                if st.source_up {
                    st.source_since = self.clock.now().wall;
                }
                st.source_up = false;
                registry.health.source(false, self.clock.mono());
            }
            Inbound::Query(q, reply) => {
                let links = api::Links {
                    source_up: st.source_up,
                    source_since: st.source_since,
                    last_commit_at: st.last_commit_at,
                    proven: st.proven,
                };
                let now = self.clock.now();
                let _ = reply.send(api::answer(driver.engine(), &q, now, registry, links));
            }
            Inbound::Control(Control::Reload(cfg)) => {
                let now = self.clock.now();
                driver.reconfigure(now, &cfg);
                let before = self.cfg.memory_max;
                self.cfg = CoreConfig::of(&cfg);
                if self.cfg.memory_max != before {
                    st.ceiling.configure(self.cfg.memory_max, &registry.memory);
                }
                st.next_metrics = now.mono.saturating_add(self.cfg.metrics_every_ms);
                st.bounds = Some(cfg.sink.outbox);
                tracing::debug!("reload applied to the engine");
            }
            Inbound::Mark(m) => driver.mark(self.clock.now(), m),
            Inbound::SetAside(r) => driver.set_aside(self.clock.now(), *r),
            Inbound::Proven => st.proven = self.clock.mono(),
            Inbound::Wake => {}
            Inbound::Control(Control::Stop) => st.stopping = true,
        }
    }

    /// The memory ceiling's look, and whether a close burst's next slice waits: its
    /// results in memory and on their way out are bounded by [`OUTPUT_BYTES`]; with
    /// the uplink down a checkpoint moves them into the outbox table.
    fn pace(&self, st: &mut Loop, mono: Millis) {
        let registry = &self.links.registry;
        let outputs = registry.memory.outputs_bytes.load(Ordering::Relaxed);
        let sink_up = registry.sink_up.load(Ordering::Relaxed);
        let backlog = self.driver.backlog();
        let in_flight = backlog || (outputs > 0 && sink_up) || st.want_checkpoint;
        st.ceiling.look(mono, &registry.memory, in_flight);
        st.paced = backlog && outputs > OUTPUT_BYTES;
        let holding = st.paced || st.ceiling.held_since().is_some();
        if holding && !sink_up && outputs > OUTPUT_BYTES && mono - st.last_checkpoint >= 1000 {
            st.want_checkpoint = true;
        }
    }

    /// Ticks, metrics, the commit plan; false when the store thread is gone.
    fn pass(&mut self, st: &mut Loop, report: &mut Report) -> bool {
        let now = self.clock.now();
        let registry = self.links.registry.clone();
        registry.health.core_beat(now.mono);
        while let Ok(ev) = self.links.store_events.try_recv() {
            match ev {
                StoreEvent::Committed {
                    journal_len,
                    over_bound,
                    redo,
                } => {
                    st.journal_len = journal_len;
                    st.want_checkpoint |= over_bound;
                    st.last_commit_at = Some(now.wall);
                    if redo > st.redo {
                        st.redo = redo;
                        self.driver.engine_mut().mark_all_changed();
                        st.full = true;
                        st.want_checkpoint = true;
                    }
                }
            }
        }
        self.pace(st, now.mono);
        let driver = &mut self.driver;
        if driver.backlog() {
            // Closures already decided go on at their own instant, whatever the links do.
            if !st.paced {
                driver.continue_backlog();
            }
        } else if st.source_up {
            // Processing time is credited only up to the last proof of the path (docs/reference.md#group_defaults-and-groupsname),
            // and stands while input is held (docs/reference.md#memory).
            let mut proven = if self.cfg.probing {
                st.proven
            } else {
                now.mono
            };
            if let Some(h) = st.ceiling.held_since() {
                proven = proven.min(h);
            }
            let credited = credited(now, proven);
            driver.skip_missed_ticks(credited);
            driver.ticks_until(credited);
        }
        report.clock(driver.engine(), now.wall);
        if now.mono >= st.next_metrics {
            st.next_metrics = now.mono.saturating_add(self.cfg.metrics_every_ms);
            let m = metrics::collect(driver.engine(), now, &registry, st.source_up);
            let _ = self.links.sink.send(SinkMsg::Metrics(Box::new(m)));
        }
        if self.cfg.prometheus && now.mono >= st.next_prometheus {
            // Scrapes read the latest text: fresh to the second, never blocking the engine.
            st.next_prometheus = now.mono.saturating_add(1000);
            let m = metrics::collect(driver.engine(), now, &registry, st.source_up);
            registry.health.set_prometheus(m.prometheus());
        }
        let quiet = now.mono.saturating_sub(st.last_message) >= GIVE_BACK_QUIET_MS;
        if now.mono >= st.next_give_back || (quiet && st.last_message > st.last_give_back) {
            st.next_give_back = now.mono.saturating_add(GIVE_BACK_MS);
            st.last_give_back = now.mono;
            crate::sys::memory::give_back();
        }
        // Each output is looked at once: only those since the last look.
        report.outputs(&driver.take_outputs(), &registry);
        if now.mono >= report.next {
            report.rates(driver.engine(), now.mono);
        }
        if self.links.snapshots.has_changed().unwrap_or(false) {
            self.links.snapshots.borrow_and_update();
            st.snapshot = true;
            st.want_checkpoint = true;
        }
        self.commit(st, now)
    }

    /// The commit plan, and the batch it cuts to the store thread; false when that is gone.
    fn commit(&mut self, st: &mut Loop, now: crate::engine::Now) -> bool {
        let driver = &mut self.driver;
        let delivered = *self.links.delivered.borrow();
        if delivered != st.committed_delivered || st.want_checkpoint || st.bounds.is_some() {
            // Delivered outputs leave the outbox with the next commit (not urgent:
            // after a crash they are published again, and ids make that harmless);
            // an outbox over its bound is applied by a checkpoint, even with no input.
            driver.durable(now.mono);
        }
        let pending = Pending {
            held: st.held.len(),
            batch_bytes: driver.journal().map_or(0, |j| j.len()),
            quiet_for: now.mono.saturating_sub(st.last_message),
            durable: driver.has_durable(),
            interval_elapsed: driver.interval_elapsed(now.mono),
            stopping: st.stopping,
            store_ok: self.links.store_state.borrow().is_ok(),
            journal_len: st.journal_len,
            dirty_devices: u64::try_from(driver.engine().dirty_devices()).unwrap_or(u64::MAX),
            want_checkpoint: st.want_checkpoint,
            backlog: driver.backlog(),
        };
        let mut snapshot = false;
        let mut batch = match plan::plan(&pending, &self.cfg.cadence) {
            Commit::Wait => return true,
            Commit::Journal => driver.take_journal(now),
            Commit::Checkpoint => {
                st.want_checkpoint = false;
                st.last_checkpoint = now.mono;
                snapshot = std::mem::take(&mut st.snapshot);
                let mut b = driver.take_checkpoint_upto(now, STREAM_SLICE);
                b.full = std::mem::take(&mut st.full);
                b
            }
        };
        st.committed_delivered = delivered;
        let stream =
            (self.driver.engine().dirty_devices() > 0 && batch.journal.is_none()).then(|| {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                batch.rest = Some(rx);
                tx
            });
        tracing::debug!(acks = st.held.len(), outputs = batch.outputs.len(), "batch");
        let job = StoreJob {
            batch,
            acks: std::mem::take(&mut st.held),
            delivered,
            bounds: st.bounds.take(),
            last: st.stopping,
            snapshot,
        };
        // Blocks while the store is still writing the previous batch: backpressure.
        let Some(rest) = stream else {
            return self.links.store.send(job).is_ok();
        };
        if self.links.store.send(job).is_err() {
            return false;
        }
        // The rest of the checkpoint's records, a slice at a time as the store writes
        // them: nothing reaches the engine meanwhile, so they are the state it covers.
        loop {
            let slice = self.driver.take_device_slice(STREAM_SLICE);
            if slice.is_empty() || rest.send(slice).is_err() {
                return true;
            }
        }
    }
}

/// `now` held back to `proven` (monotonic), the wall clock with it.
fn credited(now: crate::engine::Now, proven: Millis) -> crate::engine::Now {
    if proven >= now.mono {
        return now;
    }
    crate::engine::Now {
        wall: now.wall.saturating_sub(now.mono - proven),
        mono: proven,
        synced: now.synced,
    }
}

/// Wakes the core every `every` ms (a reload may change it).
pub async fn wake(
    core: Sender<Inbound>,
    mut every: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let period = Duration::from_millis(*every.borrow_and_update());
        let mut iv = tokio::time::interval(period);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = iv.tick() => { let _ = core.try_send(Inbound::Wake); }
                r = every.changed() => if r.is_ok() { break },
                _ = stop.changed() => return,
            }
        }
    }
}
