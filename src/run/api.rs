//! The live status API (SPEC §11): questions the HTTP endpoint asks the core
//! thread, answered from the engine's own state between two messages (so the
//! numbers are those `P/metrics` and `inspect` would give at that instant).
//! The core only copies the few values asked for; encoding happens in the HTTP task.

use std::sync::atomic::Ordering;

use serde::Serialize;

use super::metrics;
use super::registry::Registry;
use crate::engine::{Device, Engine, Liveness, Now};
use crate::model::Millis;
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
    /// Monotonic time the path from the site broker was last proven (SPEC §5).
    pub proven: Millis,
}

/// `/api/v1/status`.
#[derive(Debug, Serialize)]
pub struct Status {
    gateway: String,
    version: &'static str,
    config_hash: String,
    uptime_s: u64,
    at: Millis,
    source: SourceStatus,
    sink: SinkStatus,
    store: StoreStatus,
    gateway_clock: ClockStatus,
    counters: serde_json::Value,
    groups: Vec<GroupStatus>,
}

#[derive(Debug, Serialize)]
struct SourceStatus {
    connected: bool,
    since: Millis,
    /// How long ago a message or a probe last proved the path (processing time stops there).
    proven_ago_ms: Millis,
}

#[derive(Debug, Serialize)]
struct SinkStatus {
    connected: bool,
    outbox_depth: u64,
    outbox_dropped: u64,
}

#[derive(Debug, Serialize)]
struct StoreStatus {
    healthy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    last_commit_at: Option<Millis>,
}

#[derive(Debug, Serialize)]
struct ClockStatus {
    error_ms: Millis,
    verdict: Verdict,
    kernel_synced: bool,
}

#[derive(Debug, Serialize)]
struct GroupStatus {
    group: String,
    watermark: Option<Millis>,
    lag_ms: Option<Millis>,
    devices_active: u64,
    devices_idle: u64,
    devices_offline: u64,
    open_windows: u64,
}

/// A device's clock as the status shows it.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
enum ClockState {
    /// No offset estimate yet.
    Calibrating,
    /// Timed by its own clock and the estimate.
    Calibrated,
    /// Beyond `max_skew_ms`: timed by arrival.
    Distrusted,
}

/// One device of `/api/v1/devices`.
#[derive(Debug, Serialize)]
pub struct DeviceRow {
    group: String,
    device: String,
    state: Liveness,
    last_seen: Option<Millis>,
    last_arrival: Millis,
    offset_ms: Option<Millis>,
    clock: ClockState,
    accepted: u64,
    late: u64,
    duplicates: u64,
    readings_missing: u64,
}

/// `/api/v1/devices`.
#[derive(Debug, Serialize)]
pub struct DevicePage {
    devices: Vec<DeviceRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// An open window of `/api/v1/devices/{group}/{device}`.
#[derive(Debug, Serialize)]
struct OpenWindow {
    start: Millis,
    end: Millis,
    count: u64,
}

/// `/api/v1/devices/{group}/{device}`.
#[derive(Debug, Serialize)]
pub struct DeviceDetail {
    #[serde(flatten)]
    row: DeviceRow,
    open_windows: Vec<OpenWindow>,
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
    // Times on the corrected gateway clock, as the engine's (SPEC §4).
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
                        count: w.count,
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
        })
        .collect();
    Status {
        gateway: engine.gateway_id().to_owned(),
        version: env!("CARGO_PKG_VERSION"),
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
        counters: serde_json::to_value(&m.counters).unwrap_or_default(),
        groups,
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
        .filter(|d| f.state.is_none_or(|s| engine.liveness(d, now) == s));
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
        last_seen: d.max_event,
        last_arrival: now
            .wall
            .saturating_sub(now.mono.saturating_sub(d.last_arrival)),
        offset_ms: offset,
        clock,
        accepted: d.accepted,
        late: d.late,
        duplicates: d.duplicates,
        readings_missing: d.missing,
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
