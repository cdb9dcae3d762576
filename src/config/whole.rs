//! The whole configuration as validated: a section per component, what is
//! valid but unsafe, and the effective TOML that `check` prints.

use std::collections::BTreeMap;

use super::fleet::Fleet;
use super::gateway::{Broker, Gateway, Log, Metrics};
use super::raw::{MsOrAuto, RawAdaptive, RawGroupOverride, RawWindow, WindowKind};
use super::sink::Sink;
use super::source::Source;
use super::standby::Standby;
use serde::{Deserialize, Serialize};

use super::fleet::RawFleet;
use super::gateway::{RawBroker, RawGateway, RawLog, RawMetrics};
use super::raw::{RawGroupDefaults, RawPayload, RawSparkplug, RawTime};
use super::sink::RawSink;
use super::source::RawSource;
use super::standby::RawStandby;
use crate::engine::{EngineConfig, GroupConfig};
use crate::time::window::WindowSpec;

/// The whole file as written by the user, after layering; its `Default` is the
/// bottom layer of every configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
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

/// A validated configuration, a section per component (docs/reference.md#configuration).
#[derive(Debug, Clone)]
pub struct Config {
    /// `[gateway]`.
    pub gateway: Gateway,
    /// `[broker]`.
    pub broker: Broker,
    /// The source's link: `[source]` and the Sparkplug subscriptions.
    pub source: Source,
    /// The engine's rules: topic pattern, payload, time, groups, Sparkplug ingest.
    pub engine: EngineConfig,
    /// `[sink]`.
    pub sink: Sink,
    /// `[metrics]`: `P/metrics` and the HTTP endpoint.
    pub metrics: Metrics,
    /// `[log]`.
    pub log: Log,
    /// `[fleet]`: signed remote configuration (docs/reference.md#remote-configuration-fleet).
    pub fleet: Fleet,
    /// `[standby]`: this board's part in a pair (docs/reference.md#standby--two-boards-one-gateway), None when off.
    pub standby: Option<Standby>,
    /// The layered raw configuration, for `check` to print.
    pub raw: RawConfig,
    /// Dotted key -> the file (or `env VAR`) that set it last; absent keys are defaults.
    pub sources: BTreeMap<String, String>,
}

impl Config {
    /// What is valid but unsafe: secret files others can read, credentials sent in
    /// clear to another machine. `check` and `run` print each as a warning.
    pub fn warnings(&self) -> Vec<String> {
        let r = &self.raw;
        let mut out = Vec::new();
        let secrets = [
            ("source.password_file", &r.source.password_file),
            ("source.key_file", &r.source.key_file),
            ("sink.password_file", &r.sink.password_file),
            ("sink.key_file", &r.sink.key_file),
            ("metrics.token_file", &r.metrics.token_file),
            ("standby.key_file", &r.standby.key_file),
            (
                "sink.postgres.password_file",
                &r.sink.postgres.password_file,
            ),
            ("sink.influx.token_file", &r.sink.influx.token_file),
        ];
        for (key, file) in secrets {
            if let Some(w) = readable_by_others(key, file) {
                out.push(w);
            }
        }
        for (section, url, user, pw) in [
            (
                "source",
                &r.source.url,
                &r.source.username,
                &r.source.password_file,
            ),
            ("sink", &r.sink.url, &r.sink.username, &r.sink.password_file),
        ] {
            let plain = url.strip_prefix("mqtt://");
            let host = plain.map(|rest| rest.rsplit_once(':').map_or(rest, |(h, _)| h));
            let loopback = host.is_some_and(|h| {
                h == "localhost"
                    || h.trim_matches(['[', ']'])
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|a| a.is_loopback())
            });
            if plain.is_some() && !loopback && !(user.is_empty() && pw.is_empty()) {
                out.push(format!(
                    "{section}.url: credentials ({section}.username / password_file) go over plain mqtt:// in clear to another machine; use mqtts://"
                ));
            }
        }
        out
    }

    /// The effective configuration as TOML, secrets masked.
    pub fn effective_toml(&self) -> String {
        let mut raw = self.raw.clone();
        raw.source
            .client_id
            .clone_from(&self.source.endpoint.client_id);
        raw.sink.client_id.clone_from(&self.sink.endpoint.client_id);
        for (name, g) in &self.engine.groups.overrides {
            raw.groups.insert(name.clone(), merged_override(g));
        }
        let mut out =
            toml::to_string_pretty(&raw).unwrap_or_else(|e| format!("# cannot render: {e}\n"));
        for (label, ep) in [
            ("source", &self.source.endpoint),
            ("sink", &self.sink.endpoint),
        ] {
            if ep.password.is_some() {
                out.push_str(&format!(
                    "# {label}: password loaded from password_file: ********\n"
                ));
            }
        }
        out
    }
}

/// `KEY: FILE is readable by others` when a secret file's mode lets group or others read it.
pub fn readable_by_others(key: &str, file: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    if file.is_empty() {
        return None;
    }
    let mode = std::fs::metadata(file).ok()?.permissions().mode() & 0o777;
    (mode & 0o044 != 0)
        .then(|| format!("{key}: {file:?} is readable by others (mode {mode:o}); chmod 600 it"))
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
    let a = g.adaptive;
    let value = |v: i64, auto: bool| {
        Some(if auto {
            MsOrAuto::Auto
        } else {
            MsOrAuto::Ms(u64::try_from(v).unwrap_or(0))
        })
    };
    RawGroupOverride {
        out_of_orderness_ms: value(g.out_of_orderness_ms, a.is_some_and(|a| a.bound)),
        idle_timeout_ms: as_u(g.idle_timeout_ms),
        heartbeat_timeout_ms: as_u(g.heartbeat_timeout_ms),
        allowed_lateness_ms: value(g.allowed_lateness_ms, a.is_some_and(|a| a.lateness)),
        window: Some(window),
        adaptive: a.map(|a| RawAdaptive {
            quantile: f64::from(a.quantile_ppm) / 1_000_000.0,
            min_ms: u64::try_from(a.min_ms).unwrap_or(0),
            max_ms: u64::try_from(a.max_ms).unwrap_or(0),
            horizon_s: u64::try_from(a.horizon_ms / 1000).unwrap_or(0),
        }),
        aggregates: (!g.extras.is_none()).then(|| g.extras.names().map(String::from).collect()),
        quantile_accuracy: (g.extras.accuracy_ppm > 0)
            .then(|| f64::from(g.extras.accuracy_ppm) / 1_000_000.0),
        conditions: (!g.conditions.is_empty())
            .then(|| g.conditions.iter().map(|c| c.def().clone()).collect()),
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
    pub(crate) fn one(p: String) -> Self {
        Self { problems: vec![p] }
    }
}
