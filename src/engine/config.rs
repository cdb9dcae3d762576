//! The engine's own settings: built by `config/` from the user's files, with
//! every group's overrides already merged over the defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::codec::PayloadConfig;
use crate::model::Id;
use crate::sparkplug::SparkplugConfig;
use crate::time::TimeConfig;
use crate::time::adaptive::AdaptiveConfig;
use crate::time::window::WindowSpec;
use crate::topic::TopicPattern;

/// Everything the engine needs to know, and nothing about sockets or files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Gateway id (in window results).
    pub gateway: Id,
    /// Input topic pattern.
    pub pattern: TopicPattern,
    /// Payload decoding.
    pub payload: PayloadConfig,
    /// Event-time settings.
    pub time: TimeConfig,
    /// Watermark and window settings by group.
    pub groups: GroupRules,
    /// Sparkplug B ingest.
    pub sparkplug: SparkplugConfig,
}

/// Watermark and window settings of one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig {
    /// Tolerated disorder.
    pub out_of_orderness_ms: i64,
    /// Idleness timeout (monotonic gateway time).
    pub idle_timeout_ms: i64,
    /// Offline threshold behind the watermark.
    pub heartbeat_timeout_ms: i64,
    /// Lateness still accepted after firing.
    pub allowed_lateness_ms: i64,
    /// Window shape.
    pub window: WindowSpec,
    /// "auto" bound and/or lateness (docs/reference.md#group_defaults-and-groupsname); `None`: both fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveConfig>,
    /// `aggregates` and `quantile_accuracy` (docs/reference.md#group_defaults-and-groupsname).
    #[serde(default, skip_serializing_if = "crate::time::extras::Extras::is_none")]
    pub extras: crate::time::extras::Extras,
    /// Conditions judged on each device's window results (docs/conditions.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<super::conditions::Condition>,
}

/// Settings of groups without an override, and the overrides (merged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRules {
    /// `[group_defaults]`.
    pub defaults: GroupConfig,
    /// `[groups.NAME]`, each fully merged over the defaults.
    pub overrides: BTreeMap<String, GroupConfig>,
}

impl GroupRules {
    /// Settings of `group`: its override if any, else the defaults.
    pub fn of(&self, group: &str) -> &GroupConfig {
        self.overrides.get(group).unwrap_or(&self.defaults)
    }
}

/// The engine's rules as the journal and a checkpoint record them: a versioned
/// serde value, so a later layout reads an earlier one by its tag.
#[derive(Serialize, Deserialize)]
enum Recorded<'a> {
    /// Since 2026-12 (earlier records are TOML documents, read by `config`).
    V2(std::borrow::Cow<'a, EngineConfig>),
}

impl EngineConfig {
    /// These rules as a record (CBOR).
    pub fn record(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing CBOR into a Vec fails only on allocation failure.
        let _ =
            ciborium::ser::into_writer(&Recorded::V2(std::borrow::Cow::Borrowed(self)), &mut out);
        out
    }

    /// The rules of a record written by [`EngineConfig::record`]; None: not one.
    pub fn from_record(bytes: &[u8]) -> Option<Self> {
        match ciborium::de::from_reader::<Recorded<'static>, _>(bytes).ok()? {
            Recorded::V2(c) => Some(c.into_owned()),
        }
    }
}
