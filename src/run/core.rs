//! The core thread: owns the engine (through the [`Driver`]); messages and
//! wake-ups in, batches out to the store thread. Reads the clock once per
//! message and once per wake-up.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use tokio::sync::mpsc::Receiver;

use super::metrics;
use super::{Shared, StoreJob};
use crate::driver::Driver;
use crate::engine::Engine;
use crate::model::Millis;
use crate::output::{AlertType, GatewayAlert, Output};
use crate::sys::clock::SystemClock;
use crate::sys::link::Held;

/// Input of the core thread.
#[derive(Debug)]
pub enum Inbound {
    /// A message from the source; `held` is its ack token tagged with the connection.
    Message {
        /// Topic.
        topic: String,
        /// Payload.
        payload: bytes::Bytes,
        /// (connection generation, ack token) for QoS 1.
        held: Option<(u64, Held)>,
    },
    /// The source (re)connected: idleness clocks restart, processing time resumes.
    Connected,
    /// The source is down: nothing may become idle until it is back.
    Disconnected,
    /// Timer: ticks, commit cadence, metrics.
    Wake,
    /// Shut down: process what was received, final commit.
    Stop,
}

/// Messages taken per wake-up before ticks and commits are looked at.
const BURST: usize = 4096;

/// When a batch is cut sooner than `commit_interval_ms` after its first
/// durable change: when waiting would stall the input.
#[derive(Debug, Clone, Copy)]
pub struct Cadence {
    /// Held acks at which the broker stops sending (its in-flight window; v3.1.1:
    /// mosquitto's `max_inflight_messages` defaults to 20).
    pub hold_limit: usize,
    /// Held acks and no message for this long: the broker may be waiting on
    /// them (a v3.1.1 window smaller than `hold_limit`).
    pub quiet_ms: Option<Millis>,
}

/// How often freed heap is handed back to the kernel under load (window results
/// pass through in bursts) ...
const GIVE_BACK_MS: Millis = 5_000;
/// ... and how long the input must have been quiet for it to be handed back at once.
const GIVE_BACK_QUIET_MS: Millis = 1_000;

/// Journal bytes in one batch at which it is cut at once (a backlog burst).
const BATCH_BYTES: usize = 1 << 20;
/// Journal bytes on disk since the last checkpoint at which the next batch is
/// a checkpoint (bounds the journal, and the replay at the next start) ...
const CHECKPOINT_BYTES: u64 = 4 << 20;
/// ... unless the checkpoint would write more: about this many bytes per changed device ...
const DEVICE_BYTES: u64 = 1024;
/// ... up to this much journal.
const CHECKPOINT_MAX_BYTES: u64 = 16 << 20;

/// Runs until `Stop` or until every sender is gone.
#[allow(clippy::too_many_arguments)]
pub fn run(
    mut driver: Driver,
    clock: SystemClock,
    mut rx: Receiver<Inbound>,
    store_tx: SyncSender<StoreJob>,
    shared: Arc<Shared>,
    metrics_every_ms: Millis,
    cadence: Cadence,
    commands: crate::sys::link::Client,
) {
    let mut held: Vec<(u64, Held, Millis)> = Vec::new();
    let mut last_message = clock.mono();
    let mut source_up = false;
    let mut next_metrics = clock.mono().saturating_add(metrics_every_ms);
    let mut next_prometheus = clock.mono();
    let mut committed_delivered = shared.delivered.load(Ordering::Acquire);
    let mut stopping = false;
    let mut report = Report::new(clock.mono());
    let mut reported = 0;
    let mut next_give_back = clock.mono().saturating_add(GIVE_BACK_MS);
    let mut last_give_back = clock.mono();
    // Counters are totals since the state was created: rates start from the restored ones.
    report.rates(driver.engine(), clock.mono());
    while !stopping {
        let Some(first) = rx.blocking_recv() else {
            break;
        };
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(msg) = next.take() {
            match msg {
                Inbound::Message {
                    topic,
                    payload,
                    held: h,
                } => {
                    let now = clock.now();
                    if !source_up {
                        // A message proves the link is up (an ordering race with `Connected`).
                        source_up = true;
                        shared.health.source(true, now.mono);
                        driver.start(now);
                    }
                    driver.skip_missed_ticks(now);
                    driver.message(now, &topic, &payload);
                    for (topic, payload) in driver.engine_mut().take_commands() {
                        match commands.publish(&topic, payload, 0, false) {
                            Ok(()) => tracing::info!(%topic, "Sparkplug rebirth requested"),
                            Err(e) => {
                                tracing::warn!(%topic, error = %e, "Sparkplug rebirth request not sent")
                            }
                        }
                    }
                    shared.received.fetch_add(1, Ordering::Relaxed);
                    held.extend(h.map(|(g, t)| (g, t, now.mono)));
                    last_message = now.mono;
                }
                Inbound::Connected => {
                    source_up = true;
                    let now = clock.now();
                    shared.health.source(true, now.mono);
                    driver.start(now);
                }
                Inbound::Disconnected => {
                    source_up = false;
                    shared.health.source(false, clock.mono());
                }
                Inbound::Wake => {}
                Inbound::Stop => stopping = true,
            }
            taken += 1;
            if taken < BURST && !stopping {
                next = rx.try_recv().ok();
            }
        }
        let now = clock.now();
        shared.health.core_beat(now.mono);
        if source_up {
            driver.skip_missed_ticks(now);
            driver.ticks_until(now);
        }
        if driver.engine().clock_held() != report.clock_held {
            report.clock_held = driver.engine().clock_held();
            if report.clock_held {
                tracing::warn!(
                    wall_ms = now.wall,
                    "gateway wall clock is before time.min_valid_epoch_ms (no RTC, NTP not synced?): processing time held"
                );
            } else {
                tracing::info!(
                    wall_ms = now.wall,
                    "gateway wall clock plausible again: processing time resumes"
                );
            }
        }
        if now.mono >= next_metrics {
            next_metrics = now.mono.saturating_add(metrics_every_ms);
            let m = metrics::collect(driver.engine(), now, &shared, source_up);
            let _ = shared.metrics_tx.send(m.encode(shared.format));
        }
        if shared.http && now.mono >= next_prometheus {
            // Scrapes read the latest text: fresh to the second, never blocking the engine.
            next_prometheus = now.mono.saturating_add(1000);
            let m = metrics::collect(driver.engine(), now, &shared, source_up);
            shared.health.set_prometheus(m.prometheus());
        }
        let quiet = now.mono.saturating_sub(last_message) >= GIVE_BACK_QUIET_MS;
        if now.mono >= next_give_back || (quiet && last_message > last_give_back) {
            next_give_back = now.mono.saturating_add(GIVE_BACK_MS);
            last_give_back = now.mono;
            crate::sys::memory::give_back();
        }
        // Each output is looked at once: only those since the last look.
        report.outputs(&driver.outputs[reported..]);
        reported = driver.outputs.len();
        if now.mono >= report.next {
            report.rates(driver.engine(), now.mono);
        }
        let delivered = shared.delivered.load(Ordering::Acquire);
        if delivered != committed_delivered {
            // Delivered outputs leave the outbox with the next commit (not urgent:
            // after a crash they are published again, and ids make that harmless).
            driver.durable(now.mono);
        }
        if shared.want_checkpoint.load(Ordering::Relaxed) {
            // The outbox is over its bound: a checkpoint applies it, even with no input.
            driver.durable(now.mono);
        }
        let journal = driver.journal().map_or(0, |j| j.len());
        let urgent = held.len() >= cadence.hold_limit
            || journal >= BATCH_BYTES
            || cadence
                .quiet_ms
                .is_some_and(|q| !held.is_empty() && now.mono.saturating_sub(last_message) >= q);
        // While the store cannot commit, the driver keeps what would be the next
        // batch (the source is paused, so it stays small) and the core keeps ticking.
        let store_ok = !shared.store_blocked.load(Ordering::Acquire);
        if (store_ok && driver.has_durable() && (urgent || driver.commit_due(now.mono))) || stopping
        {
            committed_delivered = delivered;
            let dirty = u64::try_from(driver.engine().dirty_devices()).unwrap_or(u64::MAX);
            let checkpoint = stopping
                || shared.want_checkpoint.swap(false, Ordering::Relaxed)
                || shared.journal_len.load(Ordering::Relaxed)
                    >= CHECKPOINT_BYTES
                        .max(dirty.saturating_mul(DEVICE_BYTES))
                        .min(CHECKPOINT_MAX_BYTES);
            let batch = if checkpoint {
                driver.take_checkpoint(now)
            } else {
                driver.take_journal(now)
            };
            reported = 0;
            tracing::debug!(acks = held.len(), outputs = batch.outputs.len(), "batch");
            let job = StoreJob {
                batch,
                acks: std::mem::take(&mut held),
                last: stopping,
            };
            // Blocks while the store is still writing the previous batch: backpressure.
            if store_tx.send(job).is_err() {
                break;
            }
        }
    }
}

/// What an operator should see in the log: clock distrust as it happens, and
/// late/rejected rates once a minute when there were any.
struct Report {
    next: Millis,
    late: u64,
    rejected: u64,
    duplicates: u64,
    missing: u64,
    /// Devices' missing counts at the last report (only those with any).
    missing_by_device: std::collections::HashMap<(String, String), u64>,
    clock_held: bool,
    /// The first call only takes the restored totals.
    started: bool,
}

const REPORT_EVERY_MS: Millis = 60_000;

impl Report {
    fn new(mono: Millis) -> Self {
        Self {
            next: mono.saturating_add(REPORT_EVERY_MS),
            late: 0,
            rejected: 0,
            duplicates: 0,
            missing: 0,
            missing_by_device: std::collections::HashMap::new(),
            clock_held: false,
            started: false,
        }
    }

    fn outputs(&self, outputs: &[Output]) {
        for o in outputs {
            if let Output::Gateway(g) = o {
                match g {
                    GatewayAlert::Clock {
                        error_ms,
                        devices_agreeing,
                        ..
                    } => tracing::warn!(
                        error_ms,
                        devices_agreeing,
                        "gateway clock wrong (kernel reports it unsynchronized): event times follow the devices' consensus"
                    ),
                    GatewayAlert::ClockOk { .. } => {
                        tracing::info!("gateway clock agrees with the devices again");
                    }
                }
            }
            if let Output::Alert(a) = o {
                match a.kind {
                    AlertType::ClockSkew => tracing::warn!(
                        group = %a.group, device = %a.device, offset_ms = a.offset_ms,
                        "device clock distrusted: arrival time used"
                    ),
                    AlertType::ClockOk => tracing::info!(
                        group = %a.group, device = %a.device, offset_ms = a.offset_ms,
                        "device clock trusted again"
                    ),
                    AlertType::Offline => tracing::info!(
                        group = %a.group, device = %a.device, last_seen = a.last_seen,
                        "device offline"
                    ),
                    AlertType::Online => {}
                }
            }
        }
    }

    fn rates(&mut self, engine: &Engine, mono: Millis) {
        self.next = mono.saturating_add(REPORT_EVERY_MS);
        let c = engine.counters();
        let rejected: u64 = c.rejected.iter().sum();
        let (late, rej, dup) = (
            c.late.saturating_sub(self.late),
            rejected.saturating_sub(self.rejected),
            c.duplicates.saturating_sub(self.duplicates),
        );
        if self.started && late + rej > 0 {
            tracing::warn!(late, rejected = rej, duplicates = dup, "in the last minute");
        }
        (self.late, self.rejected, self.duplicates) = (c.late, rejected, c.duplicates);
        if self.started && c.readings_missing > self.missing {
            self.report_missing(engine, c.readings_missing - self.missing);
        } else if !self.started {
            self.remember_missing(engine);
        }
        self.missing = c.readings_missing;
        self.started = true;
    }

    fn remember_missing(&mut self, engine: &Engine) -> Vec<(u64, String)> {
        let mut grew = Vec::new();
        for g in engine.groups() {
            for d in engine.group_devices(&g.name).filter(|d| d.missing > 0) {
                let key = (d.group.to_string(), d.id.to_string());
                let before = self.missing_by_device.insert(key, d.missing).unwrap_or(0);
                if d.missing > before {
                    grew.push((d.missing - before, format!("{}/{}", d.group, d.id)));
                }
            }
        }
        grew
    }

    /// One line naming the devices that lost the most in the last minute.
    fn report_missing(&mut self, engine: &Engine, missing: u64) {
        let mut grew = self.remember_missing(engine);
        grew.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let worst: Vec<String> = grew
            .iter()
            .take(5)
            .map(|(n, d)| format!("{d} {n}"))
            .collect();
        tracing::warn!(
            missing,
            devices = grew.len(),
            worst = %worst.join(", "),
            "readings missing before the gateway in the last minute (sequence gaps: a site broker or radio link dropping messages?)"
        );
    }
}
