//! `[fleet]`: signed remote configuration, as written (with its defaults) and as validated.

use serde::{Deserialize, Serialize};

use super::checks::Problems;

/// `[fleet]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawFleet {
    /// Take signed documents from `P/config/set` on the sink broker.
    pub enabled: bool,
    /// Files holding the Ed25519 public keys (PEM) whose signatures are taken.
    pub trusted_keys: Vec<String>,
    /// After a document is applied, source and sink must both connect within this, or it is rolled back.
    pub confirm_s: u64,
    /// Take v1 documents (signed without their targets).
    pub accept_v1: bool,
}

impl Default for RawFleet {
    fn default() -> Self {
        Self {
            enabled: false,
            trusted_keys: Vec::new(),
            confirm_s: 60,
            accept_v1: false,
        }
    }
}

/// `[fleet]`: the trusted keys read from their files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fleet {
    /// Documents on `P/config/set` are taken.
    pub enabled: bool,
    /// Keys whose signatures are taken.
    pub trusted_keys: Vec<crate::fleet::PublicKey>,
    /// Time given to source and sink to connect after a document is applied.
    pub confirm_ms: u64,
    /// v1 documents (no targets) are taken too.
    pub accept_v1: bool,
}

impl Fleet {
    pub(super) fn validate(p: &mut Problems, raw: &RawFleet) -> Self {
        let mut keys = Vec::new();
        for (i, file) in raw.trusted_keys.iter().enumerate() {
            match crate::fleet::PublicKey::read(std::path::Path::new(file)) {
                Ok(k) => keys.push(k),
                Err(e) => p.add(
                    &format!("fleet.trusted_keys[{i}]"),
                    format!("{file:?}: {e}"),
                ),
            }
        }
        if raw.enabled && raw.trusted_keys.is_empty() {
            p.add(
                "fleet.trusted_keys",
                "is empty: with fleet.enabled at least one public key file is needed (`tidemark fleet keygen --out FILE` writes FILE.pub)",
            );
        }
        if raw.confirm_s == 0 || raw.confirm_s > 86_400 {
            p.add("fleet.confirm_s", "must be 1..=86400");
        }
        Self {
            enabled: raw.enabled,
            trusted_keys: keys,
            confirm_ms: raw.confirm_s.saturating_mul(1000),
            accept_v1: raw.accept_v1,
        }
    }
}
