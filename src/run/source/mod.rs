//! Ingest from the site broker: a persistent session, QoS 1 messages handed to
//! the core with their ack held, acks sent in receive order after the commit
//! that covers them, reconnects with capped exponential backoff. A reload
//! subscribes and unsubscribes on the same session, or moves to a new link
//! once the acks of what was handed to the core are out.

use std::time::Duration;

use tokio::sync::mpsc::{Sender, UnboundedReceiver};
use tokio::sync::watch;

use crate::config::Probe;
use crate::model::Millis;
use crate::run::error::RunError;
use crate::run::events::{Control, ControlEvent, Ctx, Current, Inbound, Side, StoreState};
use crate::run::source::proof::{ProbeStep, Proof};
use crate::sys::clock::Backoff;
use crate::sys::link::{self, Client, Event, LinkError, LinkOptions, Loop};

mod path;
pub mod proof;

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
        will_retain: true,
        inflight: 100,
    })
}

/// What the source task is wired to.
pub struct Links {
    /// Messages and link state to the core.
    pub core: Sender<Inbound>,
    /// A reload's new settings, and the stop.
    pub control: UnboundedReceiver<Control<SourceConfig>>,
    /// The store's health: no messages are taken while it cannot commit.
    pub store_state: watch::Receiver<StoreState>,
    /// The connection acks and commands go to.
    pub current: watch::Sender<Current>,
    /// Ack tokens the ack task has dealt with, in total.
    pub acked: watch::Receiver<u64>,
    /// The ack task sent the final acks.
    pub flushed: watch::Receiver<bool>,
    /// What stops the gateway: a site broker that refuses the probe topic.
    pub fatal: tokio::sync::mpsc::UnboundedSender<RunError>,
    /// The link's ups and downs, to the control component.
    pub events: tokio::sync::mpsc::UnboundedSender<ControlEvent>,
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
    /// Registry, clocks, fence.
    ctx: Ctx,
    /// A reload that came while the source waited to reconnect.
    reload: Option<SourceConfig>,
}

/// How long a reload's reconnect waits for the acks of what the core has.
const HANDOVER: Duration = Duration::from_secs(5);

impl Source {
    /// A source on a built link.
    pub fn new(cfg: SourceConfig, (client, lp): (Client, Loop), ctx: &Ctx, links: Links) -> Self {
        let (seed, started_at, clock) = (ctx.seed, ctx.started_at, ctx.clock);
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
            ctx: ctx.clone(),
            reload: None,
        }
    }

    /// Polls the source link until the ack task has flushed the final acks (or
    /// `stop` fires while disconnected). Never exits because the broker is down.
    pub async fn run(mut self) {
        let mut was_paused = false;
        // Looks at the store's state even when no message comes.
        let mut look = tokio::time::interval(Duration::from_millis(50));
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut alarm = crate::run::alarm::Alarm::new(self.proof.clock);
        loop {
            // The state store cannot commit, or a board of a pair has no fresh proof of
            // the claim (the session may be another board's): nothing is read or
            // (re)connected; the broker keeps the messages.
            let fenced = !self.ctx.fence.holds();
            let paused = (!self.links.store_state.borrow().is_ok() || fenced) && !self.stopping;
            if paused != was_paused {
                was_paused = paused;
                // To the core a pause is a disconnect: the broker's backlog grows,
                // so processing time must not advance anything meanwhile (docs/reference.md#group_defaults-and-groupsname).
                let ev = if paused {
                    let why = if fenced {
                        "this board has no fresh proof of the pair's claim"
                    } else {
                        "the state store cannot commit"
                    };
                    tracing::warn!(url = %self.cfg.endpoint.url(), "source paused: {why}");
                    Inbound::Disconnected
                } else {
                    tracing::info!(url = %self.cfg.endpoint.url(), "source resumed");
                    Inbound::Connected
                };
                if self.connected && self.links.core.send(ev).await.is_err() {
                    return;
                }
            }
            if let Some(new) = self.reload.take()
                && !self.stopping
                && !self.apply(new).await
            {
                return;
            }
            // Memory near its limit (docs/reference.md#memory): nothing is read until what is
            // in flight has gone out; the link stays up.
            let held = self
                .ctx
                .registry
                .memory
                .held
                .load(std::sync::atomic::Ordering::Relaxed)
                && !self.stopping;
            if paused || held {
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
                _ = self.links.flushed.changed() => {
                    if *self.links.flushed.borrow() {
                        self.close().await;
                        return;
                    }
                }
                c = self.links.control.recv(), if !self.stopping => self.told(c),
                ev = self.lp.poll(), if !paused && !held => {
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
            }) => self.on_connected(session_present).await,
            Ok(Event::Message {
                topic,
                payload,
                held,
                ..
            }) => self.on_message(topic, payload, held).await,
            Ok(Event::Subscribed { refused }) => {
                self.proof.proven();
                if self.proof.subacks.pop_front() == Some(true) {
                    if refused > 0 {
                        return self.probe_refused("subscribe to");
                    }
                    return true;
                }
                if refused == 0 {
                    self.ctx.registry.health.subscribed(true);
                    let _ = self
                        .links
                        .events
                        .send(ControlEvent::Link(Side::Source, true));
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
            // A PINGRESP says the connection is up, not that subscriptions deliver.
            Ok(
                Event::Heard | Event::UnsubAck | Event::PingSent | Event::Published | Event::Other,
            ) => true,
            Err(e) => self.on_error(e).await,
        }
    }

    async fn on_connected(&mut self, session_present: bool) -> bool {
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

    async fn on_message(
        &mut self,
        topic: String,
        payload: bytes::Bytes,
        held: Option<link::Held>,
    ) -> bool {
        if let Some(probe) = &self.cfg.probe
            && topic == probe.topic
        {
            // Probes are not readings: never forwarded, never counted (docs/reference.md#group_defaults-and-groupsname).
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

    /// The link failed: a refused probe (v3.1.1 closes the connection), or a
    /// disconnect to back off from. False: stop polling.
    async fn on_error(&mut self, e: LinkError) -> bool {
        if self.stopping && (*self.links.flushed.borrow() || !self.connected) {
            return false;
        }
        if let Some(probe) = &self.cfg.probe
            && self.connected
            && !self.proof.probe_back
            && self
                .proof
                .first_sent
                .is_some_and(|t| self.proof.clock.mono() - t < probe.timeout_ms)
        {
            self.proof.closed_after_probe += 1;
            if self.proof.closed_after_probe >= 3 {
                return self.probe_refused("publish to");
            }
        }
        self.lost().await;
        let delay = self.backoff.next_delay();
        tracing::warn!(url = %self.cfg.endpoint.url(), cause = %e, retry_in_ms = delay.as_millis() as u64, "source disconnected");
        self.back_off(delay).await;
        !self.stopping || self.connected
    }

    /// Waits `delay` before a reconnect, less when told to stop; a reload that
    /// comes meanwhile is applied next.
    async fn back_off(&mut self, delay: Duration) {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            c = self.links.control.recv(), if !self.stopping => self.told(c),
        }
    }

    /// What the control component said: a reload to apply, or the stop (also
    /// when it is gone).
    fn told(&mut self, c: Option<Control<SourceConfig>>) {
        match c {
            Some(Control::Reload(new)) => self.reload = Some(new),
            Some(Control::Stop) | None => self.stopping = true,
        }
    }

    /// The link is gone: its ack tokens are void, the core must not let time pass.
    async fn lost(&mut self) {
        if self.connected {
            self.connected = false;
            self.ctx.registry.health.subscribed(false);
            let _ = self
                .links
                .events
                .send(ControlEvent::Link(Side::Source, false));
            let generation = self.links.current.borrow().0 + 1;
            self.links
                .current
                .send_replace((generation, self.client.clone()));
            let _ = self.links.core.send(Inbound::Disconnected).await;
        }
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
