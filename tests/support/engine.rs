//! Drives the engine through the real `Driver` with a manual clock, as the gateway would.
#![allow(dead_code)]

use std::collections::BTreeMap;

use tidemark::config;
use tidemark::driver::Driver;
use tidemark::engine::{Engine, Now};
use tidemark::output::{Alert, AlertType, Late, Output, Rejected, WindowResult};

/// 2025-11-30T05:20:00Z, a multiple of one minute.
pub const T0: i64 = 1_764_480_000_000;

pub struct Sim {
    /// The real driving loop of `run` and `replay` (ticks, batches) around the engine.
    pub driver: Driver,
    pub now: i64,
}

/// A driver (JSON outputs) around an engine configured by the whole config `text`.
pub fn driver(text: &str) -> Driver {
    let cfg = config::load_str(text, &BTreeMap::new()).expect("valid test config");
    Driver::json(&cfg)
}

impl Sim {
    /// An engine configured by `toml` (gateway id added), started at `start`.
    pub fn new(toml: &str, start: i64) -> Self {
        let mut driver = driver(&format!("[gateway]\nid = \"gw\"\n{toml}"));
        driver.start(Now::at(start));
        Self { driver, now: start }
    }

    pub fn engine(&self) -> &Engine {
        self.driver.engine()
    }

    pub fn engine_mut(&mut self) -> &mut Engine {
        self.driver.engine_mut()
    }

    /// Every output so far, in emission order.
    pub fn out(&self) -> &[Output] {
        self.driver.outputs()
    }

    /// Moves the clock to `t`, running every tick due on the way.
    pub fn advance(&mut self, t: i64) {
        self.driver.ticks_until(Now::at(t));
        self.now = self.now.max(t);
    }

    /// Delivers a message arriving at `at` (the ticks due before it first).
    pub fn send(&mut self, at: i64, topic: &str, payload: &str) {
        self.driver.message(Now::at(at), topic, payload.as_bytes());
        self.now = self.now.max(at);
    }

    /// A reading of `device` in `group` with device timestamp `ts`.
    pub fn reading(&mut self, at: i64, group: &str, device: &str, ts: i64, temp: f64) {
        let p = format!(r#"{{"ts": {ts}, "temp": {temp}}}"#);
        self.send(at, &format!("sensors/{group}/{device}/reading"), &p);
    }

    pub fn heartbeat(&mut self, at: i64, group: &str, device: &str, ts: i64) {
        self.send(
            at,
            &format!("sensors/{group}/{device}/heartbeat"),
            &format!(r#"{{"ts": {ts}}}"#),
        );
    }

    pub fn windows(&self) -> Vec<&WindowResult> {
        self.out()
            .iter()
            .filter_map(|o| match o {
                Output::Window(w) => Some(w),
                _ => None,
            })
            .collect()
    }

    pub fn windows_of(&self, device: &str) -> Vec<&WindowResult> {
        self.windows()
            .into_iter()
            .filter(|w| w.device == device)
            .collect()
    }

    pub fn late(&self) -> Vec<&Late> {
        self.out()
            .iter()
            .filter_map(|o| match o {
                Output::Late(l) => Some(l),
                _ => None,
            })
            .collect()
    }

    pub fn rejected(&self) -> Vec<&Rejected> {
        self.out()
            .iter()
            .filter_map(|o| match o {
                Output::Rejected(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    pub fn alerts(&self, kind: AlertType) -> Vec<&Alert> {
        self.out()
            .iter()
            .filter_map(|o| match o {
                Output::Alert(a) if a.kind == kind => Some(a),
                _ => None,
            })
            .collect()
    }

    pub fn statuses(&self, device: &str) -> Vec<bool> {
        self.out()
            .iter()
            .filter_map(|o| match o {
                Output::Status {
                    device: d, online, ..
                } if d == device => Some(*online),
                _ => None,
            })
            .collect()
    }
}

/// A deterministic synthetic capture (JSON lines): `devices` devices in three
/// groups sending one reading per second for `seconds`, with clock skew,
/// network jitter, disorder, a device that goes silent and returns with a
/// backlog, duplicates, late readings and hostile input.
pub fn synthetic_capture(devices: usize, seconds: i64) -> String {
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut recs: Vec<(i64, String)> = Vec::new();
    for d in 0..devices {
        let group = ["hvac", "cold", "power"][d % 3];
        let skew: i64 = match d % 5 {
            0 => 3 * 60_000,
            1 => -40_000,
            2 => 17 * 60_000,
            _ => (d as i64 * 37) % 2_000,
        };
        let silent = d % 7 == 3;
        for s in 0..seconds {
            let t = T0 + s * 1000 + (d as i64 * 13) % 1000;
            let mut arrival = t + 5 + (next() % 200) as i64;
            if next() % 50 == 0 {
                arrival += 1_500; // reordered within out_of_orderness
            }
            if next() % 400 == 0 {
                arrival += 90_000; // late beyond lateness
            }
            if silent && (120..300).contains(&s) {
                arrival = T0 + 300_000 + (s - 120) * 3; // buffered, then burst
            }
            let temp = 20.0 + (next() % 100) as f64 / 10.0;
            let payload = format!(
                r#"{{"arrival":{arrival},"topic":"sensors/{group}/dev{d}/reading","payload":{{"ts":{},"seq":{s},"temp":{temp}}}}}"#,
                t - skew
            );
            if next() % 300 == 0 {
                recs.push((
                    arrival + 40,
                    payload.replace(
                        &format!("\"arrival\":{arrival}"),
                        &format!("\"arrival\":{}", arrival + 40),
                    ),
                ));
            }
            recs.push((arrival, payload));
            if s % 20 == 0 {
                recs.push((
                    arrival + 1,
                    format!(r#"{{"arrival":{},"topic":"sensors/{group}/dev{d}/heartbeat","payload":{{"ts":{}}}}}"#, arrival + 1, t - skew),
                ));
            }
        }
        recs.push((
            T0 + 50_000 + d as i64,
            format!(
                r#"{{"arrival":{},"topic":"sensors/{group}/dev{d}","payload":{{"ts":1}}}}"#,
                T0 + 50_000 + d as i64
            ),
        ));
        recs.push((
            T0 + 60_000 + d as i64,
            format!(
                r#"{{"arrival":{},"topic":"sensors/{group}/dev{d}/reading","payload_b64":"//8="}}"#,
                T0 + 60_000 + d as i64
            ),
        ));
    }
    recs.sort_by_key(|r| r.0);
    let mut out = String::new();
    for (_, line) in recs {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// splitmix64: deterministic test data, so a failing case replays from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    #[allow(clippy::cast_precision_loss)]
    pub fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.unit() * (hi - lo) as f64) as i64
    }

    /// Uniform in [0, n).
    #[allow(clippy::cast_possible_truncation)]
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Counts of `device`'s first results, by window start after [`T0`].
pub fn counts_by_start(sim: &Sim, device: &str) -> Vec<(i64, u64)> {
    sim.windows_of(device)
        .iter()
        .filter(|w| w.revision == 0)
        .map(|w| (w.start - T0, w.count))
        .collect()
}
