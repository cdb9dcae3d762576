//! Event time (docs/reference.md#time): the gateway's own clock, device calibration, the time policy.

use super::{Engine, Now};
use crate::codec::{Decoded, DeviceTs};
use crate::model::Millis;
use crate::output::{AlertType, Emit, GatewayAlert, Output};
use crate::time::gateway as gwclock;
use crate::time::{InvalidPolicy, TimePolicy};

impl Engine {
    /// Step detection and the consensus rule (docs/reference.md#time); returns `now` on the corrected clock.
    pub(super) fn observe_clock(&mut self, now: Now, out: &mut dyn Emit) -> Now {
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
            for w in &mut self.clock.waiting {
                w.wall = w.wall.saturating_add(delta);
            }
        }
        let mut event = o.event;
        if o.evaluate && self.time.policy == TimePolicy::Calibrated {
            self.estimates.clear();
            let second = now.wall.div_euclid(1000);
            for d in &self.devices {
                let idle = self.groups[d.group as usize].cfg.idle_timeout_ms;
                // Heard recently: by its clock's last sample, whatever the sanity
                // gate made of it (a gateway far off rejects every reading).
                let heard = d
                    .state
                    .skew
                    .last_second()
                    .is_some_and(|s| second.saturating_sub(s).saturating_mul(1000) < idle);
                if let Some(e) = d.state.skew.estimate()
                    && (heard || now.mono.saturating_sub(d.state.last_arrival) < idle)
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
            out.emit(Output::Gateway(match e {
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

    /// Event time per `[time] policy`; `Err(detail)` means reject as invalid_timestamp.
    pub(super) fn event_time(
        &mut self,
        di: usize,
        d: &Decoded,
        now: Now,
        raw_wall: Millis,
        out: &mut dyn Emit,
    ) -> Result<Timed, &'static str> {
        let timed = |t, provisional, invalid| Timed {
            t,
            provisional,
            invalid,
        };
        let valid = match d.ts {
            DeviceTs::Ms(t) if t >= self.time.min_valid_epoch_ms => Ok(t),
            DeviceTs::Ms(_) => Err("device clock before time.min_valid_epoch_ms (RTC reset?)"),
            DeviceTs::Missing => Err("timestamp field missing"),
            DeviceTs::Invalid(why) => Err(why),
        };
        let device_ts = match (self.time.policy, valid) {
            (TimePolicy::Arrival, _) => return Ok(timed(now.wall, false, false)),
            (_, Ok(t)) => t,
            (_, Err(why)) => {
                return match self.time.invalid {
                    InvalidPolicy::Arrival => Ok(timed(now.wall, false, true)),
                    InvalidPolicy::Reject => Err(why),
                };
            }
        };
        if self.time.policy == TimePolicy::Device {
            return Ok(timed(device_ts, false, false));
        }
        let window = self.time.skew_window;
        // Estimates are kept against the raw wall clock; `error` maps it onto true time.
        self.devices[di]
            .state
            .skew
            .observe(raw_wall, device_ts, window);
        let skewed = self.offset(di).abs() > self.time.max_skew_ms;
        if !skewed {
            self.clock.seconded();
        }
        if skewed && self.clock.unsure() {
            // Device or gateway wrong, not known yet: the reading waits for the
            // verdict; past the bound, the earlier of the two never puts a
            // reading ahead of true time (see time::gateway).
            let t = if now.wall < self.time.min_valid_epoch_ms {
                device_ts
            } else {
                device_ts.min(now.wall)
            };
            return Ok(timed(t, true, false));
        }
        Ok(timed(self.judged(di, device_ts, now, out), false, false))
    }

    /// The device's offset onto the corrected clock.
    fn offset(&self, di: usize) -> Millis {
        self.devices[di]
            .state
            .skew
            .estimate()
            .unwrap_or(0)
            .saturating_sub(self.clock.error)
    }

    /// The event time of `device_ts` by the verdict in force: corrected by the
    /// device's offset, or the arrival (`now`, corrected) for a distrusted clock.
    pub(super) fn judged(
        &mut self,
        di: usize,
        device_ts: Millis,
        now: Now,
        out: &mut dyn Emit,
    ) -> Millis {
        let est = self.offset(di);
        let skewed = est.abs() > self.time.max_skew_ms;
        let dev = &mut self.devices[di].state;
        if skewed != dev.distrusted {
            dev.distrusted = skewed;
            let last_seen = dev.max_event.get();
            let kind = if skewed {
                AlertType::ClockSkew
            } else {
                AlertType::ClockOk
            };
            self.alert(out, di, kind, last_seen, Some(est), now);
        }
        if skewed {
            now.wall
        } else {
            device_ts.saturating_add(est)
        }
    }
}

/// A reading's event time and how it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Timed {
    /// Event time.
    pub t: Millis,
    /// Timed while the gateway clock is in doubt: moves no watermark.
    pub provisional: bool,
    /// The device timestamp was invalid: timed by arrival (`timestamps_invalid`).
    pub invalid: bool,
}
