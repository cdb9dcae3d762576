//! tidemark as a Sparkplug B edge node (docs/reference.md#sink--the-upstream-broker), pure: the births, data
//! and deaths one window result or alert becomes, with the aliases, sequence
//! numbers and `bdSeq` of the session. The sink task decides when to publish.

use std::collections::BTreeMap;

use prost::Message as _;
use serde::Deserialize;

use super::{BD_SEQ, Metric, NAMESPACE, Payload, REBIRTH, datatype};

/// `[sink.sparkplug]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Sparkplug group id.
    pub group_id: String,
    /// Edge node id.
    pub edge_node_id: String,
    /// The Primary Host Application whose STATE gates publishing.
    pub primary_host_id: Option<String>,
    /// Least time between two answered rebirth requests (monotonic ms).
    pub rebirth_min_interval_ms: crate::model::Millis,
}

impl NodeConfig {
    /// `spBv1.0/{group}/{kind}/{node}[/{device}]`.
    pub fn topic(&self, kind: &str, device: Option<&str>) -> String {
        match device {
            Some(d) => format!(
                "{NAMESPACE}/{}/{kind}/{}/{d}",
                self.group_id, self.edge_node_id
            ),
            None => format!("{NAMESPACE}/{}/{kind}/{}", self.group_id, self.edge_node_id),
        }
    }

    /// The primary host's STATE topic.
    pub fn state_topic(&self) -> Option<String> {
        self.primary_host_id
            .as_ref()
            .map(|h| format!("{NAMESPACE}/STATE/{h}"))
    }
}

/// One message for the broker.
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    /// Topic.
    pub topic: String,
    /// Encoded payload.
    pub payload: Vec<u8>,
}

/// A window result as the outbox holds it (docs/reference.md#topics-and-payloads-upstream).
#[derive(Debug, Clone, Deserialize)]
pub struct WindowIn {
    group: String,
    device: String,
    start: u64,
    end: u64,
    revision: u64,
    count: u64,
    heartbeats: u64,
    metrics: BTreeMap<String, StatsIn>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct StatsIn {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    mean: f64,
    first: f64,
    last: f64,
}

#[derive(Deserialize)]
struct AlertIn {
    #[serde(rename = "type")]
    kind: String,
    group: String,
    device: String,
}

/// What an outbox entry is to the edge node.
#[derive(Debug, Clone)]
pub enum Entry {
    /// A window result: a DDATA.
    Window(Box<WindowIn>),
    /// A device went offline: a DDEATH of this Sparkplug device id.
    Offline(String),
    /// A device came back: a DBIRTH.
    Online(String),
    /// Nothing of Sparkplug's (late, rejected, status, other alerts).
    Other,
}

/// JSON or CBOR, whichever the entry is (a reload may change `sink.format`
/// while older entries wait in the outbox).
fn decode<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> Option<T> {
    if payload.first() == Some(&b'{') {
        serde_json::from_slice(payload).ok()
    } else {
        ciborium::de::from_reader(payload).ok()
    }
}

/// The Sparkplug device id of a tidemark device.
pub fn device_id(group: &str, device: &str) -> String {
    format!("{group}:{device}")
}

/// Reads an outbox entry (`P/windows/G/D`, `P/alerts/G/D`; ids hold no `/`).
pub fn classify(topic: &str, payload: &[u8]) -> Entry {
    let mut tail = topic.rsplitn(4, '/');
    let (Some(_), Some(_), Some(kind)) = (tail.next(), tail.next(), tail.next()) else {
        return Entry::Other;
    };
    match kind {
        "windows" => {
            decode::<WindowIn>(payload).map_or(Entry::Other, |w| Entry::Window(Box::new(w)))
        }
        "alerts" => match decode::<AlertIn>(payload) {
            Some(a) if a.kind == "offline" => Entry::Offline(device_id(&a.group, &a.device)),
            Some(a) if a.kind == "online" => Entry::Online(device_id(&a.group, &a.device)),
            _ => Entry::Other,
        },
        _ => Entry::Other,
    }
}

/// Per window field F: `F/{stat}`.
const STATS: [&str; 7] = ["mean", "min", "max", "sum", "count", "first", "last"];
/// Per device.
const WINDOW: [&str; 4] = [
    "window/count",
    "window/heartbeats",
    "window/start",
    "window/revision",
];

/// Counters of `P/metrics` carried as node metrics (NBIRTH, NDATA).
pub const COUNTERS: [&str; 11] = [
    "received",
    "accepted",
    "late",
    "duplicates",
    "readings_missing",
    "timestamps_invalid",
    "rejected",
    "windows_emitted",
    "alerts",
    "outbox_depth",
    "outbox_dropped",
];

#[derive(Debug)]
struct Device {
    /// Alias of `window/count`; the other window metrics follow it.
    window_alias: u64,
    /// Fields by name with the alias of their `F/mean`; the other stats follow.
    fields: BTreeMap<String, u64>,
    /// Born in this session and not dead since.
    alive: bool,
    /// Its last alert was `offline`: no DBIRTH at a rebirth.
    offline: bool,
}

/// The edge node's session: aliases (kept for the process: a host keeps its
/// map across births), `seq`, `bdSeq`.
#[derive(Debug)]
pub struct Node {
    cfg: NodeConfig,
    bd_seq: u64,
    seq: u64,
    next_alias: u64,
    devices: BTreeMap<String, Device>,
}

fn metric(name: Option<&str>, alias: Option<u64>, ts: u64, dt: u32) -> Metric {
    Metric {
        name: name.map(str::to_string),
        alias,
        timestamp: Some(ts),
        datatype: Some(dt),
        is_historical: None,
        is_transient: None,
        is_null: None,
        int_value: None,
        long_value: None,
        float_value: None,
        double_value: None,
        boolean_value: None,
        string_value: None,
        bytes_value: None,
    }
}

fn long(name: Option<&str>, alias: Option<u64>, ts: u64, dt: u32, v: u64) -> Metric {
    Metric {
        long_value: Some(v),
        ..metric(name, alias, ts, dt)
    }
}

fn double(alias: u64, ts: u64, v: f64) -> Metric {
    Metric {
        double_value: Some(v),
        ..metric(None, Some(alias), ts, datatype::DOUBLE)
    }
}

fn null(name: String, alias: u64, ts: u64, dt: u32) -> Metric {
    Metric {
        is_null: Some(true),
        ..metric(Some(&name), Some(alias), ts, dt)
    }
}

fn stat_type(stat: &str) -> u32 {
    if stat == "count" {
        datatype::UINT64
    } else {
        datatype::DOUBLE
    }
}

fn encode(timestamp: u64, metrics: Vec<Metric>, seq: Option<u64>) -> Vec<u8> {
    Payload {
        timestamp: Some(timestamp),
        metrics,
        seq,
        uuid: None,
        body: None,
    }
    .encode_to_vec()
}

impl Node {
    /// A session with this `bdSeq` (0..=255).
    pub fn new(cfg: NodeConfig, bd_seq: u64) -> Self {
        Self {
            cfg,
            bd_seq: bd_seq % 256,
            seq: 0,
            next_alias: 1,
            devices: BTreeMap::new(),
        }
    }

    /// The config.
    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    /// The session's `bdSeq`.
    pub fn bd_seq(&self) -> u64 {
        self.bd_seq
    }

    /// A new MQTT session: the next `bdSeq`; every device must be born again.
    pub fn new_session(&mut self, bd_seq: u64) {
        self.bd_seq = bd_seq % 256;
        for d in self.devices.values_mut() {
            d.alive = false;
        }
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq = (self.seq + 1) % 256;
        s
    }

    /// The NDEATH (the session's will, and published before a deliberate disconnect).
    pub fn death(&self, now: u64) -> Msg {
        Msg {
            topic: self.cfg.topic("NDEATH", None),
            payload: encode(
                now,
                vec![long(Some(BD_SEQ), None, now, datatype::INT64, self.bd_seq)],
                None,
            ),
        }
    }

    /// NBIRTH (seq 0) and a DBIRTH for every known device not offline.
    pub fn births(&mut self, now: u64, counters: &[u64; COUNTERS.len()]) -> Vec<Msg> {
        self.seq = 0;
        let mut m = vec![
            long(Some(BD_SEQ), None, now, datatype::INT64, self.bd_seq),
            Metric {
                boolean_value: Some(false),
                ..metric(Some(REBIRTH), None, now, datatype::BOOLEAN)
            },
        ];
        m.extend(
            COUNTERS
                .iter()
                .zip(counters)
                .map(|(n, v)| long(Some(n), None, now, datatype::UINT64, *v)),
        );
        let seq = self.next_seq();
        let mut out = vec![Msg {
            topic: self.cfg.topic("NBIRTH", None),
            payload: encode(now, m, Some(seq)),
        }];
        let ids: Vec<String> = self
            .devices
            .iter()
            .filter(|(_, d)| !d.offline)
            .map(|(k, _)| k.clone())
            .collect();
        for id in ids {
            out.push(self.dbirth(&id, now));
        }
        out
    }

    /// NDATA with the counters.
    pub fn counters(&mut self, now: u64, counters: &[u64; COUNTERS.len()]) -> Msg {
        let m = COUNTERS
            .iter()
            .zip(counters)
            .map(|(n, v)| long(Some(n), None, now, datatype::UINT64, *v))
            .collect();
        let seq = self.next_seq();
        Msg {
            topic: self.cfg.topic("NDATA", None),
            payload: encode(now, m, Some(seq)),
        }
    }

    fn dbirth(&mut self, id: &str, now: u64) -> Msg {
        let d = self.devices.get_mut(id).expect("known device");
        d.alive = true;
        let mut m: Vec<Metric> = WINDOW
            .iter()
            .zip(d.window_alias..)
            .map(|(n, a)| null((*n).to_string(), a, now, datatype::UINT64))
            .collect();
        for (field, base) in &d.fields {
            m.extend(
                STATS
                    .iter()
                    .zip(*base..)
                    .map(|(s, a)| null(format!("{field}/{s}"), a, now, stat_type(s))),
            );
        }
        let seq = self.next_seq();
        Msg {
            topic: self.cfg.topic("DBIRTH", Some(id)),
            payload: encode(now, m, Some(seq)),
        }
    }

    fn alias(&mut self, n: usize) -> u64 {
        let a = self.next_alias;
        self.next_alias += n as u64;
        a
    }

    /// The messages of one window result: a DBIRTH first when the device is not
    /// born in this session or the result has a field its birth did not declare.
    pub fn window(&mut self, w: &WindowIn, now: u64, historical: bool) -> Vec<Msg> {
        let id = device_id(&w.group, &w.device);
        let mut out = Vec::new();
        let mut born = self.devices.get(&id).is_some_and(|d| d.alive);
        if !self.devices.contains_key(&id) {
            let window_alias = self.alias(WINDOW.len());
            self.devices.insert(
                id.clone(),
                Device {
                    window_alias,
                    fields: BTreeMap::new(),
                    alive: false,
                    offline: false,
                },
            );
        }
        for f in w.metrics.keys() {
            if !self.devices[&id].fields.contains_key(f) {
                let base = self.alias(STATS.len());
                if let Some(d) = self.devices.get_mut(&id) {
                    d.fields.insert(f.clone(), base);
                }
                born = false;
            }
        }
        if let Some(d) = self.devices.get_mut(&id) {
            d.offline = false;
        }
        if !born {
            out.push(self.dbirth(&id, now));
        }
        let d = &self.devices[&id];
        let ts = w.end;
        let mut m: Vec<Metric> = [w.count, w.heartbeats, w.start, w.revision]
            .iter()
            .zip(d.window_alias..)
            .map(|(v, a)| long(None, Some(a), ts, datatype::UINT64, *v))
            .collect();
        for (field, s) in &w.metrics {
            let base = d.fields[field];
            let values = [s.mean, s.min, s.max, s.sum];
            m.extend(values.iter().zip(base..).map(|(v, a)| double(a, ts, *v)));
            m.push(long(None, Some(base + 4), ts, datatype::UINT64, s.count));
            m.push(double(base + 5, ts, s.first));
            m.push(double(base + 6, ts, s.last));
        }
        if historical {
            for x in &mut m {
                x.is_historical = Some(true);
            }
        }
        let seq = self.next_seq();
        out.push(Msg {
            topic: self.cfg.topic("DDATA", Some(&id)),
            payload: encode(now, m, Some(seq)),
        });
        out
    }

    /// A device's `offline` alert: a DDEATH if it is born.
    pub fn offline(&mut self, id: &str, now: u64) -> Option<Msg> {
        let d = self.devices.get_mut(id)?;
        d.offline = true;
        if !d.alive {
            return None;
        }
        d.alive = false;
        let seq = self.next_seq();
        Some(Msg {
            topic: self.cfg.topic("DDEATH", Some(id)),
            payload: encode(now, Vec::new(), Some(seq)),
        })
    }

    /// A device's `online` alert: a DBIRTH if its metrics are known.
    pub fn online(&mut self, id: &str, now: u64) -> Option<Msg> {
        let d = self.devices.get_mut(id)?;
        d.offline = false;
        if d.alive {
            return None;
        }
        Some(self.dbirth(id, now))
    }
}

/// An NCMD asking for `Node Control/Rebirth` (by name: tidemark gives node
/// metrics no alias).
pub fn is_rebirth(payload: &[u8]) -> bool {
    Payload::decode(payload).is_ok_and(|p| {
        p.metrics
            .iter()
            .any(|m| m.name.as_deref() == Some(REBIRTH) && m.boolean_value == Some(true))
    })
}

/// A Primary Host STATE payload (`{"online":bool,"timestamp":ms}`): online, and its timestamp.
pub fn host_state(payload: &[u8]) -> Option<(bool, u64)> {
    #[derive(Deserialize)]
    struct State {
        online: bool,
        #[serde(default)]
        timestamp: u64,
    }
    serde_json::from_slice::<State>(payload)
        .ok()
        .map(|s| (s.online, s.timestamp))
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
