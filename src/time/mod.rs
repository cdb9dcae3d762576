//! The pure event-time building blocks: clock-offset estimation, duplicate
//! suppression, the group watermark fold and windows. No I/O, no clock reads: time is passed in.

pub mod adaptive;
mod buckets;
pub mod extras;
pub mod gateway;
pub mod metrics;
pub mod moments;
pub mod seq;
pub mod sketch;
pub mod skew;
mod varint;
pub mod watermark;
pub mod window;
pub mod windows;

use serde::{Deserialize, Serialize};

/// Source of event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TimePolicy {
    /// Device time corrected by the estimated clock offset.
    Calibrated,
    /// Device time as sent.
    Device,
    /// Gateway arrival time.
    Arrival,
}

/// Handling of missing or invalid device timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InvalidPolicy {
    /// Use arrival time.
    Arrival,
    /// Reject (`invalid_timestamp`).
    Reject,
}

/// Event-time settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct TimeConfig {
    /// Event-time source.
    pub policy: TimePolicy,
    /// Lowest plausible device (and gateway) clock.
    pub min_valid_epoch_ms: i64,
    /// Invalid timestamp handling.
    pub invalid: InvalidPolicy,
    /// Distrust threshold of the estimated offset.
    pub max_skew_ms: i64,
    /// Offset estimator buckets.
    pub skew_window: usize,
    /// Future bound.
    pub max_future_ms: i64,
    /// Age bound.
    pub max_age_ms: i64,
    /// Whether a quorum of devices may overrule an unsynchronized gateway clock.
    pub gateway_clock: gateway::GatewayClockMode,
}

/// Epoch ms as UTC, `2026-12-01T22:49:03.123Z` (civil date from days, proleptic Gregorian).
pub fn utc(t: i64) -> String {
    let (days, ms) = (t.div_euclid(86_400_000), t.rem_euclid(86_400_000));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_renders_epoch_ms_on_both_sides_of_the_epoch_and_leap_days() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_764_480_000_123), "2025-11-30T05:20:00.123Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(-1), "1969-12-31T23:59:59.999Z");
    }
}
