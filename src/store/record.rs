//! The write-ahead journal's record: what the engine was given since the last
//! batch (the ops of [`crate::journal`]), the outputs it produced with their
//! outbox numbers, and the delivered mark — CBOR in an LZ4 block behind a
//! format byte. Written by `run`'s store thread, read back by its recovery.

use serde::{Deserialize, Serialize};

use super::OutboxEntry;

#[derive(Serialize)]
struct RecordRef<'a> {
    #[serde(with = "serde_bytes")]
    ops: &'a [u8],
    outputs: &'a [(u64, &'a OutboxEntry)],
    delivered: Option<u64>,
}

/// One journal record, decoded.
#[derive(Debug, Deserialize)]
pub struct Record {
    /// Journal ops ([`crate::journal::apply`]).
    #[serde(with = "serde_bytes")]
    pub ops: Vec<u8>,
    /// Outputs with their outbox numbers.
    pub outputs: Vec<(u64, OutboxEntry)>,
    /// Highest outbox number acknowledged upstream, if any.
    pub delivered: Option<u64>,
}

/// Record body (written before): a format byte, then the CBOR record as one LZ4
/// block, size prepended.
const LZ4: u8 = 1;
/// Record body: a format byte, then the CBOR record cut into pieces of at most
/// [`CHUNK`] bytes, each an LZ4 block (size prepended) behind its length (u32 LE).
/// The record is compressed as it is encoded: a tick that closed 10 000 windows
/// no longer holds its whole uncompressed record (~6 MiB) at once.
const LZ4_CHUNKS: u8 = 2;
/// Uncompressed bytes per block.
const CHUNK: usize = 64 * 1024;
/// A record larger than this when decompressed is not ours.
const MAX_RECORD: usize = 1 << 30;

/// Compresses what is written to it, a block per [`CHUNK`] bytes.
struct Chunks<'a> {
    scratch: &'a mut Vec<u8>,
    body: Vec<u8>,
}

impl Chunks<'_> {
    fn seal(&mut self) {
        if self.scratch.is_empty() {
            return;
        }
        let block = lz4_flex::block::compress_prepend_size(self.scratch);
        let len = u32::try_from(block.len()).unwrap_or(u32::MAX);
        self.body.extend_from_slice(&len.to_le_bytes());
        self.body.extend_from_slice(&block);
        self.scratch.clear();
    }
}

impl std::io::Write for Chunks<'_> {
    fn write(&mut self, mut data: &[u8]) -> std::io::Result<usize> {
        let n = data.len();
        while !data.is_empty() {
            let take = (CHUNK - self.scratch.len()).min(data.len());
            self.scratch.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.scratch.len() >= CHUNK {
                self.seal();
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encodes a record body; `buf` is reused scratch (at most [`CHUNK`] bytes).
pub fn encode(
    ops: &[u8],
    outputs: &[(u64, &OutboxEntry)],
    delivered: Option<u64>,
    buf: &mut Vec<u8>,
) -> Vec<u8> {
    buf.clear();
    let rec = RecordRef {
        ops,
        outputs,
        delivered,
    };
    let mut w = Chunks {
        scratch: buf,
        body: vec![LZ4_CHUNKS],
    };
    // Writing plain data into memory cannot fail.
    // Readings compress 5-8x (JSON keys, topics, timestamps): fewer pages per commit.
    let _ = ciborium::ser::into_writer(&rec, &mut w);
    w.seal();
    let mut body = w.body;
    if body.len() >= 5 && body.len() - 5 == u32_at(&body[1..]) {
        // One block (every record but a burst's): the earlier format, byte for byte,
        // which a rolled-back binary still reads after a crash.
        body.drain(1..5);
        body[0] = LZ4;
    }
    body
}

fn u32_at(b: &[u8]) -> usize {
    b.get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(usize::MAX, |b| u32::from_le_bytes(b) as usize)
}

/// Decodes a record body.
pub fn decode(body: &[u8]) -> Result<Record, String> {
    let (&format, mut rest) = body.split_first().ok_or("empty record")?;
    let cbor = match format {
        LZ4 => block(rest)?,
        LZ4_CHUNKS => {
            let mut cbor = Vec::new();
            while !rest.is_empty() {
                let len = u32_at(rest);
                let piece = rest
                    .get(4..4usize.saturating_add(len))
                    .ok_or("torn block")?;
                cbor.extend_from_slice(&block(piece)?);
                if cbor.len() > MAX_RECORD {
                    return Err(format!("record larger than {MAX_RECORD} bytes"));
                }
                rest = &rest[4 + len..];
            }
            cbor
        }
        _ => return Err(format!("unknown record format {format}")),
    };
    ciborium::de::from_reader(cbor.as_slice()).map_err(|e| e.to_string())
}

/// One LZ4 block, size prepended.
fn block(b: &[u8]) -> Result<Vec<u8>, String> {
    let size = u32_at(b);
    if size > MAX_RECORD {
        return Err(format!("record size {size} out of range"));
    }
    lz4_flex::block::decompress_size_prepended(b).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_and_garbage_is_refused() {
        let e = OutboxEntry {
            topic: "t".into(),
            payload: b"{}".to_vec().into(),
            retain: false,
            at: 7,
            report: false,
        };
        let body = encode(b"ops", &[(3, &e)], Some(2), &mut Vec::new());
        // A small record is one block: the earlier format, byte for byte.
        assert_eq!(body[0], LZ4);
        let r = decode(&body).unwrap();
        assert_eq!(r.ops, b"ops");
        assert_eq!(r.outputs, vec![(3, e)]);
        assert_eq!(r.delivered, Some(2));
        assert!(decode(&[]).is_err());
        assert!(decode(&[9, 1, 2]).is_err());
        assert!(decode(&[LZ4, 255, 255, 255, 255]).is_err());
        assert!(decode(&[LZ4_CHUNKS, 255, 255, 255, 255]).is_err());
        assert!(decode(&body[..body.len() - 1]).is_err());
    }

    #[test]
    fn a_burst_is_written_in_blocks_and_reads_back_whole() {
        let entries: Vec<OutboxEntry> = (0..5_000u64)
            .map(|i| OutboxEntry {
                topic: format!("tidemark/gw/windows/g/d{i}"),
                payload: format!(r#"{{"id":"g/d{i}/0/0","count":{i}}}"#)
                    .into_bytes()
                    .into(),
                retain: false,
                at: 7,
                report: false,
            })
            .collect();
        let numbered: Vec<(u64, &OutboxEntry)> = (100..).zip(entries.iter()).collect();
        let mut scratch = Vec::new();
        let body = encode(b"ops", &numbered, None, &mut scratch);
        assert_eq!(body[0], LZ4_CHUNKS);
        assert!(scratch.capacity() <= 2 * CHUNK, "{}", scratch.capacity());
        assert!(body.len() < 5_000 * 40, "compressed: {}", body.len());
        let r = decode(&body).unwrap();
        assert_eq!(r.outputs.len(), 5_000);
        assert!(
            r.outputs
                .iter()
                .zip(&numbered)
                .all(|((s, e), (t, f))| s == t && e == *f)
        );
    }

    #[test]
    fn a_record_written_as_one_block_still_reads() {
        let e = OutboxEntry {
            topic: "t".into(),
            payload: b"{}".to_vec().into(),
            retain: true,
            at: 9,
            report: false,
        };
        let mut cbor = Vec::new();
        let rec = RecordRef {
            ops: b"x",
            outputs: &[(1, &e)],
            delivered: None,
        };
        ciborium::ser::into_writer(&rec, &mut cbor).unwrap();
        let mut body = vec![LZ4];
        body.extend_from_slice(&lz4_flex::block::compress_prepend_size(&cbor));
        // What `encode` writes for it is that format, byte for byte.
        assert_eq!(encode(b"x", &[(1, &e)], None, &mut Vec::new()), body);
        let r = decode(&body).unwrap();
        assert_eq!((r.ops.as_slice(), r.outputs), (&b"x"[..], vec![(1, e)]));
    }
}
