//! Hostile input never panics the engine and never vanishes: every message is
//! accepted, late, a duplicate, or rejected — and counted.

mod support;

use proptest::prelude::*;
use support::engine::{Sim, T0};
use tidemark::engine::Now;

fn topic() -> impl Strategy<Value = String> {
    prop_oneof![
        "sensors/(g[0-2])/(d[0-3])/(reading|heartbeat)",
        "sensors/[a-z.:_-]{1,70}/[a-z]{1,3}/reading",
        "\\PC{0,40}",
        "sensors/\\PC{0,5}/\\PC{0,5}/\\PC{0,9}",
    ]
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    let ts = prop_oneof![
        Just("1764480000000".to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:e}")),
        Just("\"2025-11-30T05:20:00.5+02:00\"".to_string()),
        Just("null".to_string()),
        (0i64..400_000).prop_map(|d| (T0 + d).to_string()),
        (0i64..400_000).prop_map(|d| (T0 - d * 1000).to_string()),
    ];
    prop_oneof![
        (ts, any::<u16>(), -1e300f64..1e300).prop_map(|(ts, seq, v)| format!(
            r#"{{"ts": {ts}, "seq": {seq}, "temp": {v}, "x": [1, {{"y": 2}}]}}"#
        )
        .into_bytes()),
        prop::collection::vec(any::<u8>(), 0..64),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|mut v| {
            v.insert(0, 0xa2);
            v
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn hostile_streams_never_panic_and_every_message_is_accounted_for(
        msgs in prop::collection::vec((topic(), payload(), -5_000i64..400_000, any::<bool>()), 1..80),
        extreme in prop::sample::select(vec![0i64, i64::MIN / 2, i64::MAX / 2, -T0, 1]),
    ) {
        let mut sim = Sim::new("[time]\ninvalid = \"reject\"\n[groups.g1]\nwindow = { kind = \"session\", gap_ms = 5000 }\n[groups.g2]\nwindow = { kind = \"hopping\", size_ms = 10000, slide_ms = 1000 }\n", T0);
        let mut at = T0;
        for (topic, payload, step, wild_clock) in &msgs {
            at += step;
            // The gateway's own clock may be anything at all (RTC resets, broken captures).
            let now = if *wild_clock { Now { wall: at.wrapping_add(extreme), mono: at, synced: true } } else { Now::at(at) };
            sim.driver.message(now, topic, payload);
        }
        sim.advance(at + 500_000);
        let c = sim.engine().counters();
        let rejected: u64 = c.rejected.iter().sum();
        prop_assert_eq!(c.received, msgs.len() as u64);
        prop_assert_eq!(c.received, c.accepted + c.late + c.duplicates + rejected);
        prop_assert_eq!(sim.rejected().len() as u64, rejected);
        prop_assert_eq!(sim.late().len() as u64, c.late);
    }
}
