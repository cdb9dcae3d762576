//! Configuration: embedded defaults < TOML file < `TIDEMARK__SECTION__KEY` env,
//! deserialized strictly (unknown keys are errors) and validated once into a
//! typed [`Config`]. Every problem is reported as one line naming its key.

mod raw;
mod reload;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

pub use raw::*;
// Domain types live by the code that uses them; the config only builds them.
pub use crate::codec::{PayloadConfig, PayloadFormat, TimestampUnit};
pub use crate::engine::{EngineConfig, GroupConfig, GroupRules};
pub use crate::output::SinkFormat;
pub use crate::sparkplug::SparkplugConfig;
pub use crate::time::window::WindowSpec;
pub use crate::time::{InvalidPolicy, TimeConfig, TimePolicy};
pub use reload::{RESTART_ONLY, engine_from_doc, needs_restart};
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
    /// Outbox bound in bytes of stored outputs (0: none).
    pub outbox_max_bytes: u64,
    /// Uplink publishes in flight at most.
    pub sink_max_inflight: u16,
    /// A QoS 1 publish or ping unanswered this long takes the uplink down.
    pub sink_ack_timeout_ms: u64,
    /// Probes of the path from the site broker (SPEC §5); None: `probe_after_ms = 0`.
    pub probe: Option<Probe>,
    /// Metrics period in seconds.
    pub metrics_interval_s: u64,
    /// Local HTTP endpoint (status page and API, `/metrics`, `/healthz`).
    pub metrics_listen: Option<SocketAddr>,
    /// Bearer token of the HTTP endpoint (read from `metrics.token_file`).
    pub metrics_token: Option<String>,
    /// How long the source may be down, or the engine or a commit stuck, before `/healthz` fails.
    pub health_timeout_ms: i64,
    /// Log filter directive.
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// The layered raw configuration, for `check` to print.
    pub raw: RawConfig,
    /// Dotted key -> the file (or `env VAR`) that set it last; absent keys are defaults.
    pub sources: BTreeMap<String, String>,
    /// Sparkplug B ingest (SPEC §10).
    pub sparkplug: SparkplugConfig,
    /// Signed remote configuration (SPEC §12).
    pub fleet: FleetConfig,
}

/// `[fleet]`, validated: the trusted keys read from their files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// Documents on `P/config/set` are taken.
    pub enabled: bool,
    /// Keys whose signatures are taken.
    pub trusted_keys: Vec<crate::fleet::PublicKey>,
    /// Time given to source and sink to connect after a document is applied.
    pub confirm_ms: u64,
}

/// `[source] probe_*`, validated: how the path from the site broker is proven (SPEC §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Nothing arrived this long: a probe goes out, and again every as long.
    pub after_ms: u64,
    /// The oldest probe unanswered this long: the path is down.
    pub timeout_ms: u64,
    /// The probe topic, `{gateway}` replaced.
    pub topic: String,
}

/// An MQTT connection endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
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

impl Endpoint {
    /// `mqtt[s]://host:port`, for logs.
    pub fn url(&self) -> String {
        format!(
            "{}://{}:{}",
            if self.tls { "mqtts" } else { "mqtt" },
            self.host,
            self.port
        )
    }

    /// A tool's own connection (capture, simulate, demo): no credentials or
    /// client certificate, system CA roots for `mqtts`, 30 s keep-alive.
    pub fn plain(tls: bool, host: String, port: u16, client_id: String, qos: u8) -> Self {
        Self {
            tls,
            host,
            port,
            client_id,
            username: None,
            password: None,
            ca_file: None,
            client_cert: None,
            keep_alive_s: 30,
            qos,
        }
    }
}

impl Config {
    /// The engine's settings.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            gateway: self.gateway_id.clone(),
            pattern: self.topic_pattern.clone(),
            payload: self.payload.clone(),
            time: self.time.clone(),
            groups: GroupRules {
                defaults: self.group_defaults.clone(),
                overrides: self.groups.clone(),
            },
            sparkplug: self.sparkplug.clone(),
        }
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

/// Loads the files in order (a later file wins key by key) over the defaults,
/// then the process environment over all of them.
pub fn load(paths: &[PathBuf]) -> Result<Config, ConfigError> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    load_with_env(paths, &env)
}

/// Like [`load`] with an explicit environment (tests).
pub fn load_with_env(
    paths: &[PathBuf],
    env: &BTreeMap<String, String>,
) -> Result<Config, ConfigError> {
    let mut layers = Vec::with_capacity(paths.len());
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one(format!("config file {}: {e}", path.display())))?;
        layers.push((path.display().to_string(), text));
    }
    load_layers(&layers, env)
}

/// The name a remote layer's keys are shown as coming from (`check`).
pub const REMOTE: &str = "remote";

/// Like [`load_with_env`] with a remote layer (SPEC §12) above the files.
pub fn load_with_remote(
    paths: &[PathBuf],
    env: &BTreeMap<String, String>,
    remote: &str,
) -> Result<Config, ConfigError> {
    let mut layers = Vec::with_capacity(paths.len() + 1);
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one(format!("config file {}: {e}", path.display())))?;
        layers.push((path.display().to_string(), text));
    }
    // What points where the documents come from and who may sign them stays local.
    if let Ok(t) = toml::from_str::<toml::Table>(remote)
        && t.contains_key("fleet")
    {
        return Err(ConfigError::one(
            "fleet: cannot be set by a remote document (only by the local config files)".into(),
        ));
    }
    layers.push((REMOTE.to_owned(), remote.to_owned()));
    load_layers(&layers, env)
}

/// The gateway's config as `run` and `check` see it: the files and the
/// environment, with the remote layer kept in `state_dir` when `[fleet]` is
/// enabled. A remote layer that no longer fits is left out, with the reason.
pub fn load_gateway(
    paths: &[PathBuf],
) -> Result<(Config, Option<crate::fleet::Remote>, Option<String>), ConfigError> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let local = load_with_env(paths, &env)?;
    if !local.fleet.enabled {
        return Ok((local, None, None));
    }
    let remote = match crate::fleet::Remote::read(&local.state_dir) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok((local, None, None)),
        Err(e) => {
            let why = format!(
                "{}: {e}; running on the local config",
                crate::fleet::remote_path(&local.state_dir).display()
            );
            return Ok((local, None, Some(why)));
        }
    };
    match over_remote(local, paths, &env, &remote.config) {
        (cfg, None) => Ok((cfg, Some(remote), None)),
        (local, Some(why)) => {
            let why = format!(
                "remote layer (document {}) left out: {why}; running on the local config",
                remote.id
            );
            // Its ids stay taken.
            let kept = crate::fleet::Remote {
                id: 0,
                config: String::new(),
                ..remote
            };
            Ok((local, Some(kept), Some(why)))
        }
    }
}

/// `local` (the files and `env`) with the remote layer `remote` above the files
/// when `local` enables `[fleet]`; a layer that no longer fits them is left out,
/// with the reason.
pub fn over_remote(
    local: Config,
    paths: &[PathBuf],
    env: &BTreeMap<String, String>,
    remote: &str,
) -> (Config, Option<String>) {
    if !local.fleet.enabled || remote.is_empty() {
        return (local, None);
    }
    match load_with_remote(paths, env, remote) {
        Ok(cfg) => (cfg, None),
        Err(e) => (local, Some(e.problems.join("; "))),
    }
}

/// Parses a TOML document layered over the defaults and under `env`.
pub fn load_str(text: &str, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
    load_layers(&[("<config>".to_owned(), text.to_owned())], env)
}

/// `(name, TOML text)` layers over the defaults, `env` over all of them.
fn load_layers(
    layers: &[(String, String)],
    env: &BTreeMap<String, String>,
) -> Result<Config, ConfigError> {
    use config::{Environment, File, FileFormat};
    let env_map: config::Map<String, String> = env
        .iter()
        .filter(|(k, _)| k.starts_with("TIDEMARK__"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut builder =
        config::Config::builder().add_source(File::from_str(DEFAULTS, FileFormat::Toml));
    let mut sources = BTreeMap::new();
    for (name, text) in layers {
        // Parsed once on its own so a syntax error names its file.
        let doc: toml::Table = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(String::new(), |span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(" line {line}, column {column}:")
            });
            ConfigError::one(format!("config file {name}:{at} {}", e.message().trim()))
        })?;
        provenance(&mut sources, "", &doc, name);
        builder = builder.add_source(File::from_str(text, FileFormat::Toml));
    }
    for key in env_map.keys() {
        if let Some(rest) = key.strip_prefix("TIDEMARK__") {
            let dotted = rest.to_ascii_lowercase().replace("__", ".");
            sources.retain(|k: &String, _| !k.starts_with(&format!("{dotted}.")));
            sources.insert(dotted, format!("env {key}"));
        }
    }
    let layered = builder
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
    let (raw, mut problems) = deserialize_all(tree);
    let named = |problems: Vec<String>| ConfigError {
        problems: problems
            .into_iter()
            .map(|p| name_the_source(p, &sources))
            .collect(),
    };
    let Some(raw) = raw else {
        return Err(named(problems));
    };
    // Rule violations too, so one run lists every problem (the bad keys above
    // stand at their defaults here).
    match validate::validate(raw) {
        Ok(mut cfg) if problems.is_empty() => {
            cfg.sources = sources;
            Ok(cfg)
        }
        Ok(_) => Err(named(problems)),
        Err(e) => {
            problems.extend(e.problems);
            Err(named(problems))
        }
    }
}

/// Deserializes `tree`, collecting every unknown key and wrong type: each one is
/// reported, then removed (unknown) or set to its default, and the rest tried again.
fn deserialize_all(mut tree: serde_json::Value) -> (Option<RawConfig>, Vec<String>) {
    let defaults: serde_json::Value = toml::from_str::<toml::Table>(DEFAULTS)
        .ok()
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or_default();
    let mut problems = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, RawConfig>(tree.clone()) {
            Ok(raw) => return (Some(raw), problems),
            Err(e) => {
                let path = e.path().to_string();
                let msg = e.into_inner().to_string();
                problems.push(describe_serde_error(&path, &msg));
                if problems.len() >= 100 || !repair(&mut tree, &defaults, &path, &msg) {
                    return (None, problems);
                }
            }
        }
    }
}

/// Takes the key an error names out of the way: an unknown key is removed, a wrong
/// value replaced by its default (a group's by `group_defaults`'), else removed.
fn repair(
    tree: &mut serde_json::Value,
    defaults: &serde_json::Value,
    path: &str,
    msg: &str,
) -> bool {
    let mut keys: Vec<String> = if path == "." {
        Vec::new()
    } else {
        path.split('.').map(str::to_owned).collect()
    };
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let key = rest.split('`').next().unwrap_or(rest);
        if keys.last().map(String::as_str) != Some(key) {
            keys.push(key.to_owned());
        }
    }
    let Some((leaf, parents)) = keys.split_last() else {
        return false;
    };
    let mut default_path: Vec<&str> = keys.iter().map(String::as_str).collect();
    if default_path.first() == Some(&"groups") && default_path.len() > 2 {
        default_path.splice(..2, ["group_defaults"]);
    }
    let default = if msg.starts_with("unknown field") {
        None
    } else {
        default_path
            .iter()
            .try_fold(defaults, |v, k| v.get(*k))
            .cloned()
    };
    let Some(parent) = parents
        .iter()
        .try_fold(&mut *tree, |v, k| v.get_mut(k.as_str()))
        .and_then(serde_json::Value::as_object_mut)
    else {
        return false;
    };
    match default {
        Some(d) => parent.insert(leaf.clone(), d).is_some(),
        None => parent.remove(leaf).is_some(),
    }
}

/// `key: problem` with the environment variable named when one set the key, and
/// the deserializer's type names in plain words.
fn name_the_source(problem: String, sources: &BTreeMap<String, String>) -> String {
    let Some((key, what)) = problem.split_once(": ") else {
        return problem;
    };
    let what = plain_words(key, what);
    match sources.get(key).and_then(|s| s.strip_prefix("env ")) {
        Some(var) => format!("{key} (set by environment variable {var}): {what}"),
        None => format!("{key}: {what}"),
    }
}

fn plain_words(key: &str, what: &str) -> String {
    let number = if key.ends_with("_ms") {
        "a whole number of milliseconds"
    } else if key.ends_with("_s") {
        "a whole number of seconds"
    } else if key.ends_with("qos") {
        "0 or 1"
    } else {
        "a whole number"
    };
    let mut out = what.to_owned();
    for t in ["u8", "u16", "u32", "u64", "usize", "i64", "i32"] {
        out = out.replace(&format!("expected {t}"), &format!("expected {number}"));
    }
    out.replace("expected a sequence", "expected a list")
        .replace("expected a map", "expected a table")
        .replace("invalid type: integer", "invalid type: number")
        .replace("invalid type: sequence", "invalid type: list")
        .replace("invalid type: map", "invalid type: table")
}

/// Records `name` as the origin of every leaf of `table` (a later layer overwrites).
fn provenance(out: &mut BTreeMap<String, String>, prefix: &str, table: &toml::Table, name: &str) {
    for (k, v) in table {
        let key = format!("{prefix}{k}");
        match v {
            toml::Value::Table(t) => provenance(out, &format!("{key}."), t, name),
            _ => {
                out.insert(key, name.to_owned());
            }
        }
    }
}

/// `effective` TOML with a `# from ...` comment on every line whose key was set
/// by a file or the environment; other values are defaults (or derived from them).
pub fn annotate_sources(effective: &str, sources: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(effective.len() * 2);
    let mut table = String::new();
    for line in effective.lines() {
        let trimmed = line.trim_start();
        out.push_str(line);
        if let Some(h) = trimmed.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            table = h.trim_matches(['[', ']']).replace('"', "");
        } else if let Some((k, _)) = trimmed.split_once(" = ") {
            let key = if table.is_empty() {
                k.trim().to_owned()
            } else {
                format!("{table}.{}", k.trim().trim_matches('"'))
            };
            // A group's unset key comes from `[group_defaults]`.
            let inherited = key
                .strip_prefix("groups.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(_, k)| sources.get(&format!("group_defaults.{k}")));
            match (sources.get(&key), inherited) {
                (Some(o), _) => out.push_str(&format!("  # from {o}")),
                (None, Some(o)) => out.push_str(&format!("  # from {o} (group_defaults)")),
                (None, None) => out.push_str("  # default"),
            }
        }
        out.push('\n');
    }
    out
}
