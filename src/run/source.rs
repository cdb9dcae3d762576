//! Ingest from the site broker: a persistent session, QoS 1 messages handed to
//! the core with their ack held, acks sent in receive order after the commit
//! that covers them, reconnects with capped exponential backoff. A reload
//! subscribes and unsubscribes on the same session, or moves to a new link
//! once the acks of what was handed to the core are out.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{Sender, UnboundedReceiver};
use tokio::sync::watch;

use super::error::RunError;
use super::events::{AckJob, Current, Inbound, StoreState};
use super::registry::Registry;
use crate::config::Probe;
use crate::model::Millis;
use crate::sys::clock::{Backoff, SystemClock};
use crate::sys::link::{self, Client, Event, LinkError, LinkOptions, Loop};

/// The source's section of the config.
pub type SourceConfig = crate::config::Source;

/// The link `cfg` describes (nothing connects until it is polled); `started_at`
/// stamps the Sparkplug host STATE of its will.
pub fn build(cfg: &SourceConfig, started_at: Millis) -> Result<(Client, Loop), LinkError> {
    link::build(&LinkOptions {
        endpoint: &cfg.endpoint,
        v5: cfg.v5,
        persistent: true,
        session_expiry_s: cfg.session_expiry_s,
        manual_acks: true,
        will: cfg.host_state(started_at).map(|(t, _, dead)| (t, dead)),
        inflight: 100,
    })
}

/// What the source task is wired to.
pub struct Links {
    /// Messages and link state to the core.
    pub core: Sender<Inbound>,
    /// A reload's new settings.
    pub control: UnboundedReceiver<SourceConfig>,
    /// The store's health: no messages are taken while it cannot commit.
    pub store_state: watch::Receiver<StoreState>,
    /// The connection acks and commands go to.
    pub current: watch::Sender<Current>,
    /// Ack tokens the ack task has dealt with, in total.
    pub acked: watch::Receiver<u64>,
    /// Stop requested.
    pub stop: watch::Receiver<bool>,
    /// The ack task sent the final acks.
    pub flushed: watch::Receiver<bool>,
    /// Counters and gauges.
    pub registry: Arc<Registry>,
    /// What stops the gateway: a site broker that refuses the probe topic.
    pub fatal: tokio::sync::mpsc::UnboundedSender<RunError>,
}

/// The proof of the path from the site broker (SPEC §5): when something last
/// arrived, and the probes out since.
struct Proof {
    /// Monotonic clock.
    clock: SystemClock,
    /// Tells this process's probes from another's on the same topic (a standby).
    nonce: u64,
    /// Probes sent (the next one's number).
    sent: u64,
    /// Something arrived (a message or one of our probes).
    last: Millis,
    /// The last probe went out.
    last_probe: Option<Millis>,
    /// The oldest probe not answered by anything since.
    unanswered_since: Option<Millis>,
    /// SUBACKs to come, in order: whether each is the probe topic's.
    subacks: std::collections::VecDeque<bool>,
    /// QoS 1 PUBACKs to come, in order: whether each is the start-up probe's.
    pubacks: std::collections::VecDeque<bool>,
    /// The broker acknowledged a connection's first probe and nothing has arrived
    /// since: not back within the timeout, the broker took it but will not deliver it.
    first_acked: Option<Millis>,
    /// When this connection's first probe went out; whether any probe came back on it.
    first_sent: Option<Millis>,
    probe_back: bool,
    /// Connections in a row the broker closed right after their first probe, none
    /// back (mosquitto closes a connection that publishes where its ACL says no).
    closed_after_probe: u32,
}

impl Proof {
    fn new(nonce: u64, clock: SystemClock) -> Self {
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
    fn proven(&mut self) {
        self.last = self.clock.mono();
        self.unanswered_since = None;
        self.first_acked = None;
    }

    /// A fresh connection: proven by its CONNACK, nothing outstanding.
    fn reset(&mut self) {
        self.proven();
        self.last_probe = None;
        self.first_sent = None;
        self.probe_back = false;
        self.subacks.clear();
        self.pubacks.clear();
    }

    /// The payload of probe `n`.
    fn payload(&self, n: u64) -> Vec<u8> {
        format!("{:016x}:{n}", self.nonce).into_bytes()
    }

    /// Whether `payload` is one of this process's probes.
    fn ours(&self, payload: &[u8]) -> bool {
        payload.len() > 17
            && payload[16] == b':'
            && payload[..16] == *format!("{:016x}", self.nonce).as_bytes()
    }
}

/// What the probe clock says at a look.
enum ProbeStep {
    /// Nothing to do.
    Wait,
    /// Send a probe.
    Send,
    /// The oldest probe is not back in time: the path is down (silent for this long, ms).
    Down(Millis),
}

impl Proof {
    /// When [`Proof::step`] may next say something other than `Wait` (monotonic ms).
    fn next_look(&self, cfg: &Probe) -> Millis {
        let (after, timeout) = ms(cfg.after_ms, cfg.timeout_ms);
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

    fn step(&self, cfg: &Probe, now: Millis) -> ProbeStep {
        let (after, timeout) = ms(cfg.after_ms, cfg.timeout_ms);
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

/// Probe settings as milliseconds of the monotonic clock.
fn ms(after: u64, timeout: u64) -> (Millis, Millis) {
    let m = |v: u64| Millis::try_from(v).unwrap_or(Millis::MAX);
    (m(after), m(timeout))
}

/// The source component.
pub struct Source {
    cfg: SourceConfig,
    client: Client,
    lp: Loop,
    links: Links,
    backoff: Backoff,
    connected: bool,
    stopping: bool,
    received_since_connect: u64,
    /// Held tokens handed to the core, in total.
    forwarded: u64,
    /// Filters a reload removed while the link was down: the kept session still
    /// holds them, so they are unsubscribed at the next connect.
    unsubscribe: Vec<String>,
    /// The path's proof (probes).
    proof: Proof,
    /// Stamps the Sparkplug host STATE.
    started_at: Millis,
}

/// How long a reload's reconnect waits for the acks of what the core has.
const HANDOVER: Duration = Duration::from_secs(5);

impl Source {
    /// A source on a built link.
    pub fn new(
        cfg: SourceConfig,
        (client, lp): (Client, Loop),
        links: Links,
        (seed, started_at, clock): (u64, Millis, SystemClock),
    ) -> Self {
        Self {
            cfg,
            client,
            lp,
            links,
            backoff: Backoff::new(seed),
            connected: false,
            stopping: false,
            received_since_connect: 0,
            forwarded: 0,
            unsubscribe: Vec::new(),
            proof: Proof::new(seed.rotate_left(29) ^ 0x7469_6465_6d61_726b, clock),
            started_at,
        }
    }

    /// Polls the source link until the ack task has flushed the final acks (or
    /// `stop` fires while disconnected). Never exits because the broker is down.
    pub async fn run(mut self) {
        let mut was_paused = false;
        // Looks at the store's state even when no message comes.
        let mut look = tokio::time::interval(Duration::from_millis(200));
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut alarm = super::alarm::Alarm::new(self.proof.clock);
        loop {
            // The state store cannot commit: stop taking messages (the broker keeps
            // them; a long pause drops the connection and they come again).
            let paused = !self.links.store_state.borrow().is_ok() && !self.stopping;
            if paused != was_paused {
                was_paused = paused;
                // To the core a pause is a disconnect: the broker's backlog grows,
                // so processing time must not advance anything meanwhile (SPEC §5).
                let ev = if paused {
                    tracing::warn!(url = %self.cfg.endpoint.url(), "source paused: the state store cannot commit");
                    Inbound::Disconnected
                } else {
                    tracing::info!(url = %self.cfg.endpoint.url(), "source resumed");
                    Inbound::Connected
                };
                if self.connected && self.links.core.send(ev).await.is_err() {
                    return;
                }
            }
            if paused {
                // Nothing is polled: silence proves nothing, and is no fault of the path.
                self.proof.proven();
            }
            // Looked at every pass, moved only when it comes earlier (no timer work per message).
            alarm.want(
                self.cfg
                    .probe
                    .as_ref()
                    .filter(|_| self.connected && !self.stopping && !paused)
                    .map(|p| self.proof.next_look(p)),
            );
            tokio::select! {
                // Control first, then input: a probe's verdict must not overtake what
                // already arrived, and a busy link must not hold up a stop or a reload.
                biased;
                _ = self.links.stop.changed(), if !self.stopping => {
                    self.stopping = true;
                }
                _ = self.links.flushed.changed() => {
                    if *self.links.flushed.borrow() {
                        self.close().await;
                        return;
                    }
                }
                new = self.links.control.recv(), if !self.stopping => {
                    if let Some(new) = new
                        && !self.apply(new).await
                    {
                        return;
                    }
                }
                ev = self.lp.poll(), if !paused => {
                    if !self.on_event(ev).await {
                        return;
                    }
                }
                () = alarm.fired(), if alarm.is_armed() => {
                    if !self.probe_look().await {
                        return;
                    }
                }
                _ = look.tick() => {}
            }
        }
    }

    /// One event of the link; false when the gateway is done with the source.
    async fn on_event(&mut self, ev: Result<Event, LinkError>) -> bool {
        match ev {
            Ok(Event::Connected {
                session_present, ..
            }) => {
                let generation = self.links.current.borrow().0 + 1;
                self.links
                    .current
                    .send_replace((generation, self.client.clone()));
                self.connected = true;
                self.received_since_connect = 0;
                self.backoff.reset();
                self.proof.reset();
                let url = self.cfg.endpoint.url();
                if session_present {
                    tracing::info!(%url, generation, "source connected, session resumed");
                } else {
                    tracing::info!(%url, generation, "source connected, new session: subscribing");
                }
                // Subscribed on every connect: a kept session does not prove our
                // subscription is in it (a SUBSCRIBE lost in a cut before its SUBACK;
                // a CONNECT the broker took whose CONNACK never came back), and without
                // it the source is deaf for good. Again is harmless (v5: retained
                // messages are not sent again).
                for t in std::mem::take(&mut self.unsubscribe) {
                    if let Err(e) = self.client.unsubscribe(&t) {
                        tracing::warn!(topic = %t, error = %e, "source unsubscribe not sent");
                    }
                }
                self.subscribe_probe();
                self.subscribe(self.cfg.topics.clone());
                if let Some((topic, online, _)) = &self.cfg.host_state(self.started_at) {
                    match self.client.publish(topic, online.clone(), 1, true) {
                        Ok(()) => self.proof.pubacks.push_back(false),
                        Err(e) => tracing::warn!(error = %e, "Sparkplug host STATE not published"),
                    }
                }
                self.first_probe();
                self.links.core.send(Inbound::Connected).await.is_ok()
            }
            Ok(Event::Message {
                topic,
                payload,
                held,
                ..
            }) => {
                if let Some(probe) = &self.cfg.probe
                    && topic == probe.topic
                {
                    // Probes are not readings: never forwarded, never counted (SPEC §5).
                    if self.proof.ours(&payload) {
                        self.proof.proven();
                        self.proof.probe_back = true;
                        self.proof.closed_after_probe = 0;
                        return self.links.core.send(Inbound::Proven).await.is_ok();
                    }
                    return true;
                }
                self.proof.proven();
                if self.stopping {
                    // Not acknowledged: the broker keeps it for the next start.
                    return true;
                }
                self.received_since_connect += 1;
                if self.received_since_connect == 10_000 {
                    tracing::info!("source: 10000 messages since connect (backlog draining)");
                }
                let generation = self.links.current.borrow().0;
                let held = held.map(|h| (generation, h));
                self.forwarded += u64::from(held.is_some());
                // Waits when the core is behind: the broker's window fills and ingest slows.
                self.links
                    .core
                    .send(Inbound::Message {
                        topic,
                        payload,
                        held,
                    })
                    .await
                    .is_ok()
            }
            Ok(Event::Subscribed { refused }) => {
                self.proof.proven();
                if self.proof.subacks.pop_front() == Some(true) {
                    if refused > 0 {
                        return self.probe_refused("subscribe to");
                    }
                    return true;
                }
                if refused == 0 {
                    self.links.registry.health.subscribed(true);
                    self.links.registry.links_made[0]
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::info!(topics = ?self.cfg.topics, "source subscribed");
                } else {
                    tracing::error!(refused, topics = ?self.cfg.topics, "source broker refused topic filters");
                }
                true
            }
            Ok(Event::PubAck { ok, .. }) => {
                self.proof.proven();
                if self.proof.pubacks.pop_front() == Some(true) {
                    if !ok {
                        return self.probe_refused("publish to");
                    }
                    self.proof.first_acked = Some(self.proof.clock.mono());
                }
                true
            }
            Ok(Event::Heard) => {
                // A PINGRESP says the connection is up, not that subscriptions deliver.
                true
            }
            Ok(Event::PingSent | Event::Other) => true,
            Err(e) => {
                if self.stopping && (*self.links.flushed.borrow() || !self.connected) {
                    return false;
                }
                if let Some(probe) = &self.cfg.probe
                    && self.connected
                    && !self.proof.probe_back
                    && self
                        .proof
                        .first_sent
                        .is_some_and(|t| self.proof.clock.mono() - t < ms(0, probe.timeout_ms).1)
                {
                    self.proof.closed_after_probe += 1;
                    if self.proof.closed_after_probe >= 3 {
                        return self.probe_refused("publish to");
                    }
                }
                self.lost().await;
                let delay = self.backoff.next_delay();
                tracing::warn!(url = %self.cfg.endpoint.url(), cause = %e, retry_in_ms = delay.as_millis() as u64, "source disconnected");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = self.links.stop.changed(), if !self.stopping => { self.stopping = true; }
                }
                !self.stopping || self.connected
            }
        }
    }

    /// The link is gone: its ack tokens are void, the core must not let time pass.
    async fn lost(&mut self) {
        if self.connected {
            self.connected = false;
            self.links.registry.health.subscribed(false);
            let generation = self.links.current.borrow().0 + 1;
            self.links
                .current
                .send_replace((generation, self.client.clone()));
            let _ = self.links.core.send(Inbound::Disconnected).await;
        }
    }

    /// Subscribes the probe topic on its own (its SUBACK tells an ACL's refusal apart).
    fn subscribe_probe(&mut self) {
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
    fn first_probe(&mut self) {
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

    /// The site broker refuses the probe topic: a start-up error naming it (SPEC §5).
    fn probe_refused(&self, what: &str) -> bool {
        let topic = self.cfg.probe.as_ref().map_or("", |p| p.topic.as_str());
        tracing::error!(%topic, "the source broker refused to let the gateway {what} its probe topic");
        let _ = self.links.fatal.send(RunError::ProbeRefused {
            topic: topic.to_owned(),
            what: what.to_owned(),
        });
        false
    }

    /// The probe clock (SPEC §5): a probe when the path has been quiet for
    /// `probe_after_ms`; the path down when the oldest is not back in
    /// `probe_timeout_ms`. False when the gateway is done with the source.
    async fn probe_look(&mut self) -> bool {
        let Some(probe) = self.cfg.probe.clone() else {
            return true;
        };
        if !self.connected || self.stopping {
            return true;
        }
        let now = self.proof.clock.mono();
        if let Some(acked) = self.proof.first_acked
            && now - acked >= ms(0, probe.timeout_ms).1
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

    /// No probe came back in time: the path is down. A disconnect (SPEC §5): the
    /// connection is dropped and made anew with backoff.
    async fn path_down(&mut self, probe: &Probe, silent: Millis) -> bool {
        self.links.registry.path_down[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(url = %self.cfg.endpoint.url(), topic = %probe.topic, silent_ms = silent,
            timeout_ms = probe.timeout_ms, "source_path_down: no probe came back in time; reconnecting");
        self.lost().await;
        match build(&self.cfg, self.started_at) {
            // The old connection is dropped with its loop (no packet gets through it anyway).
            Ok(link) => (self.client, self.lp) = link,
            Err(e) => tracing::error!(error = %e, "the source link cannot be built again"),
        }
        let delay = self.backoff.next_delay();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = self.links.stop.changed(), if !self.stopping => { self.stopping = true; }
        }
        !self.stopping || self.connected
    }

    /// Subscribes `topics` (the request channel full: waits off the polling task).
    fn subscribe(&self, topics: Vec<String>) {
        if topics.is_empty() {
            return;
        }
        if self
            .client
            .subscribe(&topics, self.cfg.endpoint.qos)
            .is_err()
        {
            let (c, qos) = (self.client.clone(), self.cfg.endpoint.qos);
            tokio::spawn(async move {
                if let Err(e) = c.subscribe_wait(topics, qos).await {
                    tracing::error!(error = %e, "source subscribe failed");
                }
            });
        }
    }

    /// A reload's settings: filters on the same session, or a new link.
    async fn apply(&mut self, new: SourceConfig) -> bool {
        if new == self.cfg {
            return true;
        }
        if !self.cfg.same_link(&new) {
            return self.reconnect(new).await;
        }
        let probe_topic = |c: &SourceConfig| c.probe.as_ref().map(|p| p.topic.clone());
        if probe_topic(&new) != probe_topic(&self.cfg) && self.connected {
            if let Some(t) = probe_topic(&self.cfg)
                && let Err(e) = self.client.unsubscribe(&t)
            {
                tracing::warn!(topic = %t, error = %e, "source unsubscribe not sent");
            }
            if let Some(t) = probe_topic(&new) {
                match self.client.subscribe(std::slice::from_ref(&t), 0) {
                    Ok(()) => self.proof.subacks.push_back(true),
                    Err(e) => tracing::warn!(topic = %t, error = %e, "probe subscription not sent"),
                }
            }
            self.proof.reset();
        }
        let qos_changed = new.endpoint.qos != self.cfg.endpoint.qos;
        let added: Vec<String> = new
            .topics
            .iter()
            .filter(|t| qos_changed || !self.cfg.topics.contains(t))
            .cloned()
            .collect();
        let removed: Vec<String> = self
            .cfg
            .topics
            .iter()
            .filter(|t| !new.topics.contains(t))
            .cloned()
            .collect();
        self.cfg = new;
        if self.connected {
            for t in &removed {
                if let Err(e) = self.client.unsubscribe(t) {
                    tracing::warn!(topic = %t, error = %e, "source unsubscribe not sent");
                }
            }
            self.subscribe(added.clone());
        } else {
            self.unsubscribe.extend(removed.iter().cloned());
        }
        tracing::info!(added = ?added, removed = ?removed, "source filters changed on the same session");
        true
    }

    /// Moves to the link `new` describes: the acks of every message the core
    /// has go out on the old one first (bounded by [`HANDOVER`]); messages that
    /// arrive meanwhile are left unacknowledged for the broker to redeliver.
    async fn reconnect(&mut self, new: SourceConfig) -> bool {
        let link = match build(&new, self.started_at) {
            Ok(l) => l,
            Err(e) => {
                // Validated as `check` does; TLS material unreadable now: keep the old link.
                tracing::error!(error = %e, "reload: the new source link cannot be built; keeping the current one");
                return true;
            }
        };
        tracing::info!(from = %self.cfg.endpoint.url(), to = %new.endpoint.url(), "source reconnecting for a reload");
        if self.connected {
            let target = self.forwarded;
            let deadline = tokio::time::sleep(HANDOVER);
            tokio::pin!(deadline);
            while *self.links.acked.borrow() < target {
                tokio::select! {
                    r = self.lp.poll() => if r.is_err() { break },
                    _ = self.links.acked.changed() => {}
                    () = &mut deadline => {
                        tracing::warn!("reload: acks still held after 5 s; the broker redelivers those messages");
                        break;
                    }
                }
            }
            if let Some((topic, _, offline)) = &self.cfg.host_state(self.started_at) {
                let _ = self.client.publish(topic, offline.clone(), 1, true);
            }
            let _ = self.client.disconnect();
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                while self.lp.poll().await.is_ok() {}
            })
            .await;
        }
        self.lost().await;
        (self.client, self.lp) = link;
        self.cfg = new;
        self.backoff.reset();
        true
    }

    /// The final acks are queued: publish the host's death, disconnect, poll it out.
    /// Down already: nothing can go out (the broker keeps what was not acknowledged),
    /// and polling would only wait on a reconnect.
    async fn close(&mut self) {
        if !self.connected {
            return;
        }
        if let Some((topic, _, offline)) = &self.cfg.host_state(self.started_at) {
            let _ = self.client.publish(topic, offline.clone(), 1, true);
        }
        let _ = self.client.disconnect();
        let deadline = tokio::time::sleep(Duration::from_secs(2));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = self.lp.poll() => if r.is_err() { return },
                () = &mut deadline => return,
            }
        }
    }
}

/// Sends acks in receive order on the current connection; a token from an
/// earlier one is dropped (the broker redelivers that message, and seq
/// deduplication makes it harmless). Counts every token it dealt with.
pub async fn acks(
    mut rx: UnboundedReceiver<AckJob>,
    current: watch::Receiver<Current>,
    acked: watch::Sender<u64>,
    flushed: watch::Sender<bool>,
) {
    while let Some(job) = rx.recv().await {
        match job {
            AckJob::Acks(list) => {
                let (generation, client) = current.borrow().clone();
                let n = u64::try_from(list.len()).unwrap_or(u64::MAX);
                let mut stale = 0u64;
                for (g, held) in list {
                    if g != generation {
                        stale += 1;
                        continue;
                    }
                    if let Err(e) = client.ack(&held).await {
                        tracing::warn!(error = %e, "ack not sent; the broker will redeliver");
                    }
                }
                if stale > 0 {
                    tracing::debug!(stale, "acks of an earlier connection dropped");
                }
                acked.send_modify(|a| *a += n);
            }
            AckJob::Done => break,
        }
    }
    let _ = flushed.send(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe() -> Probe {
        Probe {
            after_ms: 1000,
            timeout_ms: 3000,
            topic: "tidemark/gw/probe".into(),
        }
    }

    fn proof() -> Proof {
        let mut p = Proof::new(7, SystemClock::new());
        p.last = 0;
        p
    }

    #[test]
    fn a_busy_path_sends_no_probe() {
        let mut p = proof();
        for i in 0..50 {
            // A message every 900 ms: never quiet for probe_after_ms.
            assert!(matches!(p.step(&probe(), i * 900), ProbeStep::Wait));
            p.last = i * 900;
        }
    }

    #[test]
    fn a_quiet_path_is_probed_every_period_and_a_returned_probe_keeps_it_up() {
        let mut p = proof();
        assert_eq!(p.next_look(&probe()), 1000);
        assert!(matches!(p.step(&probe(), 999), ProbeStep::Wait));
        assert!(matches!(p.step(&probe(), 1000), ProbeStep::Send));
        p.last_probe = Some(1000);
        p.unanswered_since = Some(1000);
        // The next one a period later, even while the first is out.
        assert_eq!(p.next_look(&probe()), 2000);
        assert!(matches!(p.step(&probe(), 1500), ProbeStep::Wait));
        assert!(matches!(p.step(&probe(), 2000), ProbeStep::Send));
        // It came back: proven, nothing outstanding, quiet counts from the return.
        p.last = 1200;
        p.unanswered_since = None;
        p.last_probe = Some(2000);
        assert!(matches!(p.step(&probe(), 2999), ProbeStep::Wait));
        assert!(matches!(p.step(&probe(), 3000), ProbeStep::Send));
    }

    #[test]
    fn a_probe_not_back_in_time_takes_the_path_down_after_after_plus_timeout() {
        let mut p = proof();
        // Probes went at 1, 2 and 3 s; none came back.
        p.unanswered_since = Some(1000);
        p.last_probe = Some(3000);
        assert_eq!(p.next_look(&probe()), 4000);
        assert!(!matches!(p.step(&probe(), 3999), ProbeStep::Down(_)));
        match p.step(&probe(), 4000) {
            ProbeStep::Down(silent) => assert_eq!(silent, 4000),
            _ => panic!("the path should be down"),
        }
        // Anything arriving before then clears it.
        p.last = 3500;
        p.unanswered_since = None;
        assert!(!matches!(p.step(&probe(), 4000), ProbeStep::Down(_)));
    }

    #[test]
    fn a_first_probe_acknowledged_but_never_delivered_is_looked_at_in_time() {
        let mut p = proof();
        p.first_acked = Some(10);
        assert_eq!(p.next_look(&probe()), 1000);
        p.last_probe = Some(10);
        p.last = 10;
        assert_eq!(p.next_look(&probe()), 1010);
        // Probes every second meanwhile; the first one's verdict is due at 3.01 s.
        p.last_probe = Some(2500);
        assert_eq!(p.next_look(&probe()), 3010);
    }

    #[test]
    fn only_this_processes_probes_count() {
        let p = Proof::new(0xabc, SystemClock::new());
        let q = Proof::new(0xabd, SystemClock::new());
        assert!(p.ours(&p.payload(0)));
        assert!(p.ours(&p.payload(123_456)));
        assert!(!p.ours(&q.payload(0)));
        assert!(!p.ours(b""));
        assert!(!p.ours(b"{\"ts\": 1}"));
        assert!(p.payload(99).len() <= 24);
    }
}
