//! `[standby]`: this board's part in a pair and the pair's key (docs/reference.md,
//! "Two boards").

use serde::{Deserialize, Serialize};

use super::checks::Problems;

/// `[standby]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawStandby {
    /// This board is one of a pair sharing `gateway.id`.
    pub enabled: bool,
    /// This board's name in the pair: `[A-Za-z0-9_-]{1,32}`.
    pub node: String,
    /// Silence of the active on the pair's topics after which it is declared dead.
    pub takeover_s: u64,
    /// The pair's shared secret: base64 of 32 random bytes (a second line during a change).
    pub key_file: String,
    /// The most one pair message, a reassembled record or snapshot may hold (MiB).
    pub max_frame_mib: u64,
}

impl Default for RawStandby {
    fn default() -> Self {
        Self {
            enabled: false,
            node: String::new(),
            takeover_s: 10,
            key_file: String::new(),
            max_frame_mib: 16,
        }
    }
}

/// `[standby]`: this board's part in a pair (docs/reference.md#standby--two-boards-one-gateway); None when off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standby {
    /// This board's name in the pair.
    pub node: String,
    /// Silence of the active after which it is declared dead.
    pub takeover_ms: crate::model::Millis,
    /// The pair key(s) read from `key_file`.
    pub keys: crate::pair::auth::Keys,
    /// The most one message or reassembled item may hold (bytes).
    pub max_frame: usize,
}

impl Standby {
    pub(super) fn validate(
        p: &mut Problems,
        (s, broker): (&RawStandby, &super::gateway::RawBroker),
    ) -> Option<Self> {
        let node_ok = !s.node.is_empty()
            && s.node.len() <= 32
            && s.node
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if (s.enabled || !s.node.is_empty()) && !node_ok {
            p.add(
                "standby.node",
                format!(
                    "{:?} must be 1..32 chars of [A-Za-z0-9_-] (this board's name in the pair, e.g. \"a\")",
                    s.node
                ),
            );
        }
        if s.takeover_s == 0 || s.takeover_s > 3600 {
            p.add("standby.takeover_s", "must be 1..=3600");
        }
        if s.enabled && broker.embedded {
            p.add(
                "standby.enabled",
                "a pair cannot use the embedded broker ([broker] embedded = true): the site broker must outlive either board",
            );
        }
        if s.max_frame_mib == 0 || s.max_frame_mib > 1024 {
            p.add("standby.max_frame_mib", "must be 1..=1024");
        }
        if !s.enabled {
            return None;
        }
        let keys = if s.key_file.is_empty() {
            p.add(
                "standby.key_file",
                "is required with standby.enabled: the same key file on both boards (`tidemark pair keygen --out FILE`)",
            );
            None
        } else {
            match std::fs::read_to_string(&s.key_file) {
                Ok(text) => match crate::pair::auth::Keys::parse(&text) {
                    Ok(k) => Some(k),
                    Err(e) => {
                        p.add("standby.key_file", format!("{:?}: {e}", s.key_file));
                        None
                    }
                },
                Err(e) => {
                    p.add(
                        "standby.key_file",
                        format!("cannot read {:?}: {e}", s.key_file),
                    );
                    None
                }
            }
        };
        Some(Self {
            node: s.node.clone(),
            takeover_ms: i64::try_from(s.takeover_s.min(3600) * 1000).unwrap_or(10_000),
            keys: keys?,
            max_frame: usize::try_from(s.max_frame_mib.clamp(1, 1024)).unwrap_or(16) << 20,
        })
    }
}
