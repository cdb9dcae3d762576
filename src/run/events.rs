//! What the components tell each other, as typed values: input for the core,
//! batches for the store and acks for the source, the store's state and commits,
//! the connection acks go to, the gateway-level notices for `P/alerts`.

use serde::Serialize;

use crate::config::Config;
use crate::model::Millis;
use crate::store::Batch;
use crate::sys::link::{Client, Held};

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
    /// One of the gateway's probes came back: the path is proven now (docs/reference.md#group_defaults-and-groupsname).
    Proven,
    /// Timer: ticks, commit cadence, metrics.
    Wake,
    /// A reload's validated config (the engine's rules from the next message
    /// on), or the stop: process what was received, final commit.
    Control(Control<Box<Config>>),
    /// State outside the windows to keep in the state store (a remote document id
    /// taken, the edge node's next session).
    Mark(crate::journal::Mark),
    /// An entry a database output refused: published on `P/rejected` (docs/reference.md#sinkpostgres-and-sinkinflux).
    SetAside(Box<crate::output::Refused>),
    /// A live status question (docs/reference.md#reload-sighup-systemctl-reload-tidemark), answered between two messages.
    Query(
        crate::run::status::api::Query,
        tokio::sync::oneshot::Sender<crate::run::status::api::Answer>,
    ),
}

/// The connection the acks must use: its generation and client. Tokens of an
/// older generation are void (the broker redelivers those messages).
pub type Current = (u64, Client);

/// Work for the ack task.
#[derive(Debug)]
pub enum AckJob {
    /// Acks of committed messages, in receive order, tagged with their connection.
    Acks(Vec<(u64, Held)>),
    /// The final commit is done: flush and disconnect the source.
    Done,
}

/// Outbox bounds a reload hands to the store thread with the next batch.
pub use crate::config::OutboxBounds;

/// A batch for the store thread and the acks it releases.
pub struct StoreJob {
    /// What to commit.
    pub batch: Batch,
    /// Acks of the messages the batch covers, in receive order, with the
    /// monotonic time each message was taken.
    pub acks: Vec<(u64, Held, Millis)>,
    /// One past the highest outbox entry acknowledged upstream when the batch was cut.
    pub delivered: u64,
    /// New outbox bounds (a reload).
    pub bounds: Option<OutboxBounds>,
    /// The final batch of a graceful stop.
    pub last: bool,
    /// A standby asked for a snapshot: read the state file after this checkpoint.
    pub snapshot: bool,
}

/// One durable commit, to the pair task (docs/reference.md#standby--two-boards-one-gateway): it replicates the record
/// and releases the acks once the standby has it.
pub struct PairCommit {
    /// The commit's position in this run.
    pub pos: u64,
    /// Its journal record body.
    pub body: Vec<u8>,
    /// The state file right after it (a standby asked for one).
    pub snapshot: Option<Vec<u8>>,
    /// The acks it releases, with the monotonic time each message was taken.
    pub acks: Vec<(u64, Held, Millis)>,
    /// The final commit of a graceful stop.
    pub last: bool,
}

/// The state store's health, as a `watch` value: the core stops cutting
/// batches and the source stops taking messages while it is `Blocked`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreState {
    /// Commits succeed.
    Ok,
    /// Commits fail (a full disk): why.
    Blocked(String),
}

impl StoreState {
    /// Commits succeed.
    pub fn is_ok(&self) -> bool {
        matches!(self, StoreState::Ok)
    }
}

/// The store thread to the core, after each write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreEvent {
    /// A batch is durable.
    Committed {
        /// Journal bytes on disk since the last checkpoint.
        journal_len: u64,
        /// The outbox is over its bound: the next batch should be a checkpoint (it applies it).
        over_bound: bool,
        /// Streamed checkpoints that failed so far: each one higher asks for a checkpoint of all state.
        redo: u64,
    },
}

/// A gateway-level notice for `P/alerts` (docs/reference.md#topics-and-payloads-upstream), published as it is by
/// the sink (the state store may be what it is about), encoded in its format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Notice {
    /// The state store cannot commit.
    StateStore {
        /// Why.
        detail: String,
        /// Gateway clock.
        at: Millis,
    },
    /// The state store commits again.
    StateStoreOk {
        /// Gateway clock.
        at: Millis,
    },
    /// A reload was applied.
    ConfigApplied {
        /// `config_hash` of the new config.
        hash: String,
        /// Dotted keys that changed.
        changed: Vec<String>,
        /// Gateway clock.
        at: Millis,
    },
    /// A reload was refused; nothing changed.
    ConfigRejected {
        /// One line per problem, naming the key.
        errors: Vec<String>,
        /// Gateway clock.
        at: Millis,
    },
    /// This board took over from a dead active (docs/reference.md#standby--two-boards-one-gateway).
    Takeover {
        /// This board.
        node: String,
        /// The board it replaced.
        from: String,
        /// The new epoch.
        epoch: u64,
        /// The last record it had synced from the old active.
        position: u64,
        /// Gateway clock.
        at: Millis,
    },
    /// The standby stopped answering (or fell behind): the active runs alone.
    StandbyLost {
        /// The standby.
        node: String,
        /// Gateway clock.
        at: Millis,
    },
    /// A standby has every record: acks wait for it again.
    StandbyJoined {
        /// The standby.
        node: String,
        /// Gateway clock.
        at: Millis,
    },
}

/// What a component is told besides its data: each component takes this one
/// enum for its section's reload and for its stop.
#[derive(Debug)]
pub enum Control<C> {
    /// Apply these settings of its section (a reload, a remote document).
    Reload(C),
    /// Finish: the source disconnects once its last acks are out; an output
    /// drains what the last commit made, then goes offline.
    Stop,
}

/// What every component is built with besides its section and its channels.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Counters and gauges.
    pub registry: std::sync::Arc<crate::run::status::registry::Registry>,
    /// The clocks.
    pub clock: crate::sys::clock::SystemClock,
    /// This run's seed (backoff jitter, stream and session ids).
    pub seed: u64,
    /// Wall time the gateway started (its status and Sparkplug host STATE).
    pub started_at: crate::model::Millis,
    /// A board of a pair acts only on a fresh proof of the claim.
    pub fence: crate::run::fence::Fence,
}

/// What the source and the sink tell the control component (docs/reference.md#remote-configuration-fleet):
/// its decisions wait on these, not on counters.
#[derive(Debug)]
pub enum ControlEvent {
    /// A remote document arrived on `P/config/set` or `P/config/desired`.
    Document(crate::fleet::Via, Vec<u8>),
    /// A link is up (the source subscribed, the sink connected) or down.
    Link(Side, bool),
}

/// One of the gateway's two links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// To the site broker.
    Source,
    /// To the upstream broker.
    Sink,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_have_the_shapes_of_the_contract() {
        let j = |n: &Notice| serde_json::to_value(n).unwrap();
        assert_eq!(
            j(&Notice::ConfigApplied {
                hash: "ab".into(),
                changed: vec!["time.max_age_ms".into()],
                at: 5
            }),
            serde_json::json!({"type": "config_applied", "hash": "ab", "changed": ["time.max_age_ms"], "at": 5})
        );
        assert_eq!(
            j(&Notice::ConfigRejected {
                errors: vec!["x: bad".into()],
                at: 5
            }),
            serde_json::json!({"type": "config_rejected", "errors": ["x: bad"], "at": 5})
        );
        assert_eq!(
            j(&Notice::StateStore {
                detail: "disk full".into(),
                at: 1
            }),
            serde_json::json!({"type": "state_store", "detail": "disk full", "at": 1})
        );
        assert_eq!(
            j(&Notice::StateStoreOk { at: 2 }),
            serde_json::json!({"type": "state_store_ok", "at": 2})
        );
    }
}
