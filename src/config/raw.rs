//! The engine's sections as written: `[payload]`, `[time]`, `[group_defaults]`,
//! `[groups.NAME]` and `[sparkplug]`, each with its defaults (`deny_unknown_fields`,
//! a `///` per key); validated in `validate.rs`.

use serde::{Deserialize, Serialize};

use crate::codec::{PayloadFormat, TimestampUnit};
use crate::time::{InvalidPolicy, TimePolicy};

/// Upper bound of `time.skew_window` (buckets kept inline per device).
pub const MAX_SKEW_WINDOW: u64 = 64;

/// `[payload]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPayload {
    /// Payload encoding.
    pub format: PayloadFormat,
    /// Field holding the device timestamp.
    pub timestamp_field: String,
    /// Unit of numeric timestamps.
    pub timestamp_unit: TimestampUnit,
    /// Optional per-device sequence number field ("" disables duplicate suppression).
    pub seq_field: String,
}

impl Default for RawPayload {
    fn default() -> Self {
        Self {
            format: PayloadFormat::Auto,
            timestamp_field: "ts".into(),
            timestamp_unit: TimestampUnit::Auto,
            seq_field: "seq".into(),
        }
    }
}

/// `[time]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTime {
    /// Where event time comes from.
    pub policy: TimePolicy,
    /// Device clocks below this epoch (an RTC reset) are invalid.
    pub min_valid_epoch_ms: i64,
    /// What to do with a missing or invalid device timestamp.
    pub invalid: InvalidPolicy,
    /// Estimated device offsets beyond this distrust the device clock.
    pub max_skew_ms: u64,
    /// One-second buckets kept per device by the offset estimator.
    pub skew_window: u64,
    /// Event times later than now + this are rejected.
    pub max_future_ms: u64,
    /// Event times earlier than now - this are rejected.
    pub max_age_ms: u64,
    /// `auto`: a quorum of devices may overrule an unsynchronized gateway clock; `trusted`: never.
    pub gateway_clock: crate::time::gateway::GatewayClockMode,
}

impl Default for RawTime {
    fn default() -> Self {
        Self {
            policy: TimePolicy::Calibrated,
            min_valid_epoch_ms: 1_577_836_800_000,
            invalid: InvalidPolicy::Arrival,
            max_skew_ms: 300_000,
            skew_window: 32,
            max_future_ms: 5000,
            max_age_ms: 86_400_000,
            gateway_clock: crate::time::gateway::GatewayClockMode::Auto,
        }
    }
}

/// `[group_defaults]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroupDefaults {
    /// Bounded disorder tolerated before the watermark passes an event.
    pub out_of_orderness_ms: MsOrAuto,
    /// A device silent this long no longer holds its group back.
    pub idle_timeout_ms: u64,
    /// A device whose last event is this far behind the watermark is offline.
    pub heartbeat_timeout_ms: u64,
    /// How long after firing a window still accepts events (as revisions).
    pub allowed_lateness_ms: MsOrAuto,
    /// Window shape.
    #[serde(default = "default_window")]
    pub window: RawWindow,
    /// How "auto" values follow the group's delays (docs/reference.md#group_defaults-and-groupsname).
    #[serde(default)]
    pub adaptive: RawAdaptive,
    /// Aggregates added to the seven for every metric (docs/reference.md#group_defaults-and-groupsname).
    #[serde(default)]
    pub aggregates: Vec<String>,
    /// Relative error bound of the p-values.
    #[serde(default = "default_accuracy")]
    pub quantile_accuracy: f64,
    /// Conditions judged on each device's window results (docs/conditions.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::engine::conditions::ConditionDef>,
}

fn default_accuracy() -> f64 {
    0.01
}

impl Default for RawGroupDefaults {
    fn default() -> Self {
        Self {
            out_of_orderness_ms: MsOrAuto::Ms(2000),
            idle_timeout_ms: 30_000,
            heartbeat_timeout_ms: 60_000,
            allowed_lateness_ms: MsOrAuto::Ms(30000),
            window: default_window(),
            adaptive: RawAdaptive::default(),
            aggregates: Vec::new(),
            quantile_accuracy: default_accuracy(),
            conditions: Vec::new(),
        }
    }
}

/// A duration in ms, or `"auto"` (docs/reference.md#group_defaults-and-groupsname "Adaptive bound").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsOrAuto {
    /// A fixed value.
    Ms(u64),
    /// Learned from the group's delays.
    Auto,
}

impl MsOrAuto {
    /// The fixed value, or `auto` for "auto".
    pub fn or(self, auto: u64) -> u64 {
        match self {
            Self::Ms(v) => v,
            Self::Auto => auto,
        }
    }
}

impl Serialize for MsOrAuto {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Ms(v) => s.serialize_u64(*v),
            Self::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for MsOrAuto {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = MsOrAuto;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number of milliseconds or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<MsOrAuto, E> {
                Ok(MsOrAuto::Ms(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<MsOrAuto, E> {
                u64::try_from(v)
                    .map(MsOrAuto::Ms)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MsOrAuto, E> {
                match v.trim() {
                    "auto" => Ok(MsOrAuto::Auto),
                    t => t
                        .parse()
                        .map(MsOrAuto::Ms)
                        .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `adaptive = { quantile, min_ms, max_ms, horizon_s }`
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdaptive {
    /// The share of readings the bound (and the lateness) should cover.
    pub quantile: f64,
    /// Lower clamp.
    pub min_ms: u64,
    /// Upper clamp.
    pub max_ms: u64,
    /// How long evidence counts, seconds.
    pub horizon_s: u64,
}

impl Default for RawAdaptive {
    fn default() -> Self {
        Self {
            quantile: 0.999,
            min_ms: 100,
            max_ms: 600_000,
            horizon_s: 900,
        }
    }
}

/// `[groups.NAME]`: any key of `[group_defaults]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroupOverride {
    /// Overrides `group_defaults.out_of_orderness_ms`.
    pub out_of_orderness_ms: Option<MsOrAuto>,
    /// Overrides `group_defaults.idle_timeout_ms`.
    pub idle_timeout_ms: Option<u64>,
    /// Overrides `group_defaults.heartbeat_timeout_ms`.
    pub heartbeat_timeout_ms: Option<u64>,
    /// Overrides `group_defaults.allowed_lateness_ms`.
    pub allowed_lateness_ms: Option<MsOrAuto>,
    /// Overrides `group_defaults.window` as a whole.
    pub window: Option<RawWindow>,
    /// Overrides `group_defaults.adaptive` as a whole.
    pub adaptive: Option<RawAdaptive>,
    /// Overrides `group_defaults.aggregates`.
    pub aggregates: Option<Vec<String>>,
    /// Overrides `group_defaults.quantile_accuracy`.
    pub quantile_accuracy: Option<f64>,
    /// Overrides `group_defaults.conditions` as a whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<crate::engine::conditions::ConditionDef>>,
}

/// `window = { kind = "...", ... }`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawWindow {
    /// `tumbling`, `hopping` or `session`.
    pub kind: WindowKind,
    /// Window length (tumbling, hopping).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_ms: Option<u64>,
    /// Distance between hopping window starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slide_ms: Option<u64>,
    /// Inactivity gap closing a session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ms: Option<u64>,
}

fn default_window() -> RawWindow {
    RawWindow {
        kind: WindowKind::Tumbling,
        size_ms: Some(60_000),
        slide_ms: None,
        gap_ms: None,
    }
}

/// `[sparkplug]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSparkplug {
    /// Subscribe `spBv1.0` topics and decode their payloads.
    pub enabled: bool,
    /// Sparkplug group ids to take; empty = all.
    pub group_ids: Vec<String>,
    /// Non-empty: act as a Primary Host Application with this id.
    pub host_id: String,
    /// Ask an edge node for its births again on an unknown alias or a seq gap.
    pub rebirth: bool,
    /// Edge nodes held at once; beyond, their messages are rejected.
    pub max_edge_nodes: usize,
}

impl Default for RawSparkplug {
    fn default() -> Self {
        Self {
            enabled: false,
            group_ids: Vec::new(),
            host_id: String::new(),
            rebirth: true,
            max_edge_nodes: 4096,
        }
    }
}

/// Window kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    /// Fixed, epoch-aligned, non-overlapping.
    Tumbling,
    /// Fixed size, starting every `slide_ms`.
    Hopping,
    /// Closed by an inactivity gap.
    Session,
}
