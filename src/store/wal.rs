//! The write-ahead journal beside the redb file (`state_dir/tidemark.wal`).
//!
//! redb rewrites ~6 pages of its own trees and header on every durable
//! commit (24 KiB measured for a one-key write), and the engine state a few
//! readings touch is spread over many pages. On an SD card that is the wear.
//! So between checkpoints each group commit is one record appended here and
//! made durable with `fdatasync`: what the engine was given (see
//! [`crate::journal`]), the outputs it produced and the delivered mark. redb
//! takes the folded state now and then (a checkpoint), after which the
//! journal starts over at offset 0 under a new generation.
//!
//! The file is written full of zeros once and then only overwritten in place:
//! an `fdatasync` then flushes the record's own pages and no file-system
//! metadata. A record is `[magic u32][generation u64][index u32][len u32]
//! [crc32 u32][body]`; reading stops at the first record that is torn, of
//! another generation, out of sequence or fails its checksum.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: u32 = 0x544d_574c; // "TMWL"
const HEADER: usize = 4 + 8 + 4 + 4 + 4;
/// Size the file is written to once; records past it grow the file.
pub const PREALLOCATED: u64 = 8 << 20;
/// A body larger than this is not ours (a corrupt length).
const MAX_BODY: u32 = 1 << 30;

/// The journal file.
pub struct Wal {
    file: File,
    path: PathBuf,
    generation: u64,
    index: u32,
    offset: u64,
}

impl Wal {
    /// The journal inside a state directory.
    pub fn file(state_dir: &Path) -> PathBuf {
        state_dir.join("tidemark.wal")
    }

    /// Opens (creating and preallocating it if needed) and reads the records of
    /// `generation` in order. Writing continues after them.
    pub fn open(state_dir: &Path, generation: u64) -> io::Result<(Self, Vec<Vec<u8>>)> {
        let path = Self::file(state_dir);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let len = file.metadata()?.len();
        if len < PREALLOCATED {
            // A nearly full disk keeps its room for the state file: the journal then
            // grows as it is written (and fails only when the disk is really full).
            let room = free_bytes(&file).is_none_or(|f| f >= 4 * PREALLOCATED);
            match if room {
                preallocate(&file, len)
            } else {
                Err(io::ErrorKind::StorageFull.into())
            } {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::StorageFull => {
                    file.set_len(len)?;
                    tracing::warn!(
                        path = %path.display(),
                        "little free space: the journal is not preallocated and grows as it is written"
                    );
                    drop_cache(&file);
                }
                Err(e) => return Err(e),
            }
            if len == 0
                && let Ok(dir) = File::open(state_dir)
            {
                dir.sync_all()?;
            }
        }
        let mut wal = Self {
            file,
            path,
            generation,
            index: 0,
            offset: 0,
        };
        let records = wal.read_all()?;
        drop_cache(&wal.file);
        Ok((wal, records))
    }

    fn read_all(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        let len = self.file.metadata()?.len();
        let mut head = [0u8; HEADER];
        loop {
            if self.offset + HEADER as u64 > len {
                break;
            }
            self.file.read_exact_at(&mut head, self.offset)?;
            let magic = u32::from_le_bytes(field(&head, 0));
            let generation = u64::from_le_bytes(field(&head, 4));
            let index = u32::from_le_bytes(field(&head, 12));
            let body_len = u32::from_le_bytes(field(&head, 16));
            let crc = u32::from_le_bytes(field(&head, 20));
            if magic != MAGIC
                || generation != self.generation
                || index != self.index
                || body_len > MAX_BODY
                || self.offset + (HEADER as u64) + u64::from(body_len) > len
            {
                break;
            }
            let mut body = vec![0u8; body_len as usize];
            self.file
                .read_exact_at(&mut body, self.offset + HEADER as u64)?;
            if crc32fast::hash(&body) != crc {
                break;
            }
            out.push(body);
            self.index += 1;
            self.offset += HEADER as u64 + u64::from(body_len);
        }
        Ok(out)
    }

    /// Appends one record and makes it durable.
    pub fn append(&mut self, body: &[u8]) -> io::Result<u64> {
        let len = u32::try_from(body.len())
            .ok()
            .filter(|&l| l <= MAX_BODY)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "journal record too large")
            })?;
        let mut head = [0u8; HEADER];
        head[..4].copy_from_slice(&MAGIC.to_le_bytes());
        head[4..12].copy_from_slice(&self.generation.to_le_bytes());
        head[12..16].copy_from_slice(&self.index.to_le_bytes());
        head[16..20].copy_from_slice(&len.to_le_bytes());
        head[20..].copy_from_slice(&crc32fast::hash(body).to_le_bytes());
        // Two writes, no copy of the body (a commit's record is ~0.3 MB at 10 000
        // readings a second); a crash between them leaves a record its CRC refuses.
        self.file.write_all_at(&head, self.offset)?;
        self.file.write_all_at(body, self.offset + HEADER as u64)?;
        self.file.sync_data()?;
        self.index += 1;
        let written = (HEADER + body.len()) as u64;
        self.offset += written;
        Ok(written)
    }

    /// Starts over at offset 0 under `generation` (after a checkpoint named it).
    /// Nothing is written: older records no longer match the generation.
    pub fn reset(&mut self, generation: u64) {
        self.generation = generation;
        self.index = 0;
        self.offset = 0;
    }

    /// Bytes of records since the last reset.
    pub fn len(&self) -> u64 {
        self.offset
    }

    /// No record since the last reset.
    pub fn is_empty(&self) -> bool {
        self.offset == 0
    }

    /// The generation records are written under.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Records of `generation` in the journal of `state_dir`, read-only (`inspect`).
pub fn count(state_dir: &Path, generation: u64) -> io::Result<usize> {
    let file = File::open(Wal::file(state_dir))?;
    let mut wal = Wal {
        file,
        path: Wal::file(state_dir),
        generation,
        index: 0,
        offset: 0,
    };
    Ok(wal.read_all()?.len())
}

fn field<const N: usize>(head: &[u8; HEADER], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&head[at..at + N]);
    a
}

/// Drops the file's pages from the page cache. Reads (readahead) and large
/// writes leave large folios there, and writeback flushes a dirty folio
/// whole: a 6 KB record written into a cached 1 MiB folio cost 1 MiB on disk
/// (measured). Pages a record creates by itself stay small.
fn drop_cache(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only advises the kernel.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Bytes free to unprivileged users on the file's file system.
fn free_bytes(file: &File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid open descriptor and a buffer of the right type.
    let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstatvfs succeeded, so it filled the buffer.
    let st = unsafe { st.assume_init() };
    // The fields are 32 bits wide on armv7.
    #[allow(clippy::useless_conversion)]
    Some(u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
}

/// Writes zeros up to [`PREALLOCATED`] so later records overwrite allocated blocks.
fn preallocate(file: &File, from: u64) -> io::Result<()> {
    let chunk = vec![0u8; 4096];
    let mut at = from;
    while at < PREALLOCATED {
        let n = usize::try_from((PREALLOCATED - at).min(chunk.len() as u64)).unwrap_or(0);
        file.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    file.sync_all()?;
    drop_cache(file);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_in_order_and_a_reset_hides_the_old_generation() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, recs) = Wal::open(dir.path(), 7).unwrap();
        assert!(recs.is_empty());
        assert_eq!(
            std::fs::metadata(Wal::file(dir.path())).unwrap().len(),
            PREALLOCATED
        );
        w.append(b"one").unwrap();
        w.append(&[9u8; 5000]).unwrap();
        drop(w);
        let (mut w, recs) = Wal::open(dir.path(), 7).unwrap();
        assert_eq!(recs, vec![b"one".to_vec(), vec![9u8; 5000]]);
        w.append(b"three").unwrap();
        let (_, recs) = Wal::open(dir.path(), 7).unwrap();
        assert_eq!(recs.len(), 3);
        // A checkpoint named generation 8: the old records no longer count.
        w.reset(8);
        w.append(b"new").unwrap();
        let (_, recs) = Wal::open(dir.path(), 8).unwrap();
        assert_eq!(recs, vec![b"new".to_vec()]);
        let (_, recs) = Wal::open(dir.path(), 7).unwrap();
        assert!(recs.is_empty(), "record 0 of generation 7 was overwritten");
    }

    #[test]
    fn a_torn_or_corrupt_record_ends_the_journal_there() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, _) = Wal::open(dir.path(), 1).unwrap();
        w.append(b"kept").unwrap();
        let at = w.len();
        w.append(&[5u8; 3000]).unwrap();
        w.append(b"after").unwrap();
        // Flip one byte of the second record's body (a torn page).
        let f = OpenOptions::new()
            .write(true)
            .open(Wal::file(dir.path()))
            .unwrap();
        f.write_all_at(&[6u8], at + HEADER as u64 + 100).unwrap();
        let (mut w, recs) = Wal::open(dir.path(), 1).unwrap();
        assert_eq!(recs, vec![b"kept".to_vec()]);
        // Writing resumes where the valid journal ends.
        w.append(b"again").unwrap();
        let (_, recs) = Wal::open(dir.path(), 1).unwrap();
        assert_eq!(recs, vec![b"kept".to_vec(), b"again".to_vec()]);
    }

    #[test]
    fn records_beyond_the_preallocated_size_grow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, _) = Wal::open(dir.path(), 1).unwrap();
        let big = vec![1u8; 3 << 20];
        for _ in 0..4 {
            w.append(&big).unwrap();
        }
        let (_, recs) = Wal::open(dir.path(), 1).unwrap();
        assert_eq!(recs.len(), 4);
        assert!(std::fs::metadata(Wal::file(dir.path())).unwrap().len() > PREALLOCATED);
    }
}
