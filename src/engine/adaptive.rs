//! "auto" bound and lateness in the engine (docs/reference.md#group_defaults-and-groupsname): the evidence each reading
//! gives, the values in force at a tick, and the frontier below which fired
//! windows are gone. Groups with fixed values never reach this code.

use super::{Engine, GroupSlot, Now};
use crate::model::Millis;
use crate::time::adaptive::AdaptiveState;
use crate::time::window::Fresh;

impl GroupSlot {
    /// Creates the adaptive state when a value turns "auto", drops it when none
    /// is; true when it changed.
    pub(super) fn fit_adaptive(&mut self) -> bool {
        match (&self.cfg.adaptive, &self.state.adaptive) {
            (Some(a), None) => {
                let mut st = AdaptiveState::new(a);
                st.floor = self.state.wm;
                self.state.adaptive = Some(st);
                true
            }
            (None, Some(_)) => {
                self.state.adaptive = None;
                true
            }
            _ => false,
        }
    }

    fn learned(&self) -> Option<(&crate::time::adaptive::AdaptiveConfig, &AdaptiveState)> {
        self.cfg.adaptive.as_ref().zip(self.state.adaptive.as_ref())
    }

    /// The watermark bound in force.
    pub(super) fn bound(&self) -> Millis {
        match self.learned() {
            Some((a, s)) if a.bound => s.bound.value,
            _ => self.cfg.out_of_orderness_ms,
        }
    }

    /// The lateness that decides which events a window no longer kept takes:
    /// fixed, or, when "auto", W − frontier (so a lateness that rises never
    /// brings back a window already gone).
    pub(super) fn lateness(&self) -> Millis {
        match self.learned() {
            Some((a, s)) if a.lateness => s.lateness_at(self.state.wm),
            _ => self.cfg.allowed_lateness_ms,
        }
    }

    /// How long fired windows are kept (their purge is scheduled with it): the
    /// value in force.
    pub(super) fn lateness_due(&self) -> Millis {
        match self.learned() {
            Some((a, s)) if a.lateness => s.lateness.value,
            _ => self.cfg.allowed_lateness_ms,
        }
    }

    /// With "auto" lateness: a window that starts after the device's latest window
    /// gone never existed, so it can take a returning backlog (up to `max_ms`
    /// behind) as a first result without giving any id a second content.
    pub(super) fn fresh(&self, purged_to_s: u32) -> Option<Fresh> {
        match self.learned() {
            Some((a, s)) if a.lateness => Some(Fresh {
                after: if purged_to_s == 0 {
                    Millis::MIN
                } else {
                    Millis::from(purged_to_s) * 1000
                }
                .max(s.floor.unwrap_or(Millis::MIN)),
                reach: a.max_ms,
            }),
            _ => None,
        }
    }

    /// "auto" lateness (purges do not follow the scheduled deadlines exactly).
    pub(super) fn auto_lateness(&self) -> bool {
        self.cfg.adaptive.is_some_and(|a| a.lateness)
    }
}

/// A window start as `purged_to_s` keeps it: epoch seconds rounded up (1 below
/// the epoch), so `after` is never below the start it stands for.
pub(super) fn purged_s(start: Millis) -> u32 {
    u32::try_from(start.div_euclid(1000) + i64::from(start.rem_euclid(1000) != 0))
        .unwrap_or(if start < 0 { 1 } else { u32::MAX })
        .max(1)
}

impl Engine {
    /// The evidence of one timed event of device `di`, before its state moves: a
    /// device back from idleness gives how far it is behind the watermark (the
    /// lateness), any other how far it is behind its own latest event — or behind
    /// the group's slowest active device when that is earlier: the part of its
    /// disorder the watermark sees (the bound).
    pub(super) fn observe_disorder(&mut self, gi: usize, di: usize, event: Millis, now: Now) {
        let Some(a) = self.groups[gi].cfg.adaptive else {
            return;
        };
        let slowest = if a.bound {
            self.active_min(gi, now)
        } else {
            None
        };
        let g = &mut self.groups[gi];
        let d = &self.devices[di].state;
        let returning = d.max_event.is_some()
            && now.mono.saturating_sub(d.last_arrival) >= g.cfg.idle_timeout_ms;
        let t = g.state.max_event.map_or(event, |m| m.max(event));
        let wm = g.state.wm;
        let Some(st) = g.state.adaptive.as_mut() else {
            return;
        };
        if returning {
            if a.lateness {
                let behind = wm.map_or(0, |w| w.saturating_sub(event).max(0));
                st.lateness.observe(behind, t, &a);
            }
        } else if a.bound {
            let own = d
                .max_event
                .get()
                .map_or(0, |m| m.saturating_sub(event).max(0));
            let seen = d.max_event.get().map_or(0, |m| {
                let front = slowest.map_or(m, |s| s.min(m));
                front.saturating_sub(event).max(0)
            });
            st.bound.observe(seen, t, &a);
            // Far behind its own device while the watermark is held by slower ones
            // (twice what the bulk of the evidence says): the delays moved (a
            // spike ending), which the watermark sees next.
            if own > st.bound.bulk.saturating_mul(2) {
                st.bound.raise(own, t, &a);
            }
        }
        self.mark_group(gi);
    }

    /// At a tick, before the watermark fold: the values in force at the group's
    /// event time.
    pub(super) fn refresh_adaptive(&mut self, gi: usize) {
        let g = &mut self.groups[gi];
        let (Some(a), Some(t)) = (g.cfg.adaptive, g.state.max_event) else {
            return;
        };
        let Some(st) = g.state.adaptive.as_mut() else {
            return;
        };
        let before = st.signature();
        st.refresh(t, &a);
        if st.signature() != before {
            self.mark_group(gi);
        }
    }

    /// After the fold: the frontier follows the watermark.
    pub(super) fn advance_frontier(&mut self, gi: usize) {
        let g = &mut self.groups[gi];
        let wm = g.state.wm;
        let Some(st) = g.state.adaptive.as_mut() else {
            return;
        };
        let before = st.frontier;
        st.advance(wm);
        if st.frontier != before {
            self.mark_group(gi);
        }
    }
}
