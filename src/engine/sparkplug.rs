//! Sparkplug B ingest (docs/reference.md#sparkplug--sparkplug-b-30-ingest): births define metrics, data becomes readings
//! through the same path as any reading, deaths take devices offline at once.

use std::collections::HashMap;

use super::{Engine, Now, Output};
use crate::codec::{Decoded, DeviceTs, MetricName};
use crate::model::{Id, Kind, Millis, Reason, valid_id};
use crate::output::{AlertType, Emit};
use crate::sparkplug::SparkplugConfig;
use crate::sparkplug::{self as sp, EdgeNode, MsgType, Seq, Value};
use crate::topic::TopicParts;

/// Sparkplug state of the engine: edge nodes and commands for the source broker.
pub(super) struct State {
    /// Sparkplug topics are decoded as such.
    pub enabled: bool,
    group_ids: Vec<String>,
    rebirth: bool,
    max_nodes: usize,
    pub(super) nodes: Vec<(EdgeNode, bool)>,
    index: HashMap<(Id, Id), usize>,
    commands: Vec<(String, Vec<u8>)>,
}

impl State {
    pub fn new(cfg: &SparkplugConfig) -> Self {
        Self {
            enabled: cfg.enabled,
            group_ids: cfg.group_ids.clone(),
            rebirth: cfg.rebirth,
            max_nodes: cfg.max_edge_nodes,
            nodes: Vec::new(),
            index: HashMap::new(),
            commands: Vec::new(),
        }
    }

    /// A reload's settings; the edge nodes' state is kept.
    pub fn configure(&mut self, cfg: &SparkplugConfig) {
        self.enabled = cfg.enabled;
        self.group_ids.clone_from(&cfg.group_ids);
        self.rebirth = cfg.rebirth;
        self.max_nodes = cfg.max_edge_nodes;
    }

    /// Why a message of this edge node (and `device`, for a DBIRTH) cannot be
    /// held: the gateway's or the node's limit (docs/reference.md, `[sparkplug]`).
    fn over_limit(&self, group: &Id, node: &Id, dbirth: Option<&str>) -> Option<String> {
        let Some(&i) = self.index.get(&(group.clone(), node.clone())) else {
            return (self.nodes.len() >= self.max_nodes).then(|| {
                format!(
                    "more than sparkplug.max_edge_nodes = {} Sparkplug edge nodes",
                    self.max_nodes
                )
            });
        };
        let n = &self.nodes[i].0;
        let sub = dbirth?;
        let devices = n.aliases.keys().filter(|d| !d.is_empty()).count();
        (devices >= sp::MAX_NODE_DEVICES && !n.aliases.contains_key(sub)).then(|| {
            format!(
                "more than {} devices on one Sparkplug edge node",
                sp::MAX_NODE_DEVICES
            )
        })
    }

    /// Whether an edge node changed since the last store changes.
    pub fn changed(&self) -> bool {
        self.nodes.iter().any(|n| n.1)
    }

    fn node(&mut self, group: &Id, node: &Id) -> usize {
        let key = (group.clone(), node.clone());
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.nodes.len();
        self.nodes.push((
            EdgeNode {
                group: group.clone(),
                node: node.clone(),
                ..EdgeNode::default()
            },
            true,
        ));
        self.index.insert(key, i);
        i
    }
}

/// The numeric metrics of one payload sharing a timestamp.
type Reading = (Option<u64>, Vec<(MetricName, f64)>);

fn id(s: &str) -> Option<Id> {
    valid_id(s).then(|| Id::try_from(s).ok()).flatten()
}

impl Engine {
    /// Edge nodes with their births and sequence numbers (persisted state).
    pub fn restore_sparkplug(&mut self, nodes: Vec<EdgeNode>) {
        for n in nodes {
            let i = self.sparkplug.node(&n.group, &n.node);
            self.sparkplug.nodes[i] = (n, false);
        }
    }

    /// Messages for the source broker (rebirth requests), oldest first.
    pub fn take_commands(&mut self) -> Vec<(String, Vec<u8>)> {
        std::mem::take(&mut self.sparkplug.commands)
    }

    /// Edge nodes changed since the last call (for the store).
    pub(super) fn take_sparkplug_changes(&mut self) -> Vec<EdgeNode> {
        self.sparkplug
            .nodes
            .iter_mut()
            .filter(|(_, dirty)| *dirty)
            .map(|(n, dirty)| {
                *dirty = false;
                n.clone()
            })
            .collect()
    }

    /// An NDEATH of the current birth (its bdSeq matches): every device of the node dies.
    fn node_death(
        &mut self,
        ni: usize,
        group: &Id,
        node: &Id,
        bd_seq: Option<u64>,
        now: Now,
        out: &mut dyn Emit,
    ) {
        let n = &self.sparkplug.nodes[ni].0;
        let current = match (n.bd_seq, bd_seq) {
            (Some(have), Some(got)) => have == got,
            _ => true,
        };
        if current {
            let prefix = format!("{node}.");
            let members: Vec<usize> = self
                .group_devices_idx(group)
                .into_iter()
                .filter(|&di| {
                    let d = &self.devices[di].state.id;
                    *d == *node || d.starts_with(&prefix)
                })
                .collect();
            for di in members {
                self.die(di, now, out);
            }
        }
    }

    /// The node's message sequence: false for a duplicate (dropped, counted); a
    /// gap is counted as missing readings and asks the node for a rebirth.
    fn sparkplug_seq(
        &mut self,
        ni: usize,
        group: &Id,
        node: &Id,
        seq: Option<u64>,
        now: Now,
    ) -> bool {
        match self.sparkplug.nodes[ni].0.observe_seq(seq) {
            Seq::Next => {}
            Seq::Again => {
                self.counters.duplicates += 1;
                if let Some(di) = self.find_device(group, node) {
                    self.devices[di].state.duplicates += 1;
                    self.mark_device(di);
                }
                return false;
            }
            Seq::Gap(n) => {
                let di = self.device_slot(group, node);
                self.devices[di].state.missing += u64::from(n);
                self.counters.readings_missing += u64::from(n);
                self.mark_device(di);
                self.request_rebirth(ni, group, node, now);
            }
        }
        true
    }

    pub(super) fn sparkplug_message(
        &mut self,
        topic: &str,
        payload: &[u8],
        now: Now,
        raw_wall: Millis,
        decoded: &mut Decoded,
        out: &mut dyn Emit,
    ) {
        let t = match sp::parse_topic(topic) {
            Ok(t) => t,
            Err(e) => return self.reject(out, Reason::BadTopic, topic, None, now, e.into()),
        };
        let device_name = match t.device {
            Some(d) => format!("{}.{d}", t.node),
            None => t.node.to_string(),
        };
        let (Some(group), Some(node), Some(device)) = (id(t.group), id(t.node), id(&device_name))
        else {
            let detail = "Sparkplug group, edge node or `{edge_node}.{device}` outside 1..64 chars of [A-Za-z0-9_.:-]";
            return self.reject(out, Reason::BadTopic, topic, None, now, detail.into());
        };
        let ids = Some((&group, &device));
        if !self.sparkplug.group_ids.is_empty()
            && !self.sparkplug.group_ids.iter().any(|g| g == t.group)
        {
            let detail = "Sparkplug group not in sparkplug.group_ids".to_string();
            return self.reject(out, Reason::BadTopic, topic, ids, now, detail);
        }
        if payload.len() > crate::codec::MAX_PAYLOAD {
            // No size in the detail: the journal keeps only the first 64 KiB + 1.
            let detail = "Sparkplug payload exceeds 64 KiB".to_owned();
            return self.reject(out, Reason::DecodeError, topic, ids, now, detail);
        }
        let p = match sp::decode(payload) {
            Ok(p) => p,
            Err(e) => return self.reject(out, Reason::DecodeError, topic, ids, now, e),
        };
        let birth = matches!(t.kind, MsgType::NBirth | MsgType::DBirth);
        if birth && p.metrics.len() > sp::MAX_BIRTH_METRICS {
            let detail = format!(
                "Sparkplug BIRTH declares {} metrics, over the limit of {}",
                p.metrics.len(),
                sp::MAX_BIRTH_METRICS
            );
            return self.reject(out, Reason::DecodeError, topic, ids, now, detail);
        }
        let dbirth = (t.kind == MsgType::DBirth).then(|| t.device.unwrap_or(""));
        if let Some(detail) = self.sparkplug.over_limit(&group, &node, dbirth) {
            return self.reject(out, Reason::DecodeError, topic, ids, now, detail);
        }
        if let Some(detail) = self.over_device_limit(&group, &device) {
            return self.reject(out, Reason::BadTopic, topic, ids, now, detail);
        }
        let ni = self.sparkplug.node(&group, &node);
        self.sparkplug.nodes[ni].1 = true;
        let sub = t.device.unwrap_or("");
        match t.kind {
            MsgType::NBirth => {
                let n = &mut self.sparkplug.nodes[ni].0;
                n.bd_seq = sp::bd_seq(&p);
                n.seq = p.seq.and_then(|s| u8::try_from(s).ok());
                n.birth("", &p.metrics);
                self.announce(&group, &device, now, out);
                return;
            }
            MsgType::NDeath => return self.node_death(ni, &group, &node, sp::bd_seq(&p), now, out),
            _ => {}
        }
        if !self.sparkplug_seq(ni, &group, &node, p.seq, now) {
            return;
        }
        match t.kind {
            MsgType::DBirth => {
                self.sparkplug.nodes[ni].0.birth(sub, &p.metrics);
                self.announce(&group, &device, now, out);
            }
            MsgType::DDeath => {
                if let Some(di) = self.find_device(&group, &device) {
                    self.die(di, now, out);
                }
            }
            _ => self.sparkplug_data(
                topic,
                &p,
                ni,
                sub,
                (&group, &device),
                now,
                raw_wall,
                decoded,
                out,
            ),
        }
    }

    /// NDATA/DDATA: numeric metrics sharing a timestamp form one reading.
    #[allow(clippy::too_many_arguments)]
    fn sparkplug_data(
        &mut self,
        topic: &str,
        p: &sp::Payload,
        ni: usize,
        sub: &str,
        (group, device): (&Id, &Id),
        now: Now,
        raw_wall: Millis,
        decoded: &mut Decoded,
        out: &mut dyn Emit,
    ) {
        let ids = Some((group, device));
        let mut readings: Vec<Reading> = Vec::new();
        for m in &p.metrics {
            let resolved = match self.sparkplug.nodes[ni].0.resolve(sub, m) {
                Ok(r) => r,
                Err(alias) => {
                    let node = self.sparkplug.nodes[ni].0.node.clone();
                    self.request_rebirth(ni, group, &node, now);
                    let detail =
                        format!("unknown Sparkplug metric alias {alias} (no birth defines it)");
                    return self.reject(out, Reason::DecodeError, topic, ids, now, detail);
                }
            };
            let value = resolved
                .as_ref()
                .map_or(Value::Other, |(_, dt)| sp::value(m, *dt));
            let (Some((name, _)), Value::Number(v)) = (resolved, value) else {
                self.counters.sparkplug_other += 1;
                continue;
            };
            let ts = m.timestamp.or(p.timestamp);
            match readings.iter_mut().find(|r| r.0 == ts) {
                Some(r) => r.1.push((name, v)),
                None => readings.push((ts, vec![(name, v)])),
            }
        }
        for (ts, metrics) in readings {
            decoded.seq = None;
            decoded.ts = match ts.map(i64::try_from) {
                None => DeviceTs::Missing,
                Some(Ok(t)) => DeviceTs::Ms(t),
                Some(Err(_)) => DeviceTs::Invalid("Sparkplug timestamp out of range"),
            };
            decoded.metrics.clear();
            for (name, v) in metrics {
                if decoded.metrics.push((name, v)).is_err() {
                    let detail = format!(
                        "more than {} numeric metrics at one timestamp",
                        crate::codec::MAX_METRICS
                    );
                    return self.reject(out, Reason::DecodeError, topic, ids, now, detail);
                }
            }
            let parts = TopicParts {
                group: group.clone(),
                device: device.clone(),
                kind: Kind::Reading,
            };
            let node = self.sparkplug.nodes[ni].0.node.clone();
            let clock = self.device_slot(group, &node);
            let slots = super::ingest::Slots {
                guess: None,
                clock_of: Some(clock),
            };
            self.apply(topic, &parts, decoded, now, raw_wall, slots, out);
        }
    }

    fn request_rebirth(&mut self, ni: usize, group: &Id, node: &Id, now: Now) {
        if self.sparkplug.rebirth && self.sparkplug.nodes[ni].0.rebirth_due(now.mono) {
            self.sparkplug.commands.push((
                format!("{}/{group}/NCMD/{node}", sp::NAMESPACE),
                sp::rebirth_command(now.wall),
            ));
        }
    }

    /// Member device indexes of a group.
    fn group_devices_idx(&self, group: &Id) -> Vec<usize> {
        self.group_index.get(group).map_or_else(Vec::new, |&gi| {
            self.groups[gi as usize]
                .members
                .iter()
                .map(|&d| d as usize)
                .collect()
        })
    }

    /// A BIRTH: the device is known and online, as after a first accepted event (§7).
    fn announce(&mut self, group: &Id, device: &Id, now: Now, out: &mut dyn Emit) {
        let di = self.device_slot(group, device);
        let dev = &mut self.devices[di].state;
        let (was_offline, announced) = (dev.offline, dev.announced);
        dev.offline = false;
        dev.announced = true;
        dev.last_arrival = now.mono;
        let last_seen = dev.max_event.get();
        self.mark_device(di);
        let gi = self.devices[di].group as usize;
        self.groups[gi].rebuild = true;
        self.mark_pending(di);
        if was_offline {
            self.alert(out, di, AlertType::Online, last_seen, None, now);
        }
        if was_offline || !announced {
            out.emit(Output::Status {
                group: group.clone(),
                device: device.clone(),
                online: true,
            });
        }
    }

    /// A DEATH: offline at once (alert, retained status) and idle for the watermark at once.
    fn die(&mut self, di: usize, now: Now, out: &mut dyn Emit) {
        let gi = self.devices[di].group as usize;
        let idle = self.groups[gi].cfg.idle_timeout_ms;
        let dev = &mut self.devices[di].state;
        dev.last_arrival = now.mono.saturating_sub(idle).saturating_sub(1);
        let newly = !dev.offline;
        dev.offline = true;
        let (last_seen, group, device) =
            (dev.max_event.get(), Id::clone(&dev.group), dev.id.to_id());
        self.mark_device(di);
        // The all-idle watermark runs from the last arrival of any member still alive.
        let members = self.groups[gi].members.clone();
        let latest = members
            .iter()
            .map(|&m| self.devices[m as usize].state.last_arrival)
            .max()
            .unwrap_or(now.mono);
        let g = &mut self.groups[gi];
        g.state.last_arrival = latest;
        g.rebuild = true;
        self.mark_group(gi);
        self.mark_pending(di);
        if newly {
            self.alert(out, di, AlertType::Offline, last_seen, None, now);
            out.emit(Output::Status {
                group,
                device,
                online: false,
            });
        }
    }
}
