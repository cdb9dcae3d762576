//! A standby pair on real brokers: two boards of one gateway, their key, their
//! log lines, a fleet publishing through a fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::fleet::{FLEET, Fleet, MIN};
use super::{Gateway, GatewayConfig, Mosquitto, Publisher, wait_or_explain};

pub struct Board {
    pub name: &'static str,
    pub http: u16,
    pub config: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub gw: Option<Gateway>,
}

impl Board {
    pub fn new(
        dir: &Path,
        name: &'static str,
        site: &Mosquitto,
        up: &Mosquitto,
        takeover_s: u64,
    ) -> Self {
        Self::with(dir, name, (site, up), takeover_s, "")
    }

    /// A board whose config adds `extra` (TOML: keys of `[metrics]`, then sections).
    pub fn with(
        dir: &Path,
        name: &'static str,
        (site, up): (&Mosquitto, &Mosquitto),
        takeover_s: u64,
        extra: &str,
    ) -> Self {
        let state = dir.join(format!("state-{name}"));
        let http = super::free_port();
        let key = pair_key(dir);
        let config = GatewayConfig::new("gw", &state, site, up)
            .http(http)
            .merge("metrics", FLEET)
            .merge("metrics", extra)
            .set("standby", "enabled = true")
            .set("standby", &format!("node = \"{name}\""))
            .set("standby", &format!("takeover_s = {takeover_s}"))
            .set(
                "standby",
                &format!("key_file = {:?}", key.display().to_string()),
            )
            .write(&dir.join(format!("{name}.toml")));
        Self {
            name,
            http,
            config,
            state,
            log: dir.join(format!("{name}.log")),
            gw: None,
        }
    }

    pub fn start(&mut self) {
        self.gw = Some(Gateway::spawn(&self.config, &self.log));
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn count(&self, line: &str) -> usize {
        self.log_text().matches(line).count()
    }

    pub fn kill9(&mut self) {
        if let Some(g) = self.gw.take() {
            g.kill9();
        }
    }
}

/// The pair's key in `dir`, made by `tidemark pair keygen` the first time.
pub fn pair_key(dir: &Path) -> PathBuf {
    let key = dir.join("pair.key");
    if !key.exists() {
        let o = super::tidemark()
            .args(["pair", "keygen", "--out"])
            .arg(&key)
            .output()
            .expect("tidemark pair keygen");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let again = super::tidemark()
            .args(["pair", "keygen", "--out"])
            .arg(&key)
            .output()
            .expect("tidemark pair keygen");
        assert_eq!(again.status.code(), Some(2), "keygen must not overwrite");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    key
}

pub const ACTIVE: &str = "pair: this board is active";
pub const TAKEOVER: &str = "pair: the active is dead; taking over";
pub const JOINED: &str = "pair: the standby has every record";
pub const DEPOSED: &str = "another board claims the gateway with a newer epoch";
pub const LOST: &str = "pair: the standby is lost";

/// Waits until `line` appears in `b`'s log more than `before` times.
pub fn wait_line(b: &Board, line: &str, before: usize, limit: Duration) {
    wait_or_explain(
        limit,
        || b.count(line) > before,
        || format!("{:?} not in {}'s log:\n{}", line, b.name, b.log_text()),
    );
}

impl Board {
    /// The `/api/v1/status` `pair` object.
    pub fn pair(&self) -> serde_json::Value {
        let (code, body) = super::http_get(self.http, "/api/v1/status");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).expect("status JSON")["pair"].clone()
    }

    /// Acks that took longer than 2 s (`tidemark_ack_delay_seconds` above its 2 s bucket).
    pub fn slow_acks(&self) -> u64 {
        self.acks_over(2.0)
    }

    /// Acks that took longer than `le` seconds (one of the histogram's bucket bounds).
    pub fn acks_over(&self, le_s: f64) -> u64 {
        let m = super::metrics(self.http);
        let all = super::total(&m, "tidemark_ack_delay_seconds_count");
        let fast = m
            .lines()
            .filter_map(|l| l.strip_prefix("tidemark_ack_delay_seconds_bucket{le=\""))
            .filter_map(|l| l.split_once("\"} "))
            .find(|(le, _)| le.parse::<f64>().ok() == Some(le_s))
            .and_then(|(_, n)| n.parse::<u64>().ok())
            .expect("a bucket of tidemark_ack_delay_seconds");
        all - fast
    }

    /// VmRSS of the running board, KiB.
    pub fn rss_kib(&self) -> u64 {
        super::rss_kib(self.gw.as_ref().expect("running").child.id())
    }
}

/// Board 0 active and ready, then board 1 its synced standby.
pub fn pair_up(boards: &mut [Board; 2]) {
    boards[0].start();
    wait_line(&boards[0], ACTIVE, 0, MIN);
    boards[0].gw.as_ref().expect("active").wait_ready();
    boards[1].start();
    wait_line(&boards[0], JOINED, 0, MIN);
}

/// A QoS 1 fleet publishing ~250 readings/s from a thread until `stop` is set
/// (or all are out); joined, it hands back its publisher and fleet.
pub fn pump(
    port: u16,
    id: &str,
    mut fleet: Fleet,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<(Publisher, Fleet)>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (halt, id) = (stop.clone(), id.to_owned());
    let thread = std::thread::spawn(move || {
        let mut publisher = Publisher::connect(port, &id);
        while !halt.load(Ordering::Relaxed) && fleet.send(&mut publisher, 10) {
            std::thread::sleep(Duration::from_millis(40));
        }
        (publisher, fleet)
    });
    (stop, thread)
}
