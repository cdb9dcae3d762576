//! `tidemark run`: the gateway over MQTT. The only module that imports tokio
//! and rumqttc and reads the clocks. A task or thread per concern, fed by
//! channels, in the shape of mini-redis's `server::run(listener, shutdown)`:
//!
//! ```text
//! source task ─► core thread (engine) ─► store thread (redb) ─► ack task ─► source broker
//!  (rumqttc)       ticks, batches          one txn per batch  └─► sink task ─► upstream broker
//! ```
//! Shutdown: stop forwarding input → the core processes what it has and cuts
//! the last batch → the store commits it → its acks go out → the source
//! disconnects → the sink drains for a few seconds, publishes `offline`, exits.

mod core;
mod delivery;
mod health;
mod metrics;
mod sink;
mod source;
mod storer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::config::{Config, Protocol, SinkFormat};
use crate::driver::Driver;
use crate::engine::Engine;
use crate::store::{Batch, Store, StoreError};
use crate::sys::clock::SystemClock;
use crate::sys::{broker, link};
use core::Inbound;
use link::{LinkError, LinkOptions};

/// State shared between the tasks (counters and marks only).
pub struct Shared {
    /// One past the highest outbox sequence number acknowledged upstream (0: none yet).
    pub delivered: AtomicU64,
    /// Outbox entries after the last commit.
    pub outbox_depth: AtomicU64,
    /// Outputs dropped because the outbox was full.
    pub outbox_dropped: AtomicU64,
    /// Wall time of the oldest undelivered output (0: unknown or none).
    pub outbox_oldest: AtomicI64,
    /// The outbox bound (for logs).
    pub outbox_max: u64,
    /// The sink is connected.
    pub sink_up: AtomicBool,
    /// Source connection generation; ack tokens of an older one are dropped.
    pub source_gen: AtomicU64,
    /// Messages handed to the core in this process.
    pub received: AtomicU64,
    /// Output encoding.
    pub format: SinkFormat,
    /// `P/metrics` payloads to the sink.
    pub metrics_tx: mpsc::UnboundedSender<Vec<u8>>,
    /// Liveness of the parts (watchdog, `/healthz`).
    pub health: Arc<health::Health>,
    /// The HTTP endpoint is on: keep its Prometheus text fresh.
    pub http: bool,
    /// Durable writes: journal records \[0\], checkpoints \[1\].
    pub commits: [AtomicU64; 2],
    /// Bytes appended to the journal.
    pub journal_bytes: AtomicU64,
    /// Bytes in the journal since the last checkpoint.
    pub journal_len: AtomicU64,
    /// The store asks the core for a checkpoint (the outbox went over its bound).
    pub want_checkpoint: AtomicBool,
    /// Time from receipt to release of QoS 1 acks.
    pub ack_delay: metrics::Histogram,
    /// The state store cannot commit (a full disk): no new batches, input paused.
    pub store_blocked: AtomicBool,
    /// A stop was requested (a store outage gives up then).
    pub stopping: AtomicBool,
}

#[derive(Serialize)]
struct GatewayAlert<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    at: crate::model::Millis,
}

/// A gateway-level alert for `P/alerts` (SPEC §8).
pub(crate) fn gateway_alert(
    format: SinkFormat,
    kind: &str,
    detail: Option<&str>,
    at: crate::model::Millis,
) -> Vec<u8> {
    format.encode(&GatewayAlert { kind, detail, at })
}

/// A batch for the store thread and the acks it releases.
pub struct StoreJob {
    /// What to commit.
    pub batch: Batch,
    /// Acks of the messages the batch covers, in receive order, with the
    /// monotonic time each message was taken.
    pub acks: Vec<(u64, link::Held, crate::model::Millis)>,
    /// The final batch of a graceful stop.
    pub last: bool,
}

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

#[derive(Serialize)]
struct Status<'a> {
    state: &'a str,
    version: &'a str,
}

/// Runs the gateway until SIGTERM/SIGINT (then flushes and returns Ok).
pub fn run(cfg: &Config) -> Result<(), RunError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tidemark-io")
        .enable_all()
        .build()?;
    rt.block_on(serve(
        cfg,
        SystemClock::new(),
        crate::sys::shutdown_signal(),
    ))
}

/// The state restored from disk, ready to drive.
struct Restored {
    durable: storer::Durable,
    driver: Driver,
    outbox_depth: u64,
    outbox_dropped: u64,
}

/// Opens the state dir and brings the engine to the last commit (blocking I/O).
fn restore(cfg: &Config) -> Result<Restored, RunError> {
    let (mut store, snap) = Store::open(&cfg.state_dir, cfg.outbox_max_messages)?;
    store.set_max_bytes(cfg.outbox_max_bytes);
    let (groups, devices) = (snap.groups.len(), snap.devices.len());
    let mut engine = Engine::new(&cfg.engine());
    engine.restore(snap.groups, snap.devices, snap.metric_names, snap.counters);
    engine.restore_clock(snap.gateway_clock);
    engine.restore_sparkplug(snap.sparkplug);
    // What the journal holds since the last checkpoint goes into the engine and the state file.
    let (durable, replayed) =
        storer::Durable::recover(store, &cfg.state_dir, &snap.meta, &mut engine)?;
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
    Ok(Restored {
        durable,
        driver,
        outbox_depth,
        outbox_dropped,
    })
}

/// The gateway until `shutdown` completes (then the last commit, its acks and
/// the uplink's drain), in the shape of mini-redis's `server::run`: `run`
/// passes the process's signals, a test may pass any future.
pub async fn serve(
    cfg: &Config,
    clock: SystemClock,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let owned = cfg.clone();
    let Restored {
        durable: store,
        driver,
        outbox_depth,
        outbox_dropped,
    } = tokio::task::spawn_blocking(move || restore(&owned)).await??;
    if cfg.source_protocol == Protocol::V311 {
        tracing::warn!(
            "source protocol v3.1.1: the site broker sends at most its in-flight window of QoS 1 messages \
             (mosquitto max_inflight_messages, default 20) before their acks, and drops queued ones past \
             max_queued_messages (default 1000); raise both on the broker (README: The site broker) or use v5"
        );
    }
    let (metrics_tx, metrics_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        delivered: AtomicU64::new(0),
        outbox_depth: AtomicU64::new(outbox_depth),
        outbox_dropped: AtomicU64::new(outbox_dropped),
        outbox_oldest: AtomicI64::new(0),
        outbox_max: cfg.outbox_max_messages,
        sink_up: AtomicBool::new(false),
        source_gen: AtomicU64::new(0),
        received: AtomicU64::new(0),
        format: cfg.sink_format,
        metrics_tx,
        health: Arc::new(health::Health::new(clock)),
        http: cfg.metrics_listen.is_some(),
        commits: [AtomicU64::new(0), AtomicU64::new(0)],
        journal_bytes: AtomicU64::new(0),
        journal_len: AtomicU64::new(0),
        want_checkpoint: AtomicBool::new(false),
        ack_delay: metrics::Histogram::default(),
        store_blocked: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
    });
    let seed = u64::try_from(clock.now().wall).unwrap_or(1) ^ u64::from(std::process::id());
    let version = env!("CARGO_PKG_VERSION");
    let status_topic = format!("{}/status", cfg.topic_prefix);
    let status = |state| cfg.sink_format.encode(&Status { state, version });
    let (online, offline) = (status("online"), status("offline"));

    if let Some(addr) = cfg.embedded_broker {
        broker::start(addr)?;
        tracing::info!(listen = %addr, "embedded broker (MQTT 3.1.1, in memory) started");
    }
    let http_listener = match cfg.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        None => None,
    };
    // Sparkplug Primary Host Application: a retained STATE birth on every
    // connect, its death (same timestamp, as Sparkplug 3.0 pairs them) as the will.
    let host_state = cfg.sparkplug.host_id.as_ref().map(|host| {
        let topic = format!("{}/STATE/{host}", crate::sparkplug::NAMESPACE);
        let at = clock.now().wall;
        let state = |online: bool| {
            serde_json::to_vec(&serde_json::json!({"online": online, "timestamp": at}))
                .unwrap_or_default()
        };
        (topic, state(true), state(false))
    });
    let (src_client, src_loop) = link::build(&LinkOptions {
        endpoint: &cfg.source,
        v5: cfg.source_protocol == Protocol::V5,
        persistent: true,
        session_expiry_s: cfg.session_expiry_s,
        manual_acks: true,
        will: host_state
            .as_ref()
            .map(|(t, _, dead)| (t.clone(), dead.clone())),
        inflight: 100,
    })?;
    let mut topics = cfg.topics.clone();
    if cfg.sparkplug.enabled {
        topics.extend(crate::sparkplug::filters(&cfg.sparkplug.group_ids));
    }
    let sink_window = cfg.sink_max_inflight;
    let (sink_client, sink_loop) = link::build(&LinkOptions {
        endpoint: &cfg.sink,
        v5: cfg.sink_protocol == Protocol::V5,
        persistent: false,
        session_expiry_s: 0,
        manual_acks: false,
        will: Some((status_topic.clone(), offline.clone())),
        inflight: sink_window,
    })?;

    let (core_tx, core_rx) = mpsc::channel::<Inbound>(8192);
    let (store_tx, store_rx) = std::sync::mpsc::sync_channel::<StoreJob>(1);
    let (acks_tx, acks_rx) = mpsc::unbounded_channel();
    let (sink_tx, sink_rx) = mpsc::unbounded_channel();
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel::<StoreError>();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (flushed_tx, flushed_rx) = watch::channel(false);

    let metrics_ms = i64::try_from(cfg.metrics_interval_s.saturating_mul(1000)).unwrap_or(i64::MAX);
    let core_shared = shared.clone();
    let cadence = if cfg.source_protocol == Protocol::V311 {
        core::Cadence {
            hold_limit: 20,
            quiet_ms: Some(100),
        }
    } else {
        // v5: the broker honours our Receive Maximum (65535).
        core::Cadence {
            hold_limit: 4096,
            quiet_ms: None,
        }
    };
    // Rebirth requests go to the site broker, not upstream.
    let commands = src_client.clone();
    let core = std::thread::Builder::new()
        .name("tidemark-core".into())
        .spawn(move || {
            core::run(
                driver,
                clock,
                core_rx,
                store_tx,
                core_shared,
                metrics_ms,
                cadence,
                commands,
            )
        })?;
    let reader = store.store().reader();
    let store_shared = shared.clone();
    let storer = std::thread::Builder::new()
        .name("tidemark-store".into())
        .spawn(move || {
            let r = storer::run(store, store_rx, acks_tx, sink_tx, store_shared, clock);
            if let Err(e) = r {
                let _ = fatal_tx.send(e);
            }
        })?;

    let source = tokio::spawn(source::run(
        src_loop,
        src_client.clone(),
        source::Subscription {
            topics,
            qos: cfg.source.qos,
            url: endpoint_url(&cfg.source),
            host_state,
        },
        core_tx.clone(),
        shared.clone(),
        stop_rx.clone(),
        flushed_rx,
        seed,
    ));
    let acker = tokio::spawn(source::acks(
        src_client,
        acks_rx,
        shared.clone(),
        flushed_tx,
    ));
    let sink = tokio::spawn(sink::run(
        sink_loop,
        sink_client,
        sink::SinkOptions {
            qos: cfg.sink.qos,
            status_topic,
            online,
            offline,
            metrics_topic: format!("{}/metrics", cfg.topic_prefix),
            alerts_topic: format!("{}/alerts", cfg.topic_prefix),
            window: usize::from(sink_window),
            url: endpoint_url(&cfg.sink),
        },
        reader,
        sink_rx,
        metrics_rx,
        shared.clone(),
        seed.rotate_left(17),
    ));
    let wake_every = cfg.tick_interval_ms.min(cfg.commit_interval_ms).max(1);
    let wake_tx = core_tx.clone();
    let mut wake_stop = stop_rx.clone();
    let waker = tokio::spawn(async move {
        let mut iv = tokio::time::interval(Duration::from_millis(wake_every));
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = iv.tick() => { let _ = wake_tx.try_send(Inbound::Wake); }
                _ = wake_stop.changed() => return,
            }
        }
    });
    let watchdog = tokio::spawn(health::watchdog(shared.health.clone(), stop_rx.clone()));
    let http = http_listener.map(|l| {
        tokio::spawn(health::serve(
            l,
            shared.health.clone(),
            cfg.health_timeout_ms,
            stop_rx.clone(),
        ))
    });
    tracing::info!(
        gateway = %cfg.gateway_id,
        source = %endpoint_url(&cfg.source),
        sink = %endpoint_url(&cfg.sink),
        "tidemark running"
    );
    // State is restored and the source is connecting (or retrying): systemd may go on.
    health::notify_ready(&format!("running; source {}", endpoint_url(&cfg.source)));

    let failed = tokio::select! {
        () = shutdown => None,
        e = fatal_rx.recv() => e,
    };
    if let Some(e) = failed {
        return Err(RunError::Store(e));
    }
    tracing::info!("stopping: final commit, then acks and the uplink");
    health::notify_stopping();
    shared.stopping.store(true, Ordering::Release);
    let _ = stop_tx.send(true);
    let _ = core_tx.send(Inbound::Stop).await;
    drop(core_tx);
    let all = async {
        let _ = watchdog.await;
        if let Some(h) = http {
            let _ = h.await;
        }
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
        received = shared.received.load(Ordering::Relaxed),
        outbox_depth = shared.outbox_depth.load(Ordering::Relaxed),
        "stopped"
    );
    Ok(())
}

fn endpoint_url(ep: &crate::config::Endpoint) -> String {
    format!(
        "{}://{}:{}",
        if ep.tls { "mqtts" } else { "mqtt" },
        ep.host,
        ep.port
    )
}
