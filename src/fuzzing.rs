//! Entry points of the coverage-guided fuzz targets (`fuzz/`, `scripts/fuzz.sh`)
//! and of their smoke test in the normal test run: each takes arbitrary bytes,
//! feeds them to a decoder that sees outside input, and panics only when an
//! invariant breaks (bad input itself is a value, never a panic).

use std::collections::BTreeMap;

use crate::codec::{Decoder, DeviceTs, PayloadConfig, PayloadFormat, TimestampUnit};
use crate::config;
use crate::engine::{Engine, Now};
use crate::model::{Millis, valid_id};
use crate::output::Output;
use crate::topic::{TopicPattern, validate_filter};

const UNITS: [TimestampUnit; 5] = [
    TimestampUnit::Auto,
    TimestampUnit::S,
    TimestampUnit::Ms,
    TimestampUnit::Us,
    TimestampUnit::Ns,
];

/// A fuzz target: arbitrary bytes in, a panic only on a broken invariant.
pub type Target = fn(&[u8]);

/// Every target by name, for `scripts/fuzz.sh` and the smoke test.
pub const TARGETS: [(&str, Target); 7] = [
    ("payload", payload),
    ("topic", topic),
    ("timestamp", timestamp),
    ("capture", capture),
    ("config", config),
    ("sparkplug", sparkplug),
    ("engine", engine),
];

/// A payload under every format and timestamp unit.
pub fn payload(data: &[u8]) {
    for format in [
        PayloadFormat::Json,
        PayloadFormat::Cbor,
        PayloadFormat::Auto,
    ] {
        for unit in UNITS {
            let d = Decoder::new(&PayloadConfig {
                format,
                timestamp_field: "ts".into(),
                timestamp_unit: unit,
                seq_field: Some("seq".into()),
            });
            if let Ok(v) = d.decode(data) {
                assert!(v.metrics.iter().all(|(_, x)| x.is_finite()), "{v:?}");
            }
        }
    }
}

/// A topic against the default pattern and Sparkplug's, and as a pattern or filter itself.
pub fn topic(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let pattern = TopicPattern::parse("sensors/{group}/{device}/{kind}").expect("default pattern");
    if let Ok(p) = pattern.parse_topic(&s) {
        // Ids go into upstream topics: nothing that could inject a level or a wildcard.
        assert!(valid_id(&p.group) && valid_id(&p.device), "{p:?}");
    }
    let _ = crate::sparkplug::parse_topic(&s);
    if let Ok(p) = TopicPattern::parse(&s) {
        let _ = p.parse_topic(&s);
    }
    let _ = validate_filter(&s);
}

/// RFC 3339 strings and numbers in every unit.
pub fn timestamp(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let _ = crate::codec::parse_rfc3339(&s);
    let mut b = [0u8; 16];
    let n = data.len().min(16);
    b[..n].copy_from_slice(&data[..n]);
    let int = i128::from_le_bytes(b);
    let float = f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]));
    for unit in UNITS {
        for ts in [
            crate::codec::int_to_ms(int, unit),
            crate::codec::float_to_ms(float, unit),
        ] {
            if let DeviceTs::Ms(t) = ts {
                assert!(t > Millis::MIN && t < Millis::MAX, "{t}");
            }
        }
    }
}

/// A capture file through `replay` (ticks a minute apart: a mutated arrival
/// years ahead is replayed tick by tick, as replay must).
pub fn capture(data: &[u8]) {
    let cfg = config::load_str(
        "[gateway]\nid = \"fuzz\"\ntick_interval_ms = 60000\n",
        &BTreeMap::new(),
    )
    .expect("config");
    let _ = crate::replay::run_memory(&cfg, data, std::io::sink(), 60_000);
}

/// A configuration file (and, after a NUL, `KEY=VALUE` environment lines).
pub fn config(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let (text, env) = s.split_once('\0').unwrap_or((&s, ""));
    let env: BTreeMap<String, String> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("TIDEMARK__{k}"), v.to_string()))
        .collect();
    if let Ok(c) = config::load_str(text, &env) {
        let _ = c.effective_toml();
    }
}

/// A Sparkplug payload as every message type of one edge node.
pub fn sparkplug(data: &[u8]) {
    let _ = crate::sparkplug::decode(data);
    let cfg = config::load_str(
        "[gateway]\nid = \"fuzz\"\n[sparkplug]\nenabled = true\n",
        &BTreeMap::new(),
    )
    .expect("config");
    let mut e = Engine::new(&cfg.engine);
    let mut out = Vec::new();
    let t0: Millis = 1_764_480_000_000;
    for (i, kind) in ["NBIRTH", "DBIRTH", "NDATA", "DDATA", "DDEATH", "NDEATH"]
        .iter()
        .enumerate()
    {
        let topic = if kind.starts_with('D') {
            format!("spBv1.0/g/{kind}/n/d")
        } else {
            format!("spBv1.0/g/{kind}/n")
        };
        let at = t0 + i as Millis * 1000;
        e.on_message(&topic, data, Now::at(at), &mut out);
        e.on_tick(Now::at(at + 500), &mut out);
    }
    let _ = e.take_changes();
}

/// What a store holds after the checkpoints so far (for the crash/restore twin).
#[derive(Default)]
struct Checkpoint {
    groups: BTreeMap<String, crate::engine::Group>,
    devices: BTreeMap<(String, String), crate::engine::Device>,
    names: Vec<crate::codec::MetricName>,
    counters: crate::engine::Counters,
    clock: Option<crate::time::gateway::GatewayClock>,
    sparkplug: BTreeMap<(String, String), crate::sparkplug::EdgeNode>,
}

impl Checkpoint {
    fn absorb(&mut self, c: crate::engine::Changes) {
        for g in c.groups {
            self.groups.insert(g.name.to_string(), g);
        }
        for d in c.devices.decode() {
            self.devices
                .insert((d.group.to_string(), d.id.to_string()), d);
        }
        for (i, n) in c.metric_names {
            assert_eq!(usize::from(i), self.names.len(), "metric names in order");
            self.names.push(n);
        }
        for n in c.sparkplug {
            self.sparkplug
                .insert((n.group.to_string(), n.node.to_string()), n);
        }
        self.counters = c.counters;
        self.clock = Some(c.clock);
    }

    fn restore(&self, cfg: &config::Config) -> Engine {
        let mut e = Engine::new(&cfg.engine);
        e.restore(
            self.groups.values().cloned().collect(),
            self.devices.values().cloned().collect(),
            self.names.clone(),
            self.counters.clone(),
        );
        e.restore_clock(self.clock.clone());
        e.restore_sparkplug(self.sparkplug.values().cloned().collect());
        e
    }
}

/// A stream of messages, ticks, gateway clock steps, restarts and crashes
/// built from the bytes: never a panic, every message accounted for,
/// watermarks never going back, and an engine restored from its checkpoints
/// after each crash behaving exactly as one that never crashed.
pub fn engine(data: &[u8]) {
    let cfg = config::load_str(
        "[gateway]\nid = \"fuzz\"\n[time]\ninvalid = \"reject\"\n\
         [groups.g1]\nwindow = { kind = \"session\", gap_ms = 5000 }\n\
         [groups.g2]\nwindow = { kind = \"hopping\", size_ms = 10000, slide_ms = 1000 }\n",
        &BTreeMap::new(),
    )
    .expect("config");
    let mut a = Engine::new(&cfg.engine);
    let mut b = Engine::new(&cfg.engine);
    let mut store = Checkpoint::default();
    let (mut out_a, mut out_b): (Vec<Output>, Vec<Output>) = (Vec::new(), Vec::new());
    let t0: Millis = 1_764_480_000_000;
    let (mut at, mut step) = (t0, 0);
    let mut wm: BTreeMap<String, Millis> = BTreeMap::new();
    let mut sent = 0u64;
    for op in data.chunks(6) {
        let [kind, dev, x, y, c, d] = <[u8; 6]>::try_from(op).unwrap_or([0; 6]);
        at += i64::from(u16::from_le_bytes([x, y]));
        let offset = i64::from(i16::from_le_bytes([c, d])) * 37;
        let now = Now {
            wall: at + step,
            mono: at - t0,
            synced: kind & 0x40 == 0,
        };
        match kind {
            // A crash: the twin comes back from its checkpoints; both restart
            // (a new process: idleness restarts, a new monotonic origin).
            0xff => {
                store.absorb(b.take_changes());
                b = store.restore(&cfg);
                for e in [&mut a, &mut b] {
                    e.new_clock_origin();
                    e.restart_idleness(now);
                }
            }
            // A checkpoint of the twin.
            0xfe => store.absorb(b.take_changes()),
            // The gateway's wall clock steps.
            0xfd => step += offset * 1000,
            k if k & 0x80 != 0 => {
                a.on_tick(now, &mut out_a);
                b.on_tick(now, &mut out_b);
            }
            _ => {
                let topic = format!(
                    "sensors/g{}/d{}/{}",
                    dev % 3,
                    dev / 3 % 5,
                    if kind & 1 == 0 {
                        "reading"
                    } else {
                        "heartbeat"
                    }
                );
                let payload = match kind >> 1 & 3 {
                    0 => format!(
                        r#"{{"ts": {}, "seq": {}, "temp": {c}}}"#,
                        at + offset,
                        d % 16
                    ),
                    1 => format!(r#"{{"ts": {}, "temp": {d}}}"#, at - offset * 1000),
                    2 => format!(r#"{{"ts": "{}", "temp": 1}}"#, at + offset),
                    _ => String::from_utf8_lossy(op).into_owned(),
                };
                a.on_message(&topic, payload.as_bytes(), now, &mut out_a);
                b.on_message(&topic, payload.as_bytes(), now, &mut out_b);
                sent += 1;
            }
        }
        assert_eq!(
            out_a, out_b,
            "restored engine diverged from the uncrashed one"
        );
        for g in a.groups() {
            if let Some(w) = g.wm {
                let prev = wm.insert(g.name.to_string(), w);
                assert!(
                    prev.is_none_or(|p| p <= w),
                    "watermark of {} went back",
                    g.name
                );
            }
        }
        out_a.clear();
        out_b.clear();
    }
    let c = a.counters();
    let rejected: u64 = c.rejected.iter().sum();
    assert_eq!(c.received, sent);
    // Readings still waiting for the gateway-clock verdict are counted once placed.
    let waiting = a.gateway_clock().waiting.len() as u64;
    assert_eq!(
        c.accepted + c.late + c.duplicates + rejected + waiting,
        sent,
        "{c:?}"
    );
    assert_eq!(c, b.counters());
}
