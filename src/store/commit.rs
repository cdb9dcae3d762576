//! One checkpoint's redb transaction: devices (streamed slices too), groups, names,
//! the outbox and its bound, META.

use redb::{ReadableTable, ReadableTableMetadata};

use super::schema::{
    DEVICES, GROUPS, K_CLOCK, K_COUNTERS, K_FLEET_ID, K_OUTBOX, K_SPARKPLUG, META, METRIC_NAMES,
    OUTBOX, OUTBOX_REPORTS,
};
use super::{Batch, CommitStats, OutboxEntry, Store, StoreError, cbor, outbox, schema};
use crate::engine::Changes;

/// The engine's state outside groups and devices, into `META`.
fn meta_of(
    ch: &Changes,
    m: &mut redb::Table<'_, &str, &[u8]>,
    buf: &mut Vec<u8>,
) -> Result<(), StoreError> {
    cbor(&ch.counters, buf);
    m.insert(K_COUNTERS, buf.as_slice())?;
    cbor(&ch.clock, buf);
    m.insert(K_CLOCK, buf.as_slice())?;
    if ch.fleet_last_id > 0 {
        m.insert(K_FLEET_ID, ch.fleet_last_id.to_be_bytes().as_slice())?;
    }
    if ch.bd_seq > 0 {
        m.insert(schema::K_BD_SEQ, ch.bd_seq.to_be_bytes().as_slice())?;
    }
    for (o, mark) in crate::model::OutputKind::ALL.iter().zip(&ch.outputs) {
        if *mark != crate::model::OutputMark::default() {
            cbor(mark, buf);
            let key = format!("{}{}", schema::K_OUTPUT, o.as_str());
            m.insert(key.as_str(), buf.as_slice())?;
        }
    }
    for n in &ch.sparkplug {
        cbor(n, buf);
        let key = format!("{K_SPARKPLUG}{}/{}", n.group, n.node);
        m.insert(key.as_str(), buf.as_slice())?;
    }
    Ok(())
}

impl Store {
    pub(super) fn commit_txn(&mut self, batch: &Batch) -> Result<CommitStats, StoreError> {
        let ch = &batch.changes;
        let mut stats = CommitStats {
            devices: ch.devices.len(),
            groups: ch.groups.len(),
            outputs: batch.outputs.len(),
            dropped: 0,
            first_seq: self.outbox.next_seq,
            depth: 0,
            oldest_at: None,
        };
        let db = self.db.get()?;
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        {
            let mut devices = txn.open_table(DEVICES)?;
            ch.devices
                .for_each(|group, id, record| devices.insert((group, id), record).map(drop))?;
            if let Some(rest) = &batch.rest {
                for slice in rest {
                    stats.devices += slice.len();
                    slice.for_each(|group, id, record| {
                        devices.insert((group, id), record).map(drop)
                    })?;
                }
            }
            let mut groups = txn.open_table(GROUPS)?;
            for g in &ch.groups {
                cbor(g, &mut self.buf);
                groups.insert(g.name.as_str(), self.buf.as_slice())?;
            }
            let mut names = txn.open_table(METRIC_NAMES)?;
            for (i, n) in &ch.metric_names {
                names.insert(*i, n.as_str())?;
            }
            let mut outbox = txn.open_table(OUTBOX)?;
            let mut reports = txn.open_table(OUTBOX_REPORTS)?;
            let mut bytes = self.outbox.bytes.unwrap_or(0);
            if let Some(upto) = batch.delivered {
                for item in outbox.range(..=upto)? {
                    bytes = bytes.saturating_sub(item?.1.value().len() as u64);
                }
                outbox.retain_in(..=upto, |_, _| false)?;
                reports.retain_in(..=upto, |_, ()| false)?;
            }
            for (seq, o) in &batch.folded {
                if batch.delivered.is_none_or(|d| *seq > d) {
                    cbor(o, &mut self.buf);
                    if let Some(old) = outbox.insert(*seq, self.buf.as_slice())? {
                        bytes = bytes.saturating_sub(old.value().len() as u64);
                    }
                    bytes += self.buf.len() as u64;
                    if o.report {
                        reports.insert(*seq, ())?;
                    }
                }
                self.outbox.next_seq = self.outbox.next_seq.max(seq + 1);
            }
            stats.first_seq = self.outbox.next_seq;
            for o in &batch.outputs {
                cbor(o, &mut self.buf);
                outbox.insert(self.outbox.next_seq, self.buf.as_slice())?;
                bytes += self.buf.len() as u64;
                if o.report {
                    reports.insert(self.outbox.next_seq, ())?;
                }
                self.outbox.next_seq += 1;
            }
            let dropped = outbox::bound(
                &mut outbox,
                &mut reports,
                (self.max_outbox, self.max_bytes),
                &mut bytes,
            )?;
            stats.dropped = dropped;
            self.outbox.dropped += dropped;
            self.outbox.bytes = Some(bytes);
            stats.depth = outbox.len()?;
            stats.oldest_at = match outbox.first()? {
                Some((_, v)) => ciborium::de::from_reader::<OutboxEntry, _>(v.value())
                    .ok()
                    .map(|e| e.at),
                None => None,
            };
            let mut m = txn.open_table(META)?;
            meta_of(ch, &mut m, &mut self.buf)?;
            cbor(&self.outbox, &mut self.buf);
            m.insert(K_OUTBOX, self.buf.as_slice())?;
            for (k, v) in &batch.meta {
                m.insert(*k, v.as_slice())?;
            }
        }
        txn.commit()?;
        Ok(stats)
    }
}
