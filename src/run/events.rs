//! What the components tell each other, as typed values: the store's state and
//! commits, the uplink's delivered mark, the gateway-level notices for `P/alerts`.

use serde::Serialize;

use crate::model::Millis;

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
    },
}

/// A gateway-level notice for `P/alerts` (SPEC §8, §11), published as it is by
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
