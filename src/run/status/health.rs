//! Liveness of the gateway's parts, for systemd (`Type=notify`, watchdog) and
//! the optional local HTTP endpoint (`/healthz`, `/readyz`).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    pub(crate) prometheus: Mutex<String>,
    /// Why the state store cannot commit, while it cannot.
    store: Mutex<Option<String>>,
    /// The source subscription is in place (`/readyz`).
    pub(crate) subscribed: std::sync::atomic::AtomicBool,
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

    /// Why the state store cannot commit, while it cannot.
    pub fn store_detail(&self) -> Option<String> {
        self.store.lock().ok().and_then(|p| p.clone())
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

    pub(crate) fn state(&self) -> State {
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
