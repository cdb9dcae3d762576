//! The active's gate (docs/reference.md#standby--two-boards-one-gateway): the acks of each commit
//! wait until the standby reports that commit synced, and go at once when there
//! is no synced standby.

use std::collections::VecDeque;

use serde::Serialize;

use super::Report;
use crate::model::Millis;

/// How the standby stands, seen from the active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerState {
    /// It has every record: acks wait for it.
    Synced,
    /// It is installing a snapshot or missed a record: acks do not wait.
    CatchingUp,
    /// None heard for `takeover_s`: the active runs alone.
    Lost,
}

/// What changed in the active's view of its standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The standby has every record now.
    Joined(String),
    /// The standby stopped answering (or fell behind): the active runs alone.
    Lost(String),
}

/// The active's gate: acks of each commit are released when the standby has
/// synced that commit, at once when there is no synced standby.
#[derive(Debug)]
pub struct Gate<A> {
    stream: u64,
    takeover_ms: Millis,
    peer: PeerState,
    peer_node: String,
    last_seen: Option<Millis>,
    last_seen_wall: Option<Millis>,
    synced: u64,
    /// The position of the last commit.
    pos: u64,
    /// Positions of commits with their acks, waiting for the standby.
    held: VecDeque<(u64, Vec<A>, Millis)>,
    /// The snapshot under way: its position once sent, and when it was asked for.
    snapshot: Option<(Option<u64>, Millis)>,
}

/// A snapshot request not answered for this long is made again.
const SNAPSHOT_RETRY_MS: Millis = 10_000;

impl<A> Gate<A> {
    /// A gate for the active's `stream`, no standby yet.
    pub fn new(stream: u64, takeover_ms: Millis) -> Self {
        Self {
            stream,
            takeover_ms,
            peer: PeerState::Lost,
            peer_node: String::new(),
            last_seen: None,
            last_seen_wall: None,
            synced: 0,
            pos: 0,
            held: VecDeque::new(),
            snapshot: None,
        }
    }

    /// The standby's state.
    pub fn peer(&self) -> PeerState {
        self.peer
    }

    /// The standby's name ("" before one was heard).
    pub fn peer_node(&self) -> &str {
        &self.peer_node
    }

    /// Wall time the standby was last heard.
    pub fn last_seen_wall(&self) -> Option<Millis> {
        self.last_seen_wall
    }

    /// The last commit's position.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Commits the standby has not synced yet (0 unless it is synced).
    pub fn lag_records(&self) -> u64 {
        match self.peer {
            PeerState::Synced => self.pos.saturating_sub(self.synced),
            _ => 0,
        }
    }

    /// Age of the oldest commit waiting for the standby.
    pub fn lag_ms(&self, mono: Millis) -> Millis {
        self.held
            .front()
            .map_or(0, |(_, _, at)| mono.saturating_sub(*at))
    }

    /// Whether records are worth publishing (a standby is there to take them).
    pub fn publishing(&self) -> bool {
        self.peer != PeerState::Lost
    }

    /// A commit at `pos` is durable here; returns the acks that may go now.
    pub fn committed(&mut self, pos: u64, acks: Vec<A>, mono: Millis) -> Vec<A> {
        self.pos = pos;
        if self.peer == PeerState::Synced {
            self.held.push_back((pos, acks, mono));
            Vec::new()
        } else {
            acks
        }
    }

    /// A snapshot at `pos` went out.
    pub fn snapshot_sent(&mut self, pos: u64, mono: Millis) {
        self.snapshot = Some((Some(pos), mono));
    }

    /// A sign of life of `node` (a beat): it counts only for the standby.
    pub fn heard(&mut self, node: &str, mono: Millis, wall: Millis) {
        if node == self.peer_node && self.peer != PeerState::Lost {
            self.last_seen = Some(mono);
            self.last_seen_wall = Some(wall);
        }
    }

    /// A report of the standby. Returns the acks released, a change, and
    /// whether a snapshot must be made for it.
    pub fn report(
        &mut self,
        r: &Report,
        mono: Millis,
        wall: Millis,
    ) -> (Vec<A>, Option<Change>, bool) {
        self.peer_node.clone_from(&r.node);
        self.last_seen = Some(mono);
        self.last_seen_wall = Some(wall);
        let on_stream = !r.want && r.stream == self.stream;
        let mut released = Vec::new();
        let mut change = None;
        let mut want_snapshot = false;
        if on_stream {
            // A report confirms only what was sent on this stream.
            self.synced = self.synced.max(r.pos.min(self.pos));
            if self.peer != PeerState::Synced {
                match self.snapshot {
                    // It installed the snapshot it was sent and synced what followed.
                    Some((Some(at_pos), _)) if r.pos >= at_pos => {
                        self.peer = PeerState::Synced;
                        self.snapshot = None;
                        change = Some(Change::Joined(r.node.clone()));
                    }
                    Some(_) => self.peer = PeerState::CatchingUp,
                    // On our stream but given up on: it missed records since.
                    None => {
                        self.peer = PeerState::CatchingUp;
                        want_snapshot = true;
                        self.snapshot = Some((None, mono));
                    }
                }
            }
            while self.held.front().is_some_and(|(p, _, _)| *p <= self.synced) {
                if let Some((_, acks, _)) = self.held.pop_front() {
                    released.extend(acks);
                }
            }
        } else {
            if self.peer == PeerState::Synced {
                change = Some(Change::Lost(r.node.clone()));
                released = self.release_all();
            }
            self.peer = PeerState::CatchingUp;
            let stale = self
                .snapshot
                .is_none_or(|(_, at)| mono.saturating_sub(at) >= SNAPSHOT_RETRY_MS);
            if stale {
                want_snapshot = true;
                self.snapshot = Some((None, mono));
            }
        }
        (released, change, want_snapshot)
    }

    /// The passage of time: a standby silent for `takeover_s` is lost.
    pub fn tick(&mut self, mono: Millis) -> (Vec<A>, Option<Change>) {
        let silent = self
            .last_seen
            .is_none_or(|t| mono.saturating_sub(t) >= self.takeover_ms);
        if self.peer != PeerState::Lost && silent {
            let was_synced = self.peer == PeerState::Synced;
            self.peer = PeerState::Lost;
            self.snapshot = None;
            let released = self.release_all();
            let change = was_synced.then(|| Change::Lost(self.peer_node.clone()));
            return (released, change);
        }
        (Vec::new(), None)
    }

    /// This board's proof of the claim is back after a stall or a lost link: the
    /// standby's silence is counted from now (the gap was this board's).
    pub fn resume(&mut self, mono: Millis) {
        if self.peer != PeerState::Lost {
            self.last_seen = Some(mono);
        }
    }

    /// The site broker reports `node` gone (its will, or a clean stop's last beat):
    /// if it is the standby, it is lost now rather than after `takeover_s`.
    pub fn gone(&mut self, node: &str) -> (Vec<A>, Option<Change>) {
        if node != self.peer_node || self.peer == PeerState::Lost {
            return (Vec::new(), None);
        }
        let was_synced = self.peer == PeerState::Synced;
        self.peer = PeerState::Lost;
        self.snapshot = None;
        let released = self.release_all();
        (released, was_synced.then(|| Change::Lost(node.to_string())))
    }

    /// Every held ack (the standby is gone or stopping waiting for it).
    pub fn release_all(&mut self) -> Vec<A> {
        self.held.drain(..).flat_map(|(_, a, _)| a).collect()
    }
}
