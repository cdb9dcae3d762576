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

/// Record body: a format byte, then the CBOR record (LZ4 block, size prepended).
const LZ4: u8 = 1;
/// A record larger than this when decompressed is not ours.
const MAX_RECORD: usize = 1 << 30;

/// Encodes a record body; `buf` is reused scratch.
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
    // Writing plain data into a Vec cannot fail.
    let _ = ciborium::ser::into_writer(&rec, &mut *buf);
    // Readings compress 5-8x (JSON keys, topics, timestamps): fewer pages per commit.
    let mut body = Vec::with_capacity(buf.len() / 4 + 16);
    body.push(LZ4);
    body.extend_from_slice(&lz4_flex::block::compress_prepend_size(buf));
    body
}

/// Decodes a record body.
pub fn decode(body: &[u8]) -> Result<Record, String> {
    let (&format, rest) = body.split_first().ok_or("empty record")?;
    if format != LZ4 {
        return Err(format!("unknown record format {format}"));
    }
    let size = rest
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(usize::MAX, |b| u32::from_le_bytes(b) as usize);
    if size > MAX_RECORD {
        return Err(format!("record size {size} out of range"));
    }
    let cbor = lz4_flex::block::decompress_size_prepended(rest).map_err(|e| e.to_string())?;
    ciborium::de::from_reader(cbor.as_slice()).map_err(|e| e.to_string())
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
        };
        let body = encode(b"ops", &[(3, &e)], Some(2), &mut Vec::new());
        let r = decode(&body).unwrap();
        assert_eq!(r.ops, b"ops");
        assert_eq!(r.outputs, vec![(3, e)]);
        assert_eq!(r.delivered, Some(2));
        assert!(decode(&[]).is_err());
        assert!(decode(&[9, 1, 2]).is_err());
        assert!(decode(&[LZ4, 255, 255, 255, 255]).is_err());
    }
}
