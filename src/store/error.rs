//! Store failures.

use std::path::PathBuf;

use super::schema::SCHEMA_VERSION;

/// Store failures. [`StoreError::is_io`] ones (a full disk) are retried by
/// `run`; the others are fatal for the process (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened (corrupt, locked, unreadable).
    #[error("state file {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: redb::DatabaseError,
    },
    /// The state directory could not be created.
    #[error("state dir {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Schema version not understood by this build.
    #[error(
        "state file {path}: schema version {found} is not supported (this build reads {SCHEMA_VERSION}); refusing to touch it"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Version found.
        found: u32,
    },
    /// A stored value does not decode.
    #[error("state file {path}: corrupt value in {table}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Table name.
        table: &'static str,
        /// Cause.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A redb operation failed.
    #[error("state store: {0}")]
    Redb(#[source] redb::Error),
    /// The state file could not be written or read (a full disk, an I/O error).
    #[error("state store: {0}")]
    Io(#[source] redb::Error),
    /// The state file was closed after an I/O error and is not open again yet.
    #[error("state store: state file closed after an I/O error")]
    Closed,
    /// The state file could not be opened again after an I/O error.
    #[error("state file {path}: {source}")]
    Reopen {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: redb::DatabaseError,
    },
    /// The write-ahead journal could not be read or written.
    #[error("journal {path}: {source}")]
    Journal {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

macro_rules! redb_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                match redb::Error::from(e) {
                    e @ (redb::Error::Io(_) | redb::Error::PreviousIo | redb::Error::Backend(_)) => {
                        StoreError::Io(e)
                    }
                    e => StoreError::Redb(e),
                }
            }
        }
    )*};
}

impl StoreError {
    /// A write that may succeed later (a full disk): retried, not fatal.
    pub fn is_io(&self) -> bool {
        matches!(
            self,
            StoreError::Io(_)
                | StoreError::Closed
                | StoreError::Reopen { .. }
                | StoreError::Journal { .. }
        )
    }
}
redb_err!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::DatabaseError,
    redb::SetDurabilityError
);
