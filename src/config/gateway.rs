//! The process's own sections: `[gateway]`, `[broker]`, `[metrics]` and `[log]`,
//! each as written (with its defaults) and as validated.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::checks::{Problems, ms};
use crate::model::Id;

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
    /// Memory the gateway stays under, MiB; 0: its cgroup's `memory.max` (docs/reference.md#memory).
    pub memory_max_mb: u64,
}

impl Default for RawGateway {
    fn default() -> Self {
        Self {
            id: None,
            state_dir: "/var/lib/tidemark".into(),
            commit_interval_ms: 1000,
            tick_interval_ms: 200,
            memory_max_mb: 0,
        }
    }
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

impl Default for RawBroker {
    fn default() -> Self {
        Self {
            embedded: false,
            listen: "127.0.0.1:1883".into(),
            allow_remote: false,
        }
    }
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

impl Default for RawMetrics {
    fn default() -> Self {
        Self {
            interval_s: 10,
            listen: String::new(),
            health_timeout_s: 60,
            token_file: String::new(),
        }
    }
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

impl Default for RawLog {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
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

/// The smallest `memory_max_mb`: below it the binary and its links alone would hold input.
const MEMORY_MIN_MB: u64 = 16;
/// The largest (1 TiB).
const MEMORY_MAX_MB: u64 = 1 << 20;

/// `[gateway]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// Gateway id (validated; empty only while other problems are reported).
    pub id: Id,
    /// Directory of the state database.
    pub state_dir: PathBuf,
    /// Group-commit period.
    pub commit_interval_ms: u64,
    /// Processing-time tick period.
    pub tick_interval_ms: u64,
    /// `memory_max_mb` in bytes; 0: the cgroup's limit, if any.
    pub memory_max_bytes: u64,
}

impl Gateway {
    pub(super) fn validate(p: &mut Problems, raw: &RawGateway) -> Self {
        let id = match raw.id.as_deref() {
            None | Some("") => {
                p.add("gateway.id", "missing");
                Id::new()
            }
            Some(id) => {
                let ok = id.len() <= 64
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !ok {
                    p.add(
                        "gateway.id",
                        format!("{id:?} must match [A-Za-z0-9_-]{{1,64}}"),
                    );
                }
                Id::try_from(id).unwrap_or_default()
            }
        };
        if raw.state_dir.as_os_str().is_empty() {
            p.add("gateway.state_dir", "must not be empty");
        }
        p.positive("gateway.commit_interval_ms", raw.commit_interval_ms);
        p.positive("gateway.tick_interval_ms", raw.tick_interval_ms);
        ms(p, "gateway.commit_interval_ms", raw.commit_interval_ms);
        ms(p, "gateway.tick_interval_ms", raw.tick_interval_ms);
        if raw.memory_max_mb != 0 && !(MEMORY_MIN_MB..=MEMORY_MAX_MB).contains(&raw.memory_max_mb) {
            p.add(
                "gateway.memory_max_mb",
                format!(
                    "{} must be 0 (the cgroup's memory.max) or {MEMORY_MIN_MB}..={MEMORY_MAX_MB}",
                    raw.memory_max_mb
                ),
            );
        }
        Self {
            id,
            state_dir: raw.state_dir.clone(),
            commit_interval_ms: raw.commit_interval_ms,
            tick_interval_ms: raw.tick_interval_ms,
            memory_max_bytes: raw.memory_max_mb.min(MEMORY_MAX_MB) << 20,
        }
    }

    /// Keys a running gateway cannot change (docs/reference.md#reload-sighup-systemctl-reload-tidemark).
    pub fn needs_restart(&self, new: &Self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.id != new.id {
            out.push("gateway.id");
        }
        if self.state_dir != new.state_dir {
            out.push("gateway.state_dir");
        }
        out
    }

    /// The core's wake-up period: the tick or commit interval, whichever is shorter.
    pub fn wake_every_ms(&self) -> u64 {
        self.tick_interval_ms.min(self.commit_interval_ms).max(1)
    }
}

/// `[broker]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// Listen address of the embedded broker, when it is on.
    pub embedded: Option<SocketAddr>,
    /// `broker.listen` as written (validated even while the broker is off).
    listen: String,
}

impl Broker {
    pub(super) fn validate(p: &mut Problems, raw: &RawBroker) -> Self {
        let listen = raw.listen.parse::<SocketAddr>().ok();
        if listen.is_none() {
            p.add(
                "broker.listen",
                format!("{:?} is not a host:port socket address", raw.listen),
            );
        }
        // The embedded broker has no authentication: any client that reaches it may
        // publish readings or read results.
        if let Some(a) = listen
            && raw.embedded
            && !a.ip().is_loopback()
            && !raw.allow_remote
        {
            p.add(
                "broker.listen",
                format!(
                    "{:?} is reachable from other machines and the embedded broker has no authentication; \
                     listen on 127.0.0.1, or set broker.allow_remote = true on a trusted network only",
                    raw.listen
                ),
            );
        }
        Self {
            embedded: listen.filter(|_| raw.embedded),
            listen: raw.listen.clone(),
        }
    }

    /// Every `[broker]` key needs a restart (docs/reference.md#reload-sighup-systemctl-reload-tidemark).
    pub fn needs_restart(&self, new: &Self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.embedded.is_some() != new.embedded.is_some() {
            out.push("broker.embedded");
        }
        if self.listen != new.listen {
            out.push("broker.listen");
        }
        out
    }
}

/// `[metrics]`: `P/metrics` and the local HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    /// `P/metrics` period, seconds.
    pub interval_s: u64,
    /// Local HTTP endpoint (status page and API, `/metrics`, `/healthz`).
    pub listen: Option<SocketAddr>,
    /// Bearer token of the HTTP endpoint (read from `metrics.token_file`).
    pub token: Option<String>,
    /// How long the source may be down, or the engine or a commit stuck, before `/healthz` fails.
    pub health_timeout_ms: i64,
}

impl Metrics {
    pub(super) fn validate(p: &mut Problems, raw: &RawMetrics) -> Self {
        p.positive("metrics.interval_s", raw.interval_s);
        p.positive("metrics.health_timeout_s", raw.health_timeout_s);
        Self {
            interval_s: raw.interval_s,
            listen: Self::listen(p, raw),
            token: Self::token(p, &raw.token_file),
            health_timeout_ms: i64::try_from(raw.health_timeout_s.saturating_mul(1000))
                .unwrap_or(i64::MAX),
        }
    }

    /// `P/metrics` period in ms.
    pub fn interval_ms(&self) -> i64 {
        i64::try_from(self.interval_s.saturating_mul(1000)).unwrap_or(i64::MAX)
    }

    fn token(p: &mut Problems, file: &str) -> Option<String> {
        if file.is_empty() {
            return None;
        }
        match std::fs::read_to_string(file) {
            Ok(t) if t.trim().len() >= 16 => Some(t.trim().to_owned()),
            Ok(_) => {
                p.add(
                    "metrics.token_file",
                    format!(
                        "{file:?} holds no token of at least 16 characters (e.g. `openssl rand -hex 32 > FILE`)"
                    ),
                );
                None
            }
            Err(e) => {
                p.add("metrics.token_file", format!("cannot read {file:?}: {e}"));
                None
            }
        }
    }

    fn listen(p: &mut Problems, raw: &RawMetrics) -> Option<SocketAddr> {
        if raw.listen.is_empty() {
            return None;
        }
        match raw.listen.parse::<SocketAddr>() {
            Ok(a) if a.ip().is_loopback() || !raw.token_file.is_empty() => Some(a),
            Ok(_) => {
                p.add(
                    "metrics.listen",
                    format!(
                        "{:?} is not a loopback address: without metrics.token_file the endpoint has no authentication (set token_file, or use 127.0.0.1:PORT or [::1]:PORT and a reverse proxy)",
                        raw.listen
                    ),
                );
                None
            }
            Err(_) => {
                p.add(
                    "metrics.listen",
                    format!(
                        "{:?} is not a host:port socket address (e.g. \"127.0.0.1:9464\")",
                        raw.listen
                    ),
                );
                None
            }
        }
    }
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Log {
    /// Filter directive.
    pub level: String,
    /// Line format (a restart applies a change).
    pub format: LogFormat,
}

impl Log {
    pub(super) fn validate(p: &mut Problems, raw: &RawLog) -> Self {
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&raw.level) {
            p.add("log.level", format!("{:?}: {e}", raw.level));
        }
        Self {
            level: raw.level.clone(),
            format: raw.format,
        }
    }
}
