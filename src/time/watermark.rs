//! The group watermark fold (docs/reference.md#group_defaults-and-groupsname), pure.

use crate::model::Millis;

/// What the fold needs to know about one member device.
#[derive(Debug, Clone, Copy)]
pub struct Member {
    /// Largest accepted event time, if any.
    pub max_event: Option<Millis>,
    /// Monotonic time of its last accepted event.
    pub last_arrival: Millis,
}

/// Group-wide inputs of the fold.
#[derive(Debug, Clone, Copy)]
pub struct GroupClock {
    /// Largest accepted event time of any member.
    pub max_event: Option<Millis>,
    /// Monotonic time of the group's last accepted event.
    pub last_arrival: Millis,
    /// `idle_timeout_ms`.
    pub idle_timeout_ms: Millis,
    /// `out_of_orderness_ms`.
    pub out_of_orderness_ms: Millis,
}

/// W = max(prev, min over non-idle members of (max − out_of_orderness)); when
/// every member is idle, W advances with the gateway clock from the group's
/// last known point. Never backwards.
pub fn fold(
    prev: Option<Millis>,
    members: impl Iterator<Item = Member>,
    g: GroupClock,
    now_mono: Millis,
) -> Option<Millis> {
    fold_min(prev, active_min(members, g, now_mono), g, now_mono)
}

/// The smallest `max_event` among members heard from within `idle_timeout_ms`.
pub fn active_min(
    members: impl Iterator<Item = Member>,
    g: GroupClock,
    now_mono: Millis,
) -> Option<Millis> {
    members
        .filter(|m| now_mono.saturating_sub(m.last_arrival) < g.idle_timeout_ms)
        .filter_map(|m| m.max_event)
        .min()
}

/// [`fold`] given the active members' minimum (kept incrementally by the engine).
pub fn fold_min(
    prev: Option<Millis>,
    active_min: Option<Millis>,
    g: GroupClock,
    now_mono: Millis,
) -> Option<Millis> {
    let candidate = match (active_min, g.max_event) {
        (Some(m), _) => Some(m.saturating_sub(g.out_of_orderness_ms)),
        (None, Some(max)) => Some(
            max.saturating_add(now_mono.saturating_sub(g.last_arrival))
                .saturating_sub(g.idle_timeout_ms + g.out_of_orderness_ms),
        ),
        (None, None) => None,
    };
    match (prev, candidate) {
        (Some(p), Some(c)) => Some(p.max(c)),
        (p, c) => p.or(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: GroupClock = GroupClock {
        max_event: Some(10_000),
        last_arrival: 10_000,
        idle_timeout_ms: 30_000,
        out_of_orderness_ms: 2_000,
    };

    fn m(max_event: i64, last_arrival: i64) -> Member {
        Member {
            max_event: Some(max_event),
            last_arrival,
        }
    }

    #[test]
    fn slowest_active_member_holds_the_group() {
        let w = fold(
            None,
            [m(10_000, 10_000), m(7_000, 9_000)].into_iter(),
            G,
            12_000,
        );
        assert_eq!(w, Some(5_000));
    }

    #[test]
    fn idle_members_do_not_hold_the_group() {
        let w = fold(
            None,
            [m(10_000, 10_000), m(1_000, 1_000)].into_iter(),
            G,
            35_000,
        );
        assert_eq!(w, Some(8_000));
    }

    #[test]
    fn all_idle_advances_with_processing_time_from_the_last_known_point() {
        let members = [m(10_000, 10_000), m(9_000, 9_000)];
        assert_eq!(
            fold(None, members.into_iter(), G, 40_000),
            Some(10_000 + 30_000 - 32_000)
        );
        assert_eq!(
            fold(None, members.into_iter(), G, 100_000),
            Some(10_000 + 90_000 - 32_000)
        );
    }

    #[test]
    fn never_moves_backwards() {
        let w = fold(Some(50_000), [m(10_000, 10_000)].into_iter(), G, 12_000);
        assert_eq!(w, Some(50_000));
    }

    #[test]
    fn members_without_accepted_events_are_ignored() {
        let none = Member {
            max_event: None,
            last_arrival: 11_000,
        };
        assert_eq!(
            fold(None, [none, m(10_000, 10_000)].into_iter(), G, 12_000),
            Some(8_000)
        );
        let empty = GroupClock {
            max_event: None,
            ..G
        };
        assert_eq!(fold(None, [none].into_iter(), empty, 12_000), None);
    }
}
