//! The ack task: acks of committed messages go out in receive order on the
//! connection they came on.

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

use crate::run::events::{AckJob, Current};

/// Sends acks in receive order on the current connection; a token from an
/// earlier one is dropped (the broker redelivers that message, and seq
/// deduplication makes it harmless). Counts every token it dealt with.
pub async fn acks(
    mut rx: UnboundedReceiver<AckJob>,
    current: watch::Receiver<Current>,
    acked: watch::Sender<u64>,
    flushed: watch::Sender<bool>,
) {
    while let Some(job) = rx.recv().await {
        match job {
            AckJob::Acks(list) => {
                let (generation, client) = current.borrow().clone();
                let n = u64::try_from(list.len()).unwrap_or(u64::MAX);
                let mut stale = 0u64;
                for (g, held) in list {
                    if g != generation {
                        stale += 1;
                        continue;
                    }
                    if let Err(e) = client.ack(&held).await {
                        tracing::warn!(error = %e, "ack not sent; the broker will redeliver");
                    }
                }
                if stale > 0 {
                    tracing::debug!(stale, "acks of an earlier connection dropped");
                }
                acked.send_modify(|a| *a += n);
            }
            AckJob::Done => break,
        }
    }
    let _ = flushed.send(true);
}
