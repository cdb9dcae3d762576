//! Hot standby on the site broker (docs/reference.md#standby--two-boards-one-gateway): the pair's own link, the
//! election at start, the active's replication task, and the standby's loop
//! that follows the active's records until it takes over. The rules are pure,
//! in [`crate::pair`]; this is their I/O.

use std::time::Duration;

use super::error::RunError;
use crate::config::{Config, Standby};
use crate::model::Millis;
use crate::run::status::registry::Registry;
use std::sync::atomic::Ordering;

use crate::pair::{Claim, PeerStateName, PeerStatus, Role, Status};
use crate::sys::clock::SystemClock;

use crate::pair::Claimed;
use crate::pair::follow::{BEAT_MS, STALL_MS};

/// At a clean stop, time given to the standby to report the last commit.
const STOP_WAIT_MS: u64 = 2_000;
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
mod active;
mod session;
mod standby;

pub use active::{ActiveLinks, ActivePair};
pub use session::PairLink;
pub use standby::{Followed, activated, follow};

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

/// The retained claim, once connected and subscribed (the broker may be down:
/// this waits for it); None when none came within [`CLAIM_WAIT_MS`].
async fn retained_claim(link: &mut PairLink) -> Result<Option<Claim>, RunError> {
    loop {
        match link.events.recv().await {
            Some(PairEvent::Up) => break,
            Some(_) => {}
            None => return Err(RunError::Pair("pair link ended".into())),
        }
    }
    let state = link.topics.state();
    let deadline = tokio::time::sleep(Duration::from_millis(CLAIM_WAIT_MS));
    tokio::pin!(deadline);
    loop {
        let ev = tokio::select! {
            () = &mut deadline => return Ok(None),
            ev = link.events.recv() => ev,
        };
        let Some(ev) = ev else { return Ok(None) };
        if let PairEvent::Msg(topic, payload) = ev
            && topic == state
            && let Ok(c) = serde_json::from_slice::<Claim>(&payload)
        {
            return Ok(Some(c));
        }
    }
}

/// At start: the retained claim names another board (follow it) or none or
/// this one (claim the next epoch).
pub async fn elect(cfg: &Config, sb: &Standby, inst: u64) -> Result<Start, RunError> {
    let mut link = PairLink::open(
        (cfg.gateway.id.as_ref(), &cfg.source),
        sb,
        Role::Standby,
        inst,
    )?;
    let seen = retained_claim(&mut link).await?;
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
                proven_at,
            }))
        }
    }
}
