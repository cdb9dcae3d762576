//! What an operator should see in the log from the core: clock distrust, alerts,
//! and late/rejected/missing rates once a minute.

use crate::engine::Engine;
use crate::model::Millis;
use crate::output::{AlertType, GatewayAlert, Output};
use crate::run::status::registry::Registry;

/// What an operator should see in the log: clock distrust as it happens, and
/// late/rejected rates once a minute when there were any.
pub(super) struct Report {
    pub(super) next: Millis,
    late: u64,
    rejected: u64,
    duplicates: u64,
    missing: u64,
    /// Devices' missing counts at the last report (only those with any).
    missing_by_device: std::collections::HashMap<(String, String), u64>,
    clock_held: bool,
    /// The first call only takes the restored totals.
    started: bool,
}

const REPORT_EVERY_MS: Millis = 60_000;

impl Report {
    pub(super) fn new(mono: Millis) -> Self {
        Self {
            next: mono.saturating_add(REPORT_EVERY_MS),
            late: 0,
            rejected: 0,
            duplicates: 0,
            missing: 0,
            missing_by_device: std::collections::HashMap::new(),
            clock_held: false,
            started: false,
        }
    }

    /// A log line when the wall clock becomes implausible or plausible again.
    pub(super) fn clock(&mut self, engine: &Engine, wall: Millis) {
        if engine.clock_held() == self.clock_held {
            return;
        }
        self.clock_held = engine.clock_held();
        if self.clock_held {
            tracing::warn!(
                wall_ms = wall,
                "gateway wall clock is before time.min_valid_epoch_ms (no RTC, NTP not synced?): processing time held"
            );
        } else {
            tracing::info!(
                wall_ms = wall,
                "gateway wall clock plausible again: processing time resumes"
            );
        }
    }

    pub(super) fn outputs(&self, outputs: &[Output], registry: &Registry) {
        for o in outputs {
            if matches!(o, Output::Alert(_) | Output::Gateway(_)) {
                registry
                    .alerts
                    .push(serde_json::to_value(o.payload()).unwrap_or_default());
            }
            if let Output::Gateway(g) = o {
                match g {
                    GatewayAlert::Clock {
                        error_ms,
                        devices_agreeing,
                        ..
                    } => tracing::warn!(
                        error_ms,
                        devices_agreeing,
                        "gateway clock wrong (kernel reports it unsynchronized): event times follow the devices' consensus"
                    ),
                    GatewayAlert::ClockOk { .. } => {
                        tracing::info!("gateway clock agrees with the devices again");
                    }
                }
            }
            if let Output::Alert(a) = o {
                match a.kind {
                    AlertType::ClockSkew => tracing::warn!(
                        group = %a.group, device = %a.device, offset_ms = a.offset_ms,
                        "device clock distrusted: arrival time used"
                    ),
                    AlertType::ClockOk => tracing::info!(
                        group = %a.group, device = %a.device, offset_ms = a.offset_ms,
                        "device clock trusted again"
                    ),
                    AlertType::Offline => tracing::info!(
                        group = %a.group, device = %a.device, last_seen = a.last_seen,
                        "device offline"
                    ),
                    AlertType::Online => {}
                }
            }
        }
    }

    pub(super) fn rates(&mut self, engine: &Engine, mono: Millis) {
        self.next = mono.saturating_add(REPORT_EVERY_MS);
        let c = engine.counters();
        let rejected: u64 = c.rejected.iter().sum();
        let (late, rej, dup) = (
            c.late.saturating_sub(self.late),
            rejected.saturating_sub(self.rejected),
            c.duplicates.saturating_sub(self.duplicates),
        );
        if self.started && late + rej > 0 {
            tracing::warn!(late, rejected = rej, duplicates = dup, "in the last minute");
        }
        (self.late, self.rejected, self.duplicates) = (c.late, rejected, c.duplicates);
        if self.started && c.readings_missing > self.missing {
            self.report_missing(engine, c.readings_missing - self.missing);
        } else if !self.started {
            self.remember_missing(engine);
        }
        self.missing = c.readings_missing;
        self.started = true;
    }

    fn remember_missing(&mut self, engine: &Engine) -> Vec<(u64, String)> {
        let mut grew = Vec::new();
        for g in engine.groups() {
            for d in engine.group_devices(&g.name).filter(|d| d.missing > 0) {
                let key = (d.group.to_string(), d.id.to_string());
                let before = self.missing_by_device.insert(key, d.missing).unwrap_or(0);
                if d.missing > before {
                    grew.push((d.missing - before, format!("{}/{}", d.group, d.id)));
                }
            }
        }
        grew
    }

    /// One line naming the devices that lost the most in the last minute.
    fn report_missing(&mut self, engine: &Engine, missing: u64) {
        let mut grew = self.remember_missing(engine);
        grew.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let worst: Vec<String> = grew
            .iter()
            .take(5)
            .map(|(n, d)| format!("{d} {n}"))
            .collect();
        tracing::warn!(
            missing,
            devices = grew.len(),
            worst = %worst.join(", "),
            "readings missing before the gateway in the last minute (sequence gaps: a site broker or radio link dropping messages?)"
        );
    }
}
