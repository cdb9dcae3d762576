//! The fleet as Sparkplug B edge nodes: [`NODE_DEVICES`] devices per edge node
//! sharing its clock, births before data, metrics by alias with their own
//! timestamps, `seq` per edge node, a DDEATH when a device falls silent and a
//! DBIRTH when it returns.

use prost::Message as _;

use super::{Fleet, Kind, Msg};
use crate::model::Millis;
use crate::sparkplug::{self as sp, Metric, Payload, datatype};

/// Devices per edge node.
pub const NODE_DEVICES: u32 = 4;

fn ms(t: Millis) -> Option<u64> {
    u64::try_from(t).ok()
}

/// The `bdSeq` metric of an edge node's NBIRTH and NDEATH (one session each run: 0).
fn bd_seq() -> Metric {
    Metric {
        name: Some(sp::BD_SEQ.into()),
        datatype: Some(datatype::UINT64),
        long_value: Some(0),
        ..Metric::default()
    }
}

/// The aliases of device `i`: temperature, humidity, a status string.
fn aliases(i: u32) -> [u64; 3] {
    let base = u64::from(i) * 4;
    [base + 1, base + 2, base + 3]
}

impl Fleet {
    fn node_of(&self, i: u32) -> (usize, String, String) {
        let node = (i / NODE_DEVICES) as usize;
        let group = self.group_name(node % self.cfg.groups.len().max(1));
        (node, group, format!("edge{node:03}"))
    }

    fn sp_msg(&mut self, i: u32, topic: String, mut p: Payload, kind: Kind) -> Msg {
        let (node, _, _) = self.node_of(i);
        if self.nodes.len() <= node {
            self.nodes.resize(node + 1, (0, false));
        }
        let seq = &mut self.nodes[node].0;
        p.seq = Some(u64::from(*seq));
        *seq = seq.wrapping_add(1);
        Msg {
            // One connection per edge node keeps its seq in order.
            device: u32::try_from(node).unwrap_or(0) * NODE_DEVICES,
            topic,
            payload: p.encode_to_vec(),
            kind,
            backlog: false,
        }
    }

    /// The end of a run: an NDEATH (the bdSeq of its NBIRTH) for every edge node
    /// that was born, as a broker publishes an edge node's will when it goes.
    pub fn finish(&mut self) -> Vec<Msg> {
        if !self.cfg.sparkplug {
            return Vec::new();
        }
        let mut out = Vec::new();
        for node in 0..self.nodes.len() {
            if !self.nodes[node].1 {
                continue;
            }
            self.nodes[node].1 = false;
            let i = u32::try_from(node).unwrap_or(0) * NODE_DEVICES;
            let (_, group, node_id) = self.node_of(i);
            let p = Payload {
                metrics: vec![bd_seq()],
                ..Payload::default()
            };
            let m = Msg {
                device: i,
                topic: format!("{}/{group}/NDEATH/{node_id}", sp::NAMESPACE),
                payload: p.encode_to_vec(),
                kind: Kind::Death,
                backlog: false,
            };
            self.tally.add(m.kind);
            out.push(m);
        }
        out
    }

    /// A silent device's DDEATH, once (None in plain mode or when already dead).
    pub(super) fn sparkplug_death(&mut self, i: u32, elapsed: Millis) -> Option<Msg> {
        if !self.cfg.sparkplug || !self.devices[i as usize].born {
            return None;
        }
        self.devices[i as usize].born = false;
        let (_, group, node) = self.node_of(i);
        let topic = format!(
            "{}/{group}/DDEATH/{node}/{}",
            sp::NAMESPACE,
            self.devices[i as usize].name
        );
        let m = self.sp_msg(i, topic, Payload::default(), Kind::Death);
        if self.in_outage(elapsed) {
            self.held.push_back(m);
            return None;
        }
        self.tally.add(m.kind);
        Some(m)
    }

    /// Device `i`'s next message at true time `now` (births queued first when due).
    pub(super) fn make_sparkplug(&mut self, i: u32, now: Millis) -> Msg {
        let (node, group, node_id) = self.node_of(i);
        if self.nodes.len() <= node {
            self.nodes.resize(node + 1, (0, false));
        }
        let device = self.devices[i as usize].name.clone();
        let data_topic = format!("{}/{group}/DDATA/{node_id}/{device}", sp::NAMESPACE);
        if self.rng.chance(self.cfg.malformed) {
            return Msg {
                device: u32::try_from(node).unwrap_or(0) * NODE_DEVICES,
                topic: data_topic,
                payload: vec![0xff, 0xff, 0x07, 0x01],
                kind: Kind::Malformed,
                backlog: false,
            };
        }
        // The edge node's clock (its first device's) times all its devices.
        let clock = self.devices[node * NODE_DEVICES as usize].offset;
        let delay = self.rng.upto(self.cfg.delay_ms);
        let device_now = now + clock - delay;
        let mut out = Vec::new();
        if !self.nodes[node].1 {
            self.nodes[node] = (0, true);
            let p = Payload {
                timestamp: ms(device_now),
                metrics: vec![bd_seq()],
                ..Payload::default()
            };
            let topic = format!("{}/{group}/NBIRTH/{node_id}", sp::NAMESPACE);
            out.push(self.sp_msg(i, topic, p, Kind::Birth));
        }
        let [a_temp, a_hum, a_state] = aliases(i);
        if !self.devices[i as usize].born {
            self.devices[i as usize].born = true;
            let def = |name: &str, alias: u64, dt: u32| Metric {
                name: Some(name.into()),
                alias: Some(alias),
                datatype: Some(dt),
                is_null: Some(true),
                ..Metric::default()
            };
            let p = Payload {
                timestamp: ms(device_now),
                metrics: vec![
                    def("temp", a_temp, datatype::DOUBLE),
                    def("hum", a_hum, datatype::FLOAT),
                    def("state", a_state, datatype::STRING),
                ],
                ..Payload::default()
            };
            let topic = format!("{}/{group}/DBIRTH/{node_id}/{device}", sp::NAMESPACE);
            out.push(self.sp_msg(i, topic, p, Kind::Birth));
        }
        let (kind, ts) = self.stamp(device_now);
        let temp = self.next_temp(i);
        let value = |alias: u64| Metric {
            alias: Some(alias),
            timestamp: ms(ts),
            ..Metric::default()
        };
        let p = Payload {
            timestamp: ms(device_now),
            metrics: vec![
                Metric {
                    double_value: Some(temp),
                    ..value(a_temp)
                },
                Metric {
                    float_value: Some((80.0 - temp) as f32),
                    ..value(a_hum)
                },
                Metric {
                    string_value: Some("running".into()),
                    ..value(a_state)
                },
            ],
            ..Payload::default()
        };
        let data = self.sp_msg(i, data_topic, p, kind);
        if self.rng.chance(self.cfg.duplicates) {
            let again = Msg {
                kind: Kind::Duplicate,
                ..data.clone()
            };
            out.push(data);
            out.push(again);
        } else {
            out.push(data);
        }
        let mut it = out.into_iter();
        let first = it.next().expect("a data message at least");
        self.pending.extend(it);
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimConfig;

    #[test]
    fn edge_nodes_birth_before_data_and_number_their_messages() {
        let mut f = Fleet::new(SimConfig {
            devices: 8,
            sparkplug: true,
            ..SimConfig::default()
        });
        let msgs: Vec<Msg> = (0..40)
            .filter_map(|k| f.next(1_764_480_000_000 + k * 100, k * 100))
            .collect();
        let first = &msgs[0];
        assert!(
            first.topic.starts_with("spBv1.0/hall/NBIRTH/edge000"),
            "{}",
            first.topic
        );
        assert!(
            msgs[1]
                .topic
                .starts_with("spBv1.0/hall/DBIRTH/edge000/d0000")
        );
        assert!(
            msgs[2]
                .topic
                .starts_with("spBv1.0/hall/DDATA/edge000/d0000")
        );
        // seq per edge node, in send order.
        let seqs: Vec<u64> = msgs
            .iter()
            .filter(|m| m.topic.contains("/edge001"))
            .map(|m| sp::decode(&m.payload).unwrap().seq.unwrap())
            .collect();
        assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
        assert!(
            msgs.iter()
                .any(|m| m.topic.contains("spBv1.0/lab/NBIRTH/edge001"))
        );
        assert_eq!(f.tally().births, 2 + 8);
    }
}
