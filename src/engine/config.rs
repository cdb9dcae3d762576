//! The engine's own settings: built by `config/` from the user's files, with
//! every group's overrides already merged over the defaults.

use std::collections::BTreeMap;

use crate::codec::PayloadConfig;
use crate::model::Id;
use crate::sparkplug::SparkplugConfig;
use crate::time::TimeConfig;
use crate::time::window::WindowSpec;
use crate::topic::TopicPattern;

/// Everything the engine needs to know, and nothing about sockets or files.
#[derive(Debug, Clone)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// Settings of groups without an override, and the overrides (merged).
#[derive(Debug, Clone)]
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
