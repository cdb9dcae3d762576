//! The gateway-clock rule where the kernel cannot be asked (docs/reference.md#time): the real
//! binary under a seccomp filter that denies adjtimex (python3-seccomp, as
//! systemd's `ProtectClock=yes` does) counts its clock as unsynchronized, and a
//! fleet whose clocks agree two hours away from it raises `gateway_clock`.
//! Without the filter the status reports what the kernel says.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::*;

const AHEAD_MS: i64 = 2 * 3_600_000;

/// The kernel's own answer: `STA_UNSYNC` clear in adjtimex's status (read by python's ctypes).
fn kernel_synced() -> bool {
    let o = Command::new("python3")
        .args([
            "-c",
            "import ctypes\n\
             class T(ctypes.Structure):\n \
             _fields_=[('modes',ctypes.c_uint),('offset',ctypes.c_long),('freq',ctypes.c_long),\
             ('maxerror',ctypes.c_long),('esterror',ctypes.c_long),('status',ctypes.c_int),('pad',ctypes.c_char*200)]\n\
             t=T()\n\
             assert ctypes.CDLL(None).adjtimex(ctypes.byref(t))>=0\n\
             print(0 if t.status & 0x40 else 1)",
        ])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim() == "1"
}

fn status(port: u16) -> Value {
    let (code, body) = http_get(port, "/api/v1/status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status json")
}

struct Run {
    kernel_synced: bool,
    alerts: Vec<Value>,
    log: String,
}

/// A gateway (under the filter when `denied`) and 5 devices whose clocks agree,
/// two hours ahead of it; what it reports after up to `limit`.
fn run(dir: &Path, denied: bool, limit: Duration) -> Run {
    let broker = Mosquitto::start(false);
    let http = free_port();
    let name = if denied { "denied" } else { "free" };
    let config = GatewayConfig::new("gw", &dir.join(name), &broker, &broker)
        .http(http)
        .set(
            "group_defaults",
            "window = { kind = \"tumbling\", size_ms = 1000 }",
        )
        .write(&dir.join(format!("{name}.toml")));
    let log = dir.join(format!("{name}.log"));
    let up = Collector::start(broker.port, "tidemark/gw/alerts", &format!("alerts-{name}"));
    let mut argv = support::tidemark_argv();
    if denied {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/scripts/deny_adjtimex.py");
        argv.insert(0, script.display().to_string());
        // Debian's python, where python3-seccomp is installed (scripts/test.sh).
        argv.insert(0, "/usr/bin/python3".into());
    }
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start the gateway");
    let gw = Gateway::adopt(child, &log);
    wait_until(Duration::from_secs(20), "the HTTP endpoint", || ready(http));
    let mut p = Publisher::connect(broker.port, &format!("fleet-{name}"));
    let start = now_ms();
    let mut seq = 0u64;
    let fired = |up: &Collector| up.all().iter().any(|s| s.json()["type"] == "gateway_clock");
    while now_ms() - start < i64::try_from(limit.as_millis()).unwrap_or(i64::MAX) && !fired(&up) {
        for d in 0..5 {
            let ts = now_ms() + AHEAD_MS;
            p.send(
                &format!("sensors/site/d{d}/reading"),
                &support::fleet::reading(ts, seq, 20.0),
            );
        }
        seq += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let kernel_synced = status(http)["gateway_clock"]["kernel_synced"]
        .as_bool()
        .expect("kernel_synced");
    let alerts = up.all().iter().map(Seen::json).collect();
    let log = gw.log_text();
    let _ = gw.terminate();
    Run {
        kernel_synced,
        alerts,
        log,
    }
}

#[test]
fn a_gateway_denied_adjtimex_counts_its_clock_unsynchronized_and_follows_an_agreeing_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let denied = run(dir.path(), true, Duration::from_secs(60));
    assert!(!denied.kernel_synced, "kernel_synced true under the filter");
    let alert = denied
        .alerts
        .iter()
        .find(|a| a["type"] == "gateway_clock")
        .unwrap_or_else(|| {
            panic!(
                "no gateway_clock alert: {:?}\n{}",
                denied.alerts, denied.log
            )
        });
    let error = alert["error_ms"].as_i64().expect("error_ms");
    assert!(
        (error.abs() - AHEAD_MS).abs() < 60_000,
        "error_ms {error} is not about two hours: {alert}"
    );
    assert_eq!(
        denied.log.matches("cannot be read").count(),
        1,
        "one warning naming the cause:\n{}",
        denied.log
    );

    // Without the filter the gateway reports the kernel's own answer, and the
    // rule acts only where that answer is "unsynchronized".
    let synced = kernel_synced();
    let free = run(
        dir.path(),
        false,
        Duration::from_secs(if synced { 8 } else { 60 }),
    );
    assert_eq!(free.kernel_synced, synced);
    assert!(!free.log.contains("cannot be read"), "{}", free.log);
    let fired = free.alerts.iter().any(|a| a["type"] == "gateway_clock");
    assert_eq!(fired, !synced, "{:?}", free.alerts);
}
