//! Why `run` ends with exit code 1.

use crate::store::StoreError;
use crate::sys::broker;
use crate::sys::link::LinkError;

/// Why the gateway stopped with exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The state store failed (unreadable file, disk error).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A connection could not be set up (TLS material).
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The async runtime or a thread could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// Restoring the state did not finish (its thread panicked).
    #[error("restoring the state: {0}")]
    Restore(#[from] tokio::task::JoinError),
    /// The local HTTP endpoint could not listen.
    #[error("metrics.listen {addr}: {source}")]
    Listen {
        /// `metrics.listen`.
        addr: std::net::SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The site broker refuses the probe topic (an ACL): docs/reference.md#group_defaults-and-groupsname.
    #[error(
        "the source broker refused to let the gateway {what} source.probe_topic {topic:?}: allow it (read and write) in the broker's ACL, or set source.probe_after_ms = 0 to turn probes off"
    )]
    ProbeRefused {
        /// The probe topic.
        topic: String,
        /// "subscribe to" or "publish to".
        what: String,
    },
    /// The embedded broker did not start.
    #[error(transparent)]
    Broker(#[from] broker::BrokerError),
    /// The standby pair's link or state (docs/reference.md#standby--two-boards-one-gateway).
    #[error("standby pair: {0}")]
    Pair(String),
    /// Another board of the pair claimed the gateway with a newer epoch: this
    /// one stops publishing and rejoins as standby.
    #[error("deposed by board {node:?} (epoch {epoch})")]
    Deposed {
        /// The board now active.
        node: String,
        /// Its epoch.
        epoch: u64,
    },
}
