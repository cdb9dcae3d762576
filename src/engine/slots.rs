//! Group and device slots: lookup, creation in id order, change tracking.

use std::collections::BinaryHeap;
use std::hash::BuildHasher;

use super::{Device, Group};
use super::{DeviceSlot, Engine, GroupSlot, MAX_DEVICES};
use crate::model::{Id, Millis, OptMillis, SharedId, SlotId};
use crate::time::seq::SeqWindow;
use crate::time::skew::SkewEstimator;
use crate::time::windows::Windows;

/// Slots added at a time once the table is large.
const SLOT_STEP: usize = 512;

impl Engine {
    pub(super) fn mark_device(&mut self, di: usize) {
        if !self.devices[di].dirty {
            self.devices[di].dirty = true;
            self.dirty_devices
                .push(u32::try_from(di).unwrap_or(u32::MAX));
        }
    }

    pub(super) fn mark_pending(&mut self, di: usize) {
        let d = &mut self.devices[di];
        if !d.pending {
            d.pending = true;
            self.groups[d.group as usize]
                .pending
                .push(u32::try_from(di).unwrap_or(u32::MAX));
        }
    }

    pub(super) fn mark_group(&mut self, gi: usize) {
        if !self.groups[gi].dirty {
            self.groups[gi].dirty = true;
            self.dirty_groups
                .push(u32::try_from(gi).unwrap_or(u32::MAX));
        }
    }

    pub(super) fn group_slot(&mut self, name: &Id) -> usize {
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
                rules: Vec::new(),
                restarts: 0,
                restarted_at: 0,
                adaptive: None,
                conditions: [0; 3],
            },
            id: SharedId::new(name.clone()),
            cfg: self.group_rules.of(name).clone(),
            members: Vec::new(),
            index: hashbrown::HashTable::new(),
            maxima: BinaryHeap::new(),
            rebuild: false,
            fold_mono: Millis::MIN,
            deadlines: BinaryHeap::new(),
            pending: Vec::new(),
            ranked: true,
            dirty: false,
        });
        self.group_index.insert(name.clone(), gi);
        let pos = self
            .group_order
            .partition_point(|&g| self.groups[g as usize].state.name < *name);
        self.group_order.insert(pos, gi);
        self.groups[i].fit_adaptive();
        self.mark_group(i);
        i
    }

    pub(super) fn find_device(&self, group: &Id, device: &Id) -> Option<usize> {
        self.lookup(group, device)
    }

    pub(super) fn lookup(&self, group: &str, device: &str) -> Option<usize> {
        let gi = *self.group_index.get(group)?;
        let h = self.hasher.hash_one(device);
        self.groups[gi as usize]
            .index
            .find(h, |&i| self.devices[i as usize].state.id.as_str() == device)
            .map(|&i| i as usize)
    }

    /// Whether slot `i` is `group`'s device `device`.
    pub(super) fn holds(&self, i: u32, group: &str, device: &str) -> bool {
        self.devices.get(i as usize).is_some_and(|d| {
            d.state.id.as_str() == device && self.groups[d.group as usize].state.name == group
        })
    }

    /// The slot a message on `topic` most likely goes to (its hash's first match,
    /// ids not compared), its memory fetched into the cache; for replay, which
    /// knows its next records: [`Engine::prefetch_windows`] and
    /// [`Engine::prefetch_blocks`] follow one stage each.
    pub fn prefetch_slot(&self, topic: &str) -> Option<u32> {
        let (group, device) = self.pattern.ids(topic)?;
        let gi = *self.group_index.get(group)?;
        let h = self.hasher.hash_one(device);
        let &i = self.groups[gi as usize].index.find(h, |_| true)?;
        crate::hint::prefetch(self.devices.get(i as usize)?);
        Some(i)
    }

    /// Before visiting `visits[0]`: the next devices' slots and windows on their way
    /// into the cache (a close burst visits every device once: each first touch a miss).
    pub(super) fn prefetch_visits(&self, visits: &[u32]) {
        if let Some(d) = visits.get(2).and_then(|&i| self.devices.get(i as usize)) {
            crate::hint::prefetch(d);
        }
        if let Some(&i) = visits.get(1) {
            self.prefetch_windows(i);
        }
    }

    /// Slot `i`'s open windows into the cache (the slot already is).
    pub fn prefetch_windows(&self, i: u32) {
        if let Some(d) = self.devices.get(i as usize) {
            d.state.windows.prefetch();
        }
    }

    /// Their metric blocks into the cache (the windows already are).
    pub fn prefetch_blocks(&self, i: u32) {
        if let Some(d) = self.devices.get(i as usize) {
            d.state.windows.prefetch_blocks();
        }
    }

    pub(super) fn device_slot(&mut self, group: &Id, device: &Id) -> usize {
        if let Some(i) = self.find_device(group, device) {
            return i;
        }
        let gi = self.group_slot(group);
        let i = self.devices.len();
        let di = u32::try_from(i).unwrap_or(u32::MAX);
        if i == self.devices.capacity() {
            // A quarter more at a time up to a fixed step, not double: a slot is
            // ~480 bytes and a fleet's size is reached once (10 000 devices in a
            // 16 384-slot table left 3 MiB unused). A step is larger than glibc's
            // mmap threshold, so growing remaps pages instead of copying them.
            self.devices.reserve_exact((i / 4).clamp(64, SLOT_STEP));
            self.ranks
                .reserve_exact(self.devices.capacity() - self.ranks.len());
        }
        self.devices.push(DeviceSlot {
            state: Device {
                group: self.groups[gi].id.clone(),
                id: SlotId::from(device),
                skew: SkewEstimator::default(),
                distrusted: false,
                max_event: OptMillis::NONE,
                last_arrival: 0,
                offline: false,
                announced: false,
                seq: SeqWindow::default(),
                windows: Windows::default(),
                missing: 0,
                timestamps_invalid: 0,
                accepted: 0,
                late: 0,
                duplicates: 0,
                restarts: self.groups[gi].state.restarts,
                purged_to_s: 0,
                conditions: None,
            },
            group: u32::try_from(gi).unwrap_or(u32::MAX),
            dirty: false,
            pending: false,
            wm_key: OptMillis::NONE,
            deadline: OptMillis::NONE,
        });
        let (devices, hasher) = (&self.devices, &self.hasher);
        self.groups[gi]
            .index
            .insert_unique(hasher.hash_one(device.as_str()), di, |&j| {
                hasher.hash_one(devices[j as usize].state.id.as_str())
            });
        let members = &self.groups[gi].members;
        let pos = members
            .partition_point(|&d| self.devices[d as usize].state.id.as_str() < device.as_str());
        let g = &mut self.groups[gi];
        g.members.insert(pos, di);
        // Placed last (ids that arrive in order): no other member's rank moves.
        g.ranked &= pos + 1 == g.members.len();
        self.ranks.push(u32::try_from(pos).unwrap_or(u32::MAX));
        // Room for the heaps up to their compaction bound: no allocation on the hot
        // path. `maxima` holds one entry a member at most (see `active_min`).
        let bound = 2 * g.members.len() + 65;
        g.maxima
            .reserve(g.members.len().saturating_sub(g.maxima.len()));
        g.deadlines.reserve(bound.saturating_sub(g.deadlines.len()));
        self.visit
            .reserve(g.members.len().saturating_sub(self.visit.len()));
        self.mark_device(i);
        i
    }

    /// A new device beyond [`MAX_DEVICES`]: the rejection's detail.
    pub(super) fn over_device_limit(&self, group: &Id, device: &Id) -> Option<String> {
        (self.devices.len() >= MAX_DEVICES && self.find_device(group, device).is_none())
            .then(|| format!("device limit of {MAX_DEVICES} reached; new device not tracked"))
    }
}
