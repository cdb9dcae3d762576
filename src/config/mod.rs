//! Configuration: embedded defaults < TOML file < `TIDEMARK__SECTION__KEY` env,
//! deserialized strictly (unknown keys are errors) and validated once into a
//! typed [`Config`]. Every problem is reported as one line naming its key.

mod raw;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use raw::*;
// Domain types live by the code that uses them; the config only builds them.
pub use crate::codec::{PayloadConfig, PayloadFormat, TimestampUnit};
pub use crate::output::SinkFormat;
pub use crate::time::window::WindowSpec;
pub use crate::time::{InvalidPolicy, TimeConfig, TimePolicy};
pub use validate::parse_url;
use validate::{describe_config_error, describe_serde_error};

use crate::model::Id;
use crate::topic::TopicPattern;

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
    /// v5 session expiry of the source session, seconds.
    pub session_expiry_s: u32,
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
    /// MQTT version of the upstream connection.
    pub sink_protocol: Protocol,
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
    /// Client certificate and key (PEM) for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Keep-alive in seconds (0: off).
    pub keep_alive_s: u16,
    /// QoS 0 or 1.
    pub qos: u8,
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
    validate::validate(raw)
}
