//! Hot standby on the site broker (SPEC §13): the pair's own link, the
//! election at start, the active's replication task, and the standby's loop
//! that follows the active's records until it takes over. The rules are pure,
//! in [`crate::pair`]; this is their I/O.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::error::RunError;
use super::events::{AckJob, Notice, PairCommit};
use super::registry::Registry;
use super::sink::SinkMsg;
use crate::config::{Config, Standby};
use crate::engine::Engine;
use crate::model::Millis;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::pair::auth::{self, Sealer};
use crate::pair::{
    Assembler, Beat, Change, Claim, Gate, Kind, PeerStateName, PeerStatus, Position, Report, Role,
    Status, Step, Topics, frames,
};
use crate::store::Store;
use crate::store::wal::Wal;
use crate::sys::clock::SystemClock;
use crate::sys::link::{self, Client, Event, LinkOptions};

/// Beats go out this often.
const BEAT_MS: Millis = 1_000;
/// Our own beat came back this recently: the path to the site broker works.
const PATH_PROVEN_MS: Millis = 3_000;
/// Time given to a claim to come back from the broker.
const CLAIM_ECHO_MS: u64 = 3_000;
/// At a clean stop, time given to the standby to report the last commit.
const STOP_WAIT_MS: u64 = 2_000;
/// Time after the echo of a claim in which a rival claim still counts.
const CLAIM_SETTLE_MS: u64 = 500;
/// A gap between two ticks longer than this is a stall of the board itself.
const STALL_MS: Millis = 1_500;
/// Time given to the retained claim to arrive after subscribing.
const CLAIM_WAIT_MS: u64 = 1_500;

/// What the pair's link reports.
#[derive(Debug)]
pub enum PairEvent {
    /// Connected and subscribed for the current role.
    Up,
    /// The connection dropped (it reconnects).
    Down,
    /// A message: topic, payload.
    Msg(String, bytes::Bytes),
}

/// The board's own session on the site broker for the pair's topics; its will
/// is a `dead` beat. Everything it sends is sealed with the pair key and its
/// session; everything it passes on was opened and found fresh
/// ([`crate::pair::auth`]); the rest is counted and dropped.
pub struct PairLink {
    client: Client,
    events: mpsc::UnboundedReceiver<PairEvent>,
    role: watch::Sender<Role>,
    task: JoinHandle<()>,
    topics: Topics,
    node: String,
    inst: u64,
    sealer: Arc<std::sync::Mutex<Sealer>>,
    /// Messages refused since start.
    pub rejected: Arc<AtomicU64>,
}

/// Refusals are logged at most this often.
const REFUSAL_LOG_MS: Millis = 60_000;

impl PairLink {
    /// Connects (in the background, retrying) as `role`.
    pub fn open(cfg: &Config, sb: &Standby, role: Role, inst: u64) -> Result<Self, RunError> {
        let topics = Topics::new(cfg.gateway.id.as_ref());
        let mut endpoint = cfg.source.endpoint.clone();
        endpoint.client_id = format!("{}-pair-{}", endpoint.client_id, sb.node);
        let will_body = serde_json::to_vec(&Beat {
            node: sb.node.clone(),
            role,
            epoch: 0,
            pos: 0,
            inst,
            dead: true,
            sent: 0,
        })
        .unwrap_or_default();
        let beat_topic = topics.beat(&sb.node);
        let sealer = Arc::new(std::sync::Mutex::new(Sealer::new(
            sb.keys.clone(),
            &sb.node,
            auth::random_nonce(),
        )));
        let will = lock(&sealer).seal_will(&beat_topic, &will_body);
        let (client, mut lp) = link::build(&LinkOptions {
            endpoint: &endpoint,
            v5: cfg.source.v5,
            persistent: false,
            session_expiry_s: 0,
            manual_acks: false,
            will: Some((beat_topic.clone(), will)),
            will_retain: false,
            inflight: 64,
        })?;
        let (tx, events) = mpsc::unbounded_channel();
        let (role_tx, mut role_rx) = watch::channel(role);
        let rejected = Arc::new(AtomicU64::new(0));
        let mut gate = Opener {
            keys: sb.keys.clone(),
            node: sb.node.clone(),
            topics: topics.clone(),
            max: sb.max_frame,
            sessions: auth::Sessions::default(),
            sealer: sealer.clone(),
            rejected: rejected.clone(),
            logged: None,
            clock: SystemClock::new(),
        };
        gate.sessions.set_mine(lock(&sealer).nonce());
        let t = topics.clone();
        let c = client.clone();
        let task = tokio::spawn(async move {
            let filters = |r: Role| match r {
                Role::Standby => vec![t.state(), t.beats(), t.stream()],
                Role::Active => vec![t.state(), t.beats(), t.reports()],
            };
            let mut subscribed = *role_rx.borrow_and_update();
            loop {
                tokio::select! {
                    ev = lp.poll() => match ev {
                        Ok(Event::Connected { .. }) => {
                            subscribed = *role_rx.borrow_and_update();
                            let _ = c.subscribe(&filters(subscribed), 1);
                        }
                        Ok(Event::Subscribed { .. }) => {
                            let _ = tx.send(PairEvent::Up);
                        }
                        Ok(Event::Message { topic, payload, .. }) => {
                            let Some(body) = gate.open(&topic, &payload) else { continue };
                            if tx.send(PairEvent::Msg(topic, body)).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "pair link");
                            if tx.send(PairEvent::Down).is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            // A new connection is a new session, with a will of its own.
                            let nonce = auth::random_nonce();
                            let will = {
                                let mut s = lock(&gate.sealer);
                                s.new_session(nonce);
                                s.seal_will(&beat_topic, &will_body)
                            };
                            gate.sessions.set_mine(nonce);
                            lp.set_will(&beat_topic, will);
                        }
                    },
                    r = role_rx.changed() => {
                        if r.is_err() {
                            return;
                        }
                        let now = *role_rx.borrow_and_update();
                        if now != subscribed {
                            for f in filters(subscribed) {
                                if !filters(now).contains(&f) {
                                    let _ = c.unsubscribe(&f);
                                }
                            }
                            let _ = c.subscribe(&filters(now), 1);
                            subscribed = now;
                        }
                    }
                }
            }
        });
        Ok(Self {
            client,
            events,
            role: role_tx,
            task,
            topics,
            node: sb.node.clone(),
            inst,
            sealer,
            rejected,
        })
    }

    /// `body` sealed for `topic`, as this session's next message.
    fn sealed(&self, topic: &str, body: &[u8]) -> Vec<u8> {
        lock(&self.sealer).seal(topic, body)
    }

    fn beat(&self, role: Role, (epoch, pos): (u64, u64), dead: bool, sent: Millis) {
        let b = Beat {
            node: self.node.clone(),
            role,
            epoch,
            pos,
            inst: self.inst,
            dead,
            sent,
        };
        let topic = self.topics.beat(&self.node);
        let body = self.sealed(&topic, &serde_json::to_vec(&b).unwrap_or_default());
        let _ = self.client.publish(&topic, body, 0, false);
    }

    /// A report of this (standby) board.
    fn report(&self, r: &Report) {
        let topic = self.topics.report(&self.node);
        let body = self.sealed(&topic, &serde_json::to_vec(r).unwrap_or_default());
        let _ = self.client.publish(&topic, body, 0, false);
    }

    /// Publishes this board's claim (retained) and waits until the broker sends
    /// it back (from then on the broker holds it), then a moment more: two boards
    /// claiming at once both see both claims, and the one [`Claim::beats`] picks stands.
    async fn claim(&mut self, claim: &Claim) -> Claimed {
        let topic = self.topics.state();
        let body = self.sealed(&topic, &serde_json::to_vec(claim).unwrap_or_default());
        if self.client.publish(&topic, body, 1, true).is_err() {
            return Claimed::NoEcho;
        }
        let deadline = tokio::time::sleep(Duration::from_millis(CLAIM_ECHO_MS));
        tokio::pin!(deadline);
        let settle = tokio::time::sleep(Duration::from_millis(CLAIM_SETTLE_MS));
        tokio::pin!(settle);
        let mut echoed = false;
        let mut rival: Option<Claim> = None;
        loop {
            let ev = tokio::select! {
                () = &mut deadline, if !echoed => break,
                () = &mut settle, if echoed => break,
                ev = self.events.recv() => ev,
            };
            match ev {
                Some(PairEvent::Msg(topic, payload)) if topic == self.topics.state() => {
                    let Ok(c) = serde_json::from_slice::<Claim>(&payload) else {
                        continue;
                    };
                    if &c == claim {
                        if !echoed {
                            echoed = true;
                            settle.set(tokio::time::sleep(Duration::from_millis(CLAIM_SETTLE_MS)));
                        }
                    } else if c.beats(claim) && rival.as_ref().is_none_or(|r| c.beats(r)) {
                        rival = Some(c);
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        match (echoed, rival) {
            (_, Some(r)) => Claimed::Superseded(r),
            (true, None) => Claimed::Held,
            (false, None) => Claimed::NoEcho,
        }
    }

    /// A clean DISCONNECT (no will), then the link is gone.
    pub async fn close(self, step_down: Option<(u64, u64)>) {
        if let Some((epoch, pos)) = step_down {
            // A clean stop of the active: the standby takes over without waiting takeover_s.
            self.beat(Role::Active, (epoch, pos), true, 0);
        }
        let _ = self.client.disconnect();
        let task = self.task;
        if tokio::time::timeout(Duration::from_millis(1000), async {
            let mut t = task;
            let _ = (&mut t).await;
        })
        .await
        .is_err()
        {
            tracing::debug!("pair link did not close in time");
        }
    }
}

/// (beat interval, how long a proof holds) for `takeover_ms`: the standby takes
/// over no sooner than `takeover_ms` after it last heard this board, so a proof
/// from a beat sent at t holds until t + `takeover_ms` less a margin of a quarter
/// (at least two beats).
fn proof_times(takeover_ms: Millis) -> (Millis, Millis) {
    let beat = (takeover_ms / 5).clamp(100, BEAT_MS);
    let margin = (takeover_ms / 4).max(2 * beat);
    (beat, takeover_ms.saturating_sub(margin).max(beat))
}

fn lock(s: &std::sync::Mutex<Sealer>) -> std::sync::MutexGuard<'_, Sealer> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The link's receiving side: what comes in is opened, checked for freshness
/// and bounded before anything else sees it.
struct Opener {
    keys: auth::Keys,
    node: String,
    topics: Topics,
    max: usize,
    sessions: auth::Sessions,
    sealer: Arc<std::sync::Mutex<Sealer>>,
    rejected: Arc<AtomicU64>,
    logged: Option<Millis>,
    clock: SystemClock,
}

impl Opener {
    /// The body of a genuine, fresh message; None (counted) for anything else.
    fn open(&mut self, topic: &str, payload: &[u8]) -> Option<bytes::Bytes> {
        let checked = if payload.len() > self.max {
            Err(auth::Refusal::TooLarge)
        } else {
            auth::open(&self.keys, topic, payload).and_then(|m| {
                // Beats and reports name their sender in the topic too.
                if self.topics.node_of(topic).is_some_and(|n| n != m.node) {
                    return Err(auth::Refusal::Forged);
                }
                if m.node != self.node {
                    // Heard, even if stale: a peer that restarted learns our session.
                    lock(&self.sealer).heard(m.nonce);
                }
                // A retained claim is from an earlier session by nature: its epoch orders it.
                if topic != self.topics.state() {
                    self.sessions.accept(&self.node, &m)?;
                }
                Ok(m.body)
            })
        };
        match checked {
            Ok(body) => Some(bytes::Bytes::copy_from_slice(body)),
            Err(why) if topic == self.topics.state() => {
                self.refused(topic, why);
                // Passed on as no claim at all: the active publishes its own again.
                Some(bytes::Bytes::new())
            }
            Err(why) => {
                self.refused(topic, why);
                None
            }
        }
    }

    /// Counts a refusal; logs at most once a minute.
    fn refused(&mut self, topic: &str, why: auth::Refusal) {
        let n = self.rejected.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.clock.mono();
        if self
            .logged
            .is_none_or(|t| now.saturating_sub(t) >= REFUSAL_LOG_MS)
        {
            self.logged = Some(now);
            tracing::warn!(%topic, why = why.as_str(), rejected = n,
                "pair: a message on the pair's topics refused (not from this pair, or replayed); nothing done");
        }
    }
}

/// What became of a claim.
enum Claimed {
    /// The broker holds it and no other board's claim beats it.
    Held,
    /// Another board's claim beats it.
    Superseded(Claim),
    /// The broker did not send it back in time.
    NoEcho,
}

/// How a board starts: the retained claim decides.
pub enum Start {
    /// Active under this epoch.
    Active(Activation),
    /// Another board is active (the claim, when one was seen): follow it.
    Standby(PairLink, Option<Claim>),
}

/// What an active board's run knows of the pair.
pub struct Activation {
    /// The pair's link.
    pub link: PairLink,
    /// The epoch claimed.
    pub epoch: u64,
    /// After a takeover: the board replaced and the position taken over.
    pub from: Option<(String, u64)>,
    /// Silence after which the standby is lost.
    pub takeover_ms: Millis,
    /// Monotonic time just before the claim that made this board active was
    /// published: the first proof of the claim.
    pub proven_at: Millis,
}

impl Activation {
    /// The pair as it stands before the replication task runs (the sink's will names the epoch).
    pub fn show(&self, registry: &Registry) {
        if let Ok(mut p) = registry.pair.lock() {
            *p = Some(Status {
                node: self.link.node.clone(),
                role: Role::Active,
                epoch: self.epoch,
                lag_records: 0,
                lag_ms: 0,
                rejected: self.link.rejected.load(Ordering::Relaxed),
                peer: PeerStatus {
                    node: String::new(),
                    state: PeerStateName::Lost,
                    last_seen: None,
                },
            });
        }
    }
}

/// At start: the retained claim names another board (follow it) or none or
/// this one (claim the next epoch).
pub async fn elect(cfg: &Config, sb: &Standby, inst: u64) -> Result<Start, RunError> {
    let mut link = PairLink::open(cfg, sb, Role::Standby, inst)?;
    // Connected and subscribed first (the broker may be down: wait for it).
    loop {
        match link.events.recv().await {
            Some(PairEvent::Up) => break,
            Some(_) => {}
            None => return Err(RunError::Pair("pair link ended".into())),
        }
    }
    let state = link.topics.state();
    let mut seen: Option<Claim> = None;
    let deadline = tokio::time::sleep(Duration::from_millis(CLAIM_WAIT_MS));
    tokio::pin!(deadline);
    loop {
        let ev = tokio::select! {
            () = &mut deadline => break,
            ev = link.events.recv() => ev,
        };
        let Some(ev) = ev else { break };
        if let PairEvent::Msg(topic, payload) = ev
            && topic == state
            && let Ok(c) = serde_json::from_slice::<Claim>(&payload)
        {
            seen = Some(c);
            break;
        }
    }
    match seen {
        Some(c) if c.node != sb.node => {
            tracing::info!(active = %c.node, epoch = c.epoch, node = %sb.node, "pair: another board is active; this one follows it as standby");
            Ok(Start::Standby(link, Some(c)))
        }
        other => {
            let Some(epoch) = other.map_or(0, |c| c.epoch).checked_add(1) else {
                return Err(RunError::Pair("the pair's epoch is exhausted".into()));
            };
            let clock = SystemClock::new();
            let proven_at = clock.mono();
            let claim = Claim {
                node: sb.node.clone(),
                epoch,
                at: clock.now().wall,
            };
            match link.claim(&claim).await {
                Claimed::Held => {}
                Claimed::Superseded(c) => {
                    tracing::info!(active = %c.node, epoch = c.epoch, node = %sb.node, "pair: another board claimed the gateway at the same time; this one follows it as standby");
                    return Ok(Start::Standby(link, Some(c)));
                }
                Claimed::NoEcho => {
                    return Err(RunError::Pair(
                        "the claim did not come back from the site broker".into(),
                    ));
                }
            }
            tracing::info!(node = %sb.node, epoch, "pair: this board is active");
            Ok(Start::Active(Activation {
                link,
                epoch,
                from: None,
                takeover_ms: sb.takeover_ms,
                proven_at,
            }))
        }
    }
}

/// The active's replication task: each commit's record to the standby, its
/// acks held until the standby reports it synced.
pub struct ActivePair {
    link: PairLink,
    epoch: u64,
    stream: u64,
    gate: Gate<(u64, crate::sys::link::Held, Millis)>,
    commits: mpsc::UnboundedReceiver<PairCommit>,
    acks: mpsc::UnboundedSender<AckJob>,
    snapshots: watch::Sender<u64>,
    sink: mpsc::UnboundedSender<SinkMsg>,
    registry: Arc<Registry>,
    clock: SystemClock,
    deposed: mpsc::UnboundedSender<RunError>,
    own: Claim,
    /// This board's proof of the claim (the fence of its source, sink and acks).
    proof: super::fence::Proof,
    /// How long a proof holds: `takeover_s` less a margin.
    valid_ms: Millis,
    /// Beats go out this often.
    beat_ms: Millis,
    /// Proofs from before this (a stall, a lost link) do not count.
    revoked_at: Millis,
    /// Acks released while the proof was not fresh: they go once it is again.
    fenced: Vec<(u64, crate::sys::link::Held, Millis)>,
    /// A newer claim of another board was seen: nothing is proven any more.
    deposed_by: Option<Claim>,
    /// When the claim was last published again.
    reasserted: Option<Millis>,
}

/// What the active's pair task is wired to.
pub struct ActiveLinks {
    /// Commits from the store thread.
    pub commits: mpsc::UnboundedReceiver<PairCommit>,
    /// Acks to the source.
    pub acks: mpsc::UnboundedSender<AckJob>,
    /// Snapshot requests to the core.
    pub snapshots: watch::Sender<u64>,
    /// Alerts.
    pub sink: mpsc::UnboundedSender<SinkMsg>,
    /// Status.
    pub registry: Arc<Registry>,
    /// A newer claim: this board must stop publishing.
    pub deposed: mpsc::UnboundedSender<RunError>,
    /// The fence of this board's source, sink and acks.
    pub proof: super::fence::Proof,
}

impl ActivePair {
    /// The task for `a`, on a stream of its own.
    pub fn new(a: Activation, links: ActiveLinks, clock: SystemClock, stream: u64) -> Self {
        let _ = a.link.role.send(Role::Active);
        let own = Claim {
            node: a.link.node.clone(),
            epoch: a.epoch,
            at: 0,
        };
        if let Some((from, position)) = &a.from {
            let _ = links.sink.send(SinkMsg::Notice(Notice::Takeover {
                node: own.node.clone(),
                from: from.clone(),
                epoch: a.epoch,
                position: *position,
                at: clock.now().wall,
            }));
        }
        let (beat_ms, valid_ms) = proof_times(a.takeover_ms);
        links.proof.proven(a.proven_at, valid_ms);
        Self {
            gate: Gate::new(stream.max(1), a.takeover_ms),
            proof: links.proof,
            valid_ms,
            beat_ms,
            revoked_at: 0,
            fenced: Vec::new(),
            deposed_by: None,
            reasserted: None,
            epoch: a.epoch,
            stream: stream.max(1),
            link: a.link,
            commits: links.commits,
            acks: links.acks,
            snapshots: links.snapshots,
            sink: links.sink,
            registry: links.registry,
            clock,
            deposed: links.deposed,
            own,
        }
    }

    /// Runs until the store thread's last commit (or the gateway is dropped).
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_beat = 0;
        let mut last_tick = self.clock.mono();
        self.status();
        loop {
            tokio::select! {
                c = self.commits.recv() => match c {
                    Some(c) => {
                        let last = c.last;
                        self.commit(c).await;
                        if last {
                            break;
                        }
                    }
                    None => break,
                },
                Some(ev) = self.link.events.recv() => self.event(ev),
                _ = tick.tick() => {
                    let now = self.clock.now();
                    if now.mono.saturating_sub(last_tick) > STALL_MS {
                        // This board stalled: the claim may have moved meanwhile.
                        tracing::warn!(stalled_ms = now.mono - last_tick, "pair: this board stalled; no ack, session or publish until the pair's claim is read again");
                        self.revoke(now.mono);
                    }
                    last_tick = now.mono;
                    if self.proof.holds_at(now.mono) {
                        // Only a silence this board lived through with its proof counts.
                        let (released, change) = self.gate.tick(now.mono);
                        self.release(released);
                        self.changed(change);
                        let fenced = std::mem::take(&mut self.fenced);
                        self.release(fenced);
                    }
                    if now.mono >= next_beat {
                        next_beat = now.mono + self.beat_ms;
                        self.link.beat(Role::Active, (self.epoch, self.gate.pos()), false, now.mono);
                    }
                    self.status();
                }
            }
        }
        // The last commit's acks too wait for the standby's report, a short while.
        let wait = tokio::time::sleep(Duration::from_millis(STOP_WAIT_MS));
        tokio::pin!(wait);
        while self.gate.lag_records() > 0 {
            tokio::select! {
                () = &mut wait => break,
                ev = self.link.events.recv() => match ev {
                    Some(ev) => self.event(ev),
                    None => break,
                },
            }
        }
        let rest = self.gate.release_all();
        self.release(rest);
        let fenced = std::mem::take(&mut self.fenced);
        self.release(fenced);
        self.proof.revoke();
        let _ = self.acks.send(AckJob::Done);
        let pos = self.gate.pos();
        self.link.close(Some((self.epoch, pos))).await;
    }

    async fn commit(&mut self, c: PairCommit) {
        let mono = self.clock.mono();
        let stream_topic = self.link.topics.stream();
        if let Some(snap) = &c.snapshot {
            tracing::info!(
                bytes = snap.len(),
                pos = c.pos,
                "pair: snapshot to the standby"
            );
            for f in frames(Kind::Snapshot, self.epoch, self.stream, c.pos, snap) {
                let f = self.link.sealed(&stream_topic, &f);
                self.sent(f.len());
                let _ = self.link.client.publish_wait(&stream_topic, f, 1).await;
            }
            self.gate.snapshot_sent(c.pos, mono);
        } else if self.gate.publishing() {
            for f in frames(Kind::Record, self.epoch, self.stream, c.pos, &c.body) {
                let f = self.link.sealed(&stream_topic, &f);
                self.sent(f.len());
                let _ = self.link.client.publish_wait(&stream_topic, f, 1).await;
            }
        }
        let released = self.gate.committed(c.pos, c.acks, mono);
        self.release(released);
    }

    fn event(&mut self, ev: PairEvent) {
        let now = self.clock.now();
        let (topic, payload) = match ev {
            PairEvent::Msg(topic, payload) => (topic, payload),
            PairEvent::Down => {
                // The link is gone (its will may be out): nothing is proven until it is back.
                self.revoke(now.mono);
                return;
            }
            PairEvent::Up => return,
        };
        if topic == self.link.topics.state() {
            let claim = serde_json::from_slice::<Claim>(&payload).ok();
            if claim
                .as_ref()
                .is_none_or(|c| c.node != self.own.node && !c.beats(&self.own))
            {
                // The retained claim was overwritten (an older claim replayed, or garbage
                // that failed its check): this board's goes back, so a board that starts
                // now elects from the truth.
                self.reassert(now.mono);
                return;
            }
            if let Some(c) = claim
                && c.node != self.own.node
                && c.beats(&self.own)
            {
                tracing::warn!(active = %c.node, epoch = c.epoch, own_epoch = self.epoch,
                    "pair: another board claims the gateway with a newer epoch; this one stops publishing and rejoins as standby");
                self.proof.revoke();
                self.fenced.clear();
                self.deposed_by = Some(c.clone());
                let _ = self.deposed.send(RunError::Deposed {
                    node: c.node,
                    epoch: c.epoch,
                });
            }
            return;
        }
        let Some(node) = self.link.topics.node_of(&topic).map(str::to_string) else {
            return;
        };
        if topic == self.link.topics.report(&node) {
            if node == self.own.node {
                return;
            }
            let Ok(r) = serde_json::from_slice::<Report>(&payload) else {
                return;
            };
            let (released, change, want) = self.gate.report(&r, now.mono, now.wall);
            self.release(released);
            self.changed(change);
            if want {
                tracing::info!(standby = %r.node, "pair: the standby asks for a snapshot");
                self.snapshots.send_modify(|n| *n += 1);
            }
        } else if let Ok(b) = serde_json::from_slice::<Beat>(&payload) {
            if node == self.own.node {
                if b.inst != self.link.inst && !b.dead {
                    tracing::error!(node = %node, "pair: another process runs with this board's standby.node; give each board its own");
                } else if b.inst == self.link.inst
                    && !b.dead
                    && b.epoch == self.epoch
                    && b.sent >= self.revoked_at
                    && self.deposed_by.is_none()
                {
                    // Our own beat came back with no newer claim before it: the claim
                    // is ours as of when it was sent.
                    let was = self.proof.holds_at(now.mono);
                    self.proof.proven(b.sent, self.valid_ms);
                    if !was && self.proof.holds_at(now.mono) {
                        tracing::info!(
                            "pair: the claim is this board's again; acks and sessions resume"
                        );
                        self.gate.resume(now.mono);
                    }
                }
            } else if b.dead {
                let (released, change) = self.gate.gone(&node);
                self.release(released);
                self.changed(change);
            } else {
                self.gate.heard(&node, now.mono, now.wall);
            }
        }
    }

    fn sent(&self, bytes: usize) {
        self.registry.pair_bytes.fetch_add(
            u64::try_from(bytes).unwrap_or(0),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Publishes this board's claim again (retained), at most once a second.
    fn reassert(&mut self, mono: Millis) {
        if self.deposed_by.is_some()
            || self
                .reasserted
                .is_some_and(|t| mono.saturating_sub(t) < 1_000)
        {
            return;
        }
        self.reasserted = Some(mono);
        tracing::warn!(
            "pair: the retained claim is not this board's current one; publishing it again"
        );
        let topic = self.link.topics.state();
        let own = Claim {
            at: self.clock.now().wall,
            ..self.own.clone()
        };
        let body = self
            .link
            .sealed(&topic, &serde_json::to_vec(&own).unwrap_or_default());
        let _ = self.link.client.publish(&topic, body, 1, true);
    }

    /// Nothing is proven from `mono` on (a stall, the link lost).
    fn revoke(&mut self, mono: Millis) {
        self.revoked_at = mono;
        self.proof.revoke();
    }

    fn release(&mut self, acks: Vec<(u64, crate::sys::link::Held, Millis)>) {
        if acks.is_empty() || self.deposed_by.is_some() {
            return;
        }
        let now = self.clock.mono();
        if !self.proof.holds_at(now) {
            // Held until the claim is proven again; dropped if deposed meanwhile.
            self.fenced.extend(acks);
            return;
        }
        for (_, _, at) in &acks {
            self.registry.ack_delay.observe(now.saturating_sub(*at));
        }
        let _ = self.acks.send(AckJob::Acks(
            acks.into_iter().map(|(g, h, _)| (g, h)).collect(),
        ));
    }

    fn changed(&self, change: Option<Change>) {
        let at = self.clock.now().wall;
        let notice = match change {
            None => return,
            Some(Change::Joined(node)) => {
                tracing::info!(standby = %node, "pair: the standby has every record; acks wait for it");
                Notice::StandbyJoined { node, at }
            }
            Some(Change::Lost(node)) => {
                tracing::warn!(standby = %node, "pair: the standby is lost; this board runs alone");
                Notice::StandbyLost { node, at }
            }
        };
        let _ = self.sink.send(SinkMsg::Notice(notice));
    }

    fn status(&self) {
        let mono = self.clock.mono();
        let s = Status {
            node: self.own.node.clone(),
            role: Role::Active,
            epoch: self.epoch,
            lag_records: self.gate.lag_records(),
            lag_ms: u64::try_from(self.gate.lag_ms(mono)).unwrap_or(0),
            rejected: self.link.rejected.load(Ordering::Relaxed),
            peer: PeerStatus {
                node: self.gate.peer_node().to_string(),
                state: PeerStateName::from(self.gate.peer()),
                last_seen: self.gate.last_seen_wall(),
            },
        };
        if let Ok(mut p) = self.registry.pair.lock() {
            *p = Some(s);
        }
    }
}

/// The replicated state on the standby's disk and in its engine.
struct Replica {
    durable: super::storer::Durable,
    engine: Engine,
    in_force: Vec<u8>,
}

/// Opens the state dir exactly as it is: no new clock origin, no reload (a
/// standby's engine must stay the active's, record for record).
fn open_replica(cfg: &Config) -> Result<Replica, RunError> {
    let (durable, engine, in_force) = super::restore::open_state(cfg)?;
    Ok(Replica {
        durable,
        engine,
        in_force,
    })
}

/// The standby's note that its state file is the active's, in sync as of its last
/// record (epoch, stream, position): after a power cut of both boards the former
/// standby takes over from its own disk (README "Two boards, one gateway").
fn synced_marker(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("pair-synced")
}

fn mark_synced(dir: &std::path::Path, p: &Position) {
    use std::io::Write;
    let tmp = dir.join("pair-synced.new");
    let done = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "{} {} {}", p.epoch, p.stream, p.pos)?;
        f.sync_all()?;
        std::fs::rename(&tmp, synced_marker(dir))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(e) = done {
        tracing::warn!(error = %e, "pair: cannot note the replica as in sync; after a power cut of both boards this one would wait for the other");
    }
}

fn unmark_synced(dir: &std::path::Path) {
    match std::fs::remove_file(synced_marker(dir)) {
        Ok(()) => {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(error = %e, "pair: cannot remove the in-sync note"),
    }
}

/// This board is the active now: its disk is no standby's replica any more.
pub fn activated(cfg: &Config) {
    unmark_synced(&cfg.gateway.state_dir);
}

fn read_synced(dir: &std::path::Path) -> Option<Position> {
    let text = std::fs::read_to_string(synced_marker(dir)).ok()?;
    let mut n = text.split_whitespace().map(|w| w.parse::<u64>().ok());
    Some(Position {
        epoch: n.next()??,
        stream: n.next()??,
        pos: n.next()??,
    })
}

/// Replaces the state dir's state with the active's snapshot, once it has been
/// opened and read whole as a state file in a side file (false: it was not one;
/// nothing on disk changed).
fn install(cfg: &Config, replica: &mut Option<Replica>, bytes: &[u8]) -> Result<bool, RunError> {
    use std::io::Write;
    let dir = &cfg.gateway.state_dir;
    std::fs::create_dir_all(dir)?;
    let part = dir.join("tidemark.redb.part");
    {
        let mut f = std::fs::File::create(&part)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    if let Err(e) = crate::store::verify_file(&part) {
        tracing::warn!(error = %e, bytes = bytes.len(), "pair: the snapshot is not a state file this board can open; keeping its own state and asking again");
        let _ = std::fs::remove_file(&part);
        return Ok(false);
    }
    drop(replica.take());
    unmark_synced(dir);
    match std::fs::remove_file(Wal::file(dir)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    std::fs::rename(&part, Store::file(dir))?;
    std::fs::File::open(dir)?.sync_all()?;
    *replica = Some(open_replica(cfg)?);
    Ok(true)
}

/// How the standby's loop ended.
pub enum Followed {
    /// The active is dead: this board is active now.
    Takeover(Activation),
    /// The gateway is stopping.
    Stopped,
}

/// The standby: follows the active's records into its own state dir, reports
/// its position, and takes over when the active is dead (its will, or
/// `takeover_s` of silence while this board's own path is proven).
pub async fn follow(
    cfg: &Config,
    sb: &Standby,
    mut link: PairLink,
    mut claim: Option<Claim>,
    clock: SystemClock,
    shutdown: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> Result<Followed, RunError> {
    // The status endpoint answers from the replicated engine (SPEC §13: the standby shows its lag).
    let registry = Arc::new(Registry::new(
        Arc::new(super::health::Health::new(clock)),
        0,
        0,
        cfg.hash(),
    ));
    let (queries_tx, mut queries) = mpsc::channel::<super::events::Inbound>(64);
    let (http_stop_tx, http_stop) = watch::channel(false);
    let http = match cfg.metrics.listen {
        Some(addr) => Some(
            super::reload::Http::bind(addr)
                .await
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        None => None,
    };
    let http = super::reload::Http::start(
        http,
        &cfg.metrics,
        (registry.clone(), queries_tx),
        http_stop,
    );
    let empty = Engine::new(&cfg.engine);
    let result = follow_loop(
        cfg,
        sb,
        &mut link,
        &mut claim,
        clock,
        &registry,
        &mut queries,
        &empty,
        shutdown,
    )
    .await;
    let _ = http_stop_tx.send(true);
    http.abort();
    http.finished().await;
    match result {
        Ok(Some(t)) => Ok(Followed::Takeover(Activation {
            link,
            epoch: t.epoch,
            from: t.from,
            takeover_ms: t.takeover_ms,
            proven_at: t.proven_at,
        })),
        Ok(None) => Ok(Followed::Stopped),
        Err(e) => Err(e),
    }
}

/// A takeover's activation without its link (the caller adds it).
struct Taken {
    epoch: u64,
    from: Option<(String, u64)>,
    takeover_ms: Millis,
    proven_at: Millis,
}

#[allow(clippy::too_many_arguments)]
async fn follow_loop(
    cfg: &Config,
    sb: &Standby,
    link: &mut PairLink,
    claim: &mut Option<Claim>,
    clock: SystemClock,
    registry: &Arc<Registry>,
    queries: &mut mpsc::Receiver<super::events::Inbound>,
    empty: &Engine,
    shutdown: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> Result<Option<Taken>, RunError> {
    let _ = link.role.send(Role::Standby);
    let topics = link.topics.clone();
    let mut asm = Assembler::bounded(sb.max_frame);
    let mut position = Position::default();
    let mut replica: Option<Replica> = None;
    let mut want = true;
    // A replica in sync when this board last stopped: it may take over from it
    // while nothing of the active is heard (both boards lost power together).
    let mut resumed = false;
    let dir = cfg.gateway.state_dir.clone();
    if let Some(at) = read_synced(&dir) {
        match tokio::task::block_in_place(|| open_replica(cfg)) {
            Ok(r) => {
                tracing::info!(
                    epoch = at.epoch,
                    position = at.pos,
                    "pair: this board's replica was in sync when it stopped"
                );
                replica = Some(r);
                resumed = true;
                position.epoch = at.epoch;
                position.pos = at.pos;
            }
            Err(e) => {
                tracing::warn!(error = %e, "pair: the replica on disk does not open; asking the active for its state")
            }
        }
    }
    let start = clock.mono();
    let mut active_seen = start;
    let mut active_seen_wall: Option<Millis> = None;
    let mut active_dead = false;
    let mut active_pos = 0u64;
    let mut own_echo: Option<Millis> = None;
    let mut next_beat = 0;
    let mut next_warn = start + sb.takeover_ms;
    let start_wall = clock.now().wall;
    let mut last_applied: Option<Millis> = None;
    // Since when the active is ahead of this board (its beats name its last commit).
    let mut behind_since: Option<Millis> = None;
    let report = |link: &PairLink, position: &Position, want: bool| {
        link.report(&Report {
            node: sb.node.clone(),
            stream: position.stream,
            pos: position.pos,
            want,
        });
    };
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = start;
    tracing::info!(node = %sb.node, "pair: standby; asking the active for its state");
    loop {
        tokio::select! {
            () = &mut *shutdown => return Ok(None),
            Some(q) = queries.recv() => {
                if let super::events::Inbound::Query(q, reply) = q {
                    let engine = replica.as_ref().map_or(empty, |r| &r.engine);
                    let links = super::api::Links {
                        source_up: false,
                        source_since: start_wall,
                        last_commit_at: last_applied,
                        proven: own_echo.unwrap_or(start),
                    };
                    let _ = reply.send(super::api::answer(engine, &q, clock.now(), registry, links));
                }
            }
            ev = link.events.recv() => {
                let Some(ev) = ev else {
                    return Err(RunError::Pair("pair link ended".into()));
                };
                let now = clock.now();
                match ev {
                    PairEvent::Up => {
                        // Silence while this board was away is not the active's.
                        active_seen = active_seen.max(now.mono);
                        report(link, &position, want);
                    }
                    PairEvent::Down => {}
                    PairEvent::Msg(topic, payload) if topic == topics.stream() => {
                        let Some(item) = asm.push(&payload) else { continue };
                        if claim.as_ref().is_none_or(|c| item.epoch >= c.epoch) {
                            active_seen = now.mono;
                            active_seen_wall = Some(now.wall);
                            active_dead = false;
                            // The active lives on: the disk's replica is behind it now.
                            resumed = false;
                        }
                        match position.step(&item) {
                            Step::Install => {
                                tracing::info!(bytes = item.data.len(), pos = item.pos, "pair: installing the active's snapshot");
                                if !tokio::task::block_in_place(|| install(cfg, &mut replica, &item.data))? {
                                    want = true;
                                    report(link, &position, want);
                                    continue;
                                }
                                position.done(&item);
                                if position.pos >= active_pos {
                                    behind_since = None;
                                }
                                want = false;
                                mark_synced(&dir, &position);
                                report(link, &position, want);
                            }
                            Step::Apply => {
                                let Some(r) = replica.as_mut() else { continue };
                                let applied = tokio::task::block_in_place(|| {
                                    r.durable.follow(&mut r.engine, &item.data, &mut r.in_force)
                                });
                                // Rebirth requests are the active's to send.
                                r.engine.take_commands();
                                match applied {
                                    Ok(()) => {
                                        last_applied = Some(now.wall);
                                        position.done(&item);
                                        if position.pos >= active_pos {
                                            behind_since = None;
                                        }
                                        report(link, &position, want);
                                    }
                                    Err(e) => {
                                        tracing::warn!(error = %e, "pair: a record did not apply; asking for a snapshot");
                                        want = true;
                                        unmark_synced(&dir);
                                        report(link, &position, want);
                                    }
                                }
                            }
                            Step::Skip => {}
                            Step::Gap => {
                                if !want {
                                    tracing::info!(pos = item.pos, at = position.pos, "pair: a record is missing; asking for a snapshot");
                                    unmark_synced(&dir);
                                }
                                want = true;
                                report(link, &position, want);
                            }
                        }
                    }
                    PairEvent::Msg(topic, payload) if topic == topics.state() => {
                        // An older claim (a genuine one replayed) never replaces the one known.
                        if let Ok(c) = serde_json::from_slice::<Claim>(&payload)
                            && claim.as_ref().is_none_or(|old| c == *old || c.beats(old))
                        {
                            position.epoch = position.epoch.max(c.epoch);
                            if claim.as_ref().is_none_or(|old| old.node != c.node) {
                                active_seen = now.mono;
                                active_dead = false;
                            }
                            *claim = Some(c);
                        }
                    }
                    PairEvent::Msg(topic, payload) => {
                        let Some(node) = topics.node_of(&topic) else { continue };
                        let Ok(b) = serde_json::from_slice::<Beat>(&payload) else { continue };
                        if node == sb.node {
                            if b.inst == link.inst {
                                own_echo = Some(now.mono);
                            } else if !b.dead {
                                tracing::error!(node = %node, "pair: another process runs with this board's standby.node; give each board its own");
                            }
                        } else if claim.as_ref().is_some_and(|c| c.node == node) {
                            if b.dead {
                                tracing::warn!(active = %node, "pair: the site broker reports the active gone");
                                active_dead = true;
                            } else {
                                active_seen = now.mono;
                                active_seen_wall = Some(now.wall);
                                active_pos = active_pos.max(b.pos);
                                active_dead = false;
                                resumed = false;
                                if active_pos > position.pos && behind_since.is_none() {
                                    behind_since = Some(now.mono);
                                }
                            }
                        }
                    }
                }
            }
            _ = tick.tick() => {
                let now = clock.now();
                if now.mono.saturating_sub(last_tick) > STALL_MS {
                    // This board stalled (a pause, a suspended VM): the silence is its own.
                    tracing::warn!(stalled_ms = now.mono - last_tick, "pair: this board stalled; the active's silence is counted from now");
                    active_seen = active_seen.max(now.mono);
                    own_echo = None;
                }
                last_tick = now.mono;
                if now.mono >= next_beat {
                    next_beat = now.mono + BEAT_MS;
                    link.beat(Role::Standby, (position.epoch, position.pos), false, now.mono);
                    report(link, &position, want);
                }
                let active = claim.as_ref().map(|c| c.node.clone()).unwrap_or_default();
                let status = Status {
                    node: sb.node.clone(),
                    role: Role::Standby,
                    epoch: position.epoch,
                    lag_records: active_pos.saturating_sub(position.pos),
                    rejected: link.rejected.load(Ordering::Relaxed),
                    lag_ms: behind_since
                        .filter(|_| active_pos > position.pos)
                        .map_or(0, |t| u64::try_from(now.mono.saturating_sub(t)).unwrap_or(0)),
                    peer: PeerStatus {
                        node: active.clone(),
                        state: if now.mono.saturating_sub(active_seen) >= sb.takeover_ms || active_dead {
                            PeerStateName::Lost
                        } else if want {
                            PeerStateName::CatchingUp
                        } else {
                            PeerStateName::Synced
                        },
                        last_seen: active_seen_wall,
                    },
                };
                if let Ok(mut p) = registry.pair.lock() {
                    *p = Some(status);
                }
                registry.health.core_beat(now.mono);
                let engine = replica.as_ref().map_or(empty, |r| &r.engine);
                registry.health.set_prometheus(
                    super::metrics::collect(engine, now, registry, false).prometheus(),
                );
                let silent = active_dead || now.mono.saturating_sub(active_seen) >= sb.takeover_ms;
                let path = own_echo.is_some_and(|t| now.mono.saturating_sub(t) <= PATH_PROVEN_MS);
                if !silent || !path {
                    continue;
                }
                if (want && !resumed) || replica.is_none() {
                    if now.mono >= next_warn {
                        next_warn = now.mono + sb.takeover_ms;
                        tracing::error!(active = %active, "pair: the active is gone and this board does not have its state (it never finished catching up): not taking over");
                    }
                    continue;
                }
                let Some(epoch) = position.epoch.max(claim.as_ref().map_or(0, |c| c.epoch)).checked_add(1) else {
                    return Err(RunError::Pair("the pair's epoch is exhausted".into()));
                };
                let proven_at = clock.mono();
                let mine = Claim { node: sb.node.clone(), epoch, at: now.wall };
                tracing::warn!(active = %active, epoch, position = position.pos, "pair: the active is dead; taking over");
                match link.claim(&mine).await {
                    Claimed::Held => {}
                    Claimed::Superseded(c) => {
                        tracing::warn!(active = %c.node, epoch = c.epoch, "pair: another board claimed the gateway first; following it");
                        position.epoch = position.epoch.max(c.epoch);
                        active_seen = now.mono;
                        active_dead = false;
                        *claim = Some(c);
                        continue;
                    }
                    Claimed::NoEcho => {
                        tracing::warn!("pair: the claim did not come back from the site broker; retrying");
                        continue;
                    }
                }
                drop(replica.take());
                return Ok(Some(Taken {
                    epoch,
                    from: Some((active, position.pos)),
                    takeover_ms: sb.takeover_ms,
                    proven_at,
                }));
            }
        }
    }
}
