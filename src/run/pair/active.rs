//! The active's replication task: each commit to the standby, its acks held
//! until the standby has it and while this board's proof of the claim holds.

use super::*;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::model::Millis;
use crate::run::error::RunError;
use crate::run::events::{AckJob, Notice, PairCommit};
use crate::run::outputs::mqtt::SinkMsg;
use crate::run::status::registry::Registry;
use std::sync::atomic::Ordering;

use crate::pair::{
    Beat, Change, Claim, Gate, Kind, PeerStateName, PeerStatus, Report, Role, Seen, Status, frames,
};
use crate::sys::clock::SystemClock;

/// (beat interval, how long a proof holds) for `takeover_ms`: the standby takes
/// over no sooner than `takeover_ms` after it last heard this board, so a proof
/// from a beat sent at t holds until t + `takeover_ms` less a margin of a quarter
/// (at least two beats).
fn proof_times(takeover_ms: Millis) -> (Millis, Millis) {
    let beat = (takeover_ms / 5).clamp(100, BEAT_MS);
    let margin = (takeover_ms / 4).max(2 * beat);
    (beat, takeover_ms.saturating_sub(margin).max(beat))
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
    proof: crate::run::fence::Proof,
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
    pub proof: crate::run::fence::Proof,
}

impl ActivePair {
    /// The task for `a`, on a stream of its own.
    pub fn new(
        a: Activation,
        links: ActiveLinks,
        clock: SystemClock,
        (stream, takeover_ms): (u64, Millis),
    ) -> Self {
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
        let (beat_ms, valid_ms) = proof_times(takeover_ms);
        links.proof.proven(a.proven_at, valid_ms);
        Self {
            gate: Gate::new(stream.max(1), takeover_ms),
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
                _ = tick.tick() => self.tick(&mut last_tick, &mut next_beat),
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

    /// The passage of time: a stall revokes the proof; the standby's silence
    /// counts only while the proof holds; beats; the status.
    fn tick(&mut self, last_tick: &mut Millis, next_beat: &mut Millis) {
        let now = self.clock.now();
        if now.mono.saturating_sub(*last_tick) > STALL_MS {
            // This board stalled: the claim may have moved meanwhile.
            tracing::warn!(
                stalled_ms = now.mono - *last_tick,
                "pair: this board stalled; no ack, session or publish until the pair's claim is read again"
            );
            self.revoke(now.mono);
        }
        *last_tick = now.mono;
        if self.proof.holds_at(now.mono) {
            // Only a silence this board lived through with its proof counts.
            let (released, change) = self.gate.tick(now.mono);
            self.release(released);
            self.changed(change);
            let fenced = std::mem::take(&mut self.fenced);
            self.release(fenced);
        }
        if now.mono >= *next_beat {
            *next_beat = now.mono + self.beat_ms;
            self.link
                .beat(Role::Active, (self.epoch, self.gate.pos()), false, now.mono);
        }
        self.status();
    }

    /// A claim on the state topic.
    fn on_claim(&mut self, payload: &[u8], mono: Millis) {
        match self
            .own
            .judge(serde_json::from_slice::<Claim>(payload).ok())
        {
            Seen::Own => {}
            // An older claim replayed, or garbage that failed its check: this
            // board's goes back, so a board that starts now elects from the truth.
            Seen::Overwritten => self.reassert(mono),
            Seen::Deposed(c) => {
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
        }
    }

    /// This board's own beat came back: another process with its name, or the
    /// proof of its claim as of when the beat was sent.
    fn own_beat(&mut self, b: &Beat, mono: Millis) {
        if b.inst != self.link.inst && !b.dead {
            tracing::error!(node = %b.node, "pair: another process runs with this board's standby.node; give each board its own");
        } else if b.inst == self.link.inst
            && !b.dead
            && b.epoch == self.epoch
            && b.sent >= self.revoked_at
            && self.deposed_by.is_none()
        {
            // Our own beat came back with no newer claim before it: the claim
            // is ours as of when it was sent.
            let was = self.proof.holds_at(mono);
            self.proof.proven(b.sent, self.valid_ms);
            if !was && self.proof.holds_at(mono) {
                tracing::info!("pair: the claim is this board's again; acks and sessions resume");
                self.gate.resume(mono);
            }
        }
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
            return self.on_claim(&payload, now.mono);
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
                self.own_beat(&b, now.mono);
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
