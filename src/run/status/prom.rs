//! `/metrics`: the gateway's [`Metrics`] in the Prometheus text format.

use super::Metrics;
use crate::model::Millis;
use crate::run::status::registry::ACK_BUCKETS_MS;

impl Metrics {
    /// Prometheus text exposition format (0.0.4).
    pub fn prometheus(&self) -> String {
        let mut p = Prom(String::with_capacity(2048 + self.groups.len() * 400));
        self.prom_counters(&mut p);
        self.prom_links(&mut p);
        self.prom_store(&mut p);
        self.prom_gateway(&mut p);
        self.prom_pair(&mut p);
        self.prom_outputs(&mut p);
        self.prom_groups(&mut p);
        self.prom_conditions(&mut p);
        self.prom_memory(&mut p);
        p.0
    }

    fn prom_memory(&self, p: &mut Prom) {
        let m = &self.memory;
        p.one(
            "memory_rss_bytes",
            "gauge",
            "Resident set of the gateway (docs/reference.md#memory).",
            m.rss_bytes,
        );
        if let Some(l) = m.limit_bytes {
            p.one(
                "memory_limit_bytes",
                "gauge",
                "The limit the gateway stays under: gateway.memory_max_mb or its cgroup's memory.max.",
                l,
            );
        }
        p.one(
            "memory_held",
            "gauge",
            "1 while input is held because memory is near its limit (the broker queues).",
            u8::from(m.held),
        );
        p.one(
            "memory_holds_total",
            "counter",
            "Times input was held for memory since the gateway started.",
            m.holds,
        );
        p.one(
            "memory_held_seconds_total",
            "counter",
            "Time input was held for memory since the gateway started.",
            seconds(Millis::try_from(m.held_ms).unwrap_or(Millis::MAX)),
        );
        p.one(
            "memory_outputs_bytes",
            "gauge",
            "Results in memory on their way upstream (a close burst's next slice waits above 4 MiB).",
            m.outputs_bytes,
        );
    }

    fn prom_outputs(&self, p: &mut Prom) {
        if self.outputs.is_empty() {
            return;
        }
        type Figure = fn(&crate::run::status::registry::OutputStatus) -> u64;
        let series: [(&str, &str, &str, Figure); 3] = [
            (
                "output_pending",
                "gauge",
                "Outbox entries this output has not confirmed.",
                |o| o.pending,
            ),
            (
                "output_written_total",
                "counter",
                "Entries this output wrote, since the state was created.",
                |o| o.written,
            ),
            (
                "output_refused_total",
                "counter",
                "Entries this output's database refused (set aside on the rejected topic).",
                |o| o.refused,
            ),
        ];
        for (name, kind, help, f) in series {
            p.head(name, kind, help);
            for o in &self.outputs {
                p.line(format_args!(
                    "tidemark_{name}{{output=\"{}\"}} {}",
                    o.name,
                    f(o)
                ));
            }
        }
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
            "This board of a standby pair: its node, role and the peer's state (docs/reference.md#standby--two-boards-one-gateway).",
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
            "The config in force: its config_hash (docs/reference.md#reload-sighup-systemctl-reload-tidemark).",
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
            "Source paths found dead by a probe not back in time (docs/reference.md#group_defaults-and-groupsname), since start.",
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

    fn prom_conditions(&self, p: &mut Prom) {
        p.head(
            "conditions_total",
            "counter",
            "Condition records published, by state (docs/conditions.md).",
        );
        for (g, s) in &self.groups {
            let g = label(g);
            for (state, n) in crate::output::ConditionState::ALL.iter().zip(s.conditions) {
                let state = state.as_str();
                p.line(format_args!(
                    "tidemark_conditions_total{{group=\"{g}\",state=\"{state}\"}} {n}"
                ));
            }
        }
        p.head(
            "conditions_raised_devices",
            "gauge",
            "Devices of the group with a condition raised now.",
        );
        for (g, s) in &self.groups {
            let (g, n) = (label(g), s.conditions_raised);
            p.line(format_args!(
                "tidemark_conditions_raised_devices{{group=\"{g}\"}} {n}"
            ));
        }
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
            "The watermark bound in force: out_of_orderness_ms, or what \"auto\" learned (docs/reference.md#group_defaults-and-groupsname).",
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
