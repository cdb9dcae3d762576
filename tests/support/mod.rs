//! Real brokers and the real gateway binary for the MQTT tests: mosquitto
//! processes on free ports (killed and restarted at will), a persistent
//! upstream collector, a QoS 1 publisher that waits for every PUBACK.
#![allow(dead_code, clippy::disallowed_methods)]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, MqttOptions, Packet, QoS};

pub mod bin;
pub mod db;
pub mod engine;
pub mod fleet;
pub mod netns;
pub mod node;
pub mod pair;
pub mod remote;
mod site;

// Each test binary uses a different part of it.
#[allow(unused_imports)]
pub use bin::{tidemark, tidemark_argv};
#[allow(unused_imports)]
pub use site::*;

/// Waits until `cond` holds, polling; panics with `what` after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Like [`wait_until`], with a diagnostic built at the timeout (e.g. the gateway log).
pub fn wait_or_explain(
    limit: Duration,
    mut cond: impl FnMut() -> bool,
    explain: impl Fn() -> String,
) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out: {}", explain());
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A mosquitto process the test owns.
pub struct Mosquitto {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Mosquitto {
    /// Starts mosquitto on a free port; `persist` keeps sessions and queues across restarts.
    pub fn start(persist: bool) -> Self {
        Self::with_conf(&format!(
            "persistence {persist}\nautosave_interval 1\nmax_queued_messages 0\n\
             max_inflight_messages 0\nmessage_size_limit 0\n"
        ))
    }

    /// [`Mosquitto::start`] listening on `ip` too (a test host's address on a veth).
    pub fn start_on(persist: bool, ip: &str) -> Self {
        Self::with_conf(&format!(
            "persistence {persist}\nautosave_interval 1\nmax_queued_messages 0\n\
             max_inflight_messages 0\nmessage_size_limit 0\nlistener {{port}} {ip}\n"
        ))
    }

    /// [`Mosquitto::start`] with more configuration lines (`{port}` is its port,
    /// `{dir}` its own directory).
    pub fn with_extra(persist: bool, extra: &str) -> Self {
        Self::with_conf(&format!(
            "persistence {persist}\nautosave_interval 1\nmax_queued_messages 0\n\
             max_inflight_messages 0\nmessage_size_limit 0\n{extra}"
        ))
    }

    /// mosquitto with its defaults, as a site installs it: only a listener and anonymous
    /// access (max_inflight_messages 20, max_queued_messages 1000, no persistence).
    pub fn stock() -> Self {
        Self::with_conf("")
    }

    fn with_conf(extra: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // mosquitto started as root drops to its own user: it must be able to write here.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
                .expect("chmod");
        }
        let port = free_port();
        let conf = dir.path().join("mosquitto.conf");
        let mut f = std::fs::File::create(&conf).expect("conf");
        writeln!(
            f,
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence_location {}/\n{}",
            dir.path().display(),
            extra
                .replace("{port}", &port.to_string())
                .replace("{dir}", &dir.path().display().to_string())
        )
        .expect("write conf");
        let mut m = Self {
            port,
            dir,
            child: None,
        };
        m.spawn();
        m
    }

    fn spawn(&mut self) {
        let bin = which("mosquitto");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("mosquitto.log"))
            .expect("log");
        let child = Command::new(bin)
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start mosquitto");
        self.child = Some(child);
        let port = self.port;
        wait_until(Duration::from_secs(20), "mosquitto to listen", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// SIGTERM: mosquitto saves its persistence file and exits.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(&c, "TERM");
            let _ = c.wait();
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// What the broker logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Finds a program on PATH (or /usr/sbin, where Debian puts mosquitto); panics if missing.
/// Runs `cmd` with sh in `dir`; it must succeed (openssl steps of the TLS tests).
pub fn sh(dir: &Path, cmd: &str) {
    let st = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("sh");
    assert!(st.success(), "{cmd}");
}

pub fn which(name: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    for d in path.split(':').chain(["/usr/sbin", "/usr/local/sbin"]) {
        let p = Path::new(d).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("{name} is not installed: run `bash scripts/test.sh`, which installs it");
}

pub fn signal(c: &Child, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(c.id().to_string())
        .status();
}

/// The gateway binary under test.
pub struct Gateway {
    pub child: Child,
    pub log: PathBuf,
    /// Readiness lines already in the (appended) log before this start.
    ready_seen: usize,
}

impl Gateway {
    pub fn start(config: &Path, log: &Path) -> Self {
        let g = Self::spawn(config, log);
        g.wait_ready();
        g
    }

    /// Started, without waiting for the source subscription.
    pub fn spawn(config: &Path, log: &Path) -> Self {
        let before = std::fs::read_to_string(log).unwrap_or_default();
        let ready_seen = before.matches("source subscribed").count();
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("gateway log");
        let child = tidemark()
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("start tidemark");
        Self {
            child,
            log: log.to_path_buf(),
            ready_seen,
        }
    }

    /// A gateway started by the caller (own arguments or environment).
    pub fn adopt(child: Child, log: &Path) -> Self {
        let g = Self {
            child,
            log: log.to_path_buf(),
            ready_seen: 0,
        };
        g.wait_ready();
        g
    }

    /// Waits until the source subscription is in place (the gateway subscribes on every connect).
    pub fn wait_ready(&self) {
        wait_or_explain(
            Duration::from_secs(60),
            || self.log_text().matches("source subscribed").count() > self.ready_seen,
            || format!("gateway not subscribed:\n{}", self.log_text()),
        );
    }

    /// SIGTERM; returns the exit code and how long the stop took.
    pub fn terminate(mut self) -> (Option<i32>, Duration) {
        let start = Instant::now();
        signal(&self.child, "TERM");
        let status = self.child.wait().expect("wait");
        (status.code(), start.elapsed())
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // A failed test must not leave a gateway running.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One message seen upstream.
#[derive(Debug, Clone)]
pub struct Seen {
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
    /// Wall clock (epoch ms) when the test received it (0 for replay output).
    pub at: i64,
}

impl Seen {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).expect("JSON payload")
    }
}

/// A persistent QoS 1 subscriber that keeps everything it receives.
pub struct Collector {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Collector {
    pub fn start(port: u16, filter: &str, client_id: &str) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
        o.set_clean_session(false)
            .set_keep_alive(Duration::from_secs(5))
            .set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut conn) = Client::new(o, 1000);
        let subscribed = Arc::new(AtomicBool::new(false));
        let (s, st, sub, f) = (
            seen.clone(),
            stop.clone(),
            subscribed.clone(),
            filter.to_string(),
        );
        let thread = std::thread::spawn(move || {
            for ev in conn.iter() {
                if st.load(Ordering::Relaxed) {
                    break;
                }
                match ev {
                    Ok(Event::Incoming(Packet::ConnAck(c))) => {
                        if !c.session_present {
                            let _ = client.try_subscribe(f.clone(), QoS::AtLeastOnce);
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => sub.store(true, Ordering::Relaxed),
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        s.lock().expect("lock").push(Seen {
                            topic: p.topic.clone(),
                            payload: p.payload.to_vec(),
                            retain: p.retain,
                            at: now_ms(),
                        });
                    }
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        });
        wait_until(Duration::from_secs(20), "collector subscription", || {
            subscribed.load(Ordering::Relaxed)
        });
        Self {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    pub fn on(&self, suffix: &str) -> Vec<Seen> {
        self.all()
            .into_iter()
            .filter(|s| s.topic.contains(suffix))
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The thread ends on its next event (pings arrive within the keep-alive).
        if let Some(t) = self.thread.take() {
            drop(t);
        }
    }
}

/// Retained messages under `filter`, read by a fresh subscriber.
pub fn retained(port: u16, filter: &str) -> Vec<Seen> {
    let mut o = MqttOptions::new(format!("retained-{}", free_port()), "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(5));
    let (client, mut conn) = Client::new(o, 100);
    client
        .subscribe(filter, QoS::AtLeastOnce)
        .expect("subscribe");
    let mut out = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        match conn.recv_timeout(Duration::from_millis(500)) {
            Ok(Ok(Event::Incoming(Packet::Publish(p)))) => out.push(Seen {
                topic: p.topic.clone(),
                payload: p.payload.to_vec(),
                retain: p.retain,
                at: now_ms(),
            }),
            Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => {}
            Ok(Ok(_)) => {}
            Ok(Err(_)) => std::thread::sleep(Duration::from_millis(100)),
            Err(_) => {
                if !out.is_empty() || start.elapsed() > Duration::from_secs(2) {
                    break;
                }
            }
        }
    }
    let _ = client.disconnect();
    out
}

/// A QoS 1 publisher; `publish` returns once the broker acknowledged every message.
pub struct Publisher {
    client: Client,
    acked: Arc<AtomicU64>,
    sent: u64,
    stop: Arc<AtomicBool>,
}

impl Publisher {
    pub fn connect(port: u16, client_id: &str) -> Self {
        let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
        o.set_keep_alive(Duration::from_secs(5))
            .set_clean_session(false)
            .set_inflight(200)
            .set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut conn) = Client::new(o, 10_000);
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, st) = (acked.clone(), stop.clone());
        std::thread::spawn(move || {
            for ev in conn.iter() {
                if st.load(Ordering::Relaxed) {
                    break;
                }
                match ev {
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        a.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        });
        Self {
            client,
            acked,
            sent: 0,
            stop,
        }
    }

    /// Publishes without waiting.
    pub fn send(&mut self, topic: &str, payload: &[u8]) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload.to_vec())
            .expect("publish queued");
        self.sent += 1;
    }

    /// Messages the broker acknowledged so far.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Waits for every PUBACK.
    pub fn flush(&self) {
        let sent = self.sent;
        let acked = self.acked.clone();
        wait_until(Duration::from_secs(120), "publisher acks", || {
            acked.load(Ordering::Relaxed) >= sent
        });
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.client.disconnect();
    }
}

/// Epoch ms now (tests only; the gateway reads its own clock).
#[allow(clippy::disallowed_methods)]
/// VmRSS of process `pid`, KiB (0 when gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `tidemark replay` of `input` under `config`, which must succeed; its output as messages.
pub fn replay(config: &Path, input: &Path, drain_ms: u64) -> Vec<Seen> {
    let out = tidemark()
        .args(["replay", "--config"])
        .arg(config)
        .arg("--input")
        .arg(input)
        .args(["--drain-ms", &drain_ms.to_string()])
        .output()
        .expect("replay");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    replay_lines(&String::from_utf8_lossy(&out.stdout))
}

/// The output lines of `tidemark replay` as messages.
pub fn replay_lines(stdout: &str) -> Vec<Seen> {
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("replay line");
            Seen {
                topic: v["topic"].as_str().unwrap_or("").to_string(),
                payload: serde_json::to_vec(&v["payload"]).expect("payload"),
                retain: v["retain"].as_bool().unwrap_or(false),
                at: 0,
            }
        })
        .collect()
}

/// Window results deduplicated by id, then the last revision of each (group/device/start).
pub fn final_windows(seen: &[Seen]) -> std::collections::BTreeMap<String, serde_json::Value> {
    let mut by_id = std::collections::BTreeMap::new();
    for s in seen.iter().filter(|s| s.topic.contains("/windows/")) {
        let v = s.json();
        by_id.insert(v["id"].as_str().expect("id").to_string(), v);
    }
    let mut last: std::collections::BTreeMap<String, serde_json::Value> =
        std::collections::BTreeMap::new();
    for v in by_id.into_values() {
        let key = format!("{}/{}/{}", v["group"], v["device"], v["start"]);
        let rev = v["revision"].as_u64().expect("revision");
        if last
            .get(&key)
            .is_none_or(|o| o["revision"].as_u64().expect("revision") < rev)
        {
            last.insert(key, v);
        }
    }
    last
}
