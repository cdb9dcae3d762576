//! The core thread: owns the engine (through the [`Driver`]); messages and
//! wake-ups in, batches out to the store thread. Reads the clock once per
//! message and once per wake-up.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use tokio::sync::mpsc::Receiver;

use super::clock::SystemClock;
use super::link::Held;
use super::metrics;
use super::{Shared, StoreJob};
use crate::driver::Driver;
use crate::engine::Engine;
use crate::model::Millis;
use crate::output::{AlertType, Output};

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

/// Runs until `Stop` or until every sender is gone.
pub fn run(
    mut driver: Driver,
    clock: SystemClock,
    mut rx: Receiver<Inbound>,
    store_tx: SyncSender<StoreJob>,
    shared: Arc<Shared>,
    metrics_every_ms: Millis,
) {
    let mut held: Vec<(u64, Held)> = Vec::new();
    let mut source_up = false;
    let mut next_metrics = clock.mono().saturating_add(metrics_every_ms);
    let mut next_prometheus = clock.mono();
    let mut committed_delivered = shared.delivered.load(Ordering::Acquire);
    let mut stopping = false;
    let mut report = Report::new(clock.mono());
    let mut reported = 0;
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
                    shared.received.fetch_add(1, Ordering::Relaxed);
                    held.extend(h);
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
        // Each output is looked at once: only those since the last look.
        report.outputs(&driver.outputs[reported..]);
        reported = driver.outputs.len();
        if now.mono >= report.next {
            report.rates(driver.engine(), now.mono);
        }
        let delivered = shared.delivered.load(Ordering::Acquire);
        let work = !held.is_empty()
            || !driver.outputs.is_empty()
            || driver.engine().has_changes()
            || delivered != committed_delivered;
        if (work && driver.commit_due(now.mono)) || stopping {
            committed_delivered = delivered;
            let batch = driver.take_batch(now);
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
            clock_held: false,
            started: false,
        }
    }

    fn outputs(&self, outputs: &[Output]) {
        for o in outputs {
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
        self.started = true;
    }
}
