//! The configuration as written: the serde structs that mirror the TOML file
//! key for key (the embedded defaults are in `defaults.rs`) (`deny_unknown_fields`, a `///` per key).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::codec::{PayloadFormat, TimestampUnit};
use crate::output::SinkFormat;
use crate::time::{InvalidPolicy, TimePolicy};

/// Upper bound of `time.skew_window` (buckets kept inline per device).
pub const MAX_SKEW_WINDOW: u64 = 64;

/// The whole file as written by the user, after layering.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Identity and local state of this gateway.
    pub gateway: RawGateway,
    /// Optional embedded MQTT broker.
    pub broker: RawBroker,
    /// The site broker the sensors publish to.
    pub source: RawSource,
    /// How sensor payloads are decoded.
    pub payload: RawPayload,
    /// How event time is derived and sanity-checked.
    pub time: RawTime,
    /// Watermark and window settings applied to every group.
    pub group_defaults: RawGroupDefaults,
    /// Per-group overrides of `group_defaults`, keyed by group name.
    #[serde(default)]
    pub groups: BTreeMap<String, RawGroupOverride>,
    /// The upstream broker results are published to.
    pub sink: RawSink,
    /// Periodic gateway metrics.
    pub metrics: RawMetrics,
    /// Logging.
    pub log: RawLog,
    /// Sparkplug B ingest (docs/reference.md#sparkplug--sparkplug-b-30-ingest).
    pub sparkplug: RawSparkplug,
    /// Signed remote configuration (docs/reference.md#remote-configuration-fleet).
    pub fleet: RawFleet,
    /// Hot standby: two boards, one gateway (docs/reference.md#standby--two-boards-one-gateway).
    pub standby: RawStandby,
}

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

/// `[gateway]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGateway {
    /// Required: `[A-Za-z0-9_-]{1,64}`; appears in topics and client ids.
    pub id: Option<String>,
    /// Directory of the redb database (`state_dir/tidemark.redb`).
    pub state_dir: PathBuf,
    /// Group-commit period of the state store.
    pub commit_interval_ms: u64,
    /// Processing-time tick: idleness, watermarks, firing.
    pub tick_interval_ms: u64,
}

/// `[broker]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBroker {
    /// Run an MQTT broker inside the gateway so sensors may connect to it.
    pub embedded: bool,
    /// Listen address of the embedded broker.
    pub listen: String,
    /// A `listen` address reachable from other machines is wanted (the broker has no authentication).
    pub allow_remote: bool,
}

/// `[source]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    /// `mqtt://host[:port]` or `mqtts://host[:port]`.
    pub url: String,
    /// MQTT protocol version.
    pub protocol: Protocol,
    /// Fixed client id so the broker keeps the session; default `tidemark-{id}-in`.
    pub client_id: String,
    /// Optional user name.
    pub username: String,
    /// The password is read from this file, never from the main config.
    pub password_file: String,
    /// Extra CA certificate (PEM) for mqtts; system roots otherwise.
    pub ca_file: String,
    /// Client certificate (PEM) for mutual TLS, with `key_file`.
    pub cert_file: String,
    /// Private key (PEM) of `cert_file`.
    pub key_file: String,
    /// v5: how long the broker keeps the session (and its queue) while the gateway is away.
    pub session_expiry_s: u64,
    /// MQTT keep-alive; 0 disables it.
    pub keep_alive_s: u64,
    /// Subscription QoS; 1 acknowledges only after the state is committed.
    pub qos: u8,
    /// Topic filters to subscribe to.
    pub topics: Vec<String>,
    /// Where group, device and kind sit in a topic.
    pub topic_pattern: String,
    /// Quiet this long: a probe proves the path from the site broker (0: no probes).
    pub probe_after_ms: u64,
    /// A probe not back within this: the path is down (a disconnect).
    pub probe_timeout_ms: u64,
    /// Where probes go, on the source broker; `{gateway}` is replaced by the id.
    pub probe_topic: String,
}

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

/// `[sink]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSink {
    /// `mqtt://host[:port]` or `mqtts://host[:port]`.
    pub url: String,
    /// MQTT protocol version of the upstream connection.
    pub protocol: Protocol,
    /// Fixed client id; default `tidemark-{id}-out`.
    pub client_id: String,
    /// Optional user name.
    pub username: String,
    /// The password is read from this file.
    pub password_file: String,
    /// Extra CA certificate (PEM) for mqtts.
    pub ca_file: String,
    /// Client certificate (PEM) for mutual TLS, with `key_file`.
    pub cert_file: String,
    /// Private key (PEM) of `cert_file`.
    pub key_file: String,
    /// MQTT keep-alive; 0 disables it.
    pub keep_alive_s: u64,
    /// Publish QoS; 1 keeps outputs in the outbox until acknowledged.
    pub qos: u8,
    /// Prefix of every output topic; `{gateway}` is replaced by the id.
    pub topic_prefix: String,
    /// Output encoding.
    pub format: SinkFormat,
    /// Store-and-forward bound; beyond it the oldest outputs are dropped and counted.
    pub outbox_max_messages: u64,
    /// The same bound in MiB of the state file (0: none).
    pub outbox_max_mb: u64,
    /// QoS 1 publishes awaiting their PUBACK at most (the broker's Receive Maximum may bind lower).
    pub max_inflight: u64,
    /// A QoS 1 publish or ping unanswered this long: the uplink is down (a disconnect).
    pub ack_timeout_ms: u64,
    /// Publish results on the plain topics of docs/reference.md#topics-and-payloads-upstream.
    pub plain: bool,
    /// Results as a Sparkplug B edge node (docs/reference.md#sink--the-upstream-broker).
    pub sparkplug: RawSinkSparkplug,
}

/// `[sink.sparkplug]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSinkSparkplug {
    /// Publish results as a Sparkplug B 3.0 edge node on the sink broker.
    pub enabled: bool,
    /// Sparkplug group id.
    pub group_id: String,
    /// Edge node id ("" = `gateway.id`).
    pub edge_node_id: String,
    /// Wait for this Primary Host Application's STATE online; hold results while it is offline.
    pub primary_host_id: String,
    /// Least time between two answered NCMD rebirth requests.
    pub rebirth_min_interval_ms: u64,
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// Period of `{prefix}/metrics`.
    pub interval_s: u64,
    /// Local HTTP endpoint: status page and API, Prometheus text, probes ("" = off;
    /// loopback only unless `token_file` is set).
    pub listen: String,
    /// `/healthz` fails once the source has been down, or the engine loop or a
    /// commit has been stuck, this long.
    pub health_timeout_s: u64,
    /// A file holding the bearer token every request but `/healthz` and `/readyz` needs.
    pub token_file: String,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// Filter directive (`info`, `tidemark=debug`...); `RUST_LOG` wins.
    pub level: String,
    /// Log line format.
    pub format: LogFormat,
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

/// The connection keys `[source]` and `[sink]` share, as written.
pub(crate) struct LinkKeys<'a> {
    pub url: &'a str,
    pub client_id: &'a str,
    pub username: &'a str,
    pub password_file: &'a str,
    pub ca_file: &'a str,
    pub cert_file: &'a str,
    pub key_file: &'a str,
    pub keep_alive_s: u64,
    pub qos: u8,
}

macro_rules! link_keys {
    ($t:ty) => {
        impl $t {
            /// The connection keys.
            pub(crate) fn link(&self) -> LinkKeys<'_> {
                LinkKeys {
                    url: &self.url,
                    client_id: &self.client_id,
                    username: &self.username,
                    password_file: &self.password_file,
                    ca_file: &self.ca_file,
                    cert_file: &self.cert_file,
                    key_file: &self.key_file,
                    keep_alive_s: self.keep_alive_s,
                    qos: self.qos,
                }
            }
        }
    };
}
link_keys!(RawSource);
link_keys!(RawSink);

/// MQTT protocol version of the source connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// MQTT 5.
    V5,
    /// MQTT 3.1.1.
    V311,
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

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}
