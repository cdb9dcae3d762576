//! Network faults no RST reveals (SPEC §5 "Processing time needs a proven path"):
//! the gateway runs in its own network namespace, joined to this host by a veth
//! pair; nftables in that namespace drops the packets of one link or both
//! (a blackhole: a dead switch port, a NAT that forgot the flow), or a share of
//! them (loss). A QoS 1 fleet of 30 devices keeps publishing into the site
//! broker throughout. Every reading must be counted exactly once, none late, no
//! device falsely offline, no window result sent while the gateway is blind.
//! Needs root, `ip` (iproute2) and `nft` (nftables): `scripts/test.sh` installs them.
#![allow(clippy::disallowed_methods)]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Collector, Gateway, Mosquitto, Publisher, Seen, now_ms, wait_or_explain};

const DEVICES: u64 = 30;
const WINDOW_MS: i64 = 10_000;

/// Runs a command that must succeed.
fn sh(cmd: &str, args: &[&str]) {
    let out = Command::new(support::which(cmd))
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
struct Net {
    ns: String,
    host_if: String,
    host_ip: String,
}

impl Net {
    fn new(k: u8) -> Self {
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

    fn nft(&self, script: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(support::which("nft"))
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
    fn blackhole(&self, port: u16) {
        self.nft(&format!(
            "add rule inet tm input tcp sport {port} drop\n\
             add rule inet tm output tcp dport {port} drop\n"
        ));
    }

    /// `pct` % of the packets of both directions of every link dropped.
    fn loss(&self, pct: u32) {
        self.nft(&format!(
            "add rule inet tm input meta l4proto tcp numgen random mod 100 < {pct} drop\n\
             add rule inet tm output meta l4proto tcp numgen random mod 100 < {pct} drop\n"
        ));
    }

    /// Counts the bytes of the link to the broker on `port`, both directions.
    fn count(&self, port: u16) {
        self.nft(&format!(
            "add rule inet tm input tcp sport {port} counter\n\
             add rule inet tm output tcp dport {port} counter\n"
        ));
    }

    /// Bytes the counters of [`Net::count`] saw (IP packets, headers included).
    fn counted(&self) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(support::which("nft"))
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
    fn heal(&self) {
        self.nft("flush chain inet tm input\nflush chain inet tm output\n");
    }

    /// `tidemark run` inside the namespace.
    fn gateway(&self, config: &Path, log: &Path) -> Gateway {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("gateway log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(support::tidemark_argv())
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
struct Fleet {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<BTreeMap<String, u64>>>,
    last_ts: Arc<Mutex<BTreeMap<String, i64>>>,
    thread: Option<std::thread::JoinHandle<Publisher>>,
}

impl Fleet {
    fn start(port: u16) -> Self {
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
    fn stop(&mut self) -> BTreeMap<String, u64> {
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
struct Site {
    net: Net,
    source: Mosquitto,
    sink: Mosquitto,
    up: Collector,
    gw: Option<Gateway>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Site {
    fn start(k: u8, source_extra: &str) -> Self {
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
    fn stop(&mut self) {
        if let Some(gw) = self.gw.take() {
            let (code, _) = gw.terminate();
            assert_eq!(code, Some(0), "gateway exit:\n{}", self.log_text());
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `needle` more than `before` times; how long that took.
    fn wait_log(&self, needle: &str, before: usize, limit: Duration) -> Duration {
        let start = Instant::now();
        wait_or_explain(
            limit,
            || self.log_text().matches(needle).count() > before,
            || format!("no {needle:?} in the gateway log:\n{}", self.log_text()),
        );
        start.elapsed()
    }

    /// Every group has a watermark and window results flow upstream.
    fn warm_up(&self, what: &str) {
        wait_or_explain(
            Duration::from_secs(60),
            || self.watermarks().len() == 3 && !self.up.on("/windows/").is_empty(),
            || format!("{what}: no watermarks or results yet\n{}", self.log_text()),
        );
    }

    /// Every group's watermark within a few seconds of the fleet's present again.
    fn wait_caught_up(&self, what: &str) {
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
    fn watermarks(&self) -> BTreeMap<String, i64> {
        latest_metrics(&self.up.all())
    }
}

/// The group watermarks of the newest `P/metrics` received at or before `until`.
fn watermarks_at(seen: &[Seen], until: i64) -> BTreeMap<String, i64> {
    seen.iter()
        .rfind(|s| s.topic == "tidemark/gw/metrics" && s.at <= until)
        .map(|s| groups_w(&s.json()))
        .unwrap_or_default()
}

fn latest_metrics(seen: &[Seen]) -> BTreeMap<String, i64> {
    watermarks_at(seen, i64::MAX)
}

fn groups_w(m: &serde_json::Value) -> BTreeMap<String, i64> {
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
struct Outcome {
    seen: Vec<Seen>,
}

/// Waits for the fleet's last windows to close (the devices idle, W runs on), then
/// checks exactly-once, no late readings, no offline alert.
fn settle_and_check(site: &mut Site, fleet: &mut Fleet, what: &str) -> Outcome {
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
    let finals = support::final_windows(&seen);
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
fn wait_until_quiet(site: &Site, windows: usize) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if support::final_windows(&site.up.all()).len() >= windows {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// The source link blackholed for `blind_s` while the fleet publishes: the gateway
/// notices within about `probe_after_ms + probe_timeout_ms`, holds processing time at
/// the last proof (W moves no further, no result goes out, nobody goes idle or
/// offline), and after the link returns every reading is counted exactly once.
fn source_blackhole(k: u8, keep_alive_s: u64, blind_s: u64) {
    let what = format!("source blackholed {blind_s} s, keep_alive_s {keep_alive_s}");
    let mut site = Site::start(k, &format!("keep_alive_s = {keep_alive_s}"));
    let mut fleet = Fleet::start(site.source.port);
    site.warm_up(&what);
    let downs = site.log_text().matches("source_path_down").count();
    let blind_from = now_ms();
    site.net.blackhole(site.source.port);
    let noticed = site.wait_log("source_path_down", downs, Duration::from_secs(blind_s));
    eprintln!("{what}: noticed after {:.2} s", noticed.as_secs_f64());
    let rest = Duration::from_secs(blind_s).saturating_sub(noticed);
    std::thread::sleep(rest);
    let blind_to = now_ms();
    site.net.heal();
    let healed = Instant::now();
    let subscribed = site.log_text().matches("source subscribed").count();
    site.wait_log("source subscribed", subscribed, Duration::from_secs(60));
    // Caught up: every group's W within a window of the fleet's present.
    site.wait_caught_up(&what);
    eprintln!(
        "{what}: caught up {:.2} s after the link returned",
        healed.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(5));
    let out = settle_and_check(&mut site, &mut fleet, &what);

    // W during the blind time: no further than the last proof (a few seconds).
    let before = watermarks_at(&out.seen, blind_from);
    let during: Vec<BTreeMap<String, i64>> = out
        .seen
        .iter()
        .filter(|s| s.topic == "tidemark/gw/metrics" && s.at > blind_from && s.at <= blind_to)
        .map(|s| groups_w(&s.json()))
        .collect();
    assert!(
        !during.is_empty(),
        "{what}: no metrics during the blind time"
    );
    let advance = during
        .iter()
        .flat_map(|m| {
            m.iter()
                .map(|(g, w)| w - before.get(g).copied().unwrap_or(*w))
        })
        .max()
        .unwrap_or(0);
    eprintln!("{what}: watermark advanced {advance} ms while blind");
    assert!(
        advance <= 6000,
        "{what}: the watermark advanced {advance} ms while the gateway could see nothing"
    );
    // No result while blind (past the first seconds, which the last proof covers).
    let blind_results: Vec<&Seen> = out
        .seen
        .iter()
        .filter(|s| s.topic.contains("/windows/") && s.at > blind_from + 6000 && s.at <= blind_to)
        .collect();
    assert!(
        blind_results.is_empty(),
        "{what}: {} window results sent while blind, e.g. {}",
        blind_results.len(),
        String::from_utf8_lossy(&blind_results[0].payload)
    );
    site.stop();
}

#[test]
fn source_blackholed_45_s_with_the_defaults() {
    source_blackhole(1, 30, 45);
}

#[test]
fn source_blackholed_75_s_with_a_cellular_keep_alive() {
    source_blackhole(2, 60, 75);
}

#[test]
fn source_blackholed_120_s() {
    source_blackhole(3, 30, 120);
}

/// The uplink blackholed 45 s: noticed within seconds (`connected.sink` false), the
/// outbox holds everything, and it all arrives once the link returns.
#[test]
fn uplink_blackholed_45_s() {
    let what = "uplink blackholed 45 s";
    let mut site = Site::start(4, "");
    let mut fleet = Fleet::start(site.source.port);
    site.warm_up(what);
    let downs = site.log_text().matches("sink_path_down").count();
    site.net.blackhole(site.sink.port);
    let noticed = site.wait_log("sink_path_down", downs, Duration::from_secs(45));
    eprintln!("{what}: noticed after {:.2} s", noticed.as_secs_f64());
    std::thread::sleep(Duration::from_secs(45).saturating_sub(noticed));
    let connects = site.log_text().matches("sink connected").count();
    site.net.heal();
    let healed = Instant::now();
    site.wait_log("sink connected", connects, Duration::from_secs(60));
    eprintln!(
        "{what}: uplink back {:.2} s after the link returned",
        healed.elapsed().as_secs_f64()
    );
    settle_and_check(&mut site, &mut fleet, what);
    site.stop();
}

/// 10 % of the packets lost on both links for the whole run.
#[test]
fn ten_percent_loss_on_both_links() {
    let what = "10 % loss on both links";
    let mut site = Site::start(5, "");
    site.net.loss(10);
    let mut fleet = Fleet::start(site.source.port);
    std::thread::sleep(Duration::from_secs(60));
    let downs = site.log_text().matches("path_down").count();
    eprintln!("{what}: links found dead meanwhile: {downs}");
    site.net.heal();
    settle_and_check(&mut site, &mut fleet, what);
    site.stop();
}

/// Both links blackholed 5 times for 3–8 s each.
#[test]
fn both_links_flapping() {
    let what = "both links flapping";
    let mut site = Site::start(6, "");
    let mut fleet = Fleet::start(site.source.port);
    site.warm_up(what);
    for (i, s) in [3u64, 8, 5, 4, 7].iter().enumerate() {
        site.net.blackhole(site.source.port);
        site.net.blackhole(site.sink.port);
        std::thread::sleep(Duration::from_secs(*s));
        site.net.heal();
        let since = Instant::now();
        // Up again (both links) before the next flap, however long reconnecting takes.
        site.wait_caught_up(&format!("{what}: flap {i}"));
        eprintln!(
            "{what}: flap {i} ({s} s) caught up {:.2} s after the link returned",
            since.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(4));
    }
    let log = site.log_text();
    eprintln!(
        "{what}: source_path_down {}, sink_path_down {}",
        log.matches("source_path_down").count(),
        log.matches("sink_path_down").count()
    );
    settle_and_check(&mut site, &mut fleet, what);
    site.stop();
}

/// A site that really goes quiet (every device stops, the path is fine): probes
/// come back, processing time runs, the devices go idle and offline on time.
#[test]
fn a_quiet_site_still_goes_idle_and_offline_on_time() {
    let what = "quiet site";
    let mut site = Site::start(7, "");
    let mut fleet = Fleet::start(site.source.port);
    std::thread::sleep(Duration::from_secs(15));
    let _ = fleet.stop();
    let last_ts = fleet.last_ts.lock().expect("lock").clone();
    // The site link's traffic while nothing arrives: probes (and keep-alive pings).
    std::thread::sleep(Duration::from_secs(2));
    site.net.count(site.source.port);
    std::thread::sleep(Duration::from_secs(30));
    let bytes = site.net.counted();
    eprintln!(
        "{what}: site link traffic while quiet: {bytes} bytes in 30 s = {:.1} bytes/s (IP packets, both directions)",
        bytes as f64 / 30.0
    );
    // heartbeat_timeout_ms (60 s) past each device's last reading, on W: idle at 30 s,
    // then W runs at the gateway clock's pace (SPEC §5, §7).
    wait_or_explain(
        Duration::from_secs(150),
        || {
            site.up
                .all()
                .iter()
                .filter(|s| {
                    s.topic.starts_with("tidemark/gw/alerts/") && s.json()["type"] == "offline"
                })
                .count()
                >= DEVICES as usize
        },
        || format!("{what}: not every device went offline\n{}", site.log_text()),
    );
    let seen = site.up.all();
    let mut worst = 0i64;
    for s in seen
        .iter()
        .filter(|s| s.topic.starts_with("tidemark/gw/alerts/") && s.json()["type"] == "offline")
    {
        let v = s.json();
        let device = v["device"].as_str().expect("device").to_string();
        let last = last_ts[&device];
        // Due when the all-idle W (last arrival + elapsed − idle − out_of_orderness)
        // reaches last_seen + heartbeat_timeout: elapsed = 60 + 30 + 2 s.
        let due = last + 92_000;
        let at = v["at"].as_i64().expect("at");
        worst = worst.max(at - due);
    }
    eprintln!("{what}: offline alerts at most {worst} ms after due");
    assert!(
        worst <= 4_000,
        "{what}: offline alerts {worst} ms late (processing time must run while probes return)"
    );
    assert_eq!(
        site.log_text().matches("source_path_down").count(),
        0,
        "{what}: a quiet but healthy path was taken for a dead one"
    );
    site.stop();
}

/// A site broker whose ACL refuses the probe topic: a clear start-up error naming
/// it (exit 1), not a gateway that reconnects forever (SPEC §5): the publish
/// refused (the v5 PUBACK of a connection's first probe; on v3.1.1 the connection
/// closed right after it, each time), or taken and never delivered (no read).
#[test]
fn a_site_broker_refusing_the_probe_topic_is_a_clear_start_up_error() {
    for (acl, protocol, what) in [
        ("topic readwrite sensors/#\n", "v5", "publish to"),
        // MQTT 3.1.1 has no refusal code: mosquitto closes the connection instead.
        ("topic readwrite sensors/#\n", "v311", "publish to"),
        (
            "topic readwrite sensors/#\ntopic read tidemark/gw/probe\n",
            "v5",
            "publish to",
        ),
        (
            "topic readwrite sensors/#\ntopic write tidemark/gw/probe\n",
            "v5",
            "publish to or subscribe to",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let acl_file = dir.path().join("acl");
        std::fs::write(&acl_file, acl).expect("acl");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            std::fs::set_permissions(&acl_file, std::fs::Permissions::from_mode(0o644))
                .expect("chmod");
        }
        let source = Mosquitto::with_extra(false, &format!("acl_file {}\n", acl_file.display()));
        let sink = Mosquitto::start(false);
        let cfg = dir.path().join("gateway.toml");
        std::fs::write(
            &cfg,
            format!(
                "[gateway]\nid = \"gw\"\nstate_dir = \"{}\"\n\
                 [source]\nurl = \"{}\"\nprotocol = \"{protocol}\"\n\
                 [sink]\nurl = \"{}\"\n",
                dir.path().join("state").display(),
                source.url(),
                sink.url()
            ),
        )
        .expect("config");
        let log = dir.path().join("gw.log");
        let mut child = support::tidemark()
            .args(["run", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("run");
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break Some(st);
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(1),
            "{protocol} {acl:?}: exit 1 expected within 60 s:\n{err}"
        );
        assert!(
            err.contains(&format!("{what} source.probe_topic \"tidemark/gw/probe\"")),
            "{protocol} {acl:?}: the error should name the topic:\n{err}"
        );
    }
}
