//! The network-fault harness (tests/netfault.rs): the gateway in its own network
//! namespace behind nftables, a QoS 1 fleet, the site's brokers and collector.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Collector, Gateway, Mosquitto, Publisher, Seen, now_ms, wait_or_explain};

pub const DEVICES: u64 = 30;
pub const WINDOW_MS: i64 = 10_000;

/// Runs a command that must succeed.
pub fn sh(cmd: &str, args: &[&str]) {
    let out = Command::new(super::which(cmd))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace for the gateway and a veth pair to this host.
pub struct Net {
    pub ns: String,
    pub host_if: String,
    pub host_ip: String,
}

impl Net {
    pub fn new(k: u8) -> Self {
        let id = std::process::id() % 10_000;
        let ns = format!("tmgw{id}-{k}");
        let host_if = format!("tmh{id}-{k}");
        let gw_if = format!("tmg{id}-{k}");
        // A /30 of the test's own: one per scenario of this binary.
        let sub = 200 + u32::from(k);
        let host_ip = format!("10.231.{sub}.1");
        let gw_ip = format!("10.231.{sub}.2");
        // Left over by a killed run.
        let quiet = |args: &[&str]| {
            let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
        };
        quiet(&["netns", "del", &ns]);
        quiet(&["link", "del", &host_if]);
        sh("ip", &["netns", "add", &ns]);
        sh(
            "ip",
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &gw_if,
            ],
        );
        sh("ip", &["link", "set", &gw_if, "netns", &ns]);
        sh(
            "ip",
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if],
        );
        sh("ip", &["link", "set", &host_if, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &ns, "ip"];
            all.extend_from_slice(args);
            sh("ip", &all);
        };
        inside(&["addr", "add", &format!("{gw_ip}/30"), "dev", &gw_if]);
        inside(&["link", "set", &gw_if, "up"]);
        inside(&["link", "set", "lo", "up"]);
        let net = Self {
            ns,
            host_if,
            host_ip,
        };
        net.nft(
            "add table inet tm\n\
             add chain inet tm input { type filter hook input priority 0; }\n\
             add chain inet tm output { type filter hook output priority 0; }\n",
        );
        net
    }

    pub fn nft(&self, script: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(super::which("nft"))
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nft");
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(script.as_bytes())
                .expect("nft script");
        }
        let out = child.wait_with_output().expect("nft");
        assert!(
            out.status.success(),
            "nft: {}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every packet to and from the broker on `port` dropped, silently.
    pub fn blackhole(&self, port: u16) {
        self.nft(&format!(
            "add rule inet tm input tcp sport {port} drop\n\
             add rule inet tm output tcp dport {port} drop\n"
        ));
    }

    /// `pct` % of the packets of both directions of every link dropped.
    pub fn loss(&self, pct: u32) {
        self.nft(&format!(
            "add rule inet tm input meta l4proto tcp numgen random mod 100 < {pct} drop\n\
             add rule inet tm output meta l4proto tcp numgen random mod 100 < {pct} drop\n"
        ));
    }

    /// Counts the bytes of the link to the broker on `port`, both directions.
    pub fn count(&self, port: u16) {
        self.nft(&format!(
            "add rule inet tm input tcp sport {port} counter\n\
             add rule inet tm output tcp dport {port} counter\n"
        ));
    }

    /// Bytes the counters of [`Net::count`] saw (IP packets, headers included).
    pub fn counted(&self) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(super::which("nft"))
            .args(["list", "table", "inet", "tm"])
            .output()
            .expect("nft list");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "bytes")
            .filter_map(|w| w[1].parse::<u64>().ok())
            .sum()
    }

    /// Every fault lifted.
    pub fn heal(&self) {
        self.nft("flush chain inet tm input\nflush chain inet tm output\n");
    }

    /// `tidemark run` inside the namespace.
    pub fn gateway(&self, config: &Path, log: &Path) -> Gateway {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("gateway log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(super::tidemark_argv())
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("start tidemark");
        Gateway::adopt(child, log)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        // Gone with the namespace's end of the pair, usually.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
    }
}

/// A fleet of [`DEVICES`] publishing one QoS 1 reading per second each until stopped;
/// remembers every reading's window.
pub struct Fleet {
    pub stop: Arc<AtomicBool>,
    pub sent: Arc<Mutex<BTreeMap<String, u64>>>,
    pub last_ts: Arc<Mutex<BTreeMap<String, i64>>>,
    pub thread: Option<std::thread::JoinHandle<Publisher>>,
}

impl Fleet {
    pub fn start(port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(BTreeMap::new()));
        let last_ts = Arc::new(Mutex::new(BTreeMap::new()));
        let mut p = Publisher::connect(port, &format!("netfault-fleet-{port}"));
        let (st, se, la) = (stop.clone(), sent.clone(), last_ts.clone());
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut seq = 0u64;
            while !st.load(Ordering::Relaxed) {
                for d in 0..DEVICES {
                    let ts = now_ms();
                    let body = format!(r#"{{"ts": {ts}, "seq": {seq}, "temp": {d}.5}}"#);
                    let (group, device) = (format!("g{}", d % 3), format!("d{d}"));
                    p.send(
                        &format!("sensors/{group}/{device}/reading"),
                        body.as_bytes(),
                    );
                    let start_ms = ts.div_euclid(WINDOW_MS) * WINDOW_MS;
                    *se.lock()
                        .expect("lock")
                        .entry(format!("\"{group}\"/\"{device}\"/{start_ms}"))
                        .or_insert(0) += 1;
                    la.lock().expect("lock").insert(device, ts);
                }
                seq += 1;
                // Paced by the clock, not by sleeps that add up.
                let next = start + Duration::from_secs(seq);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            p
        });
        Self {
            stop,
            sent,
            last_ts,
            thread: Some(thread),
        }
    }

    /// Stops publishing and waits for every PUBACK; readings sent per window key.
    pub fn stop(&mut self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        let p = self
            .thread
            .take()
            .expect("fleet")
            .join()
            .expect("fleet thread");
        p.flush();
        self.sent.lock().expect("lock").clone()
    }
}

/// The site: brokers on this host, the gateway in its namespace, a collector upstream.
pub struct Site {
    pub net: Net,
    pub source: Mosquitto,
    pub sink: Mosquitto,
    pub up: Collector,
    pub gw: Option<Gateway>,
    pub log: PathBuf,
    pub _dir: tempfile::TempDir,
}

impl Site {
    pub fn start(k: u8, source_extra: &str) -> Self {
        let net = Net::new(k);
        let source = Mosquitto::start_on(false, &net.host_ip);
        let sink = Mosquitto::start_on(false, &net.host_ip);
        let up = Collector::start(sink.port, "tidemark/gw/#", &format!("netfault-up-{k}"));
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("gateway.toml");
        std::fs::write(
            &cfg,
            format!(
                "[gateway]\nid = \"gw\"\nstate_dir = \"{state}\"\ncommit_interval_ms = 200\n\
                 [source]\nurl = \"mqtt://{ip}:{sp}\"\nclient_id = \"gw-in-{k}\"\n{source_extra}\n\
                 [time]\npolicy = \"device\"\n\
                 [group_defaults]\nwindow = {{ kind = \"tumbling\", size_ms = {WINDOW_MS} }}\n\
                 [sink]\nurl = \"mqtt://{ip}:{kp}\"\nclient_id = \"gw-out-{k}\"\n\
                 [metrics]\ninterval_s = 1\n",
                state = dir.path().join("state").display(),
                ip = net.host_ip,
                sp = source.port,
                kp = sink.port,
            ),
        )
        .expect("config");
        let log = dir.path().join("gw.log");
        let gw = net.gateway(&cfg, &log);
        Self {
            net,
            source,
            sink,
            up,
            gw: Some(gw),
            log,
            _dir: dir,
        }
    }

    /// SIGTERM: a clean stop.
    pub fn stop(&mut self) {
        if let Some(gw) = self.gw.take() {
            let (code, _) = gw.terminate();
            assert_eq!(code, Some(0), "gateway exit:\n{}", self.log_text());
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `needle` more than `before` times; how long that took.
    pub fn wait_log(&self, needle: &str, before: usize, limit: Duration) -> Duration {
        let start = Instant::now();
        wait_or_explain(
            limit,
            || self.log_text().matches(needle).count() > before,
            || format!("no {needle:?} in the gateway log:\n{}", self.log_text()),
        );
        start.elapsed()
    }

    /// Every group has a watermark and window results flow upstream.
    pub fn warm_up(&self, what: &str) {
        wait_or_explain(
            Duration::from_secs(60),
            || self.watermarks().len() == 3 && !self.up.on("/windows/").is_empty(),
            || format!("{what}: no watermarks or results yet\n{}", self.log_text()),
        );
    }

    /// Every group's watermark within a few seconds of the fleet's present again.
    pub fn wait_caught_up(&self, what: &str) {
        wait_or_explain(
            Duration::from_secs(120),
            || {
                let w = self.watermarks();
                let now = now_ms();
                w.len() == 3 && w.values().all(|&w| w >= now - 6_000)
            },
            || format!("{what}: not caught up: {:?}", self.watermarks()),
        );
    }

    /// The group watermarks of the newest `P/metrics` (group -> W).
    pub fn watermarks(&self) -> BTreeMap<String, i64> {
        latest_metrics(&self.up.all())
    }
}

/// The group watermarks of the newest `P/metrics` received at or before `until`.
pub fn watermarks_at(seen: &[Seen], until: i64) -> BTreeMap<String, i64> {
    seen.iter()
        .rfind(|s| s.topic == "tidemark/gw/metrics" && s.at <= until)
        .map(|s| groups_w(&s.json()))
        .unwrap_or_default()
}

pub fn latest_metrics(seen: &[Seen]) -> BTreeMap<String, i64> {
    watermarks_at(seen, i64::MAX)
}

pub fn groups_w(m: &serde_json::Value) -> BTreeMap<String, i64> {
    m["groups"]
        .as_object()
        .map(|g| {
            g.iter()
                .filter_map(|(k, v)| v["watermark"].as_i64().map(|w| (k.clone(), w)))
                .collect()
        })
        .unwrap_or_default()
}

/// What one scenario measured.
pub struct Outcome {
    pub seen: Vec<Seen>,
}

/// Waits for the fleet's last windows to close (the devices idle, W runs on), then
/// checks exactly-once, no late readings, no offline alert.
pub fn settle_and_check(site: &mut Site, fleet: &mut Fleet, what: &str) -> Outcome {
    let sent = fleet.stop();
    let total: u64 = sent.values().sum();
    let last_start = sent
        .keys()
        .filter_map(|k| k.rsplit('/').next()?.parse::<i64>().ok())
        .max()
        .unwrap_or(0);
    let caught_up = Instant::now();
    wait_or_explain(
        Duration::from_secs(180),
        || {
            let w = site.watermarks();
            w.len() == 3 && w.values().all(|&w| w >= last_start + WINDOW_MS)
        },
        || {
            format!(
                "{what}: the groups' watermarks did not pass the last window: {:?}\n{}",
                site.watermarks(),
                site.log_text()
            )
        },
    );
    // The last results are published by the tick that moved W; give them the uplink's round trip.
    let want_windows = sent.len();
    let _ = wait_until_quiet(site, want_windows);
    eprintln!(
        "{what}: {total} readings sent; last windows closed {:.1} s after the fleet stopped",
        caught_up.elapsed().as_secs_f64()
    );
    let seen = site.up.all();
    let finals = super::final_windows(&seen);
    let mut counted = 0u64;
    let mut wrong = Vec::new();
    for (key, n) in &sent {
        let got = finals
            .get(key)
            .and_then(|v| v["count"].as_u64())
            .unwrap_or(0);
        counted += got;
        if got != *n {
            wrong.push(format!("{key}: sent {n}, counted {got}"));
        }
    }
    let extra: Vec<_> = finals.keys().filter(|k| !sent.contains_key(*k)).collect();
    let late = seen.iter().filter(|s| s.topic.contains("/late/")).count();
    let offline: Vec<String> = seen
        .iter()
        .filter(|s| s.topic.starts_with("tidemark/gw/alerts/") && s.json()["type"] == "offline")
        .map(|s| String::from_utf8_lossy(&s.payload).into_owned())
        .collect();
    let revisions = seen
        .iter()
        .filter(|s| s.topic.contains("/windows/") && s.json()["revision"].as_u64() > Some(0))
        .count();
    eprintln!(
        "{what}: counted {counted} of {total}; {} windows; {revisions} revisions; {late} late; {} offline alerts",
        finals.len(),
        offline.len()
    );
    assert!(
        wrong.is_empty() && extra.is_empty(),
        "{what}: readings not counted exactly once:\n{}\nwindows nobody sent: {extra:?}",
        wrong.join("\n")
    );
    assert_eq!(counted, total, "{what}: readings counted");
    assert_eq!(late, 0, "{what}: late readings");
    assert!(
        offline.is_empty(),
        "{what}: false offline alerts: {offline:?}"
    );
    Outcome { seen }
}

/// Waits until the collector has results for `windows` windows (bounded).
pub fn wait_until_quiet(site: &Site, windows: usize) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if super::final_windows(&site.up.all()).len() >= windows {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}
