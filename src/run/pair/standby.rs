//! The standby: follows the active's records into its own state dir and takes
//! over when the active is dead.

use super::*;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::config::{Config, Standby};
use crate::engine::Engine;
use crate::model::Millis;
use crate::run::error::RunError;
use crate::run::registry::Registry;
use std::sync::atomic::Ordering;

use crate::pair::{
    Assembler, Beat, Claim, PeerStateName, PeerStatus, Position, Report, Role, Status, Step,
};
use crate::store::Store;
use crate::store::wal::Wal;
use crate::sys::clock::SystemClock;

/// The replicated state on the standby's disk and in its engine.
struct Replica {
    durable: crate::run::storer::Durable,
    engine: Engine,
    in_force: Vec<u8>,
}

/// Opens the state dir exactly as it is: no new clock origin, no reload (a
/// standby's engine must stay the active's, record for record).
fn open_replica(cfg: &Config) -> Result<Replica, RunError> {
    let (durable, engine, in_force) = crate::run::restore::open_state(cfg)?;
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
        Arc::new(crate::run::health::Health::new(clock)),
        0,
        0,
        cfg.hash(),
    ));
    let (queries_tx, mut queries) = mpsc::channel::<crate::run::events::Inbound>(64);
    let (http_stop_tx, http_stop) = watch::channel(false);
    let http = match cfg.metrics.listen {
        Some(addr) => Some(
            crate::run::reload::Http::bind(addr)
                .await
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        None => None,
    };
    let http = crate::run::reload::Http::start(
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
    queries: &mut mpsc::Receiver<crate::run::events::Inbound>,
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
                if let crate::run::events::Inbound::Query(q, reply) = q {
                    let engine = replica.as_ref().map_or(empty, |r| &r.engine);
                    let links = crate::run::api::Links {
                        source_up: false,
                        source_since: start_wall,
                        last_commit_at: last_applied,
                        proven: own_echo.unwrap_or(start),
                    };
                    let _ = reply.send(crate::run::api::answer(engine, &q, clock.now(), registry, links));
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
                    crate::run::metrics::collect(engine, now, registry, false).prometheus(),
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
