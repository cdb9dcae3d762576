//! The store thread: makes each batch durable (redb never runs on an async
//! thread), then releases the batch's acks to the source and its outputs to
//! the sink — in that order, only after the write.
//!
//! Between checkpoints a batch is one record of the write-ahead journal (what
//! the engine was given, its outputs, the delivered mark); a checkpoint writes
//! the changed state to redb, moves the journal's undelivered outputs into
//! the outbox table, and starts a new journal generation.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use crate::engine::Engine;
use crate::journal;
use crate::model::Millis;
use crate::run::events::{AckJob, Control, Notice, PairCommit, StoreEvent, StoreJob, StoreState};
use crate::run::outputs::mqtt::SinkMsg;
use crate::run::status::registry::Registry;
use crate::store::record;
use crate::store::schema::{K_RULES, K_WAL, rules_doc, wal_generation};
use crate::store::wal::Wal;
use crate::store::{Batch, OutboxEntry, Store, StoreError};
use crate::sys::clock::SystemClock;
use outage::Outage;

pub mod acks;
mod outage;
pub mod plan;
pub mod restore;

/// The durable side of `run`: redb (checkpoints, outbox) and the journal.
pub struct Durable {
    store: Store,
    wal: Wal,
    /// Lowest outbox number that may still exist (below it: delivered, dropped or folded away).
    oldest: u64,
    buf: Vec<u8>,
    /// The start's checkpoint, when the disk was full then.
    startup: Option<Batch>,
    /// About the bytes the journal's outputs take once in the outbox table.
    unfolded_bytes: u64,
    /// A standby follows: each write keeps its record body for it.
    replicate: bool,
    /// The last write's record body (with `replicate`).
    last_body: Vec<u8>,
    /// A streamed checkpoint failed after its records were taken: checkpoints go to
    /// the journal until one of all the state comes ([`Batch::full`]).
    need_full: bool,
    /// Streamed checkpoints that failed.
    redo: u64,
}

/// A checkpoint batch as the journal record of the input it covers; streamed
/// records still coming are read and dropped (the core waits on them).
fn as_journal(batch: &mut Batch) {
    if let Some(rest) = batch.rest.take() {
        for _ in rest.iter() {}
    }
    batch.journal = Some(std::mem::take(&mut batch.covered));
    batch.changes.devices = crate::engine::DeviceRecords::default();
    batch.full = false;
}

/// About the bytes `e` takes in the outbox table (CBOR of topic, payload, flags).
fn entry_bytes(e: &OutboxEntry) -> u64 {
    (e.topic.len() + e.payload.len() + 24) as u64
}

fn wal_err(wal: &std::path::Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Journal {
        path: wal.to_path_buf(),
        source,
    }
}

impl Durable {
    /// Opens the journal of the store's current generation and folds whatever it
    /// holds into `engine` (restored from the store) and into redb, so the gateway
    /// starts from one checkpoint with an empty journal. Returns the engine
    /// settings in force after the journal: the checkpoint's (`configured` for a
    /// state that recorded none), then each journaled reload's.
    pub fn recover(
        store: Store,
        state_dir: &std::path::Path,
        meta: &std::collections::BTreeMap<String, Vec<u8>>,
        engine: &mut Engine,
        configured: &[u8],
    ) -> Result<(Self, usize, Vec<u8>), StoreError> {
        let generation = wal_generation(meta);
        let mut in_force = rules_doc(meta).unwrap_or_else(|| configured.to_vec());
        let path = Wal::file(state_dir);
        let (wal, records) = Wal::open(state_dir, generation).map_err(wal_err(&path))?;
        let replayed = records.len();
        let mut batch = Batch::default();
        for body in records {
            let r = record::decode(&body).map_err(|detail| StoreError::Corrupt {
                path: path.clone(),
                table: "journal",
                source: detail.into(),
            })?;
            let reloaded = journal::apply(engine, &r.ops).map_err(|e| StoreError::Corrupt {
                path: path.clone(),
                table: "journal",
                source: e.into(),
            })?;
            if let Some(record) = reloaded {
                in_force = record;
            }
            batch.folded.extend(r.outputs);
            batch.delivered = batch.delivered.max(r.delivered);
        }
        let mut d = Self {
            store,
            wal,
            oldest: 0,
            buf: Vec::new(),
            startup: None,
            unfolded_bytes: 0,
            replicate: false,
            last_body: Vec::new(),
            need_full: false,
            redo: 0,
        };
        if replayed > 0 || generation == 0 {
            batch.changes = engine.take_changes();
            batch.meta.push((K_RULES, in_force.clone()));
            match d.checkpoint(&mut batch) {
                Ok(_) => {}
                Err(e) if e.is_io() && generation != 0 => {
                    // A full disk: the journal still holds it all; the store thread
                    // retries this checkpoint before anything else.
                    tracing::warn!(error = %e, "checkpoint after journal replay failed; retried once the gateway runs");
                    d.defer_startup(batch)?;
                }
                Err(e) => return Err(e),
            }
        } else {
            d.oldest = d.store.next_seq().saturating_sub(d.store.outbox_depth()?);
        }
        Ok((d, replayed, in_force))
    }

    /// Keeps the start's checkpoint for the store thread: its outputs become the
    /// journal's (numbered, visible to the sink), later numbers follow them.
    fn defer_startup(&mut self, mut batch: Batch) -> Result<(), StoreError> {
        let delivered = batch.delivered;
        let folded = std::mem::take(&mut batch.folded);
        let end = folded.last().map_or(0, |(s, _)| s + 1);
        self.store
            .reserve_seqs(end.saturating_sub(self.store.next_seq()));
        let mut pending = self
            .store
            .unfolded()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.extend(
            folded
                .into_iter()
                .filter(|(s, _)| delivered.is_none_or(|d| *s > d)),
        );
        let waiting = u64::try_from(pending.len()).unwrap_or(u64::MAX);
        self.unfolded_bytes = pending.iter().map(|(_, e)| entry_bytes(e)).sum();
        drop(pending);
        let table = self.store.outbox_depth().unwrap_or(0);
        self.oldest = self
            .store
            .next_seq()
            .saturating_sub(table.saturating_add(waiting));
        self.startup = Some(batch);
        Ok(())
    }

    /// The redb store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Writes `batch` with the journal's outputs into redb and starts the next
    /// journal generation. On failure nothing changed: the same batch may be retried.
    fn checkpoint(&mut self, batch: &mut Batch) -> Result<crate::store::CommitStats, StoreError> {
        let next = match self.wal.generation() {
            // A new state file's first generation is random: records of an earlier
            // state file's journal left beside it can never match.
            0 => {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write(self.wal.path().as_os_str().as_encoded_bytes());
                (h.finish() >> 1).max(1)
            }
            g => g + 1,
        };
        let unfolded = self.store.unfolded().clone();
        // The sink's reader waits while entries move from the journal to the table.
        let mut pending = unfolded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Moved, not copied (it may hold every output of an uplink outage); moved
        // back if the commit fails, so the same batch can be retried.
        let waiting = pending.len();
        let mut folded: Vec<_> = pending.drain(..).collect();
        folded.append(&mut batch.folded);
        batch.folded = folded;
        batch.meta.push((K_WAL, next.to_be_bytes().to_vec()));
        let result = self.store.commit(batch);
        batch.meta.pop();
        let own = batch.folded.split_off(waiting);
        let stats = match result {
            Ok(stats) => stats,
            Err(e) => {
                pending.extend(std::mem::replace(&mut batch.folded, own));
                return Err(e);
            }
        };
        batch.folded = own;
        self.unfolded_bytes = 0;
        drop(pending);
        self.wal.reset(next);
        self.oldest = self.store.next_seq().saturating_sub(stats.depth);
        Ok(stats)
    }

    /// Writes one batch; returns the outputs with their numbers, the outbox depth
    /// and what was dropped. On failure nothing changed: the same batch may be retried.
    fn write(
        &mut self,
        batch: &mut Batch,
        delivered: u64,
    ) -> Result<(Vec<(u64, OutboxEntry)>, Written), StoreError> {
        batch.delivered = delivered.checked_sub(1);
        if batch.journal.is_none() && self.need_full && !batch.full {
            as_journal(batch);
        }
        let Some(ops) = batch.journal.as_ref() else {
            let stats = match self.checkpoint(batch) {
                Ok(stats) => stats,
                Err(e) => {
                    if batch.rest.is_some() {
                        // Its streamed records are gone with the transaction: the batch is
                        // retried as what it covers, a journal record, and the core marks
                        // all state changed for a checkpoint of all of it.
                        as_journal(batch);
                        self.need_full = true;
                        self.redo += 1;
                    }
                    return Err(e);
                }
            };
            if batch.full {
                self.need_full = false;
            }
            let numbered: Vec<(u64, OutboxEntry)> = (stats.first_seq..)
                .zip(std::mem::take(&mut batch.outputs))
                .collect();
            if self.replicate {
                let refs: Vec<(u64, &OutboxEntry)> =
                    numbered.iter().map(|(s, e)| (*s, e)).collect();
                self.last_body =
                    record::encode(&batch.covered, &refs, batch.delivered, &mut self.buf);
            }
            return Ok((
                numbered,
                Written {
                    bytes: 0,
                    checkpoint: true,
                    dropped: stats.dropped,
                },
            ));
        };
        let first = self.store.next_seq();
        let numbered: Vec<(u64, &OutboxEntry)> = (first..).zip(batch.outputs.iter()).collect();
        let body = record::encode(ops, &numbered, batch.delivered, &mut self.buf);
        let path = self.wal.path().to_path_buf();
        let bytes = self.wal.append(&body).map_err(wal_err(&path))?;
        if self.replicate {
            self.last_body = body;
        } else {
            drop(body);
        }
        self.store
            .reserve_seqs(u64::try_from(batch.outputs.len()).unwrap_or(0));
        let numbered: Vec<(u64, OutboxEntry)> =
            (first..).zip(std::mem::take(&mut batch.outputs)).collect();
        self.unfolded_bytes += numbered.iter().map(|(_, e)| entry_bytes(e)).sum::<u64>();
        self.store
            .unfolded()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(numbered.iter().cloned());
        Ok((
            numbered,
            Written {
                bytes,
                checkpoint: false,
                dropped: 0,
            },
        ))
    }

    /// Forgets the journal's outputs below `delivered` (one past the highest
    /// acknowledged): the sink never reads them again, a checkpoint would skip
    /// them, and recovery reads the journal file. Without this the list would
    /// hold every output since the last checkpoint (tens of MB between them).
    fn forget_delivered(&mut self, delivered: u64) {
        let mut pending = self
            .store
            .unfolded()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = pending.partition_point(|(s, _)| *s < delivered);
        let gone: u64 = pending.drain(..n).map(|(_, e)| entry_bytes(&e)).sum();
        crate::sys::memory::shed_queue(&mut pending, 1024);
        self.unfolded_bytes = self.unfolded_bytes.saturating_sub(gone);
    }

    /// Outputs not yet delivered, and the gateway time of the oldest of them.
    fn depth(&self, delivered: u64) -> (u64, Option<Millis>) {
        let floor = self.oldest.max(delivered);
        let depth = self.store.next_seq().saturating_sub(floor);
        if depth == 0 {
            return (0, None);
        }
        let oldest = self
            .store
            .outbox_after(floor.checked_sub(1), 1)
            .ok()
            .and_then(|v| v.first().map(|(_, e)| e.at));
        (depth, oldest)
    }
}

/// The standby's side (docs/reference.md#standby--two-boards-one-gateway): the active's records applied as recovery applies its own.
impl Durable {
    /// Each write keeps its record body for a standby ([`Durable::take_body`]).
    pub fn replicating(mut self) -> Self {
        self.replicate = true;
        self
    }

    /// The last write's record body.
    pub fn take_body(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.last_body)
    }

    /// The state file as it is between two writes (right after a checkpoint:
    /// everything, the journal empty).
    pub fn snapshot(&self) -> std::io::Result<Vec<u8>> {
        std::fs::read(self.store.path())
    }

    /// One of the active's records: into this journal (synced), into `engine`,
    /// its outputs into the outbox under the active's numbers; a checkpoint when
    /// the journal reaches its bound. `in_force` follows the record's reloads.
    pub fn follow(
        &mut self,
        engine: &mut Engine,
        body: &[u8],
        in_force: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        let path = self.wal.path().to_path_buf();
        let corrupt = |detail: String| StoreError::Corrupt {
            path: path.clone(),
            table: "pair record",
            source: detail.into(),
        };
        let r = record::decode(body).map_err(&corrupt)?;
        if let Some((first, _)) = r.outputs.first()
            && *first != self.store.next_seq()
        {
            return Err(corrupt(format!(
                "outputs numbered from {first}, this outbox is at {}",
                self.store.next_seq()
            )));
        }
        self.wal.append(body).map_err(wal_err(&path))?;
        if let Some(rules) = journal::apply(engine, &r.ops).map_err(|e| corrupt(e.to_string()))? {
            *in_force = rules;
        }
        self.store
            .reserve_seqs(u64::try_from(r.outputs.len()).unwrap_or(0));
        self.unfolded_bytes += r.outputs.iter().map(|(_, e)| entry_bytes(e)).sum::<u64>();
        self.store
            .unfolded()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(r.outputs);
        if let Some(d) = r.delivered {
            self.forget_delivered(d + 1);
        }
        if self.wal.len() >= crate::run::durable::plan::CHECKPOINT_BYTES {
            let slice = plan::STREAM_SLICE;
            let mut batch = Batch {
                changes: engine.take_changes_upto(slice),
                meta: vec![(K_RULES, in_force.clone())],
                delivered: r.delivered,
                ..Batch::default()
            };
            // The rest of the records streamed into the one transaction, as `run` does.
            let done = std::thread::scope(|s| {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                batch.rest = Some(rx);
                let engine = &mut *engine;
                s.spawn(move || {
                    // Owned here: its end closes the stream.
                    let tx = tx;
                    loop {
                        let records = engine.take_device_slice(slice);
                        if records.is_empty() || tx.send(records).is_err() {
                            break;
                        }
                    }
                });
                let done = self.checkpoint(&mut batch);
                // The records not read (a failed write) are dropped: the producer then ends.
                batch.rest = None;
                done
            });
            if let Err(e) = done {
                // The journal still covers everything; the next checkpoint writes all state.
                engine.mark_all_changed();
                return Err(e);
            }
        }
        Ok(())
    }
}

struct Written {
    bytes: u64,
    checkpoint: bool,
    dropped: u64,
}

/// What the store thread is wired to.
pub struct Links {
    /// Batches from the core.
    pub rx: Receiver<StoreJob>,
    /// Acks of committed messages to the source.
    pub acks: UnboundedSender<AckJob>,
    /// Committed outputs and notices to the sink.
    pub sink: UnboundedSender<SinkMsg>,
    /// Commits, to the core.
    pub events: UnboundedSender<StoreEvent>,
    /// The store's health, to the core and the source.
    pub state: watch::Sender<StoreState>,
    /// The uplink's delivered mark (the start's deferred checkpoint).
    pub delivered: watch::Receiver<u64>,
    /// One past the newest outbox number committed (the database outputs wait on it).
    pub committed: watch::Sender<u64>,
    /// A stop was requested (a store outage gives up then).
    pub stop: watch::Receiver<bool>,
    /// Counters and gauges.
    pub registry: Arc<Registry>,
    /// A standby pair: each commit goes to the pair task, which holds its acks.
    pub pair: Option<UnboundedSender<PairCommit>>,
}

/// A commit's numbers to the registry and its state to the core.
fn shown(durable: &Durable, registry: &Registry, links: &Links, w: &Written, delivered: u64) {
    let kind = usize::from(w.checkpoint);
    registry.commits[kind].fetch_add(1, Ordering::Relaxed);
    registry.journal_bytes.fetch_add(w.bytes, Ordering::Relaxed);
    let (depth, oldest) = durable.depth(delivered);
    registry.outbox_depth.store(depth, Ordering::Relaxed);
    registry
        .outbox_oldest
        .store(oldest.unwrap_or(0), Ordering::Relaxed);
    registry
        .outbox_dropped
        .store(durable.store.outbox_dropped(), Ordering::Relaxed);
    registry
        .outbox_end
        .store(durable.store.next_seq(), Ordering::Relaxed);
    links.committed.send_replace(durable.store.next_seq());
    registry
        .memory
        .outputs_bytes
        .store(durable.unfolded_bytes, Ordering::Relaxed);
    let bytes = durable
        .store
        .outbox_bytes()
        .saturating_add(durable.unfolded_bytes);
    // The bound is applied when the journal's outputs are folded into the table.
    let over_bound = depth > durable.store.max_outbox() || bytes > durable.store.max_bytes();
    let _ = links.events.send(StoreEvent::Committed {
        journal_len: durable.wal.len(),
        over_bound,
        redo: durable.redo,
    });
}

/// Runs until the last batch or until the core is gone.
pub fn run(mut durable: Durable, links: Links, clock: SystemClock) -> Result<(), StoreError> {
    let mut outage = Outage::new(clock);
    let mut queued = std::collections::VecDeque::new();
    let registry = links.registry.clone();
    // Commits counted for a standby (docs/reference.md#standby--two-boards-one-gateway).
    let mut pos = 0u64;
    if let Some(mut batch) = durable.startup.take() {
        loop {
            let delivered = links.delivered.borrow().checked_sub(1);
            batch.delivered = batch.delivered.max(delivered);
            match durable.checkpoint(&mut batch) {
                Ok(_) => break,
                Err(e) if e.is_io() => outage.wait(e, &durable, &links, &mut queued)?,
                Err(e) => return Err(e),
            }
        }
        outage.over(&links);
    }
    loop {
        let mut job = match queued.pop_front() {
            Some(j) => j,
            None => match links.rx.recv() {
                Ok(j) => j,
                Err(_) => break,
            },
        };
        if let Some(b) = job.bounds.take() {
            durable.store.set_max_outbox(b.messages);
            durable.store.set_max_bytes(b.bytes);
        }
        let delivered = job.delivered;
        let (mut live, w) = loop {
            registry.health.committing(true);
            let r = durable.write(&mut job.batch, delivered);
            registry.health.committing(false);
            match r {
                Ok(v) => break v,
                Err(e) if e.is_io() => outage.wait(e, &durable, &links, &mut queued)?,
                Err(e) => return Err(e),
            }
        };
        outage.over(&links);
        durable.forget_delivered(delivered);
        shown(&durable, &registry, &links, &w, delivered);
        if w.dropped > 0 {
            tracing::warn!(
                dropped = w.dropped,
                limit = durable.store.max_outbox(),
                "outbox full: oldest outputs dropped"
            );
        }
        if let Some(pair) = &links.pair {
            pos += 1;
            let snapshot = if job.snapshot && w.checkpoint {
                match durable.snapshot() {
                    Ok(bytes) => Some(bytes),
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the state file for the standby");
                        None
                    }
                }
            } else {
                None
            };
            let _ = pair.send(PairCommit {
                pos,
                body: durable.take_body(),
                snapshot,
                acks: job.acks.drain(..).collect(),
                last: job.last,
            });
        } else if !job.acks.is_empty() {
            let now = clock.mono();
            for (_, _, at) in &job.acks {
                registry.ack_delay.observe(now.saturating_sub(*at));
            }
            let list = job.acks.drain(..).map(|(g, h, _)| (g, h)).collect();
            let _ = links.acks.send(AckJob::Acks(list));
        }
        if !live.is_empty() {
            // A checkpoint that dropped outputs over the bound: only those still there go live.
            let keep = durable.oldest;
            live.retain(|(s, _)| *s >= keep);
            let _ = links.sink.send(SinkMsg::Live(live));
        }
        if job.last {
            if links.pair.is_none() {
                let _ = links.acks.send(AckJob::Done);
            }
            let _ = links.sink.send(SinkMsg::Control(Control::Stop));
            break;
        }
    }
    Ok(())
}

/// A state store that cannot commit (docs/reference.md#guarantees: a full disk is not a crash):
#[cfg(test)]
mod tests;
