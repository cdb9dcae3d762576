//! State written by an earlier release is read by this one: a checkpoint whose
//! engine rules are a TOML document, and journal records after it that hold a
//! reload as a TOML document (`tests/data/state-v1`, written by
//! `scripts/fixture-state-v1.sh` with the binary of 2026-12-03).
#![allow(clippy::disallowed_methods)]

mod support;

use std::path::Path;
use std::time::Duration;

use support::{Collector, Gateway, Mosquitto, wait_or_explain};

fn copy_fixture(to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/state-v1");
    for f in ["tidemark.redb", "tidemark.wal"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

/// The journal's reload (hvac windows of 20 s, written before the kill) is
/// applied on restore: the open hvac windows fire with the 20 s shape although
/// the configured one is 10 s; the checkpoint's groups and devices are there.
#[test]
fn an_old_checkpoint_and_journal_are_restored() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    copy_fixture(&state);
    let broker = Mosquitto::start(false);
    let up = Collector::start(broker.port, "tidemark/fx/#", "compat-up");
    let cfg = dir.path().join("a.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[gateway]
id = "fx"
state_dir = "{}"
[source]
url = "{url}"
client_id = "fx-in"
probe_after_ms = 0
[time]
policy = "device"
[sink]
url = "{url}"
[group_defaults]
out_of_orderness_ms = 1000
idle_timeout_ms = 1500
window = {{ kind = "tumbling", size_ms = 10000 }}
[groups.hvac]
idle_timeout_ms = 1500
"#,
            state.display(),
            url = broker.url()
        ),
    )
    .unwrap();
    let log = dir.path().join("gw.log");
    let gw = Gateway::start(&cfg, &log);
    wait_or_explain(
        Duration::from_secs(30),
        || up.on("/windows/hvac/d1").len() + up.on("/windows/hvac/d2").len() >= 2,
        || format!("no hvac results:\n{}", gw.log_text()),
    );
    let text = gw.log_text();
    assert!(text.contains("journal_records=5"), "{text}");
    assert!(text.contains("groups=2 devices=3"), "{text}");
    assert!(text.contains("applied as a reload"), "{text}");
    for d in ["d1", "d2"] {
        let w = up.on(&format!("/windows/hvac/{d}"))[0].json();
        assert_eq!(
            w["end"].as_i64().unwrap() - w["start"].as_i64().unwrap(),
            20_000,
            "{w}"
        );
        assert_eq!(w["count"], 16, "{w}");
        assert_eq!(w["revision"], 0, "{w}");
    }
    wait_or_explain(
        Duration::from_secs(30),
        || !up.on("/windows/line/d3").is_empty(),
        || format!("no line result:\n{}", gw.log_text()),
    );
    let w = up.on("/windows/line/d3")[0].json();
    assert_eq!(
        w["end"].as_i64().unwrap() - w["start"].as_i64().unwrap(),
        10_000,
        "{w}"
    );
    assert_eq!(w["count"], 6, "{w}");
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}
