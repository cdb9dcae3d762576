//! The validated config, one struct per component, each built by its own
//! function from its raw table. A new key is a field here, a line in its
//! section's function and its use in the component that owns the section.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::checks::{Problems, endpoint, ms};
use super::{Endpoint, LogFormat, Protocol, RawConfig};
use crate::model::Id;
use crate::output::SinkFormat;

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
}

impl Gateway {
    pub(super) fn validate(p: &mut Problems, raw: &super::RawGateway) -> Self {
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
        Self {
            id,
            state_dir: raw.state_dir.clone(),
            commit_interval_ms: raw.commit_interval_ms,
            tick_interval_ms: raw.tick_interval_ms,
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
    pub(super) fn validate(p: &mut Problems, raw: &super::RawBroker) -> Self {
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

/// `[source]` (and the Sparkplug subscriptions and host id): the site broker link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The site broker.
    pub endpoint: Endpoint,
    /// MQTT 5.
    pub v5: bool,
    /// v5 session expiry, seconds.
    pub session_expiry_s: u32,
    /// Topic filters: `source.topics`, then the Sparkplug ones when it is enabled.
    pub topics: Vec<String>,
    /// Sparkplug Primary Host Application id (its STATE is this link's will).
    pub host_id: Option<String>,
    /// Probes of the path (docs/reference.md#group_defaults-and-groupsname); None: `probe_after_ms = 0`.
    pub probe: Option<Probe>,
}

/// `[source] probe_*`: how the path from the site broker is proven (docs/reference.md#group_defaults-and-groupsname).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Nothing arrived this long: a probe goes out, and again every as long.
    pub after_ms: u64,
    /// The oldest probe unanswered this long: the path is down.
    pub timeout_ms: u64,
    /// The probe topic, `{gateway}` replaced.
    pub topic: String,
}

impl Source {
    pub(super) fn validate(p: &mut Problems, raw: &RawConfig, gateway: &str) -> Self {
        let s = &raw.source;
        let endpoint = endpoint(p, "source", &s.link(), &format!("tidemark-{gateway}-in"));
        if u32::try_from(s.session_expiry_s).is_err() {
            p.add(
                "source.session_expiry_s",
                format!(
                    "{} is above the MQTT limit of {}",
                    s.session_expiry_s,
                    u32::MAX
                ),
            );
        }
        if s.topics.is_empty() {
            p.add("source.topics", "must name at least one topic filter");
        }
        for (i, t) in s.topics.iter().enumerate() {
            if let Err(e) = crate::topic::validate_filter(t) {
                p.add(&format!("source.topics[{i}]"), format!("{t:?}: {e}"));
            }
        }
        let mut topics = s.topics.clone();
        if raw.sparkplug.enabled {
            topics.extend(crate::sparkplug::filters(&raw.sparkplug.group_ids));
        }
        Self {
            endpoint,
            v5: s.protocol == Protocol::V5,
            session_expiry_s: u32::try_from(s.session_expiry_s).unwrap_or(u32::MAX),
            topics,
            host_id: (!raw.sparkplug.host_id.is_empty()).then(|| raw.sparkplug.host_id.clone()),
            probe: Self::probe(p, s, gateway),
        }
    }

    fn probe(p: &mut Problems, raw: &super::RawSource, gateway: &str) -> Option<Probe> {
        ms(p, "source.probe_after_ms", raw.probe_after_ms);
        ms(p, "source.probe_timeout_ms", raw.probe_timeout_ms);
        if raw.probe_after_ms == 0 {
            return None;
        }
        if raw.probe_timeout_ms == 0 {
            p.add(
                "source.probe_timeout_ms",
                "must be positive while source.probe_after_ms is (0 there turns probes off)",
            );
        }
        let topic = raw.probe_topic.replace("{gateway}", gateway);
        if topic.is_empty()
            || topic.contains(['+', '#', '\0'])
            || topic.starts_with('$')
            || topic.len() > 1024
        {
            p.add(
                "source.probe_topic",
                format!(
                    "{:?} must be a topic name: not empty, no + # or NUL, not starting with $",
                    raw.probe_topic
                ),
            );
        }
        Some(Probe {
            after_ms: raw.probe_after_ms,
            timeout_ms: raw.probe_timeout_ms,
            topic,
        })
    }

    /// Sparkplug host STATE (topic, online, offline payloads) stamped `started_at`
    /// (birth and death share it, as Sparkplug 3.0 pairs them).
    pub fn host_state(&self, started_at: crate::model::Millis) -> Option<HostState> {
        self.host_id.as_ref().map(|host| {
            let topic = format!("{}/STATE/{host}", crate::sparkplug::NAMESPACE);
            let state = |online: bool| {
                serde_json::to_vec(&serde_json::json!({"online": online, "timestamp": started_at}))
                    .unwrap_or_default()
            };
            (topic, state(true), state(false))
        })
    }

    /// Whether `other` needs another connection (anything but the filters and probes).
    pub fn same_link(&self, other: &Self) -> bool {
        self.endpoint == other.endpoint
            && self.v5 == other.v5
            && self.session_expiry_s == other.session_expiry_s
            && self.host_id == other.host_id
    }
}

/// Sparkplug host STATE: topic, online and offline payloads.
pub type HostState = (String, Vec<u8>, Vec<u8>);

/// Outbox bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxBounds {
    /// `sink.outbox_max_messages`.
    pub messages: u64,
    /// `sink.outbox_max_mb` in bytes (0: none).
    pub bytes: u64,
}

/// `[sink]`: the upstream link and what goes on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sink {
    /// The upstream broker.
    pub endpoint: Endpoint,
    /// MQTT 5.
    pub v5: bool,
    /// In-flight publishes at most (`sink.max_inflight`).
    pub window: u16,
    /// Output prefix P, `{gateway}` replaced.
    pub prefix: String,
    /// Output encoding.
    pub format: SinkFormat,
    /// Store-and-forward bounds.
    pub outbox: OutboxBounds,
    /// A QoS 1 publish or a ping unanswered this long: the uplink is down.
    pub ack_timeout_ms: u64,
    /// Subscribe to `P/config/set` (`[fleet] enabled`).
    pub documents: bool,
    /// Results on the plain topics (`sink.plain`).
    pub plain: bool,
    /// Results as a Sparkplug B edge node (`[sink.sparkplug] enabled`).
    pub sparkplug: Option<crate::sparkplug::node::NodeConfig>,
}

impl Sink {
    pub(super) fn validate(p: &mut Problems, raw: &RawConfig, gateway: &str) -> Self {
        let s = &raw.sink;
        let endpoint = endpoint(p, "sink", &s.link(), &format!("tidemark-{gateway}-out"));
        let prefix = &s.topic_prefix;
        if prefix.is_empty() {
            p.add("sink.topic_prefix", "must not be empty");
        } else if prefix.contains(['+', '#', '\0'])
            || prefix.starts_with('/')
            || prefix.ends_with('/')
        {
            p.add(
                "sink.topic_prefix",
                format!("{prefix:?} must not contain + # or NUL nor start or end with /"),
            );
        }
        p.positive("sink.outbox_max_messages", s.outbox_max_messages);
        if s.outbox_max_mb > 1 << 24 {
            p.add(
                "sink.outbox_max_mb",
                "must be at most 16777216 (16 TiB); 0 turns the byte bound off",
            );
        }
        if s.max_inflight == 0 || s.max_inflight > u64::from(u16::MAX) {
            p.add("sink.max_inflight", "must be 1..=65535 (MQTT packet ids)");
        }
        if s.ack_timeout_ms == 0 {
            p.add(
                "sink.ack_timeout_ms",
                "must be positive (how long an unanswered publish or ping may wait)",
            );
        }
        ms(p, "sink.ack_timeout_ms", s.ack_timeout_ms);
        Self {
            endpoint,
            v5: s.protocol == Protocol::V5,
            window: u16::try_from(s.max_inflight).unwrap_or(u16::MAX),
            prefix: prefix.replace("{gateway}", gateway),
            format: s.format,
            outbox: OutboxBounds {
                messages: s.outbox_max_messages,
                bytes: s.outbox_max_mb.saturating_mul(1 << 20),
            },
            ack_timeout_ms: s.ack_timeout_ms,
            documents: raw.fleet.enabled,
            plain: s.plain,
            sparkplug: edge_node(p, raw, gateway),
        }
    }

    /// `P/leaf`.
    pub fn topic(&self, leaf: &str) -> String {
        format!("{}/{leaf}", self.prefix)
    }
}

/// `[sink.sparkplug]`, validated (None: off).
fn edge_node(
    p: &mut Problems,
    raw: &RawConfig,
    gateway: &str,
) -> Option<crate::sparkplug::node::NodeConfig> {
    let s = &raw.sink.sparkplug;
    let rule = "must be 1..64 chars of [A-Za-z0-9_.:-] (it is a Sparkplug topic level)";
    if !crate::model::valid_id(&s.group_id) {
        p.add(
            "sink.sparkplug.group_id",
            format!("{:?} {rule}", s.group_id),
        );
    }
    if !s.edge_node_id.is_empty() && !crate::model::valid_id(&s.edge_node_id) {
        p.add(
            "sink.sparkplug.edge_node_id",
            format!("{:?} {rule}", s.edge_node_id),
        );
    }
    if !s.primary_host_id.is_empty() && !crate::model::valid_id(&s.primary_host_id) {
        p.add(
            "sink.sparkplug.primary_host_id",
            format!("{:?} {rule}", s.primary_host_id),
        );
    }
    if s.rebirth_min_interval_ms > 3_600_000 {
        p.add(
            "sink.sparkplug.rebirth_min_interval_ms",
            "must be 0..=3600000",
        );
    }
    if !raw.sink.plain && !s.enabled {
        p.add(
            "sink.plain",
            "false while [sink.sparkplug] is off would publish no results at all",
        );
    }
    if !s.enabled {
        return None;
    }
    let ingest = &raw.sparkplug;
    if ingest.enabled
        && raw.source.url == raw.sink.url
        && (ingest.group_ids.is_empty() || ingest.group_ids.contains(&s.group_id))
    {
        p.add(
            "sink.sparkplug.group_id",
            format!(
                "{:?} is also taken by [sparkplug] ingest on the same broker: the gateway would read its own results (list other ids in sparkplug.group_ids, or use another group_id)",
                s.group_id
            ),
        );
    }
    Some(crate::sparkplug::node::NodeConfig {
        group_id: s.group_id.clone(),
        edge_node_id: if s.edge_node_id.is_empty() {
            gateway.to_string()
        } else {
            s.edge_node_id.clone()
        },
        primary_host_id: (!s.primary_host_id.is_empty()).then(|| s.primary_host_id.clone()),
        rebirth_min_interval_ms: i64::try_from(s.rebirth_min_interval_ms).unwrap_or(i64::MAX),
    })
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
    pub(super) fn validate(p: &mut Problems, raw: &super::RawMetrics) -> Self {
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

    fn listen(p: &mut Problems, raw: &super::RawMetrics) -> Option<SocketAddr> {
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
    pub(super) fn validate(p: &mut Problems, raw: &super::RawLog) -> Self {
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&raw.level) {
            p.add("log.level", format!("{:?}: {e}", raw.level));
        }
        Self {
            level: raw.level.clone(),
            format: raw.format,
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
    pub(super) fn validate(p: &mut Problems, raw: &super::RawFleet) -> Self {
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
