//! The database outputs (docs/reference.md#sinkpostgres-and-sinkinflux): each
//! reads the outbox from its own cursor, writes a batch, and moves the cursor
//! only once the database confirmed it (COMMIT, HTTP 204). Writes are keyed so
//! that writing a batch again changes nothing: exactly once in the tables,
//! whatever the gateway replays after a crash or a takeover.

mod influx;
mod postgres;
pub mod rows;
mod tls;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::journal::Mark;
use crate::model::OutputKind;
use crate::model::OutputMark;
use crate::run::events::Inbound;
use crate::run::status::registry::{OutputStat, Registry};
use crate::store::OutboxReader;
use crate::sys::clock::SystemClock;
use rows::Row;

/// Waits between attempts while the database is out: doubling up to this.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const BACKOFF_MIN: Duration = Duration::from_millis(500);

/// A write that did not happen.
#[derive(Debug)]
pub enum Failed {
    /// Unreachable, timed out, 5xx, a serialization failure: the same batch again later.
    Outage(String),
}

/// Rows the database refused for their content: (index in the batch, its message).
pub type Refusals = Vec<(usize, String)>;

/// One of the two databases.
pub enum Db {
    /// `[sink.postgres]`.
    Postgres(postgres::Writer),
    /// `[sink.influx]`.
    Influx(influx::Writer),
}

impl Db {
    /// `[sink.postgres]`.
    pub fn postgres(cfg: crate::config::Postgres, gateway: String) -> Self {
        Db::Postgres(postgres::Writer::new(cfg, gateway))
    }

    /// `[sink.influx]`.
    pub fn influx(cfg: crate::config::Influx, gateway: String) -> Self {
        Db::Influx(influx::Writer::new(cfg, gateway))
    }

    /// Which output it is.
    pub fn kind(&self) -> OutputKind {
        match self {
            Db::Postgres(_) => OutputKind::Postgres,
            Db::Influx(_) => OutputKind::Influx,
        }
    }

    fn batch_max(&self) -> usize {
        match self {
            Db::Postgres(w) => w.batch_max(),
            Db::Influx(w) => w.batch_max(),
        }
    }

    async fn write(&mut self, rows: &[Row]) -> Result<Refusals, Failed> {
        match self {
            Db::Postgres(w) => w.write(rows).await,
            Db::Influx(w) => w.write(rows).await,
        }
    }
}

/// What a database output is handed.
pub struct Links {
    /// Reads the outbox.
    pub reader: OutboxReader,
    /// One past the newest committed outbox number (store).
    pub committed: watch::Receiver<u64>,
    /// Marks and set-aside entries go to the core (journaled, replicated).
    pub core: mpsc::Sender<Inbound>,
    /// This output's confirmed mark, for the outbox's removal.
    pub delivered: watch::Sender<u64>,
    /// Figures.
    pub registry: Arc<Registry>,
    /// Stop.
    pub stop: watch::Receiver<bool>,
    /// The active board of a pair acts only on a fresh proof of its claim.
    pub fence: crate::run::fence::Fence,
}

/// A database output's task.
pub struct DbOutput {
    db: Db,
    links: Links,
    mark: OutputMark,
    prefix: String,
    clock: SystemClock,
}

impl DbOutput {
    /// Starts at the stored cursor (`mark`), or the outbox's oldest entry if that is further.
    pub fn new(
        db: Db,
        links: Links,
        (mark, prefix): (OutputMark, String),
        clock: SystemClock,
    ) -> Self {
        let stat = &links.registry.outputs[db.kind() as usize];
        stat.enabled.store(true, Ordering::Relaxed);
        stat.upto.store(mark.upto, Ordering::Relaxed);
        stat.written.store(mark.written, Ordering::Relaxed);
        stat.refused.store(mark.refused, Ordering::Relaxed);
        links.delivered.send_replace(mark.upto);
        Self {
            db,
            links,
            mark,
            prefix,
            clock,
        }
    }

    fn stat(&self) -> &OutputStat {
        &self.links.registry.outputs[self.db.kind() as usize]
    }

    /// Until the stop: read a batch after the cursor, write it, move on.
    pub async fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            if *self.links.stop.borrow() {
                return;
            }
            if !self.links.fence.holds() {
                if self.pause(super::FENCE_LOOK).await {
                    return;
                }
                continue;
            }
            let committed = *self.links.committed.borrow();
            let after = self.mark.upto.checked_sub(1);
            let r = self.links.reader.clone();
            let n = self.db.batch_max();
            let read = tokio::task::spawn_blocking(move || r.outbox_after(after, n)).await;
            let entries = match read {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "reading the outbox");
                    Vec::new()
                }
                Err(_) => Vec::new(),
            };
            let Some(last) = entries.last().map(|(s, _)| *s) else {
                // Nothing left below `committed` (the bound dropped it): wait past it.
                self.mark.upto = self.mark.upto.max(committed);
                self.links.delivered.send_replace(self.mark.upto);
                if self.wait_for_more().await {
                    return;
                }
                continue;
            };
            let batch: Vec<(String, Row)> = entries
                .iter()
                .filter_map(|(_, e)| {
                    Some((
                        e.topic.clone(),
                        rows::row(&self.prefix, &e.topic, &e.payload)?,
                    ))
                })
                .collect();
            let done = if batch.is_empty() {
                Ok(Vec::new())
            } else {
                let only: Vec<Row> = batch.iter().map(|(_, r)| r.clone()).collect();
                self.db.write(&only).await
            };
            match done {
                Ok(refused) => {
                    backoff = BACKOFF_MIN;
                    self.confirmed(last + 1, &batch, refused).await;
                }
                Err(Failed::Outage(e)) => {
                    self.outage(&e);
                    if self.pause(backoff).await {
                        return;
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    fn outage(&self, e: &str) {
        let stat = self.stat();
        if stat.connected.swap(false, Ordering::Relaxed) || stat.last_error().is_none() {
            tracing::warn!(output = self.db.kind().as_str(), error = %e, "database output: write failed; retrying, nothing skipped");
        }
        stat.failed(Some(e.to_string()));
    }

    /// The batch below `upto` is in the database; `refused` of it set aside.
    async fn confirmed(&mut self, upto: u64, batch: &[(String, Row)], refused: Refusals) {
        let kind = self.db.kind();
        let now = self.clock.now().wall;
        for (i, msg) in &refused {
            let Some((topic, row)) = batch.get(*i) else {
                continue;
            };
            let (group, device) = row.owner();
            tracing::warn!(output = kind.as_str(), id = %row.id(), error = %msg, "database refused an entry: set aside on the rejected topic");
            let r = crate::output::Refused {
                reason: "output_refused",
                topic: topic.clone(),
                group,
                device,
                id: row.id(),
                arrival: now,
                detail: format!("{}: {msg}", kind.as_str()),
            };
            let _ = self.links.core.send(Inbound::SetAside(Box::new(r))).await;
        }
        let n = batch.len() as u64;
        let nr = refused.len() as u64;
        self.mark = OutputMark {
            upto,
            written: self.mark.written + n.saturating_sub(nr),
            refused: self.mark.refused + nr,
        };
        let _ = self
            .links
            .core
            .send(Inbound::Mark(Mark::Output(kind, self.mark)))
            .await;
        let stat = self.stat();
        stat.connected.store(true, Ordering::Relaxed);
        stat.failed(None);
        stat.upto.store(upto, Ordering::Relaxed);
        stat.written.store(self.mark.written, Ordering::Relaxed);
        stat.refused.store(self.mark.refused, Ordering::Relaxed);
        self.links.delivered.send_replace(upto);
    }

    /// Until a commit adds entries past the cursor (true: stop).
    async fn wait_for_more(&mut self) -> bool {
        loop {
            if *self.links.committed.borrow_and_update() > self.mark.upto {
                return false;
            }
            tokio::select! {
                r = self.links.committed.changed() => if r.is_err() { return true; },
                _ = self.links.stop.changed() => return true,
            }
        }
    }

    /// Sleeps `d` unless stopped (true: stop).
    async fn pause(&mut self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => *self.links.stop.borrow(),
            _ = self.links.stop.changed() => true,
        }
    }
}
