//! Durable replay: state, outputs and the input position committed together,
//! resumable after a crash.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use serde_json::value::RawValue;

use super::{Input, ReplayError, Summary, VirtualMono, io, line_into};
use crate::config::Config;
use crate::driver::Driver;
use crate::engine::{Engine, Now};
use crate::model::Millis;
use crate::output::SinkFormat;
use crate::store::{Batch, Store, StoreError};

/// Replay position committed with the state.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Position {
    /// Input bytes consumed.
    offset: u64,
    /// Next virtual tick.
    next_tick: Option<Millis>,
    /// Latest arrival seen.
    last_arrival: Option<Millis>,
    /// Virtual time of the last commit.
    last_commit: Option<Millis>,
    /// The virtual monotonic clock (absent in positions written before it).
    #[serde(default)]
    mono: VirtualMono,
}

const K_REPLAY: &str = "replay";

/// Cuts a partial last line (a crash mid-write); its output is still in the outbox.
fn trim_partial_line(f: &mut File) -> std::io::Result<()> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut keep = len;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let start = keep.saturating_sub(buf.len() as u64);
        let n = usize::try_from(keep - start).unwrap_or(0);
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..n])?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            keep = start + i as u64 + 1;
            break;
        }
        if start == 0 {
            keep = 0;
            break;
        }
        keep = start;
    }
    if keep != len {
        f.set_len(keep)?;
    }
    f.seek(SeekFrom::End(0))?;
    Ok(())
}

struct Durable {
    store: Store,
    /// The output file; standard output when None.
    out: Option<File>,
    pos: Position,
    /// Outbox entries written to the output file, not yet removed from the outbox.
    delivered: Option<u64>,
    summary: Summary,
    commit_ms: Millis,
}

impl Durable {
    /// Writes every outbox entry after the delivered mark to the output file and flushes it.
    fn deliver(&mut self) -> Result<(), ReplayError> {
        let mut buf = Vec::new();
        loop {
            let batch = self.store.outbox_after(self.delivered, 4096)?;
            let Some(&(last, _)) = batch.last() else {
                break;
            };
            buf.clear();
            for (_, e) in &batch {
                let payload: &RawValue = serde_json::from_slice(&e.payload)
                    .map_err(|err| io("outbox entry is not JSON")(err.into()))?;
                let text = payload.get().as_bytes();
                line_into(
                    &mut buf,
                    &e.topic,
                    |l| l.extend_from_slice(text),
                    e.retain,
                    None,
                );
            }
            match &mut self.out {
                Some(f) => f.write_all(&buf),
                None => std::io::stdout().lock().write_all(&buf),
            }
            .map_err(io("writing output"))?;
            self.summary.outputs += batch.len() as u64;
            self.delivered = Some(last);
        }
        match &mut self.out {
            Some(f) => f.sync_data(),
            None => std::io::stdout().lock().flush(),
        }
        .map_err(io("syncing output"))?;
        Ok(())
    }

    fn commit(&mut self, rp: &mut Driver, now: Millis) -> Result<(), ReplayError> {
        let mut batch = rp.take_batch(Now::at(now));
        self.pos.next_tick = rp.next_tick();
        self.pos.last_commit = rp.last_commit();
        let mut pos = Vec::new();
        ciborium::ser::into_writer(&self.pos, &mut pos)
            .map_err(|e| io("encoding position")(std::io::Error::other(e)))?;
        batch.meta.push((K_REPLAY, pos));
        batch.delivered = self.delivered;
        self.store.commit(&batch)?;
        self.summary.commits += 1;
        self.deliver()
    }
}

pub(super) fn run_durable(
    cfg: &Config,
    input: File,
    output: Option<&Path>,
    dir: &Path,
    drain_ms: Millis,
    flush: bool,
) -> Result<(Engine, Summary), ReplayError> {
    let (mut store, snap) = Store::open(dir, cfg.sink.outbox.messages)?;
    store.set_max_bytes(cfg.sink.outbox.bytes);
    let pos: Position = match snap.meta.get(K_REPLAY) {
        Some(b) => ciborium::de::from_reader(&b[..]).map_err(|e| StoreError::Corrupt {
            path: store.path().to_path_buf(),
            table: "meta",
            source: e.into(),
        })?,
        None => Position::default(),
    };
    let mut engine = Engine::new(&cfg.engine);
    engine.restore(snap.groups, snap.devices, snap.metric_names, snap.counters);
    engine.restore_clock(snap.gateway_clock);
    engine.take_fleet_id(crate::store::schema::fleet_last_id(&snap.meta));
    engine.take_bd_seq(crate::store::schema::bd_seq(&snap.meta));
    for (o, mark) in crate::store::schema::output_marks(&snap.meta) {
        engine.take_output_mark(o, mark);
    }
    engine.restore_sparkplug(snap.sparkplug);
    let out = match output {
        Some(path) => {
            let mut f = OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(path)
                .map_err(io(format!("opening {}", path.display())))?;
            trim_partial_line(&mut f).map_err(io(format!("repairing {}", path.display())))?;
            Some(f)
        }
        None => None,
    };
    let mut d = Durable {
        store,
        out,
        pos,
        delivered: None,
        summary: Summary::default(),
        commit_ms: Millis::try_from(cfg.gateway.commit_interval_ms).unwrap_or(1),
    };
    // Outputs committed before a crash but not yet in the file.
    d.deliver()?;

    let mut input = BufReader::with_capacity(1 << 18, input);
    input
        .seek(SeekFrom::Start(d.pos.offset))
        .map_err(io("seeking input"))?;
    let mut input = Input {
        r: input,
        line: String::new(),
        offset: d.pos.offset,
        line_no: 0,
        mono: d.pos.mono,
    };
    let mut rp = Driver::new(
        engine,
        &cfg.gateway,
        &cfg.sink.prefix,
        SinkFormat::Json,
        d.pos.next_tick,
    )
    .with_last_commit(d.pos.last_commit);
    let (mut topic, mut payload) = (String::new(), Vec::new());
    loop {
        topic.clear();
        payload.clear();
        let Some(now) = input.next_into(&mut topic, &mut payload)? else {
            break;
        };
        rp.message(now, &topic, &payload);
        // Replay has no site broker to ask for rebirths.
        rp.engine_mut().take_commands();
        d.summary.records += 1;
        d.pos.offset = input.offset;
        d.pos.mono = input.mono;
        // Virtual time: the arrival for captures without "mono".
        let t = now.mono;
        d.pos.last_arrival = Some(d.pos.last_arrival.map_or(t, |l| l.max(t)));
        if rp.interval_elapsed(t) {
            d.commit(&mut rp, t)?;
        }
    }
    if let Some(last) = d.pos.last_arrival {
        let end = last.saturating_add(drain_ms);
        while let Some(t) = rp.next_tick().filter(|&t| t <= end) {
            let step = (t + d.commit_ms).min(end);
            rp.ticks_until(Now::at(step));
            if rp.interval_elapsed(step) || rp.next_tick().is_none_or(|n| n > end) {
                d.commit(&mut rp, step)?;
            }
        }
    }
    if flush {
        rp.flush();
    }
    // Final commit: remaining outputs, and the delivered ones leave the outbox.
    let now = d.pos.last_commit.unwrap_or(0);
    d.commit(&mut rp, now)?;
    let last = Batch {
        changes: rp.engine_mut().take_changes(),
        delivered: d.delivered,
        ..Batch::default()
    };
    d.store.commit(&last)?;
    Ok((rp.into_engine(), d.summary))
}
