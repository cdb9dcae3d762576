//! The physical-limit anchor for `replay` (BENCHMARKS table 3): a bare
//! single-threaded loop doing the least the job needs — parse each capture line
//! (serde_json, borrowed), look the device up in a hash map, fold the reading
//! into its 1-minute tumbling window, keep a per-device watermark (max − 5 s),
//! emit each window as a JSON line once the watermark passes it. No clock
//! calibration, no dedup, no durability, no groups, no late path.
//!
//! `cargo bench --bench bare_loop -- CAPTURE` prints one JSON line:
//! {"readings","windows","wall_s","cpu_s"}; the results go to standard output's
//! sink only when `BARE_OUT` names a file.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};

use serde::Deserialize;

const WINDOW_MS: i64 = 60_000;
const BOUND_MS: i64 = 5_000;

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    topic: &'a str,
    payload: Payload,
}

#[derive(Deserialize)]
struct Payload {
    ts: i64,
    temp: f64,
}

#[derive(Clone, Copy)]
struct Agg {
    start: i64,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

#[derive(Default)]
struct Device {
    max_ts: i64,
    windows: Vec<Agg>,
}

fn cpu_s() -> f64 {
    // utime + stime of this process, in clock ticks (USER_HZ = 100 on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn emit(out: &mut impl Write, device: &str, w: &Agg) -> std::io::Result<()> {
    writeln!(
        out,
        r#"{{"device":"{device}","start":{},"end":{},"count":{},"temp":{{"sum":{},"min":{},"max":{}}}}}"#,
        w.start,
        w.start + WINDOW_MS,
        w.count,
        w.sum,
        w.min,
        w.max
    )
}

fn main() -> std::io::Result<()> {
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .expect("usage: bare_loop CAPTURE");
    // A benchmark's own stopwatch (the gateway's clocks live in sys/clock.rs).
    #[allow(clippy::disallowed_methods)]
    let started = std::time::Instant::now();
    let cpu0 = cpu_s();
    let input = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let sink: Box<dyn Write> = match std::env::var_os("BARE_OUT") {
        Some(p) => Box::new(std::fs::File::create(p)?),
        None => Box::new(std::io::sink()),
    };
    let mut out = BufWriter::with_capacity(1 << 20, sink);
    let mut devices: HashMap<String, Device, foldhash::fast::RandomState> = HashMap::default();
    let (mut readings, mut windows) = (0u64, 0u64);
    for line in input.lines() {
        let line = line?;
        let Ok(l) = serde_json::from_str::<Line<'_>>(&line) else {
            continue;
        };
        readings += 1;
        let id = l.topic.split('/').nth(2).unwrap_or("");
        let d = match devices.get_mut(id) {
            Some(d) => d,
            None => devices.entry(id.to_owned()).or_default(),
        };
        let (ts, v) = (l.payload.ts, l.payload.temp);
        let start = ts.div_euclid(WINDOW_MS) * WINDOW_MS;
        let wm = d.max_ts - BOUND_MS;
        if start + WINDOW_MS <= wm {
            continue; // late
        }
        match d.windows.iter_mut().find(|w| w.start == start) {
            Some(w) => {
                w.count += 1;
                w.sum += v;
                w.min = w.min.min(v);
                w.max = w.max.max(v);
            }
            None => d.windows.push(Agg {
                start,
                count: 1,
                sum: v,
                min: v,
                max: v,
            }),
        }
        if ts > d.max_ts {
            d.max_ts = ts;
            let wm = ts - BOUND_MS;
            let mut i = 0;
            while i < d.windows.len() {
                if d.windows[i].start + WINDOW_MS <= wm {
                    let w = d.windows.swap_remove(i);
                    emit(&mut out, id, &w)?;
                    windows += 1;
                } else {
                    i += 1;
                }
            }
        }
    }
    for (id, d) in &devices {
        for w in &d.windows {
            emit(&mut out, id, w)?;
            windows += 1;
        }
    }
    out.flush()?;
    println!(
        r#"{{"readings":{readings},"windows":{windows},"wall_s":{:.3},"cpu_s":{:.2}}}"#,
        started.elapsed().as_secs_f64(),
        cpu_s() - cpu0
    );
    Ok(())
}
