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
use crate::model::Millis;

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
    let mut committed_delivered = shared.delivered.load(Ordering::Acquire);
    let mut stopping = false;
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
                        driver.start(now);
                    }
                    driver.skip_missed_ticks(now);
                    driver.message(now, &topic, &payload);
                    shared.received.fetch_add(1, Ordering::Relaxed);
                    held.extend(h);
                }
                Inbound::Connected => {
                    source_up = true;
                    driver.start(clock.now());
                }
                Inbound::Disconnected => source_up = false,
                Inbound::Wake => {}
                Inbound::Stop => stopping = true,
            }
            taken += 1;
            if taken < BURST && !stopping {
                next = rx.try_recv().ok();
            }
        }
        let now = clock.now();
        if source_up {
            driver.skip_missed_ticks(now);
            driver.ticks_until(now);
        }
        if now.mono >= next_metrics {
            next_metrics = now.mono.saturating_add(metrics_every_ms);
            let payload = metrics::snapshot(driver.engine(), now, &shared, source_up);
            let _ = shared.metrics_tx.send(payload);
        }
        let delivered = shared.delivered.load(Ordering::Acquire);
        let work = !held.is_empty()
            || !driver.outputs.is_empty()
            || driver.engine().has_changes()
            || delivered != committed_delivered;
        if (work && driver.commit_due(now.mono)) || stopping {
            committed_delivered = delivered;
            let batch = driver.take_batch(now);
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
