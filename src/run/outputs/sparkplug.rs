//! The Sparkplug B edge node (docs/reference.md#sink--the-upstream-broker): its own session on the sink broker
//! (the will is its NDEATH), fed the same outbox entries as the plain topics.
//! DATA goes at QoS 0, as Sparkplug requires; an entry counts as delivered once
//! an UNSUBSCRIBE sent after it is answered (a broker reads a connection's
//! packets in order), so the outbox keeps it until both uplinks took it.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

use super::{first_entry, read_from};
use crate::model::Millis;
use crate::run::events::{Control, Ctx};
use crate::run::outputs::delivery::{Acked, Delivery, Next};
use crate::sparkplug::node::{self, COUNTERS, Entry, Node, NodeConfig};
use crate::store::{OutboxEntry, OutboxReader};
use crate::sys::clock::{Backoff, SystemClock};
use crate::sys::link::{self, Client, Event, LinkError, LinkOptions, Loop};

/// Input of the edge node task (from the sink task).
#[derive(Debug)]
pub enum SpbMsg {
    /// Outputs of a commit, with their outbox sequence numbers.
    Live(Vec<(u64, OutboxEntry)>),
    /// The counters of the latest `P/metrics`: an NDATA.
    Counters([u64; COUNTERS.len()]),
    /// A reload: the sink's new settings; or drain, then NDEATH and disconnect.
    Control(Control<Box<crate::config::Sink>>),
}

/// Entries published but not yet confirmed, at most (each is one or two messages).
const WINDOW: u16 = 256;
/// Time given to drain at shutdown.
const DRAIN: Duration = Duration::from_secs(3);
/// Never subscribed: its UNSUBACK only says the broker read what came before.
const BARRIER: &str = "$tidemark/barrier";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No session.
    Down,
    /// Connected, waiting for the primary host's STATE online.
    Waiting,
    /// Born: publishing.
    Live,
}

/// The edge node component.
pub struct EdgeSink {
    cfg: crate::config::Sink,
    node: Node,
    client: Client,
    lp: Loop,
    d: Delivery,
    reader: OutboxReader,
    rx: UnboundedReceiver<SpbMsg>,
    delivered: watch::Sender<u64>,
    bd_file: PathBuf,
    phase: Phase,
    /// The primary host's last STATE timestamp (older ones are ignored).
    host_ts: u64,
    counters: [u64; COUNTERS.len()],
    /// Wall time of the births: entries made before it were held (`is_historical`).
    born_at: Millis,
    /// Entries each unanswered barrier confirms, oldest first.
    barriers: VecDeque<usize>,
    /// Entries sent since the last barrier.
    unconfirmed: usize,
    /// Births and node data waiting for room in the link's request queue, in order.
    pending: VecDeque<node::Msg>,
    backoff: Backoff,
    clock: SystemClock,
    /// When the last rebirth request was answered (monotonic ms).
    reborn_at: Option<Millis>,
    registry: std::sync::Arc<crate::run::status::registry::Registry>,
    /// Where each session's counter goes to be journaled.
    core: tokio::sync::mpsc::Sender<crate::run::events::Inbound>,
    /// Outside its proof of the pair's claim the board neither connects nor publishes.
    fence: crate::run::fence::Fence,
}

/// Where `bdSeq` is kept.
pub fn bd_seq_path(state_dir: &Path) -> PathBuf {
    state_dir.join("sparkplug-bdseq")
}

/// The session counter of the next session (`bdSeq` is it mod 256), at least
/// `floor` (the state store's: a standby that took over goes on from the old
/// active's), with the one after it stored durably first (a crash mid-session
/// must not reuse it).
fn next_bd_seq(path: &Path, floor: u64) -> u64 {
    let bd = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0)
        .max(floor);
    let write = || -> std::io::Result<()> {
        let tmp = path.with_extension("new");
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, format!("{}\n", bd + 1).as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    if let Err(e) = write() {
        tracing::error!(path = %path.display(), error = %e, "storing the Sparkplug bdSeq");
    }
    bd
}

fn build(cfg: &crate::config::Sink, node: &Node, now: Millis) -> Result<(Client, Loop), LinkError> {
    let mut endpoint = cfg.endpoint.clone();
    endpoint.client_id = format!("{}-spb", endpoint.client_id);
    let death = node.death(u64::try_from(now).unwrap_or(0));
    link::build(&LinkOptions {
        endpoint: &endpoint,
        v5: cfg.v5,
        persistent: false,
        session_expiry_s: 0,
        manual_acks: false,
        will: Some((death.topic, death.payload)),
        will_retain: false,
        inflight: WINDOW,
    })
}

impl EdgeSink {
    /// An NCMD rebirth: NBIRTH and every DBIRTH again, at most once per
    /// `rebirth_min_interval_ms`; a request inside it is counted, not answered.
    fn rebirth(&mut self) {
        let mono = self.clock.mono();
        let every = self.node.config().rebirth_min_interval_ms;
        if self
            .reborn_at
            .is_some_and(|at| mono.saturating_sub(at) < every)
        {
            let n = self
                .registry
                .rebirths_refused
                .fetch_add(1, Ordering::Relaxed)
                + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    refused = n,
                    "Sparkplug rebirth requests inside sink.sparkplug.rebirth_min_interval_ms are not answered"
                );
            }
            return;
        }
        self.reborn_at = Some(mono);
        tracing::info!("Sparkplug rebirth requested");
        let now = self.now();
        let births = self.node.births(now, &self.counters);
        self.pending.extend(births);
    }

    /// An edge node publishing what `reader` holds; `delivered` says how far it got.
    pub fn new(
        (cfg, node_cfg): (crate::config::Sink, NodeConfig),
        ctx: &Ctx,
        (reader, rx): (OutboxReader, UnboundedReceiver<SpbMsg>),
        (delivered, state_dir): (watch::Sender<u64>, &Path),
        (floor, core): (u64, tokio::sync::mpsc::Sender<crate::run::events::Inbound>),
    ) -> Result<Self, LinkError> {
        let (registry, clock) = (ctx.registry.clone(), ctx.clock);
        let seed = ctx.seed.rotate_left(29);
        let bd_file = bd_seq_path(state_dir);
        let counter = next_bd_seq(&bd_file, floor);
        let _ = core.try_send(crate::run::events::Inbound::Mark(
            crate::journal::Mark::BdSeq(counter + 1),
        ));
        let node = Node::new(node_cfg, counter);
        let (client, lp) = build(&cfg, &node, clock.now().wall)?;
        Ok(Self {
            cfg,
            node,
            client,
            lp,
            d: Delivery::new(None, usize::from(WINDOW), 1),
            reader,
            rx,
            delivered,
            bd_file,
            phase: Phase::Down,
            host_ts: 0,
            counters: [0; COUNTERS.len()],
            born_at: 0,
            barriers: VecDeque::new(),
            unconfirmed: 0,
            pending: VecDeque::new(),
            backoff: Backoff::new(seed),
            clock,
            reborn_at: None,
            registry,
            core,
            fence: ctx.fence.clone(),
        })
    }

    /// Runs until stopped.
    pub async fn run(mut self) {
        let first = first_entry(&self.reader).await;
        self.d = Delivery::new(first, usize::from(WINDOW), 1);
        let mut drain: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        let mut backoff: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        let mut rx_open = true;
        loop {
            let fenced = !self.fence.holds();
            // Births first (thousands of DBIRTHs go as the link takes them), then data.
            if !fenced {
                self.flush_pending();
            }
            if self.phase == Phase::Live && self.pending.is_empty() && !fenced {
                self.fill().await;
            }
            if drain.is_some()
                && self.d.drained()
                && self.barriers.is_empty()
                && self.pending.is_empty()
            {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(super::FENCE_LOOK), if fenced => {}
                ev = self.lp.poll(), if backoff.is_none() && !fenced => match ev {
                    Ok(ev) => self.on_event(ev),
                    Err(e) => {
                        if drain.is_some() {
                            break;
                        }
                        let delay = self.backoff.next_delay();
                        tracing::warn!(cause = %e, retry_in_ms = delay.as_millis() as u64,
                            "Sparkplug edge node disconnected; results kept in the outbox");
                        self.session_over();
                        backoff = Some(Box::pin(tokio::time::sleep(delay)));
                    }
                },
                () = async { if let Some(b) = backoff.as_mut() { b.await } }, if backoff.is_some() => {
                    backoff = None;
                }
                msg = self.rx.recv(), if rx_open => match msg {
                    Some(SpbMsg::Live(list)) => self.d.live(list),
                    Some(SpbMsg::Counters(c)) => {
                        self.counters = c;
                        if self.phase == Phase::Live {
                            let m = self.node.counters(self.now(), &c);
                            self.pending.push_back(m);
                        }
                    }
                    Some(SpbMsg::Control(Control::Reload(cfg))) => {
                        let cfg = *cfg;
                        let moved = cfg.endpoint != self.cfg.endpoint || cfg.v5 != self.cfg.v5;
                        self.cfg = cfg;
                        if moved {
                            self.end_session().await;
                            backoff = None;
                        }
                    }
                    Some(SpbMsg::Control(Control::Stop)) | None => {
                        rx_open = false;
                        if self.phase != Phase::Live {
                            break;
                        }
                        drain = Some(Box::pin(tokio::time::sleep(DRAIN)));
                    }
                },
                () = async { if let Some(d) = drain.as_mut() { d.await } }, if drain.is_some() => break,
            }
        }
        if self.phase != Phase::Down {
            self.say_goodbye().await;
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.clock.now().wall).unwrap_or(0)
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Connected { .. } => {
                self.backoff.reset();
                self.phase = Phase::Waiting;
                let cfg = self.node.config();
                let mut filters = vec![cfg.topic("NCMD", None)];
                filters.extend(cfg.state_topic());
                let _ = self.client.subscribe(&filters, 1);
                tracing::info!(bd_seq = self.node.bd_seq(), node = %cfg.edge_node_id,
                    group = %cfg.group_id, "Sparkplug edge node connected");
                if cfg.primary_host_id.is_none() {
                    self.births();
                }
            }
            Event::Message { topic, payload, .. } => {
                let cfg = self.node.config();
                if cfg.state_topic().as_deref() == Some(topic.as_str()) {
                    let Some((online, ts)) = node::host_state(&payload) else {
                        return;
                    };
                    if ts < self.host_ts {
                        return;
                    }
                    self.host_ts = ts;
                    if online && self.phase == Phase::Waiting {
                        self.births();
                    } else if !online && self.phase == Phase::Live {
                        tracing::info!(host = ?cfg.primary_host_id,
                            "primary host offline: results held in the outbox until it is back");
                        self.host_gone();
                    }
                } else if topic == cfg.topic("NCMD", None)
                    && self.phase == Phase::Live
                    && node::is_rebirth(&payload)
                {
                    self.rebirth();
                }
            }
            Event::UnsubAck => {
                if let Some(n) = self.barriers.pop_front() {
                    let mut upto = None;
                    for _ in 0..n {
                        if let Acked::Delivered(u) = self.d.puback(true) {
                            upto = Some(u);
                        }
                    }
                    if let Some(u) = upto {
                        self.delivered.send_replace(u);
                    }
                }
            }
            _ => {}
        }
    }

    /// A session's NBIRTH and every DBIRTH; publishing (re)starts from the oldest
    /// unconfirmed entry (the last session's barriers are void).
    fn births(&mut self) {
        let now = self.now();
        self.pending.clear();
        let births = self.node.births(now, &self.counters);
        self.pending.extend(births);
        self.born_at = self.clock.now().wall;
        self.phase = Phase::Live;
        self.barriers.clear();
        self.unconfirmed = 0;
        self.d.connected(None);
    }

    /// Hands waiting births and node data to the link while its queue has room.
    fn flush_pending(&mut self) {
        if self.phase == Phase::Down {
            return;
        }
        while let Some(m) = self.pending.front() {
            if self
                .client
                .publish(&m.topic, m.payload.clone(), 0, false)
                .is_err()
            {
                break;
            }
            self.pending.pop_front();
        }
    }

    /// Publishes entries until the window is full, then a barrier behind them.
    async fn fill(&mut self) {
        loop {
            match self.d.next() {
                Next::Publish(seq, e) => {
                    let now = self.now();
                    let msgs = match node::classify(&e.topic, &e.payload) {
                        Entry::Window(w) => self.node.window(&w, now, e.at < self.born_at),
                        Entry::Offline(id) => self.node.offline(&id, now).into_iter().collect(),
                        Entry::Online(id) => self.node.online(&id, now).into_iter().collect(),
                        Entry::Other => Vec::new(),
                    };
                    for m in msgs {
                        if self.client.publish(&m.topic, m.payload, 0, false).is_err() {
                            // Cannot happen within the window (the request queue holds
                            // four times it); the host sees a seq gap and asks for a rebirth.
                            tracing::warn!(seq, "Sparkplug request queue full");
                        }
                    }
                    self.d.sent(seq);
                    self.unconfirmed += 1;
                }
                Next::Read(after) => match read_from(&self.reader, after).await {
                    Ok(v) => self.d.read(v),
                    Err(e) => {
                        tracing::error!(error = %e, "reading the outbox");
                        break;
                    }
                },
                Next::Wait => break,
            }
        }
        if self.unconfirmed > 0 && self.client.unsubscribe(BARRIER).is_ok() {
            self.barriers.push_back(self.unconfirmed);
            self.unconfirmed = 0;
        }
    }

    /// The session is over (the link failed): a new one gets the next `bdSeq`.
    fn session_over(&mut self) {
        self.phase = Phase::Down;
        self.pending.clear();
        self.d.disconnected();
        self.barriers.clear();
        self.unconfirmed = 0;
        let counter = next_bd_seq(&self.bd_file, 0);
        // Into the state store (and to a standby) as well as the file.
        let _ = self.core.try_send(crate::run::events::Inbound::Mark(
            crate::journal::Mark::BdSeq(counter + 1),
        ));
        self.node.new_session(counter);
        let now = self.clock.now().wall;
        match build(&self.cfg, &self.node, now) {
            Ok(link) => (self.client, self.lp) = link,
            Err(e) => tracing::error!(error = %e, "the Sparkplug link cannot be built again"),
        }
    }

    /// NDEATH, then a clean disconnect (Sparkplug: a deliberate end is announced).
    async fn say_goodbye(&mut self) {
        let death = self.node.death(self.now());
        let _ = self.client.publish(&death.topic, death.payload, 1, false);
        let _ = self.client.disconnect();
        let _ = tokio::time::timeout(Duration::from_millis(1000), async {
            while self.lp.poll().await.is_ok() {}
        })
        .await;
    }

    /// The primary host went offline: end the session; the next one waits for it.
    fn host_gone(&mut self) {
        let death = self.node.death(self.now());
        let _ = self.client.publish(&death.topic, death.payload, 1, false);
        let _ = self.client.disconnect();
        // The loop reports the closed connection, which starts the next session.
        self.pending.clear();
        self.phase = Phase::Waiting;
        self.d.disconnected();
    }

    /// A reload changed the link: end this session; a new one starts.
    async fn end_session(&mut self) {
        if self.phase != Phase::Down {
            self.say_goodbye().await;
        }
        self.session_over();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_counter_goes_on_from_the_file_or_the_state_store_whichever_is_further() {
        let dir = tempfile::tempdir().unwrap();
        let path = bd_seq_path(dir.path());
        assert_eq!(next_bd_seq(&path, 0), 0);
        assert_eq!(next_bd_seq(&path, 0), 1);
        // A board that took over: the old active's counter from the replicated state.
        assert_eq!(next_bd_seq(&path, 300), 300);
        assert_eq!(next_bd_seq(&path, 0), 301);
        let cfg = NodeConfig {
            group_id: "g".into(),
            edge_node_id: "n".into(),
            primary_host_id: None,
            rebirth_min_interval_ms: 5_000,
        };
        assert_eq!(Node::new(cfg, 301).bd_seq(), 301 % 256);
    }
}
