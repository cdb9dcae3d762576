//! Validation of a layered [`RawConfig`] into a typed [`Config`], collecting
//! every problem as a `key: problem` line.

use std::collections::BTreeMap;

use super::checks::{Problems, ms};
use super::fleet::Fleet;
use super::gateway::{Broker, Gateway, Log, Metrics};
use super::raw::{
    MAX_SKEW_WINDOW, MsOrAuto, RawAdaptive, RawPayload, RawSparkplug, RawTime, RawWindow,
    WindowKind,
};
use super::sink::Sink;
use super::source::Source;
use super::standby::Standby;
use super::whole::{Config, ConfigError, RawConfig};
use crate::codec::PayloadConfig;
use crate::engine::{EngineConfig, GroupConfig, GroupRules};
use crate::model::Id;
use crate::sparkplug::SparkplugConfig;
use crate::time::TimeConfig;
use crate::time::adaptive::AdaptiveConfig;
use crate::time::window::WindowSpec;
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

/// Every section validated; every problem of every section reported.
pub(super) fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let mut p = Problems(Vec::new());
    let gateway = Gateway::validate(&mut p, &raw.gateway);
    let gid = gateway.id.to_string();
    let broker = Broker::validate(&mut p, &raw.broker);
    let source = Source::validate(&mut p, (&raw.source, &raw.sparkplug), &gid);
    let engine = engine(&mut p, &raw, &gateway.id);
    let sections = super::sink::Sections {
        sink: &raw.sink,
        source: &raw.source,
        sparkplug: &raw.sparkplug,
        fleet: &raw.fleet,
    };
    let sink = Sink::validate(&mut p, &sections, &gid);
    let fleet = Fleet::validate(&mut p, &raw.fleet);
    let standby = Standby::validate(&mut p, (&raw.standby, &raw.broker));
    let metrics = Metrics::validate(&mut p, &raw.metrics);
    let log = Log::validate(&mut p, &raw.log);
    if !p.0.is_empty() {
        return Err(ConfigError { problems: p.0 });
    }
    Ok(Config {
        gateway,
        broker,
        source,
        engine,
        sink,
        metrics,
        log,
        fleet,
        standby,
        raw,
        sources: BTreeMap::new(),
    })
}

/// The engine's sections: `source.topic_pattern`, `[payload]`, `[time]`,
/// `[group_defaults]`, `[groups.*]`, `[sparkplug]`.
fn engine(p: &mut Problems, raw: &RawConfig, gateway: &Id) -> EngineConfig {
    let pattern = TopicPattern::parse(&raw.source.topic_pattern).unwrap_or_else(|e| {
        p.add(
            "source.topic_pattern",
            format!("{:?}: {e}", raw.source.topic_pattern),
        );
        TopicPattern::parse("{group}/{device}/{kind}").expect("a valid pattern")
    });
    let payload = payload(p, &raw.payload);
    let time = time(p, &raw.time);
    let d = &raw.group_defaults;
    let mut defaults = group_config(
        p,
        "group_defaults",
        (d.out_of_orderness_ms, d.allowed_lateness_ms),
        d.idle_timeout_ms,
        d.heartbeat_timeout_ms,
        (&d.window, &d.adaptive),
        (&d.aggregates, d.quantile_accuracy),
    );
    defaults.conditions =
        super::conditions::conditions(p, "group_defaults", &d.conditions, defaults.extras);
    let mut overrides = BTreeMap::new();
    for (name, o) in &raw.groups {
        let key = format!("groups.{name}");
        if !crate::model::valid_id(name) {
            p.add(&key, "group name must be 1..64 chars of [A-Za-z0-9_.:-]");
        }
        let mut g = group_config(
            p,
            &key,
            (
                o.out_of_orderness_ms.unwrap_or(d.out_of_orderness_ms),
                o.allowed_lateness_ms.unwrap_or(d.allowed_lateness_ms),
            ),
            o.idle_timeout_ms.unwrap_or(d.idle_timeout_ms),
            o.heartbeat_timeout_ms.unwrap_or(d.heartbeat_timeout_ms),
            (
                o.window.as_ref().unwrap_or(&d.window),
                o.adaptive.as_ref().unwrap_or(&d.adaptive),
            ),
            (
                o.aggregates.as_ref().unwrap_or(&d.aggregates),
                o.quantile_accuracy.unwrap_or(d.quantile_accuracy),
            ),
        );
        g.conditions = super::conditions::conditions(
            p,
            &key,
            o.conditions.as_ref().unwrap_or(&d.conditions),
            g.extras,
        );
        overrides.insert(name.clone(), g);
    }
    EngineConfig {
        gateway: gateway.clone(),
        pattern,
        payload,
        time,
        groups: GroupRules {
            defaults,
            overrides,
        },
        sparkplug: sparkplug(p, &raw.sparkplug),
    }
}

fn payload(p: &mut Problems, raw: &RawPayload) -> PayloadConfig {
    if raw.timestamp_field.is_empty() {
        p.add("payload.timestamp_field", "must not be empty");
    }
    if !raw.seq_field.is_empty() && raw.seq_field == raw.timestamp_field {
        p.add(
            "payload.seq_field",
            "must differ from payload.timestamp_field",
        );
    }
    PayloadConfig {
        format: raw.format,
        timestamp_field: raw.timestamp_field.clone(),
        timestamp_unit: raw.timestamp_unit,
        seq_field: (!raw.seq_field.is_empty()).then(|| raw.seq_field.clone()),
    }
}

fn time(p: &mut Problems, t: &RawTime) -> TimeConfig {
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
    TimeConfig {
        policy: t.policy,
        min_valid_epoch_ms: t.min_valid_epoch_ms.max(0),
        invalid: t.invalid,
        max_skew_ms: ms(p, "time.max_skew_ms", t.max_skew_ms),
        skew_window: usize::try_from(t.skew_window.clamp(1, MAX_SKEW_WINDOW)).unwrap_or(1),
        max_future_ms: ms(p, "time.max_future_ms", t.max_future_ms),
        max_age_ms: ms(p, "time.max_age_ms", t.max_age_ms),
        gateway_clock: t.gateway_clock,
    }
}

fn sparkplug(p: &mut Problems, sp: &RawSparkplug) -> SparkplugConfig {
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
    if !(1..=1_000_000).contains(&sp.max_edge_nodes) {
        p.add("sparkplug.max_edge_nodes", "must be 1..=1000000");
    }
    SparkplugConfig {
        enabled: sp.enabled,
        group_ids: sp.group_ids.clone(),
        host_id: (!sp.host_id.is_empty()).then(|| sp.host_id.clone()),
        rebirth: sp.rebirth,
        max_edge_nodes: sp.max_edge_nodes,
    }
}

/// `adaptive = { … }`, when a group has an "auto" value.
fn adaptive(
    p: &mut Problems,
    key: &str,
    (bound, lateness): (bool, bool),
    a: &RawAdaptive,
) -> Option<AdaptiveConfig> {
    let k = format!("{key}.adaptive");
    if !(a.quantile > 0.0 && a.quantile < 1.0) {
        p.add(
            &format!("{k}.quantile"),
            format!("{} must be between 0 and 1 (e.g. 0.999)", a.quantile),
        );
    }
    let min_ms = ms(p, &format!("{k}.min_ms"), a.min_ms);
    let max_ms = ms(p, &format!("{k}.max_ms"), a.max_ms);
    if min_ms > max_ms {
        p.add(
            &format!("{k}.min_ms"),
            format!("{min_ms} must be <= max_ms ({max_ms})"),
        );
    }
    if a.horizon_s == 0 || a.horizon_s > 7 * 86_400 {
        p.add(&format!("{k}.horizon_s"), "must be 1..=604800");
    }
    (bound || lateness).then_some(AdaptiveConfig {
        bound,
        lateness,
        // Millionths: exact enough, and the rules stay comparable (Eq) and serializable.
        quantile_ppm: (a.quantile.clamp(0.0, 1.0) * 1_000_000.0).round() as u32,
        min_ms,
        max_ms: max_ms.max(min_ms),
        horizon_ms: i64::try_from(a.horizon_s.clamp(1, 7 * 86_400) * 1000).unwrap_or(1000),
    })
}

/// `aggregates` and `quantile_accuracy`.
fn extras(
    p: &mut Problems,
    key: &str,
    aggregates: &[String],
    accuracy: f64,
) -> crate::time::extras::Extras {
    for name in aggregates {
        if !crate::time::extras::NAMES.contains(&name.as_str()) {
            p.add(
                &format!("{key}.aggregates"),
                format!(
                    "{name:?} is not one of {}",
                    crate::time::extras::NAMES.join(", ")
                ),
            );
        }
    }
    if !(0.0001..=0.5).contains(&accuracy) {
        p.add(
            &format!("{key}.quantile_accuracy"),
            format!("{accuracy} must be 0.0001..=0.5 (a relative error, e.g. 0.01)"),
        );
    }
    crate::time::extras::Extras::of(aggregates, accuracy)
}

fn group_config(
    p: &mut Problems,
    key: &str,
    (ooo, lateness): (MsOrAuto, MsOrAuto),
    idle: u64,
    hb: u64,
    (w, a): (&RawWindow, &RawAdaptive),
    (aggregates, accuracy): (&[String], f64),
) -> GroupConfig {
    p.positive(&format!("{key}.idle_timeout_ms"), idle);
    let extras = extras(p, key, aggregates, accuracy);
    p.positive(&format!("{key}.heartbeat_timeout_ms"), hb);
    let adaptive = adaptive(
        p,
        key,
        (ooo == MsOrAuto::Auto, lateness == MsOrAuto::Auto),
        a,
    );
    // An "auto" value starts at the lower clamp (it is not used as such: see `adaptive`).
    let floor = adaptive.map_or(0, |a| u64::try_from(a.min_ms).unwrap_or(0));
    let out_of_orderness_ms = ms(p, &format!("{key}.out_of_orderness_ms"), ooo.or(floor));
    let idle_timeout_ms = ms(p, &format!("{key}.idle_timeout_ms"), idle);
    let heartbeat_timeout_ms = ms(p, &format!("{key}.heartbeat_timeout_ms"), hb);
    let allowed_lateness_ms = ms(p, &format!("{key}.allowed_lateness_ms"), lateness.or(floor));
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
    GroupConfig {
        out_of_orderness_ms,
        idle_timeout_ms,
        heartbeat_timeout_ms,
        allowed_lateness_ms,
        window,
        adaptive,
        extras,
        conditions: Vec::new(),
    }
}
