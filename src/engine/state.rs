//! The engine's state as values: what the store persists and metrics report.

use serde::{Deserialize, Serialize};

use crate::codec::MetricName;
use crate::model::{Id, Millis, Reason};
use crate::time::gateway::GatewayClock;
use crate::time::seq::SeqWindow;
use crate::time::skew::SkewEstimator;
use crate::time::window::{Window, WindowSpec};

/// Totals since the state was created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Messages handed to the engine.
    pub received: u64,
    /// Events taken into at least one window.
    pub accepted: u64,
    /// Events published on the late topic.
    pub late: u64,
    /// Redelivered (device, seq) pairs dropped.
    pub duplicates: u64,
    /// Rejections by reason, in [`Reason::ALL`] order.
    pub rejected: [u64; 5],
    /// Window results emitted (revisions included).
    pub windows_emitted: u64,
    /// Alerts raised.
    pub alerts: u64,
    /// Readings lost before the gateway, by sequence-number gaps (SPEC §4).
    #[serde(default)]
    pub readings_missing: u64,
    /// Sparkplug metrics of types that are not aggregated (strings, bytes, datasets, nulls).
    #[serde(default)]
    pub sparkplug_other: u64,
    /// Events accepted although their device timestamp was missing, unparseable or
    /// invalid (timed by arrival under `invalid = "arrival"`; SPEC §8).
    #[serde(default)]
    pub timestamps_invalid: u64,
}

impl Counters {
    /// Rejections for one reason.
    pub fn rejected(&self, r: Reason) -> u64 {
        self.rejected[r.index()]
    }
}

/// Persistent state of one device (group, device).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// Group id.
    pub group: Id,
    /// Device id.
    pub id: Id,
    /// Clock-offset estimator.
    pub skew: SkewEstimator,
    /// Clock currently distrusted (`clock_skew` raised).
    pub distrusted: bool,
    /// Largest accepted event time (last_seen).
    pub max_event: Option<Millis>,
    /// Monotonic time of the last accepted event.
    pub last_arrival: Millis,
    /// Liveness: offline alert raised and not yet answered by `online`.
    pub offline: bool,
    /// Retained status `online` published at least once.
    pub announced: bool,
    /// Duplicate filter.
    pub seq: SeqWindow,
    /// Open windows, sorted by start.
    pub windows: Vec<Window>,
    /// Readings lost before the gateway (sequence numbers skipped and not arrived since).
    #[serde(default)]
    pub missing: u64,
    /// Events accepted with an invalid device timestamp.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timestamps_invalid: u64,
    /// Events of this device taken into windows (live status, SPEC §11).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted: u64,
    /// Events of this device published as late.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub late: u64,
    /// Redeliveries of this device dropped as duplicates.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duplicates: u64,
    /// The group's idleness restarts when `last_arrival` was last stored: a record
    /// behind its group's count holds a clock from before the latest restart, and
    /// restores with the group's `restarted_at` (a restart writes the groups only).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub restarts: u32,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero32(v: &u32) -> bool {
    *v == 0
}

/// Persistent state of one group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// Group id.
    pub name: Id,
    /// Watermark; never decreases.
    pub wm: Option<Millis>,
    /// Largest accepted event time of any member.
    pub max_event: Option<Millis>,
    /// Monotonic time of the last accepted event of any member.
    pub last_arrival: Millis,
    /// Window rules by the event time they govern from, oldest first, after a
    /// reload changed the rule (SPEC §11); empty: the configured rule for all times.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleEpoch>,
    /// Idleness restarts (gateway start, source reconnect) so far.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub restarts: u32,
    /// Monotonic time of the latest idleness restart.
    #[serde(default)]
    pub restarted_at: Millis,
}

/// A window rule and the event time from which it governs a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleEpoch {
    /// First event time under this rule (the next epoch's `from` ends it).
    pub from: Millis,
    /// The rule.
    pub window: WindowSpec,
}

/// One group's liveness counts at an instant.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GroupStats {
    /// Group id.
    pub name: Id,
    /// Watermark.
    pub watermark: Option<Millis>,
    /// Devices heard from within `idle_timeout_ms`.
    pub active: u64,
    /// Devices silent for `idle_timeout_ms` and not offline.
    pub idle: u64,
    /// Devices offline.
    pub offline: u64,
    /// Readings lost before the gateway, summed over the members.
    pub missing: u64,
    /// Events accepted with an invalid device timestamp, summed over the members.
    pub timestamps_invalid: u64,
    /// Open windows of the members.
    pub open_windows: u64,
}

/// The state changed since the last [`Engine::take_changes`], as values: the
/// store commits them on its own thread while the engine keeps working.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Changes {
    /// Changed groups.
    pub groups: Vec<Group>,
    /// Changed devices, encoded as the store keeps them.
    pub devices: DeviceRecords,
    /// New metric names with their indexes.
    pub metric_names: Vec<(u16, MetricName)>,
    /// Counters at this point.
    pub counters: Counters,
    /// The gateway-clock judgement at this point.
    pub clock: GatewayClock,
    /// Changed Sparkplug edge nodes.
    pub sparkplug: Vec<crate::sparkplug::EdgeNode>,
}

/// Changed devices as the store's records: (group, id) and the device's CBOR,
/// back to back in one buffer. A checkpoint of every device of a 10 000-device
/// fleet is ~4 MB of records this way, against ~12 MB as cloned devices (their
/// clock buckets, windows and duplicate filters on the heap).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DeviceRecords {
    bytes: Vec<u8>,
    /// Per device: where its group, id and record end in `bytes`.
    ends: Vec<[u32; 3]>,
}

impl DeviceRecords {
    /// Room for `n` records' places (the bytes grow as they come).
    pub fn with_capacity(n: usize) -> Self {
        Self {
            bytes: Vec::new(),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends a device's record.
    pub fn push(&mut self, d: &Device) {
        let end = |b: &Vec<u8>| u32::try_from(b.len()).unwrap_or(u32::MAX);
        self.bytes.extend_from_slice(d.group.as_bytes());
        let g = end(&self.bytes);
        self.bytes.extend_from_slice(d.id.as_bytes());
        let i = end(&self.bytes);
        // Serializing plain data into a Vec cannot fail.
        let _ = ciborium::ser::into_writer(d, &mut self.bytes);
        self.ends.push([g, i, end(&self.bytes)]);
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// No records.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// (group, id, CBOR record) of each device, in the order pushed.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &[u8])> {
        let mut start = 0usize;
        self.ends.iter().map(move |&[g, i, r]| {
            let (g, i, r) = (g as usize, i as usize, r as usize);
            let text = |a: usize, b: usize| std::str::from_utf8(&self.bytes[a..b]).unwrap_or("");
            let out = (text(start, g), text(g, i), &self.bytes[i..r]);
            start = r;
            out
        })
    }

    /// The devices, decoded (tests and the fuzz harness).
    pub fn decode(&self) -> Vec<Device> {
        self.iter()
            .filter_map(|(_, _, r)| ciborium::de::from_reader(r).ok())
            .collect()
    }
}
