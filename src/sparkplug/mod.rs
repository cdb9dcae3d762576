//! Sparkplug B 3.0 (docs/reference.md#sparkplug--sparkplug-b-30-ingest), pure: the protobuf payload as the Sparkplug
//! specification numbers its fields (written here; prost derives the wire
//! code, no `protoc` at build time), topics, metric values, and the state an
//! edge node leaves behind (births, aliases, sequence numbers).

pub mod node;

use std::collections::BTreeMap;

use prost::Message as _;
use serde::{Deserialize, Serialize};

use crate::codec::MetricName;
use crate::model::{Id, Millis};

/// The topic namespace.
pub const NAMESPACE: &str = "spBv1.0";
/// The metric of an NBIRTH/NDEATH that pairs them.
pub const BD_SEQ: &str = "bdSeq";
/// The metric of an NCMD asking an edge node for its births again.
pub const REBIRTH: &str = "Node Control/Rebirth";
/// Metrics one BIRTH may declare.
pub const MAX_BIRTH_METRICS: usize = 1024;
/// Devices one edge node may declare.
pub const MAX_NODE_DEVICES: usize = 1024;
/// Least time between two rebirth requests to one edge node (monotonic ms).
pub const REBIRTH_EVERY_MS: Millis = 10_000;

/// `[sparkplug]`, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SparkplugConfig {
    /// Subscribe and decode Sparkplug B.
    pub enabled: bool,
    /// Sparkplug group ids taken (empty: all).
    pub group_ids: Vec<String>,
    /// Primary Host Application id.
    pub host_id: Option<String>,
    /// Request rebirths on unknown aliases and seq gaps.
    pub rebirth: bool,
    /// Edge nodes held at once (docs/reference.md, `sparkplug.max_edge_nodes`).
    pub max_edge_nodes: usize,
}

/// Sparkplug B `Payload`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payload {
    /// Epoch ms.
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    /// Metrics.
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
    /// 0..=255, per edge node.
    #[prost(uint64, optional, tag = "3")]
    pub seq: Option<u64>,
    /// Payload UUID.
    #[prost(string, optional, tag = "4")]
    pub uuid: Option<String>,
    /// Opaque body.
    #[prost(bytes = "vec", optional, tag = "5")]
    pub body: Option<Vec<u8>>,
}

/// Sparkplug B `Payload.Metric` (metadata, properties, datasets and templates
/// are skipped as unknown fields: they are never aggregated).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    /// Name (BIRTH; DATA may use the alias only).
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// Alias.
    #[prost(uint64, optional, tag = "2")]
    pub alias: Option<u64>,
    /// Epoch ms of this value.
    #[prost(uint64, optional, tag = "3")]
    pub timestamp: Option<u64>,
    /// [`DataType`] number.
    #[prost(uint32, optional, tag = "4")]
    pub datatype: Option<u32>,
    /// Historical value.
    #[prost(bool, optional, tag = "5")]
    pub is_historical: Option<bool>,
    /// Transient value.
    #[prost(bool, optional, tag = "6")]
    pub is_transient: Option<bool>,
    /// No value.
    #[prost(bool, optional, tag = "7")]
    pub is_null: Option<bool>,
    /// Int8..Int32, UInt8..UInt32 (signed ones two's complement).
    #[prost(uint32, optional, tag = "10")]
    pub int_value: Option<u32>,
    /// Int64, UInt64, DateTime (some encoders put UInt32 here too).
    #[prost(uint64, optional, tag = "11")]
    pub long_value: Option<u64>,
    /// Float.
    #[prost(float, optional, tag = "12")]
    pub float_value: Option<f32>,
    /// Double.
    #[prost(double, optional, tag = "13")]
    pub double_value: Option<f64>,
    /// Boolean.
    #[prost(bool, optional, tag = "14")]
    pub boolean_value: Option<bool>,
    /// String, Text, UUID.
    #[prost(string, optional, tag = "15")]
    pub string_value: Option<String>,
    /// Bytes, File.
    #[prost(bytes = "vec", optional, tag = "16")]
    pub bytes_value: Option<Vec<u8>>,
}

/// Sparkplug B data types (the numeric ones by name).
pub mod datatype {
    /// Int8.
    pub const INT8: u32 = 1;
    /// Int16.
    pub const INT16: u32 = 2;
    /// Int32.
    pub const INT32: u32 = 3;
    /// Int64.
    pub const INT64: u32 = 4;
    /// UInt8.
    pub const UINT8: u32 = 5;
    /// UInt16.
    pub const UINT16: u32 = 6;
    /// UInt32.
    pub const UINT32: u32 = 7;
    /// UInt64.
    pub const UINT64: u32 = 8;
    /// Float.
    pub const FLOAT: u32 = 9;
    /// Double.
    pub const DOUBLE: u32 = 10;
    /// Boolean.
    pub const BOOLEAN: u32 = 11;
    /// String.
    pub const STRING: u32 = 12;
}

/// Sparkplug message types tidemark takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgType {
    /// Edge node birth.
    NBirth,
    /// Edge node data.
    NData,
    /// Edge node death (the broker's will).
    NDeath,
    /// Device birth.
    DBirth,
    /// Device data.
    DData,
    /// Device death.
    DDeath,
}

/// A Sparkplug topic `spBv1.0/{group}/{type}/{edge_node}[/{device}]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topic<'a> {
    /// Sparkplug group id.
    pub group: &'a str,
    /// Message type.
    pub kind: MsgType,
    /// Edge node id.
    pub node: &'a str,
    /// Device id (D* types).
    pub device: Option<&'a str>,
}

/// Whether `topic` is in the Sparkplug namespace.
pub fn is_sparkplug(topic: &str) -> bool {
    topic
        .strip_prefix(NAMESPACE)
        .is_some_and(|r| r.starts_with('/'))
}

/// Parses a data topic; `Err` says why it is not one.
pub fn parse_topic(topic: &str) -> Result<Topic<'_>, &'static str> {
    let mut it = topic.split('/');
    if it.next() != Some(NAMESPACE) {
        return Err("not in the spBv1.0 namespace");
    }
    let (Some(group), Some(kind), Some(node)) = (it.next(), it.next(), it.next()) else {
        return Err("too few topic levels for Sparkplug B");
    };
    let device = it.next();
    if it.next().is_some() {
        return Err("too many topic levels for Sparkplug B");
    }
    let kind = match (kind, device.is_some()) {
        ("NBIRTH", false) => MsgType::NBirth,
        ("NDATA", false) => MsgType::NData,
        ("NDEATH", false) => MsgType::NDeath,
        ("DBIRTH", true) => MsgType::DBirth,
        ("DDATA", true) => MsgType::DData,
        ("DDEATH", true) => MsgType::DDeath,
        _ => return Err("not a Sparkplug B birth, data or death topic"),
    };
    Ok(Topic {
        group,
        kind,
        node,
        device,
    })
}

/// The topic filters that take every data, birth and death message of `groups` (all when empty).
pub fn filters(groups: &[String]) -> Vec<String> {
    let groups: Vec<&str> = if groups.is_empty() {
        vec!["+"]
    } else {
        groups.iter().map(String::as_str).collect()
    };
    let mut f = Vec::new();
    for g in groups {
        for t in ["NBIRTH", "NDATA", "NDEATH"] {
            f.push(format!("{NAMESPACE}/{g}/{t}/+"));
        }
        for t in ["DBIRTH", "DDATA", "DDEATH"] {
            f.push(format!("{NAMESPACE}/{g}/{t}/+/+"));
        }
    }
    f
}

/// Decodes a payload.
pub fn decode(bytes: &[u8]) -> Result<Payload, String> {
    Payload::decode(bytes).map_err(|e| format!("not a Sparkplug B payload: {e}"))
}

/// A metric's value as a reading field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// Numeric (Boolean as 0/1).
    Number(f64),
    /// Null, or a type that is not aggregated.
    Other,
}

/// The value of `m` read as `datatype`.
pub fn value(m: &Metric, dt: u32) -> Value {
    use datatype::*;
    if m.is_null == Some(true) {
        return Value::Other;
    }
    let n = match dt {
        INT8 | INT16 | INT32 | INT64 => m
            .int_value
            .map(|v| f64::from(v as i32))
            .or(m.long_value.map(|v| v as i64 as f64)),
        UINT8 | UINT16 | UINT32 | UINT64 => m
            .int_value
            .map(f64::from)
            .or(m.long_value.map(|v| v as f64)),
        FLOAT => m.float_value.map(f64::from).or(m.double_value),
        DOUBLE => m.double_value.or(m.float_value.map(f64::from)),
        BOOLEAN => m.boolean_value.map(|b| f64::from(u8::from(b))),
        _ => None,
    };
    n.filter(|v| v.is_finite())
        .map_or(Value::Other, Value::Number)
}

/// What an edge node has told us, kept across restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeNode {
    /// Sparkplug group id (= tidemark group).
    pub group: Id,
    /// Edge node id.
    pub node: Id,
    /// `bdSeq` of the current NBIRTH.
    pub bd_seq: Option<u64>,
    /// Last `seq` applied.
    pub seq: Option<u8>,
    /// Metric definitions by device ("" is the node itself), then alias.
    pub aliases: BTreeMap<String, BTreeMap<u64, (MetricName, u32)>>,
    /// Data types by device, then name.
    pub types: BTreeMap<String, BTreeMap<MetricName, u32>>,
    /// Monotonic time of the last rebirth request.
    pub rebirth_at: Option<Millis>,
}

/// How a message's `seq` relates to the last one applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seq {
    /// The next one (or no reference yet).
    Next,
    /// `n` messages were skipped.
    Gap(u8),
    /// Already applied (a QoS 1 redelivery).
    Again,
}

impl EdgeNode {
    /// Judges `seq` against the last one applied and, unless it is a repeat, takes it.
    pub fn observe_seq(&mut self, seq: Option<u64>) -> Seq {
        let Some(s) = seq.and_then(|s| u8::try_from(s).ok()) else {
            return Seq::Next;
        };
        let Some(last) = self.seq else {
            self.seq = Some(s);
            return Seq::Next;
        };
        let ahead = s.wrapping_sub(last);
        match ahead {
            1 => {
                self.seq = Some(s);
                Seq::Next
            }
            // Behind by up to half the ring, or equal: seen already.
            0 | 128..=255 => Seq::Again,
            n => {
                self.seq = Some(s);
                Seq::Gap(n - 1)
            }
        }
    }

    /// A BIRTH: forgets what `device` ("" for the node, which also forgets its
    /// devices) defined and takes the metric definitions of `metrics`.
    pub fn birth(&mut self, device: &str, metrics: &[Metric]) {
        if device.is_empty() {
            self.aliases.clear();
            self.types.clear();
        }
        let aliases = self.aliases.entry(device.to_string()).or_default();
        let types = self.types.entry(device.to_string()).or_default();
        aliases.clear();
        types.clear();
        for m in metrics {
            let (Some(name), Some(dt)) = (&m.name, m.datatype) else {
                continue;
            };
            let Ok(name) = MetricName::try_from(name.as_str()) else {
                continue;
            };
            if let Some(a) = m.alias {
                aliases.insert(a, (name.clone(), dt));
            }
            types.insert(name, dt);
        }
    }

    /// A DATA metric's (name, datatype): by name, else by alias; `Err` names an unknown alias.
    pub fn resolve(&self, device: &str, m: &Metric) -> Result<Option<(MetricName, u32)>, u64> {
        if let Some(name) = &m.name {
            let Ok(name) = MetricName::try_from(name.as_str()) else {
                return Ok(None);
            };
            let dt = m
                .datatype
                .or_else(|| self.types.get(device)?.get(&name).copied());
            return Ok(dt.map(|dt| (name, dt)));
        }
        match m.alias {
            Some(a) => match self.aliases.get(device).and_then(|d| d.get(&a)) {
                Some((name, dt)) => Ok(Some((name.clone(), m.datatype.unwrap_or(*dt)))),
                None => Err(a),
            },
            None => Ok(None),
        }
    }

    /// Whether a rebirth may be requested at `mono`; takes the slot if so.
    pub fn rebirth_due(&mut self, mono: Millis) -> bool {
        let due = self
            .rebirth_at
            .is_none_or(|t| mono < t || mono.saturating_sub(t) >= REBIRTH_EVERY_MS);
        if due {
            self.rebirth_at = Some(mono);
        }
        due
    }
}

/// The `bdSeq` metric of a birth or death payload.
pub fn bd_seq(p: &Payload) -> Option<u64> {
    p.metrics
        .iter()
        .find(|m| m.name.as_deref() == Some(BD_SEQ))
        .and_then(|m| m.long_value.or(m.int_value.map(u64::from)))
}

/// An NCMD asking for a rebirth.
pub fn rebirth_command(at: Millis) -> Vec<u8> {
    Payload {
        timestamp: u64::try_from(at).ok(),
        metrics: vec![Metric {
            name: Some(REBIRTH.into()),
            timestamp: u64::try_from(at).ok(),
            datatype: Some(datatype::BOOLEAN),
            boolean_value: Some(true),
            ..Metric::default()
        }],
        ..Payload::default()
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_parse_only_data_birth_and_death() {
        let t = parse_topic("spBv1.0/plant/DDATA/edge1/press").unwrap();
        assert_eq!(
            (t.group, t.kind, t.node, t.device),
            ("plant", MsgType::DData, "edge1", Some("press"))
        );
        assert_eq!(
            parse_topic("spBv1.0/plant/NDEATH/edge1").unwrap().kind,
            MsgType::NDeath
        );
        for bad in [
            "spBv1.0/STATE/host",
            "spBv1.0/plant/NCMD/edge1",
            "spBv1.0/plant/NDATA/edge1/dev",
            "spBv1.0/plant/DDATA/edge1",
            "spBv1.0/plant/DDATA/e/d/x",
            "spAv1.0/plant/NDATA/edge1",
        ] {
            assert!(parse_topic(bad).is_err(), "{bad}");
        }
        assert_eq!(filters(&[]).len(), 6);
    }

    #[test]
    fn values_follow_the_datatype_whichever_field_carries_them() {
        let m = |f: fn(&mut Metric)| {
            let mut m = Metric::default();
            f(&mut m);
            m
        };
        assert_eq!(
            value(&m(|m| m.int_value = Some(u32::MAX)), datatype::INT8),
            Value::Number(-1.0)
        );
        assert_eq!(
            value(&m(|m| m.int_value = Some(u32::MAX)), datatype::UINT32),
            Value::Number(4_294_967_295.0)
        );
        assert_eq!(
            value(&m(|m| m.long_value = Some(7)), datatype::UINT32),
            Value::Number(7.0)
        );
        assert_eq!(
            value(&m(|m| m.long_value = Some(u64::MAX)), datatype::INT64),
            Value::Number(-1.0)
        );
        assert_eq!(
            value(&m(|m| m.float_value = Some(1.5)), datatype::FLOAT),
            Value::Number(1.5)
        );
        assert_eq!(
            value(&m(|m| m.boolean_value = Some(true)), datatype::BOOLEAN),
            Value::Number(1.0)
        );
        assert_eq!(
            value(&m(|m| m.string_value = Some("x".into())), datatype::STRING),
            Value::Other
        );
        assert_eq!(
            value(
                &m(|m| {
                    m.is_null = Some(true);
                    m.double_value = Some(1.0)
                }),
                datatype::DOUBLE
            ),
            Value::Other
        );
        assert_eq!(
            value(&m(|m| m.double_value = Some(f64::NAN)), datatype::DOUBLE),
            Value::Other
        );
    }

    #[test]
    fn seq_wraps_counts_gaps_and_recognises_repeats() {
        let mut n = EdgeNode::default();
        assert_eq!(n.observe_seq(Some(254)), Seq::Next);
        assert_eq!(n.observe_seq(Some(255)), Seq::Next);
        assert_eq!(n.observe_seq(Some(0)), Seq::Next);
        assert_eq!(n.observe_seq(Some(0)), Seq::Again);
        assert_eq!(n.observe_seq(Some(250)), Seq::Again);
        assert_eq!(n.observe_seq(Some(4)), Seq::Gap(3));
        assert_eq!(n.observe_seq(None), Seq::Next);
    }

    #[test]
    fn payloads_round_trip_and_garbage_is_an_error() {
        let bytes = rebirth_command(1_764_480_000_000);
        let p = decode(&bytes).unwrap();
        assert_eq!(p.metrics[0].name.as_deref(), Some(REBIRTH));
        assert!(decode(&[0xff, 0xff, 0xff]).is_err());
    }
}
