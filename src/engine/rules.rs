//! A reload's new rules applied to a running engine (docs/reference.md#reload-sighup-systemctl-reload-tidemark): group rules,
//! `[time]`, `[payload]` and `[sparkplug]` from the next message on; a changed
//! window rule from a switch point in event time, so the windows of the old and
//! the new rule never overlap and ids stay unique.

use super::{Engine, EngineConfig, GroupConfig, GroupSlot, RuleEpoch};
use crate::codec::Decoder;
use crate::model::Millis;
use crate::time::window::{self, Span, WindowSpec};

impl GroupSlot {
    /// The rule that governs event time `t`, with its span; `None` below the
    /// oldest rule kept (every window there is past its lateness).
    pub(super) fn rule_at(&self, t: Millis) -> Option<(WindowSpec, Span)> {
        let r = &self.state.rules;
        if r.is_empty() {
            return Some((self.cfg.window, Span::ALL));
        }
        let i = r.partition_point(|e| e.from <= t);
        let epoch = r.get(i.checked_sub(1)?)?;
        let until = r.get(i).map_or(Millis::MAX, |e| e.from);
        Some((
            epoch.window,
            Span {
                from: epoch.from,
                until,
            },
        ))
    }

    /// Takes `new` as the group's rules; a changed window rule switches at the
    /// point docs/reference.md#reload-sighup-systemctl-reload-tidemark names. Returns whether the persisted state changed.
    fn set_rules(&mut self, new: GroupConfig) -> bool {
        let mut changed = false;
        if new.window != self.cfg.window {
            changed = true;
            match self.state.max_event {
                // Nothing was ever windowed by event time here: the new rule for all times.
                None => self.state.rules.clear(),
                Some(latest) => {
                    let rules = &mut self.state.rules;
                    if rules.is_empty() {
                        rules.push(RuleEpoch {
                            from: Millis::MIN,
                            window: self.cfg.window,
                        });
                    }
                    let cur = rules[rules.len() - 1];
                    // At or after the current rule's own start, on a boundary of the new rule.
                    let at = window::switch_point(cur.window, new.window, latest)
                        .max(first_boundary(new.window, cur.from));
                    if at <= cur.from {
                        let last = rules.len() - 1;
                        rules[last].window = new.window;
                    } else {
                        rules.push(RuleEpoch {
                            from: at,
                            window: new.window,
                        });
                    }
                }
            }
        }
        // Rules whose every window is purged (the next rule's start is past the lateness).
        let lateness = if new.adaptive.is_some_and(|a| a.lateness) {
            self.lateness()
        } else {
            new.allowed_lateness_ms
        };
        if let Some(wm) = self.state.wm {
            let r = &mut self.state.rules;
            while r.len() >= 2 && r[1].from.saturating_add(lateness) <= wm {
                r.remove(0);
                changed = true;
            }
        }
        self.cfg = new;
        changed | self.fit_adaptive()
    }
}

/// The first boundary of `rule` at or after `t` (sessions: `t` itself).
fn first_boundary(rule: WindowSpec, t: Millis) -> Millis {
    if t == Millis::MIN {
        return t;
    }
    let step = match rule {
        WindowSpec::Tumbling { size_ms } => size_ms,
        WindowSpec::Hopping { slide_ms, .. } => slide_ms,
        WindowSpec::Session { .. } => return t,
    };
    let at = t.div_euclid(step).saturating_mul(step);
    if at < t { at.saturating_add(step) } else { at }
}

impl Engine {
    /// Applies a reload's engine settings (the gateway id needs a restart and
    /// is kept). Deterministic: the journal replays it in order with the messages.
    pub fn reconfigure(&mut self, cfg: &EngineConfig) {
        self.pattern = cfg.pattern.clone();
        self.decoder = Decoder::new(&cfg.payload);
        self.time = cfg.time.clone();
        self.sparkplug.configure(&cfg.sparkplug);
        self.group_rules = cfg.groups.clone();
        for gi in 0..self.groups.len() {
            let new = self.group_rules.of(&self.groups[gi].state.name).clone();
            if new == self.groups[gi].cfg {
                continue;
            }
            if self.groups[gi].set_rules(new) {
                self.mark_group(gi);
            }
            // Timeouts and lateness move every member's deadline and idleness.
            self.groups[gi].rebuild = true;
            for k in 0..self.groups[gi].members.len() {
                let di = self.groups[gi].members[k] as usize;
                self.mark_pending(di);
            }
        }
    }

    /// The window rules of a group by event time (status, tests).
    pub fn group_rules_of(&self, group: &str) -> Vec<RuleEpoch> {
        self.group_index
            .get(group)
            .map(|&gi| {
                let g = &self.groups[gi as usize];
                if g.state.rules.is_empty() {
                    vec![RuleEpoch {
                        from: Millis::MIN,
                        window: g.cfg.window,
                    }]
                } else {
                    g.state.rules.clone()
                }
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Millis = 60_000;

    #[test]
    fn the_switch_is_the_new_rules_first_boundary_after_the_old_window_of_the_latest_event() {
        let old = WindowSpec::Tumbling { size_ms: MIN };
        let new = WindowSpec::Tumbling { size_ms: 45_000 };
        // Latest event at 100 s: old window [60, 120) s; first 45 s boundary at or after 120 s.
        assert_eq!(window::switch_point(old, new, 100_000), 135_000);
        // Exactly on a boundary.
        let new = WindowSpec::Tumbling { size_ms: 30_000 };
        assert_eq!(window::switch_point(old, new, 100_000), 120_000);
        let sess = WindowSpec::Session { gap_ms: 10_000 };
        assert_eq!(window::switch_point(sess, old, 100_000), 120_000);
        assert_eq!(window::switch_point(old, sess, 100_000), 120_000);
        // Negative event times (both signs).
        assert_eq!(window::switch_point(old, old, -1), 0);
        assert_eq!(window::switch_point(old, new, -100_000), -60_000);
    }

    #[test]
    fn first_boundary_rounds_up_on_both_signs() {
        let t = WindowSpec::Tumbling { size_ms: 1000 };
        assert_eq!(first_boundary(t, 1), 1000);
        assert_eq!(first_boundary(t, 1000), 1000);
        assert_eq!(first_boundary(t, -1), 0);
        assert_eq!(first_boundary(t, -1001), -1000);
        assert_eq!(first_boundary(t, Millis::MIN), Millis::MIN);
    }
}
