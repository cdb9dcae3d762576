//! `[sink]` and `[sink.sparkplug]`: the upstream broker, as written (with its
//! defaults) and as validated.

use serde::{Deserialize, Serialize};

use super::checks::Endpoint;
use super::checks::{Problems, endpoint, ms};
use super::databases::{Influx, Postgres, RawInflux, RawPostgres};
use super::fleet::RawFleet;
use super::raw::RawSparkplug;
use super::source::{Protocol, RawSource};
use crate::output::SinkFormat;

/// What `[sink]` is validated against: itself and the sections its rules compare it with.
pub(super) struct Sections<'a> {
    pub sink: &'a RawSink,
    pub source: &'a RawSource,
    pub sparkplug: &'a RawSparkplug,
    pub fleet: &'a RawFleet,
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
    /// Results into PostgreSQL / TimescaleDB.
    pub postgres: RawPostgres,
    /// Results into InfluxDB.
    pub influx: RawInflux,
}

impl Default for RawSink {
    fn default() -> Self {
        Self {
            url: "mqtt://127.0.0.1:1883".into(),
            protocol: Protocol::V5,
            client_id: String::new(),
            username: String::new(),
            password_file: String::new(),
            ca_file: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
            keep_alive_s: 30,
            qos: 1,
            topic_prefix: "tidemark/{gateway}".into(),
            format: SinkFormat::Json,
            outbox_max_messages: 1_000_000,
            outbox_max_mb: 0,
            max_inflight: 4096,
            ack_timeout_ms: 5000,
            plain: true,
            sparkplug: RawSinkSparkplug::default(),
            postgres: RawPostgres::default(),
            influx: RawInflux::default(),
        }
    }
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

impl Default for RawSinkSparkplug {
    fn default() -> Self {
        Self {
            enabled: false,
            group_id: "tidemark".into(),
            edge_node_id: String::new(),
            primary_host_id: String::new(),
            rebirth_min_interval_ms: 5000,
        }
    }
}

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
    /// `[sink.postgres]` (None: off).
    pub postgres: Option<Postgres>,
    /// `[sink.influx]` (None: off).
    pub influx: Option<Influx>,
}

impl Sink {
    pub(super) fn validate(p: &mut Problems, raw: &Sections<'_>, gateway: &str) -> Self {
        let s = raw.sink;
        let postgres = Postgres::validate(p, &s.postgres);
        let influx = Influx::validate(p, &s.influx);
        let databases = s.postgres.enabled || s.influx.enabled;
        // Only database outputs: no upstream broker is needed (docs/reference.md#sinkpostgres-and-sinkinflux).
        let no_broker = s.url.is_empty() && databases && !s.plain && !s.sparkplug.enabled;
        let endpoint = if no_broker {
            Endpoint::plain(
                false,
                String::new(),
                0,
                format!("tidemark-{gateway}-out"),
                1,
            )
        } else {
            endpoint(p, "sink", &s.link(), &format!("tidemark-{gateway}-out"))
        };
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
            sparkplug: edge_node(p, raw, gateway, databases),
            postgres,
            influx,
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
    raw: &Sections<'_>,
    gateway: &str,
    databases: bool,
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
    if !raw.sink.plain && !s.enabled && !databases {
        p.add(
            "sink.plain",
            "false while [sink.sparkplug], [sink.postgres] and [sink.influx] are off would publish no results at all",
        );
    }
    if !s.enabled {
        return None;
    }
    let ingest = raw.sparkplug;
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

super::checks::link_keys!(RawSink);
