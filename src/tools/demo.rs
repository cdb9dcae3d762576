//! `tidemark demo`: the gateway with its embedded broker and a simulated fleet
//! with visible behaviour (a clock 17 min fast that gets calibrated, a
//! distrusted clock, a late burst, a device going offline and coming back, a
//! silent group), and a live view of what comes out. Both run as child
//! processes of this binary (`run`, `simulate`); the view subscribes to the
//! gateway's output topics.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::config::Endpoint;
use crate::model::Millis;
use crate::sys::clock::SystemClock;
use crate::sys::link::{self, Event, LinkOptions};

/// What to show, for how long.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Stop by itself after this many seconds.
    pub duration_s: Option<f64>,
    /// Redraw a screen (a terminal) or print scrolling lines.
    pub screen: bool,
}

/// Demo failures.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Files, processes, the runtime.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The MQTT link of the view.
    #[error(transparent)]
    Link(#[from] link::LinkError),
    /// The gateway did not come up or stopped.
    #[error("the gateway {0} (its log: {1})")]
    Gateway(String, String),
}

const DEVICES: u32 = 13;
const GROUPS: [&str; 3] = ["hall", "lab", "yard"];
const FAST_MS: Millis = 17 * 60_000;
/// What the simulated fleet does when (see [`simulate_args`]).
const SCRIPT: &str = "script: hall/d0000 runs 17 min fast, lab/d0001 2 h off; from 5 s one device is \
    silent for 15 s (offline, then online); group yard goes silent; 18-26 s the fleet's uplink \
    is down and its backlog arrives in one burst; 1 % late by 45 s, 1 % redelivered, 0.5 % malformed";
/// What the columns mean.
const LEGEND: &str = "lag = now - group watermark; rev = revision of a window result (1+: re-emitted \
    with late data); outbox = results waiting for the upstream broker";
const WILD_MS: Millis = 2 * 3_600_000;

fn config(dir: &Path, port: u16, http: u16) -> String {
    format!(
        r#"# tidemark demo: embedded broker, calibrated clocks, 10 s windows.
[gateway]
id = "demo"
state_dir = "{state}"
[broker]
embedded = true
listen = "127.0.0.1:{port}"
[source]
url = "mqtt://127.0.0.1:{port}"
protocol = "v311"
[sink]
url = "mqtt://127.0.0.1:{port}"
protocol = "v311"
[time]
policy = "calibrated"
max_skew_ms = 1800000
[group_defaults]
window = {{ kind = "tumbling", size_ms = 10000 }}
out_of_orderness_ms = 500
idle_timeout_ms = 3000
heartbeat_timeout_ms = 8000
allowed_lateness_ms = 2000
[metrics]
interval_s = 1
listen = "127.0.0.1:{http}"
"#,
        state = dir.join("state").display()
    )
}

/// The gateway's `/readyz` answers 200: state restored, source subscribed.
fn ready(http: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", http)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = [0u8; 12];
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_ok()
        && s.read_exact(&mut head).is_ok()
        && head.ends_with(b" 200")
}

fn simulate_args(port: u16) -> Vec<String> {
    let url = format!("mqtt://127.0.0.1:{port}");
    [
        "simulate",
        "--url",
        &url,
        "--protocol",
        "v311",
        "--seed",
        "17",
        "--devices",
        "13",
        "--groups",
        "hall,lab,yard",
        "--rate",
        "26",
        "--format",
        "mixed",
        "--delay-ms",
        "150",
        "--clock-offset",
        "0:1020000",
        "--clock-offset",
        "1:7200000",
        "--skew-ms",
        "1500",
        "--duplicates",
        "0.01",
        "--malformed",
        "0.005",
        "--heartbeat-every",
        "10",
        "--late",
        "0.01",
        "--late-by-ms",
        "45000",
        "--silent",
        "1",
        "--silence-at-s",
        "5",
        "--silence-s",
        "15",
        "--silent-group",
        "yard",
        "--outage-at-s",
        "18",
        "--outage-s",
        "8",
        "--quiet",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// The view's state, fed by the gateway's outputs.
#[derive(Default)]
struct View {
    metrics: Option<serde_json::Value>,
    prev_received: Option<(u64, Millis)>,
    rate: f64,
    windows: VecDeque<String>,
    alerts: VecDeque<String>,
    late: u64,
    rejected: u64,
    last_window: BTreeMap<String, Millis>,
    /// The latest window line of each device, for the clock rows.
    last_window_line: BTreeMap<String, String>,
    distrusted: BTreeMap<String, Millis>,
}

fn hms(ms: Millis) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn offset(ms: Millis) -> String {
    let sign = if ms < 0 { '-' } else { '+' };
    let s = ms.unsigned_abs() / 1000;
    if s >= 3600 {
        format!("{sign}{}h{:02}m", s / 3600, s / 60 % 60)
    } else {
        format!("{sign}{}m{:02}s", s / 60, s % 60)
    }
}

impl View {
    /// Takes one output; returns the line to print in scrolling mode.
    fn take(&mut self, topic: &str, payload: &[u8], now: Millis) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
        let path: Vec<&str> = topic.split('/').skip(2).collect();
        let who = |v: &serde_json::Value| {
            format!(
                "{}/{}",
                v["group"].as_str().unwrap_or("?"),
                v["device"].as_str().unwrap_or("?")
            )
        };
        match path.first().copied() {
            Some("metrics") => {
                let received = v["counters"]["received"].as_u64().unwrap_or(0);
                if let Some((r, t)) = self.prev_received {
                    let dt = (now - t).max(1) as f64 / 1000.0;
                    self.rate = received.saturating_sub(r) as f64 / dt;
                }
                self.prev_received = Some((received, now));
                self.metrics = Some(v);
                None
            }
            Some("windows") => {
                let start = v["start"].as_i64().unwrap_or(0);
                let temp = &v["metrics"]["temp"];
                let line = format!(
                    "{}-{} {:<11} rev {} count {:>3} heartbeats {} temp mean {:.1}",
                    hms(start),
                    hms(v["end"].as_i64().unwrap_or(0)),
                    who(&v),
                    v["revision"],
                    v["count"],
                    v["heartbeats"],
                    temp["mean"].as_f64().unwrap_or(f64::NAN)
                );
                self.last_window.insert(who(&v), start);
                self.last_window_line.insert(who(&v), line.clone());
                push(&mut self.windows, line.clone());
                Some(format!("window  {line}"))
            }
            Some("alerts") => {
                let kind = v["type"].as_str().unwrap_or("?");
                let extra = match kind {
                    "clock_skew" | "clock_ok" => {
                        // offset_ms is arrival − device time; shown as the device's error.
                        let o = -v["offset_ms"].as_i64().unwrap_or(0);
                        if kind == "clock_skew" {
                            self.distrusted.insert(who(&v), o);
                        } else {
                            self.distrusted.remove(&who(&v));
                        }
                        format!("clock offset {}", offset(o))
                    }
                    _ => format!("last seen {}", hms(v["last_seen"].as_i64().unwrap_or(0))),
                };
                let line = format!(
                    "{} {:<10} {:<11} {extra}",
                    hms(v["at"].as_i64().unwrap_or(now)),
                    kind,
                    who(&v)
                );
                push(&mut self.alerts, line.clone());
                Some(format!("alert   {line}"))
            }
            Some("late") => {
                self.late += 1;
                Some(format!(
                    "late    {} event {} behind watermark {}",
                    who(&v),
                    hms(v["event_time"].as_i64().unwrap_or(0)),
                    hms(v["watermark"].as_i64().unwrap_or(0))
                ))
            }
            Some("rejected") => {
                self.rejected += 1;
                Some(format!(
                    "reject  {} {}: {}",
                    v["reason"].as_str().unwrap_or("?"),
                    v["topic"].as_str().unwrap_or("?"),
                    v["detail"].as_str().unwrap_or("")
                ))
            }
            _ => None,
        }
    }

    fn groups(&self, now: Millis) -> Vec<String> {
        let Some(m) = &self.metrics else {
            return vec!["(waiting for the first metrics)".into()];
        };
        let mut rows = Vec::new();
        if let Some(groups) = m["groups"].as_object() {
            for (name, g) in groups {
                let wm = g["watermark"].as_i64();
                rows.push(format!(
                    "{name:<6} watermark {}  lag {:>6}  active {:>2}  idle {:>2}  offline {:>2}",
                    wm.map_or_else(|| "--:--:--".into(), hms),
                    wm.map_or_else(
                        || "-".into(),
                        |w| format!("{:.1} s", (now - w) as f64 / 1000.0)
                    ),
                    g["devices_active"],
                    g["devices_idle"],
                    g["devices_offline"]
                ));
            }
        }
        rows
    }

    fn counters(&self) -> String {
        let Some(m) = &self.metrics else {
            return String::new();
        };
        let c = &m["counters"];
        let rejected: u64 = c["rejected"].as_object().map_or(0, |o| {
            o.values().filter_map(serde_json::Value::as_u64).sum()
        });
        format!(
            "in {:>5.1} msg/s  received {}  accepted {}  late {}  duplicates {}  rejected {}  windows {}  alerts {}  outbox {}",
            self.rate,
            c["received"],
            c["accepted"],
            c["late"],
            c["duplicates"],
            rejected,
            c["windows_emitted"],
            c["alerts"],
            c["outbox_depth"]
        )
    }

    fn clocks(&self, now: Millis) -> Vec<String> {
        let mut rows = Vec::new();
        for (device, true_offset) in [("hall/d0000", FAST_MS), ("lab/d0001", WILD_MS)] {
            let state = if let Some(o) = self.distrusted.get(device) {
                format!("distrusted (estimated {}): arrival time used", offset(*o))
            } else if let Some(start) = self.last_window.get(device) {
                format!(
                    "calibrated: its windows are on true time (latest {}, {} s ago)",
                    hms(*start),
                    (now - start) / 1000
                )
            } else {
                "learning".into()
            };
            rows.push(format!(
                "{device:<11} clock {:>7}  {state}",
                offset(true_offset)
            ));
            if let Some(line) = self.last_window_line.get(device) {
                rows.push(format!("            latest window {line}"));
            }
        }
        rows.push("others      clock within ±1.5 s".into());
        rows
    }

    fn screen(&self, now: Millis, elapsed: Millis, port: u16) -> String {
        let mut s = String::from("\x1b[H\x1b[2J");
        s.push_str(&format!(
            "tidemark demo — embedded broker 127.0.0.1:{port}, {DEVICES} simulated devices, {:.0} s   (Ctrl-C stops)\n",
            elapsed as f64 / 1000.0
        ));
        s.push_str(&format!("{SCRIPT}\n{LEGEND}\n"));
        s.push_str(&format!("{}\n\nGROUPS\n", self.counters()));
        for r in self.groups(now) {
            s.push_str(&format!("  {r}\n"));
        }
        s.push_str("\nCLOCKS (device time − true time)\n");
        for r in self.clocks(now) {
            s.push_str(&format!("  {r}\n"));
        }
        // The counts are the header's (the gateway's own totals), not a second tally.
        s.push_str("\nRECENT WINDOWS (newest last)\n");
        for w in &self.windows {
            s.push_str(&format!("  {w}\n"));
        }
        s.push_str("\nALERTS\n");
        for a in &self.alerts {
            s.push_str(&format!("  {a}\n"));
        }
        s
    }
}

fn push(q: &mut VecDeque<String>, line: String) {
    if q.len() == 8 {
        q.pop_front();
    }
    q.push_back(line);
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// SIGTERM (a clean stop), then SIGKILL if it does not stop within `grace`.
fn stop(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .stderr(Stdio::null())
        .status();
    let clock = SystemClock::new();
    let limit = Millis::try_from(grace.as_millis()).unwrap_or(Millis::MAX);
    while clock.mono() < limit {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

struct Children {
    gateway: Child,
    fleet: Option<Child>,
    dir: PathBuf,
}

impl Drop for Children {
    fn drop(&mut self) {
        if let Some(f) = &mut self.fleet {
            stop(f, Duration::from_secs(3));
        }
        stop(&mut self.gateway, Duration::from_secs(6));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the demo until Ctrl-C or `duration_s`.
pub fn run(o: &DemoOptions) -> Result<(), DemoError> {
    let exe = std::env::current_exe()?;
    let clock = SystemClock::new();
    let dir = std::env::temp_dir().join(format!("tidemark-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = free_port()?;
    let http = free_port()?;
    let cfg = dir.join("demo.toml");
    std::fs::write(&cfg, config(&dir, port, http))?;
    let log = dir.join("gateway.log");
    let gateway = Command::new(&exe)
        .args(["run", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let mut kids = Children {
        gateway,
        fleet: None,
        dir: dir.clone(),
    };
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let up_by = clock.mono() + 20_000;
    while !ready(http) {
        if let Ok(Some(status)) = kids.gateway.try_wait() {
            return Err(DemoError::Gateway(
                format!("exited with {status}"),
                log_text(),
            ));
        }
        if clock.mono() > up_by {
            return Err(DemoError::Gateway(
                "did not start in 20 s".into(),
                log_text(),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "tidemark demo: gateway and embedded broker on 127.0.0.1:{port}; {DEVICES} devices in {} (a clock 17 min fast, one 2 h off, a silent group, late readings, a device dropping out 5-20 s, an outage at 18-26 s and its backlog burst){}",
        GROUPS.join(", "),
        o.duration_s.map_or_else(
            || "; Ctrl-C stops".into(),
            |d| format!("; stops after {d} s")
        )
    );
    kids.fleet = Some(
        Command::new(&exe)
            .args(simulate_args(port))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let mut view = View::default();
    if let Some(why) = watch(o, port, &mut kids, &mut view, clock)? {
        return Err(DemoError::Gateway(why, log_text()));
    }
    println!("\ntidemark demo: stopping (final commit, then the uplink)");
    if let Some(f) = &mut kids.fleet {
        stop(f, Duration::from_secs(3));
    }
    stop(&mut kids.gateway, Duration::from_secs(6));
    let clean = matches!(kids.gateway.try_wait(), Ok(Some(s)) if s.success());
    println!(
        "tidemark demo: {} — {}",
        if clean {
            "gateway stopped cleanly"
        } else {
            "gateway did not stop cleanly"
        },
        view.counters()
    );
    if clean {
        Ok(())
    } else {
        Err(DemoError::Gateway(
            "did not stop cleanly".into(),
            log_text(),
        ))
    }
}

/// Shows what the gateway publishes until Ctrl-C or the duration; why the
/// gateway failed, if it did.
fn watch(
    o: &DemoOptions,
    port: u16,
    kids: &mut Children,
    view: &mut View,
    clock: SystemClock,
) -> Result<Option<String>, DemoError> {
    let endpoint = Endpoint::plain(
        false,
        "127.0.0.1".into(),
        port,
        format!("tidemark-demo-view-{}", std::process::id()),
        1,
    );
    let (client, mut lp) = link::build(&LinkOptions {
        endpoint: &endpoint,
        v5: false,
        persistent: false,
        session_expiry_s: 0,
        manual_acks: false,
        will: None,
        will_retain: true,
        inflight: 10,
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let start = clock.mono();
    let limit = o
        .duration_s
        .map_or(Millis::MAX, |d| (d * 1000.0).round() as Millis);
    let mut out = std::io::stdout();
    let failed = rt.block_on(async {
        let stop = crate::sys::shutdown_signal();
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(Duration::from_millis(1000));
        let mut last_status = 0;
        loop {
            tokio::select! {
                ev = lp.poll() => match ev {
                    Ok(Event::Connected { .. }) => {
                        let _ = client.subscribe(&["tidemark/demo/#".to_owned()], 1);
                    }
                    Ok(Event::Message { topic, payload, .. }) => {
                        let line = view.take(&topic, &payload, clock.now().wall);
                        if let (false, Some(l)) = (o.screen, line) {
                            let _ = writeln!(out, "{l}");
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                },
                _ = tick.tick() => {
                    let now = clock.now();
                    let elapsed = now.mono - start;
                    if o.screen {
                        let _ = write!(out, "{}", view.screen(now.wall, elapsed, port));
                    } else if elapsed - last_status >= 5000 {
                        last_status = elapsed;
                        print_status(&mut out, view, now.wall);
                    }
                    let _ = out.flush();
                    if let Ok(Some(status)) = kids.gateway.try_wait() {
                        return Some(format!("stopped unexpectedly ({status})"));
                    }
                    if elapsed >= limit {
                        return None;
                    }
                }
                () = &mut stop => return None,
            }
        }
    });
    let _ = client.disconnect();
    Ok(failed)
}

/// The plain view's periodic lines.
fn print_status(out: &mut impl Write, view: &View, wall: Millis) {
    let _ = writeln!(out, "status  {}", view.counters());
    for r in view.groups(wall) {
        let _ = writeln!(out, "group   {r}");
    }
    for r in view.clocks(wall) {
        let _ = writeln!(out, "clock   {r}");
    }
}
