//! Liveness of the gateway's parts, for systemd (`Type=notify`, watchdog) and
//! the optional local HTTP endpoint (`/healthz`, Prometheus `/metrics`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;

use crate::model::Millis;
use crate::sys::clock::SystemClock;

/// `-1`: not happening.
const NONE: Millis = -1;

/// Timestamps (monotonic ms) the parts of the gateway leave behind.
#[derive(Debug)]
pub struct Health {
    clock: SystemClock,
    /// Last pass of the core loop (it wakes at least every tick).
    core_beat: AtomicI64,
    /// Start of the commit in progress.
    commit_since: AtomicI64,
    /// Since when the source is down.
    source_down_since: AtomicI64,
    /// The latest Prometheus text, refreshed by the core.
    prometheus: Mutex<String>,
    /// Why the state store cannot commit, while it cannot.
    store: Mutex<Option<String>>,
    /// The source subscription is in place (`/readyz`).
    subscribed: std::sync::atomic::AtomicBool,
}

impl Health {
    /// Everything fresh now; the source down until it connects.
    pub fn new(clock: SystemClock) -> Self {
        let now = clock.mono();
        Self {
            clock,
            core_beat: AtomicI64::new(now),
            commit_since: AtomicI64::new(NONE),
            source_down_since: AtomicI64::new(now),
            prometheus: Mutex::new(String::new()),
            store: Mutex::new(None),
            subscribed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The source broker granted the subscription (`true`) or the link dropped.
    pub fn subscribed(&self, yes: bool) {
        self.subscribed.store(yes, Ordering::Relaxed);
    }

    /// The state store cannot commit (`Some(why)`) or commits again (`None`).
    pub fn store_problem(&self, problem: Option<String>) {
        if let Ok(mut p) = self.store.lock() {
            *p = problem;
        }
    }

    /// The core loop made a pass at `mono`.
    pub fn core_beat(&self, mono: Millis) {
        self.core_beat.store(mono, Ordering::Relaxed);
    }

    /// A commit starts (`true`) or ended (`false`).
    pub fn committing(&self, busy: bool) {
        let v = if busy { self.clock.mono() } else { NONE };
        self.commit_since.store(v, Ordering::Relaxed);
    }

    /// The source connected (`true`) or went down (`false`) at `mono`.
    pub fn source(&self, up: bool, mono: Millis) {
        if up {
            self.source_down_since.store(NONE, Ordering::Relaxed);
        } else {
            let _ = self.source_down_since.compare_exchange(
                NONE,
                mono,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// New Prometheus text.
    pub fn set_prometheus(&self, text: String) {
        if let Ok(mut p) = self.prometheus.lock() {
            *p = text;
        }
    }

    fn state(&self) -> State {
        State {
            now: self.clock.mono(),
            core_beat: self.core_beat.load(Ordering::Relaxed),
            commit_since: self.commit_since.load(Ordering::Relaxed),
            source_down_since: self.source_down_since.load(Ordering::Relaxed),
        }
    }
}

/// A reading of [`Health`] at `now`.
#[derive(Debug, Clone, Copy)]
pub struct State {
    /// Monotonic now.
    pub now: Millis,
    /// Last core pass.
    pub core_beat: Millis,
    /// Start of the commit in progress (`-1`: none).
    pub commit_since: Millis,
    /// Source down since (`-1`: up).
    pub source_down_since: Millis,
}

impl State {
    /// Problems of the engine loop and the store: what the watchdog guards.
    pub fn engine_problems(&self, limit_ms: Millis) -> Vec<String> {
        let mut out = Vec::new();
        let beat = self.now.saturating_sub(self.core_beat);
        if beat > limit_ms {
            out.push(format!("engine loop stalled for {beat} ms"));
        }
        if self.commit_since != NONE {
            let c = self.now.saturating_sub(self.commit_since);
            if c > limit_ms {
                out.push(format!("commit in progress for {c} ms"));
            }
        }
        out
    }

    /// Every problem: the engine's and a source down past `limit_ms`.
    pub fn problems(&self, limit_ms: Millis) -> Vec<String> {
        let mut out = self.engine_problems(limit_ms);
        if self.source_down_since != NONE {
            let d = self.now.saturating_sub(self.source_down_since);
            if d > limit_ms {
                out.push(format!("source down for {d} ms"));
            }
        }
        out
    }
}

/// Tells systemd (when it started us with `Type=notify`) that we are ready.
pub fn notify_ready(status: &str) {
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(status),
    ]);
}

/// Tells systemd a reload has begun (READY follows when it is done).
pub fn notify_reloading() {
    let mut states = vec![sd_notify::NotifyState::Reloading];
    // systemd 253+ (`Type=notify-reload`) wants the instant beside it.
    if let Ok(t) = sd_notify::NotifyState::monotonic_usec_now() {
        states.push(t);
    }
    let _ = sd_notify::notify(&states);
}

/// Tells systemd the stop has begun.
pub fn notify_stopping() {
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping: final commit"),
    ]);
}

/// Pings the systemd watchdog (when `WatchdogSec=` asks for it) at half its
/// period, only while the engine loop and commits are healthy: a wedged
/// gateway is restarted by systemd instead of hanging on.
pub async fn watchdog(health: Arc<Health>, mut stop: watch::Receiver<bool>) {
    let Some(period) = sd_notify::watchdog_enabled() else {
        return;
    };
    let half = (period / 2).max(Duration::from_millis(10));
    let limit = Millis::try_from(half.as_millis()).unwrap_or(Millis::MAX);
    let mut iv = tokio::time::interval(half);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first ping half a period from now: READY (sent once everything is wired) comes first.
    iv.tick().await;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = iv.tick() => {}
            _ = stop.changed() => return,
        }
        let problems = health.state().engine_problems(limit);
        if problems.is_empty() {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            if failing {
                tracing::info!("healthy again: watchdog pings resume");
            }
            failing = false;
        } else if !failing {
            failing = true;
            tracing::error!(problems = %problems.join("; "), "unhealthy: watchdog pings withheld");
        }
    }
}

/// Connections the HTTP endpoint serves at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Serves `/metrics` and `/healthz` on `listener` until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    limit_ms: Millis,
    mut stop: watch::Receiver<bool>,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(listen = %addr, "HTTP endpoint: /metrics, /healthz, /readyz");
    }
    // A flood of connections costs at most this many tasks and sockets; the
    // rest are closed at once (a scraper needs one).
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut refused: u64 = 0;
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("HTTP accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    refused,
                    "HTTP endpoint: {MAX_CONNECTIONS} connections open, closing new ones"
                );
            }
            drop(tcp);
            continue;
        };
        let health = health.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let health = health.clone();
                async move { Ok::<_, Infallible>(respond(&req, &health, limit_ms)) }
            });
            // Slow or garbage clients: headers within 5 s and 16 KiB, one request
            // per connection (no idle keep-alive holding a slot).
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .max_buf_size(16 * 1024)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
            drop(slot);
        });
    }
}

fn respond<B>(req: &Request<B>, health: &Health, limit_ms: Millis) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(hyper::header::CONTENT_TYPE, ctype.parse().expect("static"));
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let text = health
                .prometheus
                .lock()
                .map(|p| p.clone())
                .unwrap_or_default();
            reply(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        "/healthz" => {
            let mut problems = health.state().problems(limit_ms);
            // At once, not after a limit: the store is refusing commits right now.
            if let Some(p) = health.store.lock().ok().and_then(|p| p.clone()) {
                problems.insert(0, p);
            }
            if problems.is_empty() {
                reply(StatusCode::OK, "text/plain", "ok\n".into())
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("unhealthy: {}\n", problems.join("; ")),
                )
            }
        }
        // Ready: state restored and input flowing in (what a tool or a test waits for).
        "/readyz" => {
            if health.subscribed.load(Ordering::Relaxed) {
                reply(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not ready: source not subscribed\n".into(),
                )
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(now: Millis, beat: Millis, commit: Millis, down: Millis) -> State {
        State {
            now,
            core_beat: beat,
            commit_since: commit,
            source_down_since: down,
        }
    }

    #[test]
    fn healthy_when_everything_is_fresh() {
        assert!(st(10_000, 9_900, NONE, NONE).problems(1000).is_empty());
        // A commit under way but young, a source down but briefly.
        assert!(st(10_000, 9_900, 9_500, 9_200).problems(1000).is_empty());
    }

    #[test]
    fn each_stall_is_named_past_the_limit() {
        let p = st(10_000, 8_000, NONE, NONE).problems(1000);
        assert_eq!(p, vec!["engine loop stalled for 2000 ms".to_owned()]);
        let p = st(10_000, 9_990, 7_000, NONE).problems(1000);
        assert_eq!(p, vec!["commit in progress for 3000 ms".to_owned()]);
        let p = st(10_000, 9_990, NONE, 5_000).problems(1000);
        assert_eq!(p, vec!["source down for 5000 ms".to_owned()]);
    }

    #[test]
    fn the_watchdog_ignores_the_source() {
        // Restarting the gateway does not bring a broker back.
        let s = st(100_000, 99_990, NONE, 0);
        assert!(s.engine_problems(1000).is_empty());
        assert_eq!(s.problems(1000).len(), 1);
    }

    #[test]
    fn source_down_keeps_its_first_instant() {
        let h = Health::new(SystemClock::new());
        h.source(true, 5);
        h.source(false, 100);
        h.source(false, 900);
        assert_eq!(h.source_down_since.load(Ordering::Relaxed), 100);
        h.source(true, 1000);
        assert_eq!(h.source_down_since.load(Ordering::Relaxed), NONE);
    }
}
