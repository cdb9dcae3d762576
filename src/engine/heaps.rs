//! The two lazy heaps per group that make a tick cost O(changes): the active
//! members' maxima (watermark fold, SPEC §5) and the members' next deadlines.

use std::cmp::Reverse;

use super::{Device, Engine, Now};
use crate::model::Millis;
use crate::time::watermark;

impl Engine {
    /// Registers a device's next deadline after a visit.
    pub(super) fn schedule(&mut self, gi: usize, di: u32) {
        let (lateness, hb) = (
            self.groups[gi].lateness_due(),
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
    pub(super) fn active_min(&mut self, gi: usize, now: Now) -> Option<Millis> {
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
    pub(super) fn group_watermark(&mut self, gi: usize, now: Now) -> Option<Millis> {
        let min = self.active_min(gi, now);
        let g = &self.groups[gi];
        let clock = watermark::GroupClock {
            max_event: g.state.max_event,
            last_arrival: g.state.last_arrival,
            idle_timeout_ms: g.cfg.idle_timeout_ms,
            out_of_orderness_ms: g.bound(),
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
}

/// The watermark at which a device next has something to do: emit a changed
/// window (its end), purge one (end + allowed lateness), go offline (last
/// event + heartbeat timeout). Everything below it was done at the last visit.
pub(super) fn deadline(d: &Device, lateness: Millis, heartbeat_timeout: Millis) -> Option<Millis> {
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
