use super::*;

fn cfg() -> NodeConfig {
    NodeConfig {
        group_id: "plant".into(),
        edge_node_id: "gw1".into(),
        primary_host_id: None,
        rebirth_min_interval_ms: 5_000,
    }
}

fn result(fields: &[&str], revision: u64) -> Vec<u8> {
    let metrics: serde_json::Map<String, serde_json::Value> = fields
        .iter()
        .map(|f| {
            (
                (*f).to_string(),
                serde_json::json!({"count":2,"sum":3.0,"min":1.0,"max":2.0,"mean":1.5,"first":1.0,"last":2.0}),
            )
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "id": format!("g/d/0/{revision}"), "gateway":"gw1", "group":"g", "device":"d",
        "start": 0, "end": 10_000, "revision": revision, "count": 2, "heartbeats": 0,
        "metrics": metrics,
    }))
    .unwrap()
}

fn window(fields: &[&str], revision: u64) -> WindowIn {
    match classify("t/gw1/windows/g/d", &result(fields, revision)) {
        Entry::Window(w) => *w,
        e => panic!("{e:?}"),
    }
}

fn payload(m: &Msg) -> Payload {
    Payload::decode(m.payload.as_slice()).unwrap()
}

#[test]
fn entries_are_told_apart_by_topic_and_payload() {
    assert!(matches!(classify("p/late/g/d", b"{}"), Entry::Other));
    assert!(matches!(classify("p/rejected", b"{}"), Entry::Other));
    assert!(matches!(
        classify("windows/x/rejected", b"{}"),
        Entry::Other
    ));
    let off = br#"{"type":"offline","group":"g","device":"d","at":1}"#;
    assert!(matches!(classify("p/alerts/g/d", off), Entry::Offline(d) if d == "g:d"));
    let skew = br#"{"type":"clock_skew","group":"g","device":"d","at":1}"#;
    assert!(matches!(classify("p/alerts/g/d", skew), Entry::Other));
    let mut cbor = Vec::new();
    let v: serde_json::Value = serde_json::from_slice(&result(&["t"], 0)).unwrap();
    ciborium::ser::into_writer(&v, &mut cbor).unwrap();
    assert!(matches!(classify("p/windows/g/d", &cbor), Entry::Window(_)));
}

#[test]
fn a_window_is_born_once_then_data_with_the_end_as_timestamp() {
    let mut n = Node::new(cfg(), 7);
    let b = n.births(5, &[0; COUNTERS.len()]);
    assert_eq!(b.len(), 1);
    let nb = payload(&b[0]);
    assert_eq!(nb.seq, Some(0));
    assert_eq!(nb.metrics[0].long_value, Some(7));
    let out = n.window(&window(&["temp"], 0), 20, false);
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].topic, "spBv1.0/plant/DBIRTH/gw1/g:d");
    let birth = payload(&out[0]);
    assert_eq!(birth.seq, Some(1));
    assert_eq!(birth.metrics.len(), 4 + 7);
    let data = payload(&out[1]);
    assert_eq!(data.seq, Some(2));
    assert!(data.metrics.iter().all(|m| m.timestamp == Some(10_000)));
    assert!(data.metrics.iter().all(|m| m.name.is_none()));
    // Every alias of the data is declared by the birth with its type.
    for m in &data.metrics {
        let b = birth.metrics.iter().find(|b| b.alias == m.alias).unwrap();
        assert_eq!(b.datatype, m.datatype, "{:?}", b.name);
    }
    // A revision: data only; a new field: born again with the old aliases kept.
    assert_eq!(n.window(&window(&["temp"], 1), 21, true).len(), 1);
    let again = n.window(&window(&["hum", "temp"], 2), 22, false);
    assert_eq!(again.len(), 2);
    let rebirth = payload(&again[0]);
    let temp = |p: &Payload| {
        p.metrics
            .iter()
            .find(|m| m.name.as_deref() == Some("temp/mean"))
            .and_then(|m| m.alias)
    };
    assert_eq!(temp(&rebirth), temp(&birth));
    assert_eq!(rebirth.metrics.len(), 4 + 14);
}

#[test]
fn seq_wraps_and_a_rebirth_restarts_it() {
    let mut n = Node::new(cfg(), 255);
    n.births(0, &[0; COUNTERS.len()]);
    let mut last = 0;
    for r in 0..300 {
        let out = n.window(&window(&["t"], r), 1, false);
        last = payload(out.last().unwrap()).seq.unwrap();
    }
    assert_eq!(last, (1 + 300) % 256);
    let b = n.births(2, &[0; COUNTERS.len()]);
    assert_eq!(b.len(), 2, "NBIRTH and the device's DBIRTH");
    assert_eq!(payload(&b[0]).seq, Some(0));
    assert_eq!(payload(&b[1]).seq, Some(1));
}

#[test]
fn offline_is_a_death_and_online_a_birth() {
    let mut n = Node::new(cfg(), 0);
    n.births(0, &[0; COUNTERS.len()]);
    assert!(n.offline("g:d", 1).is_none(), "unknown device: nothing");
    n.window(&window(&["t"], 0), 1, false);
    let death = n.offline("g:d", 2).unwrap();
    assert_eq!(death.topic, "spBv1.0/plant/DDEATH/gw1/g:d");
    assert!(n.offline("g:d", 2).is_none(), "dead once");
    assert_eq!(
        n.births(3, &[0; COUNTERS.len()]).len(),
        1,
        "offline: not reborn"
    );
    let birth = n.online("g:d", 4).unwrap();
    assert_eq!(birth.topic, "spBv1.0/plant/DBIRTH/gw1/g:d");
    // A result of a dead device is born first.
    n.offline("g:d", 5);
    assert_eq!(n.window(&window(&["t"], 1), 6, false).len(), 2);
}

#[test]
fn rebirth_commands_and_host_states_are_read() {
    let cmd = Payload {
        timestamp: Some(1),
        metrics: vec![Metric {
            boolean_value: Some(true),
            ..metric(Some(REBIRTH), None, 1, datatype::BOOLEAN)
        }],
        seq: None,
        uuid: None,
        body: None,
    }
    .encode_to_vec();
    assert!(is_rebirth(&cmd));
    assert!(!is_rebirth(b"junk"));
    assert_eq!(
        host_state(br#"{"online":true,"timestamp":5}"#),
        Some((true, 5))
    );
    assert_eq!(host_state(b"ONLINE"), None);
}
