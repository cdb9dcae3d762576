//! Builds each component from its slice of the config and wires them: the
//! channels between them, the threads and tasks that run them, and the order
//! in which they stop.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::model::OutputKind;
use crate::run::control::{ReloadOptions, Reloader, Targets};
use crate::run::core::{self, Core, CoreConfig};
use crate::run::durable;
use crate::run::durable::restore::Restored;
use crate::run::error::RunError;
use crate::run::events::{Control, Ctx, Inbound, StoreJob, StoreState};
use crate::run::http::Http;
use crate::run::outputs::database;
use crate::run::outputs::mqtt::Sink;
use crate::run::source::{self, Source};
use crate::run::status::health::{self, Health};
use crate::run::status::registry::Registry;
use crate::sys::clock::SystemClock;

/// A running gateway: what stops it and what reloads it.
pub struct Running {
    /// A failure that stops the gateway (the store; a refused probe topic).
    pub fatal: mpsc::UnboundedReceiver<RunError>,
    /// Applies SIGHUPs and remote documents.
    pub reloader: Reloader,
    core_tx: mpsc::Sender<Inbound>,
    /// The source's control (its stop).
    source: mpsc::UnboundedSender<Control<crate::config::Source>>,
    stop_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    registry: Arc<Registry>,
}

/// The core and store threads (blocking work: the engine, fsync).
fn spawn_threads(
    core: Core,
    durable: durable::Durable,
    links: durable::Links,
    clock: SystemClock,
    fatal: mpsc::UnboundedSender<RunError>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    Ok(vec![
        std::thread::Builder::new()
            .name("tidemark-core".into())
            .spawn(move || core.run())?,
        std::thread::Builder::new()
            .name("tidemark-store".into())
            .spawn(move || {
                if let Err(e) = durable::run(durable, links, clock) {
                    let _ = fatal.send(RunError::Store(e));
                }
            })?,
    ])
}

/// The shared registry, with what the restored state and the pair already know.
fn registry(
    cfg: &Config,
    opts: &ReloadOptions,
    restored: &Restored,
    clock: SystemClock,
    pair: Option<&crate::run::pair::Activation>,
) -> Arc<Registry> {
    let registry = Arc::new(Registry::new(
        Arc::new(Health::new(clock)),
        restored.outbox_depth,
        restored.outbox_dropped,
        cfg.hash(),
    ));
    registry.config_id.store(
        opts.remote.as_ref().map_or(0, |r| r.id),
        std::sync::atomic::Ordering::Relaxed,
    );
    if let Some(a) = pair {
        a.show(&registry);
    }
    registry
}

/// The outputs over the outbox (docs/reference.md#sinkpostgres-and-sinkinflux): the
/// sink, the edge node (`[sink.sparkplug]`), the database outputs; an entry
/// leaves the outbox once every output that carries results has it.
#[allow(clippy::type_complexity)]
fn outputs(
    cfg: &Config,
    restored: &Restored,
    (ctx, core_tx, stop_rx): (&Ctx, mpsc::Sender<Inbound>, &watch::Receiver<bool>),
    (sink_rx, delivered_tx, documents_tx, committed_rx): (
        mpsc::UnboundedReceiver<crate::run::outputs::mqtt::SinkMsg>,
        watch::Sender<u64>,
        mpsc::UnboundedSender<crate::run::events::ControlEvent>,
        watch::Receiver<u64>,
    ),
) -> Result<(Option<Sink>, Vec<JoinHandle<()>>), RunError> {
    let mut marks: Vec<(OutputKind, watch::Receiver<u64>)> = Vec::new();
    let mut tasks = Vec::new();
    let mut spb = None;
    let (plain_tx, plain_rx) = watch::channel(0u64);
    if cfg.sink.plain {
        marks.push((OutputKind::Mqtt, plain_rx));
    }
    if let Some(node) = &cfg.sink.sparkplug {
        let (edge_tx, edge_rx) = watch::channel(0u64);
        let (spb_tx, spb_rx) = mpsc::unbounded_channel();
        let edge = crate::run::outputs::sparkplug::EdgeSink::new(
            (cfg.sink.clone(), node.clone()),
            ctx,
            (restored.durable.store().reader(), spb_rx),
            (edge_tx, &cfg.gateway.state_dir),
            (restored.driver.engine().bd_seq(), core_tx.clone()),
        )?;
        tasks.push(tokio::spawn(edge.run()));
        marks.push((OutputKind::Sparkplug, edge_rx));
        spb = Some(spb_tx);
    }
    let gateway = cfg.gateway.id.to_string();
    let mut dbs = Vec::new();
    if let Some(pg) = &cfg.sink.postgres {
        dbs.push(database::Db::postgres(pg.clone(), gateway.clone()));
    }
    if let Some(ix) = &cfg.sink.influx {
        dbs.push(database::Db::influx(ix.clone(), gateway.clone()));
    }
    for db in dbs {
        let kind = db.kind();
        let (tx, rx) = watch::channel(0u64);
        let mark = restored.driver.engine().output_mark(db.kind());
        let links = database::Links {
            reader: restored.durable.store().reader(),
            committed: committed_rx.clone(),
            core: core_tx.clone(),
            delivered: tx,
            registry: ctx.registry.clone(),
            stop: stop_rx.clone(),
            fence: ctx.fence.clone(),
        };
        let out = database::DbOutput::new(db, links, (mark, cfg.sink.prefix.clone()), ctx.clock);
        tasks.push(tokio::spawn(out.run()));
        marks.push((kind, rx));
    }
    tasks.push(tokio::spawn(all_delivered(
        marks,
        delivered_tx,
        ctx.registry.clone(),
    )));
    if cfg.sink.endpoint.host.is_empty() {
        // Database outputs only, no upstream broker: the sink's messages go nowhere.
        tasks.push(tokio::spawn(drain(sink_rx)));
        return Ok((None, tasks));
    }
    let mut sink = Sink::new(
        cfg.sink.clone(),
        ctx,
        (restored.durable.store().reader(), sink_rx),
        (plain_tx, documents_tx),
    )?;
    if let Some(spb) = spb {
        sink = sink.with_edge_node(spb);
    }
    Ok((Some(sink), tasks))
}

/// The sink's messages without an upstream broker, until the stop.
async fn drain(mut rx: mpsc::UnboundedReceiver<crate::run::outputs::mqtt::SinkMsg>) {
    use crate::run::outputs::mqtt::SinkMsg;
    while let Some(m) = rx.recv().await {
        if matches!(m, SinkMsg::Control(Control::Stop)) {
            return;
        }
    }
}

/// An active board of a pair: its store replicates each commit, and its pair
/// task sends them to the standby and holds their acks.
fn active_pair(
    durable: durable::Durable,
    pair: Option<(crate::run::pair::Activation, crate::run::pair::ActiveLinks)>,
    (seed, clock, standby): (u64, SystemClock, Option<&crate::config::Standby>),
) -> (durable::Durable, Option<crate::run::pair::ActivePair>) {
    match pair.zip(standby) {
        Some(((activation, links), sb)) => {
            let takeover_ms = sb.takeover_ms;
            let stream = seed.rotate_left(41) | 1;
            let task =
                crate::run::pair::ActivePair::new(activation, links, clock, (stream, takeover_ms));
            (durable.replicating(), Some(task))
        }
        None => (durable, None),
    }
}

/// The tasks, in the order they stop: the ack task's flush ends the source,
/// the store's last batch the sink.
#[allow(clippy::type_complexity)]
fn spawn_tasks(
    (source, sink, edge_tasks, pair_task): (
        Source,
        Option<Sink>,
        Vec<JoinHandle<()>>,
        Option<crate::run::pair::ActivePair>,
    ),
    (registry, core_tx, wake_rx, stop_rx): (
        &Arc<Registry>,
        &mpsc::Sender<Inbound>,
        watch::Receiver<u64>,
        &watch::Receiver<bool>,
    ),
    (acks_rx, current_rx, acked_tx, flushed_tx): (
        mpsc::UnboundedReceiver<crate::run::events::AckJob>,
        watch::Receiver<(u64, crate::sys::link::Client)>,
        watch::Sender<u64>,
        watch::Sender<bool>,
    ),
) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(health::watchdog(registry.health.clone(), stop_rx.clone())),
        tokio::spawn(core::wake(core_tx.clone(), wake_rx, stop_rx.clone())),
        tokio::spawn(crate::run::durable::acks::acks(
            acks_rx, current_rx, acked_tx, flushed_tx,
        )),
        tokio::spawn(source.run()),
    ];
    if let Some(sink) = sink {
        tasks.push(tokio::spawn(sink.run()));
    }
    tasks.extend(edge_tasks);
    if let Some(p) = pair_task {
        tasks.push(tokio::spawn(p.run()));
    }
    tasks
}

/// Builds and starts every component on the restored state.
// Long by choice: the one place where every channel is made and its two ends
// handed out; split, a channel's ends would live in different functions.
#[allow(clippy::too_many_lines)]
pub fn start(
    cfg: &Config,
    opts: ReloadOptions,
    restored: Restored,
    listener: Option<TcpListener>,
    clock: SystemClock,
    pair: Option<crate::run::pair::Activation>,
) -> Result<Running, RunError> {
    let started_at = clock.now().wall;
    let seed = u64::try_from(started_at).unwrap_or(1) ^ u64::from(std::process::id());
    let registry = registry(cfg, &opts, &restored, clock, pair.as_ref());
    let source_link = source::build(&cfg.source, started_at)?;
    // A board of a pair acts only on a fresh proof of the claim (its pair task keeps it).
    let (proof, fence) = if pair.is_some() {
        let (p, f) = crate::run::fence::Fence::paired(clock);
        (Some(p), f)
    } else {
        (None, crate::run::fence::Fence::open(clock))
    };

    let (core_tx, core_rx) = mpsc::channel::<Inbound>(8192);
    let (store_tx, store_rx) = std::sync::mpsc::sync_channel::<StoreJob>(1);
    let (acks_tx, acks_rx) = mpsc::unbounded_channel();
    let (sink_tx, sink_rx) = mpsc::unbounded_channel();
    let (store_events_tx, store_events_rx) = mpsc::unbounded_channel();
    let (source_ctl_tx, source_ctl_rx) = mpsc::unbounded_channel();
    let (fatal_tx, fatal) = mpsc::unbounded_channel::<RunError>();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (flushed_tx, flushed_rx) = watch::channel(false);
    let (store_state_tx, store_state_rx) = watch::channel(StoreState::Ok);
    let (delivered_tx, delivered_rx) = watch::channel(0u64);
    let (current_tx, current_rx) = watch::channel((0u64, source_link.0.clone()));
    let (acked_tx, acked_rx) = watch::channel(0u64);
    let (wake_tx, wake_rx) = watch::channel(cfg.gateway.wake_every_ms());
    let (control_tx, events) = mpsc::unbounded_channel();
    let (snapshots_tx, snapshots_rx) = watch::channel(0u64);
    let (pair_tx, pair_rx) = mpsc::unbounded_channel();
    let ctx = Ctx {
        registry: registry.clone(),
        clock,
        seed,
        started_at,
        fence,
    };
    let (committed_tx, committed_rx) = watch::channel(0u64);
    let (sink, edge_tasks) = outputs(
        cfg,
        &restored,
        (&ctx, core_tx.clone(), &stop_rx),
        (sink_rx, delivered_tx, control_tx.clone(), committed_rx),
    )?;
    let fleet_last_id = restored.driver.engine().fleet_last_id();
    let core = Core::new(
        restored.driver,
        clock,
        CoreConfig::of(cfg),
        core::Links {
            rx: core_rx,
            store: store_tx,
            store_events: store_events_rx,
            store_state: store_state_rx.clone(),
            delivered: delivered_rx.clone(),
            sink: sink_tx.clone(),
            commands: current_rx.clone(),
            registry: registry.clone(),
            snapshots: snapshots_rx,
        },
    );
    let store_links = durable::Links {
        rx: store_rx,
        acks: acks_tx.clone(),
        sink: sink_tx.clone(),
        events: store_events_tx,
        state: store_state_tx,
        delivered: delivered_rx,
        committed: committed_tx,
        stop: stop_rx.clone(),
        registry: registry.clone(),
        pair: (pair.is_some() && proof.is_some()).then_some(pair_tx),
    };
    let links = proof.map(|proof| crate::run::pair::ActiveLinks {
        commits: pair_rx,
        acks: acks_tx.clone(),
        snapshots: snapshots_tx,
        sink: sink_tx.clone(),
        registry: registry.clone(),
        deposed: fatal_tx.clone(),
        proof,
    });
    let (durable, pair_task) = active_pair(
        restored.durable,
        pair.zip(links),
        (seed, clock, cfg.standby.as_ref()),
    );
    let source = Source::new(
        cfg.source.clone(),
        source_link,
        &ctx,
        source::Links {
            core: core_tx.clone(),
            control: source_ctl_rx,
            store_state: store_state_rx,
            current: current_tx,
            acked: acked_rx,
            flushed: flushed_rx,
            fatal: fatal_tx.clone(),
            events: control_tx,
        },
    );
    let threads = spawn_threads(core, durable, store_links, clock, fatal_tx)?;
    let tasks = spawn_tasks(
        (source, sink, edge_tasks, pair_task),
        (&registry, &core_tx, wake_rx, &stop_rx),
        (acks_rx, current_rx, acked_tx, flushed_tx),
    );
    let http = Http::start(
        listener,
        &cfg.metrics,
        (registry.clone(), core_tx.clone()),
        stop_rx,
    );
    let targets = Targets {
        core: core_tx.clone(),
        source: source_ctl_tx.clone(),
        sink: sink_tx,
        wake: wake_tx,
        http,
    };
    let reloader = Reloader::new(
        (opts, fleet_last_id),
        cfg.clone(),
        (targets, events),
        registry.clone(),
        clock,
    );
    Ok(Running {
        fatal,
        reloader,
        core_tx,
        source: source_ctl_tx,
        stop_tx,
        tasks,
        threads,
        registry,
    })
}

/// The lowest of the outputs' delivered marks: entries below it leave the outbox.
async fn all_delivered(
    marks: Vec<(OutputKind, watch::Receiver<u64>)>,
    out: watch::Sender<u64>,
    registry: Arc<Registry>,
) {
    let mut slots: [Option<watch::Receiver<u64>>; 4] = Default::default();
    let mut kinds = Vec::new();
    for (slot, (kind, m)) in slots.iter_mut().zip(marks) {
        registry.outputs[kind as usize]
            .enabled
            .store(true, Ordering::Relaxed);
        kinds.push(kind);
        *slot = Some(m);
    }
    if slots[0].is_none() {
        return;
    }
    loop {
        let mut upto = u64::MAX;
        for (kind, m) in kinds.iter().zip(slots.iter_mut().flatten()) {
            let v = *m.borrow_and_update();
            upto = upto.min(v);
            let stat = &registry.outputs[*kind as usize];
            // The uplinks' figures; the database outputs keep their own.
            if matches!(kind, OutputKind::Mqtt | OutputKind::Sparkplug) {
                let was = stat.upto.swap(v, Ordering::Relaxed);
                if was > 0 {
                    stat.written
                        .fetch_add(v.saturating_sub(was), Ordering::Relaxed);
                }
                stat.connected
                    .store(registry.sink_up.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
        if upto > *out.borrow() {
            out.send_replace(upto);
        }
        let [a, b, c, d] = &mut slots;
        let changed = tokio::select! {
            r = changed(a) => r,
            r = changed(b) => r,
            r = changed(c) => r,
            r = changed(d) => r,
        };
        if !changed {
            return;
        }
    }
}

/// A slot's next change (false: its sender is gone); an empty slot never changes.
async fn changed(m: &mut Option<watch::Receiver<u64>>) -> bool {
    match m {
        Some(m) => m.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

impl Running {
    /// Deposed (docs/reference.md#standby--two-boards-one-gateway): every task ends at once, nothing more is published
    /// or acknowledged; the threads end once their channels close.
    pub async fn abort(self) {
        let _ = self.stop_tx.send(true);
        let _ = self.source.send(Control::Stop);
        for t in &self.tasks {
            t.abort();
        }
        let http = self.reloader.into_http();
        http.abort();
        // The HTTP side holds a sender to the core: the core thread ends once all are gone.
        drop(http);
        drop(self.core_tx);
        for t in self.tasks {
            let _ = t.await;
        }
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }

    /// Stop ingest → the core's last batch → its commit and acks → the source
    /// disconnects → the sink drains and goes offline.
    pub async fn stop(mut self) -> Result<(), RunError> {
        let _ = self.stop_tx.send(true);
        let _ = self.source.send(Control::Stop);
        let _ = self.core_tx.send(Inbound::Control(Control::Stop)).await;
        drop(self.core_tx);
        let http = self.reloader.into_http();
        let tasks = self.tasks;
        let all = async {
            http.finished().await;
            for t in tasks {
                let _ = t.await;
            }
        };
        if tokio::time::timeout(Duration::from_millis(4500), all)
            .await
            .is_err()
        {
            tracing::warn!("shutdown took too long; exiting with what is committed");
        }
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
        if let Ok(e) = self.fatal.try_recv() {
            return Err(e);
        }
        tracing::info!(
            received = self.registry.received.load(Ordering::Relaxed),
            outbox_depth = self.registry.outbox_depth.load(Ordering::Relaxed),
            "stopped"
        );
        Ok(())
    }
}
