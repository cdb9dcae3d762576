//! A rollout across 20 real gateway processes on one stock upstream mosquitto
//! (docs/reference.md#remote-configuration-fleet): canaries, then batches; four gateways stopped during the rollout
//! show `drift` in `fleet ls` and converge to the retained desired document
//! when they start again, with no new push; a document that breaks the source
//! is rolled back by the canaries and stops the rollout before any other
//! gateway is touched.

mod support;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::*;

const N: usize = 20;
const CONFIRM_S: u64 = 3;

fn gw(i: usize) -> String {
    format!("gw{i:02}")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn rollout_cmd(up: &Mosquitto, key: &Path, id: u64, doc: &Path) -> Command {
    let mut c = support::tidemark();
    c.args(["fleet", "rollout", "--url", &up.url(), "--key"])
        .arg(key)
        .args([
            "--id",
            &id.to_string(),
            "--all",
            "--canary",
            "2",
            "--batch",
            "6",
        ])
        .args([
            "--max-failures",
            "0",
            "--desired",
            "--json",
            "--timeout-s",
            "60",
        ])
        .arg(doc);
    c
}

fn ls(up: &Mosquitto) -> Vec<Value> {
    let o = support::tidemark()
        .args(["fleet", "ls", "--url", &up.url(), "--json", "--wait-s", "1"])
        .output()
        .expect("fleet ls");
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

/// The latest status of each gateway seen live.
fn latest(statuses: &Collector, id: &str) -> Value {
    statuses
        .on(&format!("/{id}/status"))
        .last()
        .map_or(Value::Null, Seen::json)
}

struct Node {
    config: PathBuf,
    log: PathBuf,
    proc: Option<Gateway>,
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn a_rollout_reaches_twenty_gateways_in_stages_the_absent_converge_and_a_broken_one_stops_at_the_canaries()
 {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let up = Mosquitto::stock();
    let site = Mosquitto::stock();
    let key = d.join("op.key");
    support::fleet::keygen(&key);
    let statuses = Collector::start(up.port, "tidemark/+/status", "statuses");
    let results = Collector::start(up.port, "tidemark/+/config/result", "results");

    let mut nodes: Vec<Node> = (1..=N)
        .map(|i| {
            let id = gw(i);
            let config = d.join(format!("{id}.toml"));
            let public = d.join("op.key.pub");
            support::fleet::remote_config(d, &id, (&site, &up), &[&public], CONFIRM_S)
                .write(&config);
            let log = d.join(format!("{id}.log"));
            let proc = Some(Gateway::spawn(&config, &log));
            Node { config, log, proc }
        })
        .collect();
    for n in &nodes {
        n.proc.as_ref().unwrap().wait_ready();
    }
    wait_until(Duration::from_secs(30), "20 gateways online", || {
        (1..=N).all(|i| latest(&statuses, &gw(i))["state"] == "online")
    });

    // The rollout; gw17..gw20 (the last batch) stop once the canaries are through.
    let doc1 = d.join("doc1.toml");
    std::fs::write(
        &doc1,
        "[groups.probe]\nwindow = { kind = \"tumbling\", size_ms = 4000 }\n",
    )
    .unwrap();
    let mut child = rollout_cmd(&up, &key, 1, &doc1)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a progress line");
    assert!(
        first.starts_with("canary: 2 gateways: 2 applied"),
        "{first}"
    );
    // The rollout is held (SIGSTOP) while they go, so on a busy machine too they are
    // offline before their batch: progress, not a race, decides.
    signal(&child, "STOP");
    let away: Vec<usize> = (17..=N).collect();
    for &i in &away {
        signal(&nodes[i - 1].proc.as_ref().unwrap().child, "TERM");
    }
    for &i in &away {
        let (code, _) = nodes[i - 1].proc.take().unwrap().terminate();
        assert_eq!(code, Some(0));
    }
    wait_until(Duration::from_secs(30), "gw17..gw20 offline", || {
        away.iter()
            .all(|&i| latest(&statuses, &gw(i))["state"] == "offline")
    });
    signal(&child, "CONT");
    let out = child.wait_with_output().unwrap();
    let progress = reader.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{progress}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("the JSON report");
    eprintln!(
        "rollout of document 1: {} ms from first push to last result",
        report["took_ms"]
    );
    assert_eq!(report["stopped"], false);
    assert_eq!(report["desired"], true);
    assert_eq!(
        progress
            .lines()
            .filter(|l| l.contains(" gateways: "))
            .count(),
        4,
        "{progress}"
    );
    let rows = report["gateways"].as_array().unwrap();
    assert_eq!(rows.len(), N);
    let result_of = |i: usize| {
        rows.iter()
            .find(|r| r["gateway"] == gw(i))
            .map(|r| r["result"].as_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    };
    for i in 1..=16 {
        assert_eq!(result_of(i), "applied", "{report}");
    }
    assert_eq!(rows[0]["stage"], "canary");
    assert_eq!(rows[19]["stage"], "batch 3");
    // Stopped before their batch (they may, rarely, have applied first).
    let absent: Vec<usize> = away
        .iter()
        .copied()
        .filter(|&i| result_of(i) != "applied")
        .collect();
    for &i in &absent {
        assert_eq!(result_of(i), "offline", "{report}");
    }
    assert!(!absent.is_empty(), "none of gw17..gw20 was away: {report}");
    eprintln!("away during the rollout: {} of gw17..gw20", absent.len());

    // Drift while they are away.
    let table = ls(&up);
    for r in &table {
        let i: usize = r["id"].as_str().unwrap()[2..].parse().unwrap();
        assert_eq!(r["desired_id"], 1, "{r}");
        if absent.contains(&i) {
            assert_eq!(
                (r["state"].as_str(), &r["config_id"], &r["drift"]),
                (Some("offline"), &Value::Null, &Value::Bool(true)),
                "{r}"
            );
        } else {
            assert_eq!(
                (&r["config_id"], &r["drift"]),
                (&Value::from(1), &Value::Bool(false)),
                "{r}"
            );
        }
    }
    let o = support::tidemark()
        .args(["fleet", "ls", "--url", &up.url(), "--wait-s", "1"])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(t.contains("DESIRED ID") && t.contains("1 drift"), "{t}");

    // Back again: they take the desired document with no new push.
    let before = results.on("/config/result").len();
    for &i in &away {
        let n = &mut nodes[i - 1];
        n.proc = Some(Gateway::start(&n.config, &n.log));
    }
    wait_until(
        Duration::from_secs(60),
        "the returning gateways on document 1",
        || {
            away.iter().all(|&i| {
                let s = latest(&statuses, &gw(i));
                s["state"] == "online" && s["config_id"] == 1
            })
        },
    );
    let converged: Vec<Value> = results
        .on("/config/result")
        .iter()
        .skip(before)
        .map(Seen::json)
        .collect();
    assert_eq!(converged.len(), absent.len(), "{converged:?}");
    assert!(
        converged
            .iter()
            .all(|r| r["id"] == 1 && r["result"] == "applied"),
        "{converged:?}"
    );
    for &i in &away {
        let remote =
            std::fs::read_to_string(d.join(format!("{}-state/remote.toml", gw(i)))).unwrap();
        assert!(remote.contains("# id = 1\n"), "{remote}");
    }
    let table = ls(&up);
    assert_eq!(table.len(), N);
    assert!(
        table
            .iter()
            .all(|r| r["drift"] == false && r["config_id"] == 1),
        "{table:?}"
    );

    // A document that breaks the source: the canaries roll back, the rollout stops.
    let doc2 = d.join("doc2.toml");
    std::fs::write(
        &doc2,
        format!("[source]\nurl = \"mqtt://127.0.0.1:{}\"\n", free_port()),
    )
    .unwrap();
    let before = results.on("/config/result").len();
    let out = rollout_cmd(&up, &key, 2, &doc2).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("the JSON report");
    assert_eq!(
        (&report["stopped"], &report["desired"]),
        (&Value::Bool(true), &Value::Bool(false)),
        "{report}"
    );
    let rows = report["gateways"].as_array().unwrap();
    for r in rows {
        if r["gateway"] == "gw01" || r["gateway"] == "gw02" {
            assert_eq!(r["result"], "rolled_back", "{r}");
            assert_eq!(
                r["errors"],
                serde_json::json!(["not_connected: source"]),
                "{r}"
            );
        } else {
            assert_eq!(r["result"], "not_pushed", "{r}");
        }
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stopping the rollout"), "{stderr}");
    // The command saw both answers; the collector's copies may still be on their way.
    let answered = || -> Vec<String> {
        results
            .on("/config/result")
            .iter()
            .skip(before)
            .map(|s| s.topic.clone())
            .collect()
    };
    wait_until(Duration::from_secs(30), "the canaries' answers", || {
        answered().len() >= 2
    });
    let answered = answered();
    assert_eq!(answered.len(), 2, "{answered:?}");
    assert!(
        answered
            .iter()
            .all(|t| t.contains("/gw01/") || t.contains("/gw02/")),
        "{answered:?}"
    );
    // Nobody else touched; the desired state stays document 1.
    for i in 3..=N {
        assert_eq!(latest(&statuses, &gw(i))["config_id"], 1);
    }
    let desired = retained(up.port, "tidemark/gw07/config/desired");
    assert_eq!(
        desired.last().map(|s| s.json()["id"].clone()),
        Some(Value::from(1))
    );
    for n in &mut nodes {
        n.proc.take().unwrap().terminate();
    }
}
