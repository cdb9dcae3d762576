//! Growing past one gateway (docs/operate.md): two gateways, each given half of the
//! groups by topic filter, together publish exactly the window results one
//! gateway publishes for all of them — against one real mosquitto.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{Collector, Gateway, Mosquitto, Publisher, final_windows, now_ms, wait_or_explain};

fn config(dir: &Path, id: &str, topics: &[&str], broker: &Mosquitto) -> PathBuf {
    let path = dir.join(format!("{id}.toml"));
    let topics: Vec<String> = topics.iter().map(|t| format!("{t:?}")).collect();
    let text = format!(
        "[gateway]\nid = \"{id}\"\nstate_dir = \"{state}\"\ncommit_interval_ms = 100\ntick_interval_ms = 100\n\
         [source]\nurl = \"{url}\"\nclient_id = \"{id}-in-{port}\"\ntopics = [{topics}]\n\
         [time]\npolicy = \"device\"\n\
         [group_defaults]\nout_of_orderness_ms = 1000\nidle_timeout_ms = 1000\nallowed_lateness_ms = 0\n\
         heartbeat_timeout_ms = 600000\nwindow = {{ kind = \"tumbling\", size_ms = 5000 }}\n\
         [groups.g3]\nwindow = {{ kind = \"session\", gap_ms = 3000 }}\n\
         [sink]\nurl = \"{url}\"\nclient_id = \"{id}-out-{port}\"\n",
        state = dir.join(id).display(),
        url = broker.url(),
        port = broker.port,
        topics = topics.join(", "),
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// Final window results of `gateway`, keyed by group/device/start, without the gateway's name.
fn results(up: &Collector, gateway: &str) -> BTreeMap<String, serde_json::Value> {
    let prefix = format!("tidemark/{gateway}/windows/");
    let seen: Vec<_> = up
        .all()
        .into_iter()
        .filter(|s| s.topic.starts_with(&prefix))
        .collect();
    final_windows(&seen)
        .into_values()
        .map(|mut v| {
            let key = format!("{}/{}/{}", v["group"], v["device"], v["start"]);
            if let Some(m) = v.as_object_mut() {
                m.remove("gateway");
                m.remove("revision");
                m.remove("id");
            }
            (key, v)
        })
        .collect()
}

#[test]
fn two_gateways_with_half_the_groups_each_publish_what_one_publishes_for_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Mosquitto::stock();
    let up = Collector::start(broker.port, "tidemark/+/windows/#", "scale-upstream");
    let gateways = [
        ("all", vec!["sensors/+/+/+"]),
        ("half-a", vec!["sensors/g0/+/+", "sensors/g1/+/+"]),
        ("half-b", vec!["sensors/g2/+/+", "sensors/g3/+/+"]),
    ];
    let running: Vec<Gateway> = gateways
        .iter()
        .map(|(id, topics)| {
            let cfg = config(dir.path(), id, topics, &broker);
            Gateway::start(&cfg, &dir.path().join(format!("{id}.log")))
        })
        .collect();

    // Device clocks only (policy device): out of order within a second, some sparse devices.
    let mut p = Publisher::connect(broker.port, "scale-fleet");
    let base = (now_ms() - 120_000) / 5000 * 5000;
    let mut sent = 0u64;
    for step in 0..40i64 {
        for d in 0..12i64 {
            if d % 5 == 4 && step % 3 != 0 {
                continue;
            }
            let ts = base + step * 1000 + (d * 137 + step * 71) % 900;
            let body = format!(
                r#"{{"ts": {ts}, "seq": {step}, "temp": {}.25, "hum": {d}}}"#,
                step % 7
            );
            p.send(&format!("sensors/g{}/d{d}/reading", d % 4), body.as_bytes());
            sent += 1;
        }
    }
    p.flush();
    let count = |m: &BTreeMap<String, serde_json::Value>| -> u64 {
        m.values().map(|w| w["count"].as_u64().unwrap_or(0)).sum()
    };
    wait_or_explain(
        Duration::from_secs(90),
        || {
            count(&results(&up, "all")) == sent
                && count(&results(&up, "half-a")) + count(&results(&up, "half-b")) == sent
        },
        || {
            format!(
                "sent {sent}: all {} halves {} + {}",
                count(&results(&up, "all")),
                count(&results(&up, "half-a")),
                count(&results(&up, "half-b"))
            )
        },
    );
    let all = results(&up, "all");
    let mut halves = results(&up, "half-a");
    let b = results(&up, "half-b");
    assert!(halves.keys().all(|k| !b.contains_key(k)), "groups overlap");
    halves.extend(b);
    assert_eq!(all.len(), halves.len());
    for (k, v) in &all {
        assert_eq!(Some(v), halves.get(k), "{k}");
    }
    for gw in running {
        let (code, _) = gw.terminate();
        assert_eq!(code, Some(0));
    }
}
