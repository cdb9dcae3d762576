//! The engine's state as values: what the store persists and metrics report.

use serde::{Deserialize, Serialize};

use crate::codec::MetricName;
use crate::model::{Id, Millis, OptMillis, Reason, SharedId, SlotId};
use crate::time::adaptive::AdaptiveState;
use crate::time::gateway::GatewayClock;
use crate::time::seq::SeqWindow;
use crate::time::skew::SkewEstimator;
use crate::time::window::WindowSpec;
use crate::time::windows::Windows;

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
    /// Readings lost before the gateway, by sequence-number gaps (docs/reference.md#time).
    #[serde(default)]
    pub readings_missing: u64,
    /// Sparkplug metrics of types that are not aggregated (strings, bytes, datasets, nulls).
    #[serde(default)]
    pub sparkplug_other: u64,
    /// Events accepted although their device timestamp was missing, unparseable or
    /// invalid (timed by arrival under `invalid = "arrival"`; docs/reference.md#topics-and-payloads-upstream).
    #[serde(default)]
    pub timestamps_invalid: u64,
    /// Condition records emitted: raised, cleared, retracted (docs/conditions.md).
    #[serde(default)]
    pub conditions: [u64; 3],
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
    /// Group id, shared with the group's other devices.
    pub group: SharedId,
    /// Device id.
    pub id: SlotId,
    /// Clock-offset estimator.
    pub skew: SkewEstimator,
    /// Clock currently distrusted (`clock_skew` raised).
    pub distrusted: bool,
    /// Largest accepted event time (last_seen).
    pub max_event: OptMillis,
    /// Monotonic time of the last accepted event.
    pub last_arrival: Millis,
    /// Liveness: offline alert raised and not yet answered by `online`.
    pub offline: bool,
    /// Retained status `online` published at least once.
    pub announced: bool,
    /// Duplicate filter.
    pub seq: SeqWindow,
    /// Its windows: those that can still change, and the fired ones packed.
    pub windows: Windows,
    /// Readings lost before the gateway (sequence numbers skipped and not arrived since).
    #[serde(default)]
    pub missing: u64,
    /// Events accepted with an invalid device timestamp (saturating: 32 bits
    /// leave room in the struct for `purged_to_s`).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub timestamps_invalid: u32,
    /// Events of this device taken into windows (live status, docs/reference.md#reload-sighup-systemctl-reload-tidemark).
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
    /// With "auto" lateness: the latest start of a window of this device that is
    /// gone (purged), in epoch seconds rounded up; 0: none. A window starting
    /// after it never existed, so it may take a returning backlog as a first
    /// result. Fits in the struct's padding: no memory per device is added.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub purged_to_s: u32,
    /// Its conditions' judging (docs/conditions.md); None: its group has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: super::conditions::DeviceConditions,
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
    /// reload changed the rule (docs/reference.md#reload-sighup-systemctl-reload-tidemark); empty: the configured rule for all times.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleEpoch>,
    /// Idleness restarts (gateway start, source reconnect) so far.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub restarts: u32,
    /// Monotonic time of the latest idleness restart.
    #[serde(default)]
    pub restarted_at: Millis,
    /// What "auto" values learned (docs/reference.md#group_defaults-and-groupsname); `None` while both are fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveState>,
    /// Condition records of its devices: raised, cleared, retracted.
    #[serde(default, skip_serializing_if = "no_conditions")]
    pub conditions: [u64; 3],
}

fn no_conditions(c: &[u64; 3]) -> bool {
    *c == [0; 3]
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
    /// The watermark bound in force (`out_of_orderness_ms`, learned when "auto").
    pub bound_ms: Millis,
    /// The allowed lateness in force (learned when "auto").
    pub lateness_ms: Millis,
    /// Condition records: raised, cleared, retracted (docs/conditions.md).
    pub conditions: [u64; 3],
    /// Members with a condition raised now.
    pub conditions_raised: u64,
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
    /// The highest remote document id taken (0: none).
    pub fleet_last_id: u64,
    /// The Sparkplug edge node's next session counter (0: none).
    pub bd_seq: u64,
    /// Outputs' cursors and totals, by [`crate::model::OutputKind`].
    pub outputs: [crate::model::OutputMark; crate::model::OutputKind::ALL.len()],
}

/// Changed devices as the store's records: (group, id) and the device's CBOR,
/// gathered in blocks of ~64 KiB that are LZ4-compressed as they fill. A
/// checkpoint of every device of a 10 000-device fleet is ~8 MB of records (the
/// peak of the gateway's heap when it was held whole), ~2 MB compressed; the
/// store thread inflates one block at a time.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DeviceRecords {
    /// Sealed blocks, each LZ4-compressed with its size prepended, back to back.
    packed: Vec<u8>,
    /// Per sealed block: its end in `packed` and the end of its records in `ends`.
    blocks: Vec<(usize, usize)>,
    /// Records of the block being gathered.
    open: Vec<u8>,
    /// Per record: where its group, id and record end within its block.
    ends: Vec<[u32; 3]>,
}

/// Raw bytes of records gathered before a block is compressed.
const BLOCK_BYTES: usize = 64 << 10;

impl DeviceRecords {
    /// Room for `n` records' places (the bytes grow as they come).
    pub fn with_capacity(n: usize) -> Self {
        Self {
            ends: Vec::with_capacity(n),
            ..Self::default()
        }
    }

    /// Appends a device's record.
    pub fn push(&mut self, d: &Device) {
        let end = |b: &Vec<u8>| u32::try_from(b.len()).unwrap_or(u32::MAX);
        self.open.extend_from_slice(d.group.as_bytes());
        let g = end(&self.open);
        self.open.extend_from_slice(d.id.as_bytes());
        let i = end(&self.open);
        // Serializing plain data into a Vec cannot fail.
        let _ = ciborium::ser::into_writer(d, &mut self.open);
        self.ends.push([g, i, end(&self.open)]);
        if self.open.len() >= BLOCK_BYTES {
            self.seal();
        }
    }

    fn seal(&mut self) {
        let start = self.packed.len();
        let room = lz4_flex::block::get_maximum_output_size(self.open.len());
        self.packed.resize(start + 4 + room, 0);
        let raw = u32::try_from(self.open.len()).unwrap_or(u32::MAX);
        self.packed[start..start + 4].copy_from_slice(&raw.to_le_bytes());
        // The output has the room LZ4 can need: compression cannot fail.
        let n =
            lz4_flex::block::compress_into(&self.open, &mut self.packed[start + 4..]).unwrap_or(0);
        self.packed.truncate(start + 4 + n);
        self.blocks.push((self.packed.len(), self.ends.len()));
        self.open.clear();
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// No records.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes held (compressed blocks and the open one).
    pub fn bytes(&self) -> usize {
        self.packed.len() + self.open.len()
    }

    /// Calls `f` with (group, id, CBOR record) of each device, in the order pushed;
    /// stops at its first error.
    pub fn for_each<E>(
        &self,
        mut f: impl FnMut(&str, &str, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut raw = Vec::new();
        let (mut from, mut first) = (0, 0);
        let blocks = self.blocks.iter().copied().map(Some).chain([None]);
        for block in blocks {
            let (bytes, last) = match block {
                Some((to, last)) => {
                    let mut size = [0u8; 4];
                    size.copy_from_slice(&self.packed[from..from + 4]);
                    raw.resize(u32::from_le_bytes(size) as usize, 0);
                    // Our own blocks, whole: they inflate.
                    let _ = lz4_flex::block::decompress_into(&self.packed[from + 4..to], &mut raw);
                    from = to;
                    (&raw[..], last)
                }
                None => (&self.open[..], self.ends.len()),
            };
            let mut start = 0usize;
            for &[g, i, r] in &self.ends[first..last] {
                let (g, i, r) = (g as usize, i as usize, r as usize);
                let text = |a: usize, b: usize| std::str::from_utf8(&bytes[a..b]).unwrap_or("");
                f(text(start, g), text(g, i), &bytes[i..r])?;
                start = r;
            }
            first = last;
        }
        Ok(())
    }

    /// The devices, decoded (tests and the fuzz harness).
    pub fn decode(&self) -> Vec<Device> {
        let mut out = Vec::new();
        let _ = self.for_each(|_, _, r| {
            out.extend(ciborium::de::from_reader(r).ok());
            Ok::<(), ()>(())
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, Now};

    /// Records read back are each device's own CBOR, in order, for fleets that fill
    /// no block, exactly one, many, and devices whose one record outgrows a block.
    #[test]
    fn device_records_read_back_each_device_as_encoded() {
        let cfg = crate::config::load_str(
            "[gateway]\nid = \"gw\"\n[time]\npolicy = \"device\"\n[group_defaults]\n\
             allowed_lateness_ms = 3600000\nwindow = { kind = \"tumbling\", size_ms = 1000 }\n",
            &std::collections::BTreeMap::new(),
        )
        .unwrap();
        // (devices, metrics, readings each a second apart: one window each)
        for (n, metrics, readings) in [
            (0usize, 1usize, 1i64),
            (1, 1, 1),
            (60, 2, 2),
            (1_500, 3, 1),
            (3, 32, 40),
        ] {
            let mut e = Engine::new(&cfg.engine);
            let mut out = Vec::new();
            let t = 1_764_480_000_000i64;
            for k in 0..readings {
                for i in 0..n {
                    let fields: Vec<String> = (0..metrics)
                        .map(|m| format!(r#""m{}": {}.{m}"#, (i + m) % metrics, i))
                        .collect();
                    let ts = t + k * 1000;
                    let p = format!(r#"{{"ts": {ts}, "seq": {k}, {}}}"#, fields.join(", "));
                    let topic = format!("sensors/g{}/dev-{i:05}/reading", i % 4);
                    e.on_message(&topic, p.as_bytes(), Now::at(ts), &mut out);
                }
            }
            if metrics == 32 {
                let d = e.device("g0", "dev-00000").unwrap();
                let mut own = Vec::new();
                ciborium::ser::into_writer(d, &mut own).unwrap();
                assert!(own.len() > BLOCK_BYTES, "{} bytes", own.len());
            }
            let c = e.take_changes();
            assert_eq!(c.devices.len(), n);
            let mut seen = Vec::new();
            c.devices
                .for_each(|g, id, r| {
                    let d = e.device(g, id).expect("a device of the fleet");
                    let mut own = Vec::new();
                    ciborium::ser::into_writer(d, &mut own).unwrap();
                    assert_eq!(r, &own[..], "{g}/{id}");
                    seen.push(format!("{g}/{id}"));
                    Ok::<(), ()>(())
                })
                .unwrap();
            assert_eq!(seen.len(), n);
            let mut uniq = seen.clone();
            uniq.sort();
            uniq.dedup();
            assert_eq!(uniq.len(), n, "each device once");
            assert_eq!(c.devices.decode().len(), n);
            if n >= 1_500 {
                assert!(
                    c.devices.bytes() * 2 < c.devices.decode().len() * 700,
                    "compressed"
                );
            }
        }
    }

    #[test]
    fn device_records_stop_at_the_first_error() {
        let mut r = DeviceRecords::default();
        let cfg = crate::config::load_str("[gateway]\nid = \"gw\"\n", &Default::default()).unwrap();
        let mut e = Engine::new(&cfg.engine);
        let mut out = Vec::new();
        for i in 0..5 {
            e.on_message(
                &format!("sensors/g/d{i}/reading"),
                b"{\"v\": 1}",
                Now::at(1),
                &mut out,
            );
        }
        for i in 0..5 {
            r.push(e.device("g", &format!("d{i}")).unwrap());
        }
        let mut calls = 0;
        let res = r.for_each(|_, _, _| {
            calls += 1;
            if calls == 2 { Err("stop") } else { Ok(()) }
        });
        assert_eq!((res, calls), (Err("stop"), 2));
    }
}
/// The per-device state: 272 bytes on 64-bit targets ("auto" lateness fits
/// in padding; conditions add one pointer, their state boxed where configured;
/// optional times in 8 bytes, [`OptMillis`]; fired windows packed behind one
/// more list; the id in 24 bytes, [`SlotId`]), 296 with the engine's slot
/// (BENCHMARKS 4b).
#[cfg(all(test, target_pointer_width = "64"))]
#[test]
fn a_device_stays_272_bytes_and_its_slot_296() {
    assert_eq!(std::mem::size_of::<Device>(), 272);
    assert_eq!(std::mem::size_of::<super::DeviceSlot>(), 296);
}
