//! `P/metrics` (docs/reference.md#topics-and-payloads-upstream): gateway state at an instant, published at QoS 0.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::engine::{Engine, Now};
use crate::model::{Millis, Reason};
use crate::run::status::registry::Registry;

#[derive(Debug, Serialize)]
pub(crate) struct Group {
    pub(crate) watermark: Option<Millis>,
    pub(crate) lag_ms: Option<Millis>,
    pub(crate) devices_active: u64,
    pub(crate) devices_idle: u64,
    pub(crate) devices_offline: u64,
    readings_missing: u64,
    timestamps_invalid: u64,
    /// The watermark bound in force (learned when "auto", docs/reference.md#group_defaults-and-groupsname).
    pub(crate) bound_ms: Millis,
    /// The allowed lateness in force (learned when "auto").
    pub(crate) lateness_ms: Millis,
    /// Live status only (not in `P/metrics`).
    #[serde(skip)]
    pub(crate) open_windows: u64,
    /// Condition records by state (/metrics, the status API).
    #[serde(skip)]
    pub(crate) conditions: [u64; 3],
    /// Members with a condition raised now.
    #[serde(skip)]
    pub(crate) conditions_raised: u64,
}

/// Condition records emitted (docs/conditions.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ConditionCounts {
    /// `raised` records.
    pub raised: u64,
    /// `cleared` records.
    pub cleared: u64,
    /// `retracted` records.
    pub retracted: u64,
}

impl From<[u64; 3]> for ConditionCounts {
    fn from([raised, cleared, retracted]: [u64; 3]) -> Self {
        Self {
            raised,
            cleared,
            retracted,
        }
    }
}

/// Counters since the gateway started (`P/metrics`, the status API).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Counters {
    /// Messages taken from the source.
    pub received: u64,
    /// Readings and heartbeats counted in a window.
    pub accepted: u64,
    /// Readings past their window's lateness (`P/late`).
    pub late: u64,
    /// Redeliveries and repeated sequence numbers dropped.
    pub duplicates: u64,
    /// Readings a sequence gap says never arrived.
    pub readings_missing: u64,
    /// Readings timed by arrival (bad device timestamp).
    pub timestamps_invalid: u64,
    /// Rejections by reason (`P/rejected`).
    pub rejected: BTreeMap<String, u64>,
    /// Window results published.
    pub windows_emitted: u64,
    /// Device alerts published.
    pub alerts: u64,
    /// Condition records published, by state.
    #[serde(default)]
    pub conditions: ConditionCounts,
    /// Outputs waiting in the outbox.
    pub outbox_depth: u64,
    /// Outputs the outbox bound dropped.
    pub outbox_dropped: u64,
    /// Sparkplug metrics of types that are not aggregated.
    pub sparkplug_other: u64,
    /// NCMD rebirth requests to the edge node inside `rebirth_min_interval_ms`, not answered.
    pub sparkplug_rebirths_refused: u64,
    /// Source paths found dead (a probe not back in time) since the gateway started (docs/reference.md#group_defaults-and-groupsname).
    pub source_path_down: u64,
    /// Uplinks found dead (a publish or ping unanswered in time) since the gateway started.
    pub sink_path_down: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Connections {
    source: bool,
    pub(crate) sink: bool,
}

/// Durable writes since the gateway started.
#[derive(Debug, Serialize)]
struct StoreIo {
    /// Group commits written to the journal.
    journal_commits: u64,
    /// Checkpoints written to redb.
    checkpoints: u64,
    /// Bytes appended to the journal.
    journal_bytes: u64,
    /// Bytes the process sent to storage (`/proc/self/io` write_bytes), if readable.
    disk_write_bytes: Option<u64>,
    /// The state store commits (false while a full disk holds input).
    ok: bool,
}

/// The gateway's own clock (docs/reference.md#time `P/metrics`).
#[derive(Debug, Serialize)]
pub(crate) struct GatewayClockOut {
    /// Estimated error of the wall clock (wall − true), 0 while it is trusted.
    pub(crate) error_ms: Millis,
    /// The kernel reports the clock synchronized.
    pub(crate) kernel_synced: bool,
    /// The kernel's maximum error estimate, µs.
    kernel_maxerror_us: i64,
    /// unsure | trusted | wrong.
    pub(crate) verdict: crate::time::gateway::Verdict,
}

/// Reloads since the gateway started (docs/reference.md#reload-sighup-systemctl-reload-tidemark).
#[derive(Debug, Serialize)]
struct Reloads {
    applied: u64,
    rejected: u64,
}

/// Gateway state at `now`.
#[derive(Debug, Serialize)]
pub struct Metrics {
    pub(crate) at: Millis,
    pub(crate) uptime_s: u64,
    pub(crate) config_hash: String,
    reloads: Reloads,
    pub(crate) groups: BTreeMap<String, Group>,
    pub(crate) counters: Counters,
    outbox_oldest_age_ms: Option<Millis>,
    pub(crate) connected: Connections,
    clock_held: bool,
    pub(crate) gateway_clock: GatewayClockOut,
    store: StoreIo,
    /// The memory ceiling (docs/reference.md#memory).
    pub(crate) memory: crate::run::ceiling::MemoryStatus,
    /// The standby pair (docs/reference.md#standby--two-boards-one-gateway); absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pair: Option<crate::pair::Status>,
    #[serde(skip)]
    pair_bytes: u64,
    /// Each enabled output (the status API and /metrics; not in `P/metrics`).
    #[serde(skip)]
    pub(crate) outputs: Vec<crate::run::status::registry::OutputStatus>,
    #[serde(skip)]
    ack_delay: ([u64; 11], u64),
}

impl Metrics {
    /// The `P/metrics` payload, encoded per `[sink] format`.
    pub fn encode(&self, format: crate::config::SinkFormat) -> Vec<u8> {
        format.encode(self)
    }

    /// The counters an edge node carries (docs/reference.md#sink--the-upstream-broker), in [`crate::sparkplug::node::COUNTERS`] order.
    pub fn sparkplug_counters(&self) -> [u64; crate::sparkplug::node::COUNTERS.len()] {
        let c = &self.counters;
        [
            c.received,
            c.accepted,
            c.late,
            c.duplicates,
            c.readings_missing,
            c.timestamps_invalid,
            c.rejected.values().sum(),
            c.windows_emitted,
            c.alerts,
            c.outbox_depth,
            c.outbox_dropped,
        ]
    }
}

/// Gateway state now.
pub fn collect(engine: &Engine, now: Now, shared: &Registry, source_up: bool) -> Metrics {
    let mut m = gather(engine, now, shared, source_up);
    m.store.disk_write_bytes = disk_write_bytes();
    m
}

/// Gateway state now without reading `/proc` (the live status asks often, on the core thread).
pub fn gather(engine: &Engine, now: Now, shared: &Registry, source_up: bool) -> Metrics {
    let c = engine.counters();
    let clock = engine.gateway_clock();
    // Times on the corrected gateway clock, as the engine's (docs/reference.md#time).
    let now = Now {
        wall: clock.tick_wall(now.wall, now.mono),
        ..now
    };
    let kernel = crate::sys::clock::kernel_clock();
    let groups = engine
        .group_stats(now)
        .into_iter()
        .map(|g| {
            (
                g.name.to_string(),
                Group {
                    watermark: g.watermark,
                    lag_ms: g.watermark.map(|w| now.wall.saturating_sub(w)),
                    devices_active: g.active,
                    devices_idle: g.idle,
                    devices_offline: g.offline,
                    readings_missing: g.missing,
                    timestamps_invalid: g.timestamps_invalid,
                    bound_ms: g.bound_ms,
                    lateness_ms: g.lateness_ms,
                    open_windows: g.open_windows,
                    conditions: g.conditions,
                    conditions_raised: g.conditions_raised,
                },
            )
        })
        .collect();
    let oldest = shared.outbox_oldest.load(Ordering::Relaxed);
    Metrics {
        at: now.wall,
        uptime_s: u64::try_from(now.mono / 1000).unwrap_or(0),
        config_hash: shared.config_hash(),
        reloads: Reloads {
            applied: shared.reloads[0].load(Ordering::Relaxed),
            rejected: shared.reloads[1].load(Ordering::Relaxed),
        },
        groups,
        counters: Counters {
            received: c.received,
            accepted: c.accepted,
            late: c.late,
            duplicates: c.duplicates,
            readings_missing: c.readings_missing,
            timestamps_invalid: c.timestamps_invalid,
            rejected: Reason::ALL
                .iter()
                .map(|r| (r.as_str().to_owned(), c.rejected(*r)))
                .collect(),
            windows_emitted: c.windows_emitted,
            alerts: c.alerts,
            conditions: c.conditions.into(),
            outbox_depth: shared.outbox_depth.load(Ordering::Relaxed),
            outbox_dropped: shared.outbox_dropped.load(Ordering::Relaxed),
            sparkplug_other: c.sparkplug_other,
            sparkplug_rebirths_refused: shared.rebirths_refused.load(Ordering::Relaxed),
            source_path_down: shared.path_down[0].load(Ordering::Relaxed),
            sink_path_down: shared.path_down[1].load(Ordering::Relaxed),
        },
        outbox_oldest_age_ms: (oldest > 0).then(|| now.wall.saturating_sub(oldest)),
        outputs: shared.outputs(),
        connected: Connections {
            source: source_up,
            sink: shared.sink_up.load(Ordering::Relaxed),
        },
        clock_held: engine.clock_held(),
        gateway_clock: GatewayClockOut {
            error_ms: clock.error,
            kernel_synced: kernel.synced,
            kernel_maxerror_us: kernel.maxerror_us,
            verdict: clock.verdict,
        },
        store: StoreIo {
            journal_commits: shared.commits[0].load(Ordering::Relaxed),
            checkpoints: shared.commits[1].load(Ordering::Relaxed),
            journal_bytes: shared.journal_bytes.load(Ordering::Relaxed),
            disk_write_bytes: None,
            ok: shared.store_ok.load(Ordering::Relaxed),
        },
        memory: shared.memory.status(),
        pair: shared.pair(),
        pair_bytes: shared.pair_bytes.load(Ordering::Relaxed),
        ack_delay: shared.ack_delay.snapshot(),
    }
}

/// What this process has sent to storage, as the kernel counts it.
fn disk_write_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
}

#[path = "prom.rs"]
mod prom;
