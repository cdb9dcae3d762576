//! The event-time engine (SPEC §4–§8): pure and deterministic.
//!
//! `on_message(topic, payload, now)` and `on_tick(now)` append [`Output`]s and
//! mark the state they changed; they never touch a socket, a file or a clock.
//! `run`, `replay` and the tests drive this same code.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use foldhash::fast::RandomState;

use serde::{Deserialize, Serialize};

use crate::codec::{Decoded, Decoder, DeviceTs, MetricName};
use crate::config::{Config, GroupConfig};
use crate::model::{Id, Kind, Millis, Reason};
use crate::output::{
    Alert, AlertType, GatewayAlert, Late, MetricOut, Output, Rejected, WindowResult, decoded_fields,
};
use crate::time::gateway::{self as gwclock, GatewayClock};
use crate::time::seq::{Seen, SeqWindow};
use crate::time::skew::SkewEstimator;
use crate::time::watermark;
use crate::time::window::{self, MetricIdx, Window};
use crate::time::{InvalidPolicy, TimeConfig, TimePolicy};
use crate::topic::{TopicParts, TopicPattern};

mod sparkplug;

/// The gateway clock at one instant: wall time for arrival stamps, a
/// monotonic reading for idleness (an NTP step must not make devices idle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Wall clock, epoch ms.
    pub wall: Millis,
    /// Monotonic clock, ms from an arbitrary origin.
    pub mono: Millis,
    /// The kernel reports the wall clock synchronized (NTP).
    pub synced: bool,
}

impl Now {
    /// Both clocks at the same value, synchronized (virtual time, tests).
    pub fn at(t: Millis) -> Self {
        Self {
            wall: t,
            mono: t,
            synced: true,
        }
    }
}

/// Devices tracked at most (memory bound on a small board against runaway or
/// hostile topics); a message from a device beyond it is rejected `bad_topic`.
pub const MAX_DEVICES: usize = 100_000;

/// Distinct metric names remembered; beyond this a new name is a decode error.
pub const MAX_METRIC_NAMES: usize = 4096;

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
}

impl Counters {
    /// Rejections for one reason.
    pub fn rejected(&self, r: Reason) -> u64 {
        self.rejected[Reason::ALL.iter().position(|x| *x == r).unwrap_or(0)]
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
}

/// Min-heap of (time, device index); entries go stale lazily (see the users).
type TimeHeap = BinaryHeap<Reverse<(Millis, u32)>>;

struct GroupSlot {
    state: Group,
    cfg: GroupConfig,
    /// Member device indexes, sorted by device id (deterministic output order).
    members: Vec<u32>,
    /// Device id -> device index.
    index: HashMap<Id, u32, RandomState>,
    /// Members' `max_event`s, for the active minimum of the watermark fold:
    /// an entry is current while it equals its device's `wm_key`.
    maxima: TimeHeap,
    /// `maxima` must be rebuilt from the members (restore, idleness restart).
    rebuild: bool,
    /// Monotonic time of the last fold: a member dropped as idle stays idle
    /// until its next event only while time does not go back (replayed captures may).
    fold_mono: Millis,
    /// Members' next deadlines in watermark time (see [`deadline`]): a tick
    /// visits only the devices whose deadline the watermark reached, plus
    /// `pending`. Ticks cost O(changes), not O(members).
    deadlines: TimeHeap,
    /// Members changed by input since their last visit.
    pending: Vec<u32>,
    dirty: bool,
}

struct DeviceSlot {
    state: Device,
    group: u32,
    dirty: bool,
    /// In the group's `pending` list.
    pending: bool,
    /// Value of this device's current entry in the group's `maxima`.
    wm_key: Option<Millis>,
    /// Value of this device's current entry in the group's `deadlines`.
    deadline: Option<Millis>,
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
}

/// The state changed since the last [`Engine::take_changes`], as values: the
/// store commits them on its own thread while the engine keeps working.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Changes {
    /// Changed groups.
    pub groups: Vec<Group>,
    /// Changed devices.
    pub devices: Vec<Device>,
    /// New metric names with their indexes.
    pub metric_names: Vec<(u16, MetricName)>,
    /// Counters at this point.
    pub counters: Counters,
    /// The gateway-clock judgement at this point.
    pub clock: GatewayClock,
    /// Changed Sparkplug edge nodes.
    pub sparkplug: Vec<crate::sparkplug::EdgeNode>,
}

/// The engine.
pub struct Engine {
    gateway: Id,
    pattern: TopicPattern,
    decoder: Decoder,
    time: TimeConfig,
    /// Settings of groups without an override, and the overrides.
    group_defaults: GroupConfig,
    group_overrides: BTreeMap<String, GroupConfig>,
    groups: Vec<GroupSlot>,
    group_index: HashMap<Id, u32, RandomState>,
    /// Group indexes sorted by name.
    group_order: Vec<u32>,
    devices: Vec<DeviceSlot>,
    metric_names: Vec<MetricName>,
    metric_index: HashMap<MetricName, MetricIdx>,
    persisted_names: usize,
    counters: Counters,
    dirty_groups: Vec<u32>,
    dirty_devices: Vec<u32>,
    /// The gateway wall clock is implausible: processing time is held.
    clock_held: bool,
    /// Judgement of the gateway's own clock (SPEC §4).
    clock: GatewayClock,
    /// Reused list of device offset estimates for the consensus.
    estimates: Vec<Millis>,
    /// Reused decode buffer (boxed: moved in and out without copying).
    scratch: Option<Box<Decoded>>,
    /// Reused list of the devices a tick visits in one group.
    visit: Vec<u32>,
    /// Sparkplug B ingest (SPEC §10).
    sparkplug: sparkplug::State,
}

impl Engine {
    /// A fresh engine; `now` starts the idleness clocks.
    pub fn new(cfg: &Config) -> Self {
        Self {
            gateway: cfg.gateway_id.clone(),
            pattern: cfg.topic_pattern.clone(),
            decoder: Decoder::new(&cfg.payload),
            time: cfg.time.clone(),
            group_defaults: cfg.group_defaults.clone(),
            group_overrides: cfg.groups.clone(),
            groups: Vec::new(),
            group_index: HashMap::default(),
            group_order: Vec::new(),
            devices: Vec::new(),
            metric_names: Vec::new(),
            metric_index: HashMap::new(),
            persisted_names: 0,
            counters: Counters::default(),
            dirty_groups: Vec::new(),
            dirty_devices: Vec::new(),
            clock_held: false,
            clock: GatewayClock::default(),
            estimates: Vec::new(),
            scratch: Some(Box::default()),
            visit: Vec::new(),
            sparkplug: sparkplug::State::new(&cfg.sparkplug),
        }
    }

    /// Restores persisted state (store restore).
    pub fn restore(
        &mut self,
        groups: Vec<Group>,
        devices: Vec<Device>,
        metric_names: Vec<MetricName>,
        counters: Counters,
    ) {
        for g in groups {
            self.group_slot(&g.name.clone());
            let gi = self.group_index[&g.name] as usize;
            self.groups[gi].state = g;
            self.groups[gi].dirty = false;
        }
        for d in devices {
            let di = self.device_slot(&d.group.clone(), &d.id.clone());
            self.devices[di].state = d;
            self.devices[di].dirty = false;
        }
        for (i, n) in metric_names.iter().enumerate() {
            self.metric_index
                .insert(n.clone(), MetricIdx::try_from(i).unwrap_or(MetricIdx::MAX));
        }
        self.persisted_names = metric_names.len();
        self.metric_names = metric_names;
        self.counters = counters;
        // Windows changed before the last commit may await their next tick.
        for di in 0..self.devices.len() {
            self.mark_pending(di);
        }
        for g in &mut self.groups {
            g.rebuild = true;
        }
        self.dirty_groups.clear();
        self.dirty_devices.clear();
    }

    /// Restarts idleness clocks (gateway start, source reconnect): nothing is
    /// idle until it has been silent for `idle_timeout_ms` from now.
    pub fn restart_idleness(&mut self, now: Now) {
        for g in &mut self.groups {
            g.state.last_arrival = now.mono;
        }
        for d in &mut self.devices {
            d.state.last_arrival = now.mono;
        }
        // A checkpoint must hold the restarted clocks: a journal after it counts from them.
        for gi in 0..self.groups.len() {
            self.mark_group(gi);
        }
        for di in 0..self.devices.len() {
            self.mark_device(di);
        }
        // Members dropped from `maxima` as idle are active again.
        for g in &mut self.groups {
            g.rebuild = true;
        }
    }

    /// Restores the persisted gateway-clock judgement (none: state from before it existed).
    pub fn restore_clock(&mut self, clock: Option<GatewayClock>) {
        self.clock = clock.unwrap_or_default();
    }

    /// A new process: its monotonic clock has a new origin, so a jump of
    /// wall − mono across it is not a step (see the README's contract notes).
    pub fn new_clock_origin(&mut self) {
        self.clock.new_origin();
    }

    /// The gateway-clock judgement (estimated error, verdict).
    pub fn gateway_clock(&self) -> &GatewayClock {
        &self.clock
    }

    /// Totals.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Nothing can fire on later ticks: no device has a window or liveness
    /// deadline and no change awaits a visit. Ticks then only move watermarks,
    /// and one tick at the end leaves the same state as all of them.
    pub fn settled(&self) -> bool {
        self.groups.iter().all(|g| g.pending.is_empty())
            && self.devices.iter().all(|d| d.deadline.is_none())
    }

    /// Whether processing time is held because the wall clock is implausible.
    pub fn clock_held(&self) -> bool {
        self.clock_held
    }

    /// Groups, in name order.
    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.group_order
            .iter()
            .map(|&i| &self.groups[i as usize].state)
    }

    /// Devices of a group in id order.
    pub fn group_devices(&self, group: &str) -> impl Iterator<Item = &Device> {
        let members = self
            .group_index
            .get(group)
            .map_or(&[][..], |&gi| &self.groups[gi as usize].members[..]);
        members.iter().map(|&d| &self.devices[d as usize].state)
    }

    /// A device's state.
    pub fn device(&self, group: &str, device: &str) -> Option<&Device> {
        let gi = *self.group_index.get(group)?;
        self.groups[gi as usize]
            .index
            .get(device)
            .map(|&i| &self.devices[i as usize].state)
    }

    /// The watermark of a group.
    pub fn watermark(&self, group: &str) -> Option<Millis> {
        self.group_index
            .get(group)
            .and_then(|&i| self.groups[i as usize].state.wm)
    }

    /// Interned metric names.
    pub fn metric_names(&self) -> &[MetricName] {
        &self.metric_names
    }

    /// Whether any state changed since the last [`Engine::take_changes`].
    pub fn has_changes(&self) -> bool {
        !self.dirty_groups.is_empty()
            || !self.dirty_devices.is_empty()
            || self.persisted_names < self.metric_names.len()
            || self.sparkplug.changed()
    }

    /// Devices changed since the last [`Engine::take_changes`].
    pub fn dirty_devices(&self) -> usize {
        self.dirty_devices.len()
    }

    /// Per-group liveness at `now` (metrics): devices active, idle and offline.
    pub fn group_stats(&self, now: Now) -> Vec<GroupStats> {
        self.group_order
            .iter()
            .map(|&gi| {
                let g = &self.groups[gi as usize];
                let mut st = GroupStats {
                    name: g.state.name.clone(),
                    watermark: g.state.wm,
                    ..GroupStats::default()
                };
                for &di in &g.members {
                    let d = &self.devices[di as usize].state;
                    st.missing += d.missing;
                    if d.offline {
                        st.offline += 1;
                    } else if now.mono.saturating_sub(d.last_arrival) >= g.cfg.idle_timeout_ms {
                        st.idle += 1;
                    } else {
                        st.active += 1;
                    }
                }
                st
            })
            .collect()
    }

    /// State changed since the last call, for the store.
    pub fn take_changes(&mut self) -> Changes {
        let mut c = Changes {
            groups: Vec::with_capacity(self.dirty_groups.len()),
            devices: Vec::with_capacity(self.dirty_devices.len()),
            metric_names: Vec::new(),
            counters: self.counters.clone(),
            clock: self.clock.clone(),
            sparkplug: self.take_sparkplug_changes(),
        };
        for g in self.dirty_groups.drain(..) {
            let slot = &mut self.groups[g as usize];
            slot.dirty = false;
            c.groups.push(slot.state.clone());
        }
        for d in self.dirty_devices.drain(..) {
            let slot = &mut self.devices[d as usize];
            slot.dirty = false;
            c.devices.push(slot.state.clone());
        }
        for (i, n) in self
            .metric_names
            .iter()
            .enumerate()
            .skip(self.persisted_names)
        {
            c.metric_names
                .push((u16::try_from(i).unwrap_or(u16::MAX), n.clone()));
        }
        self.persisted_names = self.metric_names.len();
        c
    }

    fn mark_device(&mut self, di: usize) {
        if !self.devices[di].dirty {
            self.devices[di].dirty = true;
            self.dirty_devices
                .push(u32::try_from(di).unwrap_or(u32::MAX));
        }
    }

    fn mark_pending(&mut self, di: usize) {
        let d = &mut self.devices[di];
        if !d.pending {
            d.pending = true;
            self.groups[d.group as usize]
                .pending
                .push(u32::try_from(di).unwrap_or(u32::MAX));
        }
    }

    fn mark_group(&mut self, gi: usize) {
        if !self.groups[gi].dirty {
            self.groups[gi].dirty = true;
            self.dirty_groups
                .push(u32::try_from(gi).unwrap_or(u32::MAX));
        }
    }

    fn group_slot(&mut self, name: &Id) -> usize {
        if let Some(&i) = self.group_index.get(name) {
            return i as usize;
        }
        let i = self.groups.len();
        let gi = u32::try_from(i).unwrap_or(u32::MAX);
        self.groups.push(GroupSlot {
            state: Group {
                name: name.clone(),
                wm: None,
                max_event: None,
                last_arrival: 0,
            },
            cfg: self
                .group_overrides
                .get(name.as_str())
                .unwrap_or(&self.group_defaults)
                .clone(),
            members: Vec::new(),
            index: HashMap::default(),
            maxima: BinaryHeap::new(),
            rebuild: false,
            fold_mono: Millis::MIN,
            deadlines: BinaryHeap::new(),
            pending: Vec::new(),
            dirty: false,
        });
        self.group_index.insert(name.clone(), gi);
        let pos = self
            .group_order
            .partition_point(|&g| self.groups[g as usize].state.name < *name);
        self.group_order.insert(pos, gi);
        self.mark_group(i);
        i
    }

    fn find_device(&self, group: &Id, device: &Id) -> Option<usize> {
        let gi = *self.group_index.get(group)?;
        self.groups[gi as usize]
            .index
            .get(device)
            .map(|&i| i as usize)
    }

    fn device_slot(&mut self, group: &Id, device: &Id) -> usize {
        if let Some(i) = self.find_device(group, device) {
            return i;
        }
        let gi = self.group_slot(group);
        let i = self.devices.len();
        let di = u32::try_from(i).unwrap_or(u32::MAX);
        self.devices.push(DeviceSlot {
            state: Device {
                group: group.clone(),
                id: device.clone(),
                skew: SkewEstimator::default(),
                distrusted: false,
                max_event: None,
                last_arrival: 0,
                offline: false,
                announced: false,
                seq: SeqWindow::default(),
                windows: Vec::new(),
                missing: 0,
            },
            group: u32::try_from(gi).unwrap_or(u32::MAX),
            dirty: false,
            pending: false,
            wm_key: None,
            deadline: None,
        });
        self.groups[gi].index.insert(device.clone(), di);
        let members = &self.groups[gi].members;
        let pos = members.partition_point(|&d| self.devices[d as usize].state.id < *device);
        let g = &mut self.groups[gi];
        g.members.insert(pos, di);
        // Room for the heaps up to their compaction bound: no allocation on the hot path.
        let bound = 2 * g.members.len() + 65;
        g.maxima.reserve(bound.saturating_sub(g.maxima.len()));
        g.deadlines.reserve(bound.saturating_sub(g.deadlines.len()));
        self.visit
            .reserve(g.members.len().saturating_sub(self.visit.len()));
        self.mark_device(i);
        i
    }

    fn reject(
        &mut self,
        out: &mut Vec<Output>,
        reason: Reason,
        topic: &str,
        ids: Option<(&Id, &Id)>,
        now: Now,
        detail: String,
    ) {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.counters.rejected[i] += 1;
        out.push(Output::Rejected(Rejected {
            reason,
            topic: topic.chars().take(1024).collect(),
            group: ids.map(|(g, _)| g.clone()),
            device: ids.map(|(_, d)| d.clone()),
            arrival: now.wall,
            detail,
        }));
    }

    /// Handles one input message that arrived at `now`.
    pub fn on_message(&mut self, topic: &str, payload: &[u8], now: Now, out: &mut Vec<Output>) {
        let raw_wall = now.wall;
        let now = self.observe_clock(now, out);
        let mut decoded = self.scratch.take().unwrap_or_default();
        self.handle(topic, payload, now, raw_wall, &mut decoded, out);
        self.scratch = Some(decoded);
    }

    /// Step detection and the consensus rule (SPEC §4); returns `now` on the corrected clock.
    fn observe_clock(&mut self, now: Now, out: &mut Vec<Output>) -> Now {
        let t = &self.time;
        let o = self.clock.observe(
            now.wall,
            now.mono,
            now.synced,
            t.gateway_clock,
            t.max_skew_ms,
        );
        if let Some(delta) = o.step {
            for di in 0..self.devices.len() {
                self.devices[di].state.skew.rebase(delta);
                self.mark_device(di);
            }
        }
        let mut event = o.event;
        if o.evaluate && self.time.policy == TimePolicy::Calibrated {
            self.estimates.clear();
            for d in &self.devices {
                let idle = self.groups[d.group as usize].cfg.idle_timeout_ms;
                if let Some(e) = d.state.skew.estimate()
                    && now.mono.saturating_sub(d.state.last_arrival) < idle
                {
                    self.estimates.push(e);
                }
            }
            event = self
                .clock
                .judge(&mut self.estimates, now.mono, self.time.max_skew_ms)
                .or(event);
        }
        let corrected = Now {
            wall: self.clock.correct(now.wall),
            ..now
        };
        if let Some(e) = event {
            self.counters.alerts += 1;
            out.push(Output::Gateway(match e {
                gwclock::Event::Wrong { error, agreeing } => GatewayAlert::Clock {
                    error_ms: error,
                    devices_agreeing: agreeing,
                    at: corrected.wall,
                },
                gwclock::Event::Ok => GatewayAlert::ClockOk { at: corrected.wall },
            }));
        }
        corrected
    }

    fn handle(
        &mut self,
        topic: &str,
        payload: &[u8],
        now: Now,
        raw_wall: Millis,
        decoded: &mut Decoded,
        out: &mut Vec<Output>,
    ) {
        self.counters.received += 1;
        if self.sparkplug.enabled && crate::sparkplug::is_sparkplug(topic) {
            return self.sparkplug_message(topic, payload, now, raw_wall, decoded, out);
        }
        let parts = match self.pattern.parse_topic(topic) {
            Ok(p) => p,
            Err(e) => return self.reject(out, Reason::BadTopic, topic, None, now, e.to_string()),
        };
        let ids = Some((&parts.group, &parts.device));
        if let Err(e) = self.decoder.decode_into(payload, decoded) {
            return self.reject(out, Reason::DecodeError, topic, ids, now, e.0);
        }
        self.apply(topic, parts, decoded, now, raw_wall, None, out);
    }

    /// One decoded reading or heartbeat of `parts`' device: time, windows,
    /// liveness. `clock_of`: the device whose clock times it, if not its own.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        topic: &str,
        parts: TopicParts,
        decoded: &Decoded,
        now: Now,
        raw_wall: Millis,
        clock_of: Option<usize>,
        out: &mut Vec<Output>,
    ) {
        let ids = Some((&parts.group, &parts.device));
        if let Some(detail) = self.over_device_limit(&parts.group, &parts.device) {
            return self.reject(out, Reason::BadTopic, topic, ids, now, detail);
        }
        let di = self.device_slot(&parts.group, &parts.device);
        if let Some(seq) = decoded.seq {
            let dev = &mut self.devices[di].state;
            match dev.seq.observe(seq) {
                Seen::Duplicate => {
                    self.counters.duplicates += 1;
                    return;
                }
                Seen::New { missing } => {
                    dev.missing = dev.missing.saturating_add_signed(missing);
                    self.counters.readings_missing = self
                        .counters
                        .readings_missing
                        .saturating_add_signed(missing);
                }
            }
        }
        self.mark_device(di);
        // Sparkplug devices share their edge node's clock (SPEC §10).
        let ci = clock_of.unwrap_or(di);
        if ci != di {
            self.mark_device(ci);
        }
        let (event, provisional) = match self.event_time(ci, decoded, now, raw_wall, out) {
            Ok(t) => t,
            Err(detail) => {
                return self.reject(
                    out,
                    Reason::InvalidTimestamp,
                    topic,
                    ids,
                    now,
                    detail.into(),
                );
            }
        };
        if event > now.wall.saturating_add(self.time.max_future_ms) {
            let detail = format!(
                "event time {event} is {} ms ahead of the gateway clock",
                event.saturating_sub(now.wall)
            );
            return self.reject(out, Reason::Future, topic, ids, now, detail);
        }
        if event < now.wall.saturating_sub(self.time.max_age_ms) {
            let detail = format!(
                "event time {event} is {} ms behind the gateway clock",
                now.wall.saturating_sub(event)
            );
            return self.reject(out, Reason::TooOld, topic, ids, now, detail);
        }
        // Names are interned only for events that reach the windows.
        let heartbeat = parts.kind == Kind::Heartbeat;
        let mut metrics: heapless::Vec<(MetricIdx, f64), { crate::codec::MAX_METRICS }> =
            heapless::Vec::new();
        if !heartbeat {
            for (name, v) in &decoded.metrics {
                let Some(m) = self.intern(name) else {
                    let detail = format!("more than {MAX_METRIC_NAMES} distinct metric names");
                    return self.reject(out, Reason::DecodeError, topic, ids, now, detail);
                };
                let _ = metrics.push((m, *v));
            }
        }
        let gi = self.devices[di].group as usize;
        let (wm, spec, lateness) = {
            let g = &self.groups[gi];
            (g.state.wm, g.cfg.window, g.cfg.allowed_lateness_ms)
        };
        let dev = &mut self.devices[di].state;
        if !window::apply(
            &mut dev.windows,
            spec,
            event,
            wm,
            lateness,
            heartbeat,
            &metrics,
        ) {
            self.counters.late += 1;
            out.push(Output::Late(Late {
                group: parts.group.clone(),
                device: parts.device.clone(),
                event_time: event,
                watermark: wm,
                arrival: now.wall,
                payload: decoded_fields(
                    self.decoder.ts_field(),
                    decoded.ts,
                    self.decoder.seq_field(),
                    decoded.seq,
                    &decoded.metrics,
                ),
            }));
            return;
        }
        self.counters.accepted += 1;
        // A reading timed while the gateway clock is in doubt does not move the
        // watermark: its time may be either clock's error.
        if !provisional {
            dev.max_event = Some(dev.max_event.map_or(event, |m| m.max(event)));
        }
        dev.last_arrival = now.mono;
        let (was_offline, announced) = (dev.offline, dev.announced);
        dev.offline = false;
        dev.announced = true;
        let last_seen = dev.max_event;
        let slot = &mut self.devices[di];
        if slot.wm_key != last_seen
            && let Some(max) = last_seen
        {
            slot.wm_key = last_seen;
            self.groups[gi]
                .maxima
                .push(Reverse((max, u32::try_from(di).unwrap_or(u32::MAX))));
        }
        let g = &mut self.groups[gi];
        if !provisional {
            g.state.max_event = Some(g.state.max_event.map_or(event, |m| m.max(event)));
        }
        g.state.last_arrival = g.state.last_arrival.max(now.mono);
        self.mark_group(gi);
        self.mark_pending(di);
        if was_offline {
            self.alert(out, di, AlertType::Online, last_seen, None, now);
        }
        if was_offline || !announced {
            out.push(Output::Status {
                group: parts.group,
                device: parts.device,
                online: true,
            });
        }
    }

    /// A new device beyond [`MAX_DEVICES`]: the rejection's detail.
    fn over_device_limit(&self, group: &Id, device: &Id) -> Option<String> {
        (self.devices.len() >= MAX_DEVICES && self.find_device(group, device).is_none())
            .then(|| format!("device limit of {MAX_DEVICES} reached; new device not tracked"))
    }

    fn intern(&mut self, name: &MetricName) -> Option<MetricIdx> {
        if let Some(&i) = self.metric_index.get(name) {
            return Some(i);
        }
        if self.metric_names.len() >= MAX_METRIC_NAMES {
            return None;
        }
        let i = MetricIdx::try_from(self.metric_names.len()).ok()?;
        self.metric_names.push(name.clone());
        self.metric_index.insert(name.clone(), i);
        Some(i)
    }

    /// Event time per `[time] policy`; `Err(detail)` means reject as invalid_timestamp;
    /// `Ok((t, true))`: timed while the gateway clock is in doubt (moves no watermark).
    fn event_time(
        &mut self,
        di: usize,
        d: &Decoded,
        now: Now,
        raw_wall: Millis,
        out: &mut Vec<Output>,
    ) -> Result<(Millis, bool), &'static str> {
        let valid = match d.ts {
            DeviceTs::Ms(t) if t >= self.time.min_valid_epoch_ms => Ok(t),
            DeviceTs::Ms(_) => Err("device clock before time.min_valid_epoch_ms (RTC reset?)"),
            DeviceTs::Missing => Err("timestamp field missing"),
            DeviceTs::Invalid(why) => Err(why),
        };
        let device_ts = match (self.time.policy, valid) {
            (TimePolicy::Arrival, _) => return Ok((now.wall, false)),
            (_, Ok(t)) => t,
            (_, Err(why)) => {
                return match self.time.invalid {
                    InvalidPolicy::Arrival => Ok((now.wall, false)),
                    InvalidPolicy::Reject => Err(why),
                };
            }
        };
        if self.time.policy == TimePolicy::Device {
            return Ok((device_ts, false));
        }
        let window = self.time.skew_window;
        let dev = &mut self.devices[di].state;
        // Estimates are kept against the raw wall clock; `error` maps it onto true time.
        dev.skew.observe(raw_wall, device_ts, window);
        let est = dev
            .skew
            .estimate()
            .unwrap_or(0)
            .saturating_sub(self.clock.error);
        let skewed = est.abs() > self.time.max_skew_ms;
        if !skewed {
            self.clock.seconded();
        }
        if skewed && self.clock.unsure() {
            // Device or gateway wrong, not known yet: the earlier of the two
            // never puts a reading ahead of true time (see time::gateway).
            let t = if now.wall < self.time.min_valid_epoch_ms {
                device_ts
            } else {
                device_ts.min(now.wall)
            };
            return Ok((t, true));
        }
        if skewed != dev.distrusted {
            dev.distrusted = skewed;
            let last_seen = dev.max_event;
            let kind = if skewed {
                AlertType::ClockSkew
            } else {
                AlertType::ClockOk
            };
            self.alert(out, di, kind, last_seen, Some(est), now);
        }
        let t = if skewed {
            now.wall
        } else {
            device_ts.saturating_add(est)
        };
        Ok((t, false))
    }

    fn alert(
        &mut self,
        out: &mut Vec<Output>,
        di: usize,
        kind: AlertType,
        last_seen: Option<Millis>,
        offset_ms: Option<Millis>,
        now: Now,
    ) {
        let d = &self.devices[di];
        let wm = self.groups[d.group as usize].state.wm;
        self.counters.alerts += 1;
        out.push(Output::Alert(Alert {
            kind,
            group: d.state.group.clone(),
            device: d.state.id.clone(),
            last_seen,
            watermark: wm,
            offset_ms,
            at: now.wall,
        }));
    }

    /// Advances processing time: watermarks, firing, purge, liveness.
    pub fn on_tick(&mut self, now: Now, out: &mut Vec<Output>) {
        let now = Now {
            wall: self.clock.tick_wall(now.wall, now.mono),
            ..now
        };
        // A board without RTC before NTP sync: arrival-based decisions are unsafe.
        self.clock_held = now.wall < self.time.min_valid_epoch_ms;
        if self.clock_held {
            return;
        }
        let mut visit = std::mem::take(&mut self.visit);
        for oi in 0..self.group_order.len() {
            let gi = self.group_order[oi] as usize;
            let prev = self.groups[gi].state.wm;
            let wm = self.group_watermark(gi, now);
            let advanced = wm > prev;
            if advanced {
                self.groups[gi].state.wm = wm;
                self.mark_group(gi);
            }
            // Devices changed before the first watermark wait for it.
            let Some(wm) = wm else { continue };
            if !advanced && self.groups[gi].pending.is_empty() {
                continue;
            }
            visit.clear();
            let g = &mut self.groups[gi];
            for di in g.pending.drain(..) {
                self.devices[di as usize].pending = false;
                visit.push(di);
            }
            while let Some(&Reverse((at, di))) = g.deadlines.peek()
                && at <= wm
            {
                g.deadlines.pop();
                let d = &mut self.devices[di as usize];
                if d.deadline == Some(at) {
                    d.deadline = None;
                    visit.push(di);
                }
            }
            // Member (device id) order, as a visit of every member would emit.
            let devices = &self.devices;
            visit.sort_unstable_by(|&a, &b| {
                devices[a as usize]
                    .state
                    .id
                    .cmp(&devices[b as usize].state.id)
            });
            visit.dedup();
            for &di in &visit {
                self.close_device(gi, di as usize, wm, now, out);
                self.schedule(gi, di);
            }
            #[cfg(debug_assertions)]
            {
                let g = &self.groups[gi];
                for &di in &g.members {
                    let d = &self.devices[di as usize];
                    let next = deadline(
                        &d.state,
                        g.cfg.allowed_lateness_ms,
                        g.cfg.heartbeat_timeout_ms,
                    );
                    debug_assert!(next.is_none_or(|t| t > wm), "device left behind by a tick");
                    debug_assert!(d.deadline.is_none_or(|t| next.is_some_and(|n| t <= n)));
                }
            }
            let g = &mut self.groups[gi];
            if g.deadlines.len() > 2 * g.members.len() + 64 {
                let devices = &self.devices;
                g.deadlines = g
                    .members
                    .iter()
                    .filter_map(|&di| devices[di as usize].deadline.map(|t| Reverse((t, di))))
                    .collect();
            }
        }
        self.visit = visit;
    }

    /// Registers a device's next deadline after a visit.
    fn schedule(&mut self, gi: usize, di: u32) {
        let (lateness, hb) = (
            self.groups[gi].cfg.allowed_lateness_ms,
            self.groups[gi].cfg.heartbeat_timeout_ms,
        );
        let d = &mut self.devices[di as usize];
        let next = deadline(&d.state, lateness, hb);
        if next != d.deadline {
            d.deadline = next;
            if let Some(t) = next {
                self.groups[gi].deadlines.push(Reverse((t, di)));
            }
        }
    }

    /// The smallest `max_event` among active members, from `maxima`: stale
    /// entries and idle members are dropped as they surface. A member idle
    /// below the top cannot change the minimum, so it may stay.
    fn active_min(&mut self, gi: usize, now: Now) -> Option<Millis> {
        let g = &mut self.groups[gi];
        let devices = &mut self.devices;
        let back = now.mono < g.fold_mono;
        g.fold_mono = now.mono;
        if g.rebuild || back || g.maxima.len() > 2 * g.members.len() + 64 {
            g.rebuild = false;
            g.maxima.clear();
            for &di in &g.members {
                let d = &mut devices[di as usize];
                d.wm_key = d.state.max_event;
                if let Some(m) = d.wm_key {
                    g.maxima.push(Reverse((m, di)));
                }
            }
        }
        while let Some(&Reverse((m, di))) = g.maxima.peek() {
            let d = &mut devices[di as usize];
            if d.wm_key != Some(m) {
                g.maxima.pop();
            } else if now.mono.saturating_sub(d.state.last_arrival) >= g.cfg.idle_timeout_ms {
                g.maxima.pop();
                d.wm_key = None;
            } else {
                return Some(m);
            }
        }
        None
    }

    /// SPEC §5, via the pure fold in [`watermark`].
    fn group_watermark(&mut self, gi: usize, now: Now) -> Option<Millis> {
        let min = self.active_min(gi, now);
        let g = &self.groups[gi];
        let clock = watermark::GroupClock {
            max_event: g.state.max_event,
            last_arrival: g.state.last_arrival,
            idle_timeout_ms: g.cfg.idle_timeout_ms,
            out_of_orderness_ms: g.cfg.out_of_orderness_ms,
        };
        debug_assert_eq!(
            min,
            watermark::active_min(
                g.members.iter().map(|&d| {
                    let d = &self.devices[d as usize].state;
                    watermark::Member {
                        max_event: d.max_event,
                        last_arrival: d.last_arrival,
                    }
                }),
                clock,
                now.mono
            )
        );
        watermark::fold_min(g.state.wm, min, clock, now.mono)
    }

    /// End of a bounded input (`replay --flush`): every open window with
    /// unemitted events emits its result now, as a final watermark at +∞
    /// would, without moving the persisted watermarks or raising alerts.
    pub fn flush(&mut self, out: &mut Vec<Output>) {
        for oi in 0..self.group_order.len() {
            let gi = self.group_order[oi] as usize;
            for mi in 0..self.groups[gi].members.len() {
                let di = self.groups[gi].members[mi] as usize;
                if self.emit_windows(di, Millis::MAX, out) {
                    self.mark_device(di);
                }
            }
        }
    }

    /// Emits every window of a device with unemitted events that ends at or before `upto`.
    fn emit_windows(&mut self, di: usize, upto: Millis, out: &mut Vec<Output>) -> bool {
        let mut emitted = false;
        let dev = &mut self.devices[di].state;
        for w in dev.windows.iter_mut().filter(|w| w.dirty && upto >= w.end) {
            let revision = w.emitted.map_or(0, |r| r + 1);
            w.emitted = Some(revision);
            w.dirty = false;
            emitted = true;
            self.counters.windows_emitted += 1;
            out.push(Output::Window(window_result(
                &self.gateway,
                &dev.group,
                &dev.id,
                w,
                revision,
                &self.metric_names,
            )));
        }
        emitted
    }

    fn close_device(&mut self, gi: usize, di: usize, wm: Millis, now: Now, out: &mut Vec<Output>) {
        let (lateness, hb) = (
            self.groups[gi].cfg.allowed_lateness_ms,
            self.groups[gi].cfg.heartbeat_timeout_ms,
        );
        let mut changed = self.emit_windows(di, wm, out);
        let dev = &mut self.devices[di].state;
        let before = dev.windows.len();
        dev.windows.retain(|w| wm < w.end + lateness);
        changed |= dev.windows.len() != before;
        let offline_now = !dev.offline && dev.max_event.is_some_and(|seen| wm >= seen + hb);
        if offline_now {
            dev.offline = true;
            changed = true;
            let last_seen = dev.max_event;
            let (group, device) = (dev.group.clone(), dev.id.clone());
            self.alert(out, di, AlertType::Offline, last_seen, None, now);
            out.push(Output::Status {
                group,
                device,
                online: false,
            });
        }
        if changed {
            self.mark_device(di);
        }
    }
}

/// The watermark at which a device next has something to do: emit a changed
/// window (its end), purge one (end + allowed lateness), go offline (last
/// event + heartbeat timeout). Everything below it was done at the last visit.
fn deadline(d: &Device, lateness: Millis, heartbeat_timeout: Millis) -> Option<Millis> {
    let windows = d.windows.iter().map(|w| {
        let purge = w.end.saturating_add(lateness);
        if w.dirty { w.end.min(purge) } else { purge }
    });
    let offline = d
        .max_event
        .filter(|_| !d.offline)
        .map(|m| m.saturating_add(heartbeat_timeout));
    windows.chain(offline).min()
}

fn window_result(
    gateway: &Id,
    group: &Id,
    device: &Id,
    w: &Window,
    revision: u32,
    names: &[MetricName],
) -> WindowResult {
    WindowResult {
        id: format!("{group}/{device}/{}/{revision}", w.start),
        gateway: gateway.clone(),
        group: group.clone(),
        device: device.clone(),
        start: w.start,
        end: w.end,
        revision,
        count: w.count,
        heartbeats: w.heartbeats,
        metrics: w
            .metrics
            .iter()
            .filter_map(|(m, s)| {
                names
                    .get(*m as usize)
                    .map(|n| (n.clone(), MetricOut::from(s)))
            })
            .collect(),
    }
}
