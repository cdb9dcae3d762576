//! Engine throughput alone (no MQTT, no store): 10 000 devices, JSON and CBOR payloads.
//! `cargo bench --bench engine`; criterion reports events/s as "elem/s".

use std::collections::BTreeMap;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tidemark::config;
use tidemark::engine::{Engine, Now};

const T0: i64 = 1_764_480_000_000;
const DEVICES: usize = 10_000;
const GROUPS: usize = 20;
const BATCH: usize = 100_000;

struct Msg {
    topic: String,
    payload: Vec<u8>,
    arrival: i64,
}

fn cbor(ts: i64, seq: u64, temp: f64, hum: f64) -> Vec<u8> {
    let v = serde_json::json!({"ts": ts, "seq": seq, "temp": temp, "hum": hum});
    let mut out = Vec::new();
    ciborium::ser::into_writer(&v, &mut out).unwrap();
    out
}

/// `rounds` readings per device, one per second per device, devices interleaved.
fn workload(as_cbor: bool, rounds: usize) -> Vec<Msg> {
    let mut v = Vec::with_capacity(DEVICES * rounds);
    for r in 0..rounds {
        for d in 0..DEVICES {
            let arrival = T0 + (r as i64) * 1000 + (d as i64 * 1000 / DEVICES as i64);
            let ts = arrival - 40;
            let temp = 20.0 + (d % 10) as f64 * 0.1;
            let payload = if as_cbor {
                cbor(ts, r as u64, temp, 40.0)
            } else {
                format!(r#"{{"ts":{ts},"seq":{r},"temp":{temp},"hum":40}}"#).into_bytes()
            };
            v.push(Msg {
                topic: format!("sensors/g{}/dev{d}/reading", d % GROUPS),
                payload,
                arrival,
            });
        }
    }
    v
}

fn engine() -> Engine {
    let cfg = config::load_str("[gateway]\nid = \"bench\"\n", &BTreeMap::new()).unwrap();
    let mut e = Engine::new(&cfg.engine);
    e.restart_idleness(Now::at(T0));
    e
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(10);
    for (name, as_cbor) in [("json", false), ("cbor", true)] {
        // Warm state: every device known with open windows; then measure steady-state batches.
        let msgs = workload(as_cbor, 2 + BATCH / DEVICES * 4);
        group.bench_function(BenchmarkId::new("on_message+tick", name), |b| {
            let mut e = engine();
            let mut out = Vec::new();
            let mut i = 0usize;
            let mut next_tick = T0 + 200;
            b.iter(|| {
                for _ in 0..BATCH {
                    if i == msgs.len() {
                        // Start over on fresh state so time keeps moving forward.
                        e = engine();
                        i = 0;
                        next_tick = T0 + 200;
                    }
                    let m = &msgs[i];
                    while next_tick <= m.arrival {
                        e.on_tick(Now::at(next_tick), &mut out);
                        next_tick += 200;
                    }
                    e.on_message(&m.topic, &m.payload, Now::at(m.arrival), &mut out);
                    out.clear();
                    i += 1;
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
