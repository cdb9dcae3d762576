//! Payloads written as JSON by hand, byte for byte as serde_json writes them:
//! serde's writes of one token at a time were a sixth of replay's CPU and the
//! sink's encoding cost. What this does not cover goes through serde_json.

use serde_json::ser::{CompactFormatter, Formatter};

use super::{Output, PayloadRef, WindowResult};

/// `s` as a JSON string.
pub fn str_into(out: &mut Vec<u8>, s: &str) {
    // serde_json escapes control bytes, `"` and `\` only.
    if crate::scan::plain_run(s.as_bytes()) < s.len() {
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// An integer.
pub fn int_into(out: &mut Vec<u8>, v: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

fn f64_into(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        let _ = CompactFormatter.write_f64(out, v);
    } else {
        out.extend_from_slice(b"null");
    }
}

/// The JSON payload of `o`.
pub fn payload_into(out: &mut Vec<u8>, o: &Output) {
    match o {
        Output::Window(w) if window_into(out, w) => {}
        Output::Status { online, .. } => {
            out.extend_from_slice(if *online {
                b"\"online\""
            } else {
                b"\"offline\""
            });
        }
        // Writing into a Vec cannot fail; these types always serialize.
        _ => {
            let _ = serde_json::to_writer(&mut *out, &PayloadRef(o));
        }
    }
}

/// A window result without extra aggregates; false, nothing written, with them.
fn window_into(out: &mut Vec<u8>, w: &WindowResult) -> bool {
    if w.metrics.iter().any(|(_, m)| m.extra.is_some()) {
        return false;
    }
    out.extend_from_slice(b"{\"id\":");
    str_into(out, &w.id);
    out.extend_from_slice(b",\"gateway\":");
    str_into(out, &w.gateway);
    out.extend_from_slice(b",\"group\":");
    str_into(out, &w.group);
    out.extend_from_slice(b",\"device\":");
    str_into(out, &w.device);
    out.extend_from_slice(b",\"start\":");
    int_into(out, w.start);
    out.extend_from_slice(b",\"end\":");
    int_into(out, w.end);
    out.extend_from_slice(b",\"revision\":");
    int_into(out, w.revision);
    out.extend_from_slice(b",\"count\":");
    int_into(out, w.count);
    out.extend_from_slice(b",\"heartbeats\":");
    int_into(out, w.heartbeats);
    out.extend_from_slice(b",\"metrics\":{");
    for (i, (name, m)) in w.metrics.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        str_into(out, name);
        out.extend_from_slice(b":{\"count\":");
        int_into(out, m.count);
        for (key, v) in [
            (&b",\"sum\":"[..], m.sum),
            (b",\"min\":", m.min),
            (b",\"max\":", m.max),
            (b",\"mean\":", m.mean),
            (b",\"first\":", m.first),
            (b",\"last\":", m.last),
        ] {
            out.extend_from_slice(key);
            f64_into(out, v);
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"}}");
    true
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::codec::MetricName;
    use crate::model::Id;
    use crate::output::{MetricOut, MetricsOut};
    use crate::time::extras::ExtraOut;

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-0.0),
            Just(1e-300),
            Just(18.827_999_999_999_996),
            (-1000i32..1000).prop_map(|i| f64::from(i) / 100.0),
        ]
    }

    fn metric() -> impl Strategy<Value = (String, MetricOut)> {
        (
            "([a-z_]{1,8}|[^\\\\]{0,6}|\"q\\\\\u{1}\u{7f}é)",
            any::<u64>(),
            proptest::collection::vec(value(), 6),
            any::<bool>(),
        )
            .prop_map(|(name, count, v, extra)| {
                let m = MetricOut {
                    count,
                    sum: v[0],
                    min: v[1],
                    max: v[2],
                    mean: v[3],
                    first: v[4],
                    last: v[5],
                    extra: extra.then(|| Box::new(ExtraOut(vec![("p50", v[0]), ("stddev", v[1])]))),
                };
                (name, m)
            })
    }

    fn window() -> impl Strategy<Value = Output> {
        (
            "[a-z0-9._:-]{1,64}",
            "[a-z0-9._:-]{1,64}",
            any::<i64>(),
            any::<i64>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(metric(), 0..4),
        )
            .prop_map(|(g, d, start, end, revision, count, heartbeats, ms)| {
                let mut metrics = MetricsOut::default();
                for (n, m) in ms {
                    if let Ok(n) = MetricName::try_from(n.as_str()) {
                        metrics.insert(n, m);
                    }
                }
                Output::Window(WindowResult {
                    id: format!("{g}/{d}/{start}/{revision}"),
                    gateway: Id::try_from("gw-1").unwrap(),
                    group: Id::try_from(g.as_str()).unwrap(),
                    device: Id::try_from(d.as_str()).unwrap(),
                    start,
                    end,
                    revision,
                    count,
                    heartbeats,
                    metrics,
                })
            })
    }

    proptest! {
        /// The hand-written payload is serde_json's, byte for byte, extras or not.
        #[test]
        fn window_payloads_are_serde_jsons(o in window()) {
            let mut mine = Vec::new();
            payload_into(&mut mine, &o);
            let serde = serde_json::to_vec(&PayloadRef(&o)).unwrap();
            prop_assert_eq!(String::from_utf8_lossy(&mine), String::from_utf8_lossy(&serde));
        }

        #[test]
        fn strings_are_serde_jsons(s in "\\PC{0,12}|[\u{0}-\u{7f}]{0,12}") {
            let mut mine = Vec::new();
            str_into(&mut mine, &s);
            prop_assert_eq!(mine, serde_json::to_vec(&s).unwrap());
        }
    }

    #[test]
    fn status_payloads_are_serde_jsons() {
        for online in [true, false] {
            let o = Output::Status {
                group: Id::try_from("g").unwrap(),
                device: Id::try_from("d").unwrap(),
                online,
            };
            let mut mine = Vec::new();
            payload_into(&mut mine, &o);
            assert_eq!(mine, serde_json::to_vec(&PayloadRef(&o)).unwrap());
        }
    }
}
