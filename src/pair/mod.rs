//! Hot standby (docs/reference.md#standby--two-boards-one-gateway): what the two boards of a pair tell each other on
//! the site broker, and the pure rules around it — the active's gate that holds
//! source acks until its standby reports the record synced, the standby's
//! reassembly of frames and its check that records follow on without a gap.
//!
//! Topics under `tidemark/{gateway}/pair/`:
//! - `stream`: the active's journal records and snapshots, as [`Frame`]s (CBOR, QoS 1);
//! - `report/{node}`: the standby's synced position ([`Report`], JSON);
//! - `beat/{node}`: each board's sign of life, once a second, and its will ([`Beat`], JSON);
//! - `state`: retained, the active's claim: node and epoch ([`Claim`], JSON).

pub mod auth;
pub mod follow;
mod gate;

pub use follow::{Action, ClaimRace, Claimed, Follower, Note};
pub use gate::{Change, Gate, PeerState};

use serde::{Deserialize, Serialize};

use crate::model::Millis;

/// Bytes of a record or snapshot per frame (the link's packet bound is 1 MiB).
pub const FRAME_BYTES: usize = 256 * 1024;

/// The pair's topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    root: String,
}

impl Topics {
    /// The topics of `gateway`'s pair.
    pub fn new(gateway: &str) -> Self {
        Self {
            root: format!("tidemark/{gateway}/pair"),
        }
    }
    /// Records and snapshots.
    pub fn stream(&self) -> String {
        format!("{}/stream", self.root)
    }
    /// The retained claim of the active.
    pub fn state(&self) -> String {
        format!("{}/state", self.root)
    }
    /// `node`'s beats (and will).
    pub fn beat(&self, node: &str) -> String {
        format!("{}/beat/{node}", self.root)
    }
    /// Every node's beats.
    pub fn beats(&self) -> String {
        format!("{}/beat/+", self.root)
    }
    /// `node`'s reports.
    pub fn report(&self, node: &str) -> String {
        format!("{}/report/{node}", self.root)
    }
    /// Every node's reports.
    pub fn reports(&self) -> String {
        format!("{}/report/+", self.root)
    }
    /// The node a beat or report topic is about.
    pub fn node_of<'a>(&self, topic: &'a str) -> Option<&'a str> {
        let rest = topic.strip_prefix(self.root.as_str())?;
        rest.strip_prefix("/beat/")
            .or_else(|| rest.strip_prefix("/report/"))
    }
}

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// A journal record (its body as the active's journal holds it).
    Record,
    /// The active's state file at a checkpoint.
    Snapshot,
}

/// One piece of a record or snapshot on the stream topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// Record or snapshot.
    pub kind: Kind,
    /// The pair's epoch the active publishes under.
    pub epoch: u64,
    /// The active's run (random per activation): positions count within it.
    pub stream: u64,
    /// The commit this is (a snapshot: the state after that commit).
    pub pos: u64,
    /// This piece, of `parts`.
    pub part: u32,
    /// Pieces in all.
    pub parts: u32,
    /// The bytes of this piece.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// [`Frame`] as written: the piece borrowed from the body, not copied first.
#[derive(Serialize)]
struct FrameRef<'a> {
    kind: Kind,
    epoch: u64,
    stream: u64,
    pos: u64,
    part: u32,
    parts: u32,
    #[serde(with = "serde_bytes")]
    data: &'a [u8],
}

/// A whole record or snapshot, reassembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Record or snapshot.
    pub kind: Kind,
    /// Epoch.
    pub epoch: u64,
    /// Stream.
    pub stream: u64,
    /// Position.
    pub pos: u64,
    /// The body.
    pub data: Vec<u8>,
}

/// `body` cut into encoded frames.
pub fn frames(kind: Kind, epoch: u64, stream: u64, pos: u64, body: &[u8]) -> Vec<Vec<u8>> {
    let pieces: Vec<&[u8]> = if body.is_empty() {
        vec![&[]]
    } else {
        body.chunks(FRAME_BYTES).collect()
    };
    let parts = u32::try_from(pieces.len()).unwrap_or(u32::MAX);
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, data)| {
            let f = FrameRef {
                kind,
                epoch,
                stream,
                pos,
                part: u32::try_from(i).unwrap_or(u32::MAX),
                parts,
                data,
            };
            let mut out = Vec::with_capacity(data.len() + 64);
            // Writing plain data into memory cannot fail.
            let _ = ciborium::ser::into_writer(&f, &mut out);
            out
        })
        .collect()
}

/// Reassembles frames that arrive in order (one publisher, one topic, QoS 1).
#[derive(Debug)]
pub struct Assembler {
    current: Option<Item>,
    next_part: u32,
    parts: u32,
    /// The most an item may hold (`standby.max_frame_mib`).
    max: usize,
}

impl Default for Assembler {
    fn default() -> Self {
        Self::bounded(usize::MAX)
    }
}

impl Assembler {
    /// An assembler of items of at most `max` bytes.
    pub fn bounded(max: usize) -> Self {
        Self {
            current: None,
            next_part: 0,
            parts: 0,
            max,
        }
    }

    /// Takes one encoded frame; a whole item when it was the last piece. A frame
    /// that does not continue the item under way starts over (a lost piece: the
    /// position check after it asks for a snapshot).
    pub fn push(&mut self, bytes: &[u8]) -> Option<Item> {
        let f: Frame = ciborium::de::from_reader(bytes).ok()?;
        let continues = self.current.as_ref().is_some_and(|c| {
            c.kind == f.kind && c.stream == f.stream && c.pos == f.pos && self.next_part == f.part
        });
        if !continues {
            self.current = None;
            let announced = usize::try_from(f.parts).unwrap_or(usize::MAX);
            if f.part != 0
                || announced.saturating_mul(FRAME_BYTES) > self.max.saturating_add(FRAME_BYTES)
            {
                return None;
            }
            self.current = Some(Item {
                kind: f.kind,
                epoch: f.epoch,
                stream: f.stream,
                pos: f.pos,
                data: Vec::new(),
            });
            self.parts = f.parts;
            self.next_part = 0;
        }
        let cur = self.current.as_mut()?;
        if f.data.len() > FRAME_BYTES || cur.data.len() + f.data.len() > self.max {
            self.current = None;
            return None;
        }
        cur.data.extend_from_slice(&f.data);
        self.next_part += 1;
        if self.next_part >= self.parts {
            return self.current.take();
        }
        None
    }
}

/// A board's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Holds the sessions and publishes.
    Active,
    /// Follows the active's records.
    Standby,
}

/// A board's sign of life (and, with `dead`, its will).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// The board.
    pub node: String,
    /// Its role.
    pub role: Role,
    /// The epoch it knows.
    pub epoch: u64,
    /// The active: its last commit; the standby: its last synced record.
    pub pos: u64,
    /// This process (two processes with one node name are a misconfiguration).
    pub inst: u64,
    /// The site broker published this as the board's will.
    #[serde(default)]
    pub dead: bool,
    /// The sender's monotonic clock when it sent this (its own echo proves the claim from then).
    #[serde(default)]
    pub sent: Millis,
}

/// The standby's position, after each record it synced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The standby.
    pub node: String,
    /// The active's stream it follows (0: none).
    pub stream: u64,
    /// The last record it has synced on its disk.
    pub pos: u64,
    /// It needs a snapshot (it joined, or a record is missing).
    pub want: bool,
}

/// The active's claim, retained on `pair/state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The active board.
    pub node: String,
    /// Raised at each takeover.
    pub epoch: u64,
    /// Wall time of the claim.
    pub at: Millis,
}

impl Claim {
    /// `self` supersedes `other`: a higher epoch, or the same one claimed by a
    /// node later in name order (two claims of one epoch: both boards agree which stands).
    pub fn beats(&self, other: &Claim) -> bool {
        (self.epoch, &self.node) > (other.epoch, &other.node)
    }

    /// What `seen` on the state topic means to the active that claimed `self`
    /// (None: not a claim, or one that failed its check).
    pub fn judge(&self, seen: Option<Claim>) -> Seen {
        match seen {
            Some(c) if c.node == self.node => Seen::Own,
            Some(c) if c.beats(self) => Seen::Deposed(c),
            _ => Seen::Overwritten,
        }
    }
}

/// A claim on the state topic, seen by the active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Its own (the broker's echo, or an older one of its own).
    Own,
    /// Another board's that does not beat it, or garbage: the retained claim
    /// was overwritten, and the active publishes its own again.
    Overwritten,
    /// Another board's newer claim: the active stops publishing and rejoins as standby.
    Deposed(Claim),
}

/// The standby's view of the stream: which item it can apply next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    /// The stream followed (0: none yet).
    pub stream: u64,
    /// The last record applied (or the snapshot's position).
    pub pos: u64,
    /// Highest epoch seen.
    pub epoch: u64,
}

/// What the standby does with an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Install this snapshot.
    Install,
    /// Apply this record.
    Apply,
    /// Already had it.
    Skip,
    /// A record is missing or of another stream: ask for a snapshot.
    Gap,
}

impl Position {
    /// What to do with `item`.
    pub fn step(&self, item: &Item) -> Step {
        match item.kind {
            Kind::Snapshot => Step::Install,
            Kind::Record if self.stream == 0 => Step::Gap,
            Kind::Record if item.stream != self.stream => Step::Gap,
            Kind::Record if item.pos <= self.pos => Step::Skip,
            Kind::Record if item.pos == self.pos + 1 => Step::Apply,
            Kind::Record => Step::Gap,
        }
    }

    /// `item` was installed or applied.
    pub fn done(&mut self, item: &Item) {
        self.stream = item.stream;
        self.pos = item.pos;
        self.epoch = self.epoch.max(item.epoch);
    }
}

#[cfg(test)]
mod tests;

/// The pair as `/api/v1/status`, `P/metrics` and `tidemark status` show it (docs/reference.md#standby--two-boards-one-gateway).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// This board.
    pub node: String,
    /// Its role.
    pub role: Role,
    /// The pair's epoch.
    pub epoch: u64,
    /// The standby: records behind the active; the active: records its standby lacks.
    pub lag_records: u64,
    /// The same in time (the oldest commit waiting).
    pub lag_ms: u64,
    /// Messages on the pair's topics refused (forged, replayed, too large) since start.
    pub rejected: u64,
    /// The other board.
    pub peer: PeerStatus,
}

/// The other board of the pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Its name ("" before it was heard).
    pub node: String,
    /// Synced, catching up or lost.
    pub state: PeerStateName,
    /// Wall time it was last heard.
    pub last_seen: Option<Millis>,
}

/// [`PeerState`] as the contract spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerStateName {
    /// Has every record.
    Synced,
    /// Installing a snapshot or behind.
    CatchingUp,
    /// Not heard for `takeover_s`.
    Lost,
}

impl From<PeerState> for PeerStateName {
    fn from(p: PeerState) -> Self {
        match p {
            PeerState::Synced => Self::Synced,
            PeerState::CatchingUp => Self::CatchingUp,
            PeerState::Lost => Self::Lost,
        }
    }
}
