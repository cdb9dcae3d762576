//! A deterministic synthetic fleet for `tidemark simulate` (load, tests, demo):
//! which device sends what, with which clock, when. Pure: time comes in as a
//! value, randomness from the seed, so the same seed makes the same fleet.

use serde::Serialize;

use crate::model::Millis;

mod sparkplug;

/// Payload encoding of the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SimFormat {
    /// JSON objects.
    Json,
    /// CBOR maps.
    Cbor,
    /// Every other device CBOR.
    Mixed,
}

/// The fleet and its misbehaviour (also `tidemark simulate`'s arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct SimConfig {
    /// Seed of every random choice: the same seed makes the same fleet.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Devices in all.
    #[arg(long, default_value_t = 20)]
    pub devices: u32,
    /// Group names (comma-separated); devices are spread over them.
    #[arg(long, value_delimiter = ',', default_value = "hall,lab")]
    pub groups: Vec<String>,
    /// Topic prefix: `{prefix}/{group}/{device}/reading`.
    #[arg(long, default_value = "sensors")]
    pub prefix: String,
    /// Payload encoding.
    #[arg(long, value_enum, default_value = "json")]
    pub format: SimFormat,
    /// Device clock offsets are uniform in +-this (ms).
    #[arg(long, default_value_t = 0)]
    pub skew_ms: Millis,
    /// The first device's clock is this far ahead (ms; e.g. 1020000 = 17 min).
    #[arg(long)]
    pub fast_clock_ms: Option<Millis>,
    /// A fixed clock offset for one device, `INDEX:MS` (repeatable; e.g. `2:7200000`).
    #[arg(long = "clock-offset", value_parser = clock_offset)]
    pub clock_offsets: Vec<(u32, Millis)>,
    /// Network delay: readings are stamped up to this long before they are sent (ms).
    #[arg(long, default_value_t = 50)]
    pub delay_ms: Millis,
    /// Fraction of readings stamped up to --disorder-ms earlier.
    #[arg(long, default_value_t = 0.0)]
    pub out_of_order: f64,
    /// How far out of order (ms).
    #[arg(long, default_value_t = 1000)]
    pub disorder_ms: Millis,
    /// Fraction of readings stamped --late-by-ms in the past.
    #[arg(long, default_value_t = 0.0)]
    pub late: f64,
    /// How late (ms).
    #[arg(long, default_value_t = 600_000)]
    pub late_by_ms: Millis,
    /// Fraction of readings sent twice (a QoS 1 redelivery: same seq, same bytes).
    #[arg(long, default_value_t = 0.0)]
    pub duplicates: f64,
    /// Fraction of messages that are malformed (bad payload or topic).
    #[arg(long, default_value_t = 0.0)]
    pub malformed: f64,
    /// A heartbeat after every N readings of a device (0: none).
    #[arg(long, default_value_t = 0)]
    pub heartbeat_every: u32,
    /// The last this many devices fall silent at --silence-at-s for --silence-s.
    #[arg(long, default_value_t = 0)]
    pub silent: u32,
    /// Every device of this group stops for good at --silence-at-s.
    #[arg(long)]
    pub silent_group: Option<String>,
    /// When the silent devices stop (s since the start).
    #[arg(long = "silence-at-s", default_value = "10", value_parser = seconds)]
    pub silence_at_ms: Millis,
    /// How long they stay silent (s).
    #[arg(long = "silence-s", default_value = "60", value_parser = seconds)]
    pub silence_ms: Millis,
    /// The second device's clock steps by --step-ms at this time (s since the start).
    #[arg(long = "step-at-s", value_parser = seconds)]
    pub step_at_ms: Option<Millis>,
    /// Size of the clock step (ms).
    #[arg(long, default_value_t = 120_000)]
    pub step_ms: Millis,
    /// The fleet's uplink goes down at this time (s since the start) for --outage-s;
    /// readings are kept and sent in one burst when it returns.
    #[arg(long = "outage-at-s", value_parser = seconds)]
    pub outage_at_ms: Option<Millis>,
    /// Length of the outage (s).
    #[arg(long = "outage-s", default_value = "30", value_parser = seconds)]
    pub outage_ms: Millis,
    /// Publish as Sparkplug B edge nodes (4 devices each, sharing a clock; births,
    /// metrics by alias with their own timestamps, a DDEATH when a device falls silent).
    #[arg(long)]
    pub sparkplug: bool,
}

/// `INDEX:MS`.
fn clock_offset(s: &str) -> Result<(u32, Millis), String> {
    let (i, ms) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: want INDEX:MS"))?;
    let i = i.parse().map_err(|e| format!("{s:?}: device index: {e}"))?;
    let ms = ms.parse().map_err(|e| format!("{s:?}: offset ms: {e}"))?;
    Ok((i, ms))
}

/// Seconds (fractions allowed) as ms.
fn seconds(s: &str) -> Result<Millis, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !v.is_finite() || !(0.0..=1e9).contains(&v) {
        return Err(format!("{s:?}: seconds from 0 to 1e9"));
    }
    Ok((v * 1000.0).round() as Millis)
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            devices: 20,
            groups: vec!["hall".into(), "lab".into()],
            prefix: "sensors".into(),
            format: SimFormat::Json,
            skew_ms: 0,
            fast_clock_ms: None,
            clock_offsets: Vec::new(),
            delay_ms: 50,
            out_of_order: 0.0,
            disorder_ms: 1000,
            late: 0.0,
            late_by_ms: 600_000,
            duplicates: 0.0,
            malformed: 0.0,
            heartbeat_every: 0,
            silent: 0,
            silent_group: None,
            silence_at_ms: 0,
            silence_ms: 0,
            step_at_ms: None,
            step_ms: 0,
            outage_at_ms: None,
            outage_ms: 0,
            sparkplug: false,
        }
    }
}

/// What a message is, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A reading in order (up to the network delay).
    Reading,
    /// A reading stamped earlier than its neighbours.
    OutOfOrder,
    /// A reading stamped `late_by_ms` in the past.
    Late,
    /// A heartbeat.
    Heartbeat,
    /// A second copy of the previous reading.
    Duplicate,
    /// Garbage payload or a topic that does not match the pattern.
    Malformed,
    /// A Sparkplug NBIRTH or DBIRTH.
    Birth,
    /// A Sparkplug DDEATH.
    Death,
}

/// One message to publish.
#[derive(Debug, Clone)]
pub struct Msg {
    /// Index of the device (connections are chosen by it, keeping per-device order).
    pub device: u32,
    /// Topic.
    pub topic: String,
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// What it is.
    pub kind: Kind,
    /// Held back by the outage, sent in its burst.
    pub backlog: bool,
}

/// Counts of what was generated, by kind.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Tally {
    /// Readings in order.
    pub readings: u64,
    /// Readings out of order.
    pub out_of_order: u64,
    /// Readings stamped late.
    pub late: u64,
    /// Heartbeats.
    pub heartbeats: u64,
    /// Redelivered copies.
    pub duplicates: u64,
    /// Malformed messages.
    pub malformed: u64,
    /// Readings held back by the outage and sent in its burst.
    pub backlog: u64,
    /// Sparkplug births.
    pub births: u64,
    /// Sparkplug device deaths.
    pub deaths: u64,
}

impl Tally {
    /// Every message.
    pub fn total(&self) -> u64 {
        self.readings
            + self.out_of_order
            + self.late
            + self.heartbeats
            + self.duplicates
            + self.malformed
            + self.births
            + self.deaths
    }

    /// Counts a message of `kind` (`backlog`: sent in the outage's burst).
    pub fn record(&mut self, kind: Kind, backlog: bool) {
        self.add(kind);
        self.backlog += u64::from(backlog);
    }

    fn add(&mut self, k: Kind) {
        match k {
            Kind::Reading => self.readings += 1,
            Kind::OutOfOrder => self.out_of_order += 1,
            Kind::Late => self.late += 1,
            Kind::Heartbeat => self.heartbeats += 1,
            Kind::Duplicate => self.duplicates += 1,
            Kind::Malformed => self.malformed += 1,
            Kind::Birth => self.births += 1,
            Kind::Death => self.deaths += 1,
        }
    }
}

/// splitmix64: small, seedable, good enough for test traffic.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n] (n >= 0).
    fn upto(&mut self, n: Millis) -> Millis {
        let n = u64::try_from(n.max(0)).unwrap_or(0);
        Millis::try_from(self.next() % (n + 1)).unwrap_or(0)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
}

#[derive(Debug, Clone)]
struct Device {
    group: usize,
    name: String,
    offset: Millis,
    seq: u64,
    since_heartbeat: u32,
    cbor: bool,
    last: Option<Vec<u8>>,
    /// Sparkplug: DBIRTH sent (and no DDEATH since).
    born: bool,
}

/// The fleet: call [`Fleet::next`] for each message to send.
#[derive(Debug)]
pub struct Fleet {
    cfg: SimConfig,
    rng: Rng,
    devices: Vec<Device>,
    cursor: u32,
    /// Readings kept during the outage, in order.
    held: std::collections::VecDeque<Msg>,
    /// Messages waiting to be sent right after the last one (a duplicate, births).
    pending: std::collections::VecDeque<Msg>,
    /// Sparkplug edge nodes: (next seq, NBIRTH sent).
    nodes: Vec<(u8, bool)>,
    tally: Tally,
}

impl Fleet {
    /// A fleet whose clocks and names come from `cfg.seed`.
    pub fn new(cfg: SimConfig) -> Self {
        let mut rng = Rng(cfg.seed ^ 0x7469_6465_6D61_726B);
        let groups = cfg.groups.len().max(1);
        let devices = (0..cfg.devices.max(1))
            .map(|i| {
                let random = rng.upto(2 * cfg.skew_ms) - cfg.skew_ms;
                let fixed = cfg
                    .clock_offsets
                    .iter()
                    .find(|(d, _)| *d == i)
                    .map(|(_, o)| *o);
                let offset = match (i, cfg.fast_clock_ms, fixed) {
                    (_, _, Some(o)) => o,
                    (0, Some(fast), None) => fast,
                    _ => random,
                };
                Device {
                    group: i as usize % groups,
                    name: format!("d{i:04}"),
                    offset,
                    seq: 0,
                    since_heartbeat: 0,
                    cbor: match cfg.format {
                        SimFormat::Json => false,
                        SimFormat::Cbor => true,
                        SimFormat::Mixed => i % 2 == 1,
                    },
                    last: None,
                    born: false,
                }
            })
            .collect();
        Self {
            cfg,
            rng,
            devices,
            cursor: 0,
            held: std::collections::VecDeque::new(),
            pending: std::collections::VecDeque::new(),
            nodes: Vec::new(),
            tally: Tally::default(),
        }
    }

    /// What has been generated so far.
    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// Readings held back by an outage that has not ended yet.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    fn group_name(&self, g: usize) -> String {
        self.cfg
            .groups
            .get(g)
            .cloned()
            .unwrap_or_else(|| format!("g{g}"))
    }

    fn silent(&self, device: u32, elapsed: Millis) -> bool {
        let d = &self.devices[device as usize];
        if elapsed >= self.cfg.silence_at_ms
            && self
                .cfg
                .silent_group
                .as_ref()
                .is_some_and(|g| self.cfg.groups.get(d.group) == Some(g))
        {
            return true;
        }
        let n = self.devices.len() as u32;
        device >= n.saturating_sub(self.cfg.silent)
            && elapsed >= self.cfg.silence_at_ms
            && elapsed < self.cfg.silence_at_ms.saturating_add(self.cfg.silence_ms)
    }

    fn in_outage(&self, elapsed: Millis) -> bool {
        self.cfg
            .outage_at_ms
            .is_some_and(|at| elapsed >= at && elapsed < at.saturating_add(self.cfg.outage_ms))
    }

    /// Once the outage is over: the next reading it held back (send these first,
    /// as fast as possible — the backlog burst).
    pub fn release(&mut self, elapsed: Millis) -> Option<Msg> {
        if self.in_outage(elapsed) {
            return None;
        }
        let mut m = self.held.pop_front()?;
        m.backlog = true;
        self.tally.record(m.kind, true);
        Some(m)
    }

    /// The message of the next slot of the schedule at true time `now`, `elapsed`
    /// ms after the start; `None` when the device whose turn it is is silent or
    /// its reading is held back by the outage.
    pub fn next(&mut self, now: Millis, elapsed: Millis) -> Option<Msg> {
        if let Some(m) = self.pending.pop_front() {
            self.tally.add(m.kind);
            return Some(m);
        }
        let n = self.devices.len() as u32;
        let i = self.cursor % n;
        self.cursor = self.cursor.wrapping_add(1);
        if self.silent(i, elapsed) {
            return self.sparkplug_death(i, elapsed);
        }
        if i == 1 && self.cfg.step_at_ms.is_some_and(|at| elapsed >= at) {
            // The step happens once; then it is this device's clock.
            self.cfg.step_at_ms = None;
            self.devices[1].offset += self.cfg.step_ms;
        }
        let m = self.make(i, now);
        if self.in_outage(elapsed) && m.kind != Kind::Malformed {
            self.held.push_back(m);
            if self.cfg.sparkplug {
                // Births before their data, all in the burst.
                self.held.extend(self.pending.drain(..));
            }
            return None;
        }
        self.tally.add(m.kind);
        Some(m)
    }

    /// A reading's kind and timestamp: in order, out of order or late.
    fn stamp(&mut self, device_now: Millis) -> (Kind, Millis) {
        if self.rng.chance(self.cfg.late) {
            (Kind::Late, device_now - self.cfg.late_by_ms)
        } else if self.rng.chance(self.cfg.out_of_order) {
            let back = 1 + self.rng.upto(self.cfg.disorder_ms.max(1) - 1);
            (Kind::OutOfOrder, device_now - back)
        } else {
            (Kind::Reading, device_now)
        }
    }

    /// Device `i`'s next reading number and temperature.
    fn next_temp(&mut self, i: u32) -> f64 {
        let d = &mut self.devices[i as usize];
        d.seq += 1;
        20.0 + f64::from(i % 7) + (d.seq % 60) as f64 / 10.0
    }

    fn make(&mut self, i: u32, now: Millis) -> Msg {
        if self.cfg.sparkplug {
            return self.make_sparkplug(i, now);
        }
        let group = self.group_name(self.devices[i as usize].group);
        let prefix = self.cfg.prefix.clone();
        if self.rng.chance(self.cfg.malformed) {
            let d = &self.devices[i as usize];
            let (topic, payload) = if self.rng.unit() < 0.5 {
                (
                    format!("{prefix}/{group}/{}/reading", d.name),
                    b"{\"ts\": 17, \"temp\": [unterminated".to_vec(),
                )
            } else {
                (
                    format!("{prefix}/{group}/{}/bogus", d.name),
                    b"{\"ts\": 1}".to_vec(),
                )
            };
            return Msg {
                device: i,
                topic,
                payload,
                kind: Kind::Malformed,
                backlog: false,
            };
        }
        let every = self.cfg.heartbeat_every;
        let delay = self.rng.upto(self.cfg.delay_ms);
        let d = &mut self.devices[i as usize];
        let device_now = now + d.offset - delay;
        if every > 0 && d.since_heartbeat >= every {
            d.since_heartbeat = 0;
            let payload = encode(d.cbor, device_now, None, None);
            return Msg {
                device: i,
                topic: format!("{prefix}/{group}/{}/heartbeat", d.name),
                payload,
                kind: Kind::Heartbeat,
                backlog: false,
            };
        }
        d.since_heartbeat += 1;
        let (kind, ts) = self.stamp(device_now);
        let temp = self.next_temp(i);
        let d = &mut self.devices[i as usize];
        let payload = encode(d.cbor, ts, Some(d.seq), Some(temp));
        d.last = Some(payload.clone());
        let topic = format!("{prefix}/{group}/{}/reading", d.name);
        if self.rng.chance(self.cfg.duplicates) {
            self.pending.push_back(Msg {
                device: i,
                topic: topic.clone(),
                payload: payload.clone(),
                kind: Kind::Duplicate,
                backlog: false,
            });
        }
        Msg {
            device: i,
            topic,
            payload,
            kind,
            backlog: false,
        }
    }
}

#[derive(Serialize)]
struct Payload {
    ts: Millis,
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temp: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hum: Option<f64>,
}

fn encode(cbor: bool, ts: Millis, seq: Option<u64>, temp: Option<f64>) -> Vec<u8> {
    let p = Payload {
        ts,
        seq,
        temp,
        hum: temp.map(|t| 80.0 - t),
    };
    if cbor {
        let mut b = Vec::with_capacity(48);
        let _ = ciborium::ser::into_writer(&p, &mut b);
        b
    } else {
        serde_json::to_vec(&p).unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
