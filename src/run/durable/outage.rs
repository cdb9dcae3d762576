//! A disk that refuses writes: the store thread waits, retrying with backoff,
//! and the gateway says so (docs/reference.md#guarantees).

use super::*;

/// input is paused and acks held while the same batch is retried with backoff.
pub(super) struct Outage {
    clock: SystemClock,
    /// Monotonic start of the outage (`None`: the store is fine).
    since: Option<Millis>,
    next_log: Millis,
    delay_ms: u64,
}

const RETRY_FIRST_MS: u64 = 500;
const RETRY_MAX_MS: u64 = 30_000;
const OUTAGE_LOG_MS: Millis = 60_000;

impl Outage {
    pub(super) fn new(clock: SystemClock) -> Self {
        Self {
            clock,
            since: None,
            next_log: 0,
            delay_ms: RETRY_FIRST_MS,
        }
    }

    /// After a failed write: report (once, then a log line a minute), wait
    /// the backoff while taking the core's next jobs off the channel (so it
    /// never stalls on it), then reopen the store for the retry. Gives up
    /// only when the gateway is stopping.
    pub(super) fn wait(
        &mut self,
        e: StoreError,
        durable: &Durable,
        links: &Links,
        queued: &mut std::collections::VecDeque<StoreJob>,
    ) -> Result<(), StoreError> {
        let now = self.clock.mono();
        let detail = e.to_string();
        if self.since.is_none() {
            self.since = Some(now);
            self.next_log = now.saturating_add(OUTAGE_LOG_MS);
            self.delay_ms = RETRY_FIRST_MS;
            links.registry.store_ok.store(false, Ordering::Relaxed);
            links
                .state
                .send_replace(StoreState::Blocked(detail.clone()));
            tracing::error!(
                error = %detail,
                "state store cannot commit: input paused, acks held, retrying (nothing is lost; free disk space under the state dir)"
            );
            let at = self.clock.now().wall;
            let _ = links.sink.send(SinkMsg::Notice(Notice::StateStore {
                detail: detail.clone(),
                at,
            }));
        } else if now >= self.next_log {
            self.next_log = now.saturating_add(OUTAGE_LOG_MS);
            let secs = now.saturating_sub(self.since.unwrap_or(now)) / 1000;
            tracing::warn!(error = %detail, for_s = secs, "state store still cannot commit: input paused");
        }
        links
            .registry
            .health
            .store_problem(Some(format!("state store cannot commit: {detail}")));
        let until = now.saturating_add(i64::try_from(self.delay_ms).unwrap_or(i64::MAX));
        self.delay_ms = (self.delay_ms * 2).min(RETRY_MAX_MS);
        loop {
            while let Ok(job) = links.rx.try_recv() {
                queued.push_back(job);
            }
            if *links.stop.borrow() {
                tracing::error!(
                    "stopping while the state store cannot commit: input since the last commit stays with the source broker (acks were held)"
                );
                return Err(e);
            }
            let left = until.saturating_sub(self.clock.mono());
            if left <= 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(
                u64::try_from(left.min(100)).unwrap_or(100),
            ));
        }
        // redb refuses every call after an I/O error until it is opened again;
        // a journal error leaves it as it was.
        if matches!(
            e,
            StoreError::Io(_) | StoreError::Closed | StoreError::Reopen { .. }
        ) && let Err(e) = durable.store.reopen()
        {
            tracing::debug!(error = %e, "reopening the state file");
        }
        Ok(())
    }

    /// After a successful write: ends an outage.
    pub(super) fn over(&mut self, links: &Links) {
        let Some(since) = self.since.take() else {
            return;
        };
        let secs = self.clock.mono().saturating_sub(since) / 1000;
        tracing::info!(after_s = secs, "state store commits again: input resumes");
        links.registry.health.store_problem(None);
        links.registry.store_ok.store(true, Ordering::Relaxed);
        links.state.send_replace(StoreState::Ok);
        let at = self.clock.now().wall;
        let _ = links
            .sink
            .send(SinkMsg::Notice(Notice::StateStoreOk { at }));
    }
}
