//! A message in: topic, payload, duplicate filter, sanity gate, windows, liveness.

use std::cmp::Reverse;

use super::{Engine, MAX_METRIC_NAMES, Now};
use crate::codec::{DecodeError, Decoded, Decoder, MetricName};
use crate::model::{Id, Kind, Millis, OptMillis, Reason};
use crate::output::{AlertType, Emit, Late, Output, Rejected, decoded_fields};
use crate::time::gateway as gwclock;
use crate::time::seq::Seen;
use crate::time::window::{self, MetricIdx};
use crate::topic::TopicParts;

/// What a caller that reads ahead already knows of a message (replay).
#[derive(Debug, Clone, Copy, Default)]
pub struct Known<'a> {
    /// Its payload decoded by a clone of [`Engine::decoder`]; None: decoded here.
    pub decoded: Option<Result<&'a Decoded, &'a DecodeError>>,
    /// The slot its device most likely has ([`Engine::prefetch_slot`]); checked before use.
    pub slot: Option<u32>,
}

/// Where a message's device most likely is, and the device whose clock times it
/// if not its own.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Slots {
    pub(super) guess: Option<u32>,
    pub(super) clock_of: Option<usize>,
}

impl Engine {
    pub(super) fn reject(
        &mut self,
        out: &mut dyn Emit,
        reason: Reason,
        topic: &str,
        ids: Option<(&Id, &Id)>,
        now: Now,
        detail: String,
    ) {
        self.counters.rejected[reason.index()] += 1;
        out.emit(Output::Rejected(Rejected {
            reason,
            topic: topic.chars().take(1024).collect(),
            group: ids.map(|(g, _)| g.clone()),
            device: ids.map(|(_, d)| d.clone()),
            arrival: now.wall,
            detail,
        }));
    }

    /// Handles one input message that arrived at `now`.
    pub fn on_message(&mut self, topic: &str, payload: &[u8], now: Now, out: &mut dyn Emit) {
        self.on_message_decoded(topic, payload, Known::default(), now, out);
    }

    /// [`Engine::on_message`] with what a caller reading ahead already knows
    /// (replay decodes on its read-ahead thread). A Sparkplug message ignores it:
    /// its payload is read against its edge node's births.
    pub fn on_message_decoded(
        &mut self,
        topic: &str,
        payload: &[u8],
        known: Known<'_>,
        now: Now,
        out: &mut dyn Emit,
    ) {
        let raw_wall = now.wall;
        let now = self.observe_clock(now, out);
        self.release_waiting(out);
        let mut scratch = self.scratch.take().unwrap_or_default();
        self.handle(topic, payload, known, now, raw_wall, &mut scratch, out);
        self.scratch = Some(scratch);
    }

    /// The payload decoder in force; what [`Engine::on_message_decoded`] expects.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    #[allow(clippy::too_many_arguments)]
    fn handle(
        &mut self,
        topic: &str,
        payload: &[u8],
        known: Known<'_>,
        now: Now,
        raw_wall: Millis,
        scratch: &mut Decoded,
        out: &mut dyn Emit,
    ) {
        self.counters.received += 1;
        if self.sparkplug.enabled && crate::sparkplug::is_sparkplug(topic) {
            return self.sparkplug_message(topic, payload, now, raw_wall, scratch, out);
        }
        let parts = match self.pattern.parse_topic(topic) {
            Ok(p) => p,
            Err(e) => return self.reject(out, Reason::BadTopic, topic, None, now, e.to_string()),
        };
        let ids = Some((&parts.group, &parts.device));
        let decoded = match known.decoded {
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                return self.reject(out, Reason::DecodeError, topic, ids, now, e.0.clone());
            }
            None => match self.decoder.decode_into(payload, scratch) {
                Ok(()) => &*scratch,
                Err(e) => return self.reject(out, Reason::DecodeError, topic, ids, now, e.0),
            },
        };
        let slots = Slots {
            guess: known.slot,
            clock_of: None,
        };
        self.apply(topic, &parts, decoded, now, raw_wall, slots, out);
    }

    /// One decoded reading or heartbeat of `parts`' device: time, windows,
    /// liveness. `slots`: where its device most likely is, whose clock times it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply(
        &mut self,
        topic: &str,
        parts: &TopicParts,
        decoded: &Decoded,
        now: Now,
        raw_wall: Millis,
        Slots { guess, clock_of }: Slots,
        out: &mut dyn Emit,
    ) {
        let ids = Some((&parts.group, &parts.device));
        let di = match guess.filter(|&i| self.holds(i, &parts.group, &parts.device)) {
            Some(i) => i as usize,
            None => {
                if let Some(detail) = self.over_device_limit(&parts.group, &parts.device) {
                    return self.reject(out, Reason::BadTopic, topic, ids, now, detail);
                }
                self.device_slot(&parts.group, &parts.device)
            }
        };
        if let Some(seq) = decoded.seq {
            let dev = &mut self.devices[di].state;
            let ts = match decoded.ts {
                crate::codec::DeviceTs::Ms(t) => Some(t),
                _ => None,
            };
            match dev.seq.observe_at(seq, ts) {
                Seen::Duplicate => {
                    self.counters.duplicates += 1;
                    dev.duplicates += 1;
                    self.mark_device(di);
                    return;
                }
                Seen::New { missing } => {
                    dev.missing = dev.missing.saturating_add_signed(missing);
                    self.counters.readings_missing = self
                        .counters
                        .readings_missing
                        .saturating_add_signed(missing);
                }
            }
        }
        self.mark_device(di);
        // Sparkplug devices share their edge node's clock (docs/reference.md#sparkplug--sparkplug-b-30-ingest).
        let ci = clock_of.unwrap_or(di);
        if ci != di {
            self.mark_device(ci);
        }
        let (event, provisional, invalid_ts) =
            match self.event_time(ci, decoded, now, raw_wall, out) {
                Ok(t) => (t.t, t.provisional, t.invalid),
                Err(detail) => {
                    return self.reject(
                        out,
                        Reason::InvalidTimestamp,
                        topic,
                        ids,
                        now,
                        detail.into(),
                    );
                }
            };
        if provisional
            && self.clock.waiting.len() < gwclock::WAITING_MAX
            && let crate::codec::DeviceTs::Ms(ts) = decoded.ts
        {
            let clock = (ci != di).then(|| {
                let c = &self.devices[ci].state;
                (Id::clone(&c.group), c.id.to_id())
            });
            self.clock.waiting.push(gwclock::Waiting {
                topic: topic.to_owned(),
                group: parts.group.clone(),
                device: parts.device.clone(),
                heartbeat: parts.kind == Kind::Heartbeat,
                clock,
                ts,
                seq: decoded.seq,
                metrics: decoded.metrics.iter().cloned().collect(),
                wall: raw_wall,
                mono: now.mono,
                synced: now.synced,
            });
            return;
        }
        self.place(
            topic,
            parts,
            di,
            decoded,
            (event, provisional, invalid_ts),
            now,
            out,
        );
    }

    /// The readings that waited for the gateway-clock verdict, once it is in:
    /// timed by it, then placed in arrival order (docs/reference.md#time).
    pub(super) fn release_waiting(&mut self, out: &mut dyn Emit) {
        if self.clock.waiting.is_empty() || self.clock.unsure() {
            return;
        }
        let waiting = std::mem::take(&mut self.clock.waiting);
        let mut decoded = self.scratch.take().unwrap_or_default();
        for w in waiting {
            let di = self.device_slot(&w.group, &w.device);
            let ci = match &w.clock {
                Some((g, d)) => self.device_slot(g, d),
                None => di,
            };
            let now = Now {
                wall: self.clock.correct(w.wall),
                mono: w.mono,
                synced: w.synced,
            };
            let t = self.judged(ci, w.ts, now, out);
            decoded.ts = crate::codec::DeviceTs::Ms(w.ts);
            decoded.seq = w.seq;
            decoded.metrics.clear();
            for m in w.metrics {
                let _ = decoded.metrics.push(m);
            }
            let kind = if w.heartbeat {
                Kind::Heartbeat
            } else {
                Kind::Reading
            };
            let parts = TopicParts {
                group: w.group,
                device: w.device,
                kind,
            };
            self.place(&w.topic, &parts, di, &decoded, (t, false, false), now, out);
        }
        self.scratch = Some(decoded);
    }

    /// A timed reading of device `di`: the sanity gate, windows, liveness.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &mut self,
        topic: &str,
        parts: &TopicParts,
        di: usize,
        decoded: &Decoded,
        (event, provisional, invalid_ts): (Millis, bool, bool),
        now: Now,
        out: &mut dyn Emit,
    ) {
        let ids = Some((&parts.group, &parts.device));
        if event > now.wall.saturating_add(self.time.max_future_ms) {
            let detail = format!(
                "event time {event} is {} ms ahead of the gateway clock",
                event.saturating_sub(now.wall)
            );
            return self.reject(out, Reason::Future, topic, ids, now, detail);
        }
        if event < now.wall.saturating_sub(self.time.max_age_ms) {
            let detail = format!(
                "event time {event} is {} ms behind the gateway clock",
                now.wall.saturating_sub(event)
            );
            return self.reject(out, Reason::TooOld, topic, ids, now, detail);
        }
        // Names are interned only for events that reach the windows.
        let heartbeat = parts.kind == Kind::Heartbeat;
        let mut metrics: heapless::Vec<(MetricIdx, f64), { crate::codec::MAX_METRICS }> =
            heapless::Vec::new();
        if !heartbeat {
            for (name, v) in &decoded.metrics {
                let Some(m) = self.intern(name) else {
                    let detail = format!("more than {MAX_METRIC_NAMES} distinct metric names");
                    return self.reject(out, Reason::DecodeError, topic, ids, now, detail);
                };
                let _ = metrics.push((m, *v));
            }
        }
        let gi = self.devices[di].group as usize;
        if !provisional {
            self.observe_disorder(gi, di, event, now);
        }
        let (wm, rule, lateness, fresh, extras) = {
            let g = &self.groups[gi];
            let fresh = g.fresh(self.devices[di].state.purged_to_s);
            (
                g.state.wm,
                g.rule_at(event),
                g.lateness(),
                fresh,
                g.cfg.extras,
            )
        };
        let dev = &mut self.devices[di].state;
        // No rule: below the oldest rule kept, so past every window's lateness.
        let taken = rule.is_some_and(|(spec, span)| {
            let rule = window::Rule {
                spec,
                span,
                lateness,
                fresh,
                extras,
            };
            dev.windows.apply(rule, event, wm, heartbeat, &metrics)
        });
        if !taken {
            self.counters.late += 1;
            dev.late += 1;
            out.emit(Output::Late(Late {
                group: parts.group.clone(),
                device: parts.device.clone(),
                event_time: event,
                watermark: wm,
                arrival: now.wall,
                payload: decoded_fields(
                    self.decoder.ts_field(),
                    decoded.ts,
                    self.decoder.seq_field(),
                    decoded.seq,
                    &decoded.metrics,
                ),
            }));
            return;
        }
        self.accepted(di, gi, event, (provisional, invalid_ts), now, parts, out);
    }

    /// An accepted reading of device `di` in group `gi`: counts, the watermark's
    /// inputs, the device's next visit, and its coming back online.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn accepted(
        &mut self,
        di: usize,
        gi: usize,
        event: Millis,
        (provisional, invalid_ts): (bool, bool),
        now: Now,
        parts: &TopicParts,
        out: &mut dyn Emit,
    ) {
        let dev = &mut self.devices[di].state;
        self.counters.accepted += 1;
        dev.accepted += 1;
        if invalid_ts {
            self.counters.timestamps_invalid += 1;
            dev.timestamps_invalid = dev.timestamps_invalid.saturating_add(1);
        }
        // A reading timed while the gateway clock is in doubt does not move the
        // watermark: its time may be either clock's error.
        if !provisional {
            dev.max_event = OptMillis::some(dev.max_event.get().map_or(event, |m| m.max(event)));
        }
        dev.last_arrival = now.mono;
        let (was_offline, announced) = (dev.offline, dev.announced);
        dev.offline = false;
        dev.announced = true;
        let last_seen = dev.max_event.get();
        let slot = &mut self.devices[di];
        // A device already in `maxima` keeps its entry: the fold raises it to the
        // current maximum when it surfaces (a push per reading was 8 % of replay).
        if slot.wm_key.is_none()
            && let Some(max) = last_seen
        {
            slot.wm_key = OptMillis::some(max);
            self.groups[gi]
                .maxima
                .push(Reverse((max, u32::try_from(di).unwrap_or(u32::MAX))));
        }
        let g = &mut self.groups[gi];
        if !provisional {
            g.state.max_event = Some(g.state.max_event.map_or(event, |m| m.max(event)));
        }
        g.state.last_arrival = g.state.last_arrival.max(now.mono);
        self.mark_group(gi);
        // A device with nothing due below the watermark waits in the deadline heap
        // instead of being visited at the next tick (a visit would find nothing to
        // do); one with something due now (a late reading into a fired window), or
        // in a group whose "auto" lateness purges at visits, is visited.
        let wm = self.groups[gi].state.wm;
        if self.groups[gi].auto_lateness() {
            self.mark_pending(di);
        } else {
            let d = u32::try_from(di).unwrap_or(u32::MAX);
            self.schedule(gi, d);
            if self.devices[di]
                .deadline
                .get()
                .is_some_and(|t| wm.is_none_or(|w| t <= w))
            {
                self.mark_pending(di);
            }
        }
        if was_offline {
            self.alert(out, di, AlertType::Online, last_seen, None, now);
        }
        if was_offline || !announced {
            out.emit(Output::Status {
                group: parts.group.clone(),
                device: parts.device.clone(),
                online: true,
            });
        }
    }

    pub(super) fn intern(&mut self, name: &MetricName) -> Option<MetricIdx> {
        if let Some(&i) = self.metric_index.get(name) {
            return Some(i);
        }
        if self.metric_names.len() >= MAX_METRIC_NAMES {
            return None;
        }
        let i = MetricIdx::try_from(self.metric_names.len()).ok()?;
        self.metric_names.push(name.clone());
        self.metric_index.insert(name.clone(), i);
        Some(i)
    }
}
