//! `[source]`: the site broker, as written (with its defaults) and as validated.

use serde::{Deserialize, Serialize};

use super::checks::Endpoint;
use super::checks::{Problems, endpoint, ms};
use super::raw::RawSparkplug;

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

impl Default for RawSource {
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
            session_expiry_s: 604_800,
            keep_alive_s: 30,
            qos: 1,
            topics: vec!["sensors/+/+/+".into()],
            topic_pattern: "sensors/{group}/{device}/{kind}".into(),
            probe_after_ms: 1000,
            probe_timeout_ms: 3000,
            probe_topic: "tidemark/{gateway}/probe".into(),
        }
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
    pub after_ms: crate::model::Millis,
    /// The oldest probe unanswered this long: the path is down.
    pub timeout_ms: crate::model::Millis,
    /// The probe topic, `{gateway}` replaced.
    pub topic: String,
}

/// Sparkplug host STATE: topic, online and offline payloads.
pub type HostState = (String, Vec<u8>, Vec<u8>);

impl Source {
    pub(super) fn validate(
        p: &mut Problems,
        (s, sparkplug): (&RawSource, &RawSparkplug),
        gateway: &str,
    ) -> Self {
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
        if sparkplug.enabled {
            topics.extend(crate::sparkplug::filters(&sparkplug.group_ids));
        }
        Self {
            endpoint,
            v5: s.protocol == Protocol::V5,
            session_expiry_s: u32::try_from(s.session_expiry_s).unwrap_or(u32::MAX),
            topics,
            host_id: (!sparkplug.host_id.is_empty()).then(|| sparkplug.host_id.clone()),
            probe: Self::probe(p, s, gateway),
        }
    }

    fn probe(p: &mut Problems, raw: &RawSource, gateway: &str) -> Option<Probe> {
        let after_ms = ms(p, "source.probe_after_ms", raw.probe_after_ms);
        let timeout_ms = ms(p, "source.probe_timeout_ms", raw.probe_timeout_ms);
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
            after_ms,
            timeout_ms,
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

/// MQTT protocol version of the source connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// MQTT 5.
    V5,
    /// MQTT 3.1.1.
    V311,
}

super::checks::link_keys!(RawSource);
