//! `tidemark run`: the gateway over MQTT. The only module that imports tokio
//! and rumqttc and reads the clocks. Components built from their own slice of
//! the config, wired by channels, in the shape of mini-redis's
//! `server::run(listener, shutdown)`:
//!
//! ```text
//! source ─► core thread (engine) ─► store thread (redb) ─► acks ─► source broker
//! (rumqttc)  ticks, plan, batches    one txn per batch   └─► sink ─► upstream broker
//!    ▲            ▲                        │ StoreEvent, StoreState     │ delivered mark
//!    └──── reload (SIGHUP): each component applies its own slice ◄──────┘
//! ```
//! Shutdown: stop forwarding input → the core processes what it has and cuts
//! the last batch → the store commits it → its acks go out → the source
//! disconnects → the sink drains for a few seconds, publishes `offline`, exits.

mod core;
mod delivery;
mod events;
mod health;
mod metrics;
mod plan;
mod registry;
mod reload;
mod sink;
mod source;
mod storer;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::config::{Config, Protocol};
use crate::driver::Driver;
use crate::engine::Engine;
use crate::store::{Store, StoreError};
use crate::sys::broker;
use crate::sys::clock::SystemClock;
use crate::sys::link::LinkError;
use core::{Core, CoreConfig};
use events::StoreState;
use events::{Inbound, StoreJob};
use registry::Registry;
use reload::{Http, Reloader, Targets};
pub use reload::{LogControl, ReloadOptions};
use sink::{Sink, SinkConfig};
use source::{Source, SourceConfig};

/// Why the gateway stopped with exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The state store failed (unreadable file, disk error).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A connection could not be set up (TLS material).
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The async runtime or a thread could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// Restoring the state did not finish (its thread panicked).
    #[error("restoring the state: {0}")]
    Restore(#[from] tokio::task::JoinError),
    /// The local HTTP endpoint could not listen.
    #[error("metrics.listen {addr}: {source}")]
    Listen {
        /// `metrics.listen`.
        addr: std::net::SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The embedded broker did not start.
    #[error(transparent)]
    Broker(#[from] broker::BrokerError),
}

/// Runs the gateway until SIGTERM/SIGINT (then flushes and returns Ok);
/// SIGHUP reloads the config files `opts` names.
pub fn run(cfg: &Config, opts: ReloadOptions) -> Result<(), RunError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tidemark-io")
        .enable_all()
        .build()?;
    rt.block_on(async {
        // Installed first: from here a SIGHUP reloads instead of killing the process.
        let hangups = crate::sys::hangups()?;
        serve(
            cfg,
            opts,
            SystemClock::new(),
            crate::sys::shutdown_signal(),
            hangups,
        )
        .await
    })
}

/// The state restored from disk, ready to drive.
struct Restored {
    durable: storer::Durable,
    driver: Driver,
    outbox_depth: u64,
    outbox_dropped: u64,
}

/// Opens the state dir and brings the engine to the last commit (blocking I/O),
/// under the rules each journaled message arrived with; then `cfg`'s rules, if
/// they differ, as a reload would apply them.
fn restore(cfg: &Config, clock: SystemClock) -> Result<Restored, RunError> {
    let (mut store, snap) = Store::open(&cfg.state_dir, cfg.outbox_max_messages)?;
    store.set_max_bytes(cfg.outbox_max_bytes);
    let (groups, devices) = (snap.groups.len(), snap.devices.len());
    let doc = crate::store::schema::rules_doc(&snap.meta);
    let at_checkpoint = doc.as_deref().map(crate::config::engine_from_doc);
    let mut engine = match at_checkpoint {
        Some(Ok(rules)) => Engine::new(&rules),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "the rules recorded with the state do not validate; starting with the configured ones");
            Engine::new(&cfg.engine())
        }
        None => Engine::new(&cfg.engine()),
    };
    engine.restore(snap.groups, snap.devices, snap.metric_names, snap.counters);
    engine.restore_clock(snap.gateway_clock);
    engine.restore_sparkplug(snap.sparkplug);
    // What the journal holds since the last checkpoint goes into the engine and the state file.
    let configured = cfg.engine_doc();
    let (durable, replayed, in_force) =
        storer::Durable::recover(store, &cfg.state_dir, &snap.meta, &mut engine, &configured)?;
    let outbox_depth = durable.store().outbox_depth()?;
    let outbox_dropped = durable.store().outbox_dropped();
    tracing::info!(
        state = %durable.store().path().display(),
        groups,
        devices,
        journal_records = replayed,
        outbox_depth,
        "state restored"
    );
    let mut driver = Driver::new(engine, cfg, cfg.sink_format, None).with_journal();
    // This process's monotonic clock starts afresh: the last reference of wall − mono is void.
    driver.new_clock_origin();
    // Rebirth requests recomputed from the journal were sent (or not) by the last process.
    driver.engine_mut().take_commands();
    if in_force == configured {
        driver.set_rules_doc(configured);
    } else {
        tracing::info!("the rules changed since the state was written: applied as a reload");
        driver.set_rules_doc(in_force);
        driver.reconfigure(clock.now(), cfg);
    }
    Ok(Restored {
        durable,
        driver,
        outbox_depth,
        outbox_dropped,
    })
}

/// The gateway until `shutdown` completes (then the last commit, its acks and
/// the uplink's drain), in the shape of mini-redis's `server::run`: `run`
/// passes the process's signals, a test may pass any future. Each item of
/// `hangups` is a reload.
pub async fn serve(
    cfg: &Config,
    opts: ReloadOptions,
    clock: SystemClock,
    shutdown: impl std::future::Future<Output = ()>,
    mut hangups: mpsc::UnboundedReceiver<()>,
) -> Result<(), RunError> {
    let owned = cfg.clone();
    let restored = tokio::task::spawn_blocking(move || restore(&owned, clock)).await??;
    if cfg.source_protocol == Protocol::V311 && cfg.embedded_broker.is_none() {
        tracing::warn!(
            "source protocol v3.1.1: the site broker sends at most its in-flight window of QoS 1 messages \
             (mosquitto max_inflight_messages, default 20) before their acks, and drops queued ones past \
             max_queued_messages (default 1000); raise both on the broker (README: The site broker) or use v5"
        );
    }
    let started_at = clock.now().wall;
    let seed = u64::try_from(started_at).unwrap_or(1) ^ u64::from(std::process::id());
    let registry = Arc::new(Registry::new(
        Arc::new(health::Health::new(clock)),
        restored.outbox_depth,
        restored.outbox_dropped,
        cfg.hash(),
    ));
    if let Some(addr) = cfg.embedded_broker {
        broker::start(addr)?;
        tracing::info!(listen = %addr, "embedded broker (MQTT 3.1.1, in memory) started");
    }
    let listener = match cfg.metrics_listen {
        Some(addr) => Some(
            Http::bind(addr)
                .await
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        None => None,
    };
    let source_cfg = SourceConfig::of(cfg, started_at);
    let source_link = source_cfg.build()?;

    let (core_tx, core_rx) = mpsc::channel::<Inbound>(8192);
    let (store_tx, store_rx) = std::sync::mpsc::sync_channel::<StoreJob>(1);
    let (acks_tx, acks_rx) = mpsc::unbounded_channel();
    let (sink_tx, sink_rx) = mpsc::unbounded_channel();
    let (store_events_tx, store_events_rx) = mpsc::unbounded_channel();
    let (source_ctl_tx, source_ctl_rx) = mpsc::unbounded_channel();
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel::<StoreError>();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (flushed_tx, flushed_rx) = watch::channel(false);
    let (store_state_tx, store_state_rx) = watch::channel(StoreState::Ok);
    let (delivered_tx, delivered_rx) = watch::channel(0u64);
    let (current_tx, current_rx) = watch::channel((0u64, source_link.0.clone()));
    let (acked_tx, acked_rx) = watch::channel(0u64);

    let sink = Sink::new(
        SinkConfig::of(cfg),
        restored.durable.store().reader(),
        sink_rx,
        registry.clone(),
        delivered_tx,
        (seed.rotate_left(17), started_at),
    )?;
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
        },
    );
    let core = std::thread::Builder::new()
        .name("tidemark-core".into())
        .spawn(move || core.run())?;
    let store_links = storer::Links {
        rx: store_rx,
        acks: acks_tx,
        sink: sink_tx.clone(),
        events: store_events_tx,
        state: store_state_tx,
        delivered: delivered_rx,
        stop: stop_rx.clone(),
        registry: registry.clone(),
    };
    let durable = restored.durable;
    let storer = std::thread::Builder::new()
        .name("tidemark-store".into())
        .spawn(move || {
            if let Err(e) = storer::run(durable, store_links, clock) {
                let _ = fatal_tx.send(e);
            }
        })?;
    let source_url = source_cfg.url();
    let source = Source::new(
        source_cfg,
        source_link,
        source::Links {
            core: core_tx.clone(),
            control: source_ctl_rx,
            store_state: store_state_rx,
            current: current_tx,
            acked: acked_rx,
            stop: stop_rx.clone(),
            flushed: flushed_rx,
            registry: registry.clone(),
        },
        seed,
    );
    let source = tokio::spawn(source.run());
    let acker = tokio::spawn(source::acks(acks_rx, current_rx, acked_tx, flushed_tx));
    let sink = tokio::spawn(sink.run());
    let (wake_tx, wake_rx) = watch::channel(core::wake_every(cfg));
    let waker = tokio::spawn(core::wake(core_tx.clone(), wake_rx, stop_rx.clone()));
    let watchdog = tokio::spawn(health::watchdog(registry.health.clone(), stop_rx.clone()));
    let http = Http::start(
        listener,
        cfg.health_timeout_ms,
        registry.health.clone(),
        stop_rx.clone(),
    );
    let mut reloader = Reloader::new(
        opts,
        cfg.clone(),
        Targets {
            core: core_tx.clone(),
            source: source_ctl_tx,
            sink: sink_tx,
            wake: wake_tx,
            http,
        },
        registry.clone(),
        (clock, started_at),
    );
    tracing::info!(gateway = %cfg.gateway_id, source = %source_url,
        sink = %cfg.sink.url(), config_hash = %cfg.hash(), "tidemark running");
    // State is restored and the source is connecting (or retrying): systemd may go on.
    health::notify_ready(&format!("running; source {source_url}"));

    tokio::pin!(shutdown);
    let failed = loop {
        tokio::select! {
            () = &mut shutdown => break None,
            e = fatal_rx.recv() => break e,
            Some(()) = hangups.recv() => {
                health::notify_reloading();
                reloader.reload().await;
                health::notify_ready("running; config reloaded");
            }
        }
    };
    if let Some(e) = failed {
        return Err(RunError::Store(e));
    }
    tracing::info!("stopping: final commit, then acks and the uplink");
    health::notify_stopping();
    let _ = stop_tx.send(true);
    let _ = core_tx.send(Inbound::Stop).await;
    drop(core_tx);
    let http = reloader.into_http();
    let all = async {
        let _ = watchdog.await;
        http.finished().await;
        let _ = waker.await;
        let _ = acker.await;
        let _ = source.await;
        let _ = sink.await;
    };
    let finished = tokio::time::timeout(Duration::from_millis(4500), all).await;
    if finished.is_err() {
        tracing::warn!("shutdown took too long; exiting with what is committed");
    }
    let _ = tokio::task::spawn_blocking(move || {
        let _ = core.join();
        let _ = storer.join();
    })
    .await;
    if let Ok(e) = fatal_rx.try_recv() {
        return Err(RunError::Store(e));
    }
    tracing::info!(
        received = registry.received.load(std::sync::atomic::Ordering::Relaxed),
        outbox_depth = registry
            .outbox_depth
            .load(std::sync::atomic::Ordering::Relaxed),
        "stopped"
    );
    Ok(())
}
