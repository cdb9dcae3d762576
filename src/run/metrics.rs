//! `P/metrics` (SPEC §8): gateway state at an instant, published at QoS 0.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::Serialize;

use super::Shared;
use crate::engine::{Engine, Now};
use crate::model::{Millis, Reason};

#[derive(Serialize)]
struct Group {
    watermark: Option<Millis>,
    lag_ms: Option<Millis>,
    devices_active: u64,
    devices_idle: u64,
    devices_offline: u64,
}

#[derive(Serialize)]
struct Counters {
    received: u64,
    accepted: u64,
    late: u64,
    duplicates: u64,
    rejected: BTreeMap<&'static str, u64>,
    windows_emitted: u64,
    alerts: u64,
    outbox_depth: u64,
    outbox_dropped: u64,
}

#[derive(Serialize)]
struct Connections {
    source: bool,
    sink: bool,
}

#[derive(Serialize)]
struct Metrics {
    at: Millis,
    uptime_s: u64,
    groups: BTreeMap<String, Group>,
    counters: Counters,
    outbox_oldest_age_ms: Option<Millis>,
    connected: Connections,
    clock_held: bool,
}

/// The metrics payload, encoded per `[sink] format`.
pub fn snapshot(engine: &Engine, now: Now, shared: &Shared, source_up: bool) -> Vec<u8> {
    let c = engine.counters();
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
                },
            )
        })
        .collect();
    let oldest = shared.outbox_oldest.load(Ordering::Relaxed);
    let m = Metrics {
        at: now.wall,
        uptime_s: u64::try_from(now.mono / 1000).unwrap_or(0),
        groups,
        counters: Counters {
            received: c.received,
            accepted: c.accepted,
            late: c.late,
            duplicates: c.duplicates,
            rejected: Reason::ALL
                .iter()
                .map(|r| (r.as_str(), c.rejected(*r)))
                .collect(),
            windows_emitted: c.windows_emitted,
            alerts: c.alerts,
            outbox_depth: shared.outbox_depth.load(Ordering::Relaxed),
            outbox_dropped: shared.outbox_dropped.load(Ordering::Relaxed),
        },
        outbox_oldest_age_ms: (oldest > 0).then(|| now.wall.saturating_sub(oldest)),
        connected: Connections {
            source: source_up,
            sink: shared.sink_up.load(Ordering::Relaxed),
        },
        clock_held: engine.clock_held(),
    };
    match shared.format {
        crate::config::SinkFormat::Json => serde_json::to_vec(&m).unwrap_or_default(),
        crate::config::SinkFormat::Cbor => {
            let mut b = Vec::new();
            let _ = ciborium::ser::into_writer(&m, &mut b);
            b
        }
    }
}
