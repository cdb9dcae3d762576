//! Configuration: embedded defaults < TOML file < `TIDEMARK__SECTION__KEY` env,
//! deserialized strictly (unknown keys are errors) and validated once into a
//! typed [`Config`]. Every problem is reported as one line naming its key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::Id;
use crate::topic::TopicPattern;

/// SPEC defaults; the bottom layer of every configuration.
pub const DEFAULTS: &str = r#"
[gateway]
state_dir = "/var/lib/tidemark"
commit_interval_ms = 50
tick_interval_ms = 200

[broker]
embedded = false
listen = "127.0.0.1:1883"

[source]
url = "mqtt://127.0.0.1:1883"
protocol = "v5"
client_id = ""
username = ""
password_file = ""
ca_file = ""
qos = 1
topics = ["sensors/+/+/+"]
topic_pattern = "sensors/{group}/{device}/{kind}"

[payload]
format = "auto"
timestamp_field = "ts"
timestamp_unit = "auto"
seq_field = "seq"

[time]
policy = "calibrated"
min_valid_epoch_ms = 1577836800000
invalid = "arrival"
max_skew_ms = 300000
skew_window = 32
max_future_ms = 5000
max_age_ms = 86400000

[group_defaults]
out_of_orderness_ms = 2000
idle_timeout_ms = 30000
heartbeat_timeout_ms = 60000
allowed_lateness_ms = 30000

[sink]
url = "mqtt://127.0.0.1:1883"
client_id = ""
username = ""
password_file = ""
ca_file = ""
qos = 1
topic_prefix = "tidemark/{gateway}"
format = "json"
outbox_max_messages = 1000000

[metrics]
interval_s = 10

[log]
level = "info"
format = "text"
"#;

/// Upper bound of `time.skew_window` (buckets kept inline per device).
pub const MAX_SKEW_WINDOW: u64 = 64;

// ---------------------------------------------------------------------------
// Raw (deserialized) form: mirrors the TOML file key for key.
// ---------------------------------------------------------------------------

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
    /// Subscription QoS; 1 acknowledges only after the state is committed.
    pub qos: u8,
    /// Topic filters to subscribe to.
    pub topics: Vec<String>,
    /// Where group, device and kind sit in a topic.
    pub topic_pattern: String,
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
}

/// `[group_defaults]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroupDefaults {
    /// Bounded disorder tolerated before the watermark passes an event.
    pub out_of_orderness_ms: u64,
    /// A device silent this long no longer holds its group back.
    pub idle_timeout_ms: u64,
    /// A device whose last event is this far behind the watermark is offline.
    pub heartbeat_timeout_ms: u64,
    /// How long after firing a window still accepts events (as revisions).
    pub allowed_lateness_ms: u64,
    /// Window shape.
    #[serde(default = "default_window")]
    pub window: RawWindow,
}

/// `[groups.NAME]`: any key of `[group_defaults]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroupOverride {
    /// Overrides `group_defaults.out_of_orderness_ms`.
    pub out_of_orderness_ms: Option<u64>,
    /// Overrides `group_defaults.idle_timeout_ms`.
    pub idle_timeout_ms: Option<u64>,
    /// Overrides `group_defaults.heartbeat_timeout_ms`.
    pub heartbeat_timeout_ms: Option<u64>,
    /// Overrides `group_defaults.allowed_lateness_ms`.
    pub allowed_lateness_ms: Option<u64>,
    /// Overrides `group_defaults.window` as a whole.
    pub window: Option<RawWindow>,
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
    /// Fixed client id; default `tidemark-{id}-out`.
    pub client_id: String,
    /// Optional user name.
    pub username: String,
    /// The password is read from this file.
    pub password_file: String,
    /// Extra CA certificate (PEM) for mqtts.
    pub ca_file: String,
    /// Publish QoS; 1 keeps outputs in the outbox until acknowledged.
    pub qos: u8,
    /// Prefix of every output topic; `{gateway}` is replaced by the id.
    pub topic_prefix: String,
    /// Output encoding.
    pub format: SinkFormat,
    /// Store-and-forward bound; beyond it the oldest outputs are dropped and counted.
    pub outbox_max_messages: u64,
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// Period of `{prefix}/metrics`.
    pub interval_s: u64,
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

/// MQTT protocol version of the source connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// MQTT 5.
    V5,
    /// MQTT 3.1.1.
    V311,
}

/// Payload encoding of sensor messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    /// JSON object.
    Json,
    /// CBOR map.
    Cbor,
    /// CBOR if the first byte is a CBOR map header, else JSON.
    Auto,
}

/// Unit of numeric device timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TimestampUnit {
    /// Seconds.
    S,
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
    /// Nanoseconds.
    Ns,
    /// By magnitude.
    Auto,
}

/// Source of event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TimePolicy {
    /// Device time corrected by the estimated clock offset.
    Calibrated,
    /// Device time as sent.
    Device,
    /// Gateway arrival time.
    Arrival,
}

/// Handling of missing or invalid device timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InvalidPolicy {
    /// Use arrival time.
    Arrival,
    /// Reject (`invalid_timestamp`).
    Reject,
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

/// Output encoding upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkFormat {
    /// JSON.
    Json,
    /// CBOR.
    Cbor,
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

// ---------------------------------------------------------------------------
// Typed, validated form.
// ---------------------------------------------------------------------------

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Gateway id (validated).
    pub gateway_id: Id,
    /// Directory of the state database.
    pub state_dir: PathBuf,
    /// Group-commit period.
    pub commit_interval_ms: u64,
    /// Processing-time tick period.
    pub tick_interval_ms: u64,
    /// Embedded broker listen address, when enabled.
    pub embedded_broker: Option<SocketAddr>,
    /// Source connection.
    pub source: Endpoint,
    /// Source MQTT protocol.
    pub source_protocol: Protocol,
    /// Subscription filters.
    pub topics: Vec<String>,
    /// Parsed topic pattern.
    pub topic_pattern: TopicPattern,
    /// Payload decoding settings.
    pub payload: PayloadConfig,
    /// Event-time settings.
    pub time: TimeConfig,
    /// Settings of groups without an override.
    pub group_defaults: GroupConfig,
    /// Groups with overrides, fully merged over the defaults.
    pub groups: BTreeMap<String, GroupConfig>,
    /// Sink connection.
    pub sink: Endpoint,
    /// Output topic prefix with `{gateway}` replaced.
    pub topic_prefix: String,
    /// Output encoding.
    pub sink_format: SinkFormat,
    /// Outbox bound.
    pub outbox_max_messages: u64,
    /// Metrics period in seconds.
    pub metrics_interval_s: u64,
    /// Log filter directive.
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// The layered raw configuration, for `check` to print.
    pub raw: RawConfig,
}

/// An MQTT connection endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `mqtts://`.
    pub tls: bool,
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Client id (defaults filled in).
    pub client_id: String,
    /// User name, if any.
    pub username: Option<String>,
    /// Password read from `password_file`, if any.
    pub password: Option<String>,
    /// Extra CA file.
    pub ca_file: Option<PathBuf>,
    /// QoS 0 or 1.
    pub qos: u8,
}

/// Payload decoding settings.
#[derive(Debug, Clone)]
pub struct PayloadConfig {
    /// Encoding.
    pub format: PayloadFormat,
    /// Timestamp field name.
    pub timestamp_field: String,
    /// Timestamp unit.
    pub timestamp_unit: TimestampUnit,
    /// Sequence field name, if duplicate suppression is enabled.
    pub seq_field: Option<String>,
}

/// Event-time settings.
#[derive(Debug, Clone)]
pub struct TimeConfig {
    /// Event-time source.
    pub policy: TimePolicy,
    /// Lowest plausible device (and gateway) clock.
    pub min_valid_epoch_ms: i64,
    /// Invalid timestamp handling.
    pub invalid: InvalidPolicy,
    /// Distrust threshold of the estimated offset.
    pub max_skew_ms: i64,
    /// Offset estimator buckets.
    pub skew_window: usize,
    /// Future bound.
    pub max_future_ms: i64,
    /// Age bound.
    pub max_age_ms: i64,
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

/// A validated window shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSpec {
    /// `[k·size, (k+1)·size)`.
    Tumbling {
        /// Length.
        size_ms: i64,
    },
    /// `[k·slide, k·slide + size)`.
    Hopping {
        /// Length.
        size_ms: i64,
        /// Start spacing.
        slide_ms: i64,
    },
    /// `[first, last + gap)`.
    Session {
        /// Inactivity gap.
        gap_ms: i64,
    },
}

impl Config {
    /// Settings of `group` (its override if any, else the defaults).
    pub fn group(&self, group: &str) -> &GroupConfig {
        self.groups.get(group).unwrap_or(&self.group_defaults)
    }

    /// The effective configuration as TOML, secrets masked.
    pub fn effective_toml(&self) -> String {
        let mut raw = self.raw.clone();
        raw.source.client_id.clone_from(&self.source.client_id);
        raw.sink.client_id.clone_from(&self.sink.client_id);
        for (name, g) in &self.groups {
            raw.groups.insert(name.clone(), merged_override(g));
        }
        let mut out =
            toml::to_string_pretty(&raw).unwrap_or_else(|e| format!("# cannot render: {e}\n"));
        for (label, ep) in [("source", &self.source), ("sink", &self.sink)] {
            if ep.password.is_some() {
                out.push_str(&format!(
                    "# {label}: password loaded from password_file: ********\n"
                ));
            }
        }
        out
    }
}

fn merged_override(g: &GroupConfig) -> RawGroupOverride {
    let as_u = |v: i64| Some(u64::try_from(v).unwrap_or(0));
    let window = match g.window {
        WindowSpec::Tumbling { size_ms } => RawWindow {
            kind: WindowKind::Tumbling,
            size_ms: as_u(size_ms),
            slide_ms: None,
            gap_ms: None,
        },
        WindowSpec::Hopping { size_ms, slide_ms } => RawWindow {
            kind: WindowKind::Hopping,
            size_ms: as_u(size_ms),
            slide_ms: as_u(slide_ms),
            gap_ms: None,
        },
        WindowSpec::Session { gap_ms } => RawWindow {
            kind: WindowKind::Session,
            size_ms: None,
            slide_ms: None,
            gap_ms: as_u(gap_ms),
        },
    };
    RawGroupOverride {
        out_of_orderness_ms: as_u(g.out_of_orderness_ms),
        idle_timeout_ms: as_u(g.idle_timeout_ms),
        heartbeat_timeout_ms: as_u(g.heartbeat_timeout_ms),
        allowed_lateness_ms: as_u(g.allowed_lateness_ms),
        window: Some(window),
    }
}

/// Configuration problems, one line each, every line naming its key.
#[derive(Debug, thiserror::Error)]
#[error("{}", .problems.join("\n"))]
pub struct ConfigError {
    /// `key: problem` lines.
    pub problems: Vec<String>,
}

impl ConfigError {
    fn one(p: String) -> Self {
        Self { problems: vec![p] }
    }
}

/// Loads `path` over the defaults, then the process environment over both.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    load_with_env(path, &env)
}

/// Like [`load`] with an explicit environment (tests).
pub fn load_with_env(path: &Path, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::one(format!("config file {}: {e}", path.display())))?;
    load_str(&text, env)
}

/// Parses a TOML document layered over the defaults and under `env`.
pub fn load_str(text: &str, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
    use config::{Environment, File, FileFormat};
    let env_map: config::Map<String, String> = env
        .iter()
        .filter(|(k, _)| k.starts_with("TIDEMARK__"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let layered = config::Config::builder()
        .add_source(File::from_str(DEFAULTS, FileFormat::Toml))
        .add_source(File::from_str(text, FileFormat::Toml))
        .add_source(
            Environment::with_prefix("TIDEMARK")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("source.topics")
                .source(Some(env_map)),
        )
        .build()
        .map_err(|e| ConfigError::one(describe_config_error(&e)))?;
    let tree: serde_json::Value = layered
        .try_deserialize()
        .map_err(|e| ConfigError::one(describe_config_error(&e)))?;
    let raw: RawConfig = serde_path_to_error::deserialize(tree).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::one(describe_serde_error(&path, &e.into_inner().to_string()))
    })?;
    validate(raw)
}

fn describe_config_error(e: &config::ConfigError) -> String {
    let s = e.to_string();
    // The TOML parser reports positions; keep its message, it names the line.
    format!("config: {s}")
}

fn describe_serde_error(path: &str, msg: &str) -> String {
    let prefix = if path == "." {
        String::new()
    } else {
        format!("{path}.")
    };
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let key = rest.split('`').next().unwrap_or(rest);
        let expected = rest.split_once(", expected ").map(|(_, e)| e).unwrap_or("");
        // The path already ends with the unknown key.
        let full = if path == key || path.ends_with(&format!(".{key}")) {
            path.to_string()
        } else {
            format!("{prefix}{key}")
        };
        return format!("{full}: unknown key (expected {expected})");
    }
    if let Some(rest) = msg.strip_prefix("missing field `") {
        let key = rest.split('`').next().unwrap_or(rest);
        return format!("{prefix}{key}: missing");
    }
    let key = if path == "." { "config" } else { path };
    format!("{key}: {msg}")
}

struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, key: &str, msg: impl std::fmt::Display) {
        self.0.push(format!("{key}: {msg}"));
    }
    fn positive(&mut self, key: &str, v: u64) {
        if v == 0 {
            self.add(key, "must be > 0");
        }
    }
}

/// Largest duration accepted anywhere (about 100 years): keeps i64 math safe.
const MAX_DURATION_MS: u64 = 1 << 42;

fn ms(p: &mut Problems, key: &str, v: u64) -> i64 {
    if v > MAX_DURATION_MS {
        p.add(key, format!("must be <= {MAX_DURATION_MS}"));
        return 1;
    }
    i64::try_from(v).unwrap_or(1)
}

fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let mut p = Problems(Vec::new());

    let gateway_id = match raw.gateway.id.as_deref() {
        None | Some("") => {
            p.add("gateway.id", "missing");
            None
        }
        Some(id) => {
            let ok = id.len() <= 64
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if ok {
                Id::try_from(id).ok()
            } else {
                p.add(
                    "gateway.id",
                    format!("{id:?} must match [A-Za-z0-9_-]{{1,64}}"),
                );
                None
            }
        }
    };
    if raw.gateway.state_dir.as_os_str().is_empty() {
        p.add("gateway.state_dir", "must not be empty");
    }
    p.positive("gateway.commit_interval_ms", raw.gateway.commit_interval_ms);
    p.positive("gateway.tick_interval_ms", raw.gateway.tick_interval_ms);
    let commit_interval_ms = raw.gateway.commit_interval_ms;
    let tick_interval_ms = raw.gateway.tick_interval_ms;
    ms(&mut p, "gateway.commit_interval_ms", commit_interval_ms);
    ms(&mut p, "gateway.tick_interval_ms", tick_interval_ms);

    let listen = match raw.broker.listen.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            p.add(
                "broker.listen",
                format!("{:?} is not a host:port socket address", raw.broker.listen),
            );
            None
        }
    };
    let embedded_broker = if raw.broker.embedded { listen } else { None };

    let gid = gateway_id.as_ref().map_or("", |g| g.as_str()).to_string();
    let source = endpoint(
        &mut p,
        "source",
        &raw.source.url,
        &raw.source.client_id,
        &format!("tidemark-{gid}-in"),
        &raw.source.username,
        &raw.source.password_file,
        &raw.source.ca_file,
        raw.source.qos,
    );
    if raw.source.topics.is_empty() {
        p.add("source.topics", "must name at least one topic filter");
    }
    for (i, t) in raw.source.topics.iter().enumerate() {
        if let Err(e) = crate::topic::validate_filter(t) {
            p.add(&format!("source.topics[{i}]"), format!("{t:?}: {e}"));
        }
    }
    let topic_pattern = match TopicPattern::parse(&raw.source.topic_pattern) {
        Ok(tp) => Some(tp),
        Err(e) => {
            p.add(
                "source.topic_pattern",
                format!("{:?}: {e}", raw.source.topic_pattern),
            );
            None
        }
    };

    if raw.payload.timestamp_field.is_empty() {
        p.add("payload.timestamp_field", "must not be empty");
    }
    if !raw.payload.seq_field.is_empty() && raw.payload.seq_field == raw.payload.timestamp_field {
        p.add(
            "payload.seq_field",
            "must differ from payload.timestamp_field",
        );
    }
    let payload = PayloadConfig {
        format: raw.payload.format,
        timestamp_field: raw.payload.timestamp_field.clone(),
        timestamp_unit: raw.payload.timestamp_unit,
        seq_field: (!raw.payload.seq_field.is_empty()).then(|| raw.payload.seq_field.clone()),
    };

    let t = &raw.time;
    if t.min_valid_epoch_ms < 0 {
        p.add("time.min_valid_epoch_ms", "must be >= 0");
    }
    if t.skew_window == 0 || t.skew_window > MAX_SKEW_WINDOW {
        p.add(
            "time.skew_window",
            format!("must be between 1 and {MAX_SKEW_WINDOW}"),
        );
    }
    p.positive("time.max_skew_ms", t.max_skew_ms);
    p.positive("time.max_future_ms", t.max_future_ms);
    p.positive("time.max_age_ms", t.max_age_ms);
    let time = TimeConfig {
        policy: t.policy,
        min_valid_epoch_ms: t.min_valid_epoch_ms.max(0),
        invalid: t.invalid,
        max_skew_ms: ms(&mut p, "time.max_skew_ms", t.max_skew_ms),
        skew_window: usize::try_from(t.skew_window.clamp(1, MAX_SKEW_WINDOW)).unwrap_or(1),
        max_future_ms: ms(&mut p, "time.max_future_ms", t.max_future_ms),
        max_age_ms: ms(&mut p, "time.max_age_ms", t.max_age_ms),
    };

    let d = &raw.group_defaults;
    let group_defaults = group_config(
        &mut p,
        "group_defaults",
        d.out_of_orderness_ms,
        d.idle_timeout_ms,
        d.heartbeat_timeout_ms,
        d.allowed_lateness_ms,
        &d.window,
    );
    let mut groups = BTreeMap::new();
    for (name, o) in &raw.groups {
        let key = format!("groups.{name}");
        if !crate::model::valid_id(name) {
            p.add(&key, "group name must be 1..64 chars of [A-Za-z0-9_.:-]");
        }
        let g = group_config(
            &mut p,
            &key,
            o.out_of_orderness_ms.unwrap_or(d.out_of_orderness_ms),
            o.idle_timeout_ms.unwrap_or(d.idle_timeout_ms),
            o.heartbeat_timeout_ms.unwrap_or(d.heartbeat_timeout_ms),
            o.allowed_lateness_ms.unwrap_or(d.allowed_lateness_ms),
            o.window.as_ref().unwrap_or(&d.window),
        );
        groups.insert(name.clone(), g);
    }

    let sink = endpoint(
        &mut p,
        "sink",
        &raw.sink.url,
        &raw.sink.client_id,
        &format!("tidemark-{gid}-out"),
        &raw.sink.username,
        &raw.sink.password_file,
        &raw.sink.ca_file,
        raw.sink.qos,
    );
    let prefix = &raw.sink.topic_prefix;
    if prefix.is_empty() {
        p.add("sink.topic_prefix", "must not be empty");
    } else if prefix.contains(['+', '#', '\0']) || prefix.starts_with('/') || prefix.ends_with('/')
    {
        p.add(
            "sink.topic_prefix",
            format!("{prefix:?} must not contain + # or NUL nor start or end with /"),
        );
    }
    let topic_prefix = prefix.replace("{gateway}", &gid);
    p.positive("sink.outbox_max_messages", raw.sink.outbox_max_messages);
    p.positive("metrics.interval_s", raw.metrics.interval_s);
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&raw.log.level) {
        p.add("log.level", format!("{:?}: {e}", raw.log.level));
    }

    if !p.0.is_empty() {
        return Err(ConfigError { problems: p.0 });
    }
    let (Some(gateway_id), Some(source), Some(sink), Some(topic_pattern), Some(group_defaults)) =
        (gateway_id, source, sink, topic_pattern, group_defaults)
    else {
        return Err(ConfigError::one("config: invalid".into()));
    };
    let groups = groups
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    Ok(Config {
        gateway_id,
        state_dir: raw.gateway.state_dir.clone(),
        commit_interval_ms,
        tick_interval_ms,
        embedded_broker,
        source,
        source_protocol: raw.source.protocol,
        topics: raw.source.topics.clone(),
        topic_pattern,
        payload,
        time,
        group_defaults,
        groups,
        sink,
        topic_prefix,
        sink_format: raw.sink.format,
        outbox_max_messages: raw.sink.outbox_max_messages,
        metrics_interval_s: raw.metrics.interval_s,
        log_level: raw.log.level.clone(),
        log_format: raw.log.format,
        raw,
    })
}

#[allow(clippy::too_many_arguments)]
fn group_config(
    p: &mut Problems,
    key: &str,
    ooo: u64,
    idle: u64,
    hb: u64,
    lateness: u64,
    w: &RawWindow,
) -> Option<GroupConfig> {
    let before = p.0.len();
    p.positive(&format!("{key}.idle_timeout_ms"), idle);
    p.positive(&format!("{key}.heartbeat_timeout_ms"), hb);
    let out_of_orderness_ms = ms(p, &format!("{key}.out_of_orderness_ms"), ooo);
    let idle_timeout_ms = ms(p, &format!("{key}.idle_timeout_ms"), idle);
    let heartbeat_timeout_ms = ms(p, &format!("{key}.heartbeat_timeout_ms"), hb);
    let allowed_lateness_ms = ms(p, &format!("{key}.allowed_lateness_ms"), lateness);
    let wk = format!("{key}.window");
    let need = |p: &mut Problems, name: &str, v: Option<u64>| -> i64 {
        match v {
            None => {
                p.add(&format!("{wk}.{name}"), "missing");
                1
            }
            Some(0) => {
                p.add(&format!("{wk}.{name}"), "must be > 0");
                1
            }
            Some(v) => ms(p, &format!("{wk}.{name}"), v),
        }
    };
    let forbid = |p: &mut Problems, name: &str, v: Option<u64>, kind: &str| {
        if v.is_some() {
            p.add(
                &format!("{wk}.{name}"),
                format!("not allowed for a {kind} window"),
            );
        }
    };
    let window = match w.kind {
        WindowKind::Tumbling => {
            forbid(p, "slide_ms", w.slide_ms, "tumbling");
            forbid(p, "gap_ms", w.gap_ms, "tumbling");
            WindowSpec::Tumbling {
                size_ms: need(p, "size_ms", w.size_ms),
            }
        }
        WindowKind::Hopping => {
            forbid(p, "gap_ms", w.gap_ms, "hopping");
            let size_ms = need(p, "size_ms", w.size_ms);
            let slide_ms = need(p, "slide_ms", w.slide_ms);
            if slide_ms > 0
                && (size_ms + slide_ms - 1) / slide_ms > crate::time::window::MAX_OVERLAP
            {
                p.add(
                    &format!("{wk}.slide_ms"),
                    format!(
                        "size_ms / slide_ms (rounded up) must be at most {} (windows per event)",
                        crate::time::window::MAX_OVERLAP
                    ),
                );
            }
            if slide_ms > size_ms {
                p.add(
                    &format!("{wk}.slide_ms"),
                    format!("{slide_ms} must be <= size_ms ({size_ms})"),
                );
            }
            WindowSpec::Hopping { size_ms, slide_ms }
        }
        WindowKind::Session => {
            forbid(p, "size_ms", w.size_ms, "session");
            forbid(p, "slide_ms", w.slide_ms, "session");
            WindowSpec::Session {
                gap_ms: need(p, "gap_ms", w.gap_ms),
            }
        }
    };
    (p.0.len() == before).then_some(GroupConfig {
        out_of_orderness_ms,
        idle_timeout_ms,
        heartbeat_timeout_ms,
        allowed_lateness_ms,
        window,
    })
}

#[allow(clippy::too_many_arguments)]
fn endpoint(
    p: &mut Problems,
    section: &str,
    url: &str,
    client_id: &str,
    default_client_id: &str,
    username: &str,
    password_file: &str,
    ca_file: &str,
    qos: u8,
) -> Option<Endpoint> {
    let before = p.0.len();
    let key = format!("{section}.url");
    let parsed = parse_url(url);
    if let Err(e) = &parsed {
        p.add(&key, e);
    }
    if qos > 1 {
        p.add(
            &format!("{section}.qos"),
            format!("{qos} is not supported (0 or 1)"),
        );
    }
    if client_id.len() > 128 {
        p.add(
            &format!("{section}.client_id"),
            "must be at most 128 characters",
        );
    }
    let password = if password_file.is_empty() {
        None
    } else {
        match std::fs::read_to_string(password_file) {
            Ok(s) => Some(s.trim_end_matches(['\n', '\r']).to_string()),
            Err(e) => {
                p.add(
                    &format!("{section}.password_file"),
                    format!("cannot read {password_file:?}: {e}"),
                );
                None
            }
        }
    };
    if !ca_file.is_empty() {
        if let Err(e) = std::fs::metadata(ca_file) {
            p.add(
                &format!("{section}.ca_file"),
                format!("cannot read {ca_file:?}: {e}"),
            );
        } else if matches!(parsed, Ok((false, _, _))) {
            p.add(
                &format!("{section}.ca_file"),
                "set, but url is not mqtts://",
            );
        }
    }
    let (tls, host, port) = parsed.ok()?;
    (p.0.len() == before).then(|| Endpoint {
        tls,
        host,
        port,
        client_id: if client_id.is_empty() {
            default_client_id.to_string()
        } else {
            client_id.to_string()
        },
        username: (!username.is_empty()).then(|| username.to_string()),
        password,
        ca_file: (!ca_file.is_empty()).then(|| PathBuf::from(ca_file)),
        qos,
    })
}

/// Parses `mqtt://host[:port][/]` or `mqtts://...`.
pub fn parse_url(url: &str) -> Result<(bool, String, u16), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{url:?} is not a URL (expected mqtt://host:port or mqtts://host:port)"
        ));
    };
    let (tls, default_port) = match scheme {
        "mqtt" | "tcp" => (false, 1883),
        "mqtts" | "ssl" => (true, 8883),
        other => {
            return Err(format!(
                "unsupported scheme {other:?} (expected mqtt or mqtts)"
            ));
        }
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(
            "credentials in the URL are not allowed; use username and password_file".into(),
        );
    }
    if rest.contains('/') || rest.contains('?') {
        return Err(format!("{url:?} must not have a path or query"));
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{url:?}: unterminated [ in host"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| format!("{url:?}: bad port {p:?}"))?,
            None if after.is_empty() => default_port,
            None => return Err(format!("{url:?}: junk after host")),
        };
        (h.to_string(), port)
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse::<u16>()
                    .map_err(|_| format!("{url:?}: bad port {p:?}"))?,
            ),
            None => (rest.to_string(), default_port),
        }
    };
    if host.is_empty() {
        return Err(format!("{url:?}: missing host"));
    }
    if port == 0 {
        return Err(format!("{url:?}: port must be > 0"));
    }
    Ok((tls, host, port))
}
