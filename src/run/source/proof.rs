//! The proof of the path from the site broker (docs/reference.md#group_defaults-and-groupsname): probes out, what came
//! back, and when the path counts as down. Pure but for the monotonic clock
//! handle it reads; the source task does the publishing.

use crate::config::Probe;
use crate::model::Millis;
use crate::sys::clock::SystemClock;

/// The proof of the path from the site broker (docs/reference.md#group_defaults-and-groupsname): when something last
/// arrived, and the probes out since.
pub(crate) struct Proof {
    /// Monotonic clock.
    pub(crate) clock: SystemClock,
    /// Tells this process's probes from another's on the same topic (a standby).
    pub(crate) nonce: u64,
    /// Probes sent (the next one's number).
    pub(crate) sent: u64,
    /// Something arrived (a message or one of our probes).
    pub(crate) last: Millis,
    /// The last probe went out.
    pub(crate) last_probe: Option<Millis>,
    /// The oldest probe not answered by anything since.
    pub(crate) unanswered_since: Option<Millis>,
    /// SUBACKs to come, in order: whether each is the probe topic's.
    pub(crate) subacks: std::collections::VecDeque<bool>,
    /// QoS 1 PUBACKs to come, in order: whether each is the start-up probe's.
    pub(crate) pubacks: std::collections::VecDeque<bool>,
    /// The broker acknowledged a connection's first probe and nothing has arrived
    /// since: not back within the timeout, the broker took it but will not deliver it.
    pub(crate) first_acked: Option<Millis>,
    /// When this connection's first probe went out; whether any probe came back on it.
    pub(crate) first_sent: Option<Millis>,
    pub(crate) probe_back: bool,
    /// Connections in a row the broker closed right after their first probe, none
    /// back (mosquitto closes a connection that publishes where its ACL says no).
    pub(crate) closed_after_probe: u32,
}

impl Proof {
    pub(crate) fn new(nonce: u64, clock: SystemClock) -> Self {
        Self {
            clock,
            nonce,
            sent: 0,
            last: clock.mono(),
            last_probe: None,
            unanswered_since: None,
            subacks: std::collections::VecDeque::new(),
            pubacks: std::collections::VecDeque::new(),
            first_acked: None,
            first_sent: None,
            probe_back: false,
            closed_after_probe: 0,
        }
    }

    /// The path is proven now.
    pub(crate) fn proven(&mut self) {
        self.last = self.clock.mono();
        self.unanswered_since = None;
        self.first_acked = None;
    }

    /// A fresh connection: proven by its CONNACK, nothing outstanding.
    pub(crate) fn reset(&mut self) {
        self.proven();
        self.last_probe = None;
        self.first_sent = None;
        self.probe_back = false;
        self.subacks.clear();
        self.pubacks.clear();
    }

    /// The payload of probe `n`.
    pub(crate) fn payload(&self, n: u64) -> Vec<u8> {
        format!("{:016x}:{n}", self.nonce).into_bytes()
    }

    /// Whether `payload` is one of this process's probes.
    pub(crate) fn ours(&self, payload: &[u8]) -> bool {
        payload.len() > 17
            && payload[16] == b':'
            && payload[..16] == *format!("{:016x}", self.nonce).as_bytes()
    }
}

/// What the probe clock says at a look.
pub(crate) enum ProbeStep {
    /// Nothing to do.
    Wait,
    /// Send a probe.
    Send,
    /// The oldest probe is not back in time: the path is down (silent for this long, ms).
    Down(Millis),
}

impl Proof {
    /// When [`Proof::step`] may next say something other than `Wait` (monotonic ms).
    pub(crate) fn next_look(&self, cfg: &Probe) -> Millis {
        let (after, timeout) = (cfg.after_ms, cfg.timeout_ms);
        let send = match self.last_probe {
            Some(t) => self.last.max(t).saturating_add(after),
            None => self.last.saturating_add(after),
        };
        [self.unanswered_since, self.first_acked]
            .into_iter()
            .flatten()
            .map(|t| t.saturating_add(timeout))
            .fold(send, std::cmp::Ord::min)
    }

    pub(crate) fn step(&self, cfg: &Probe, now: Millis) -> ProbeStep {
        let (after, timeout) = (cfg.after_ms, cfg.timeout_ms);
        if let Some(since) = self.unanswered_since
            && now - since >= timeout
        {
            return ProbeStep::Down(now - self.last);
        }
        let quiet = now - self.last >= after;
        let due = self.last_probe.is_none_or(|t| now - t >= after);
        if quiet && due {
            ProbeStep::Send
        } else {
            ProbeStep::Wait
        }
    }
}

#[cfg(test)]
#[path = "proof_tests.rs"]
mod tests;
