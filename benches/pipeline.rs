//! End-to-end throughput of `tidemark run` (QoS 1 in, durability on, QoS 1
//! out) against the physical limit of the same path: a bare `mosquitto_sub
//! -q 1` draining the same queued load from the same broker, in the same run.
//!
//! `cargo bench --bench pipeline` (builds nothing itself: run `cargo build
//! --release` first). Prints a table; no timed assertions.
#![allow(clippy::disallowed_methods, clippy::cast_precision_loss)]

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, MqttOptions, Packet, QoS};

const DEVICES: u64 = 100;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

fn mosquitto(dir: &std::path::Path, port: u16) -> Child {
    let conf = dir.join("m.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
             max_queued_messages 0\nmax_inflight_messages 0\n"
        ),
    )
    .expect("conf");
    let c = Command::new(which("mosquitto"))
        .arg("-c")
        .arg(&conf)
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c
}

fn which(name: &str) -> String {
    for d in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin"])
    {
        let p = std::path::Path::new(d).join(name);
        if p.is_file() {
            return p.to_string_lossy().into_owned();
        }
    }
    panic!("{name} not installed (scripts/test.sh installs it)");
}

fn tidemark_bin() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/tidemark");
    assert!(p.exists(), "build first: cargo build --release");
    p
}

// The caller stops the returned child.
#[allow(clippy::zombie_processes)]
fn start_gateway(config: &std::path::Path, log: &std::path::Path) -> Child {
    let f = std::fs::File::create(log).expect("log");
    let c = Command::new(tidemark_bin())
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stderr(f)
        .spawn()
        .expect("tidemark");
    let start = Instant::now();
    loop {
        let t = std::fs::read_to_string(log).unwrap_or_default();
        if t.contains("source subscribed") || t.contains("session resumed") {
            return c;
        }
        if start.elapsed() > Duration::from_secs(30) {
            stop(c);
            panic!("gateway not ready:\n{t}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `mosquitto_sub` on the bench topics with a persistent QoS 1 session.
fn bare_subscriber(bin: &str, port: u16) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "-p",
        &port.to_string(),
        "-c",
        "-i",
        "bare",
        "-q",
        "1",
        "-t",
        "sensors/#",
    ]);
    c
}

fn stop(mut c: Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(c.id().to_string())
        .status();
    let _ = c.wait();
}

/// Publishes `per_device` readings for each device at QoS 1 and waits for every PUBACK.
fn publish(port: u16, per_device: u64, base: i64) -> Duration {
    let mut o = MqttOptions::new("bench-fleet", "127.0.0.1", port);
    o.set_inflight(1000).set_keep_alive(Duration::from_secs(30));
    let (client, mut conn) = Client::new(o, 100_000);
    let acked = Arc::new(AtomicU64::new(0));
    let a = acked.clone();
    std::thread::spawn(move || {
        for ev in conn.iter() {
            match ev {
                Ok(Event::Incoming(Packet::PubAck(_))) => {
                    a.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    let start = Instant::now();
    let total = per_device * DEVICES;
    for k in 0..per_device {
        for d in 0..DEVICES {
            // The last message of each device is a heartbeat an hour ahead: it closes every
            // window of readings at once.
            let (kind, p) = if k + 1 == per_device {
                ("heartbeat", format!(r#"{{"ts":{}}}"#, base + 3_600_000))
            } else {
                let ts = base + i64::try_from(k).unwrap_or(0) * 100;
                (
                    "reading",
                    format!(r#"{{"ts":{ts},"seq":{k},"temp":21.5,"hum":40}}"#),
                )
            };
            client
                .publish(
                    format!("sensors/bench/d{d}/{kind}"),
                    QoS::AtLeastOnce,
                    false,
                    p,
                )
                .expect("publish");
        }
    }
    while acked.load(Ordering::Relaxed) < total {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = client.disconnect();
    start.elapsed()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let per_device: u64 = std::env::var("PIPELINE_PER_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let total = per_device * DEVICES;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut broker = mosquitto(dir.path(), port);
    let config = dir.path().join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nid = \"bench\"\nstate_dir = \"{}\"\n[source]\nurl = \"mqtt://127.0.0.1:{port}\"\nprotocol = \"{proto}\"\n\
             [sink]\nurl = \"mqtt://127.0.0.1:{port}\"\n[time]\npolicy = \"device\"\nmax_future_ms = 7200000\n\
             [group_defaults]\nwindow = {{ kind = \"tumbling\", size_ms = 10000 }}\nallowed_lateness_ms = 0\n",
            dir.path().join("state").display(),
            proto = std::env::var("PIPELINE_PROTOCOL").unwrap_or_else(|_| "v5".into()),
        ),
    )
    .expect("config");
    let log = dir.path().join("gw.log");
    // Register both persistent sessions, then queue the load for both.
    let sub = which("mosquitto_sub");
    let st = bare_subscriber(&sub, port)
        .arg("-E")
        .status()
        .expect("mosquitto_sub");
    assert!(st.success());
    stop(start_gateway(&config, &log));
    let base = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
        - 3_600_000)
        / 10_000
        * 10_000;
    let pub_time = publish(port, per_device, base);

    // The physical limit: a bare QoS 1 subscriber draining the same queue.
    let start = Instant::now();
    let st = bare_subscriber(&sub, port)
        .args(["-C", &total.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("mosquitto_sub");
    assert!(st.success());
    let bare = start.elapsed();

    // tidemark: from process start to the last window result upstream.
    let counted = Arc::new(Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
    let mut o = MqttOptions::new("bench-up", "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut conn) = Client::new(o, 1000);
    client
        .subscribe("tidemark/bench/windows/#", QoS::AtLeastOnce)
        .expect("subscribe");
    let c2 = counted.clone();
    std::thread::spawn(move || {
        for ev in conn.iter() {
            if let Ok(Event::Incoming(Packet::Publish(p))) = ev
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&p.payload)
            {
                let id = v["id"].as_str().unwrap_or("").to_string();
                c2.lock()
                    .expect("lock")
                    .insert(id, v["count"].as_u64().unwrap_or(0));
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let gw = start_gateway(&config, &log);
    loop {
        let sum: u64 = counted.lock().expect("lock").values().sum();
        if sum >= total - DEVICES {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "gateway did not finish: {sum} of {total}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let gateway = start.elapsed();
    stop(gw);
    let _ = broker.kill();
    let _ = broker.wait();
    let rate = |d: Duration| total as f64 / d.as_secs_f64();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "end to end, {total} QoS 1 readings from {DEVICES} devices queued on mosquitto, same run\n\
         {:<44} {:>10} {:>12}\n\
         {:<44} {:>10.2} {:>12.0}\n\
         {:<44} {:>10.2} {:>12.0}\n\
         {:<44} {:>10.2} {:>12.0}\n\
         ratio tidemark / bare subscriber: {:.2}",
        "path",
        "seconds",
        "msg/s",
        "publisher -> mosquitto (QoS 1, 1000 in flight)",
        pub_time.as_secs_f64(),
        rate(pub_time),
        "mosquitto -> bare mosquitto_sub -q 1",
        bare.as_secs_f64(),
        rate(bare),
        "mosquitto -> tidemark run -> mosquitto (durable)",
        gateway.as_secs_f64(),
        rate(gateway),
        bare.as_secs_f64() / gateway.as_secs_f64()
    );
}
