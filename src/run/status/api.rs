//! The live status API (docs/reference.md#reload-sighup-systemctl-reload-tidemark): questions the HTTP endpoint asks the core
//! thread, answered from the engine's own state between two messages (so the
//! numbers are those `P/metrics` and `inspect` would give at that instant).
//! The core only copies the few values asked for; encoding happens in the HTTP task.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use crate::engine::{Device, Engine, Liveness, Now};
use crate::model::Millis;
use crate::run::status::metrics;
pub use crate::run::status::metrics::Counters;
use crate::run::status::registry::Registry;
use crate::time::gateway::Verdict;

/// Devices a page holds unless asked otherwise, and at most.
pub const PAGE_DEFAULT: usize = 100;
/// The largest page.
pub const PAGE_MAX: usize = 1000;

/// A question for the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// `/api/v1/status`.
    Status,
    /// `/api/v1/devices`.
    Devices(DeviceFilter),
    /// `/api/v1/devices/{group}/{device}`.
    Device {
        /// Group id.
        group: String,
        /// Device id.
        device: String,
    },
}

/// `/api/v1/devices` parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFilter {
    /// Only this group.
    pub group: Option<String>,
    /// Only devices in this state.
    pub state: Option<Liveness>,
    /// Page size (1..=[`PAGE_MAX`]).
    pub limit: usize,
    /// Start after this (group, device).
    pub after: Option<(String, String)>,
    /// Only devices with a condition raised now.
    pub raised: bool,
}

/// The core's answer.
#[derive(Debug)]
pub enum Answer {
    /// Gateway status.
    Status(Box<Status>),
    /// A page of devices.
    Devices(DevicePage),
    /// One device (`None`: unknown).
    Device(Option<Box<DeviceDetail>>),
}

/// What the core knows of its links beyond the engine.
#[derive(Debug, Clone, Copy)]
pub struct Links {
    /// The source is connected.
    pub source_up: bool,
    /// Wall time of the source's last connect or disconnect.
    pub source_since: Millis,
    /// Wall time of the last durable commit.
    pub last_commit_at: Option<Millis>,
    /// Monotonic time the path from the site broker was last proven (docs/reference.md#group_defaults-and-groupsname).
    pub proven: Millis,
}

/// `/api/v1/status` (docs/reference.md#reload-sighup-systemctl-reload-tidemark); `tidemark status` reads it as this type.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    /// `gateway.id`.
    pub gateway: String,
    /// The binary's version.
    pub version: String,
    /// The config in force (`check`'s hash).
    pub config_hash: String,
    /// Since the process started.
    pub uptime_s: u64,
    /// Wall time of the answer.
    pub at: Millis,
    /// The site broker link.
    pub source: SourceStatus,
    /// The upstream link and the outbox.
    pub sink: SinkStatus,
    /// The state store.
    pub store: StoreStatus,
    /// The gateway's own clock (docs/reference.md#time).
    pub gateway_clock: ClockStatus,
    /// Counters since the start.
    pub counters: metrics::Counters,
    /// Every group.
    pub groups: Vec<GroupStatus>,
    /// The standby pair (docs/reference.md#standby--two-boards-one-gateway); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<crate::pair::Status>,
    /// Each output over the outbox (docs/reference.md#sinkpostgres-and-sinkinflux).
    #[serde(default)]
    pub outputs: Vec<crate::run::status::registry::OutputStatus>,
    /// The memory ceiling (docs/reference.md#memory).
    #[serde(default)]
    pub memory: Option<crate::run::ceiling::MemoryStatus>,
}

/// The source link.
#[derive(Debug, Serialize, Deserialize)]
pub struct SourceStatus {
    /// Connected and subscribed.
    pub connected: bool,
    /// Wall time of the last connect or disconnect.
    pub since: Millis,
    /// How long ago a message or a probe last proved the path (processing time stops there).
    pub proven_ago_ms: Millis,
}

/// The uplink.
#[derive(Debug, Serialize, Deserialize)]
pub struct SinkStatus {
    /// Connected.
    pub connected: bool,
    /// Outputs waiting.
    pub outbox_depth: u64,
    /// Outputs the outbox bound dropped.
    pub outbox_dropped: u64,
}

/// The state store.
#[derive(Debug, Serialize, Deserialize)]
pub struct StoreStatus {
    /// Commits succeed.
    pub healthy: bool,
    /// Why not, when they do not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Wall time of the last durable commit.
    pub last_commit_at: Option<Millis>,
}

/// The gateway's clock as judged by the devices.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClockStatus {
    /// Estimated error (wall − true).
    pub error_ms: Millis,
    /// Who is believed.
    pub verdict: Verdict,
    /// The kernel reports the clock synchronized.
    pub kernel_synced: bool,
}

/// One group.
#[derive(Debug, Serialize, Deserialize)]
pub struct GroupStatus {
    /// Group id.
    pub group: String,
    /// Its watermark.
    pub watermark: Option<Millis>,
    /// How far the watermark is behind the corrected gateway clock.
    pub lag_ms: Option<Millis>,
    /// Devices by liveness.
    pub devices_active: u64,
    /// Idle devices (no longer holding the watermark back).
    pub devices_idle: u64,
    /// Offline devices.
    pub devices_offline: u64,
    /// Windows open in the group.
    pub open_windows: u64,
    /// The watermark bound in force (learned when "auto", docs/reference.md#group_defaults-and-groupsname).
    #[serde(default)]
    pub bound_ms: Millis,
    /// The allowed lateness in force (learned when "auto").
    #[serde(default)]
    pub lateness_ms: Millis,
    /// Devices with a condition raised now (docs/conditions.md).
    #[serde(default)]
    pub conditions_raised: u64,
}

/// A device's clock as the status shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockState {
    /// No offset estimate yet.
    Calibrating,
    /// Timed by its own clock and the estimate.
    Calibrated,
    /// Beyond `max_skew_ms`: timed by arrival.
    Distrusted,
}

/// One device of `/api/v1/devices`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeviceRow {
    /// Group id.
    pub group: String,
    /// Device id.
    pub device: String,
    /// Active, idle or offline.
    pub state: Liveness,
    /// Its latest event time.
    pub last_seen: Option<Millis>,
    /// Wall time its last message arrived.
    pub last_arrival: Millis,
    /// Estimated clock offset against the corrected gateway clock.
    pub offset_ms: Option<Millis>,
    /// How its clock is used.
    pub clock: ClockState,
    /// Readings counted.
    pub accepted: u64,
    /// Readings past their window's lateness.
    pub late: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Readings a sequence gap says never arrived.
    pub readings_missing: u64,
    /// Its conditions raised now (docs/conditions.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<String>,
}

/// `/api/v1/devices`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DevicePage {
    /// This page.
    pub devices: Vec<DeviceRow>,
    /// The paging key of the next page, if there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// An open window of `/api/v1/devices/{group}/{device}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct OpenWindow {
    /// Window start (event time).
    pub start: Millis,
    /// Window end.
    pub end: Millis,
    /// Readings in it.
    pub count: u64,
}

/// `/api/v1/devices/{group}/{device}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeviceDetail {
    /// As in the list.
    #[serde(flatten)]
    pub row: DeviceRow,
    /// Its open windows.
    pub open_windows: Vec<OpenWindow>,
}

/// The paging key of a device: `group/device` (ids never hold a `/`: they are topic levels).
pub fn key(group: &str, device: &str) -> String {
    format!("{group}/{device}")
}

/// The (group, device) of a paging key.
pub fn parse_key(k: &str) -> Option<(String, String)> {
    let (g, d) = k.split_once('/')?;
    Some((g.to_owned(), d.to_owned()))
}

/// Answers `q` from the engine at `now`.
pub fn answer(engine: &Engine, q: &Query, now: Now, registry: &Registry, links: Links) -> Answer {
    // Times on the corrected gateway clock, as the engine's (docs/reference.md#time).
    let corrected = Now {
        wall: engine.gateway_clock().tick_wall(now.wall, now.mono),
        ..now
    };
    match q {
        Query::Status => Answer::Status(Box::new(status(engine, now, registry, links))),
        Query::Devices(f) => Answer::Devices(devices(engine, f, corrected)),
        Query::Device { group, device } => Answer::Device(engine.device(group, device).map(|d| {
            Box::new(DeviceDetail {
                row: row(engine, d, corrected),
                open_windows: d
                    .windows
                    .iter()
                    .map(|w| OpenWindow {
                        start: w.start,
                        end: w.end,
                        count: u64::from(w.count),
                    })
                    .collect(),
            })
        })),
    }
}

fn status(engine: &Engine, now: Now, registry: &Registry, links: Links) -> Status {
    let m = metrics::gather(engine, now, registry, links.source_up);
    let groups = m
        .groups
        .iter()
        .map(|(name, g)| GroupStatus {
            group: name.clone(),
            watermark: g.watermark,
            lag_ms: g.lag_ms,
            devices_active: g.devices_active,
            devices_idle: g.devices_idle,
            devices_offline: g.devices_offline,
            open_windows: g.open_windows,
            bound_ms: g.bound_ms,
            lateness_ms: g.lateness_ms,
            conditions_raised: g.conditions_raised,
        })
        .collect();
    Status {
        gateway: engine.gateway_id().to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        config_hash: m.config_hash.clone(),
        uptime_s: m.uptime_s,
        at: m.at,
        source: SourceStatus {
            connected: links.source_up,
            since: links.source_since,
            proven_ago_ms: now.mono.saturating_sub(links.proven).max(0),
        },
        sink: SinkStatus {
            connected: m.connected.sink,
            outbox_depth: m.counters.outbox_depth,
            outbox_dropped: m.counters.outbox_dropped,
        },
        store: StoreStatus {
            healthy: registry.store_ok.load(Ordering::Relaxed),
            detail: registry.health.store_detail(),
            last_commit_at: links.last_commit_at,
        },
        gateway_clock: ClockStatus {
            error_ms: m.gateway_clock.error_ms,
            verdict: m.gateway_clock.verdict,
            kernel_synced: m.gateway_clock.kernel_synced,
        },
        counters: m.counters.clone(),
        groups,
        pair: m.pair.clone(),
        outputs: m.outputs.clone(),
        memory: Some(m.memory.clone()),
    }
}

fn devices(engine: &Engine, f: &DeviceFilter, now: Now) -> DevicePage {
    let limit = f.limit.clamp(1, PAGE_MAX);
    let after = f.after.as_ref().map(|(g, d)| (g.as_str(), d.as_str()));
    // A group filter starts at that group (or after the paging key, if later).
    let start = match (&f.group, after) {
        (Some(g), Some(a)) if a.0 >= g.as_str() => Some(a),
        (Some(g), _) => Some((g.as_str(), "")),
        (None, a) => a,
    };
    let mut out = Vec::with_capacity(limit.min(64));
    let mut next = None;
    let matching = engine
        .devices_after(start)
        .take_while(|d| f.group.as_ref().is_none_or(|g| d.group.as_str() == g))
        .filter(|d| f.state.is_none_or(|s| engine.liveness(d, now) == s))
        .filter(|d| !f.raised || engine.raised_conditions(d).next().is_some());
    for d in matching {
        if out.len() == limit {
            // One more exists: the page ends at the last one taken.
            next = out.last().map(|r: &DeviceRow| key(&r.group, &r.device));
            break;
        }
        out.push(row(engine, d, now));
    }
    DevicePage { devices: out, next }
}

fn row(engine: &Engine, d: &Device, now: Now) -> DeviceRow {
    let error = engine.gateway_clock().error;
    let offset = d.skew.estimate().map(|e| e.saturating_sub(error));
    let clock = if d.distrusted {
        ClockState::Distrusted
    } else if offset.is_some() {
        ClockState::Calibrated
    } else {
        ClockState::Calibrating
    };
    DeviceRow {
        group: d.group.to_string(),
        device: d.id.to_string(),
        state: engine.liveness(d, now),
        last_seen: d.max_event.get(),
        last_arrival: now
            .wall
            .saturating_sub(now.mono.saturating_sub(d.last_arrival)),
        offset_ms: offset,
        clock,
        accepted: d.accepted,
        late: d.late,
        duplicates: d.duplicates,
        readings_missing: d.missing,
        conditions: engine.raised_conditions(d).map(String::from).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_keys_round_trip() {
        assert_eq!(
            parse_key(&key("hall", "t-1")),
            Some(("hall".into(), "t-1".into()))
        );
        assert_eq!(parse_key("nogroup"), None);
    }
}
