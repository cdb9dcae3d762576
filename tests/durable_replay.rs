//! The durable store through `tidemark replay --state-dir`: crash at random
//! moments with SIGKILL, resume, and compare with an uncrashed in-memory run.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const CONFIG: &str = "[gateway]\nid = \"gw\"\ncommit_interval_ms = 200\n";

fn tidemark() -> Command {
    let mut c = support::tidemark();
    c.env("RUST_LOG", "warn");
    c
}

fn replay_args(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["replay", "--config"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.push(dir.join("c.toml").display().to_string());
    v.push("--input".into());
    v.push(dir.join("capture.jsonl").display().to_string());
    v.push("--drain-ms".into());
    v.push("200000".into());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// "auto" bound and lateness (docs/reference.md#group_defaults-and-groupsname) for every group.
const AUTO: &str = "[group_defaults]\nout_of_orderness_ms = \"auto\"\nallowed_lateness_ms = \"auto\"\n\
    adaptive = { quantile = 0.99, min_ms = 100, max_ms = 300000, horizon_s = 120 }\n";

/// A temp dir with the config and a synthetic capture of `devices` × `seconds`.
fn setup(devices: usize, seconds: i64) -> tempfile::TempDir {
    setup_with(devices, seconds, CONFIG)
}

fn setup_with(devices: usize, seconds: i64, config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c.toml"), config).unwrap();
    std::fs::write(
        dir.path().join("capture.jsonl"),
        support::engine::synthetic_capture(devices, seconds),
    )
    .unwrap();
    dir
}

/// Runs `replay --state-dir state --output out`.
fn durable_replay_output(dir: &Path, state: &Path, out: &Path) -> std::process::Output {
    tidemark()
        .args(replay_args(
            dir,
            &[
                "--state-dir",
                state.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
            ],
        ))
        .output()
        .unwrap()
}

/// Runs `replay --state-dir state --output out` to completion.
fn durable_replay(dir: &Path, state: &Path, out: &Path) {
    let r = durable_replay_output(dir, state, out);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
}

/// `tidemark inspect --json` of a state dir, which must succeed.
fn inspect_json(state: &Path) -> serde_json::Value {
    let r = tidemark()
        .args(["inspect", "--json", "--state-dir", state.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    serde_json::from_slice(&r.stdout).unwrap()
}

/// Window results by id, and every other output line.
fn parse(text: &str) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut windows = BTreeMap::new();
    let mut others = BTreeSet::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"));
        if v["topic"].as_str().unwrap().contains("/windows/") {
            let id = v["payload"]["id"].as_str().unwrap().to_string();
            let prev = windows.insert(id.clone(), line.to_string());
            assert!(
                prev.is_none_or(|p| p == line),
                "result {id} differs between deliveries"
            );
        } else {
            others.insert(line.to_string());
        }
    }
    (windows, others)
}

#[test]
fn kill_9_at_random_moments_loses_nothing_and_changes_no_result() {
    let _ = crash_and_compare(&setup(60, 600), 20, true);
}

/// The same with "auto" bound and lateness: what they learned is part of the
/// state, so a resumed run decides exactly as an uncrashed one.
#[test]
fn kill_9_with_adaptive_watermarks_changes_no_result() {
    let dir = setup_with(60, 600, &format!("{CONFIG}{AUTO}"));
    let _ = crash_and_compare(&dir, 8, false);
    let v = inspect_json(&dir.path().join("state"));
    let groups = v["groups"].as_array().unwrap();
    assert!(
        groups.iter().all(|g| g["bound_ms"]
            .as_i64()
            .is_some_and(|b| (100..=300_000).contains(&b))
            && g["lateness_ms"]
                .as_i64()
                .is_some_and(|l| (100..=300_000).contains(&l))),
        "{groups:?}"
    );
    // The bursts of buffered readings taught the lateness.
    assert!(
        groups.iter().any(|g| g["lateness_ms"].as_i64() > Some(100)),
        "{groups:?}"
    );
}

/// Two conditions on every group (docs/conditions.md), one reading a p99.
const CONDITIONS: &str = "[group_defaults]\naggregates = [\"p99\"]\n\
    [[group_defaults.conditions]]\nname = \"warm\"\nwhen = \"temp.mean > 25\"\nclear = \"temp.mean < 24.9\"\n\
    [[group_defaults.conditions]]\nname = \"peaky\"\nwhen = \"temp.p99 > 29.8 and count > 30\"\nfor_windows = 2\n";

/// Conditions through kill -9 during replay: the same records (same ids, same
/// values) as an uncrashed run, and no condition raised twice without a clear
/// or a retraction between.
#[test]
fn kill_9_with_conditions_gives_the_same_condition_ids_none_raised_twice() {
    let dir = setup_with(60, 600, &format!("{CONFIG}{CONDITIONS}"));
    let (reference, crashed) = crash_and_compare(&dir, 8, true);
    let conditions = |set: &BTreeSet<String>| -> BTreeSet<String> {
        set.iter()
            .filter(|l| l.contains("/conditions/"))
            .cloned()
            .collect()
    };
    let (want, have) = (conditions(&reference), conditions(&crashed));
    assert!(want.len() > 50, "too few condition records: {}", want.len());
    assert_eq!(
        have, want,
        "condition records differ from the uncrashed run"
    );
    // In the order first delivered: per device and condition, raised and cleared
    // alternate once retractions are applied.
    let text = std::fs::read_to_string(dir.path().join("crashed.jsonl")).unwrap();
    let mut seen = BTreeSet::new();
    let mut standing: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for line in text.lines().filter(|l| l.contains("/conditions/")) {
        if !seen.insert(line.to_string()) {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let c = &v["payload"];
        let key = format!("{}/{}/{}", c["group"], c["device"], c["name"]);
        let start = c["window_start"].as_i64().unwrap();
        let list = standing.entry(key).or_default();
        match c["state"].as_str().unwrap() {
            "retracted" => {
                let i = list.iter().position(|(s, _)| *s == start);
                assert!(i.is_some(), "retracted, never standing: {line}");
                list.remove(i.unwrap());
            }
            state => {
                list.push((start, state.to_string()));
                list.sort();
            }
        }
    }
    for (key, list) in &standing {
        for pair in list.windows(2) {
            assert_ne!(pair[0].1, pair[1].1, "{key}: {list:?}");
        }
        assert!(
            list.first().is_none_or(|f| f.1 == "raised"),
            "{key}: {list:?}"
        );
    }
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
fn crash_and_compare(
    dir: &tempfile::TempDir,
    kills_wanted: usize,
    fixed: bool,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let reference = dir.path().join("reference.jsonl");
    let r = tidemark()
        .args(replay_args(
            dir.path(),
            &["--output", reference.to_str().unwrap()],
        ))
        .output()
        .unwrap();
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let (ref_windows, ref_others) = parse(&std::fs::read_to_string(&reference).unwrap());
    assert!(
        ref_windows.len() > 500,
        "capture too small: {} windows",
        ref_windows.len()
    );
    assert!(!fixed || ref_others.iter().any(|l| l.contains("/late/")));
    assert!(ref_others.iter().any(|l| l.contains("/alerts/")));
    assert!(ref_others.iter().any(|l| l.contains("/rejected")));

    // An uncrashed durable run gives exactly the in-memory output.
    let state = dir.path().join("state-clean");
    let clean = dir.path().join("clean.jsonl");
    durable_replay(dir.path(), &state, &clean);
    assert_eq!(
        std::fs::read(&clean).unwrap(),
        std::fs::read(&reference).unwrap()
    );

    let state = dir.path().join("state");
    let crashed = dir.path().join("crashed.jsonl");
    let args = replay_args(
        dir.path(),
        &[
            "--state-dir",
            state.to_str().unwrap(),
            "--output",
            crashed.to_str().unwrap(),
        ],
    );
    // Kill moments are relative to measured progress, not wall time: each run is killed once
    // its output holds a random share (1/60 .. 1/20) more distinct lines than when it started
    // (outputs redelivered after a restart are not progress), so a slow or busy machine proves
    // the same thing and every run moves the replay forward.
    let distinct = |path: &Path| -> usize {
        std::fs::read_to_string(path)
            .map(|t| t.lines().collect::<BTreeSet<_>>().len())
            .unwrap_or(0)
    };
    let total = distinct(&reference) as u64;
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    let mut kills = 0;
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs < 400, "replay made no progress");
        let start_lines = distinct(&crashed) as u64;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let grow = total / 60 + rng % (total / 20 - total / 60);
        let mut child = tidemark()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if distinct(&crashed) as u64 >= start_lines + grow {
                break None;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        match status {
            Some(status) => {
                let mut err = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
                assert_eq!(status.code(), Some(0), "{err}");
                if kills >= kills_wanted {
                    break;
                }
                // Finished before enough kills: start over to get more crash rounds.
                std::fs::remove_dir_all(&state).unwrap();
                std::fs::remove_file(&crashed).unwrap();
            }
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                if kills == 5 {
                    // Inspect works on a crashed state without touching it.
                    let file = state.join("tidemark.redb");
                    let before = std::fs::read(&file).unwrap();
                    let v = inspect_json(&state);
                    assert!(v["counters"]["received"].as_u64().unwrap() > 0);
                    assert!(
                        std::fs::read(&file).unwrap() == before,
                        "inspect modified the state file"
                    );
                }
            }
        }
    }
    eprintln!("{kills} SIGKILL rounds over {runs} runs");
    assert!(kills >= kills_wanted, "only {kills} crash rounds");
    let (windows, others) = parse(&std::fs::read_to_string(&crashed).unwrap());
    assert_eq!(windows.len(), ref_windows.len());
    assert!(
        windows == ref_windows,
        "window results differ from the uncrashed run"
    );
    let missing: Vec<_> = ref_others.difference(&others).take(3).collect();
    assert!(
        missing.is_empty(),
        "missing outputs after crashes: {missing:?}"
    );
    (ref_others, others)
}

#[test]
fn inspect_shows_watermarks_devices_and_outbox() {
    let dir = setup(6, 120);
    let state = dir.path().join("state");
    let out = dir.path().join("out.jsonl");
    durable_replay(dir.path(), &state, &out);
    let v = inspect_json(&state);
    let groups: Vec<&str> = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(groups.len(), 3, "{groups:?}");
    assert!(v["groups"][0]["watermark"].as_i64().unwrap() > support::engine::T0);
    assert_eq!(v["devices"].as_array().unwrap().len(), 6);
    let fast = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == "dev2")
        .unwrap();
    assert_eq!(fast["clock_distrusted"], true);
    assert_eq!(v["outbox"]["depth"], 0);
    assert!(v["counters"]["received"].as_u64().unwrap() > 700);
    let text = tidemark()
        .args(["inspect", "--state-dir", state.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("WATERMARK") && text.contains("dev2") && text.contains("outbox: 0 entries"),
        "{text}"
    );
}

#[test]
fn corrupt_or_foreign_state_file_is_a_clear_error_and_is_left_alone() {
    let dir = setup(2, 10);
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let file = state.join("tidemark.redb");
    let garbage = vec![0x5a; 8192];
    std::fs::write(&file, &garbage).unwrap();
    let out = dir.path().join("out.jsonl");
    let r = durable_replay_output(dir.path(), &state, &out);
    assert_eq!(r.status.code(), Some(1));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains(file.to_str().unwrap()), "{err}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        garbage,
        "corrupt file was modified"
    );
    let r = tidemark()
        .args(["inspect", "--state-dir", state.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("tidemark.redb"));
}
