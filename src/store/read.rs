//! Reading a state file: the snapshot a start restores, its checks, `inspect`.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::schema::{
    self, DEVICES, GROUPS, K_CLOCK, K_COUNTERS, K_OUTBOX, K_SCHEMA, K_SPARKPLUG, META,
    METRIC_NAMES, OUTBOX, SCHEMA_VERSION,
};
use super::*;

/// Every table exists and the schema version matches: starting writes nothing
/// (a gateway restarted on a full disk must get as far as its retry loop).
pub(super) fn has_tables(db: &Database) -> Result<bool, StoreError> {
    let r = db.begin_read()?;
    let version = match r.open_table(META) {
        Ok(t) => t.get(K_SCHEMA)?.map(|v| v.value().to_vec()),
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if version.as_deref().map(schema::version_of) != Some(SCHEMA_VERSION) {
        // Missing or another version: the write path creates or refuses it.
        return Ok(false);
    }
    for exists in [
        r.open_table(GROUPS).is_ok(),
        r.open_table(DEVICES).is_ok(),
        r.open_table(METRIC_NAMES).is_ok(),
        r.open_table(OUTBOX).is_ok(),
    ] {
        if !exists {
            return Ok(false);
        }
    }
    Ok(true)
}

type Cause = Box<dyn std::error::Error + Send + Sync>;

fn corrupt<'a>(path: &'a Path, table: &'static str) -> impl Fn(Cause) -> StoreError + 'a {
    move |source| StoreError::Corrupt {
        path: path.to_path_buf(),
        table,
        source,
    }
}

pub(super) fn read_snapshot<D: ReadableDatabase>(
    db: &D,
    path: &Path,
    devices: bool,
) -> Result<Snapshot, StoreError> {
    let r = db.begin_read()?;
    let mut s = Snapshot::default();
    for item in r.open_table(GROUPS)?.iter()? {
        let (_, v) = item?;
        s.groups.push(
            ciborium::de::from_reader(v.value()).map_err(|e| corrupt(path, "groups")(e.into()))?,
        );
    }
    s.device_count = r.open_table(DEVICES)?.len()?;
    if devices {
        s.devices
            .reserve_exact(usize::try_from(s.device_count).unwrap_or(0));
        each_device(&r, path, &mut |d| s.devices.push(d))?;
    }
    for item in r.open_table(METRIC_NAMES)?.iter()? {
        let (k, v) = item?;
        if usize::from(k.value()) != s.metric_names.len() {
            return Err(corrupt(path, "metric_names")(
                "gap in metric name indexes".into(),
            ));
        }
        let name = MetricName::try_from(v.value())
            .map_err(|_| corrupt(path, "metric_names")("name too long".into()))?;
        s.metric_names.push(name);
    }
    for item in r.open_table(META)?.iter()? {
        let (k, v) = item?;
        s.meta.insert(k.value().to_string(), v.value().to_vec());
    }
    if let Some(b) = s.meta.get(K_COUNTERS) {
        s.counters =
            ciborium::de::from_reader(&b[..]).map_err(|e| corrupt(path, "meta")(e.into()))?;
    }
    if let Some(b) = s.meta.get(K_CLOCK) {
        s.gateway_clock =
            Some(ciborium::de::from_reader(&b[..]).map_err(|e| corrupt(path, "meta")(e.into()))?);
    }
    for (k, b) in s.meta.range(K_SPARKPLUG.to_string()..) {
        if !k.starts_with(K_SPARKPLUG) {
            break;
        }
        s.sparkplug
            .push(ciborium::de::from_reader(&b[..]).map_err(|e| corrupt(path, "meta")(e.into()))?);
    }
    if let Some(b) = s.meta.get(K_OUTBOX) {
        let m: OutboxMeta =
            ciborium::de::from_reader(&b[..]).map_err(|e| corrupt(path, "meta")(e.into()))?;
        s.outbox_dropped = m.dropped;
    }
    s.outbox_depth = r.open_table(OUTBOX)?.len()?;
    Ok(s)
}

pub(super) fn each_device(
    r: &redb::ReadTransaction,
    path: &Path,
    f: &mut dyn FnMut(Device),
) -> Result<(), StoreError> {
    for item in r.open_table(DEVICES)?.iter()? {
        let (_, v) = item?;
        f(ciborium::de::from_reader(v.value()).map_err(|e| corrupt(path, "devices")(e.into()))?);
    }
    Ok(())
}

/// Refuses a file without our schema version (another program's redb, or another version).
pub(super) fn check_version<D: ReadableDatabase>(db: &D, path: &Path) -> Result<(), StoreError> {
    let r = db.begin_read()?;
    let found = match r.open_table(META) {
        Ok(meta) => meta
            .get(K_SCHEMA)?
            .map_or(u32::MAX, |v| schema::version_of(v.value())),
        Err(redb::TableError::TableDoesNotExist(_)) => {
            // A database created but never initialised (crash during the first start).
            if r.list_tables()?.next().is_none() {
                return Ok(());
            }
            u32::MAX
        }
        Err(e) => return Err(e.into()),
    };
    if found != SCHEMA_VERSION {
        return Err(StoreError::Version {
            path: path.to_path_buf(),
            found,
        });
    }
    Ok(())
}

/// A read-only view for `tidemark inspect` (the gateway must be stopped).
pub struct Inspect {
    /// Everything persisted.
    pub snapshot: Snapshot,
    /// Oldest outbox entry, if any.
    pub oldest: Option<OutboxEntry>,
    /// Journal records after the checkpoint (a gateway that stopped without its final checkpoint).
    pub journal_records: usize,
}

/// Opens a state directory read-only.
pub fn inspect(state_dir: &Path) -> Result<Inspect, StoreError> {
    let path = Store::file(state_dir);
    if !path.exists() {
        return Err(StoreError::Open {
            path,
            source: redb::DatabaseError::Storage(redb::StorageError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no state file",
            ))),
        });
    }
    match redb::ReadOnlyDatabase::open(&path) {
        Ok(db) => read_inspect(&db, &path, state_dir),
        Err(redb::DatabaseError::RepairAborted) => {
            // Left by a crash: recover a copy in a directory only we can enter,
            // never the original.
            let dir = private_temp_dir().map_err(|source| StoreError::Dir {
                path: std::env::temp_dir(),
                source,
            })?;
            let copy = dir.join("tidemark.redb");
            let result = std::fs::copy(&path, &copy)
                .map_err(|source| StoreError::Dir {
                    path: copy.clone(),
                    source,
                })
                .and_then(|_| {
                    Database::open(&copy).map_err(|source| StoreError::Open {
                        path: path.clone(),
                        source,
                    })
                })
                .and_then(|db| read_inspect(&db, &path, state_dir));
            let _ = std::fs::remove_dir_all(&dir);
            result
        }
        Err(source) => Err(StoreError::Open { path, source }),
    }
}

/// Whether `path` is a state file this build can open (a standby checks a
/// snapshot with this before it replaces anything): its version, then every
/// table it restores from, devices included.
pub fn verify_file(path: &Path) -> Result<(), StoreError> {
    // A copy of a live file needs redb's recovery, done in place: `path` is a side file.
    let db = Database::open(path).map_err(|source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    check_version(&db, path)?;
    read_snapshot(&db, path, true).map(drop)
}

/// A new directory (mode 0700) under the temp dir; a name already taken (by
/// anyone, a symlink included) is never used.
fn private_temp_dir() -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let mut last = None;
    for n in 0..1000u32 {
        let dir = base.join(format!("tidemark-inspect-{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temp name")))
}

fn read_inspect<D: ReadableDatabase>(
    db: &D,
    path: &Path,
    state_dir: &Path,
) -> Result<Inspect, StoreError> {
    check_version(db, path)?;
    let snapshot = read_snapshot(db, path, true)?;
    let generation = schema::wal_generation(&snapshot.meta);
    let journal_records = wal::count(state_dir, generation).unwrap_or(0);
    let r = db.begin_read()?;
    let oldest = match r.open_table(OUTBOX)?.first()? {
        Some((_, v)) => Some(
            ciborium::de::from_reader(v.value()).map_err(|e| corrupt(path, "outbox")(e.into()))?,
        ),
        None => None,
    };
    Ok(Inspect {
        snapshot,
        oldest,
        journal_records,
    })
}

/// Reads the outbox beside the writer (the sink's backlog after a restart or an outage).
#[derive(Clone)]
pub struct OutboxReader {
    pub(super) db: std::sync::Arc<super::DbSlot>,
    pub(super) path: std::path::PathBuf,
    pub(super) unfolded: super::Unfolded,
}

impl OutboxReader {
    /// Up to `limit` outbox entries with sequence number > `after`, oldest first.
    pub fn outbox_after(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<(u64, super::OutboxEntry)>, super::StoreError> {
        // Under the lock a checkpoint moving entries from the journal to the table holds.
        let pending = self
            .unfolded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = self.db.get()?.begin_read()?;
        let t = r.open_table(super::schema::OUTBOX)?;
        let start = after.map_or(0, |a| a + 1);
        let mut out = Vec::new();
        for item in t.range(start..)?.take(limit) {
            let (k, v) = item?;
            let e =
                ciborium::de::from_reader(v.value()).map_err(|e| super::StoreError::Corrupt {
                    path: self.path.clone(),
                    table: "outbox",
                    source: e.into(),
                })?;
            out.push((k.value(), e));
        }
        // Then the journal's outputs: all numbered after the table's.
        if out.len() < limit {
            let from = out.last().map_or(start, |(s, _)| s + 1);
            let skip = pending.partition_point(|(s, _)| *s < from);
            out.extend(pending.iter().skip(skip).take(limit - out.len()).cloned());
        }
        Ok(out)
    }
}
