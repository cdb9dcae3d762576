//! Durable state and outbox in redb (docs/reference.md#guarantees).
//!
//! `run` commits through the write-ahead journal ([`wal`]) and writes redb
//! only at checkpoints: one transaction carries the changed engine state, the
//! outputs (into the outbox) and the journal generation that follows. `replay
//! --state-dir` commits here directly, with its input position in the same
//! transaction. Either way, after a crash the store is at a commit boundary
//! and the input after it is processed again.

mod commit;
mod error;
mod outbox;
mod read;
pub mod record;
pub mod schema;
#[cfg(test)]
mod tests;
pub mod wal;

pub use error::StoreError;
pub use read::{Inspect, OutboxReader, inspect, verify_file};
use read::{check_version, has_tables, read_snapshot};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use serde::{Deserialize, Serialize};

use crate::codec::MetricName;
use crate::engine::{Changes, Counters, Device, Group};
use crate::model::Millis;
use schema::{DEVICES, GROUPS, K_OUTBOX, K_SCHEMA, META, METRIC_NAMES, OUTBOX, SCHEMA_VERSION};

/// One output awaiting delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxEntry {
    /// Full topic.
    pub topic: String,
    /// Encoded payload; shared, not copied, by the journal's list of outputs not yet
    /// folded into the outbox table and the uplink's queue (one copy of a burst, not two).
    #[serde(with = "shared_bytes")]
    pub payload: bytes::Bytes,
    /// Retain flag.
    pub retain: bool,
    /// Gateway clock when produced (for the oldest-entry age).
    pub at: Millis,
    /// A report about input (rejected or late data): bounded apart from results,
    /// so a flood of bad input never pushes a result out (absent: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub report: bool,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct OutboxMeta {
    next_seq: u64,
    dropped: u64,
    /// Bytes of the outbox table's values (absent in files written before it: counted at open).
    #[serde(default)]
    bytes: Option<u64>,
}

/// A payload as a CBOR byte string.
mod shared_bytes {
    pub fn serialize<S: serde::Serializer>(b: &bytes::Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bytes::Bytes, D::Error> {
        serde::Deserialize::deserialize(d).map(|b: serde_bytes::ByteBuf| b.into_vec().into())
    }
}

/// Everything persisted, as read at startup.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Group states.
    pub groups: Vec<Group>,
    /// Device states (empty from [`Store::open_streaming`]: see [`Store::read_devices`]).
    pub devices: Vec<Device>,
    /// Device records in the file.
    pub device_count: u64,
    /// Interned metric names, by index.
    pub metric_names: Vec<MetricName>,
    /// Counters.
    pub counters: Counters,
    /// The gateway-clock judgement (absent in state written before it existed).
    pub gateway_clock: Option<crate::time::gateway::GatewayClock>,
    /// Sparkplug edge nodes.
    pub sparkplug: Vec<crate::sparkplug::EdgeNode>,
    /// Other `META` entries (caller positions).
    pub meta: BTreeMap<String, Vec<u8>>,
    /// Entries in the outbox.
    pub outbox_depth: u64,
    /// Outputs dropped because the outbox was full.
    pub outbox_dropped: u64,
}

/// What one commit wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Device records written.
    pub devices: usize,
    /// Group records written.
    pub groups: usize,
    /// Outputs added to the outbox.
    pub outputs: usize,
    /// Oldest outputs dropped to respect the bound.
    pub dropped: u64,
    /// Outbox sequence number of the batch's first output (the rest follow).
    pub first_seq: u64,
    /// Entries in the outbox after the commit.
    pub depth: u64,
    /// Gateway time of the oldest entry still in the outbox.
    pub oldest_at: Option<Millis>,
}

/// One commit, as a value: what the engine changed, the outputs it produced,
/// caller positions, and the outbox entries delivered up to a sequence number.
#[derive(Debug, Default)]
pub struct Batch {
    /// Engine state changed since the previous batch.
    pub changes: Changes,
    /// Outputs to append to the outbox.
    pub outputs: Vec<OutboxEntry>,
    /// `META` entries written with the state (e.g. an input position).
    pub meta: Vec<(&'static str, Vec<u8>)>,
    /// Outbox entries up to this sequence number (inclusive) were delivered.
    pub delivered: Option<u64>,
    /// Outputs already numbered by the journal, folded into the outbox at a checkpoint.
    pub folded: Vec<(u64, OutboxEntry)>,
    /// `run` between checkpoints: the engine input since the last batch, for the journal
    /// (then `changes` is empty and the batch goes to the journal, not to redb).
    pub journal: Option<Vec<u8>>,
    /// A checkpoint: the engine input it covers (a standby follows it as a record).
    pub covered: Vec<u8>,
    /// A checkpoint's further device records, streamed in slices into its one
    /// transaction (the core sends them while the store writes; docs/reference.md#memory).
    pub rest: Option<std::sync::mpsc::Receiver<crate::engine::DeviceRecords>>,
    /// A checkpoint of every device (after a streamed one failed: see [`Batch::rest`]).
    pub full: bool,
}

/// Outputs in the journal and not yet in the outbox table, oldest first,
/// shared with the sink's reader.
pub type Unfolded =
    std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<(u64, OutboxEntry)>>>;

/// The open database, replaceable: after an I/O error redb fails every call
/// until it is closed and opened again ([`Store::reopen`]).
pub struct DbSlot(std::sync::RwLock<Option<std::sync::Arc<Database>>>);

impl DbSlot {
    fn new(db: Database) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self(std::sync::RwLock::new(Some(std::sync::Arc::new(db)))))
    }

    fn get(&self) -> Result<std::sync::Arc<Database>, StoreError> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or(StoreError::Closed)
    }
}

/// The state store.
pub struct Store {
    db: std::sync::Arc<DbSlot>,
    path: PathBuf,
    outbox: OutboxMeta,
    max_outbox: u64,
    /// Byte bound of the outbox table (`u64::MAX`: none).
    max_bytes: u64,
    buf: Vec<u8>,
    unfolded: Unfolded,
}

fn stored_meta(snapshot: &Snapshot) -> Option<OutboxMeta> {
    snapshot
        .meta
        .get(K_OUTBOX)
        .and_then(|b| ciborium::de::from_reader::<OutboxMeta, _>(&b[..]).ok())
}

fn cbor<T: Serialize>(v: &T, buf: &mut Vec<u8>) {
    buf.clear();
    // Serializing plain data into a Vec cannot fail.
    let _ = ciborium::ser::into_writer(v, &mut *buf);
}

/// The path of an in-memory store.
const MEMORY: &str = ":memory:";

/// redb's page cache (its default is 1 GiB, which would grow with the file
/// on a small board); the kernel's page cache still holds the file. 1 MiB:
/// the state is written in sorted checkpoints and read whole at a restore,
/// so most of a larger cache (4 MiB held ~3 MiB more at 10 000 devices) sat idle.
const CACHE_BYTES: usize = 1 << 20;

impl Store {
    /// The database file inside a state directory.
    pub fn file(state_dir: &Path) -> PathBuf {
        state_dir.join("tidemark.redb")
    }

    /// Opens (or creates) `state_dir/tidemark.redb`. An existing file that
    /// cannot be read is an error and is never replaced.
    pub fn open(state_dir: &Path, max_outbox: u64) -> Result<(Self, Snapshot), StoreError> {
        Self::open_with(state_dir, max_outbox, true)
    }

    /// As [`Store::open`], without the devices: a start streams them into the
    /// engine with [`Store::read_devices`] instead of holding them twice.
    pub fn open_streaming(
        state_dir: &Path,
        max_outbox: u64,
    ) -> Result<(Self, Snapshot), StoreError> {
        Self::open_with(state_dir, max_outbox, false)
    }

    fn open_with(
        state_dir: &Path,
        max_outbox: u64,
        devices: bool,
    ) -> Result<(Self, Snapshot), StoreError> {
        std::fs::create_dir_all(state_dir)
            .and_then(|()| crate::sys::make_private(state_dir))
            .map_err(|source| StoreError::Dir {
                path: state_dir.to_path_buf(),
                source,
            })?;
        let path = Self::file(state_dir);
        let db = if path.exists() {
            // Check a foreign or newer file without writing to it; a file that
            // needs crash recovery cannot be read that way and is ours to repair.
            match redb::ReadOnlyDatabase::open(&path) {
                Ok(ro) => {
                    check_version(&ro, &path)?;
                    drop(ro);
                }
                Err(redb::DatabaseError::RepairAborted) => {}
                Err(source) => return Err(StoreError::Open { path, source }),
            }
            Database::builder().set_cache_size(CACHE_BYTES).open(&path)
        } else {
            Database::builder()
                .set_cache_size(CACHE_BYTES)
                .create(&path)
        }
        .map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
        Self::init(db, path, max_outbox, devices)
    }

    /// Each stored device, in key order, decoded.
    pub fn read_devices(&self, mut f: impl FnMut(Device)) -> Result<(), StoreError> {
        let r = self.db.get()?.begin_read()?;
        read::each_device(&r, &self.path, &mut f)
    }

    /// A store in memory (tests, benchmarks).
    pub fn in_memory(max_outbox: u64) -> Result<(Self, Snapshot), StoreError> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        Self::init(db, PathBuf::from(MEMORY), max_outbox, true)
    }

    fn init(
        db: Database,
        path: PathBuf,
        max_outbox: u64,
        devices: bool,
    ) -> Result<(Self, Snapshot), StoreError> {
        if !has_tables(&db)? {
            Self::create_tables(&db, &path)?;
        }
        let snapshot = read_snapshot(&db, &path, devices)?;
        Self::finish(db, path, max_outbox, snapshot)
    }

    /// Tables and schema version in a new file (an existing file of another version is refused).
    fn create_tables(db: &Database, path: &Path) -> Result<(), StoreError> {
        let txn = db.begin_write()?;
        {
            let mut meta = txn.open_table(META)?;
            let version = meta.get(K_SCHEMA)?.map(|v| v.value().to_vec());
            match version {
                None => {
                    meta.insert(K_SCHEMA, &schema::version_bytes()[..])?;
                }
                Some(v) => {
                    let found = schema::version_of(&v);
                    if found != SCHEMA_VERSION {
                        return Err(StoreError::Version {
                            path: path.to_path_buf(),
                            found,
                        });
                    }
                }
            }
            txn.open_table(GROUPS)?;
            txn.open_table(DEVICES)?;
            txn.open_table(METRIC_NAMES)?;
            txn.open_table(OUTBOX)?;
        }
        txn.commit()?;
        Ok(())
    }

    fn finish(
        db: Database,
        path: PathBuf,
        max_outbox: u64,
        snapshot: Snapshot,
    ) -> Result<(Self, Snapshot), StoreError> {
        let outbox = OutboxMeta {
            next_seq: {
                let r = db.begin_read()?;
                let t = r.open_table(OUTBOX)?;
                let last = t.last()?.map(|(k, _)| k.value() + 1).unwrap_or(0);
                let stored = stored_meta(&snapshot).map_or(0, |m| m.next_seq);
                last.max(stored)
            },
            dropped: snapshot.outbox_dropped,
            bytes: Some(match stored_meta(&snapshot).and_then(|m| m.bytes) {
                Some(b) => b,
                None => {
                    let r = db.begin_read()?;
                    let t = r.open_table(OUTBOX)?;
                    let mut sum = 0u64;
                    for item in t.iter()? {
                        sum += item?.1.value().len() as u64;
                    }
                    sum
                }
            }),
        };
        Ok((
            Self {
                db: DbSlot::new(db),
                path,
                outbox,
                max_outbox: max_outbox.max(1),
                max_bytes: u64::MAX,
                buf: Vec::new(),
                unfolded: Unfolded::default(),
            },
            snapshot,
        ))
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Numbers `n` outputs going to the journal; returns the first number.
    pub fn reserve_seqs(&mut self, n: u64) -> u64 {
        let first = self.outbox.next_seq;
        self.outbox.next_seq += n;
        first
    }

    /// The next outbox sequence number.
    pub fn next_seq(&self) -> u64 {
        self.outbox.next_seq
    }

    /// Bounds the outbox's bytes too (`sink.outbox_max_mb`; 0: no byte bound).
    pub fn set_max_bytes(&mut self, bytes: u64) {
        self.max_bytes = if bytes == 0 { u64::MAX } else { bytes };
    }

    /// The outbox's byte bound (`u64::MAX`: none).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes in the outbox table after the last commit.
    pub fn outbox_bytes(&self) -> u64 {
        self.outbox.bytes.unwrap_or(0)
    }

    /// Bounds the outbox in entries (`sink.outbox_max_messages`, a reload).
    pub fn set_max_outbox(&mut self, n: u64) {
        self.max_outbox = n.max(1);
    }

    /// The outbox bound in entries.
    pub fn max_outbox(&self) -> u64 {
        self.max_outbox
    }

    /// Outputs in the journal and not yet in the outbox table (the sink reads them too).
    pub fn unfolded(&self) -> &Unfolded {
        &self.unfolded
    }

    /// Outputs dropped so far because the outbox was full.
    pub fn outbox_dropped(&self) -> u64 {
        self.outbox.dropped
    }

    /// Writes one [`Batch`] in ONE transaction: the engine state changed
    /// since the last commit, its outputs appended to the outbox, meta
    /// entries, and the removal of delivered outbox entries.
    /// A failed commit changes nothing: it may be retried with the same batch.
    pub fn commit(&mut self, batch: &Batch) -> Result<CommitStats, StoreError> {
        let before = self.outbox;
        let r = self.commit_txn(batch);
        if r.is_err() {
            self.outbox = before;
        }
        r
    }

    /// Closes the database and opens it again: after an I/O error (a full
    /// disk) redb refuses every call until then. Waits for readers to finish.
    pub fn reopen(&self) -> Result<(), StoreError> {
        if self.path == Path::new(MEMORY) {
            return Ok(());
        }
        let mut slot = self
            .db
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(mut old) = slot.take() {
            // Readers hold a clone only for the length of one read.
            loop {
                match std::sync::Arc::try_unwrap(old) {
                    Ok(db) => {
                        drop(db);
                        break;
                    }
                    Err(still) => {
                        old = still;
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
            }
        }
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .open(&self.path)
            .map_err(|source| StoreError::Reopen {
                path: self.path.clone(),
                source,
            })?;
        *slot = Some(std::sync::Arc::new(db));
        Ok(())
    }

    /// Up to `limit` outbox entries with sequence number > `after`, oldest first.
    pub fn outbox_after(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<(u64, OutboxEntry)>, StoreError> {
        self.reader().outbox_after(after, limit)
    }

    /// A read handle on the outbox for another thread (redb reads run beside the writer).
    pub fn reader(&self) -> OutboxReader {
        OutboxReader {
            db: self.db.clone(),
            path: self.path.clone(),
            unfolded: self.unfolded.clone(),
        }
    }

    /// Entries in the outbox.
    pub fn outbox_depth(&self) -> Result<u64, StoreError> {
        let r = self.db.get()?.begin_read()?;
        Ok(r.open_table(OUTBOX)?.len()?)
    }
}
