//! `tidemark run`: the gateway over MQTT. Components, each handed its section
//! of the config, wired by channels, in the shape of mini-redis's
//! `server::run(listener, shutdown)`; the links are `sys::link`'s, the clocks
//! `sys::clock`'s:
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

mod alarm;
pub mod ceiling;
mod control;
mod core;
mod durable;
mod error;
mod events;
mod fence;
pub mod http;
mod outputs;
mod pair;
mod report;
mod source;
pub mod status;
mod wiring;

use tokio::sync::mpsc;

use crate::config::Config;
use crate::sys::broker;
use crate::sys::clock::SystemClock;
pub use control::{LogControl, ReloadOptions};
use durable::restore::restore;
pub use error::RunError;
use http::Http;

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
        match &cfg.standby {
            None => {
                serve(
                    cfg,
                    opts,
                    SystemClock::new(),
                    crate::sys::shutdown_signal(),
                    hangups,
                )
                .await
            }
            Some(sb) => paired(cfg, opts, sb, hangups).await,
        }
    })
}

/// One board of a pair (docs/reference.md#standby--two-boards-one-gateway): standby until the active is dead, then
/// active until deposed (then standby again) or stopped.
async fn paired(
    cfg: &Config,
    opts: ReloadOptions,
    sb: &crate::config::Standby,
    mut hangups: mpsc::UnboundedReceiver<()>,
) -> Result<(), RunError> {
    let clock = SystemClock::new();
    let shutdown = crate::sys::shutdown_signal();
    tokio::pin!(shutdown);
    let inst = u64::try_from(clock.now().wall).unwrap_or(1) ^ (u64::from(std::process::id()) << 32);
    let mut opts = Some(opts);
    status::health::notify_ready(&format!("standby pair node {}: electing", sb.node));
    let mut start = tokio::select! {
        () = &mut shutdown => return Ok(()),
        s = pair::elect(cfg, sb, inst) => s?,
    };
    loop {
        let activation = match start {
            pair::Start::Active(a) => a,
            pair::Start::Standby(link, claim) => {
                match pair::follow(cfg, sb, link, claim, clock, &mut shutdown).await? {
                    pair::Followed::Takeover(a) => a,
                    pair::Followed::Stopped => return Ok(()),
                }
            }
        };
        let Some(o) = opts.take() else {
            return Err(RunError::Pair("reload options used twice".into()));
        };
        pair::activated(cfg);
        let paths = o.paths.clone();
        let remote = o.remote.clone();
        let (hang_tx, hang_rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let run = serve_as(
            cfg,
            o,
            clock,
            async move {
                let _ = stop_rx.await;
            },
            hang_rx,
            Some(activation),
        );
        tokio::pin!(run);
        let mut stop_tx = Some(stop_tx);
        let ended = loop {
            tokio::select! {
                r = &mut run => break r,
                () = &mut shutdown, if stop_tx.is_some() => {
                    if let Some(t) = stop_tx.take() {
                        let _ = t.send(());
                    }
                }
                Some(()) = hangups.recv() => { let _ = hang_tx.send(()); }
            }
        };
        match ended {
            Err(RunError::Deposed { node, epoch }) => {
                opts = Some(ReloadOptions {
                    paths,
                    log: None,
                    remote,
                });
                let link = pair::PairLink::open(
                    (cfg.gateway.id.as_ref(), &cfg.source),
                    sb,
                    crate::pair::Role::Standby,
                    inst,
                )?;
                let claim = crate::pair::Claim { node, epoch, at: 0 };
                start = pair::Start::Standby(link, Some(claim));
            }
            other => return other,
        }
    }
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
    hangups: mpsc::UnboundedReceiver<()>,
) -> Result<(), RunError> {
    serve_as(cfg, opts, clock, shutdown, hangups, None).await
}

/// [`serve`], as the active board of a pair when `pair` is given (docs/reference.md#standby--two-boards-one-gateway).
async fn serve_as(
    cfg: &Config,
    opts: ReloadOptions,
    clock: SystemClock,
    shutdown: impl std::future::Future<Output = ()>,
    mut hangups: mpsc::UnboundedReceiver<()>,
    pair: Option<pair::Activation>,
) -> Result<(), RunError> {
    let owned = cfg.clone();
    let restored = tokio::task::spawn_blocking(move || restore(&owned, clock)).await??;
    if !cfg.source.v5 && cfg.broker.embedded.is_none() {
        tracing::warn!(
            "source protocol v3.1.1: the site broker sends at most its in-flight window of QoS 1 messages \
             (mosquitto max_inflight_messages, default 20) before their acks, and drops queued ones past \
             max_queued_messages (default 1000); raise both on the broker (docs/operate.md, The site broker) or use v5"
        );
    }
    if let Some(addr) = cfg.broker.embedded {
        broker::start(addr)?;
        tracing::info!(listen = %addr, "embedded broker (MQTT 3.1.1, in memory) started");
    }
    let listener = match cfg.metrics.listen {
        Some(addr) => Some(
            Http::bind(addr)
                .await
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        None => None,
    };
    let mut gw = wiring::start(cfg, opts, restored, listener, clock, pair)?;
    tracing::info!(gateway = %cfg.gateway.id, source = %cfg.source.endpoint.url(),
        sink = %cfg.sink.endpoint.url(), config_hash = %cfg.hash(), "tidemark running");
    // State is restored and the source is connecting (or retrying): systemd may go on.
    status::health::notify_ready(&format!("running; source {}", cfg.source.endpoint.url()));
    tokio::pin!(shutdown);
    let mut confirm = tokio::time::interval(std::time::Duration::from_millis(100));
    confirm.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let failed = loop {
        tokio::select! {
            () = &mut shutdown => break None,
            e = gw.fatal.recv() => break e,
            Some(()) = hangups.recv() => {
                status::health::notify_reloading();
                gw.reloader.reload().await;
                status::health::notify_ready("running; config reloaded");
            }
            Some(ev) = gw.reloader.next_event() => gw.reloader.on(ev).await,
            _ = confirm.tick(), if gw.reloader.confirming() => gw.reloader.confirm().await,
        }
    };
    if let Some(e) = failed {
        if matches!(e, RunError::Deposed { .. }) {
            gw.abort().await;
        }
        return Err(e);
    }
    tracing::info!("stopping: final commit, then acks and the uplink");
    status::health::notify_stopping();
    gw.stop().await
}
