//! `P/metrics` (SPEC §8): gateway state at an instant, published at QoS 0.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::engine::{Engine, Now};
use crate::model::{Millis, Reason};
use crate::run::status::registry::{ACK_BUCKETS_MS, Registry};

#[derive(Debug, Serialize)]
pub(crate) struct Group {
    pub(crate) watermark: Option<Millis>,
    pub(crate) lag_ms: Option<Millis>,
    pub(crate) devices_active: u64,
    pub(crate) devices_idle: u64,
    pub(crate) devices_offline: u64,
    readings_missing: u64,
    timestamps_invalid: u64,
    /// The watermark bound in force (learned when "auto", SPEC §5).
    pub(crate) bound_ms: Millis,
    /// The allowed lateness in force (learned when "auto").
    pub(crate) lateness_ms: Millis,
    /// Live status only (not in `P/metrics`).
    #[serde(skip)]
    pub(crate) open_windows: u64,
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
    /// Outputs waiting in the outbox.
    pub outbox_depth: u64,
    /// Outputs the outbox bound dropped.
    pub outbox_dropped: u64,
    /// Sparkplug metrics of types that are not aggregated.
    pub sparkplug_other: u64,
    /// NCMD rebirth requests to the edge node inside `rebirth_min_interval_ms`, not answered.
    pub sparkplug_rebirths_refused: u64,
    /// Source paths found dead (a probe not back in time) since the gateway started (SPEC §5).
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

/// The gateway's own clock (SPEC §4, §8 `P/metrics`).
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

/// Reloads since the gateway started (SPEC §11).
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
    /// The standby pair (SPEC §13); absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pair: Option<crate::pair::Status>,
    #[serde(skip)]
    pair_bytes: u64,
    #[serde(skip)]
    ack_delay: ([u64; 11], u64),
}

impl Metrics {
    /// The `P/metrics` payload, encoded per `[sink] format`.
    pub fn encode(&self, format: crate::config::SinkFormat) -> Vec<u8> {
        format.encode(self)
    }

    /// The counters an edge node carries (SPEC §10b), in [`crate::sparkplug::node::COUNTERS`] order.
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

    /// Prometheus text exposition format (0.0.4).
    pub fn prometheus(&self) -> String {
        let mut p = Prom(String::with_capacity(2048 + self.groups.len() * 400));
        self.prom_counters(&mut p);
        self.prom_links(&mut p);
        self.prom_store(&mut p);
        self.prom_gateway(&mut p);
        self.prom_pair(&mut p);
        self.prom_groups(&mut p);
        p.0
    }

    fn prom_pair(&self, p: &mut Prom) {
        let Some(pair) = &self.pair else {
            return;
        };
        let role = match pair.role {
            crate::pair::Role::Active => "active",
            crate::pair::Role::Standby => "standby",
        };
        p.head(
            "pair_info",
            "gauge",
            "This board of a standby pair: its node, role and the peer's state (SPEC §13).",
        );
        let peer = match pair.peer.state {
            crate::pair::PeerStateName::Synced => "synced",
            crate::pair::PeerStateName::CatchingUp => "catching_up",
            crate::pair::PeerStateName::Lost => "lost",
        };
        p.line(format_args!(
            "tidemark_pair_info{{node=\"{}\",role=\"{role}\",peer=\"{}\",peer_state=\"{peer}\"}} 1",
            label(&pair.node),
            label(&pair.peer.node)
        ));
        p.one(
            "pair_replicated_bytes_total",
            "counter",
            "Bytes of journal records and snapshots published to the standby, since start.",
            self.pair_bytes,
        );
        p.one(
            "pair_epoch",
            "gauge",
            "The pair's epoch (raised at each takeover).",
            pair.epoch,
        );
        p.one(
            "pair_lag_records",
            "gauge",
            "Commits the standby lacks (on the standby: how far it is behind).",
            pair.lag_records,
        );
        p.one(
            "pair_lag_seconds",
            "gauge",
            "Age of the oldest commit waiting for the standby.",
            seconds(i64::try_from(pair.lag_ms).unwrap_or(i64::MAX)),
        );
        p.one(
            "pair_rejected_total",
            "counter",
            "Messages on the pair's topics refused (forged, replayed, too large) since start.",
            pair.rejected,
        );
    }

    fn prom_counters(&self, p: &mut Prom) {
        let c = &self.counters;
        for (name, help, v) in [
            (
                "received_total",
                "Messages received from the source.",
                c.received,
            ),
            (
                "accepted_total",
                "Events accepted into windows.",
                c.accepted,
            ),
            (
                "late_total",
                "Events later than the allowed lateness.",
                c.late,
            ),
            (
                "duplicates_total",
                "Events dropped as duplicates by sequence number.",
                c.duplicates,
            ),
            (
                "windows_emitted_total",
                "Window results emitted.",
                c.windows_emitted,
            ),
            (
                "sparkplug_metrics_other_total",
                "Sparkplug metrics of types that are not aggregated (strings, bytes, datasets, nulls).",
                c.sparkplug_other,
            ),
            ("alerts_total", "Alerts raised.", c.alerts),
            (
                "outbox_dropped_total",
                "Outputs dropped because the outbox was full.",
                c.outbox_dropped,
            ),
        ] {
            p.one(name, "counter", help, v);
        }
        p.head("rejected_total", "counter", "Messages rejected, by reason.");
        for (reason, v) in &c.rejected {
            p.line(format_args!(
                "tidemark_rejected_total{{reason=\"{reason}\"}} {v}"
            ));
        }
        p.one(
            "outbox_depth",
            "gauge",
            "Outputs waiting for the upstream broker.",
            c.outbox_depth,
        );
        p.one(
            "outbox_oldest_age_seconds",
            "gauge",
            "Age of the oldest undelivered output.",
            seconds(self.outbox_oldest_age_ms.unwrap_or(0)),
        );
    }

    fn prom_links(&self, p: &mut Prom) {
        p.head("connected", "gauge", "1 when the link is connected.");
        for (link, up) in [
            ("source", self.connected.source),
            ("sink", self.connected.sink),
        ] {
            p.line(format_args!(
                "tidemark_connected{{link=\"{link}\"}} {}",
                u8::from(up)
            ));
        }
        p.one(
            "clock_held",
            "gauge",
            "1 while the gateway clock is implausible and processing time is held.",
            u8::from(self.clock_held),
        );
        let g = &self.gateway_clock;
        p.one(
            "gateway_clock_error_seconds",
            "gauge",
            "Estimated error of the gateway wall clock (gateway minus the devices' consensus); 0 while trusted.",
            seconds(g.error_ms),
        );
        let wrong = g.verdict == crate::time::gateway::Verdict::Wrong;
        p.one(
            "gateway_clock_wrong",
            "gauge",
            "1 while a quorum of devices overrules the (unsynchronized) gateway clock.",
            u8::from(wrong),
        );
        p.one(
            "kernel_clock_synced",
            "gauge",
            "1 while the kernel reports the wall clock synchronized (adjtimex STA_UNSYNC clear).",
            u8::from(g.kernel_synced),
        );
        p.one(
            "kernel_clock_maxerror_seconds",
            "gauge",
            "The kernel's maximum error estimate of the wall clock.",
            format_args!(
                "{}.{:06}",
                g.kernel_maxerror_us.div_euclid(1_000_000),
                g.kernel_maxerror_us.rem_euclid(1_000_000)
            ),
        );
    }

    fn prom_store(&self, p: &mut Prom) {
        p.one(
            "state_store_ok",
            "gauge",
            "1 while the state store commits; 0 while it cannot (a full disk): input paused, acks held.",
            u8::from(self.store.ok),
        );
        p.head(
            "commits_total",
            "counter",
            "Durable writes: group commits to the journal, checkpoints to the state file.",
        );
        p.line(format_args!(
            "tidemark_commits_total{{kind=\"journal\"}} {}\ntidemark_commits_total{{kind=\"checkpoint\"}} {}",
            self.store.journal_commits, self.store.checkpoints
        ));
        p.one(
            "journal_bytes_total",
            "counter",
            "Bytes appended to the write-ahead journal.",
            self.store.journal_bytes,
        );
        if let Some(b) = self.store.disk_write_bytes {
            p.one(
                "disk_write_bytes_total",
                "counter",
                "Bytes this process sent to storage (/proc/self/io write_bytes).",
                b,
            );
        }
        p.head(
            "ack_delay_seconds",
            "histogram",
            "Time from receipt of a QoS 1 message to the release of its ack (after the commit).",
        );
        let (buckets, sum_ms) = self.ack_delay;
        let mut cumulative = 0;
        for (i, n) in buckets.iter().enumerate() {
            cumulative += n;
            let le = ACK_BUCKETS_MS
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |&b| seconds(b));
            p.line(format_args!(
                "tidemark_ack_delay_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            ));
        }
        p.line(format_args!(
            "tidemark_ack_delay_seconds_sum {}\ntidemark_ack_delay_seconds_count {cumulative}",
            seconds(i64::try_from(sum_ms).unwrap_or(i64::MAX))
        ));
    }

    fn prom_gateway(&self, p: &mut Prom) {
        p.head(
            "config_info",
            "gauge",
            "The config in force: its config_hash (SPEC §11).",
        );
        p.line(format_args!(
            "tidemark_config_info{{hash=\"{}\"}} 1",
            label(&self.config_hash)
        ));
        p.head(
            "config_reloads_total",
            "counter",
            "Reloads (SIGHUP), by result.",
        );
        p.line(format_args!(
            "tidemark_config_reloads_total{{result=\"applied\"}} {}\ntidemark_config_reloads_total{{result=\"rejected\"}} {}",
            self.reloads.applied, self.reloads.rejected
        ));
        p.one(
            "sparkplug_rebirths_refused_total",
            "counter",
            "NCMD rebirth requests to the edge node inside rebirth_min_interval_ms, not answered.",
            self.counters.sparkplug_rebirths_refused,
        );
        p.one(
            "source_path_down_total",
            "counter",
            "Source paths found dead by a probe not back in time (SPEC §5), since start.",
            self.counters.source_path_down,
        );
        p.one(
            "sink_path_down_total",
            "counter",
            "Uplinks found dead by a publish or ping unanswered in time, since start.",
            self.counters.sink_path_down,
        );
        p.one(
            "uptime_seconds",
            "gauge",
            "Seconds since the gateway started.",
            self.uptime_s,
        );
    }

    fn prom_groups(&self, p: &mut Prom) {
        p.head(
            "group_watermark_seconds",
            "gauge",
            "Event-time watermark of the group (epoch).",
        );
        for (g, s) in &self.groups {
            if let Some(w) = s.watermark {
                let (g, w) = (label(g), seconds(w));
                p.line(format_args!(
                    "tidemark_group_watermark_seconds{{group=\"{g}\"}} {w}"
                ));
            }
        }
        p.head(
            "group_lag_seconds",
            "gauge",
            "Gateway clock minus the group watermark.",
        );
        for (g, s) in &self.groups {
            if let Some(l) = s.lag_ms {
                let (g, l) = (label(g), seconds(l));
                p.line(format_args!(
                    "tidemark_group_lag_seconds{{group=\"{g}\"}} {l}"
                ));
            }
        }
        p.head(
            "watermark_bound_ms",
            "gauge",
            "The watermark bound in force: out_of_orderness_ms, or what \"auto\" learned (SPEC §5).",
        );
        for (g, s) in &self.groups {
            let (g, b) = (label(g), s.bound_ms);
            p.line(format_args!(
                "tidemark_watermark_bound_ms{{group=\"{g}\"}} {b}"
            ));
        }
        p.head(
            "group_allowed_lateness_seconds",
            "gauge",
            "The allowed lateness in force: allowed_lateness_ms, or what \"auto\" learned.",
        );
        for (g, s) in &self.groups {
            let (g, l) = (label(g), seconds(s.lateness_ms));
            p.line(format_args!(
                "tidemark_group_allowed_lateness_seconds{{group=\"{g}\"}} {l}"
            ));
        }
        p.head(
            "readings_missing_total",
            "gauge",
            "Readings lost before the gateway (sequence-number gaps); a late arrival takes its count back.",
        );
        for (g, s) in &self.groups {
            let (g, n) = (label(g), s.readings_missing);
            p.line(format_args!(
                "tidemark_readings_missing_total{{group=\"{g}\"}} {n}"
            ));
        }
        p.head(
            "timestamps_invalid_total",
            "counter",
            "Events accepted although their device timestamp was missing, unparseable or invalid (timed by arrival).",
        );
        for (g, s) in &self.groups {
            let (g, n) = (label(g), s.timestamps_invalid);
            p.line(format_args!(
                "tidemark_timestamps_invalid_total{{group=\"{g}\"}} {n}"
            ));
        }
        p.head("group_devices", "gauge", "Devices of the group by state.");
        for (g, s) in &self.groups {
            for (state, n) in [
                ("active", s.devices_active),
                ("idle", s.devices_idle),
                ("offline", s.devices_offline),
            ] {
                let g = label(g);
                p.line(format_args!(
                    "tidemark_group_devices{{group=\"{g}\",state=\"{state}\"}} {n}"
                ));
            }
        }
    }
}

/// Prometheus text being written.
struct Prom(String);

impl Prom {
    /// `# HELP` and `# TYPE` of `tidemark_{name}`.
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        use std::fmt::Write;
        let _ = writeln!(
            self.0,
            "# HELP tidemark_{name} {help}\n# TYPE tidemark_{name} {kind}"
        );
    }

    fn line(&mut self, line: std::fmt::Arguments<'_>) {
        use std::fmt::Write;
        let _ = self.0.write_fmt(line);
        self.0.push('\n');
    }

    /// A metric of one sample without labels.
    fn one(&mut self, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
        self.head(name, kind, help);
        self.line(format_args!("tidemark_{name} {v}"));
    }
}

fn seconds(ms: Millis) -> String {
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

/// Group names are `[A-Za-z0-9_.:-]`; escaped anyway, as the format asks.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
    // Times on the corrected gateway clock, as the engine's (SPEC §4).
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
            outbox_depth: shared.outbox_depth.load(Ordering::Relaxed),
            outbox_dropped: shared.outbox_dropped.load(Ordering::Relaxed),
            sparkplug_other: c.sparkplug_other,
            sparkplug_rebirths_refused: shared.rebirths_refused.load(Ordering::Relaxed),
            source_path_down: shared.path_down[0].load(Ordering::Relaxed),
            sink_path_down: shared.path_down[1].load(Ordering::Relaxed),
        },
        outbox_oldest_age_ms: (oldest > 0).then(|| now.wall.saturating_sub(oldest)),
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
