//! The standby's rules (docs/reference.md#standby--two-boards-one-gateway), as a state machine:
//! frames, claims, beats and ticks go in with the time they were seen; what the
//! board must do comes out as [`Action`]s. No clock, no I/O: `run/pair` pumps it.

use super::{Assembler, Beat, Claim, Item, PeerStateName, PeerStatus, Position, Report, Role};
use super::{Status, Step};
use crate::model::Millis;

/// Beats go out this often.
pub const BEAT_MS: Millis = 1_000;
/// Our own beat came back this recently: the path to the site broker works.
pub const PATH_PROVEN_MS: Millis = 3_000;
/// A gap between two ticks longer than this is a stall of the board itself.
pub const STALL_MS: Millis = 1_500;
/// Time given to a claim to come back from the broker.
pub const CLAIM_ECHO_MS: Millis = 3_000;
/// Time after the echo of a claim in which a rival claim still counts.
pub const CLAIM_SETTLE_MS: Millis = 500;

/// What the standby must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Publish this report.
    Report(Report),
    /// Publish a beat naming (epoch, position).
    Beat(u64, u64),
    /// Replace the state with this snapshot; answer with [`Follower::installed`].
    Install(Item),
    /// Apply this record to the state; answer with [`Follower::applied`].
    Apply(Item),
    /// The disk holds the active's state as of this position.
    MarkSynced(Position),
    /// The disk is behind the active now.
    Unmark,
    /// Publish this claim and race for it ([`ClaimRace`]); answer with [`Follower::claimed`].
    Claim(Claim),
    /// Take over: (the board replaced, the position taken over).
    TakeOver(Claim, String, u64),
    /// Something to log.
    Say(Note),
}

/// What the standby has to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A record is missing at this position; a snapshot is asked for.
    Gap(u64),
    /// The site broker reports the active gone.
    ActiveGone(String),
    /// Another process runs with this board's name.
    Twin,
    /// This board stalled this long; the silence is counted from now.
    Stalled(Millis),
    /// The active is gone, and this board does not have its state.
    CannotTakeOver(String),
    /// Another board claimed the gateway first.
    Superseded(Claim),
    /// The claim did not come back.
    NoEcho,
    /// The pair's epoch is exhausted.
    EpochExhausted,
}

/// What became of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The broker holds it and no other board's claim beats it.
    Held,
    /// Another board's claim beats it.
    Superseded(Claim),
    /// The broker did not send it back in time.
    NoEcho,
}

/// One claim's race: published, it must come back from the broker within
/// [`CLAIM_ECHO_MS`]; a rival that beats it within [`CLAIM_SETTLE_MS`] of the
/// echo wins (two boards claiming at once both see both claims).
#[derive(Debug, Clone)]
pub struct ClaimRace {
    claim: Claim,
    started: Millis,
    echoed: Option<Millis>,
    rival: Option<Claim>,
}

impl ClaimRace {
    /// `claim` was published at `mono`.
    pub fn new(claim: Claim, mono: Millis) -> Self {
        Self {
            claim,
            started: mono,
            echoed: None,
            rival: None,
        }
    }

    /// A claim seen on the state topic at `mono`.
    pub fn seen(&mut self, c: Claim, mono: Millis) {
        if c == self.claim {
            self.echoed.get_or_insert(mono);
        } else if c.beats(&self.claim) && self.rival.as_ref().is_none_or(|r| c.beats(r)) {
            self.rival = Some(c);
        }
    }

    /// When to look again.
    pub fn deadline(&self) -> Millis {
        self.echoed
            .map_or(self.started + CLAIM_ECHO_MS, |t| t + CLAIM_SETTLE_MS)
    }

    /// The outcome once decided at `mono` (or the link ended: `ended`).
    pub fn outcome(&self, mono: Millis, ended: bool) -> Option<Claimed> {
        if !ended && mono < self.deadline() {
            return None;
        }
        Some(match (&self.echoed, &self.rival) {
            (_, Some(r)) => Claimed::Superseded(r.clone()),
            (Some(_), None) => Claimed::Held,
            (None, None) => Claimed::NoEcho,
        })
    }
}

/// The standby's view of the pair.
#[derive(Debug)]
pub struct Follower {
    node: String,
    inst: u64,
    takeover_ms: Millis,
    claim: Option<Claim>,
    position: Position,
    asm: Assembler,
    /// It needs a snapshot.
    want: bool,
    /// The state on disk was in sync when this board stopped: it may take over
    /// from it while nothing of the active is heard.
    resumed: bool,
    /// The runtime holds a replica to take over from.
    replica: bool,
    active_seen: Millis,
    active_seen_wall: Option<Millis>,
    active_dead: bool,
    active_pos: u64,
    own_echo: Option<Millis>,
    next_beat: Millis,
    next_warn: Millis,
    last_tick: Millis,
    /// Since when the active is ahead of this board.
    behind_since: Option<Millis>,
    last_applied: Option<Millis>,
}

impl Follower {
    /// A standby `node` (process `inst`) starting at `mono`, knowing `claim`;
    /// `resumed` is the position of a replica in sync when it last stopped.
    pub fn new(
        node: &str,
        inst: u64,
        takeover_ms: Millis,
        max_frame: usize,
        claim: Option<Claim>,
        resumed: Option<Position>,
        mono: Millis,
    ) -> Self {
        let mut position = Position::default();
        if let Some(at) = resumed {
            position.epoch = at.epoch;
            position.pos = at.pos;
        }
        Self {
            node: node.to_string(),
            inst,
            takeover_ms,
            claim,
            position,
            asm: Assembler::bounded(max_frame),
            want: true,
            resumed: resumed.is_some(),
            replica: resumed.is_some(),
            active_seen: mono,
            active_seen_wall: None,
            active_dead: false,
            active_pos: 0,
            own_echo: None,
            next_beat: 0,
            next_warn: mono + takeover_ms,
            last_tick: mono,
            behind_since: None,
            last_applied: None,
        }
    }

    /// The claim known.
    pub fn claim(&self) -> Option<&Claim> {
        self.claim.as_ref()
    }

    /// When the last record was applied (wall).
    pub fn last_applied(&self) -> Option<Millis> {
        self.last_applied
    }

    /// When this board's own beat last came back (mono).
    pub fn proven(&self) -> Option<Millis> {
        self.own_echo
    }

    fn report(&self) -> Action {
        Action::Report(Report {
            node: self.node.clone(),
            stream: self.position.stream,
            pos: self.position.pos,
            want: self.want,
        })
    }

    /// The active is silent past `takeover_s`, or the broker reported it gone.
    pub fn silent(&self, mono: Millis) -> bool {
        self.active_dead || mono.saturating_sub(self.active_seen) >= self.takeover_ms
    }

    fn alive(&mut self, mono: Millis, wall: Option<Millis>) {
        self.active_seen = mono;
        if wall.is_some() {
            self.active_seen_wall = wall;
        }
        self.active_dead = false;
    }

    /// Connected and subscribed again: silence while away is not the active's.
    pub fn up(&mut self, mono: Millis) -> Vec<Action> {
        self.active_seen = self.active_seen.max(mono);
        vec![self.report()]
    }

    /// A frame on the stream topic.
    pub fn frame(&mut self, bytes: &[u8], mono: Millis, wall: Millis) -> Vec<Action> {
        let Some(item) = self.asm.push(bytes) else {
            return Vec::new();
        };
        if self.claim.as_ref().is_none_or(|c| item.epoch >= c.epoch) {
            self.alive(mono, Some(wall));
            // The active lives on: the disk's replica is behind it now.
            self.resumed = false;
        }
        match self.position.step(&item) {
            Step::Install => vec![Action::Install(item)],
            Step::Apply if self.replica => vec![Action::Apply(item)],
            Step::Apply | Step::Skip => Vec::new(),
            Step::Gap => {
                let mut out = Vec::new();
                if !self.want {
                    out.push(Action::Say(Note::Gap(item.pos)));
                    out.push(Action::Unmark);
                }
                self.want = true;
                out.push(self.report());
                out
            }
        }
    }

    fn synced(&mut self, item: &Item) {
        self.position.done(item);
        if self.position.pos >= self.active_pos {
            self.behind_since = None;
        }
    }

    /// The snapshot `item` was installed (`ok`), or was not a state file.
    pub fn installed(&mut self, item: &Item, ok: bool) -> Vec<Action> {
        self.want = true;
        if !ok {
            return vec![self.report()];
        }
        self.replica = true;
        self.synced(item);
        self.want = false;
        vec![Action::MarkSynced(self.position), self.report()]
    }

    /// The record `item` was applied at `wall` (`ok`), or did not apply.
    pub fn applied(&mut self, item: &Item, ok: bool, wall: Millis) -> Vec<Action> {
        if !ok {
            self.want = true;
            return vec![Action::Unmark, self.report()];
        }
        self.last_applied = Some(wall);
        self.synced(item);
        vec![self.report()]
    }

    /// A claim on the state topic. An older claim (a genuine one replayed) never
    /// replaces the one known.
    pub fn state(&mut self, c: Claim, mono: Millis) {
        if self
            .claim
            .as_ref()
            .is_none_or(|old| c == *old || c.beats(old))
        {
            self.position.epoch = self.position.epoch.max(c.epoch);
            if self.claim.as_ref().is_none_or(|old| old.node != c.node) {
                self.alive(mono, None);
            }
            self.claim = Some(c);
        }
    }

    /// A beat of `node`.
    pub fn beat(&mut self, node: &str, b: &Beat, mono: Millis, wall: Millis) -> Vec<Action> {
        if node == self.node {
            if b.inst == self.inst {
                self.own_echo = Some(mono);
            } else if !b.dead {
                return vec![Action::Say(Note::Twin)];
            }
        } else if self.claim.as_ref().is_some_and(|c| c.node == node) {
            if b.dead {
                self.active_dead = true;
                return vec![Action::Say(Note::ActiveGone(node.to_string()))];
            }
            self.alive(mono, Some(wall));
            self.active_pos = self.active_pos.max(b.pos);
            self.resumed = false;
            if self.active_pos > self.position.pos && self.behind_since.is_none() {
                self.behind_since = Some(mono);
            }
        }
        Vec::new()
    }

    /// The passage of time: beats, reports, and the takeover when the active is
    /// silent and this board's own path to the broker is proven.
    pub fn tick(&mut self, mono: Millis, wall: Millis) -> Vec<Action> {
        let mut out = Vec::new();
        if mono.saturating_sub(self.last_tick) > STALL_MS {
            // This board stalled (a pause, a suspended VM): the silence is its own.
            out.push(Action::Say(Note::Stalled(mono - self.last_tick)));
            self.active_seen = self.active_seen.max(mono);
            self.own_echo = None;
        }
        self.last_tick = mono;
        if mono >= self.next_beat {
            self.next_beat = mono + BEAT_MS;
            out.push(Action::Beat(self.position.epoch, self.position.pos));
            out.push(self.report());
        }
        let path = self
            .own_echo
            .is_some_and(|t| mono.saturating_sub(t) <= PATH_PROVEN_MS);
        if !self.silent(mono) || !path {
            return out;
        }
        if (self.want && !self.resumed) || !self.replica {
            if mono >= self.next_warn {
                self.next_warn = mono + self.takeover_ms;
                out.push(Action::Say(Note::CannotTakeOver(self.active_node())));
            }
            return out;
        }
        let known = self.claim.as_ref().map_or(0, |c| c.epoch);
        match self.position.epoch.max(known).checked_add(1) {
            Some(epoch) => out.push(Action::Claim(Claim {
                node: self.node.clone(),
                epoch,
                at: wall,
            })),
            None => out.push(Action::Say(Note::EpochExhausted)),
        }
        out
    }

    /// How this board's claim `mine` ended.
    pub fn claimed(&mut self, mine: Claim, outcome: Claimed, mono: Millis) -> Vec<Action> {
        match outcome {
            Claimed::Held => {
                self.replica = false;
                vec![Action::TakeOver(
                    mine,
                    self.active_node(),
                    self.position.pos,
                )]
            }
            Claimed::Superseded(c) => {
                self.position.epoch = self.position.epoch.max(c.epoch);
                self.alive(mono, None);
                self.claim = Some(c.clone());
                vec![Action::Say(Note::Superseded(c))]
            }
            Claimed::NoEcho => vec![Action::Say(Note::NoEcho)],
        }
    }

    fn active_node(&self) -> String {
        self.claim
            .as_ref()
            .map(|c| c.node.clone())
            .unwrap_or_default()
    }

    /// The pair as the status shows it, with `rejected` messages refused.
    pub fn status(&self, mono: Millis, rejected: u64) -> Status {
        let behind = self.active_pos > self.position.pos;
        Status {
            node: self.node.clone(),
            role: Role::Standby,
            epoch: self.position.epoch,
            lag_records: self.active_pos.saturating_sub(self.position.pos),
            rejected,
            lag_ms: self
                .behind_since
                .filter(|_| behind)
                .map_or(0, |t| u64::try_from(mono.saturating_sub(t)).unwrap_or(0)),
            peer: PeerStatus {
                node: self.active_node(),
                state: if self.silent(mono) {
                    PeerStateName::Lost
                } else if self.want {
                    PeerStateName::CatchingUp
                } else {
                    PeerStateName::Synced
                },
                last_seen: self.active_seen_wall,
            },
        }
    }
}

#[cfg(test)]
#[path = "follow_tests.rs"]
mod tests;
