//! The board's own session on the site broker for the pair's topics.

use super::*;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::Standby;
use crate::model::Millis;
use crate::run::error::RunError;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::pair::auth::{self, Sealer};
use crate::pair::{Beat, Claim, ClaimRace, Claimed, Report, Role, Topics};
use crate::sys::clock::SystemClock;
use crate::sys::link::{self, Client, Event, LinkOptions};

pub struct PairLink {
    pub(super) client: Client,
    pub(super) events: mpsc::UnboundedReceiver<PairEvent>,
    pub(super) role: watch::Sender<Role>,
    pub(super) task: JoinHandle<()>,
    pub(super) topics: Topics,
    pub(super) node: String,
    pub(super) inst: u64,
    pub(super) sealer: Arc<std::sync::Mutex<Sealer>>,
    /// Messages refused since start.
    pub rejected: Arc<AtomicU64>,
}

/// Refusals are logged at most this often.
const REFUSAL_LOG_MS: Millis = 60_000;

impl PairLink {
    /// Connects (in the background, retrying) as `role`.
    pub fn open(
        (gateway, source): (&str, &crate::config::Source),
        sb: &Standby,
        role: Role,
        inst: u64,
    ) -> Result<Self, RunError> {
        let topics = Topics::new(gateway);
        let mut endpoint = source.endpoint.clone();
        endpoint.client_id = format!("{}-pair-{}", endpoint.client_id, sb.node);
        // The will: a dead beat.
        let dead = Beat {
            node: sb.node.clone(),
            role,
            epoch: 0,
            pos: 0,
            inst,
            dead: true,
            sent: 0,
        };
        let will_body = serde_json::to_vec(&dead).unwrap_or_default();
        let beat_topic = topics.beat(&sb.node);
        let sealer = Arc::new(std::sync::Mutex::new(Sealer::new(
            sb.keys.clone(),
            &sb.node,
            auth::random_nonce(),
        )));
        let will = lock(&sealer).seal_will(&beat_topic, &will_body);
        let (client, lp) = link::build(&LinkOptions {
            endpoint: &endpoint,
            v5: source.v5,
            persistent: false,
            session_expiry_s: 0,
            manual_acks: false,
            will: Some((beat_topic.clone(), will)),
            will_retain: false,
            inflight: 64,
        })?;
        let (tx, events) = mpsc::unbounded_channel();
        let (role_tx, role_rx) = watch::channel(role);
        let rejected = Arc::new(AtomicU64::new(0));
        let gate = Opener::new(sb, &topics, &sealer, &rejected);
        let task = tokio::spawn(carry(
            (lp, client.clone(), topics.clone()),
            (tx, role_rx),
            gate,
            (beat_topic, will_body),
        ));
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
    pub(super) fn sealed(&self, topic: &str, body: &[u8]) -> Vec<u8> {
        lock(&self.sealer).seal(topic, body)
    }

    pub(super) fn beat(&self, role: Role, (epoch, pos): (u64, u64), dead: bool, sent: Millis) {
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
    pub(super) fn report(&self, r: &Report) {
        let topic = self.topics.report(&self.node);
        let body = self.sealed(&topic, &serde_json::to_vec(r).unwrap_or_default());
        let _ = self.client.publish(&topic, body, 0, false);
    }

    /// Publishes this board's claim (retained) and waits until the broker sends
    /// it back (from then on the broker holds it), then a moment more: two boards
    /// claiming at once both see both claims, and the one [`Claim::beats`] picks stands.
    pub(super) async fn claim(&mut self, claim: &Claim) -> Claimed {
        let topic = self.topics.state();
        let body = self.sealed(&topic, &serde_json::to_vec(claim).unwrap_or_default());
        if self.client.publish(&topic, body, 1, true).is_err() {
            return Claimed::NoEcho;
        }
        let clock = SystemClock::new();
        let mut race = ClaimRace::new(claim.clone(), clock.mono());
        loop {
            let wait = race.deadline().saturating_sub(clock.mono());
            let ev = tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))) => None,
                ev = self.events.recv() => Some(ev),
            };
            let ended = matches!(ev, Some(None));
            if let Some(Some(PairEvent::Msg(topic, payload))) = ev
                && topic == self.topics.state()
                && let Ok(c) = serde_json::from_slice::<Claim>(&payload)
            {
                race.seen(c, clock.mono());
            }
            if let Some(outcome) = race.outcome(clock.mono(), ended) {
                return outcome;
            }
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

/// The link's task: (re)subscribes for the board's role, opens what comes in,
/// and gives each new connection a session and a will of its own.
async fn carry(
    (mut lp, c, t): (link::Loop, Client, Topics),
    (tx, mut role_rx): (mpsc::UnboundedSender<PairEvent>, watch::Receiver<Role>),
    mut gate: Opener,
    (beat_topic, will_body): (String, Vec<u8>),
) {
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
                    gate.new_session(&mut lp, &beat_topic, &will_body);
                }
            },
            r = role_rx.changed() => {
                if r.is_err() {
                    return;
                }
                let now = *role_rx.borrow_and_update();
                if now != subscribed {
                    resubscribe(&c, &filters(subscribed), &filters(now));
                    subscribed = now;
                }
            }
        }
    }
}

/// From the filters of one role to another's.
fn resubscribe(c: &Client, old: &[String], new: &[String]) {
    for f in old {
        if !new.contains(f) {
            let _ = c.unsubscribe(f);
        }
    }
    let _ = c.subscribe(new, 1);
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
    /// The receiving side of `sb`'s link, its own session known.
    fn new(
        sb: &Standby,
        topics: &Topics,
        sealer: &Arc<std::sync::Mutex<Sealer>>,
        rejected: &Arc<AtomicU64>,
    ) -> Self {
        let mut gate = Self {
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
        gate.sessions.set_mine(lock(sealer).nonce());
        gate
    }

    /// A new connection is a new session, with a will of its own.
    fn new_session(&mut self, lp: &mut link::Loop, beat_topic: &str, will_body: &[u8]) {
        let nonce = auth::random_nonce();
        let will = {
            let mut s = lock(&self.sealer);
            s.new_session(nonce);
            s.seal_will(beat_topic, will_body)
        };
        self.sessions.set_mine(nonce);
        lp.set_will(beat_topic, will);
    }

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
