//! A tick: watermarks advance, windows fire and purge, devices go offline.

use std::cmp::Reverse;

use super::{Engine, Now};
use crate::codec::MetricName;
use crate::model::{Id, Millis, OptMillis, SlotId};
use crate::output::{Alert, AlertType, Emit, MetricOut, Output, WindowResult};
use crate::time::window::Window;

use super::conditions;

/// Devices one [`Engine::tick_slice`] may change: ~1.5 MB of window results.
pub const TICK_SLICE: usize = 4096;

impl Engine {
    /// Advances processing time: watermarks, firing, purge, liveness.
    pub fn on_tick(&mut self, now: Now, out: &mut dyn Emit) {
        self.tick_pass(now, out, usize::MAX);
    }

    /// [`Engine::on_tick`] that changes at most [`TICK_SLICE`] devices: a window-close
    /// burst leaves the rest for the next slice ([`Engine::backlog`]), so `run` hands the
    /// burst to the store a slice at a time. Slices at one instant until the backlog is
    /// gone leave the state and outputs of one [`Engine::on_tick`]. Returns the backlog.
    pub fn tick_slice(&mut self, now: Now, out: &mut dyn Emit) -> bool {
        self.tick_pass(now, out, self.slice);
        self.backlog
    }

    /// Tests: slices of `n` devices (a journal is replayed with the slices it was made with).
    #[doc(hidden)]
    #[must_use]
    pub fn with_tick_slice(mut self, n: usize) -> Self {
        self.slice = n.max(1);
        self
    }

    /// The last tick stopped at its budget (docs/reference.md#memory).
    pub fn backlog(&self) -> bool {
        self.backlog
    }

    /// Debug builds: after a whole pass no member is left with something due.
    #[cfg(debug_assertions)]
    fn check_deadlines(&self, gi: usize, wm: Millis) {
        let g = &self.groups[gi];
        // "auto" lateness purges by the frontier, not exactly at the deadlines.
        if g.auto_lateness() {
            return;
        }
        for &di in &g.members {
            let d = &self.devices[di as usize];
            let next = super::heaps::deadline(
                &d.state,
                g.cfg.allowed_lateness_ms,
                g.cfg.heartbeat_timeout_ms,
            );
            debug_assert!(next.is_none_or(|t| t > wm), "device left behind by a tick");
            let kept = d.deadline.get();
            debug_assert!(kept.is_none_or(|t| next.is_some_and(|n| t <= n)));
        }
    }

    /// Group `gi`'s devices to visit at watermark `wm` into `visit`: those changed
    /// since the last visit and those whose deadline is due.
    fn due(&mut self, gi: usize, wm: Millis, visit: &mut Vec<u32>) {
        visit.clear();
        let g = &mut self.groups[gi];
        for di in g.pending.drain(..) {
            self.devices[di as usize].pending = false;
            visit.push(di);
        }
        while let Some(&Reverse((at, di))) = g.deadlines.peek()
            && at <= wm
        {
            // The next tops (the top's children) on their way into the cache.
            for &Reverse((_, n)) in g.deadlines.as_slice().iter().skip(1).take(2) {
                if let Some(d) = self.devices.get(n as usize) {
                    crate::hint::prefetch(&d.deadline);
                }
            }
            g.deadlines.pop();
            let d = &mut self.devices[di as usize];
            if d.deadline.get() == Some(at) {
                d.deadline = OptMillis::NONE;
                visit.push(di);
            }
        }
    }

    fn tick_pass(&mut self, now: Now, out: &mut dyn Emit, mut budget: usize) {
        self.backlog = false;
        let now = Now {
            wall: self.clock.tick_wall(now.wall, now.mono),
            ..now
        };
        self.wall = now.wall;
        self.clock.expire(now.mono);
        self.release_waiting(out);
        // A board without RTC before NTP sync: arrival-based decisions are unsafe.
        self.clock_held = now.wall < self.time.min_valid_epoch_ms;
        if self.clock_held {
            return;
        }
        let mut visit = std::mem::take(&mut self.visit);
        for oi in 0..self.group_order.len() {
            if budget == 0 {
                // Later groups are looked at by the next slice.
                self.backlog = true;
                break;
            }
            let gi = self.group_order[oi] as usize;
            let prev = self.groups[gi].state.wm;
            self.refresh_adaptive(gi);
            let wm = self.group_watermark(gi, now);
            let advanced = wm > prev;
            if advanced {
                self.groups[gi].state.wm = wm;
                self.mark_group(gi);
            }
            self.advance_frontier(gi);
            // Devices changed before the first watermark wait for it.
            let Some(wm) = wm else { continue };
            if !advanced && self.groups[gi].pending.is_empty() {
                continue;
            }
            self.due(gi, wm, &mut visit);
            // Member (device id) order, as a visit of every member would emit.
            let g = &mut self.groups[gi];
            if !g.ranked {
                for (r, &di) in g.members.iter().enumerate() {
                    self.ranks[di as usize] = u32::try_from(r).unwrap_or(u32::MAX);
                }
                g.ranked = true;
            }
            let ranks = &self.ranks;
            visit.sort_unstable_by_key(|&di| ranks[di as usize]);
            visit.dedup();
            let mut left = visit.len();
            for (k, &di) in visit.iter().enumerate() {
                if budget == 0 {
                    left = k;
                    break;
                }
                self.prefetch_visits(&visit[k..]);
                // Only changes count: a visit that changes nothing (every device after a
                // restore is visited once) costs no budget, so the slices a journal replays
                // are the slices `run` made.
                if self.close_device(gi, di as usize, wm, now, out) {
                    budget -= 1;
                }
                self.schedule(gi, di);
            }
            for &di in &visit[left..] {
                self.mark_pending(di as usize);
            }
            if left < visit.len() {
                self.backlog = true;
            }
            #[cfg(debug_assertions)]
            if left == visit.len() {
                self.check_deadlines(gi, wm);
            }
            let g = &mut self.groups[gi];
            if g.deadlines.len() > 2 * g.members.len() + 64 {
                let devices = &self.devices;
                g.deadlines = g
                    .members
                    .iter()
                    .filter_map(|&di| {
                        devices[di as usize]
                            .deadline
                            .get()
                            .map(|t| Reverse((t, di)))
                    })
                    .collect();
            }
        }
        self.visit = visit;
    }

    /// End of a bounded input (`replay --flush`): every open window with
    /// unemitted events emits its result now, as a final watermark at +∞
    /// would, without moving the persisted watermarks or raising alerts.
    pub fn flush(&mut self, out: &mut dyn Emit) {
        for oi in 0..self.group_order.len() {
            let gi = self.group_order[oi] as usize;
            for mi in 0..self.groups[gi].members.len() {
                let di = self.groups[gi].members[mi] as usize;
                if self.emit_windows(di, Millis::MAX, self.wall, out) {
                    self.mark_device(di);
                }
            }
        }
    }

    /// Emits every window of a device with unemitted events that ends at or
    /// before `upto`, each followed by what its conditions say (`at`: gateway time).
    pub(super) fn emit_windows(
        &mut self,
        di: usize,
        upto: Millis,
        at: Millis,
        out: &mut dyn Emit,
    ) -> bool {
        let mut emitted = false;
        let gi = self.devices[di].group as usize;
        let g = &self.groups[gi];
        let extras = g.cfg.extras;
        let dev = &mut self.devices[di].state;
        let mut counts = [0; 3];
        let said = &mut self.judging;
        for w in dev
            .windows
            .open_mut()
            .iter_mut()
            .filter(|w| w.dirty && upto >= w.end)
        {
            let revision = w.emitted().map_or(0, |r| r + 1);
            if revision == 0
                && let Some(x) = w.extra.as_deref_mut()
            {
                crate::time::extras::shrink(x);
            }
            w.set_emitted(Some(revision));
            w.dirty = false;
            emitted = true;
            self.counters.windows_emitted += 1;
            let r = window_result(
                &self.gateway,
                (&dev.group, &dev.id),
                w,
                revision,
                (&self.metric_names, extras),
            );
            if !g.cfg.conditions.is_empty() || dev.conditions.is_some() {
                let spec = g.rule_at(w.start).map_or(g.cfg.window, |(s, _)| s);
                let c = conditions::judge(
                    &g.cfg.conditions,
                    spec.step_ms(),
                    &mut dev.conditions,
                    &r,
                    at,
                    said,
                );
                for (n, k) in counts.iter_mut().zip(c) {
                    *n += k;
                }
            }
            out.emit(Output::Window(r));
            for o in said.said.drain(..) {
                out.emit(o);
            }
        }
        if counts != [0; 3] {
            for (i, k) in counts.into_iter().enumerate() {
                self.counters.conditions[i] += k;
                self.groups[gi].state.conditions[i] += k;
            }
            self.mark_group(gi);
        }
        emitted
    }

    /// Windows no later reading can revise are folded into the device's conditions.
    fn settle_conditions(&mut self, gi: usize, di: usize, wm: Millis, lateness: Millis) -> bool {
        let g = &self.groups[gi];
        let dev = &mut self.devices[di].state;
        if dev.conditions.is_none() {
            return false;
        }
        let span = g.cfg.window.span_ms();
        // A late reading may still open a window starting after this, or revise one held.
        let mut before = wm
            .saturating_sub(lateness)
            .saturating_sub(span)
            .saturating_add(1);
        if let Some(s) = dev.windows.first_start() {
            before = before.min(s);
        }
        conditions::settle(
            &g.cfg.conditions,
            g.cfg.window.step_ms(),
            &mut dev.conditions,
            before,
        )
    }

    pub(super) fn close_device(
        &mut self,
        gi: usize,
        di: usize,
        wm: Millis,
        now: Now,
        out: &mut dyn Emit,
    ) -> bool {
        let g = &self.groups[gi];
        let (lateness, hb, auto) = (
            g.lateness_due(),
            g.cfg.heartbeat_timeout_ms,
            g.auto_lateness(),
        );
        let mut changed = self.emit_windows(di, wm, now.wall, out);
        let dev = &mut self.devices[di].state;
        if auto {
            let mut gone = None;
            changed |= dev.windows.retain(|start, end| {
                let keep = wm < end + lateness;
                if !keep {
                    gone = gone.max(Some(start));
                }
                keep
            });
            if let Some(s) = gone {
                dev.purged_to_s = dev.purged_to_s.max(super::adaptive::purged_s(s));
            }
        } else {
            changed |= dev.windows.retain(|_, end| wm < end + lateness);
        }
        changed |= self.settle_conditions(gi, di, wm, lateness);
        let dev = &mut self.devices[di].state;
        let offline_now = !dev.offline && dev.max_event.get().is_some_and(|seen| wm >= seen + hb);
        if offline_now {
            dev.offline = true;
            changed = true;
            let last_seen = dev.max_event.get();
            let (group, device) = (Id::clone(&dev.group), dev.id.to_id());
            self.alert(out, di, AlertType::Offline, last_seen, None, now);
            out.emit(Output::Status {
                group,
                device,
                online: false,
            });
        }
        if changed {
            self.mark_device(di);
        }
        changed
    }

    pub(super) fn alert(
        &mut self,
        out: &mut dyn Emit,
        di: usize,
        kind: AlertType,
        last_seen: Option<Millis>,
        offset_ms: Option<Millis>,
        now: Now,
    ) {
        let d = &self.devices[di];
        let wm = self.groups[d.group as usize].state.wm;
        self.counters.alerts += 1;
        out.emit(Output::Alert(Alert {
            kind,
            group: Id::clone(&d.state.group),
            device: d.state.id.to_id(),
            last_seen,
            watermark: wm,
            offset_ms,
            at: now.wall,
        }));
    }
}

/// `{group}/{device}/{start}/{revision}`, as `format!` writes it.
fn window_id(group: &str, device: &str, start: Millis, revision: u32) -> String {
    let (mut a, mut b) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (start, revision) = (a.format(start), b.format(revision));
    let mut id =
        String::with_capacity(group.len() + device.len() + start.len() + revision.len() + 3);
    for (i, part) in [group, device, start, revision].into_iter().enumerate() {
        if i > 0 {
            id.push('/');
        }
        id.push_str(part);
    }
    id
}

fn window_result(
    gateway: &Id,
    (group, device): (&Id, &SlotId),
    w: &Window,
    revision: u32,
    (names, extras): (&[MetricName], crate::time::extras::Extras),
) -> WindowResult {
    let state = |m| {
        w.extra
            .as_deref()
            .and_then(|l| l.iter().find(|e| e.metric == m))
    };
    WindowResult {
        id: window_id(group, device.as_str(), w.start, revision),
        gateway: gateway.clone(),
        group: group.clone(),
        device: device.to_id(),
        start: w.start,
        end: w.end,
        revision,
        count: u64::from(w.count),
        heartbeats: u64::from(w.heartbeats),
        metrics: w
            .metrics
            .iter()
            .filter_map(|s| {
                names.get(s.metric as usize).map(|n| {
                    let mut m = MetricOut::from(&s);
                    m.extra = crate::time::extras::out(extras, state(s.metric), s.delta());
                    (n.clone(), m)
                })
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    proptest::proptest! {
        #[test]
        fn window_ids_read_as_formatted(g in "[a-z0-9._:-]{1,64}", d in "[a-z0-9._:-]{1,64}", start: i64, rev: u32) {
            proptest::prop_assert_eq!(super::window_id(&g, &d, start, rev), format!("{g}/{d}/{start}/{rev}"));
        }
    }
}
