//! When the core cuts a batch, and which kind (docs/reference.md#guarantees group commit): a pure
//! function of what is pending, beside [`crate::run::outputs::delivery`] for the uplink.

use crate::model::Millis;

/// When a batch is cut sooner than `commit_interval_ms` after its first
/// durable change: when waiting would stall the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// Held acks at which the broker stops sending (its in-flight window; v3.1.1:
    /// mosquitto's `max_inflight_messages` defaults to 20).
    pub hold_limit: usize,
    /// Held acks and no message for this long: the broker may be waiting on
    /// them (a v3.1.1 window smaller than `hold_limit`).
    pub quiet_ms: Option<Millis>,
}

impl Cadence {
    /// The cadence a source protocol needs.
    pub fn of(v5: bool) -> Self {
        if v5 {
            // The broker honours our Receive Maximum (65535).
            Self {
                hold_limit: 4096,
                quiet_ms: None,
            }
        } else {
            Self {
                hold_limit: 20,
                quiet_ms: Some(100),
            }
        }
    }
}

/// Device records per slice of a streamed checkpoint (~2 MB at 100 000 devices with 10 s
/// windows); debug builds stream every checkpoint of more than a few devices, so the
/// tests (a full disk among them) take the streamed path.
pub const STREAM_SLICE: usize = if cfg!(debug_assertions) { 4 } else { 4096 };

/// Journal bytes in one batch at which it is cut at once (a backlog burst).
pub const BATCH_BYTES: usize = 1 << 20;
/// Journal bytes on disk since the last checkpoint at which the next batch is
/// a checkpoint (bounds the journal, and the replay at the next start) ...
pub const CHECKPOINT_BYTES: u64 = 4 << 20;
/// ... unless the checkpoint would write more: about this many bytes per changed device ...
pub const DEVICE_BYTES: u64 = 1024;
/// ... up to this much journal.
pub const CHECKPOINT_MAX_BYTES: u64 = 16 << 20;

/// What the core holds at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    /// QoS 1 acks held.
    pub held: usize,
    /// Journal bytes of the batch so far.
    pub batch_bytes: usize,
    /// Time since the last message.
    pub quiet_for: Millis,
    /// Something must become durable (input, outputs, a delivered mark).
    pub durable: bool,
    /// `commit_interval_ms` has passed since the last batch.
    pub interval_elapsed: bool,
    /// The gateway is stopping: the last batch.
    pub stopping: bool,
    /// The state store commits.
    pub store_ok: bool,
    /// Journal bytes on disk since the last checkpoint.
    pub journal_len: u64,
    /// Devices changed since the last checkpoint.
    pub dirty_devices: u64,
    /// The store asked for a checkpoint (the outbox is over its bound).
    pub want_checkpoint: bool,
    /// A tick stopped at its budget: its slice goes to the store before the next one.
    pub backlog: bool,
}

/// The core's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Keep collecting.
    Wait,
    /// A journal record.
    Journal,
    /// A checkpoint of the changed state.
    Checkpoint,
}

/// The one commit rule of `run`.
pub fn plan(p: &Pending, c: &Cadence) -> Commit {
    let urgent = p.held >= c.hold_limit
        || p.backlog
        || p.batch_bytes >= BATCH_BYTES
        || c.quiet_ms.is_some_and(|q| p.held > 0 && p.quiet_for >= q);
    let due = p.durable && (urgent || p.interval_elapsed);
    // While the store cannot commit, the next batch stays with the driver (the
    // source is paused, so it stays small); a stop cuts it anyway.
    if !(p.stopping || p.store_ok && due) {
        return Commit::Wait;
    }
    let bound = CHECKPOINT_BYTES
        .max(p.dirty_devices.saturating_mul(DEVICE_BYTES))
        .min(CHECKPOINT_MAX_BYTES);
    if p.stopping || p.want_checkpoint || p.journal_len >= bound {
        Commit::Checkpoint
    } else {
        Commit::Journal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending() -> Pending {
        Pending {
            store_ok: true,
            durable: true,
            ..Pending::default()
        }
    }

    #[test]
    fn nothing_durable_waits_even_when_the_interval_passed() {
        let p = Pending {
            durable: false,
            interval_elapsed: true,
            ..pending()
        };
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Wait);
    }

    #[test]
    fn durable_work_is_cut_once_the_interval_passed() {
        let p = pending();
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Wait);
        let p = Pending {
            interval_elapsed: true,
            ..pending()
        };
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Journal);
    }

    #[test]
    fn held_acks_at_the_brokers_window_cut_at_once_for_each_protocol() {
        for v5 in [true, false] {
            let c = Cadence::of(v5);
            let below = Pending {
                held: c.hold_limit - 1,
                ..pending()
            };
            assert_eq!(plan(&below, &c), Commit::Wait, "v5 {v5}");
            let at = Pending {
                held: c.hold_limit,
                ..pending()
            };
            assert_eq!(plan(&at, &c), Commit::Journal, "v5 {v5}");
        }
    }

    #[test]
    fn a_quiet_v311_link_with_held_acks_is_not_kept_waiting() {
        let c = Cadence::of(false);
        let p = Pending {
            held: 3,
            quiet_for: 100,
            ..pending()
        };
        assert_eq!(plan(&p, &c), Commit::Journal);
        let p = Pending { quiet_for: 99, ..p };
        assert_eq!(plan(&p, &c), Commit::Wait);
        // v5 never waits on the broker's window.
        let p = Pending {
            quiet_for: 10_000,
            ..p
        };
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Wait);
    }

    #[test]
    fn a_slice_of_a_window_close_burst_is_cut_at_once() {
        let p = Pending {
            backlog: true,
            ..pending()
        };
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Journal);
        assert_eq!(
            plan(
                &Pending {
                    backlog: false,
                    ..p
                },
                &Cadence::of(true)
            ),
            Commit::Wait
        );
    }

    #[test]
    fn a_burst_past_the_batch_bound_is_cut_at_once() {
        let p = Pending {
            batch_bytes: BATCH_BYTES,
            ..pending()
        };
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Journal);
    }

    #[test]
    fn a_blocked_store_keeps_the_batch_until_the_stop() {
        let p = Pending {
            store_ok: false,
            interval_elapsed: true,
            held: 10_000,
            ..pending()
        };
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Wait);
        let p = Pending {
            stopping: true,
            ..p
        };
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Checkpoint);
    }

    #[test]
    fn the_journal_bound_grows_with_the_changed_devices_up_to_its_cap() {
        let due = Pending {
            interval_elapsed: true,
            ..pending()
        };
        for (dirty, len, want) in [
            (0, CHECKPOINT_BYTES - 1, Commit::Journal),
            (0, CHECKPOINT_BYTES, Commit::Checkpoint),
            (10_000, CHECKPOINT_BYTES, Commit::Journal),
            (10_000, 10_000 * DEVICE_BYTES, Commit::Checkpoint),
            (1_000_000, CHECKPOINT_MAX_BYTES - 1, Commit::Journal),
            (1_000_000, CHECKPOINT_MAX_BYTES, Commit::Checkpoint),
        ] {
            let p = Pending {
                dirty_devices: dirty,
                journal_len: len,
                ..due
            };
            assert_eq!(
                plan(&p, &Cadence::of(true)),
                want,
                "dirty {dirty} len {len}"
            );
        }
        let p = Pending {
            want_checkpoint: true,
            ..due
        };
        assert_eq!(plan(&p, &Cadence::of(true)), Commit::Checkpoint);
    }
}
