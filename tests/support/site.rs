//! The gateway's HTTP endpoint and metrics, a flapping link, a fleet publisher,
//! a config file with the endpoint on, and a small filesystem.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// The gateway's `/readyz` answers 200 (false while its endpoint is not up yet).
pub fn ready(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && http_get(port, "/readyz").0 == 200
}

/// One HTTP/1.1 GET on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    http_request(port, path, "1.1", "")
}

/// One GET in HTTP/`version` with `headers` (each line ending in `\r\n`): (status, body).
pub fn http_request(port: u16, path: &str, version: &str, headers: &str) -> (u16, String) {
    try_http_request(port, path, version, headers).expect("http response")
}

/// [`http_get`], with a refused or reset connection as an error (a server still
/// shedding a flood of connections), for waits.
pub fn try_http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    try_http_request(port, path, "1.1", "")
}

fn try_http_request(
    port: u16,
    path: &str,
    version: &str,
    headers: &str,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/{version}\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}

/// A TCP proxy in front of a broker whose connections can be cut at will (a
/// flapping link): `cut` closes every connection through it; new ones are accepted.
pub struct Proxy {
    pub port: u16,
    open: Arc<Mutex<Vec<TcpStream>>>,
    pub cuts: Arc<AtomicU64>,
    /// While set, connections are closed as soon as they are accepted (a link that is down).
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listen");
        let port = listener.local_addr().expect("addr").port();
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let conns = open.clone();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refuse = down.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if refuse.load(Ordering::Relaxed) {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                };
                if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                    let mut list = conns.lock().expect("lock");
                    list.push(c2);
                    list.push(s2);
                }
                match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => {
                        pipe(c, server);
                        pipe(s, client);
                    }
                    _ => continue,
                }
            }
        });
        Self {
            port,
            open,
            cuts: Arc::new(AtomicU64::new(0)),
            down,
        }
    }

    /// The link goes down (every connection cut, new ones closed at once) or comes back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
        if down {
            self.cut();
        }
    }

    /// Closes every connection through the proxy.
    pub fn cut(&self) {
        for s in self.open.lock().expect("lock").drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.cuts.fetch_add(1, Ordering::Relaxed);
    }
}

/// The gateway's Prometheus text.
pub fn metrics(port: u16) -> String {
    http_get(port, "/metrics").1
}

/// Sum of every sample of `name` (all label sets, unless `name` gives them).
pub fn total(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum::<f64>() as u64
}

/// Sends every device of a fleet (in 4 groups) one reading per sequence number; returns how many.
pub fn send_fleet(p: &mut Publisher, devices: u64, seqs: std::ops::Range<u64>) -> u64 {
    let mut n = 0;
    for seq in seqs {
        for d in 0..devices {
            let body = format!(r#"{{"ts": {}, "seq": {seq}, "temp": {d}.5}}"#, now_ms());
            p.send(&format!("sensors/g{}/d{d}/reading", d % 4), body.as_bytes());
            n += 1;
        }
    }
    p.flush();
    n
}

/// Readings in the final revision of every window result seen.
pub fn window_readings(seen: &[Seen]) -> u64 {
    final_windows(seen)
        .values()
        .map(|w| w["count"].as_u64().unwrap_or(0))
        .sum()
}

/// A gateway config for the tests: id `gw`, state in `state`, the source at
/// `source_port` (the broker, or a proxy in front of it), the sink on `broker`,
/// metrics each second and the HTTP endpoint on `http`. `gateway` adds keys to
/// `[gateway]`; `extra` follows the source keys (more of them, then whole sections).
pub fn gateway_config(
    dir: &Path,
    state: &Path,
    source_port: u16,
    broker: &Mosquitto,
    http: u16,
    gateway: &str,
    extra: &str,
) -> PathBuf {
    GatewayConfig::new("gw", state, broker, broker)
        .set(
            "source",
            &format!("url = \"mqtt://127.0.0.1:{source_port}\""),
        )
        .set("source", &format!("client_id = \"gw-in-{}\"", broker.port))
        .set("sink", &format!("client_id = \"gw-out-{}\"", broker.port))
        .http(http)
        .merge("gateway", gateway)
        .merge("source", extra)
        .write(&dir.join("gateway.toml"))
}

/// A test's directory: removed when the test passes, kept (and named on stderr) when
/// it fails, for a look at its logs and state. Kept always, a suite's runs filled a disk.
pub struct Scratch(Option<tempfile::TempDir>, PathBuf);

impl Scratch {
    /// A new empty directory.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_path_buf();
        Self(Some(dir), path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.1
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("kept for a look: {}", dir.keep().display());
        }
    }
}

/// A tmpfs mounted for a test, unmounted when dropped.
pub struct Mount(pub PathBuf);

impl Mount {
    /// A tmpfs of `size` at `at`; `None` (with a visible message) where mounting is impossible.
    pub fn tmpfs(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIPPED: cannot mount a tmpfs here (not root?)");
        }
        ok.then(|| Self(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A gateway's config file, built section by section: `gateway.id`,
/// `state_dir`, the source and sink brokers (client ids from the id) and
/// `P/metrics` every second, then whatever keys a test adds.
pub struct GatewayConfig {
    sections: Vec<(String, Vec<String>)>,
}

impl GatewayConfig {
    pub fn new(id: &str, state: &Path, source: &Mosquitto, sink: &Mosquitto) -> Self {
        Self {
            sections: Vec::new(),
        }
        .set("gateway", &format!("id = \"{id}\""))
        .set(
            "gateway",
            &format!("state_dir = {:?}", state.display().to_string()),
        )
        .set("source", &format!("url = \"{}\"", source.url()))
        .set(
            "source",
            &format!("client_id = \"{id}-in-{}\"", source.port),
        )
        .set("sink", &format!("url = \"{}\"", sink.url()))
        .set("sink", &format!("client_id = \"{id}-out-{}\"", sink.port))
        .set("metrics", "interval_s = 1")
    }

    /// `line` (`key = value`, or several lines) in `[section]`; a key set twice keeps the last.
    pub fn set(mut self, section: &str, line: &str) -> Self {
        let idx = match self.sections.iter().position(|(s, _)| s == section) {
            Some(i) => i,
            None => {
                self.sections.push((section.to_owned(), Vec::new()));
                self.sections.len() - 1
            }
        };
        for l in line.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let key = l.split('=').next().unwrap_or(l).trim().to_owned();
            let lines = &mut self.sections[idx].1;
            lines.retain(|have| have.split('=').next().unwrap_or(have).trim() != key);
            lines.push(l.to_owned());
        }
        self
    }

    /// TOML `text`: keys before its first `[table]` header go to `[section]`.
    pub fn merge(mut self, section: &str, text: &str) -> Self {
        let mut at = section.to_owned();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                Some(table) => at = table.trim().to_owned(),
                None => self = self.set(&at, line),
            }
        }
        self
    }

    /// The HTTP endpoint on `port`.
    pub fn http(self, port: u16) -> Self {
        self.set("metrics", &format!("listen = \"127.0.0.1:{port}\""))
    }

    /// The TOML text.
    pub fn text(&self) -> String {
        self.sections
            .iter()
            .map(|(s, lines)| format!("[{s}]\n{}\n", lines.join("\n")))
            .collect()
    }

    /// Written to `path`.
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.text()).expect("config");
        path.to_path_buf()
    }
}

/// Headless Chromium on `url`; its standard output.
pub fn chromium(url: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(which("chromium"))
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--virtual-time-budget=10000")
        .args(args)
        .arg(url)
        .output()
        .expect("chromium");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
