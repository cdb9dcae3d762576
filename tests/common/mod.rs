//! Drives the engine with a manual clock, as the gateway would.
#![allow(dead_code)]

use std::collections::BTreeMap;

use tidemark::config;
use tidemark::engine::{Engine, Now};
use tidemark::output::{Alert, AlertType, Late, Output, Rejected, WindowResult};

/// 2025-11-30T05:20:00Z, a multiple of one minute.
pub const T0: i64 = 1_764_480_000_000;

pub struct Sim {
    pub engine: Engine,
    pub now: i64,
    tick: i64,
    next_tick: i64,
    pub out: Vec<Output>,
}

impl Sim {
    /// An engine configured by `toml` (gateway id added), started at `start`.
    pub fn new(toml: &str, start: i64) -> Self {
        let text = format!("[gateway]\nid = \"gw\"\n{toml}");
        let cfg = config::load_str(&text, &BTreeMap::new()).expect("valid test config");
        let tick = i64::try_from(cfg.tick_interval_ms).unwrap();
        let mut engine = Engine::new(&cfg);
        engine.restart_idleness(Now::at(start));
        Self {
            engine,
            now: start,
            tick,
            next_tick: start + tick,
            out: Vec::new(),
        }
    }

    /// Moves the clock to `t`, running every tick due on the way.
    pub fn advance(&mut self, t: i64) {
        while self.next_tick <= t {
            self.engine.on_tick(Now::at(self.next_tick), &mut self.out);
            self.next_tick += self.tick;
        }
        self.now = self.now.max(t);
    }

    /// Delivers a message arriving at `at`.
    pub fn send(&mut self, at: i64, topic: &str, payload: &str) {
        self.advance(at);
        self.engine
            .on_message(topic, payload.as_bytes(), Now::at(at), &mut self.out);
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
        self.out
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
        self.out
            .iter()
            .filter_map(|o| match o {
                Output::Late(l) => Some(l),
                _ => None,
            })
            .collect()
    }

    pub fn rejected(&self) -> Vec<&Rejected> {
        self.out
            .iter()
            .filter_map(|o| match o {
                Output::Rejected(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    pub fn alerts(&self, kind: AlertType) -> Vec<&Alert> {
        self.out
            .iter()
            .filter_map(|o| match o {
                Output::Alert(a) if a.kind == kind => Some(a),
                _ => None,
            })
            .collect()
    }

    pub fn statuses(&self, device: &str) -> Vec<bool> {
        self.out
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
