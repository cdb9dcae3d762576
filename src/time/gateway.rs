//! The gateway's own clock (docs/reference.md#time "The gateway's own clock"), pure.
//!
//! Device offset estimates are kept against the raw wall clock. This module
//! keeps the one number that maps it onto true time, `error` (wall − true):
//! - a step of the wall clock shows as a jump of wall − mono; the caller
//!   re-bases every device estimate by it and `error` absorbs it, so the
//!   corrected clock (wall − error) and every event time stay continuous;
//! - while the kernel reports the clock unsynchronized (and `gateway_clock =
//!   "auto"`), a quorum of devices that agree with each other and not with the
//!   gateway sets `error` to their consensus; while it is synchronized (or
//!   `"trusted"`) `error` is 0.
//!
//! Before a quorum can exist the verdict is [`Verdict::Unsure`]: a reading of a
//! device that disagrees with the gateway waits for the verdict (kept with the
//! state, at most [`WAITING_MAX`] of them) and is then timed by it; no device
//! alert is raised yet. Past that bound a reading gets the earlier of its own
//! time and the gateway's and moves no watermark. The doubt lasts until a
//! verdict, or [`UNSURE_MAX_MS`]; a step during the doubt starts it afresh.

use serde::{Deserialize, Serialize};

use crate::codec::MetricName;
use crate::model::{Id, Millis};

/// A jump of wall − mono at least this large is a step (Linux keeps wall − mono
/// constant except when the clock is set; slewing moves both together).
pub const STEP_MS: Millis = 1_000;
/// Calibrated devices that must agree before the gateway is judged wrong.
pub const QUORUM: usize = 3;
/// The consensus is evaluated at most this often (monotonic ms).
pub const EVAL_MS: Millis = 1_000;
/// Longest doubt before the gateway is trusted by default (fewer than
/// [`QUORUM`] devices heard: a small site).
pub const UNSURE_MAX_MS: Millis = 10_000;
/// Readings kept waiting for a verdict at most (the doubt's 10 s of a large site).
pub const WAITING_MAX: usize = 50_000;

/// Who is believed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No evidence yet (a fresh state on an unsynchronized gateway).
    #[default]
    Unsure,
    /// The gateway clock is taken as true (`error` 0).
    Trusted,
    /// A quorum of devices disagrees with the gateway: `error` is their consensus.
    Wrong,
}

/// `[time] gateway_clock`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GatewayClockMode {
    /// Follow a quorum of devices while the kernel reports the clock unsynchronized.
    #[default]
    Auto,
    /// Never follow the devices.
    Trusted,
}

/// Persisted state of the gateway-clock judgement.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GatewayClock {
    /// Estimated error of the wall clock (wall − true), ms.
    pub error: Millis,
    /// Current verdict.
    pub verdict: Verdict,
    /// wall − mono at the last observation; None after a new clock origin.
    pub base: Option<Millis>,
    /// Monotonic time of the last observation.
    pub last_mono: Millis,
    /// Monotonic time the doubt began.
    pub unsure_since: Option<Millis>,
    /// Monotonic time of the next consensus evaluation.
    pub next_eval: Millis,
    /// While unsure: a device has agreed with the gateway, which is then taken
    /// as right for devices that disagree (two clocks against one).
    #[serde(default)]
    pub seconded: bool,
    /// Readings that arrived in doubt, in arrival order, waiting for the verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<Waiting>,
}

/// A reading that arrived while the gateway clock was in doubt: all the engine
/// needs to time and place it once the verdict is in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    /// Its topic (for a rejection or a late output).
    pub topic: String,
    /// Group and device.
    pub group: Id,
    /// Device id.
    pub device: Id,
    /// A heartbeat, not a reading.
    pub heartbeat: bool,
    /// The device whose clock times it, when not its own (a Sparkplug edge node).
    pub clock: Option<(Id, Id)>,
    /// Device timestamp.
    pub ts: Millis,
    /// Sequence number.
    pub seq: Option<u64>,
    /// Metric values.
    pub metrics: Vec<(MetricName, f64)>,
    /// The uncorrected wall clock at arrival.
    pub wall: Millis,
    /// Monotonic clock at arrival.
    pub mono: Millis,
    /// The kernel reported the clock synchronized.
    pub synced: bool,
}

/// What an observation or evaluation concluded, for the engine to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The gateway clock was judged wrong by `error` ms, `agreeing` devices agreeing.
    Wrong {
        /// Estimated error (wall − true).
        error: Millis,
        /// Devices in the consensus.
        agreeing: usize,
    },
    /// The gateway clock agrees again.
    Ok,
}

/// One observation's outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Observed {
    /// The wall clock stepped by this much: re-base every device estimate by it.
    pub step: Option<Millis>,
    /// A verdict change to announce.
    pub event: Option<Event>,
    /// The consensus is due: call [`GatewayClock::judge`] with the devices' estimates.
    pub evaluate: bool,
}

impl GatewayClock {
    /// The corrected wall clock for `wall`.
    pub fn correct(&self, wall: Millis) -> Millis {
        wall.saturating_sub(self.error)
    }

    /// The corrected clock for a tick at `mono` (`wall` as given): ticks never
    /// judge steps (they are collapsed in the journal), so they follow the
    /// monotonic clock from the last observation.
    pub fn tick_wall(&self, wall: Millis, mono: Millis) -> Millis {
        match self.base {
            Some(b) if mono >= self.last_mono => mono.saturating_add(b),
            _ => wall,
        }
        .saturating_sub(self.error)
    }

    /// Forgets the reference of wall − mono (a new process: a new monotonic origin).
    pub fn new_origin(&mut self) {
        self.base = None;
    }

    /// Whether a device that disagrees with the gateway is still in doubt:
    /// no verdict yet, and no device has agreed with the gateway.
    pub fn unsure(&self) -> bool {
        self.verdict == Verdict::Unsure && !self.seconded
    }

    /// A device agrees with the gateway (within `max_skew_ms`).
    pub fn seconded(&mut self) {
        if self.verdict == Verdict::Unsure {
            self.seconded = true;
        }
    }

    /// One observation of both clocks (a message), with the kernel's state.
    pub fn observe(
        &mut self,
        wall: Millis,
        mono: Millis,
        synced: bool,
        mode: GatewayClockMode,
        max_skew: Millis,
    ) -> Observed {
        let mut o = Observed::default();
        let base = wall.saturating_sub(mono);
        if let Some(b) = self.base
            && mono >= self.last_mono
        {
            let delta = base.saturating_sub(b);
            if delta.abs() >= STEP_MS {
                o.step = Some(delta);
                // The new wall reading is off from the old by delta: the
                // corrected clock stays where it was.
                self.error = self.error.saturating_add(delta);
            }
        }
        self.base = Some(base);
        self.last_mono = mono;
        let trusted = mode == GatewayClockMode::Trusted || synced;
        if trusted {
            o.event = self.trust();
            return o;
        }
        if o.step.is_some() {
            // Unsynchronized and stepped: the corrected clock stayed put; say
            // whether the stepped clock now agrees with it.
            if self.error.abs() <= max_skew {
                self.error = 0;
                if self.verdict == Verdict::Wrong {
                    self.verdict = Verdict::Trusted;
                    o.event = Some(Event::Ok);
                }
            } else if self.unsure() {
                // Nothing vouched for the clock before the step either: the
                // doubt starts afresh about the stepped clock, as at a start.
                self.error = 0;
                self.unsure_since = Some(mono);
            } else if self.verdict != Verdict::Wrong {
                self.verdict = Verdict::Wrong;
                self.unsure_since = None;
                o.event = Some(Event::Wrong {
                    error: self.error,
                    agreeing: 0,
                });
            }
            self.next_eval = mono;
        }
        if self.verdict == Verdict::Unsure {
            let since = *self.unsure_since.get_or_insert(mono);
            if mono.saturating_sub(since) >= UNSURE_MAX_MS {
                self.verdict = Verdict::Trusted;
                self.unsure_since = None;
            }
        }
        o.evaluate = mono >= self.next_eval;
        o
    }

    /// A tick at `mono`: a doubt past [`UNSURE_MAX_MS`] ends with the gateway trusted.
    pub fn expire(&mut self, mono: Millis) {
        if self.verdict == Verdict::Unsure
            && let Some(since) = self.unsure_since
            && mono.saturating_sub(since) >= UNSURE_MAX_MS
        {
            self.verdict = Verdict::Trusted;
            self.unsure_since = None;
        }
    }

    /// The gateway is trusted (synchronized, or by configuration).
    fn trust(&mut self) -> Option<Event> {
        let was = self.verdict;
        self.verdict = Verdict::Trusted;
        self.unsure_since = None;
        self.error = 0;
        (was == Verdict::Wrong).then_some(Event::Ok)
    }

    /// The consensus rule over the estimates (raw wall − device time) of the
    /// calibrated devices heard recently; `estimates` is sorted in place.
    pub fn judge(
        &mut self,
        estimates: &mut [Millis],
        mono: Millis,
        max_skew: Millis,
    ) -> Option<Event> {
        self.next_eval = mono.saturating_add(EVAL_MS);
        let n = estimates.len();
        if n < QUORUM {
            return None;
        }
        estimates.sort_unstable();
        // The largest run of estimates within max_skew of each other.
        let (mut best_lo, mut best_len, mut lo) = (0usize, 0usize, 0usize);
        for hi in 0..n {
            while estimates[hi].saturating_sub(estimates[lo]) > max_skew {
                lo += 1;
            }
            if hi + 1 - lo > best_len {
                (best_lo, best_len) = (lo, hi + 1 - lo);
            }
        }
        // Most of those heard recently, and at least a quorum.
        if best_len < QUORUM || 2 * best_len <= n {
            return None;
        }
        let run = &estimates[best_lo..best_lo + best_len];
        let median = run[best_len / 2];
        let (first, last) = (run[0], run[best_len - 1]);
        if first > max_skew || last < -max_skew {
            let was = self.verdict;
            self.verdict = Verdict::Wrong;
            self.error = median;
            self.unsure_since = None;
            (was != Verdict::Wrong).then_some(Event::Wrong {
                error: median,
                agreeing: best_len,
            })
        } else if median.abs() <= max_skew {
            self.trust()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_764_480_000_000;
    const SKEW: Millis = 300_000;
    const AUTO: GatewayClockMode = GatewayClockMode::Auto;

    #[test]
    fn a_step_is_absorbed_and_the_corrected_clock_stays_continuous() {
        let mut c = GatewayClock::default();
        c.observe(T0, 0, false, AUTO, SKEW);
        // Devices agree with it: trusted before the step.
        c.judge(&mut [10, -20, 30], 0, SKEW);
        assert_eq!(c.verdict, Verdict::Trusted);
        let o = c.observe(T0 + 1_000, 1_000, false, AUTO, SKEW);
        assert_eq!(o.step, None);
        // Stepped an hour back at mono 2 s.
        let o = c.observe(T0 + 2_000 - 3_600_000, 2_000, false, AUTO, SKEW);
        assert_eq!(o.step, Some(-3_600_000));
        assert_eq!(c.correct(T0 + 2_000 - 3_600_000), T0 + 2_000);
        assert_eq!(c.verdict, Verdict::Wrong);
        assert!(matches!(
            o.event,
            Some(Event::Wrong {
                error: -3_600_000,
                ..
            })
        ));
        // Ticks follow the monotonic clock from the last observation.
        assert_eq!(c.tick_wall(0, 2_500), T0 + 2_500);
        // Stepped back right: the error is gone, one Ok.
        let o = c.observe(T0 + 3_000, 3_000, false, AUTO, SKEW);
        assert_eq!(
            (o.step, o.event, c.error),
            (Some(3_600_000), Some(Event::Ok), 0)
        );
    }

    #[test]
    fn a_step_before_any_verdict_starts_the_doubt_afresh() {
        // Nothing vouched for the clock before the step: keeping it would
        // distrust every correct device until the quorum overrules it.
        let mut c = GatewayClock::default();
        c.observe(T0 - 300 * 86_400_000, 0, false, AUTO, SKEW);
        let o = c.observe(T0 - 200 * 86_400_000 + 5_000, 5_000, false, AUTO, SKEW);
        assert_eq!(o.step, Some(100 * 86_400_000));
        assert_eq!((o.event, c.error, c.verdict), (None, 0, Verdict::Unsure));
        assert!(c.unsure());
        c.expire(14_000);
        assert!(
            c.unsure(),
            "the doubt about the stepped clock began at the step"
        );
        c.expire(15_000);
        assert_eq!(c.verdict, Verdict::Trusted);
        // A device agreed before the step: the clock was vouched for, the step is judged.
        let mut c = GatewayClock::default();
        c.observe(T0, 0, false, AUTO, SKEW);
        c.seconded();
        let o = c.observe(T0 + 1_000 + 3_600_000, 1_000, false, AUTO, SKEW);
        assert_eq!((c.verdict, c.error), (Verdict::Wrong, 3_600_000));
        assert!(matches!(o.event, Some(Event::Wrong { agreeing: 0, .. })));
    }

    #[test]
    fn a_new_origin_or_a_monotonic_clock_going_back_is_not_a_step() {
        let mut c = GatewayClock::default();
        c.observe(T0, 50_000, false, AUTO, SKEW);
        let o = c.observe(T0 + 60_000, 10, false, AUTO, SKEW);
        assert_eq!(o.step, None);
        c.new_origin();
        let o = c.observe(T0 + 90_000, 20_000, false, AUTO, SKEW);
        assert_eq!(o.step, None);
        assert_eq!(c.error, 0);
    }

    #[test]
    fn a_synchronized_or_trusted_gateway_is_believed() {
        let mut c = GatewayClock::default();
        c.observe(T0, 0, false, AUTO, SKEW);
        let mut est = vec![3_600_000; 5];
        assert!(matches!(
            c.judge(&mut est, 0, SKEW),
            Some(Event::Wrong { agreeing: 5, .. })
        ));
        assert_eq!(c.correct(T0), T0 - 3_600_000);
        let o = c.observe(T0 + 100, 100, true, AUTO, SKEW);
        assert_eq!(
            (o.event, c.error, c.verdict),
            (Some(Event::Ok), 0, Verdict::Trusted)
        );
        let mut t = GatewayClock::default();
        t.observe(T0, 0, false, GatewayClockMode::Trusted, SKEW);
        assert_eq!(t.verdict, Verdict::Trusted);
    }

    #[test]
    fn the_quorum_needs_three_agreeing_devices_that_are_most_of_those_heard() {
        let h = 3_600_000;
        let cases: [(&[Millis], Verdict); 7] = [
            (&[h, h + 20], Verdict::Unsure),
            (&[h, h + 20, h - 30], Verdict::Wrong),
            (&[h, h + 20, 0, 10], Verdict::Unsure),
            (&[h, h + 20, h + 5, 0, 10], Verdict::Wrong),
            (&[0, 10, 20, h], Verdict::Trusted),
            // Agreeing with each other, near the gateway: it is right.
            (&[-200_000, -100_000, 50_000], Verdict::Trusted),
            // Agreeing, but straddling the gateway's bound: no verdict.
            (&[200_000, 310_000, 320_000, 400_000], Verdict::Unsure),
        ];
        for (est, want) in cases {
            let mut c = GatewayClock::default();
            c.observe(T0, 0, false, AUTO, SKEW);
            c.judge(&mut est.to_vec(), 0, SKEW);
            assert_eq!(c.verdict, want, "{est:?}");
        }
    }

    #[test]
    fn a_device_agreeing_with_the_gateway_ends_the_doubt_for_the_others() {
        let mut c = GatewayClock::default();
        c.observe(T0, 0, false, AUTO, SKEW);
        assert!(c.unsure());
        c.seconded();
        assert!(!c.unsure());
        assert_eq!(
            c.verdict,
            Verdict::Unsure,
            "a verdict still needs the quorum"
        );
    }

    #[test]
    fn doubt_ends_by_default_on_a_small_site() {
        let mut c = GatewayClock::default();
        c.observe(T0, 0, false, AUTO, SKEW);
        assert!(c.unsure());
        c.observe(T0 + UNSURE_MAX_MS, UNSURE_MAX_MS, false, AUTO, SKEW);
        assert_eq!(c.verdict, Verdict::Trusted);
    }
}
