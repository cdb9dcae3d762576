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
use crate::run::status::registry::Registry;
use std::sync::atomic::Ordering;

use crate::pair::{Action, Beat, Claim, Follower, Note, Position, Role};
use crate::store::Store;
use crate::store::wal::Wal;
use crate::sys::clock::SystemClock;

/// The replicated state on the standby's disk and in its engine.
struct Replica {
    durable: crate::run::durable::Durable,
    engine: Engine,
    in_force: Vec<u8>,
}

/// Opens the state dir exactly as it is: no new clock origin, no reload (a
/// standby's engine must stay the active's, record for record).
fn open_replica(cfg: &Config) -> Result<Replica, RunError> {
    let (durable, engine, in_force) = crate::run::durable::restore::open_state(cfg)?;
    Ok(Replica {
        durable,
        engine,
        in_force,
    })
}

/// The standby's note that its state file is the active's, in sync as of its last
/// record (epoch, stream, position): after a power cut of both boards the former
/// standby takes over from its own disk (docs/pair.md).
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
    // The status endpoint answers from the replicated engine (docs/reference.md#standby--two-boards-one-gateway: the standby shows its lag).
    let registry = Arc::new(Registry::new(
        Arc::new(crate::run::status::health::Health::new(clock)),
        0,
        0,
        cfg.hash(),
    ));
    let (queries_tx, mut queries) = mpsc::channel::<crate::run::events::Inbound>(64);
    let (http_stop_tx, http_stop) = watch::channel(false);
    let http = match cfg.metrics.listen {
        Some(addr) => Some(
            crate::run::http::Http::bind(addr)
                .await
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        None => None,
    };
    let http = crate::run::http::Http::start(
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
    proven_at: Millis,
}

/// The standby's I/O around [`Follower`]: its replica on disk, the status
/// endpoint, the pair's link.
struct Pump<'a> {
    cfg: &'a Config,
    link: &'a mut PairLink,
    clock: SystemClock,
    registry: &'a Arc<Registry>,
    empty: &'a Engine,
    replica: Option<Replica>,
    started: (Millis, Millis),
}

/// The replica on disk as it was when this board stopped, if it was in sync then.
fn resume(cfg: &Config) -> (Option<Replica>, Option<Position>) {
    let Some(at) = read_synced(&cfg.gateway.state_dir) else {
        return (None, None);
    };
    match tokio::task::block_in_place(|| open_replica(cfg)) {
        Ok(r) => {
            tracing::info!(
                epoch = at.epoch,
                position = at.pos,
                "pair: this board's replica was in sync when it stopped"
            );
            (Some(r), Some(at))
        }
        Err(e) => {
            tracing::warn!(error = %e, "pair: the replica on disk does not open; asking the active for its state");
            (None, None)
        }
    }
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
    let (mut pump, resumed) = Pump::open(cfg, link, clock, (registry, empty));
    let mut f = Follower::new(
        &sb.node,
        pump.link.inst,
        sb.takeover_ms,
        sb.max_frame,
        claim.clone(),
        resumed,
        pump.started.0,
    );
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!(node = %sb.node, "pair: standby; asking the active for its state");
    let taken = loop {
        let actions = tokio::select! {
            () = &mut *shutdown => break None,
            Some(q) = queries.recv() => {
                pump.answer(q, &f);
                continue;
            }
            ev = pump.link.events.recv() => {
                let Some(ev) = ev else {
                    return Err(RunError::Pair("pair link ended".into()));
                };
                pump.event(&mut f, ev)
            }
            _ = tick.tick() => {
                let now = pump.clock.now();
                let out = f.tick(now.mono, now.wall);
                pump.show(&f, now);
                out
            }
        };
        if let Some(t) = pump.act(&mut f, actions).await? {
            break Some(t);
        }
    };
    *claim = f.claim().cloned();
    Ok(taken)
}

impl<'a> Pump<'a> {
    /// The standby's side opened: its role on the link, and the replica on disk
    /// with its position if it was in sync when this board stopped.
    fn open(
        cfg: &'a Config,
        link: &'a mut PairLink,
        clock: SystemClock,
        (registry, empty): (&'a Arc<Registry>, &'a Engine),
    ) -> (Self, Option<Position>) {
        let _ = link.role.send(Role::Standby);
        let (replica, resumed) = resume(cfg);
        let now = clock.now();
        let pump = Pump {
            cfg,
            link,
            clock,
            registry,
            empty,
            replica,
            started: (now.mono, now.wall),
        };
        (pump, resumed)
    }

    /// One event of the link, into the machine.
    fn event(&mut self, f: &mut Follower, ev: PairEvent) -> Vec<Action> {
        let now = self.clock.now();
        let topics = &self.link.topics;
        match ev {
            PairEvent::Up => f.up(now.mono),
            PairEvent::Down => Vec::new(),
            PairEvent::Msg(topic, payload) if topic == topics.stream() => {
                f.frame(&payload, now.mono, now.wall)
            }
            PairEvent::Msg(topic, payload) if topic == topics.state() => {
                if let Ok(c) = serde_json::from_slice::<Claim>(&payload) {
                    f.state(c, now.mono);
                }
                Vec::new()
            }
            PairEvent::Msg(topic, payload) => {
                let Some(node) = topics.node_of(&topic) else {
                    return Vec::new();
                };
                match serde_json::from_slice::<Beat>(&payload) {
                    Ok(b) => f.beat(node, &b, now.mono, now.wall),
                    Err(_) => Vec::new(),
                }
            }
        }
    }

    /// Carries out the machine's actions (and those they lead to); a takeover ends the loop.
    async fn act(
        &mut self,
        f: &mut Follower,
        actions: Vec<Action>,
    ) -> Result<Option<Taken>, RunError> {
        let mut queue = std::collections::VecDeque::from(actions);
        let dir = self.cfg.gateway.state_dir.clone();
        while let Some(a) = queue.pop_front() {
            match a {
                Action::Report(r) => self.link.report(&r),
                Action::Beat(epoch, pos) => {
                    let sent = self.clock.mono();
                    self.link.beat(Role::Standby, (epoch, pos), false, sent);
                }
                Action::Install(item) => {
                    tracing::info!(
                        bytes = item.data.len(),
                        pos = item.pos,
                        "pair: installing the active's snapshot"
                    );
                    let ok = tokio::task::block_in_place(|| {
                        install(self.cfg, &mut self.replica, &item.data)
                    })?;
                    queue.extend(f.installed(&item, ok));
                }
                Action::Apply(item) => queue.extend(self.apply(f, &item)),
                Action::MarkSynced(p) => mark_synced(&dir, &p),
                Action::Unmark => unmark_synced(&dir),
                Action::Claim(mine) => match self.claim(f, mine).await {
                    Ok(taken) => return Ok(Some(taken)),
                    Err(out) => queue.extend(out),
                },
                Action::TakeOver(..) => {}
                Action::Say(note) => say(&note)?,
            }
        }
        Ok(None)
    }

    /// A record to the replica; what the machine makes of the outcome.
    fn apply(&mut self, f: &mut Follower, item: &crate::pair::Item) -> Vec<Action> {
        let Some(r) = self.replica.as_mut() else {
            return Vec::new();
        };
        let applied = tokio::task::block_in_place(|| {
            r.durable.follow(&mut r.engine, &item.data, &mut r.in_force)
        });
        // Rebirth requests are the active's to send.
        r.engine.take_commands();
        if let Err(e) = &applied {
            tracing::warn!(error = %e, "pair: a record did not apply; asking for a snapshot");
        }
        f.applied(item, applied.is_ok(), self.clock.now().wall)
    }

    /// This board's claim raced on the site broker: the takeover, or what the
    /// machine does instead.
    async fn claim(&mut self, f: &mut Follower, mine: Claim) -> Result<Taken, Vec<Action>> {
        let proven_at = self.clock.mono();
        tracing::warn!(active = %f.claim().map_or("", |c| c.node.as_str()), epoch = mine.epoch,
            "pair: the active is dead; taking over");
        let outcome = self.link.claim(&mine).await;
        let out = f.claimed(mine, outcome, self.clock.mono());
        if let Some(Action::TakeOver(c, from, pos)) = out.first() {
            drop(self.replica.take());
            return Ok(Taken {
                epoch: c.epoch,
                from: Some((from.clone(), *pos)),
                proven_at,
            });
        }
        Err(out)
    }

    /// Answers a status query from the replicated engine.
    fn answer(&self, q: crate::run::events::Inbound, f: &Follower) {
        if let crate::run::events::Inbound::Query(q, reply) = q {
            let engine = self.replica.as_ref().map_or(self.empty, |r| &r.engine);
            let links = crate::run::status::api::Links {
                source_up: false,
                source_since: self.started.1,
                last_commit_at: f.last_applied(),
                proven: f.proven().unwrap_or(self.started.0),
            };
            let _ = reply.send(crate::run::status::api::answer(
                engine,
                &q,
                self.clock.now(),
                self.registry,
                links,
            ));
        }
    }

    /// The pair's status and metrics, after a tick.
    fn show(&self, f: &Follower, now: crate::engine::Now) {
        let status = f.status(now.mono, self.link.rejected.load(Ordering::Relaxed));
        if let Ok(mut p) = self.registry.pair.lock() {
            *p = Some(status);
        }
        self.registry.health.core_beat(now.mono);
        let engine = self.replica.as_ref().map_or(self.empty, |r| &r.engine);
        self.registry.health.set_prometheus(
            crate::run::status::metrics::collect(engine, now, self.registry, false).prometheus(),
        );
    }
}

/// Logs what the machine says; an exhausted epoch ends the standby.
fn say(note: &Note) -> Result<(), RunError> {
    match note {
        Note::Gap(pos) => tracing::info!(pos, "pair: a record is missing; asking for a snapshot"),
        Note::ActiveGone(node) => {
            tracing::warn!(active = %node, "pair: the site broker reports the active gone")
        }
        Note::Twin => tracing::error!(
            "pair: another process runs with this board's standby.node; give each board its own"
        ),
        Note::Stalled(ms) => tracing::warn!(
            stalled_ms = ms,
            "pair: this board stalled; the active's silence is counted from now"
        ),
        Note::CannotTakeOver(active) => {
            tracing::error!(active = %active, "pair: the active is gone and this board does not have its state (it never finished catching up): not taking over")
        }
        Note::Superseded(c) => {
            tracing::warn!(active = %c.node, epoch = c.epoch, "pair: another board claimed the gateway first; following it")
        }
        Note::NoEcho => {
            tracing::warn!("pair: the claim did not come back from the site broker; retrying")
        }
        Note::EpochExhausted => return Err(RunError::Pair("the pair's epoch is exhausted".into())),
    }
    Ok(())
}
