//! The memory ceiling (docs/reference.md#memory): a gateway in a real memory cgroup well
//! below the peak the build before the ceiling reached on the same load, through a
//! window-close burst of 100 000 devices while the uplink is down. The kernel would
//! kill it at the limit; it holds input instead, and every reading and every result
//! arrives exactly (against stock mosquitto processes).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{Collector, Gateway, GatewayConfig, Mosquitto, wait_or_explain};

const DEVICES: u64 = 100_000;
/// The limit, MiB. On this load (debug build) the
/// build before the ceiling peaked at 182 MiB with the uplink down through the burst
/// (its results held in memory), this one at ~117 without a limit (116 with one hold
/// under a 135 MiB limit), so input is held (at 85 %, 110 MiB) on the way up. Under a
/// limit of 125 the gateway was gone once in ten runs beside a test suite (not explained).
const LIMIT_MB: u64 = 130;

/// A memory cgroup of the test's own with `limit` bytes: (its directory, the file to
/// put a process in, the file that counts OOM kills). cgroup v2 where the memory
/// controller can be enabled below ours, else v1's memory hierarchy.
fn cgroup(limit: u64) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let name = format!("tidemark-test-{}", std::process::id());
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        let (dir, max_file, events) = if controllers.is_empty() {
            let base = Path::new("/sys/fs/cgroup").join(rel);
            // Only a cgroup2 mount (a hybrid system's /sys/fs/cgroup may be a tmpfs).
            if !base.join("cgroup.controllers").exists() {
                continue;
            }
            let _ = std::fs::write(base.join("cgroup.subtree_control"), "+memory");
            (base.join(&name), "memory.max", "memory.events")
        } else if controllers.split(',').any(|c| c == "memory") {
            let base = Path::new("/sys/fs/cgroup/memory").join(rel);
            (
                base.join(&name),
                "memory.limit_in_bytes",
                "memory.oom_control",
            )
        } else {
            continue;
        };
        if std::fs::create_dir(&dir).is_err() {
            continue;
        }
        // The kernel makes the file when the controller is on for the new cgroup.
        if dir.join(max_file).exists()
            && std::fs::write(dir.join(max_file), limit.to_string()).is_ok()
        {
            return Some((dir.clone(), dir.join("cgroup.procs"), dir.join(events)));
        }
        let _ = std::fs::remove_dir(&dir);
    }
    None
}

fn oom_kills(events: &Path) -> u64 {
    std::fs::read_to_string(events)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The process runs (a killed one stays a zombie until waited for).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One reading from each of `devices` devices in `groups`, flat out at QoS 1 (`tidemark simulate`).
fn one_reading_each(source: &Mosquitto, devices: u64, groups: &str) {
    let n = devices.to_string();
    let out = support::tidemark()
        .args(["simulate", "--url", &source.url(), "--quiet", "--seed", "3"])
        .args(["--devices", &n, "--count", &n, "--groups", groups])
        .args(["--rate", "0", "--qos", "1", "--connections", "2"])
        .output()
        .expect("simulate");
    assert!(
        out.status.success(),
        "simulate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory on disk for one test's state and logs.
fn work_dir(name: &str) -> PathBuf {
    let work =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    work
}

/// `tidemark run`, in the cgroup whose process list is `procs` if there is one.
fn spawn(procs: Option<&Path>, config: &Path, log: &Path) -> Gateway {
    let mut cmd = match procs {
        Some(procs) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!(
                    "echo $$ > {} && exec \"$0\" \"$@\"",
                    procs.display()
                ))
                .arg(env!("CARGO_BIN_EXE_tidemark"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_tidemark")),
    };
    let child = cmd
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start tidemark");
    Gateway::adopt(child, log)
}

/// Every window delivered, distinct by id, each with its one reading.
fn exactly_once(collector: &Collector) {
    let mut ids = std::collections::BTreeMap::new();
    for s in collector.on("/windows/") {
        let w = s.json();
        ids.insert(
            w["id"].as_str().unwrap().to_owned(),
            w["count"].as_u64().unwrap(),
        );
    }
    assert_eq!(ids.len() as u64, DEVICES, "distinct results");
    assert_eq!(
        ids.values().sum::<u64>(),
        DEVICES,
        "readings in the results"
    );
}

/// Two-second windows closing together once the fleet goes quiet; `memory_max_mb` where
/// no cgroup can be had.
fn config(
    work: &Path,
    (source, sink): (&Mosquitto, &Mosquitto),
    http: u16,
    own_limit: bool,
) -> PathBuf {
    let state = work.join("state");
    let mut cfg = GatewayConfig::new("gw", &state, source, sink)
        .http(http)
        .merge(
            "group_defaults",
            "window = { kind = \"tumbling\", size_ms = 2000 }\nidle_timeout_ms = 3000\n\
             allowed_lateness_ms = 0\nheartbeat_timeout_ms = 3600000",
        );
    if own_limit {
        // No cgroup to be had here: the same ceiling from the config, and the peak checked below.
        eprintln!(
            "no memory cgroup can be created here: gateway.memory_max_mb = {LIMIT_MB} instead"
        );
        cfg = cfg.set("gateway", &format!("memory_max_mb = {LIMIT_MB}"));
    }
    cfg.write(&work.join("gateway.toml"))
}

/// The gateway held input rather than growing, and says so; returns where its limit came from.
fn held_and_said(http: u16, gw: &Gateway, cgroup: bool) -> &'static str {
    let metric = |name: &str| support::total(&support::metrics(http), name);
    let limit = LIMIT_MB << 20;
    // It held input rather than growing, and says so.
    let m = support::metrics(http);
    assert!(metric("tidemark_memory_holds_total") >= 1, "no hold:\n{m}");
    assert_eq!(support::total(&m, "tidemark_memory_limit_bytes"), limit);
    let (_, status) = support::http_get(http, "/api/v1/status");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let from = if cgroup {
        "cgroup memory.max"
    } else {
        "gateway.memory_max_mb"
    };
    assert_eq!(status["memory"]["limit_from"], from, "{status}");
    assert!(
        gw.log_text().contains("input held"),
        "no log line about the hold"
    );
    let text = support::tidemark()
        .args(["status", "--url", &format!("http://127.0.0.1:{http}")])
        .output()
        .expect("tidemark status");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("of {LIMIT_MB} MiB ({from})")) && text.contains("input held"),
        "{text}"
    );
    from
}

/// The two tests' gateways (100 000 and 40 000 devices) one at a time: side by side on a
/// 2-core machine the one in the cgroup lagged its hold and passed the limit (140 MiB
/// under 130 in one of two runs).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_gateway_in_a_small_cgroup_holds_input_through_a_100k_device_close_burst_and_loses_nothing() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let source = Mosquitto::start(false);
    let mut sink = Mosquitto::start(true);
    // The state file on disk, not tmpfs: a cgroup is charged for tmpfs pages it cannot reclaim.
    let work = work_dir("ceiling");
    let http = support::free_port();
    let limit = LIMIT_MB << 20;
    let group = cgroup(limit);
    let config = config(&work, (&source, &sink), http, group.is_none());
    let log = work.join("gw.log");
    let collector = Collector::start(sink.port, "tidemark/gw/windows/#", "ceiling-collector");
    let gw = spawn(group.as_ref().map(|g| g.1.as_path()), &config, &log);
    let pid = gw.child.id();
    let metric = |name: &str| support::total(&support::metrics(http), name);
    // The uplink goes down: the burst's results have nowhere to go but the outbox.
    sink.stop();
    one_reading_each(&source, DEVICES, "g0,g1,g2,g3,g4,g5,g6,g7,g8,g9");
    wait_or_explain(
        Duration::from_secs(600),
        || {
            assert!(alive(pid), "the gateway is gone:\n{}", gw.log_text());
            metric("tidemark_windows_emitted_total") >= DEVICES
        },
        || {
            format!(
                "burst not closed: {} readings, {} results\n{}",
                metric("tidemark_received_total"),
                metric("tidemark_windows_emitted_total"),
                gw.log_text()
            )
        },
    );
    sink.restart();
    wait_or_explain(
        Duration::from_secs(600),
        || {
            collector.on("/windows/").len() as u64 >= DEVICES
                && metric("tidemark_outbox_depth") == 0
        },
        || {
            format!(
                "results delivered: {} of {DEVICES}, outbox {}\n{}",
                collector.on("/windows/").len(),
                metric("tidemark_outbox_depth"),
                gw.log_text()
            )
        },
    );
    let peak = peak_kib(pid) / 1024;
    assert!(alive(pid), "the gateway was killed:\n{}", gw.log_text());
    if let Some((_, _, events)) = &group {
        assert_eq!(
            oom_kills(events),
            0,
            "the kernel killed in the gateway's cgroup"
        );
    }
    assert!(
        peak < LIMIT_MB,
        "peak {peak} MiB above the {LIMIT_MB} MiB limit"
    );
    let from = held_and_said(http, &gw, group.is_some());
    // Nothing lost: every reading taken once, every window delivered, each with its reading.
    assert_eq!(metric("tidemark_received_total"), DEVICES);
    assert_eq!(metric("tidemark_duplicates_total"), 0);
    exactly_once(&collector);
    eprintln!(
        "peak {peak} MiB under a {LIMIT_MB} MiB limit ({from}), {} holds",
        metric("tidemark_memory_holds_total")
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    if let Some((dir, _, _)) = group {
        let _ = std::fs::remove_dir(dir);
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// A kill -9 while a close burst goes out in slices (the uplink down, so each slice
/// waits for the outbox): the restarted gateway finishes the burst, and every result
/// arrives once by id with its reading, every reading counted once.
#[test]
fn a_kill_in_the_middle_of_a_sliced_close_burst_loses_and_repeats_nothing() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Past 4 MiB of results the burst waits for a checkpoint to fold them into the outbox.
    const N: u64 = 40_000;
    let source = Mosquitto::start(false);
    let mut sink = Mosquitto::start(true);
    let work = work_dir("burst-kill");
    let http = support::free_port();
    let config = config(&work, (&source, &sink), http, false);
    let log = work.join("gw.log");
    let collector = Collector::start(sink.port, "tidemark/gw/windows/#", "burst-kill-collector");
    let gw = Gateway::start(&config, &log);
    let metric = |name: &str| support::total(&support::metrics(http), name);
    sink.stop();
    one_reading_each(&source, N, "g0,g1,g2,g3,g4");
    // The first results of the burst (the status API counts them as they are emitted):
    // kill it there, with later slices still to come.
    let emitted = || {
        let (_, body) = support::http_get(http, "/api/v1/status");
        serde_json::from_str::<serde_json::Value>(&body).ok()?["counters"]["windows_emitted"]
            .as_u64()
    };
    wait_or_explain(
        Duration::from_secs(300),
        || {
            std::thread::sleep(Duration::from_millis(5));
            emitted().is_some_and(|n| n > 0)
        },
        || gw.log_text(),
    );
    let at = emitted().unwrap_or(0);
    gw.kill9();
    assert!(at < N, "the burst was over before the kill: {at} results");
    eprintln!("killed with {at} of {N} results emitted");
    let gw = Gateway::start(&config, &log);
    sink.restart();
    wait_or_explain(
        Duration::from_secs(300),
        || {
            let ids: std::collections::BTreeSet<String> = collector
                .on("/windows/")
                .iter()
                .map(|s| s.json()["id"].as_str().unwrap().to_owned())
                .collect();
            ids.len() as u64 >= N && metric("tidemark_outbox_depth") == 0
        },
        || {
            format!(
                "results: {}\n{}",
                collector.on("/windows/").len(),
                gw.log_text()
            )
        },
    );
    assert_eq!(metric("tidemark_accepted_total"), N);
    let mut ids = std::collections::BTreeMap::new();
    for s in collector.on("/windows/") {
        let w = s.json();
        let count = w["count"].as_u64().unwrap();
        // A result published before the kill and again after it is the same result.
        let before = ids.insert(w["id"].as_str().unwrap().to_owned(), count);
        assert!(before.is_none_or(|c| c == count), "{w}");
    }
    assert_eq!(ids.len() as u64, N);
    assert_eq!(ids.values().sum::<u64>(), N);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    let _ = std::fs::remove_dir_all(&work);
}
