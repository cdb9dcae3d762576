//! The outbox's bounds, kept inside each commit's transaction.

use redb::ReadableTableMetadata;

use super::StoreError;

/// Drops entries until the outbox is within its bounds (`max_outbox` entries,
/// `max_bytes`) and reports within their quarter share; returns how many went.
pub(super) fn bound(
    outbox: &mut redb::Table<'_, u64, &[u8]>,
    reports: &mut redb::Table<'_, u64, ()>,
    (max_outbox, max_bytes): (u64, u64),
    bytes: &mut u64,
) -> Result<u64, StoreError> {
    let mut len = outbox.len()?;
    let mut dropped = 0;
    // Reports have a quarter of the bound, and go first when it is reached:
    // results are dropped only when no report is left (docs/reference.md#sink--the-upstream-broker).
    let share = (max_outbox / 4).max(1);
    let mut n_reports = reports.len()?;
    loop {
        let over = len > max_outbox || (*bytes > max_bytes && len > 0);
        if !over && n_reports <= share {
            break;
        }
        let removed = if n_reports > 0 {
            let Some((seq, ())) = reports.pop_first()?.map(|(k, _)| (k.value(), ())) else {
                break;
            };
            n_reports -= 1;
            outbox.remove(seq)?.map(|v| v.value().len())
        } else if over {
            outbox.pop_first()?.map(|(_, v)| v.value().len())
        } else {
            break;
        };
        if let Some(n) = removed {
            *bytes = bytes.saturating_sub(n as u64);
            len -= 1;
            dropped += 1;
        }
    }
    Ok(dropped)
}
