//! What the gateway tests share: a config file for a source and a sink broker,
//! a reading's payload, and a fleet whose totals are checked exactly upstream.

use std::path::Path;
use std::time::Duration;

use super::{Collector, Mosquitto, Publisher, final_windows, now_ms, wait_or_explain};

pub const MIN: Duration = Duration::from_secs(60);

/// A gateway `gw` with its state in `dir/state`; `extra` follows `[metrics]`
/// (keys there, then whole sections).
pub fn write_config(
    dir: &Path,
    source: &Mosquitto,
    sink: &Mosquitto,
    extra: &str,
) -> std::path::PathBuf {
    super::GatewayConfig::new("gw", &dir.join("state"), source, sink)
        .merge("metrics", extra)
        .write(&dir.join("gateway.toml"))
}

/// Gateway `id` taking signed documents (docs/reference.md#remote-configuration-fleet) from keys in these public key
/// files, its state in `dir/{id}-state`, its MQTT client ids its own.
pub fn remote_config(
    dir: &Path,
    id: &str,
    (site, up): (&Mosquitto, &Mosquitto),
    keys: &[&Path],
    confirm_s: u64,
) -> super::GatewayConfig {
    let keys: Vec<String> = keys
        .iter()
        .map(|k| format!("{:?}", k.display().to_string()))
        .collect();
    super::GatewayConfig::new(id, &dir.join(format!("{id}-state")), site, up)
        .set("source", &format!("client_id = \"{id}-in\""))
        .set("sink", &format!("client_id = \"{id}-out\""))
        .set("fleet", "enabled = true")
        .set("fleet", &format!("trusted_keys = [{}]", keys.join(", ")))
        .set("fleet", &format!("confirm_s = {confirm_s}"))
}

/// `tidemark fleet keygen --out FILE`, which must succeed; FILE.pub is the public key.
pub fn keygen(out: &Path) {
    let o = super::tidemark()
        .args(["fleet", "keygen", "--out"])
        .arg(out)
        .output()
        .expect("tidemark fleet keygen");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

pub fn reading(ts: i64, seq: u64, temp: f64) -> Vec<u8> {
    format!(r#"{{"ts": {ts}, "seq": {seq}, "temp": {temp}, "hum": 40}}"#).into_bytes()
}

pub const DEVICE_POLICY: &str = "[time]\npolicy = \"device\"\n\
    [group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 10000 }\n\
    out_of_orderness_ms = 0\nidle_timeout_ms = 1500\nheartbeat_timeout_ms = 20000\n\
    allowed_lateness_ms = 5000\n";

pub const FLEET: &str = "[time]\npolicy = \"device\"\n\
    [group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 2000 }\n\
    out_of_orderness_ms = 0\nidle_timeout_ms = 1000\nheartbeat_timeout_ms = 3600000\n\
    allowed_lateness_ms = 600000\n";

/// A fleet of `devices` sending `per_device` readings 100 ms apart (device time), 30 min ago.
pub struct Fleet {
    pub devices: u64,
    pub per_device: u64,
    pub base: i64,
    pub next: u64,
}

impl Fleet {
    pub fn new(devices: u64, per_device: u64) -> Self {
        Self {
            devices,
            per_device,
            base: (now_ms() - 30 * 60_000) / 2000 * 2000,
            next: 0,
        }
    }

    pub fn total(&self) -> u64 {
        self.devices * self.per_device
    }

    /// Publishes the next `n` readings (round-robin over devices); false when all are out.
    pub fn send(&mut self, p: &mut Publisher, n: u64) -> bool {
        for _ in 0..n {
            if self.next >= self.total() {
                return false;
            }
            let (k, d) = (self.next / self.devices, self.next % self.devices);
            let ts = self.base + i64::try_from(k).unwrap_or(0) * 100 + 50;
            p.send(&format!("sensors/fleet/d{d}/reading"), &reading(ts, k, 1.0));
            self.next += 1;
        }
        self.next < self.total()
    }
}

pub fn counted(up: &Collector) -> u64 {
    final_windows(&up.on("/windows/"))
        .values()
        .map(|w| w["count"].as_u64().unwrap_or(0))
        .sum()
}

pub fn wait_counted(fleet: &Fleet, up: &Collector, log: &Path, limit: Duration) {
    wait_or_explain(
        limit,
        || counted(up) >= fleet.total(),
        || {
            format!(
                "counted {} of {} readings upstream\n{}",
                counted(up),
                fleet.total(),
                std::fs::read_to_string(log).unwrap_or_default()
            )
        },
    );
}

pub fn assert_exact(fleet: &Fleet, up: &Collector) {
    let windows = final_windows(&up.on("/windows/"));
    let sum: u64 = windows
        .values()
        .map(|w| w["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        sum,
        fleet.total(),
        "readings counted upstream (deduplicated by id)"
    );
    // 100 ms apart in 2 s windows: 20 readings in every full window.
    let full = fleet.per_device / 20;
    for d in 0..fleet.devices {
        for w in 0..full {
            let key = format!(
                "\"fleet\"/\"d{d}\"/{}",
                fleet.base + i64::try_from(w).unwrap_or(0) * 2000
            );
            assert_eq!(
                windows.get(&key).map(|v| v["count"].as_u64()),
                Some(Some(20)),
                "window {key}"
            );
        }
    }
    assert!(up.on("/late/").is_empty(), "nothing late");
}
