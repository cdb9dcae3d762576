//! The event-time engine (docs/reference.md#time): pure and deterministic.
//!
//! `on_message(topic, payload, now)` and `on_tick(now)` append [`Output`]s and
//! mark the state they changed; they never touch a socket, a file or a clock.
//! `run`, `replay` and the tests drive this same code.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use foldhash::fast::RandomState;

use crate::codec::{Decoded, Decoder, MetricName};
use crate::model::{Id, Millis, OptMillis, SharedId};
use crate::output::Output;
use crate::time::TimeConfig;
use crate::time::gateway::GatewayClock;
use crate::time::window::MetricIdx;
use crate::topic::TopicPattern;

mod adaptive;
mod clock;
pub mod conditions;
mod config;
mod emission;
pub mod expr;
mod heaps;
mod ingest;
pub mod judge;
mod rules;
mod slots;
mod sparkplug;
mod state;

pub use config::{EngineConfig, GroupConfig, GroupRules};
pub use emission::TICK_SLICE;
pub use ingest::Known;
pub use state::{Changes, Counters, Device, DeviceRecords, Group, GroupStats, RuleEpoch};

/// A device's liveness (docs/reference.md#group_defaults-and-groupsname).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    /// Heard from within `idle_timeout_ms`.
    Active,
    /// Silent for `idle_timeout_ms`, not offline.
    Idle,
    /// Offline alert raised.
    Offline,
}

impl Liveness {
    /// The name in the API and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Idle => "idle",
            Self::Offline => "offline",
        }
    }

    /// From its name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Active, Self::Idle, Self::Offline]
            .into_iter()
            .find(|l| l.as_str() == s)
    }
}

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

/// Min-heap of (time, device index); entries go stale lazily (see the users).
type TimeHeap = BinaryHeap<Reverse<(Millis, u32)>>;

struct GroupSlot {
    state: Group,
    /// The group's id, shared by its devices.
    id: SharedId,
    cfg: GroupConfig,
    /// Member device indexes, sorted by device id (deterministic output order).
    members: Vec<u32>,
    /// Device indexes, hashed by device id (the ids live in the slots).
    index: hashbrown::HashTable<u32>,
    /// Members' `max_event`s, for the active minimum of the watermark fold:
    /// an entry is current while it equals its device's `wm_key`.
    maxima: TimeHeap,
    /// `maxima` must be rebuilt from the members (restore, idleness restart).
    rebuild: bool,
    /// Monotonic time of the last fold: a member dropped as idle stays idle
    /// until its next event only while time does not go back (replayed captures may).
    fold_mono: Millis,
    /// Members' next deadlines in watermark time (see [`heaps::deadline`]): a tick
    /// visits only the devices whose deadline the watermark reached, plus
    /// `pending`. Ticks cost O(changes), not O(members).
    deadlines: TimeHeap,
    /// Members changed by input since their last visit.
    pending: Vec<u32>,
    /// The members' `ranks` are current (a device placed before others shifts them).
    ranked: bool,
    dirty: bool,
}

struct DeviceSlot {
    state: Device,
    group: u32,
    dirty: bool,
    /// In the group's `pending` list.
    pending: bool,
    /// Value of this device's current entry in the group's `maxima`.
    wm_key: OptMillis,
    /// Value of this device's current entry in the group's `deadlines`.
    deadline: OptMillis,
}

/// The engine.
pub struct Engine {
    gateway: Id,
    pattern: TopicPattern,
    decoder: Decoder,
    time: TimeConfig,
    /// Settings of groups without an override, and the overrides.
    group_rules: GroupRules,
    groups: Vec<GroupSlot>,
    group_index: HashMap<Id, u32, RandomState>,
    /// Hashes device ids for the groups' `index`.
    hasher: RandomState,
    /// Group indexes sorted by name.
    group_order: Vec<u32>,
    devices: Vec<DeviceSlot>,
    metric_names: Vec<MetricName>,
    metric_index: HashMap<MetricName, MetricIdx, RandomState>,
    persisted_names: usize,
    counters: Counters,
    dirty_groups: Vec<u32>,
    dirty_devices: Vec<u32>,
    /// The gateway wall clock is implausible: processing time is held.
    clock_held: bool,
    /// Judgement of the gateway's own clock (docs/reference.md#time).
    clock: GatewayClock,
    /// Reused list of device offset estimates for the consensus.
    estimates: Vec<Millis>,
    /// Reused decode buffer (boxed: moved in and out without copying).
    scratch: Option<Box<Decoded>>,
    /// Reused list of the devices a tick visits in one group.
    visit: Vec<u32>,
    /// Each device's place in its group's `members`, current while the group is
    /// `ranked`: a tick sorts its visits by it instead of comparing ids.
    ranks: Vec<u32>,
    /// Sparkplug B ingest (docs/reference.md#sparkplug--sparkplug-b-30-ingest).
    sparkplug: sparkplug::State,
    /// The highest remote document id taken: state, so replay protection survives
    /// a lost `remote.toml` and reaches a standby.
    fleet_last_id: u64,
    /// The Sparkplug edge node's next session counter: state, so a standby that
    /// takes over goes on with the `bdSeq` hosts expect.
    bd_seq: u64,
    /// Outputs' cursors and totals, by [`crate::model::OutputKind`].
    outputs: [crate::model::OutputMark; crate::model::OutputKind::ALL.len()],
    /// Gateway wall time of the latest tick (`at` of what a flush emits).
    wall: Millis,
    /// Reused by the conditions' judging.
    judging: conditions::Scratch,
    /// The last tick stopped at its budget: devices due wait in their groups' `pending`.
    backlog: bool,
    /// Devices a [`Engine::tick_slice`] may change ([`TICK_SLICE`]).
    slice: usize,
}

impl Engine {
    /// A fresh engine; `now` starts the idleness clocks.
    pub fn new(cfg: &EngineConfig) -> Self {
        Self {
            gateway: cfg.gateway.clone(),
            pattern: cfg.pattern.clone(),
            decoder: Decoder::new(&cfg.payload),
            time: cfg.time.clone(),
            group_rules: cfg.groups.clone(),
            groups: Vec::new(),
            group_index: HashMap::default(),
            hasher: RandomState::default(),
            group_order: Vec::new(),
            devices: Vec::new(),
            metric_names: Vec::new(),
            metric_index: HashMap::default(),
            persisted_names: 0,
            counters: Counters::default(),
            dirty_groups: Vec::new(),
            dirty_devices: Vec::new(),
            clock_held: false,
            clock: GatewayClock::default(),
            estimates: Vec::new(),
            scratch: Some(Box::default()),
            visit: Vec::new(),
            ranks: Vec::new(),
            sparkplug: sparkplug::State::new(&cfg.sparkplug),
            fleet_last_id: 0,
            bd_seq: 0,
            outputs: Default::default(),
            wall: 0,
            judging: conditions::Scratch::default(),
            backlog: false,
            slice: TICK_SLICE,
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
        self.restore_groups(groups, metric_names, counters, devices.len());
        for d in devices {
            self.restore_device(d);
        }
        self.restored();
    }

    /// Restore, first step: the groups, names and counters, with room for `devices`
    /// devices; then each device ([`Engine::restore_device`]), then [`Engine::restored`].
    /// A store streams its devices in: a 100 000-device fleet is not held twice.
    pub fn restore_groups(
        &mut self,
        groups: Vec<Group>,
        metric_names: Vec<MetricName>,
        counters: Counters,
        devices: usize,
    ) {
        for g in groups {
            self.group_slot(&g.name.clone());
            let gi = self.group_index[&g.name] as usize;
            self.groups[gi].state = g;
            self.groups[gi].fit_adaptive();
            self.groups[gi].dirty = false;
        }
        // Exactly the restored fleet, not a quarter more (devices that join later grow it).
        self.devices.reserve_exact(devices);
        self.ranks.reserve_exact(devices);
        for (i, n) in metric_names.iter().enumerate() {
            self.metric_index
                .insert(n.clone(), MetricIdx::try_from(i).unwrap_or(MetricIdx::MAX));
        }
        self.persisted_names = metric_names.len();
        self.metric_names = metric_names;
        self.counters = counters;
    }

    /// Restores one device (after [`Engine::restore_groups`]).
    pub fn restore_device(&mut self, mut d: Device) {
        let di = self.device_slot(&d.group.clone(), &d.id.to_id());
        let slot = &self.groups[self.devices[di].group as usize];
        d.group = slot.id.clone();
        let g = &slot.state;
        if d.restarts != g.restarts {
            // Stored before the group's latest idleness restart, not written since.
            d.last_arrival = g.restarted_at;
            d.restarts = g.restarts;
        }
        self.devices[di].state = d;
        self.devices[di].dirty = false;
    }

    /// Restore, last step: every device is in.
    pub fn restored(&mut self) {
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
            g.state.restarts = g.state.restarts.wrapping_add(1);
            g.state.restarted_at = now.mono;
        }
        // The devices' clocks restart with their group's count: a checkpoint holds
        // the groups, and a device record stored before restores from them (see
        // [`Engine::restore_device`]). Marking every device would write the whole
        // fleet at each start and reconnect (~100 MB at 100 000 devices).
        for d in &mut self.devices {
            d.state.last_arrival = now.mono;
            d.state.restarts = self.groups[d.group as usize].state.restarts;
        }
        for gi in 0..self.groups.len() {
            self.mark_group(gi);
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

    /// A remote document id was taken (never lowers the one held).
    pub fn take_fleet_id(&mut self, id: u64) {
        self.fleet_last_id = self.fleet_last_id.max(id);
    }

    /// The highest remote document id taken (0: none).
    pub fn fleet_last_id(&self) -> u64 {
        self.fleet_last_id
    }

    /// The edge node's next session counter moved on (never back).
    pub fn take_bd_seq(&mut self, next: u64) {
        self.bd_seq = self.bd_seq.max(next);
    }

    /// The edge node's next session counter (0: none).
    pub fn bd_seq(&self) -> u64 {
        self.bd_seq
    }

    /// An output's cursor and totals moved on (never back).
    pub fn take_output_mark(&mut self, o: crate::model::OutputKind, m: crate::model::OutputMark) {
        let slot = &mut self.outputs[o as usize];
        *slot = slot.max(m);
    }

    /// An output's cursor and totals (zero: none yet).
    pub fn output_mark(&self, o: crate::model::OutputKind) -> crate::model::OutputMark {
        self.outputs[o as usize]
    }

    /// A new process: its monotonic clock has a new origin, so a jump of
    /// wall − mono across it is not a step (docs/reference.md#contract-notes).
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
            && self.clock.waiting.is_empty()
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

    /// The gateway id.
    pub fn gateway_id(&self) -> &str {
        &self.gateway
    }

    /// Devices in (group, device) order, starting after `after` (live status paging).
    pub fn devices_after<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
    ) -> impl Iterator<Item = &'a Device> + 'a {
        let first = after.map_or(0, |(g, _)| {
            self.group_order
                .partition_point(|&gi| self.groups[gi as usize].state.name.as_str() < g)
        });
        self.group_order[first..].iter().flat_map(move |&gi| {
            let g = &self.groups[gi as usize];
            let skip = match after {
                Some((ag, ad)) if g.state.name.as_str() == ag => g
                    .members
                    .partition_point(|&d| self.devices[d as usize].state.id.as_str() <= ad),
                _ => 0,
            };
            g.members[skip..]
                .iter()
                .map(|&d| &self.devices[d as usize].state)
        })
    }

    /// A device's liveness at `now` as the metrics count it: offline, idle (silent
    /// for its group's `idle_timeout_ms`) or active.
    pub fn liveness(&self, d: &Device, now: Now) -> Liveness {
        let idle_after = self
            .group_index
            .get(d.group.as_str())
            .map_or(Millis::MAX, |&gi| {
                self.groups[gi as usize].cfg.idle_timeout_ms
            });
        if d.offline {
            Liveness::Offline
        } else if now.mono.saturating_sub(d.last_arrival) >= idle_after {
            Liveness::Idle
        } else {
            Liveness::Active
        }
    }

    /// The names of a device's conditions raised now (docs/conditions.md).
    pub fn raised_conditions<'a>(&'a self, d: &'a Device) -> impl Iterator<Item = &'a str> {
        let conds = self
            .group_index
            .get(d.group.as_str())
            .map_or(&[][..], |&gi| &self.groups[gi as usize].cfg.conditions[..]);
        conditions::raised(&d.conditions, conds)
    }

    /// A device's state.
    pub fn device(&self, group: &str, device: &str) -> Option<&Device> {
        self.lookup(group, device).map(|i| &self.devices[i].state)
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
                    bound_ms: g.bound(),
                    lateness_ms: g.lateness_due(),
                    conditions: g.state.conditions,
                    ..GroupStats::default()
                };
                for &di in &g.members {
                    let d = &self.devices[di as usize].state;
                    st.missing += d.missing;
                    st.timestamps_invalid += u64::from(d.timestamps_invalid);
                    st.open_windows += d.windows.len() as u64;
                    if conditions::raised(&d.conditions, &g.cfg.conditions)
                        .next()
                        .is_some()
                    {
                        st.conditions_raised += 1;
                    }
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
        self.take_changes_upto(usize::MAX)
    }

    /// [`Engine::take_changes`] with at most `devices` device records: the rest stay
    /// marked for [`Engine::take_device_slice`] (a checkpoint streamed to the store).
    pub fn take_changes_upto(&mut self, devices: usize) -> Changes {
        let mut c = Changes {
            groups: Vec::with_capacity(self.dirty_groups.len()),
            devices: DeviceRecords::with_capacity(self.dirty_devices.len()),
            metric_names: Vec::new(),
            counters: self.counters.clone(),
            clock: self.clock.clone(),
            sparkplug: self.take_sparkplug_changes(),
            fleet_last_id: self.fleet_last_id,
            bd_seq: self.bd_seq,
            outputs: self.outputs,
        };
        for g in self.dirty_groups.drain(..) {
            let slot = &mut self.groups[g as usize];
            slot.dirty = false;
            c.groups.push(slot.state.clone());
        }
        c.devices = self.take_device_slice(devices);
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

    /// The records of up to `n` changed devices not yet taken, in the order they changed.
    pub fn take_device_slice(&mut self, n: usize) -> DeviceRecords {
        let n = n.min(self.dirty_devices.len());
        let mut records = DeviceRecords::with_capacity(n);
        for d in self.dirty_devices.drain(..n) {
            let slot = &mut self.devices[d as usize];
            slot.dirty = false;
            records.push(&slot.state);
        }
        records
    }

    /// Marks all state changed: the next checkpoint writes all of it (a streamed
    /// checkpoint failed after its records were taken).
    pub fn mark_all_changed(&mut self) {
        for di in 0..self.devices.len() {
            self.mark_device(di);
        }
        for gi in 0..self.groups.len() {
            self.mark_group(gi);
        }
        self.persisted_names = 0;
        for (_, dirty) in &mut self.sparkplug.nodes {
            *dirty = true;
        }
    }
}
