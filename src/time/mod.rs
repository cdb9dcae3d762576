//! The pure event-time building blocks: clock-offset estimation, duplicate
//! suppression, the group watermark fold and windows. No I/O, no clock reads: time is passed in.

pub mod gateway;
pub mod seq;
pub mod skew;
pub mod watermark;
pub mod window;

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
#[derive(Debug, Clone)]
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
