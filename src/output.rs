//! Outputs of the engine and their wire form (docs/reference.md#topics-and-payloads-upstream).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::codec::{DeviceTs, MetricName};
use crate::model::{Id, Millis, Reason};
use crate::time::window::Stats;

mod condition;
pub mod json;
pub use condition::{ConditionOut, ConditionState, Values};

/// Output encoding upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkFormat {
    /// JSON.
    Json,
    /// CBOR.
    Cbor,
}

impl SinkFormat {
    /// `v` encoded in this format: every payload published upstream goes through here.
    pub fn encode<T: Serialize + ?Sized>(self, v: &T) -> Vec<u8> {
        match self {
            SinkFormat::Json => serde_json::to_vec(v).unwrap_or_default(),
            SinkFormat::Cbor => {
                let mut out = Vec::new();
                // Writing into a Vec cannot fail.
                let _ = ciborium::ser::into_writer(v, &mut out);
                out
            }
        }
    }
}

/// Where the engine puts what it emits, in order.
pub trait Emit {
    /// One output.
    fn emit(&mut self, o: Output);
}

impl Emit for Vec<Output> {
    fn emit(&mut self, o: Output) {
        self.push(o);
    }
}

/// Outputs nobody reads (a journal replayed after a crash: they were committed).
pub struct Discard;

impl Emit for Discard {
    fn emit(&mut self, _: Output) {}
}

/// Something the gateway publishes upstream.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A window result (revision 0 or a re-emission).
    Window(WindowResult),
    /// An event whose windows are all past their lateness.
    Late(Late),
    /// Bad input.
    Rejected(Rejected),
    /// A device alert.
    Alert(Alert),
    /// A gateway-level alert from the engine (`P/alerts`).
    Gateway(GatewayAlert),
    /// An entry a database refused, set aside (`P/rejected`, reason `output_refused`).
    Refused(Refused),
    /// A condition raised, cleared or retracted (`P/conditions/{group}/{device}`).
    Condition(ConditionOut),
    /// Retained device status.
    Status {
        /// Group.
        group: Id,
        /// Device.
        device: Id,
        /// Online or offline.
        online: bool,
    },
}

/// `P/windows/{group}/{device}` payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowResult {
    /// `{group}/{device}/{start}/{revision}`, deterministic.
    pub id: String,
    /// Gateway id.
    pub gateway: Id,
    /// Group.
    pub group: Id,
    /// Device.
    pub device: Id,
    /// Window start (inclusive).
    pub start: Millis,
    /// Window end (exclusive).
    pub end: Millis,
    /// 0 for the first result, +1 for each re-emission.
    pub revision: u32,
    /// Readings.
    pub count: u64,
    /// Heartbeats.
    pub heartbeats: u64,
    /// Per-metric aggregates by name.
    pub metrics: MetricsOut,
}

/// A window result's metrics, sorted by name; written as a map. A sorted list
/// of exactly the metrics present: a map's node took ~1.4 KiB a result, 14 MiB
/// when 10 000 windows close in one tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsOut(Vec<(MetricName, MetricOut)>);

impl MetricsOut {
    /// Adds or replaces a metric, keeping the names in order.
    pub fn insert(&mut self, name: MetricName, m: MetricOut) {
        match self
            .0
            .binary_search_by(|(n, _)| n.as_str().cmp(name.as_str()))
        {
            Ok(i) => self.0[i].1 = m,
            Err(i) => self.0.insert(i, (name, m)),
        }
    }

    /// One metric by name.
    pub fn get(&self, name: &str) -> Option<&MetricOut> {
        self.0
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// The metrics in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&MetricName, &MetricOut)> {
        self.0.iter().map(|(n, m)| (n, m))
    }

    /// Metrics held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No metrics.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(MetricName, MetricOut)> for MetricsOut {
    fn from_iter<I: IntoIterator<Item = (MetricName, MetricOut)>>(it: I) -> Self {
        let mut v: Vec<_> = it.into_iter().collect();
        v.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        // Last one wins on a repeated name, as a map's insert.
        v.reverse();
        v.dedup_by(|later, earlier| later.0 == earlier.0);
        v.reverse();
        v.shrink_to_fit();
        Self(v)
    }
}

impl std::ops::Index<&str> for MetricsOut {
    type Output = MetricOut;
    fn index(&self, name: &str) -> &MetricOut {
        self.get(name)
            .unwrap_or_else(|| panic!("no metric {name:?} in the window result"))
    }
}

impl Serialize for MetricsOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (n, v) in &self.0 {
            m.serialize_entry(n.as_str(), v)?;
        }
        m.end()
    }
}

/// One metric of a window result.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricOut {
    /// Readings carrying the metric.
    pub count: u64,
    /// Sum.
    pub sum: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub mean: f64,
    /// Value at the earliest event time.
    pub first: f64,
    /// Value at the latest event time.
    pub last: f64,
    /// The group's extra aggregates (docs/reference.md#group_defaults-and-groupsname), when it has any.
    pub extra: Option<Box<crate::time::extras::ExtraOut>>,
}

impl Serialize for MetricOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let extra = self.extra.as_deref().map_or(&[][..], |e| e.0.as_slice());
        let mut st = s.serialize_struct("MetricOut", 7 + extra.len())?;
        st.serialize_field("count", &self.count)?;
        st.serialize_field("sum", &self.sum)?;
        st.serialize_field("min", &self.min)?;
        st.serialize_field("max", &self.max)?;
        st.serialize_field("mean", &self.mean)?;
        st.serialize_field("first", &self.first)?;
        st.serialize_field("last", &self.last)?;
        for (name, v) in extra {
            st.serialize_field(name, v)?;
        }
        st.end()
    }
}

impl From<&Stats> for MetricOut {
    fn from(s: &Stats) -> Self {
        Self {
            count: u64::from(s.count),
            sum: s.sum,
            min: s.min,
            max: s.max,
            mean: s.mean(),
            first: s.first,
            last: s.last,
            extra: None,
        }
    }
}

/// `P/late/{group}/{device}` payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Late {
    /// Group.
    pub group: Id,
    /// Device.
    pub device: Id,
    /// The event time the gateway assigned.
    pub event_time: Millis,
    /// Group watermark at the time.
    pub watermark: Option<Millis>,
    /// Arrival (gateway wall clock).
    pub arrival: Millis,
    /// Decoded fields of the message.
    pub payload: BTreeMap<String, PayloadValue>,
}

/// A decoded field value echoed in a late record.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PayloadValue {
    /// Integer (timestamp, sequence).
    Int(i64),
    /// Unsigned integer (sequence).
    UInt(u64),
    /// Metric value.
    Float(f64),
}

/// Decoded fields of a message as echoed on the late topic.
pub fn decoded_fields(
    ts_field: &str,
    ts: DeviceTs,
    seq_field: Option<&str>,
    seq: Option<u64>,
    metrics: &[(MetricName, f64)],
) -> BTreeMap<String, PayloadValue> {
    let mut m = BTreeMap::new();
    if let DeviceTs::Ms(t) = ts {
        m.insert(ts_field.to_string(), PayloadValue::Int(t));
    }
    if let (Some(f), Some(s)) = (seq_field, seq) {
        m.insert(f.to_string(), PayloadValue::UInt(s));
    }
    for (k, v) in metrics {
        m.insert(k.to_string(), PayloadValue::Float(*v));
    }
    m
}

/// `P/rejected` payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    /// Why.
    pub reason: Reason,
    /// The input topic.
    pub topic: String,
    /// Group, when the topic matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<Id>,
    /// Device, when the topic matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<Id>,
    /// Arrival (gateway wall clock).
    pub arrival: Millis,
    /// Human-readable cause.
    pub detail: String,
}

/// `P/rejected` payload of an entry a database output refused for its content.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refused {
    /// Always `output_refused`.
    pub reason: &'static str,
    /// The entry's topic.
    pub topic: String,
    /// Group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The result's or alert's id.
    pub id: String,
    /// Gateway wall clock when set aside.
    pub arrival: Millis,
    /// `{output}: {the database's message}`.
    pub detail: String,
}

/// Alert kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertType {
    /// Watermark passed last_seen + heartbeat_timeout.
    Offline,
    /// An offline device sent an accepted event.
    Online,
    /// Device clock offset beyond `max_skew_ms`.
    ClockSkew,
    /// Device clock back within `max_skew_ms`.
    ClockOk,
}

/// `P/alerts/{group}/{device}` payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    /// Kind.
    #[serde(rename = "type")]
    pub kind: AlertType,
    /// Group.
    pub group: Id,
    /// Device.
    pub device: Id,
    /// Device's last event time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Millis>,
    /// Group watermark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark: Option<Millis>,
    /// Estimated clock offset (arrival − device time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset_ms: Option<Millis>,
    /// Gateway clock when raised.
    pub at: Millis,
}

/// `P/alerts` payloads raised by the engine (docs/reference.md#topics-and-payloads-upstream).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GatewayAlert {
    /// A quorum of devices says the gateway's clock is wrong.
    #[serde(rename = "gateway_clock")]
    Clock {
        /// Estimated error of the gateway clock (gateway − devices' consensus).
        error_ms: Millis,
        /// Devices in the consensus (0: the gateway clock stepped away from the corrected time).
        devices_agreeing: usize,
        /// Corrected gateway time when raised.
        at: Millis,
    },
    /// The gateway clock agrees again.
    #[serde(rename = "gateway_clock_ok")]
    ClockOk {
        /// Gateway time when raised.
        at: Millis,
    },
}

impl Output {
    /// Topic below the prefix `p`.
    pub fn topic(&self, p: &str) -> String {
        let mut t = String::new();
        self.topic_into(p, &mut t);
        t
    }

    /// [`Output::topic`] appended to `t` (a renderer reusing one buffer).
    pub fn topic_into(&self, p: &str, t: &mut String) {
        let (kind, ids) = match self {
            Output::Window(w) => ("/windows/", Some((&w.group, &w.device))),
            Output::Late(l) => ("/late/", Some((&l.group, &l.device))),
            Output::Rejected(_) | Output::Refused(_) => ("/rejected", None),
            Output::Alert(a) => ("/alerts/", Some((&a.group, &a.device))),
            Output::Gateway(_) => ("/alerts", None),
            Output::Condition(c) => ("/conditions/", Some((&c.group, &c.device))),
            Output::Status { group, device, .. } => ("/status/", Some((group, device))),
        };
        t.push_str(p);
        t.push_str(kind);
        if let Some((g, d)) = ids {
            t.push_str(g);
            t.push('/');
            t.push_str(d);
        }
    }

    /// Retained on the broker.
    pub fn retain(&self) -> bool {
        matches!(self, Output::Status { .. })
    }

    /// The payload, serializable in field order (docs/reference.md#topics-and-payloads-upstream).
    pub fn payload(&self) -> PayloadRef<'_> {
        PayloadRef(self)
    }

    /// The payload bytes in the sink format.
    pub fn encode(&self, format: SinkFormat) -> Vec<u8> {
        match format {
            SinkFormat::Json => {
                // serde_json's first room: a result grows twice, not six times.
                let mut v = Vec::with_capacity(128);
                json::payload_into(&mut v, self);
                v
            }
            SinkFormat::Cbor => format.encode(&self.payload()),
        }
    }
}

/// Borrowed payload of an [`Output`].
pub struct PayloadRef<'a>(&'a Output);

impl<'a> From<&'a Output> for PayloadRef<'a> {
    fn from(o: &'a Output) -> Self {
        Self(o)
    }
}

impl Serialize for PayloadRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Output::Window(w) => w.serialize(s),
            Output::Late(l) => l.serialize(s),
            Output::Rejected(r) => r.serialize(s),
            Output::Refused(r) => r.serialize(s),
            Output::Alert(a) => a.serialize(s),
            Output::Gateway(a) => a.serialize(s),
            Output::Condition(c) => c.serialize(s),
            Output::Status { online, .. } => {
                s.serialize_str(if *online { "online" } else { "offline" })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_window() -> Output {
        let mut metrics = MetricsOut::default();
        metrics.insert(
            MetricName::try_from("temp").unwrap(),
            MetricOut {
                count: 2,
                sum: 43.0,
                min: 21.0,
                max: 22.0,
                mean: 21.5,
                first: 21.0,
                last: 22.0,
                extra: None,
            },
        );
        Output::Window(WindowResult {
            id: "g/d/60000/1".into(),
            gateway: Id::try_from("gw").unwrap(),
            group: Id::try_from("g").unwrap(),
            device: Id::try_from("d").unwrap(),
            start: 60_000,
            end: 120_000,
            revision: 1,
            count: 2,
            heartbeats: 0,
            metrics,
        })
    }

    #[test]
    fn window_result_has_the_contract_topic_and_fields_in_both_formats() {
        let o = build_window();
        assert_eq!(o.topic("tidemark/gw"), "tidemark/gw/windows/g/d");
        assert!(!o.retain());
        let json: serde_json::Value = serde_json::from_slice(&o.encode(SinkFormat::Json)).unwrap();
        let cbor: serde_json::Value =
            ciborium::de::from_reader(&o.encode(SinkFormat::Cbor)[..]).unwrap();
        assert_eq!(json, cbor);
        assert_eq!(json["id"], "g/d/60000/1");
        assert_eq!(json["metrics"]["temp"]["mean"], 21.5);
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for k in [
            "id",
            "gateway",
            "group",
            "device",
            "start",
            "end",
            "revision",
            "count",
            "heartbeats",
            "metrics",
        ] {
            assert!(keys.contains(&k), "{k} missing");
        }
    }

    #[test]
    fn status_is_a_retained_bare_string() {
        let o = Output::Status {
            group: Id::try_from("g").unwrap(),
            device: Id::try_from("d").unwrap(),
            online: false,
        };
        assert_eq!(o.topic("p"), "p/status/g/d");
        assert!(o.retain());
        assert_eq!(o.encode(SinkFormat::Json), b"\"offline\"");
    }
}
