//! Upstream publishing: the async task around [`Delivery`], which decides what
//! goes next; this task only moves events between it, the link and the outbox.
//! A reload that changes the connection moves to a new link; the outbox keeps
//! everything not yet acknowledged, and it goes again on the new one.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

use super::{FENCE_LOOK, first_entry, read_from};
use crate::fleet::Via;
use crate::model::Millis;
use crate::run::events::{Control, ControlEvent, Ctx, Notice, Side};
use crate::run::outputs::delivery::{Acked, Delivery, Next};
use crate::run::outputs::sparkplug::SpbMsg;
use crate::run::status::metrics::Metrics;
use crate::run::status::registry::Registry;
use crate::store::{OutboxEntry, OutboxReader};
use crate::sys::clock::Backoff;
use crate::sys::link::{self, Client, Event, LinkError, LinkOptions, Loop};

/// Input of the sink task.
#[derive(Debug)]
pub enum SinkMsg {
    /// Outputs of a commit, with their outbox sequence numbers.
    Live(Vec<(u64, OutboxEntry)>),
    /// A gateway-level notice for `P/alerts`, published as it is (the state
    /// store may be what it is about); kept until the uplink is up.
    Notice(Notice),
    /// `P/metrics` (QoS 0, dropped while the uplink is down).
    Metrics(Box<Metrics>),
    /// What became of a remote document: retained on this topic (the
    /// `P/config/result` of the prefix it came under), kept until the uplink is up.
    Result(String, crate::fleet::ConfigResult),
    /// A reload was applied: these settings (a new link if they differ) and the
    /// retained status again (its `config_hash` changed); or the last commit is
    /// done: drain for a few seconds, then go offline.
    Control(Control<Box<SinkConfig>>),
}

/// Gateway notices kept while the uplink is down (the newest).
const NOTICES_KEPT: usize = 64;
/// Time given to the uplink to drain at shutdown.
const DRAIN: Duration = Duration::from_secs(3);

/// The sink's section of the config.
pub type SinkConfig = crate::config::Sink;

/// `P/status` (docs/reference.md#topics-and-payloads-upstream).
#[derive(Serialize)]
struct Status<'a> {
    state: &'a str,
    version: &'a str,
    config_hash: &'a str,
    started_at: Millis,
    /// The remote document in force (docs/reference.md#remote-configuration-fleet).
    config_id: Option<u64>,
    /// The board of a standby pair publishing (docs/reference.md#standby--two-boards-one-gateway).
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// The pair's epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
}

/// The sink component.
pub struct Sink {
    cfg: SinkConfig,
    client: Client,
    lp: Loop,
    d: Delivery,
    reader: OutboxReader,
    rx: UnboundedReceiver<SinkMsg>,
    registry: Arc<Registry>,
    delivered: watch::Sender<u64>,
    backoff: Backoff,
    started_at: Millis,
    /// Gateway notices waiting for the uplink (a few: they report state changes).
    notices: VecDeque<Notice>,
    /// Results of remote documents waiting for the uplink.
    results: VecDeque<(String, crate::fleet::ConfigResult)>,
    /// Where `P/config/set` and `P/config/desired` messages go (the reloader).
    documents: tokio::sync::mpsc::UnboundedSender<ControlEvent>,
    /// Since when the broker owes an answer (a PUBACK, a PINGRESP).
    waiting_since: Option<Millis>,
    /// When the broker was last heard from (any packet).
    heard: Millis,
    /// Monotonic clock.
    clock: crate::sys::clock::SystemClock,
    /// A PINGREQ is unanswered.
    ping_pending: bool,
    /// The Sparkplug edge node's task (`[sink.sparkplug]`), fed the same entries.
    spb: Option<tokio::sync::mpsc::UnboundedSender<SpbMsg>>,
    /// Outside its proof of the pair's claim the board neither connects nor publishes.
    fence: crate::run::fence::Fence,
    /// Publishes handed to the link and not yet taken from its request queue.
    queued: usize,
}

/// Publishes waiting in the link's request queue at most: the queue keeps the room
/// it grew to, ~216 bytes a publish (a full `sink.max_inflight` window was 885 KB).
const QUEUED: usize = 256;

impl Sink {
    /// A sink publishing the outbox `reader` reads; `delivered` carries how far
    /// upstream has acknowledged.
    pub fn new(
        cfg: SinkConfig,
        ctx: &Ctx,
        (reader, rx): (OutboxReader, UnboundedReceiver<SinkMsg>),
        (delivered, documents): (
            watch::Sender<u64>,
            tokio::sync::mpsc::UnboundedSender<ControlEvent>,
        ),
    ) -> Result<Self, LinkError> {
        let (registry, started_at, clock) = (ctx.registry.clone(), ctx.started_at, ctx.clock);
        let seed = ctx.seed.rotate_left(17);
        let qos = cfg.endpoint.qos;
        let window = usize::from(cfg.window);
        let (client, lp) = build(&cfg, status(&cfg, &registry, started_at, "offline"))?;
        Ok(Self {
            client,
            lp,
            d: Delivery::new(None, window, qos),
            cfg,
            reader,
            rx,
            registry,
            delivered,
            backoff: Backoff::new(seed),
            started_at,
            notices: VecDeque::new(),
            results: VecDeque::new(),
            documents,
            waiting_since: None,
            heard: 0,
            clock,
            ping_pending: false,
            spb: None,
            fence: ctx.fence.clone(),
            queued: 0,
        })
    }

    /// Hands every entry, the counters, reloads and the stop to the edge node too.
    pub fn with_edge_node(mut self, spb: tokio::sync::mpsc::UnboundedSender<SpbMsg>) -> Self {
        self.spb = Some(spb);
        self
    }

    fn to_edge_node(&self, m: SpbMsg) {
        if let Some(s) = &self.spb {
            let _ = s.send(m);
        }
    }

    fn status(&self, cfg: &SinkConfig, state: &str) -> Vec<u8> {
        status(cfg, &self.registry, self.started_at, state)
    }

    /// Runs until stopped.
    pub async fn run(mut self) {
        let first = first_entry(&self.reader).await;
        self.d = Delivery::new(first, usize::from(self.cfg.window), self.cfg.endpoint.qos);
        if first.is_some() {
            let depth = self.registry.outbox_depth.load(Ordering::Relaxed);
            tracing::info!(depth, "outbox backlog to deliver upstream");
        }
        let mut drain: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        // Between reconnect attempts; a stop or a reload does not wait for it.
        let mut backoff: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        let mut rx_open = true;
        let mut alarm = crate::run::alarm::Alarm::new(self.clock);
        loop {
            let fenced = !self.fence.holds();
            if !fenced {
                self.send_notices();
            }
            if self.cfg.plain && !fenced {
                fill(
                    &mut self.d,
                    (&self.client, &mut self.queued),
                    &self.reader,
                    self.cfg.endpoint.qos,
                )
                .await;
            }
            if drain.is_some() && (self.d.drained() || !self.cfg.plain) {
                break;
            }
            let owed = self.d.is_connected() && (self.d.in_flight() > 0 || self.ping_pending);
            if !owed {
                self.waiting_since = None;
            } else if self.waiting_since.is_none() {
                self.waiting_since = Some(self.clock.mono());
            }
            alarm.want(self.answer_due().filter(|_| backoff.is_none()));
            tokio::select! {
                () = tokio::time::sleep(FENCE_LOOK), if fenced => {}
                ev = self.lp.poll(), if backoff.is_none() && !fenced => match ev {
                    Ok(ev) => self.on_event(ev),
                    Err(e) => {
                        self.lost();
                        if drain.is_some() {
                            break;
                        }
                        let delay = self.backoff.next_delay();
                        tracing::warn!(
                            url = %self.cfg.endpoint.url(), cause = %e, retry_in_ms = delay.as_millis() as u64,
                            outbox_depth = self.registry.outbox_depth.load(Ordering::Relaxed),
                            "sink disconnected; outputs kept in the outbox"
                        );
                        backoff = Some(Box::pin(tokio::time::sleep(delay)));
                    }
                },
                () = async { if let Some(b) = backoff.as_mut() { b.await } }, if backoff.is_some() => {
                    backoff = None;
                }
                () = alarm.fired(), if alarm.is_armed() => {
                    // Looked at again: answers that came meanwhile moved the deadline on.
                    if self.answer_due().is_some_and(|t| self.clock.mono() >= t) {
                        if drain.is_some() {
                            break;
                        }
                        backoff = Some(Box::pin(tokio::time::sleep(self.path_down())));
                    }
                }
                msg = self.rx.recv(), if rx_open => match msg {
                    Some(SinkMsg::Control(Control::Reload(cfg))) => {
                        self.to_edge_node(SpbMsg::Control(Control::Reload(cfg.clone())));
                        self.apply(*cfg).await;
                        backoff = None;
                    }
                    Some(SinkMsg::Control(Control::Stop)) | None => {
                        self.to_edge_node(SpbMsg::Control(Control::Stop));
                        if !self.d.is_connected() {
                            // Down: what is left stays in the outbox for the next start.
                            break;
                        }
                        rx_open = false;
                        drain = Some(Box::pin(tokio::time::sleep(DRAIN)));
                    }
                    Some(m) => self.on_msg(m),
                },
                () = async { if let Some(d) = drain.as_mut() { d.await } }, if drain.is_some() => {
                    tracing::warn!(
                        outbox_depth = self.registry.outbox_depth.load(Ordering::Relaxed),
                        "uplink not drained at shutdown; the rest stays in the outbox"
                    );
                    break;
                }
                () = tokio::time::sleep(Duration::from_millis(200)), if self.d.retry_due() => self.d.retry(),
            }
        }
        self.offline().await;
    }

    /// When the uplink is down unless the broker says something first: `ack_timeout_ms`
    /// after an answer became owed or the broker was last heard, whichever is later.
    /// A packet from the broker.
    fn on_event(&mut self, ev: Event) {
        if matches!(ev, Event::PingSent) {
            self.ping_pending = true;
            return;
        }
        if matches!(ev, Event::Published) {
            self.queued = self.queued.saturating_sub(1);
            return;
        }
        if matches!(ev, Event::Other) {
            return;
        }
        // Anything from the broker: the path works; what is still owed waits anew.
        self.heard = self.clock.mono();
        match ev {
            Event::Connected { receive_max, .. } => {
                self.ping_pending = false;
                self.on_connected(receive_max);
            }
            Event::PubAck { ok, reason } => self.on_puback(ok, &reason),
            // A retained `set` would come again at every connect; `desired` is
            // retained on purpose (the reloader takes each one once).
            Event::Message {
                topic,
                payload,
                retained,
                ..
            } if self.cfg.documents => {
                if !retained && topic == self.cfg.topic("config/set") {
                    let _ = self
                        .documents
                        .send(ControlEvent::Document(Via::Set, payload.to_vec()));
                } else if topic == self.cfg.topic("config/desired") && !payload.is_empty() {
                    let _ = self
                        .documents
                        .send(ControlEvent::Document(Via::Desired, payload.to_vec()));
                }
            }
            Event::Subscribed { refused } if refused > 0 => {
                tracing::error!(topics = ?[self.cfg.topic("config/set"), self.cfg.topic("config/desired")],
                    "the upstream broker refused the fleet subscriptions: no remote configuration");
            }
            Event::Heard | Event::UnsubAck => self.ping_pending = false,
            _ => {}
        }
    }

    /// The link failed: nothing is owed on it any more.
    fn lost(&mut self) {
        self.waiting_since = None;
        self.ping_pending = false;
        if self.d.is_connected() {
            self.d.disconnected();
            self.link_down();
        }
    }

    /// A message from the other components (but a reload and the stop).
    fn on_msg(&mut self, m: SinkMsg) {
        match m {
            SinkMsg::Live(list) => {
                if self.spb.is_some() {
                    self.to_edge_node(SpbMsg::Live(list.clone()));
                }
                if self.cfg.plain {
                    self.d.live(list);
                }
            }
            SinkMsg::Notice(n) => {
                self.registry
                    .alerts
                    .push(serde_json::to_value(&n).unwrap_or_default());
                if self.notices.len() >= NOTICES_KEPT {
                    self.notices.pop_front();
                }
                self.notices.push_back(n);
            }
            SinkMsg::Metrics(m) => {
                self.to_edge_node(SpbMsg::Counters(m.sparkplug_counters()));
                if self.d.is_connected() {
                    let payload = m.encode(self.cfg.format);
                    let _ = self
                        .client
                        .publish(&self.cfg.topic("metrics"), payload, 0, false);
                }
            }
            SinkMsg::Result(topic, r) => self.results.push_back((topic, r)),
            SinkMsg::Control(_) => {}
        }
    }

    fn answer_due(&self) -> Option<Millis> {
        let timeout = Millis::try_from(self.cfg.ack_timeout_ms).unwrap_or(Millis::MAX);
        self.waiting_since
            .map(|t| t.max(self.heard).saturating_add(timeout))
    }

    /// The broker has answered nothing for `ack_timeout_ms` while it owed an answer:
    /// the uplink is down (a blackholed link sends no RST). The connection is dropped
    /// and made anew; the outbox keeps everything. Returns the backoff delay.
    fn path_down(&mut self) -> Duration {
        self.registry.path_down[1].fetch_add(1, Ordering::Relaxed);
        self.d.disconnected();
        self.link_down();
        self.waiting_since = None;
        self.ping_pending = false;
        match build(&self.cfg, self.status(&self.cfg, "offline")) {
            Ok(link) => (self.client, self.lp) = link,
            Err(e) => tracing::error!(error = %e, "the sink link cannot be built again"),
        }
        let delay = self.backoff.next_delay();
        tracing::warn!(
            url = %self.cfg.endpoint.url(), ack_timeout_ms = self.cfg.ack_timeout_ms, retry_in_ms = delay.as_millis() as u64,
            outbox_depth = self.registry.outbox_depth.load(Ordering::Relaxed),
            "sink_path_down: the upstream broker answered nothing in time; reconnecting, outputs kept in the outbox"
        );
        delay
    }

    fn send_notices(&mut self) {
        if !self.d.is_connected() {
            return;
        }
        while let Some((topic, r)) = self.results.pop_front() {
            let payload = self.cfg.format.encode(&r);
            if self.client.publish(&topic, payload, 1, true).is_err() {
                self.results.push_front((topic, r));
                break;
            }
            self.queued += 1;
            self.d.other_sent(1);
        }
        let (topic, qos) = (self.cfg.topic("alerts"), self.cfg.endpoint.qos);
        while let Some(n) = self.notices.pop_front() {
            let payload = self.cfg.format.encode(&n);
            if self.client.publish(&topic, payload, qos, false).is_err() {
                self.notices.push_front(n);
                break;
            }
            self.queued += 1;
            self.d.other_sent(qos);
        }
    }

    /// The uplink is gone: status and control hear of it.
    fn link_down(&self) {
        if self.registry.sink_up.swap(false, Ordering::Relaxed) {
            let _ = self.documents.send(ControlEvent::Link(Side::Sink, false));
        }
    }

    fn on_connected(&mut self, receive_max: Option<u16>) {
        // rumqttc moved what was queued into its own list at the disconnect (and a
        // publish it lost there would never be counted out): the count starts again.
        self.queued = 0;
        self.backoff.reset();
        self.d.connected(receive_max);
        self.registry.sink_up.store(true, Ordering::Relaxed);
        let _ = self.documents.send(ControlEvent::Link(Side::Sink, true));
        if self.cfg.documents {
            let _ = self.client.subscribe(
                &[
                    self.cfg.topic("config/set"),
                    self.cfg.topic("config/desired"),
                ],
                1,
            );
        }
        let depth = self.registry.outbox_depth.load(Ordering::Relaxed);
        // What bounds the uplink's rate over a long round trip: the smaller of the two.
        let broker_max = receive_max.unwrap_or(u16::MAX);
        tracing::info!(url = %self.cfg.endpoint.url(), outbox_depth = depth, max_inflight = self.cfg.window,
            broker_receive_maximum = broker_max, "sink connected");
        if broker_max < self.cfg.window {
            tracing::info!(
                broker_receive_maximum = broker_max,
                "the upstream broker takes fewer unacknowledged publishes than sink.max_inflight: its limit applies"
            );
        }
        self.publish_status("online");
    }

    fn publish_status(&mut self, state: &str) -> bool {
        let payload = self.status(&self.cfg, state);
        let ok = self
            .client
            .publish(&self.cfg.topic("status"), payload, 1, true)
            .is_ok();
        if ok {
            self.queued += 1;
            self.d.other_sent(1);
        }
        ok
    }

    fn on_puback(&mut self, ok: bool, reason: &str) {
        match self.d.puback(ok) {
            Acked::Delivered(upto) => {
                self.delivered.send_replace(upto);
            }
            Acked::Refused(seq) => {
                tracing::warn!(seq, reason, "upstream refused an output; retrying");
            }
            Acked::Nothing => {}
        }
    }

    /// A reload: the same link republishes the status (new hash); other settings
    /// go offline on the old link and connect a new one.
    async fn apply(&mut self, new: SinkConfig) {
        if new == self.cfg {
            if self.d.is_connected() {
                self.publish_status("online");
            }
            return;
        }
        let link = match build(&new, self.status(&new, "offline")) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "reload: the new sink link cannot be built; keeping the current one");
                return;
            }
        };
        tracing::info!(from = %self.cfg.endpoint.url(), to = %new.endpoint.url(), "sink reconnecting for a reload");
        self.send_notices();
        self.offline().await;
        self.d.disconnected();
        self.link_down();
        self.d.configure(usize::from(new.window), new.endpoint.qos);
        (self.client, self.lp) = link;
        self.queued = 0;
        self.cfg = new;
        self.backoff.reset();
        self.waiting_since = None;
        self.ping_pending = false;
    }

    /// Offline status, retained, then a clean disconnect (the last will covers a crash).
    async fn offline(&mut self) {
        if !self.d.is_connected() || !self.publish_status("offline") {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while self.d.in_flight() > 0 {
                match self.lp.poll().await {
                    Ok(Event::PubAck { ok, reason }) => self.on_puback(ok, &reason),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        })
        .await;
        let _ = self.client.disconnect();
        let _ = tokio::time::timeout(Duration::from_millis(500), async {
            while self.lp.poll().await.is_ok() {}
        })
        .await;
    }
}

/// The `P/status` payload in `cfg`'s format with the config hash in force.
fn status(cfg: &SinkConfig, registry: &Registry, started_at: Millis, state: &str) -> Vec<u8> {
    let pair = registry.pair();
    cfg.format.encode(&Status {
        state,
        version: env!("CARGO_PKG_VERSION"),
        config_hash: &registry.config_hash(),
        started_at,
        config_id: Some(registry.config_id.load(Ordering::Relaxed)).filter(|&id| id > 0),
        node: pair.as_ref().map(|p| p.node.clone()),
        epoch: pair.map(|p| p.epoch),
    })
}

/// The uplink: a clean session each time (the outbox is the session), `offline` as its will.
fn build(cfg: &SinkConfig, offline: Vec<u8>) -> Result<(Client, Loop), LinkError> {
    link::build(&LinkOptions {
        endpoint: &cfg.endpoint,
        v5: cfg.v5,
        persistent: false,
        session_expiry_s: 0,
        manual_acks: false,
        will: Some((cfg.topic("status"), offline)),
        will_retain: true,
        inflight: cfg.window,
    })
}

/// Publishes until the in-flight window is full, [`QUEUED`] wait in the link's
/// queue, or nothing is left. Each publish the link takes calls this again.
async fn fill(
    d: &mut Delivery,
    (client, queued): (&Client, &mut usize),
    reader: &OutboxReader,
    qos: u8,
) {
    while *queued < QUEUED {
        match d.next() {
            Next::Publish(seq, e) => {
                if client.publish(&e.topic, e.payload, qos, e.retain).is_err() {
                    d.unsent(seq);
                    return;
                }
                *queued += 1;
                d.sent(seq);
            }
            Next::Read(after) => match read_from(reader, after).await {
                Ok(v) => d.read(v),
                Err(e) => {
                    tracing::error!(error = %e, "reading the outbox");
                    return;
                }
            },
            Next::Wait => return,
        }
    }
}
