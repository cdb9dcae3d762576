//! Validation of a layered [`RawConfig`] into a typed [`Config`], collecting
//! every problem as a `key: problem` line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::*;
use crate::model::Id;
use crate::topic::TopicPattern;

pub(super) fn describe_config_error(e: &config::ConfigError) -> String {
    let s = e.to_string();
    // The TOML parser reports positions; keep its message, it names the line.
    format!("config: {s}")
}

pub(super) fn describe_serde_error(path: &str, msg: &str) -> String {
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

pub(super) fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
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
        Tls {
            ca_file: &raw.source.ca_file,
            cert_file: &raw.source.cert_file,
            key_file: &raw.source.key_file,
        },
        raw.source.qos,
        raw.source.keep_alive_s,
    );
    if u32::try_from(raw.source.session_expiry_s).is_err() {
        p.add(
            "source.session_expiry_s",
            format!(
                "{} is above the MQTT limit of {}",
                raw.source.session_expiry_s,
                u32::MAX
            ),
        );
    }
    if raw.source.topics.is_empty() {
        p.add("source.topics", "must name at least one topic filter");
    }
    for (i, t) in raw.source.topics.iter().enumerate() {
        if let Err(e) = crate::topic::validate_filter(t) {
            p.add(&format!("source.topics[{i}]"), format!("{t:?}: {e}"));
        }
    }
    let probe = probe(&mut p, &raw.source, &gid);
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
        gateway_clock: t.gateway_clock,
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
        Tls {
            ca_file: &raw.sink.ca_file,
            cert_file: &raw.sink.cert_file,
            key_file: &raw.sink.key_file,
        },
        raw.sink.qos,
        raw.sink.keep_alive_s,
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
    if raw.sink.outbox_max_mb > 1 << 24 {
        p.add(
            "sink.outbox_max_mb",
            "must be at most 16777216 (16 TiB); 0 turns the byte bound off",
        );
    }
    if raw.sink.max_inflight == 0 || raw.sink.max_inflight > u64::from(u16::MAX) {
        p.add("sink.max_inflight", "must be 1..=65535 (MQTT packet ids)");
    }
    if raw.sink.ack_timeout_ms == 0 {
        p.add(
            "sink.ack_timeout_ms",
            "must be positive (how long an unanswered publish or ping may wait)",
        );
    }
    ms(&mut p, "sink.ack_timeout_ms", raw.sink.ack_timeout_ms);
    let fleet = fleet_config(&mut p, &raw.fleet);
    p.positive("metrics.interval_s", raw.metrics.interval_s);
    p.positive("metrics.health_timeout_s", raw.metrics.health_timeout_s);
    let metrics_token = if raw.metrics.token_file.is_empty() {
        None
    } else {
        match std::fs::read_to_string(&raw.metrics.token_file) {
            Ok(t) if t.trim().len() >= 16 => Some(t.trim().to_owned()),
            Ok(_) => {
                p.add(
                    "metrics.token_file",
                    format!(
                        "{:?} holds no token of at least 16 characters (e.g. `openssl rand -hex 32 > FILE`)",
                        raw.metrics.token_file
                    ),
                );
                None
            }
            Err(e) => {
                p.add(
                    "metrics.token_file",
                    format!("cannot read {:?}: {e}", raw.metrics.token_file),
                );
                None
            }
        }
    };
    let metrics_listen = if raw.metrics.listen.is_empty() {
        None
    } else {
        match raw.metrics.listen.parse::<SocketAddr>() {
            Ok(a) if a.ip().is_loopback() || !raw.metrics.token_file.is_empty() => Some(a),
            Ok(_) => {
                p.add(
                    "metrics.listen",
                    format!(
                        "{:?} is not a loopback address: without metrics.token_file the endpoint has no authentication (set token_file, or use 127.0.0.1:PORT or [::1]:PORT and a reverse proxy)",
                        raw.metrics.listen
                    ),
                );
                None
            }
            Err(_) => {
                p.add(
                    "metrics.listen",
                    format!(
                        "{:?} is not a host:port socket address (e.g. \"127.0.0.1:9464\")",
                        raw.metrics.listen
                    ),
                );
                None
            }
        }
    };
    let sp = &raw.sparkplug;
    for (i, g) in sp.group_ids.iter().enumerate() {
        if !crate::model::valid_id(g) {
            p.add(
                &format!("sparkplug.group_ids[{i}]"),
                format!(
                    "{g:?} must be 1..64 chars of [A-Za-z0-9_.:-] (it becomes a tidemark group)"
                ),
            );
        }
    }
    if !sp.host_id.is_empty() && !crate::model::valid_id(&sp.host_id) {
        p.add(
            "sparkplug.host_id",
            format!(
                "{:?} must be 1..64 chars of [A-Za-z0-9_.:-] (it appears in a topic)",
                sp.host_id
            ),
        );
    }
    let sparkplug = SparkplugConfig {
        enabled: sp.enabled,
        group_ids: sp.group_ids.clone(),
        host_id: (!sp.host_id.is_empty()).then(|| sp.host_id.clone()),
        rebirth: sp.rebirth,
    };
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
        sink_protocol: raw.sink.protocol,
        session_expiry_s: u32::try_from(raw.source.session_expiry_s).unwrap_or(u32::MAX),
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
        outbox_max_bytes: raw.sink.outbox_max_mb.saturating_mul(1 << 20),
        sink_max_inflight: u16::try_from(raw.sink.max_inflight).unwrap_or(u16::MAX),
        sink_ack_timeout_ms: raw.sink.ack_timeout_ms,
        probe,
        metrics_interval_s: raw.metrics.interval_s,
        metrics_listen,
        metrics_token,
        health_timeout_ms: i64::try_from(raw.metrics.health_timeout_s.saturating_mul(1000))
            .unwrap_or(i64::MAX),
        log_level: raw.log.level.clone(),
        log_format: raw.log.format,
        sparkplug,
        fleet,
        raw,
        sources: BTreeMap::new(),
    })
}

/// `[source] probe_*` (SPEC §5): None when `probe_after_ms = 0`.
fn probe(p: &mut Problems, raw: &super::RawSource, gateway: &str) -> Option<super::Probe> {
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
    Some(super::Probe {
        after_ms: raw.probe_after_ms,
        timeout_ms: raw.probe_timeout_ms,
        topic,
    })
}

fn fleet_config(p: &mut Problems, raw: &super::RawFleet) -> super::FleetConfig {
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
    super::FleetConfig {
        enabled: raw.enabled,
        trusted_keys: keys,
        confirm_ms: raw.confirm_s.saturating_mul(1000),
    }
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
    tls_files: Tls<'_>,
    qos: u8,
    keep_alive_s: u64,
) -> Option<Endpoint> {
    let ca_file = tls_files.ca_file;
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
    let is_tls = matches!(parsed, Ok((true, _, _)));
    let (cert, key) = (tls_files.cert_file, tls_files.key_file);
    for (k, f) in [("cert_file", cert), ("key_file", key)] {
        if f.is_empty() {
            continue;
        }
        if let Err(e) = std::fs::metadata(f) {
            p.add(&format!("{section}.{k}"), format!("cannot read {f:?}: {e}"));
        } else if !is_tls && parsed.is_ok() {
            p.add(&format!("{section}.{k}"), "set, but url is not mqtts://");
        }
    }
    if cert.is_empty() != key.is_empty() {
        let missing = if cert.is_empty() {
            "cert_file"
        } else {
            "key_file"
        };
        p.add(
            &format!("{section}.{missing}"),
            "mutual TLS needs both cert_file and key_file",
        );
    }
    if keep_alive_s > u64::from(u16::MAX) {
        p.add(
            &format!("{section}.keep_alive_s"),
            format!("{keep_alive_s} is above the MQTT limit of {}", u16::MAX),
        );
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
        client_cert: (!cert.is_empty()).then(|| (PathBuf::from(cert), PathBuf::from(key))),
        keep_alive_s: u16::try_from(keep_alive_s).unwrap_or(u16::MAX),
        qos,
    })
}

/// The TLS files of one endpoint, as written.
struct Tls<'a> {
    ca_file: &'a str,
    cert_file: &'a str,
    key_file: &'a str,
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
