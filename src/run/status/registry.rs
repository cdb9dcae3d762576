//! The numbers the components write and the metrics read: counters and gauges
//! only. Feedback between components travels as typed events (see
//! [`crate::run::events`]), never through here.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use std::sync::Arc;

use crate::model::Millis;
use crate::run::status::health::Health;

/// Upper bounds (ms) of the ack-delay histogram's buckets.
pub const ACK_BUCKETS_MS: [Millis; 10] = [10, 50, 100, 250, 500, 1000, 1250, 1500, 2000, 5000];

/// A fixed-bucket histogram of durations, shared between threads.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Counts per bucket of [`ACK_BUCKETS_MS`], then +Inf.
    buckets: [AtomicU64; 11],
    sum_ms: AtomicU64,
}

impl Histogram {
    /// One observation of `ms`.
    pub fn observe(&self, ms: Millis) {
        let i = ACK_BUCKETS_MS.partition_point(|&b| b < ms);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ms
            .fetch_add(u64::try_from(ms).unwrap_or(0), Ordering::Relaxed);
    }

    /// Counts per bucket and the sum of all ack delays (ms).
    pub fn snapshot(&self) -> ([u64; 11], u64) {
        (
            std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            self.sum_ms.load(Ordering::Relaxed),
        )
    }
}

/// Written by one component each, read by metrics and the HTTP endpoint.
#[derive(Debug)]
pub struct Registry {
    /// Outbox entries after the last commit (store).
    pub outbox_depth: AtomicU64,
    /// Outputs dropped because the outbox was full (store).
    pub outbox_dropped: AtomicU64,
    /// Wall time of the oldest undelivered output, 0: none (store).
    pub outbox_oldest: AtomicI64,
    /// The sink is connected (sink).
    pub sink_up: AtomicBool,
    /// Messages handed to the core in this process (core).
    pub received: AtomicU64,
    /// Durable writes: journal records \[0\], checkpoints \[1\] (store).
    pub commits: [AtomicU64; 2],
    /// Bytes appended to the journal (store).
    pub journal_bytes: AtomicU64,
    /// Time from receipt to release of QoS 1 acks (store).
    pub ack_delay: Histogram,
    /// The state store commits (store).
    pub store_ok: AtomicBool,
    /// Reloads applied \[0\] and rejected \[1\] (reload).
    pub reloads: [AtomicU64; 2],
    /// `config_hash` of the config in force (reload).
    config_hash: Mutex<String>,
    /// Liveness of the parts (watchdog, `/healthz`).
    pub health: Arc<Health>,
    /// The latest alerts, device and gateway level (core, sink).
    pub alerts: AlertLog,
    /// Links found dead by their own checks: source probes unanswered \[0\],
    /// sink publishes or pings unanswered \[1\] (docs/reference.md#group_defaults-and-groupsname "proven path").
    pub path_down: [AtomicU64; 2],
    /// The id of the remote document in force, 0 for none (`P/status` `config_id`).
    pub config_id: AtomicU64,
    /// NCMD rebirth requests inside `rebirth_min_interval_ms`, not answered (edge node).
    pub rebirths_refused: AtomicU64,
    /// The standby pair as last seen (pair task), None without `[standby]`.
    pub pair: Mutex<Option<crate::pair::Status>>,
    /// Bytes of records and snapshots published to the standby (pair task).
    pub pair_bytes: AtomicU64,
    /// One past the newest outbox number, after the last commit (store).
    pub outbox_end: AtomicU64,
    /// Each output's figures, by [`crate::model::OutputKind`] (each output).
    pub outputs: [OutputStat; crate::model::OutputKind::ALL.len()],
    /// The memory ceiling (core; undelivered output bytes: store).
    pub memory: crate::run::ceiling::MemoryStat,
}

/// One output's figures (docs/reference.md#sinkpostgres-and-sinkinflux).
#[derive(Debug, Default)]
pub struct OutputStat {
    /// Configured.
    pub enabled: AtomicBool,
    /// Its link or session is up.
    pub connected: AtomicBool,
    /// One past the highest outbox number it confirmed.
    pub upto: AtomicU64,
    /// Entries written since the state was created.
    pub written: AtomicU64,
    /// Entries refused (set aside) since the state was created.
    pub refused: AtomicU64,
    /// The last failure, until the next success.
    pub last_error: Mutex<Option<String>>,
}

/// One output as `/api/v1/status` shows it (docs/reference.md#sinkpostgres-and-sinkinflux).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OutputStatus {
    /// `mqtt`, `sparkplug`, `postgres` or `influx`.
    pub name: String,
    /// Its link or session is up.
    pub connected: bool,
    /// Outbox entries it has not confirmed.
    pub pending: u64,
    /// Entries written since the state was created.
    pub written: u64,
    /// Entries refused (set aside) since the state was created.
    pub refused: u64,
    /// The last failure, until the next success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl Registry {
    /// Every enabled output's figures.
    pub fn outputs(&self) -> Vec<OutputStatus> {
        let end = self.outbox_end.load(Ordering::Relaxed);
        let depth = self.outbox_depth.load(Ordering::Relaxed);
        crate::model::OutputKind::ALL
            .iter()
            .zip(&self.outputs)
            .filter(|(_, s)| s.enabled.load(Ordering::Relaxed))
            .map(|(k, s)| OutputStatus {
                name: k.as_str().to_string(),
                connected: match k {
                    crate::model::OutputKind::Mqtt | crate::model::OutputKind::Sparkplug => {
                        self.sink_up.load(Ordering::Relaxed)
                    }
                    _ => s.connected.load(Ordering::Relaxed),
                },
                pending: end
                    .saturating_sub(s.upto.load(Ordering::Relaxed))
                    .min(depth),
                written: s.written.load(Ordering::Relaxed),
                refused: s.refused.load(Ordering::Relaxed),
                last_error: s.last_error(),
            })
            .collect()
    }
}

impl OutputStat {
    /// A failure to show; None clears it.
    pub fn failed(&self, e: Option<String>) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = e;
    }

    /// The last failure.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Registry {
    /// A registry with the restored outbox figures.
    pub fn new(health: Arc<Health>, outbox_depth: u64, outbox_dropped: u64, hash: String) -> Self {
        Self {
            outbox_depth: AtomicU64::new(outbox_depth),
            outbox_dropped: AtomicU64::new(outbox_dropped),
            outbox_oldest: AtomicI64::new(0),
            sink_up: AtomicBool::new(false),
            received: AtomicU64::new(0),
            commits: [AtomicU64::new(0), AtomicU64::new(0)],
            journal_bytes: AtomicU64::new(0),
            ack_delay: Histogram::default(),
            store_ok: AtomicBool::new(true),
            reloads: [AtomicU64::new(0), AtomicU64::new(0)],
            config_hash: Mutex::new(hash),
            health,
            outbox_end: AtomicU64::new(0),
            outputs: Default::default(),
            alerts: AlertLog::default(),
            path_down: [AtomicU64::new(0), AtomicU64::new(0)],
            config_id: AtomicU64::new(0),
            rebirths_refused: AtomicU64::new(0),
            pair: Mutex::new(None),
            pair_bytes: AtomicU64::new(0),
            memory: crate::run::ceiling::MemoryStat::default(),
        }
    }

    /// The pair's status, if this board is one of a pair.
    pub fn pair(&self) -> Option<crate::pair::Status> {
        self.pair.lock().ok().and_then(|p| p.clone())
    }

    /// The config hash in force.
    pub fn config_hash(&self) -> String {
        self.config_hash
            .lock()
            .map(|h| h.clone())
            .unwrap_or_default()
    }

    /// A reload was applied (`Some(hash)`) or rejected (`None`).
    pub fn reloaded(&self, applied: Option<&str>) {
        match applied {
            Some(h) => {
                if let Ok(mut cur) = self.config_hash.lock() {
                    h.clone_into(&mut cur);
                }
                self.reloads[0].fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.reloads[1].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Alerts kept in memory for `/api/v1/alerts`.
pub const ALERTS_KEPT: usize = 1000;

/// The last alerts (device and gateway level), newest last, for `/api/v1/alerts`.
#[derive(Debug, Default)]
pub struct AlertLog(Mutex<VecDeque<serde_json::Value>>);

impl AlertLog {
    /// Keeps `alert` (its `P/alerts` payload), forgetting the oldest past [`ALERTS_KEPT`].
    pub fn push(&self, alert: serde_json::Value) {
        if let Ok(mut q) = self.0.lock() {
            if q.len() == ALERTS_KEPT {
                q.pop_front();
            }
            q.push_back(alert);
        }
    }

    /// The newest `limit`, newest first.
    pub fn latest(&self, limit: usize) -> Vec<serde_json::Value> {
        self.0
            .lock()
            .map(|q| q.iter().rev().take(limit).cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alert_log_keeps_the_newest_thousand_newest_first() {
        let log = AlertLog::default();
        for i in 0..1500 {
            log.push(serde_json::json!({ "i": i }));
        }
        let all = log.latest(5000);
        assert_eq!(all.len(), ALERTS_KEPT);
        assert_eq!(all[0]["i"], 1499);
        assert_eq!(all[ALERTS_KEPT - 1]["i"], 500);
        assert_eq!(log.latest(2).len(), 2);
    }
}
