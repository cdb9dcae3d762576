//! The remote-configuration harness (tests/fleet_remote.rs): gateways under a
//! fleet, `fleet push`/`ls` run as a user would, raw documents on the topics.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::fleet::FLEET;
use super::*;

pub const CONFIRM_S: u64 = 4;

pub fn run_tidemark(args: &[&str]) -> std::process::Output {
    super::tidemark().args(args).output().expect("tidemark")
}

pub fn text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub struct Gw {
    pub id: &'static str,
    pub config: PathBuf,
    pub log: PathBuf,
    pub proc: Option<Gateway>,
}

impl Gw {
    pub fn new(
        dir: &Path,
        id: &'static str,
        (site, up): (&Mosquitto, &Mosquitto),
        keys: &[&Path],
        fleet_extra: &str,
    ) -> Self {
        let config = dir.join(format!("{id}.toml"));
        super::fleet::remote_config(dir, id, (site, up), keys, CONFIRM_S)
            .set("gateway", "commit_interval_ms = 100")
            .set("fleet", fleet_extra)
            .merge("fleet", FLEET)
            .write(&config);
        let log = dir.join(format!("{id}.log"));
        let proc = Some(Gateway::start(&config, &log));
        Self {
            id,
            config,
            log,
            proc,
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.as_ref().expect("running").child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Readings of the device fleet counted upstream (window results deduplicated by id).
pub fn counted(up: &Collector) -> u64 {
    final_windows(&up.on("/windows/"))
        .values()
        .filter(|w| w["group"] == "fleet")
        .map(|w| w["count"].as_u64().unwrap_or(0))
        .sum()
}

/// The retained `P/status` of `gw`.
pub fn status(up: &Mosquitto, gw: &str) -> Value {
    retained(up.port, &format!("tidemark/{gw}/status"))
        .last()
        .map(Seen::json)
        .unwrap_or(Value::Null)
}

/// `tidemark fleet push` of `doc` as document `id` for `gw`, signed with `key`.
pub fn push_cmd(
    url: &str,
    key: &Path,
    gw: &str,
    id: u64,
    doc: &Path,
    timeout_s: u32,
) -> std::process::Output {
    run_tidemark(&[
        "fleet",
        "push",
        "--url",
        url,
        "--key",
        &key.display().to_string(),
        "--gateway",
        gw,
        "--id",
        &id.to_string(),
        "--timeout-s",
        &timeout_s.to_string(),
        &doc.display().to_string(),
    ])
}

/// `fleet push`: its exit code and the result it printed.
pub fn push(up: &Mosquitto, key: &Path, gw: &str, id: u64, doc: &Path) -> (i32, Value) {
    let o = push_cmd(&up.url(), key, gw, id, doc, 30);
    let r = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert!(r.is_object(), "{}", text(&o));
    (o.status.code().unwrap_or(-1), r)
}

/// Publishes a raw `P/config/set` message and waits for the result with `id`.
pub fn send_raw(up: &Mosquitto, results: &Collector, gw: &str, id: u64, msg: &[u8]) -> Value {
    let before = results.on(&format!("{gw}/config/result")).len();
    let mut p = Publisher::connect(up.port, &format!("raw-{gw}-{id}-{}", free_port()));
    p.send(&format!("tidemark/{gw}/config/set"), msg);
    p.flush();
    let mut found = Value::Null;
    wait_until(Duration::from_secs(30), "a config result", || {
        found = results
            .on(&format!("{gw}/config/result"))
            .iter()
            .skip(before)
            .map(Seen::json)
            .find(|r| r["id"] == id)
            .unwrap_or(Value::Null);
        found.is_object()
    });
    found
}

pub fn ls(up: &Mosquitto) -> Vec<Value> {
    let o = run_tidemark(&[
        "fleet",
        "ls",
        "--url",
        &up.url(),
        "--json",
        "--wait-s",
        "10",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice::<Vec<Value>>(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

pub fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).expect("doc");
    p
}
