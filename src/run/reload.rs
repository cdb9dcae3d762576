//! SIGHUP (SPEC §11): the same `--config` files and environment read again,
//! validated as `check` does, and applied in place by each component that owns
//! the changed part — or rejected with the reason, changing nothing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc::{Sender, UnboundedSender};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::events::{Inbound, Notice};
use super::http;
use super::registry::Registry;
use super::sink::{SinkConfig, SinkMsg};
use super::source::SourceConfig;
use crate::config::{self, Config};
use crate::model::Millis;
use crate::sys::clock::SystemClock;

/// Sets the log filter (`[log] level`) of the running process.
pub type LogControl = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Where a reload reads its config from, and how it changes the log level.
#[derive(Default)]
pub struct ReloadOptions {
    /// The `--config` files, in order.
    pub paths: Vec<PathBuf>,
    /// The log filter's setter (`None`: the level stays as it started).
    pub log: Option<LogControl>,
}

/// The local HTTP endpoint, rebound when `[metrics]` changes.
pub struct Http {
    task: Option<JoinHandle<()>>,
    registry: Arc<Registry>,
    core: Sender<Inbound>,
    stop: watch::Receiver<bool>,
}

impl Http {
    /// Binds `addr` (a reload binds before it applies anything).
    pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
        tokio::net::TcpListener::bind(addr).await
    }

    /// Serves on `listener`, if any, with `cfg`'s `[metrics]` settings.
    pub fn start(
        listener: Option<tokio::net::TcpListener>,
        cfg: &Config,
        (registry, core): (Arc<Registry>, Sender<Inbound>),
        stop: watch::Receiver<bool>,
    ) -> Self {
        let mut h = Self {
            task: None,
            registry,
            core,
            stop,
        };
        h.serve(listener, cfg);
        h
    }

    fn serve(&mut self, listener: Option<tokio::net::TcpListener>, cfg: &Config) {
        if let Some(old) = self.task.take() {
            old.abort();
        }
        self.task = listener.map(|l| {
            let api = http::Api {
                registry: self.registry.clone(),
                core: self.core.clone(),
                limit_ms: cfg.health_timeout_ms,
                token: cfg.metrics_token.clone(),
            };
            tokio::spawn(http::serve(l, api, self.stop.clone()))
        });
    }

    /// Waits for the server to finish (after the stop).
    pub async fn finished(self) {
        if let Some(t) = self.task {
            let _ = t.await;
        }
    }
}

/// The components a reload speaks to.
pub struct Targets {
    /// The core (engine rules), in order with the messages.
    pub core: Sender<Inbound>,
    /// The source (filters, connection).
    pub source: UnboundedSender<SourceConfig>,
    /// The sink (connection, status) and `P/alerts`.
    pub sink: UnboundedSender<SinkMsg>,
    /// The core's wake-up period.
    pub wake: watch::Sender<u64>,
    /// The HTTP endpoint.
    pub http: Http,
}

/// Applies reloads; holds the config in force.
pub struct Reloader {
    opts: ReloadOptions,
    current: Config,
    targets: Targets,
    registry: Arc<Registry>,
    clock: SystemClock,
    started_at: Millis,
}

impl Reloader {
    /// A reloader for a gateway started with `current`.
    pub fn new(
        opts: ReloadOptions,
        current: Config,
        targets: Targets,
        registry: Arc<Registry>,
        (clock, started_at): (SystemClock, Millis),
    ) -> Self {
        Self {
            opts,
            current,
            targets,
            registry,
            clock,
            started_at,
        }
    }

    /// Gives the HTTP endpoint back for the shutdown.
    pub fn into_http(self) -> Http {
        self.targets.http
    }

    /// One SIGHUP.
    pub async fn reload(&mut self) {
        tracing::info!(files = ?self.opts.paths, "reload requested: reading the config again");
        let new = match config::load(&self.opts.paths) {
            Ok(c) => c,
            Err(e) => return self.reject(e.problems),
        };
        let changed = self.current.changed_keys(&new);
        let restart = config::needs_restart(&changed);
        if !restart.is_empty() {
            let errors = restart
                .iter()
                .map(|k| format!("{k}: needs a restart (nothing of this reload was applied)"))
                .collect();
            return self.reject(errors);
        }
        // What can still fail comes first: nothing is applied unless all of it works.
        let rebind = new.metrics_listen != self.current.metrics_listen
            || new.health_timeout_ms != self.current.health_timeout_ms
            || new.metrics_token != self.current.metrics_token;
        let listener = match (rebind, new.metrics_listen) {
            (true, Some(addr)) => match Http::bind(addr).await {
                Ok(l) => Some(l),
                Err(e) => return self.reject(vec![format!("metrics.listen {addr}: {e}")]),
            },
            _ => None,
        };
        if let Some(log) = &self.opts.log
            && changed.iter().any(|k| k == "log.level")
            && let Err(e) = log(&new.log_level)
        {
            return self.reject(vec![format!("log.level: {e}")]);
        }
        let hash = new.hash();
        if self
            .targets
            .core
            .send(Inbound::Reload(Box::new(new.clone())))
            .await
            .is_err()
        {
            return;
        }
        let _ = self
            .targets
            .source
            .send(SourceConfig::of(&new, self.started_at));
        self.registry.reloaded(Some(&hash));
        let _ = self.targets.sink.send(SinkMsg::Apply(SinkConfig::of(&new)));
        if rebind {
            self.targets.http.serve(listener, &new);
        }
        self.targets
            .wake
            .send_replace(super::core::wake_every(&new));
        if changed.iter().any(|k| k == "log.format") {
            tracing::warn!("log.format takes effect at the next start");
        }
        tracing::info!(hash = %hash, changed = ?changed, "config applied");
        let _ = self
            .targets
            .sink
            .send(SinkMsg::Notice(Notice::ConfigApplied {
                hash,
                changed,
                at: self.clock.now().wall,
            }));
        self.current = new;
    }

    fn reject(&self, errors: Vec<String>) {
        for e in &errors {
            tracing::error!("reload rejected: {e}");
        }
        tracing::warn!(
            problems = errors.len(),
            "config not reloaded: the gateway runs on with the config in force"
        );
        self.registry.reloaded(None);
        let _ = self
            .targets
            .sink
            .send(SinkMsg::Notice(Notice::ConfigRejected {
                errors,
                at: self.clock.now().wall,
            }));
    }
}
