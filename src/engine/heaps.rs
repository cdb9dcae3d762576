//! The two lazy heaps per group that make a tick cost O(changes): the active
//! members' maxima (watermark fold, docs/reference.md#group_defaults-and-groupsname) and the members' next deadlines.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;

use super::{Device, Engine, Now};
use crate::model::{Millis, OptMillis};
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
        if next != d.deadline.get() {
            d.deadline = next.into();
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
                if let Some(m) = d.wm_key.get() {
                    g.maxima.push(Reverse((m, di)));
                }
            }
        }
        // An entry is a lower bound of its device's `max_event` (input does not
        // push each new maximum): one below it at the top is raised in place.
        loop {
            // The top's children are the next tops: their devices on their way into
            // the cache while this one is looked at (each a miss in a busy tick).
            for &Reverse((_, n)) in g.maxima.as_slice().iter().skip(1).take(2) {
                if let Some(d) = devices.get(n as usize) {
                    crate::hint::prefetch(&d.wm_key);
                    crate::hint::prefetch(&d.state.max_event);
                }
            }
            let Some(mut top) = g.maxima.peek_mut() else {
                break;
            };
            let Reverse((m, di)) = *top;
            let d = &mut devices[di as usize];
            if d.wm_key.get() != Some(m) {
                PeekMut::pop(top);
            } else if now.mono.saturating_sub(d.state.last_arrival) >= g.cfg.idle_timeout_ms {
                PeekMut::pop(top);
                d.wm_key = OptMillis::NONE;
            } else {
                match d.state.max_event.get() {
                    Some(cur) if cur == m => return Some(m),
                    Some(cur) => {
                        d.wm_key = OptMillis::some(cur);
                        *top = Reverse((cur, di));
                    }
                    None => {
                        PeekMut::pop(top);
                        d.wm_key = OptMillis::NONE;
                    }
                }
            }
        }
        None
    }

    /// docs/reference.md#group_defaults-and-groupsname, via the pure fold in [`watermark`].
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
                        max_event: d.max_event.get(),
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
    let windows = d.windows.deadline(lateness);
    let offline = d
        .max_event
        .get()
        .filter(|_| !d.offline)
        .map(|m| m.saturating_add(heartbeat_timeout));
    windows.into_iter().chain(offline).min()
}

#[cfg(test)]
mod tests {
    use crate::engine::{Engine, Now};
    use crate::output::Output;

    const T0: i64 = 1_764_480_000_000;

    fn reading(e: &mut Engine, ts: i64, at: i64, out: &mut Vec<Output>) {
        let p = format!(r#"{{"ts": {ts}, "v": 1}}"#);
        e.on_message("sensors/g/d/reading", p.as_bytes(), Now::at(at), out);
    }

    fn revisions(out: &[Output]) -> Vec<(i64, u32)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Window(w) => Some((w.start - T0, w.revision)),
                _ => None,
            })
            .collect()
    }

    /// A reading with nothing due below the watermark waits in the deadline heap
    /// (no visit at the next tick); a late one into a fired window is visited at
    /// the next tick and re-emitted, though the watermark does not move.
    #[test]
    fn a_reading_is_visited_only_when_something_is_due() {
        let cfg = crate::config::load_str(
            "[gateway]\nid = \"gw\"\n[time]\npolicy = \"device\"\n[group_defaults]\n\
             out_of_orderness_ms = 0\nallowed_lateness_ms = 60000\n\
             window = { kind = \"tumbling\", size_ms = 10000 }\n",
            &std::collections::BTreeMap::new(),
        )
        .unwrap();
        let mut e = Engine::new(&cfg.engine);
        let mut out = Vec::new();
        reading(&mut e, T0 + 1_000, T0 + 1_000, &mut out);
        e.on_tick(Now::at(T0 + 1_100), &mut out);
        reading(&mut e, T0 + 12_000, T0 + 12_000, &mut out);
        assert!(
            e.groups[0].pending.is_empty(),
            "nothing due: no visit queued"
        );
        assert_eq!(e.devices[0].deadline.get(), Some(T0 + 10_000));
        e.on_tick(Now::at(T0 + 12_100), &mut out);
        assert_eq!(revisions(&out), vec![(0, 0)]);
        assert_eq!(e.watermark("g"), Some(T0 + 12_000));
        reading(&mut e, T0 + 13_000, T0 + 13_000, &mut out);
        assert!(e.groups[0].pending.is_empty());
        e.on_tick(Now::at(T0 + 13_100), &mut out);
        assert_eq!(e.watermark("g"), Some(T0 + 13_000));
        reading(&mut e, T0 + 2_000, T0 + 13_500, &mut out);
        assert_eq!(
            e.groups[0].pending,
            vec![0],
            "a fired window changed: visited"
        );
        e.on_tick(Now::at(T0 + 13_600), &mut out);
        assert_eq!(e.watermark("g"), Some(T0 + 13_000));
        assert_eq!(revisions(&out), vec![(0, 0), (0, 1)]);
    }
}
