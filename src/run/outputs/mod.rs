//! What leaves the gateway: the upstream MQTT sink, the Sparkplug edge node,
//! and the outbox's delivery rules they share.

pub mod database;
pub mod delivery;
pub mod mqtt;
pub mod sparkplug;

use std::time::Duration;

use crate::store::{OutboxEntry, OutboxReader};

/// How often a fenced link looks at its proof again.
const FENCE_LOOK: Duration = Duration::from_millis(50);

/// Outbox entries read per backlog step.
const BACKLOG_READ: usize = 512;

/// Up to a backlog step of outbox entries after `after`, read off the async threads.
async fn read_from(
    reader: &OutboxReader,
    after: Option<u64>,
) -> Result<Vec<(u64, OutboxEntry)>, crate::store::StoreError> {
    let r = reader.clone();
    tokio::task::spawn_blocking(move || r.outbox_after(after, BACKLOG_READ))
        .await
        .unwrap_or_else(|e| {
            Ok({
                tracing::error!(error = %e, "outbox reader task failed");
                Vec::new()
            })
        })
}

/// The sequence number of the outbox's oldest entry: where an output starts.
async fn first_entry(reader: &OutboxReader) -> Option<u64> {
    match read_from(reader, None).await {
        Ok(v) => v.first().map(|(s, _)| *s),
        Err(e) => {
            tracing::error!(error = %e, "reading the outbox");
            None
        }
    }
}
