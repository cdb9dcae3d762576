//! The steady-state hot path allocates nothing: a known device, known metric
//! names, an open window, ticks that close nothing, no output.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use tidemark::config;
use tidemark::engine::{Engine, Now};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const T0: i64 = 1_764_480_000_000;

#[test]
fn steady_state_messages_and_ticks_allocate_nothing() {
    let cfg = config::load_str("[gateway]\nid = \"gw\"\n", &BTreeMap::new()).unwrap();
    let mut e = Engine::new(&cfg.engine);
    e.restart_idleness(Now::at(T0));
    let mut out = Vec::with_capacity(1024);
    let msgs: Vec<(String, Vec<u8>, i64)> = (0..6_000i64)
        .map(|i| {
            let d = i % 50;
            let t = T0 + 1_000 + i * 8;
            let json = i % 2 == 0;
            let payload = if json {
                format!(r#"{{"ts":{t},"seq":{i},"temp":21.5,"hum":40}}"#).into_bytes()
            } else {
                let mut b = Vec::new();
                ciborium::ser::into_writer(
                    &serde_json::json!({"ts": t, "seq": i, "temp": 21.5, "hum": 40}),
                    &mut b,
                )
                .unwrap();
                b
            };
            (format!("sensors/g{}/d{d}/reading", d % 3), payload, t + 30)
        })
        .collect();
    // Warm up: every device, group, metric name and window exists, and every
    // device's clock estimator has its 32 one-second buckets (grown as it is heard).
    let warm = 4_500;
    for (topic, payload, at) in &msgs[..warm] {
        e.on_message(topic, payload, Now::at(*at), &mut out);
    }
    out.clear();
    let before = ALLOCS.load(Ordering::Relaxed);
    for (i, (topic, payload, at)) in msgs[warm..].iter().enumerate() {
        e.on_message(topic, payload, Now::at(*at), &mut out);
        if i % 20 == 0 {
            e.on_tick(Now::at(*at), &mut out);
        }
    }
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert!(out.is_empty(), "no outputs expected: {out:?}");
    assert_eq!(e.counters().accepted, 6_000);
    assert_eq!(
        allocs, 0,
        "{allocs} allocations for 1500 steady-state messages"
    );
}
