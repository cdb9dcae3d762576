//! The store thread: commits each batch in one redb transaction (redb never
//! runs on an async thread), then releases the batch's acks to the source and
//! its outputs to the sink — in that order, only after the commit.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use tokio::sync::mpsc::UnboundedSender;

use super::link::Held;
use super::sink::SinkMsg;
use super::{Shared, StoreJob};
use crate::store::{Store, StoreError};

/// Work for the ack task.
#[derive(Debug)]
pub enum AckJob {
    /// Acks of committed messages, in receive order, tagged with their connection.
    Acks(Vec<(u64, Held)>),
    /// The final commit is done: flush and disconnect the source.
    Done,
}

/// Runs until the last batch or until the core is gone.
pub fn run(
    mut store: Store,
    rx: Receiver<StoreJob>,
    acks: UnboundedSender<AckJob>,
    sink: UnboundedSender<SinkMsg>,
    shared: Arc<Shared>,
) -> Result<(), StoreError> {
    while let Ok(mut job) = rx.recv() {
        let delivered = shared.delivered.load(Ordering::Acquire);
        job.batch.delivered = delivered.checked_sub(1);
        shared.health.committing(true);
        let stats = store.commit(&job.batch)?;
        shared.health.committing(false);
        shared.outbox_depth.store(stats.depth, Ordering::Relaxed);
        shared
            .outbox_oldest
            .store(stats.oldest_at.unwrap_or(0), Ordering::Relaxed);
        shared
            .outbox_dropped
            .store(store.outbox_dropped(), Ordering::Relaxed);
        if stats.dropped > 0 {
            tracing::warn!(
                dropped = stats.dropped,
                limit = shared.outbox_max,
                "outbox full: oldest outputs dropped"
            );
        }
        if !job.acks.is_empty() {
            let _ = acks.send(AckJob::Acks(std::mem::take(&mut job.acks)));
        }
        if !job.batch.outputs.is_empty() {
            let live: Vec<_> = std::mem::take(&mut job.batch.outputs)
                .into_iter()
                .zip(stats.first_seq..)
                .map(|(e, seq)| (seq, e))
                .collect();
            let _ = sink.send(SinkMsg::Live(live));
        }
        if job.last {
            let _ = acks.send(AckJob::Done);
            let _ = sink.send(SinkMsg::Stop);
            break;
        }
    }
    Ok(())
}
