//! The source's path probes (docs/reference.md#group_defaults-and-groupsname): the I/O around
//! the pure rules of [`super::proof`].

use super::*;

impl Source {
    /// Subscribes the probe topic on its own (its SUBACK tells an ACL's refusal apart).
    pub(super) fn subscribe_probe(&mut self) {
        let Some(probe) = &self.cfg.probe else {
            return;
        };
        match self.client.subscribe(std::slice::from_ref(&probe.topic), 0) {
            Ok(()) => self.proof.subacks.push_back(true),
            Err(e) => {
                tracing::warn!(topic = %probe.topic, error = %e, "probe subscription not sent")
            }
        }
        // The filters' SUBACK follows it.
        if !self.cfg.topics.is_empty() {
            self.proof.subacks.push_back(false);
        }
    }

    /// The first probe of a connection: at once, and at QoS 1, so a broker's ACL
    /// refusing the topic shows: in the PUBACK (MQTT 5), or as a probe the broker
    /// acknowledged but never delivers.
    pub(super) fn first_probe(&mut self) {
        let Some(probe) = &self.cfg.probe else {
            return;
        };
        let qos = 1;
        let n = self.proof.sent;
        if self
            .client
            .publish(&probe.topic, self.proof.payload(n), qos, false)
            .is_ok()
        {
            self.proof.sent += 1;
            if qos == 1 {
                self.proof.pubacks.push_back(true);
            }
            let now = self.proof.clock.mono();
            self.proof.first_sent = Some(now);
            self.proof.last_probe = Some(now);
            self.proof.unanswered_since.get_or_insert(now);
        }
    }

    /// The site broker refuses the probe topic: a start-up error naming it (docs/reference.md#group_defaults-and-groupsname).
    pub(super) fn probe_refused(&self, what: &str) -> bool {
        let topic = self.cfg.probe.as_ref().map_or("", |p| p.topic.as_str());
        tracing::error!(%topic, "the source broker refused to let the gateway {what} its probe topic");
        let _ = self.links.fatal.send(RunError::ProbeRefused {
            topic: topic.to_owned(),
            what: what.to_owned(),
        });
        false
    }

    /// The probe clock (docs/reference.md#group_defaults-and-groupsname): a probe when the path has been quiet for
    /// `probe_after_ms`; the path down when the oldest is not back in
    /// `probe_timeout_ms`. False when the gateway is done with the source.
    pub(super) async fn probe_look(&mut self) -> bool {
        let Some(probe) = self.cfg.probe.clone() else {
            return true;
        };
        if !self.connected || self.stopping {
            return true;
        }
        let now = self.proof.clock.mono();
        if let Some(acked) = self.proof.first_acked
            && now - acked >= probe.timeout_ms
        {
            return self.probe_refused("publish to or subscribe to");
        }
        match self.proof.step(&probe, now) {
            ProbeStep::Wait => true,
            ProbeStep::Send => {
                let n = self.proof.sent;
                match self
                    .client
                    .publish(&probe.topic, self.proof.payload(n), 0, false)
                {
                    Ok(()) => {
                        self.proof.sent += 1;
                        self.proof.last_probe = Some(now);
                        self.proof.unanswered_since.get_or_insert(now);
                    }
                    Err(e) => {
                        // Tried again a period later; the timeout still runs.
                        self.proof.last_probe = Some(now);
                        tracing::debug!(error = %e, "probe not queued");
                    }
                }
                true
            }
            ProbeStep::Down(silent) => self.path_down(&probe, silent).await,
        }
    }

    /// No probe came back in time: the path is down. A disconnect (docs/reference.md#group_defaults-and-groupsname): the
    /// connection is dropped and made anew with backoff.
    pub(super) async fn path_down(&mut self, probe: &Probe, silent: Millis) -> bool {
        self.ctx.registry.path_down[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(url = %self.cfg.endpoint.url(), topic = %probe.topic, silent_ms = silent,
            timeout_ms = probe.timeout_ms, "source_path_down: no probe came back in time; reconnecting");
        self.lost().await;
        match build(&self.cfg, self.started_at) {
            // The old connection is dropped with its loop (no packet gets through it anyway).
            Ok(link) => (self.client, self.lp) = link,
            Err(e) => tracing::error!(error = %e, "the source link cannot be built again"),
        }
        let delay = self.backoff.next_delay();
        self.back_off(delay).await;
        !self.stopping || self.connected
    }
}
