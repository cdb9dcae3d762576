//! SIGHUP (docs/reference.md#reload-sighup-systemctl-reload-tidemark): the same `--config` files and environment read again,
//! validated as `check` does, and applied in place by each component that owns
//! the changed part — or rejected with the reason, changing nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use std::collections::VecDeque;

use tokio::sync::mpsc::{Sender, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;

use crate::config::{self, Config};
use crate::fleet::{Checks, ConfigResult, Document, Outcome, Remote, Via};
use crate::model::Millis;
use crate::run::events::{Control, ControlEvent, Inbound, Notice, Side};
use crate::run::http::Http;
use crate::run::outputs::mqtt::SinkMsg;
use crate::run::source::SourceConfig;
use crate::run::status::registry::Registry;
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
    /// The remote layer the gateway started with (docs/reference.md#remote-configuration-fleet).
    pub remote: Option<Remote>,
}

/// The components a reload speaks to.
pub struct Targets {
    /// The core (engine rules), in order with the messages.
    pub core: Sender<Inbound>,
    /// The source (filters, connection).
    pub source: UnboundedSender<Control<SourceConfig>>,
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
    /// The remote layer in force (docs/reference.md#remote-configuration-fleet).
    remote: Remote,
    /// A remote document applied and waiting for both connections.
    pending: Option<Pending>,
    /// The last desired document looked at (a hash of the message): the
    /// retained one comes again at every connect and is answered once.
    desired_seen: Option<u64>,
    /// A desired document that came while another was on probation.
    deferred: Option<Vec<u8>>,
    /// What the source and the sink say (documents, their links' ups and downs).
    events: UnboundedReceiver<ControlEvent>,
    /// Documents taken in while catching up on link events.
    inbox: VecDeque<ControlEvent>,
    /// The source subscribed, the sink connected.
    up: [bool; 2],
}

/// A document on probation: what to go back to, and what confirms it.
struct Pending {
    id: u64,
    /// `P/config/result` of the prefix the document came under.
    topic: String,
    previous: Box<Config>,
    previous_remote: Remote,
    deadline: Millis,
    /// A new connection of the source, of the sink, is still to come (its link
    /// changed); a link that did not change need only be up.
    awaited: [bool; 2],
}

impl Reloader {
    /// A reloader for a gateway started with `current`; `opts.1` is the
    /// highest remote document id the state store holds.
    pub fn new(
        opts: (ReloadOptions, u64),
        current: Config,
        (targets, events): (Targets, UnboundedReceiver<ControlEvent>),
        registry: Arc<Registry>,
        clock: SystemClock,
    ) -> Self {
        let (opts, stored_id) = opts;
        let mut remote = opts.remote.clone().unwrap_or_default();
        // A lost or corrupt remote.toml never lowers the id the state store holds.
        remote.last_id = remote.last_id.max(stored_id);
        Self {
            opts,
            current,
            targets,
            registry,
            clock,
            remote,
            pending: None,
            desired_seen: None,
            deferred: None,
            events,
            inbox: VecDeque::new(),
            up: [false; 2],
        }
    }

    /// The next word from the source or the sink (cancel-safe).
    pub async fn next_event(&mut self) -> Option<ControlEvent> {
        if let Some(ev) = self.inbox.pop_front() {
            return Some(ev);
        }
        self.events.recv().await
    }

    /// Handles one word from the source or the sink.
    pub async fn on(&mut self, ev: ControlEvent) {
        match ev {
            ControlEvent::Document(via, doc) => self.document(via, &doc).await,
            ControlEvent::Link(side, up) => self.link(side, up),
        }
    }

    /// A link went up or down; a new connection is what a document on probation awaits.
    fn link(&mut self, side: Side, up: bool) {
        let i = side as usize;
        self.up[i] = up;
        if up && let Some(p) = &mut self.pending {
            p.awaited[i] = false;
        }
    }

    /// Takes in every link event already sent: what happened before a change
    /// is not the change's new connection. Documents wait their turn.
    fn catch_up(&mut self) {
        while let Ok(ev) = self.events.try_recv() {
            match ev {
                ControlEvent::Link(side, up) => self.up[side as usize] = up,
                doc @ ControlEvent::Document(..) => self.inbox.push_back(doc),
            }
        }
    }

    /// Gives the HTTP endpoint back for the shutdown.
    pub fn into_http(self) -> Http {
        self.targets.http
    }

    /// One SIGHUP: the files and environment again, with the remote layer in force.
    pub async fn reload(&mut self) {
        tracing::info!(files = ?self.opts.paths, "reload requested: reading the config again");
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let local = match config::load_with_env(&self.opts.paths, &env) {
            Ok(c) => c,
            Err(e) => return self.reject(e.problems),
        };
        let (new, left_out) =
            config::over_remote(local, &self.opts.paths, &env, &self.remote.config);
        if let Some(why) = left_out {
            tracing::warn!(
                document = self.remote.id,
                "the remote layer does not fit the new local config and is left out: {why}"
            );
        }
        if let Err(errors) = self.apply(new).await {
            self.reject(errors);
        }
    }

    /// Applies `new` in place, or names why not (then nothing changed).
    async fn apply(&mut self, new: Config) -> Result<String, Vec<String>> {
        let changed = self.current.changed_keys(&new);
        let restart = self.current.needs_restart(&new);
        if !restart.is_empty() {
            return Err(restart
                .iter()
                .map(|k| format!("{k}: needs a restart (nothing of this reload was applied)"))
                .collect());
        }
        // What can still fail comes first: nothing is applied unless all of it works.
        let (m, was) = (&new.metrics, &self.current.metrics);
        let rebind = m.listen != was.listen
            || m.health_timeout_ms != was.health_timeout_ms
            || m.token != was.token;
        let listener = match (rebind, m.listen) {
            (true, Some(addr)) => match Http::bind(addr).await {
                Ok(l) => Some(l),
                Err(e) => return Err(vec![format!("metrics.listen {addr}: {e}")]),
            },
            _ => None,
        };
        if let Some(log) = &self.opts.log
            && new.log.level != self.current.log.level
            && let Err(e) = log(&new.log.level)
        {
            return Err(vec![format!("log.level: {e}")]);
        }
        let hash = new.hash();
        if self
            .targets
            .core
            .send(Inbound::Control(Control::Reload(Box::new(new.clone()))))
            .await
            .is_err()
        {
            return Err(vec!["the gateway is stopping".into()]);
        }
        let _ = self
            .targets
            .source
            .send(Control::Reload(new.source.clone()));
        self.registry.reloaded(Some(&hash));
        let _ = self
            .targets
            .sink
            .send(SinkMsg::Control(Control::Reload(Box::new(
                new.sink.clone(),
            ))));
        if rebind {
            self.targets.http.serve(listener, &new.metrics);
        }
        self.targets.wake.send_replace(new.gateway.wake_every_ms());
        if new.log.format != self.current.log.format {
            tracing::warn!("log.format takes effect at the next start");
        }
        tracing::info!(hash = %hash, changed = ?changed, "config applied");
        let _ = self
            .targets
            .sink
            .send(SinkMsg::Notice(Notice::ConfigApplied {
                hash: hash.clone(),
                changed,
                at: self.clock.now().wall,
            }));
        self.current = new;
        Ok(hash)
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

    /// A remote document is waiting for its connections.
    pub fn confirming(&self) -> bool {
        self.pending.is_some()
    }

    /// `P/config/result` under the prefix in force (a document may change it).
    fn result_topic(&self) -> String {
        self.current.sink.topic("config/result")
    }

    fn result(&self, id: Option<u64>, result: Outcome, hash: Option<String>, errors: Vec<String>) {
        self.result_to(self.result_topic(), id, result, hash, errors);
    }

    fn result_to(
        &self,
        topic: String,
        id: Option<u64>,
        result: Outcome,
        hash: Option<String>,
        errors: Vec<String>,
    ) {
        match result {
            Outcome::Applied => tracing::info!(document = id, hash, "remote config applied"),
            _ => tracing::warn!(document = id, ?result, errors = ?errors, "remote config not kept"),
        }
        let at = self.clock.now().wall;
        let _ = self.targets.sink.send(SinkMsg::Result(
            topic,
            ConfigResult {
                id,
                result,
                hash,
                errors,
                at,
            },
        ));
    }

    /// A `P/config/set` or `P/config/desired` message: checked, then applied on
    /// probation, or rejected with its reasons (then nothing changed). A desired
    /// document is looked at once, and not at all when its id was taken already.
    pub async fn document(&mut self, via: Via, payload: &[u8]) {
        if !self.current.fleet.enabled {
            return;
        }
        if via == Via::Desired {
            let seen = {
                use std::hash::{Hash, Hasher};
                let mut h = std::hash::DefaultHasher::new();
                payload.hash(&mut h);
                h.finish()
            };
            if self.desired_seen == Some(seen) {
                return;
            }
            if self.pending.is_some() {
                self.deferred = Some(payload.to_vec());
                return;
            }
            self.desired_seen = Some(seen);
            let id = serde_json::from_slice::<serde_json::Value>(payload)
                .ok()
                .and_then(|v| v.get("id").and_then(serde_json::Value::as_u64));
            if id.is_some_and(|id| id <= self.remote.last_id) {
                tracing::debug!(document = id, "desired config already taken");
                return;
            }
            tracing::info!(document = id, "a newer desired config: taking it");
        }
        self.take(payload).await;
    }

    async fn take(&mut self, payload: &[u8]) {
        let doc: Document = match serde_json::from_slice(payload) {
            Ok(d) => d,
            Err(e) => {
                let id = serde_json::from_slice::<serde_json::Value>(payload)
                    .ok()
                    .and_then(|v| v.get("id").and_then(serde_json::Value::as_u64));
                return self.result(
                    id,
                    Outcome::Rejected,
                    None,
                    vec![format!("invalid: message: {e}")],
                );
            }
        };
        let id = Some(doc.id);
        let checks = Checks {
            trusted: &self.current.fleet.trusted_keys,
            gateway: &self.current.gateway.id,
            now: self.clock.now().wall,
            accept_v1: self.current.fleet.accept_v1,
        };
        if let Err(why) = doc.verify(&checks) {
            return self.result(id, Outcome::Rejected, None, vec![why.into()]);
        }
        if doc.id <= self.remote.last_id {
            tracing::warn!(
                document = doc.id,
                last = self.remote.last_id,
                "remote document refused: its id is not above the last applied one"
            );
            return self.result(id, Outcome::Rejected, None, vec!["stale_id".into()]);
        }
        if let Some(p) = &self.pending {
            let why = format!("invalid: document {} is still being confirmed", p.id);
            return self.result(id, Outcome::Rejected, None, vec![why]);
        }
        // Taken from here on, applied or not: durable in the state store first.
        let _ = self
            .targets
            .core
            .send(Inbound::Mark(crate::journal::Mark::FleetId(doc.id)))
            .await;
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let new = match config::load_with_remote(&self.opts.paths, &env, &doc.config) {
            Ok(c) => c,
            Err(e) => {
                let errors = e.problems.iter().map(|p| format!("invalid: {p}")).collect();
                return self.result(id, Outcome::Rejected, None, errors);
            }
        };
        let restart = self.current.needs_restart(&new);
        if !restart.is_empty() {
            let errors = restart
                .iter()
                .map(|k| format!("needs_restart: {k}"))
                .collect();
            return self.result(id, Outcome::Rejected, None, errors);
        }
        let previous = self.current.clone();
        let topic = self.result_topic();
        let source_moves = !previous.source.same_link(&new.source);
        let sink_moves = previous.sink != new.sink;
        self.catch_up();
        if let Err(errors) = self.apply(new).await {
            let errors = errors
                .into_iter()
                .map(|e| format!("invalid: {e}"))
                .collect();
            return self.result(id, Outcome::Rejected, None, errors);
        }
        tracing::info!(
            document = doc.id,
            confirm_s = previous.fleet.confirm_ms / 1000,
            "remote config applied on probation: waiting for source and sink"
        );
        let previous_remote = std::mem::replace(
            &mut self.remote,
            Remote {
                id: doc.id,
                last_id: doc.id,
                config: doc.config,
            },
        );
        self.pending = Some(Pending {
            id: doc.id,
            topic,
            deadline: self.clock.mono()
                + i64::try_from(self.current.fleet.confirm_ms).unwrap_or(i64::MAX / 2),
            previous: Box::new(previous),
            previous_remote,
            awaited: [source_moves, sink_moves],
        });
    }

    /// Confirms the pending document once both connections are up, or rolls
    /// it back once `confirm_s` has passed.
    pub async fn confirm(&mut self) {
        let Some(p) = &self.pending else { return };
        let source_ok = self.up[0] && !p.awaited[0];
        let sink_ok = self.up[1] && !p.awaited[1];
        let Some(p) = (if source_ok && sink_ok || self.clock.mono() >= p.deadline {
            self.pending.take()
        } else {
            None
        }) else {
            return;
        };
        if source_ok && sink_ok {
            let hash = self.current.hash();
            match self.remote.write(&self.current.gateway.state_dir) {
                Ok(()) => {
                    self.in_force();
                    self.result_to(
                        p.topic,
                        Some(p.id),
                        Outcome::Applied,
                        Some(hash),
                        Vec::new(),
                    );
                }
                Err(e) => {
                    let why = format!("store: writing remote.toml: {e}");
                    self.roll_back(p, vec![why]).await;
                }
            }
        } else {
            let mut errors = Vec::new();
            if !source_ok {
                errors.push("not_connected: source".to_owned());
            }
            if !sink_ok {
                errors.push("not_connected: sink".to_owned());
            }
            self.roll_back(p, errors).await;
        }
        if let Some(d) = self.deferred.take() {
            Box::pin(self.document(Via::Desired, &d)).await;
        }
    }

    /// The remote document in force goes into the retained `P/status`.
    fn in_force(&self) {
        self.registry
            .config_id
            .store(self.remote.id, Ordering::Relaxed);
        let _ = self
            .targets
            .sink
            .send(SinkMsg::Control(Control::Reload(Box::new(
                self.current.sink.clone(),
            ))));
    }

    async fn roll_back(&mut self, p: Pending, errors: Vec<String>) {
        tracing::warn!(document = p.id, errors = ?errors, "rolling the remote config back");
        let last_id = self.remote.last_id;
        self.remote = Remote {
            last_id,
            ..p.previous_remote
        };
        // Its id stays taken: a replay of it is refused.
        if let Err(e) = self.remote.write(&self.current.gateway.state_dir) {
            tracing::error!(error = %e, "cannot keep the remote layer's last id in remote.toml");
        }
        self.registry
            .config_id
            .store(self.remote.id, Ordering::Relaxed);
        let hash = match self.apply(*p.previous).await {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!(errors = ?e, "the previous config cannot be applied again");
                None
            }
        };
        self.result_to(p.topic, Some(p.id), Outcome::RolledBack, hash, errors);
    }
}
