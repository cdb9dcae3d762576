//! Outbox entries as database rows: window results, alerts and condition
//! records (docs/conditions.md); everything else
//! (late, rejected, status) is not written (docs/reference.md#sinkpostgres-and-sinkinflux).

use serde_json::Value;

/// A window result, as both databases store it.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRow {
    /// `{group}/{device}/{start}/{revision}`.
    pub id: String,
    /// Group.
    pub group: String,
    /// Device.
    pub device: String,
    /// Window start, ms.
    pub start: i64,
    /// Window end, ms.
    pub end: i64,
    /// Revision.
    pub revision: i64,
    /// Readings.
    pub readings: i64,
    /// Heartbeats.
    pub heartbeats: i64,
    /// The result's `metrics` object.
    pub metrics: serde_json::Map<String, Value>,
}

/// An alert (device or gateway level: then group and device are empty).
#[derive(Debug, Clone, PartialEq)]
pub struct AlertRow {
    /// Group, or "".
    pub group: String,
    /// Device, or "".
    pub device: String,
    /// `type`.
    pub kind: String,
    /// `at`, ms.
    pub at: i64,
    /// The alert as published.
    pub body: Value,
}

/// A condition record.
#[derive(Debug, Clone, PartialEq)]
pub struct ConditionRow {
    /// `{group}/{device}/{name}/{window_start}/{state}`.
    pub id: String,
    /// Group.
    pub group: String,
    /// Device.
    pub device: String,
    /// The condition's name.
    pub name: String,
    /// raised, cleared or retracted.
    pub state: String,
    /// Start of the window that completed the run, ms.
    pub start: i64,
    /// Its end, ms.
    pub end: i64,
    /// Gateway time of the record, ms.
    pub at: i64,
    /// The record as published.
    pub body: Value,
}

/// What an outbox entry is to a database.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    /// `{p}windows` / `tidemark_windows`.
    Window(WindowRow),
    /// `{p}alerts` / `tidemark_alerts`.
    Alert(AlertRow),
    /// `{p}conditions` / `tidemark_conditions`.
    Condition(ConditionRow),
}

impl Row {
    /// The id named when the row is set aside.
    pub fn id(&self) -> String {
        match self {
            Row::Window(w) => w.id.clone(),
            Row::Alert(a) => format!("{}/{}/{}/{}", a.group, a.device, a.kind, a.at),
            Row::Condition(c) => c.id.clone(),
        }
    }

    /// Group and device, when there are.
    pub fn owner(&self) -> (Option<String>, Option<String>) {
        let (g, d) = match self {
            Row::Window(w) => (&w.group, &w.device),
            Row::Alert(a) => (&a.group, &a.device),
            Row::Condition(c) => (&c.group, &c.device),
        };
        (
            (!g.is_empty()).then(|| g.clone()),
            (!d.is_empty()).then(|| d.clone()),
        )
    }
}

/// JSON or CBOR, whichever the entry is (a reload may change `sink.format`).
fn decode(payload: &[u8]) -> Option<Value> {
    if payload.first() == Some(&b'{') {
        serde_json::from_slice(payload).ok()
    } else {
        ciborium::de::from_reader(payload).ok()
    }
}

fn int(v: &Value, k: &str) -> Option<i64> {
    v.get(k)?.as_i64()
}

fn text(v: &Value, k: &str) -> Option<String> {
    Some(v.get(k)?.as_str()?.to_string())
}

/// The row an entry of `topic` makes, if any. `prefix` is the sink's `P`.
pub fn row(prefix: &str, topic: &str, payload: &[u8]) -> Option<Row> {
    let leaf = topic.strip_prefix(prefix)?.strip_prefix('/')?;
    let kind = leaf.split('/').next()?;
    match kind {
        "windows" => {
            let v = decode(payload)?;
            Some(Row::Window(WindowRow {
                id: text(&v, "id")?,
                group: text(&v, "group")?,
                device: text(&v, "device")?,
                start: int(&v, "start")?,
                end: int(&v, "end")?,
                revision: int(&v, "revision")?,
                readings: int(&v, "count")?,
                heartbeats: int(&v, "heartbeats").unwrap_or(0),
                metrics: v.get("metrics")?.as_object()?.clone(),
            }))
        }
        "alerts" => {
            let v = decode(payload)?;
            Some(Row::Alert(AlertRow {
                group: text(&v, "group").unwrap_or_default(),
                device: text(&v, "device").unwrap_or_default(),
                kind: text(&v, "type")?,
                at: int(&v, "at")?,
                body: v,
            }))
        }
        "conditions" => {
            let v = decode(payload)?;
            Some(Row::Condition(ConditionRow {
                id: text(&v, "id")?,
                group: text(&v, "group")?,
                device: text(&v, "device")?,
                name: text(&v, "name")?,
                state: text(&v, "state")?,
                start: int(&v, "window_start")?,
                end: int(&v, "window_end")?,
                at: int(&v, "at")?,
                body: v,
            }))
        }
        _ => None,
    }
}

/// Rows with the same key kept once: a window's highest revision (a batch may
/// hold several), an alert's first, a condition record's latest. Order otherwise kept.
pub fn dedup(rows: &mut Vec<(usize, Row)>) {
    use std::collections::HashMap;
    let mut best: HashMap<(u8, String, String, String, i64), usize> = HashMap::new();
    let mut keep = vec![true; rows.len()];
    for (i, (_, r)) in rows.iter().enumerate() {
        let key = match r {
            Row::Window(w) => (0, w.group.clone(), w.device.clone(), String::new(), w.start),
            Row::Alert(a) => (1, a.group.clone(), a.device.clone(), a.kind.clone(), a.at),
            Row::Condition(c) => (2, c.id.clone(), String::new(), String::new(), 0),
        };
        match best.get(&key) {
            Some(&j) => {
                let later_wins = match (r, &rows[j].1) {
                    (Row::Window(a), Row::Window(b)) => a.revision > b.revision,
                    (Row::Condition(a), Row::Condition(b)) => a.at >= b.at,
                    _ => false,
                };
                if later_wins {
                    keep[j] = false;
                    best.insert(key, i);
                } else {
                    keep[i] = false;
                }
            }
            None => {
                best.insert(key, i);
            }
        }
    }
    let mut k = keep.into_iter();
    rows.retain(|_| k.next().unwrap_or(true));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(rev: i64, start: i64) -> Row {
        Row::Window(WindowRow {
            id: format!("g/d/{start}/{rev}"),
            group: "g".into(),
            device: "d".into(),
            start,
            end: start + 10,
            revision: rev,
            readings: 1,
            heartbeats: 0,
            metrics: serde_json::Map::new(),
        })
    }

    #[test]
    fn results_and_alerts_become_rows_in_json_and_cbor_the_rest_does_not() {
        let w = serde_json::json!({"id":"g/d/0/1","gateway":"gw","group":"g","device":"d","start":0,"end":10,
            "revision":1,"count":3,"heartbeats":1,"metrics":{"t":{"count":3,"sum":6.0}}});
        let json = serde_json::to_vec(&w).unwrap();
        let mut cbor = Vec::new();
        ciborium::ser::into_writer(&w, &mut cbor).unwrap();
        for p in [&json, &cbor] {
            let Some(Row::Window(r)) = row("P/x", "P/x/windows/g/d", p) else {
                panic!("no window row")
            };
            assert_eq!((r.revision, r.readings, r.heartbeats), (1, 3, 1));
            assert_eq!(r.metrics["t"]["sum"], 6.0);
        }
        let a =
            serde_json::to_vec(&serde_json::json!({"type":"gateway_clock","error_ms":5,"at":7}))
                .unwrap();
        let Some(Row::Alert(r)) = row("P", "P/alerts", &a) else {
            panic!("no alert row")
        };
        assert_eq!(
            (r.group.as_str(), r.kind.as_str(), r.at),
            ("", "gateway_clock", 7)
        );
        assert_eq!(row("P", "P/late/g/d", &json), None);
        assert_eq!(row("P", "P/windows/g/d", b"\xff"), None);
    }

    #[test]
    fn a_batch_keeps_each_window_once_at_its_highest_revision() {
        let mut rows: Vec<(usize, Row)> = [window(0, 0), window(2, 0), window(1, 0), window(0, 10)]
            .into_iter()
            .enumerate()
            .collect();
        dedup(&mut rows);
        let kept: Vec<_> = rows.iter().map(|(i, _)| *i).collect();
        assert_eq!(kept, vec![1, 3]);
    }
}
