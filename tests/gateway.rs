//! `tidemark run` against real mosquitto processes: shapes of every output,
//! equality with `replay`, acks after commit under kill -9, broker restarts,
//! an upstream outage, graceful stop.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::{
    Collector, Gateway, Mosquitto, Publisher, final_windows, now_ms, retained, wait_or_explain,
    wait_until,
};

const MIN: Duration = Duration::from_secs(60);

fn write_config(
    dir: &Path,
    source: &Mosquitto,
    sink: &Mosquitto,
    extra: &str,
) -> std::path::PathBuf {
    let path = dir.join("gateway.toml");
    let text = format!(
        "[gateway]\nid = \"gw\"\nstate_dir = \"{state}\"\n\
         [source]\nurl = \"{src}\"\nclient_id = \"gw-in-{sp}\"\n\
         [sink]\nurl = \"{snk}\"\nclient_id = \"gw-out-{kp}\"\n\
         [metrics]\ninterval_s = 1\n{extra}",
        state = dir.join("state").display(),
        src = source.url(),
        sp = source.port,
        snk = sink.url(),
        kp = sink.port,
    );
    std::fs::write(&path, text).expect("config");
    path
}

fn reading(ts: i64, seq: u64, temp: f64) -> Vec<u8> {
    format!(r#"{{"ts": {ts}, "seq": {seq}, "temp": {temp}, "hum": 40}}"#).into_bytes()
}

const DEVICE_POLICY: &str = "[time]\npolicy = \"device\"\n\
    [group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 10000 }\n\
    out_of_orderness_ms = 0\nidle_timeout_ms = 1500\nheartbeat_timeout_ms = 20000\n\
    allowed_lateness_ms = 5000\n";

#[test]
fn end_to_end_outputs_have_spec_shapes_and_match_replay() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, DEVICE_POLICY);
    let up = Collector::start(broker.port, "tidemark/#", "e2e-collector");
    let gw = Gateway::start(&config, &dir.path().join("gw.log"));
    let mut records: Vec<(String, Vec<u8>)> = Vec::new();
    let mut publisher = Publisher::connect(broker.port, "e2e-fleet");
    let mut send = |p: &mut Publisher, topic: &str, payload: Vec<u8>| {
        p.send(topic, &payload);
        records.push((topic.to_string(), payload));
    };
    // Ten minutes ago, on a window boundary.
    let base = (now_ms() - 10 * 60_000) / 10_000 * 10_000;
    for s in 0..10i64 {
        let t = base + s * 1000 + 100;
        send(
            &mut publisher,
            "sensors/hall/d1/reading",
            reading(t, s as u64, 20.0 + s as f64),
        );
        send(
            &mut publisher,
            "sensors/hall/d2/reading",
            reading(t, s as u64, 30.0),
        );
        send(
            &mut publisher,
            "sensors/hall/d2/heartbeat",
            format!(r#"{{"ts": {t}}}"#).into_bytes(),
        );
    }
    // A QoS 1 redelivery, a malformed payload, a topic outside the pattern.
    send(
        &mut publisher,
        "sensors/hall/d1/reading",
        reading(base + 3100, 3, 23.0),
    );
    send(
        &mut publisher,
        "sensors/hall/d1/reading",
        b"{\"ts\": 12, \"temp\": [1, {".to_vec(),
    );
    send(
        &mut publisher,
        "sensors/hall/d1/telemetry",
        reading(base + 5000, 99, 1.0),
    );
    publisher.flush();
    // d2 falls silent; d1 carries on for 30 s of device time.
    for s in 10..40i64 {
        let t = base + s * 1000 + 100;
        send(
            &mut publisher,
            "sensors/hall/d1/reading",
            reading(t, s as u64, 20.0 + s as f64),
        );
    }
    publisher.flush();
    wait_until(MIN, "first window and d2 offline", || {
        up.on("/windows/hall/d1")
            .iter()
            .any(|s| s.json()["start"] == base)
            && up
                .on("/alerts/hall/d2")
                .iter()
                .any(|s| s.json()["type"] == "offline")
    });
    // Past end + lateness of the first window: late.
    send(
        &mut publisher,
        "sensors/hall/d1/reading",
        reading(base + 1500, 1000, 99.0),
    );
    // d2 comes back, far ahead of the watermark whatever time this machine took so far.
    send(
        &mut publisher,
        "sensors/hall/d2/reading",
        reading(base + 300_100, 10, 31.0),
    );
    publisher.flush();
    wait_until(MIN, "late, online and the last windows", || {
        !up.on("/late/").is_empty()
            && up
                .on("/alerts/hall/d2")
                .iter()
                .any(|s| s.json()["type"] == "online")
            && up
                .on("/windows/hall/d2")
                .iter()
                .any(|s| s.json()["start"] == base + 300_000)
            && up
                .on("/windows/hall/d1")
                .iter()
                .any(|s| s.json()["start"] == base + 30_000)
    });

    // Shapes (SPEC §8).
    let w = up.on("/windows/hall/d1")[0].json();
    for k in [
        "id",
        "gateway",
        "group",
        "device",
        "start",
        "end",
        "revision",
        "count",
        "heartbeats",
        "metrics",
    ] {
        assert!(w.get(k).is_some(), "window result lacks {k}: {w}");
    }
    assert_eq!(w["gateway"], "gw");
    for k in ["count", "sum", "min", "max", "mean", "first", "last"] {
        assert!(
            w["metrics"]["temp"].get(k).is_some(),
            "metric lacks {k}: {w}"
        );
    }
    let d2w = up.on("/windows/hall/d2")[0].json();
    assert_eq!(
        (d2w["count"].as_u64(), d2w["heartbeats"].as_u64()),
        (Some(10), Some(10))
    );
    let late = up.on("/late/hall/d1")[0].json();
    for k in [
        "group",
        "device",
        "event_time",
        "watermark",
        "arrival",
        "payload",
    ] {
        assert!(late.get(k).is_some(), "late lacks {k}: {late}");
    }
    assert_eq!(late["payload"]["temp"], 99.0);
    let rejected: Vec<_> = up.on("/rejected").iter().map(|s| s.json()).collect();
    let reasons: Vec<_> = rejected
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        reasons.contains(&"decode_error".to_string()),
        "{rejected:?}"
    );
    assert!(reasons.contains(&"bad_topic".to_string()), "{rejected:?}");
    for r in &rejected {
        for k in ["reason", "topic", "arrival", "detail"] {
            assert!(r.get(k).is_some(), "rejected lacks {k}: {r}");
        }
    }
    let offline = up
        .on("/alerts/hall/d2")
        .into_iter()
        .map(|s| s.json())
        .find(|a| a["type"] == "offline")
        .expect("offline");
    for k in ["type", "group", "device", "last_seen", "watermark", "at"] {
        assert!(offline.get(k).is_some(), "alert lacks {k}: {offline}");
    }
    let statuses: Vec<String> = up
        .on("/status/hall/d2")
        .iter()
        .map(|s| String::from_utf8_lossy(&s.payload).into_owned())
        .collect();
    assert_eq!(statuses, vec!["\"online\"", "\"offline\"", "\"online\""]);
    let gw_status = up
        .on("tidemark/gw/status")
        .into_iter()
        .find(|s| s.topic == "tidemark/gw/status")
        .expect("gateway status");
    assert_eq!(gw_status.json()["state"], "online");
    let metrics = up.on("tidemark/gw/metrics");
    assert!(!metrics.is_empty());
    let m = metrics.last().expect("metrics").json();
    for k in ["at", "uptime_s", "groups", "counters"] {
        assert!(m.get(k).is_some(), "metrics lacks {k}: {m}");
    }
    assert_eq!(m["counters"]["duplicates"], 1, "{m}");
    assert!(m["groups"]["hall"].get("watermark").is_some(), "{m}");

    let (code, took) = gw.terminate();
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(5), "stop took {took:?}");

    // The same records through `tidemark replay` give the same window results.
    let capture = dir.path().join("capture.jsonl");
    let mut text = String::new();
    let n = records.len();
    for (i, (topic, payload)) in records.iter().enumerate() {
        // One record per 100 ms; the late one 5 s after the rest, d2's return when its clock says.
        let arrival = match n - i {
            1 => base + 301_000,
            2 => base + 65_000 + i as i64 * 100,
            _ => base + 60_000 + i as i64 * 100,
        };
        let line = match serde_json::from_slice::<serde_json::Value>(payload) {
            Ok(v) => serde_json::json!({"arrival": arrival, "topic": topic, "payload": v}),
            Err(_) => {
                use base64::Engine as _;
                let b = base64::engine::general_purpose::STANDARD.encode(payload);
                serde_json::json!({"arrival": arrival, "topic": topic, "payload_b64": b})
            }
        };
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&capture, text).expect("capture");
    let replay_seen = support::replay(&config, &capture, 600_000);
    let live = final_windows(&up.all());
    let offline_run = final_windows(&replay_seen);
    let strip = |m: BTreeMap<String, serde_json::Value>| -> BTreeMap<String, String> {
        m.into_iter()
            .map(|(k, v)| {
                (
                    k,
                    format!("{} {} {}", v["count"], v["heartbeats"], v["metrics"]),
                )
            })
            .collect()
    };
    assert_eq!(
        strip(live),
        strip(offline_run),
        "live and replayed window results differ"
    );
}

const FLEET: &str = "[time]\npolicy = \"device\"\n\
    [group_defaults]\nwindow = { kind = \"tumbling\", size_ms = 2000 }\n\
    out_of_orderness_ms = 0\nidle_timeout_ms = 1000\nheartbeat_timeout_ms = 3600000\n\
    allowed_lateness_ms = 600000\n";

/// A fleet of `devices` sending `per_device` readings 100 ms apart (device time), 30 min ago.
struct Fleet {
    devices: u64,
    per_device: u64,
    base: i64,
    next: u64,
}

impl Fleet {
    fn new(devices: u64, per_device: u64) -> Self {
        Self {
            devices,
            per_device,
            base: (now_ms() - 30 * 60_000) / 2000 * 2000,
            next: 0,
        }
    }

    fn total(&self) -> u64 {
        self.devices * self.per_device
    }

    /// Publishes the next `n` readings (round-robin over devices); false when all are out.
    fn send(&mut self, p: &mut Publisher, n: u64) -> bool {
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

fn counted(up: &Collector) -> u64 {
    final_windows(&up.on("/windows/"))
        .values()
        .map(|w| w["count"].as_u64().unwrap_or(0))
        .sum()
}

fn wait_counted(fleet: &Fleet, up: &Collector, log: &Path, limit: Duration) {
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

fn assert_exact(fleet: &Fleet, up: &Collector) {
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

#[test]
fn kill_9_at_moments_of_progress_loses_and_double_counts_nothing() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/windows/#", "kill-collector");
    let mut publisher = Publisher::connect(broker.port, "kill-fleet");
    let mut fleet = Fleet::new(20, 400);
    let mut gw = Gateway::start(&config, &log);
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut kills = 0;
    let mut more = true;
    while kills < 12 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Kill after the fleet moved on by a random share and the gateway delivered something new.
        let step = fleet.total() / 24 + rng % (fleet.total() / 24);
        let windows_before = up.all().len();
        let target = fleet.next + step;
        while more && fleet.next < target {
            more = fleet.send(&mut publisher, 20);
            std::thread::sleep(Duration::from_millis(10));
        }
        wait_until(MIN, "progress upstream since the restart", || {
            up.all().len() > windows_before
        });
        gw.kill9();
        kills += 1;
        gw = Gateway::start(&config, &log);
    }
    while fleet.send(&mut publisher, 20) {}
    publisher.flush();
    wait_counted(&fleet, &up, &log, 2 * MIN);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
    eprintln!("{kills} kill -9 rounds over {} readings", fleet.total());
}

#[test]
fn graceful_stop_exits_promptly_goes_offline_and_resumes_exactly() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/windows/#", "stop-collector");
    let mut publisher = Publisher::connect(broker.port, "stop-fleet");
    let mut fleet = Fleet::new(10, 400);
    let gw = Gateway::start(&config, &log);
    // Stop in the middle of the stream.
    while fleet.next < fleet.total() / 2 {
        fleet.send(&mut publisher, 10);
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_until(MIN, "first results", || !up.all().is_empty());
    let (code, took) = gw.terminate();
    assert_eq!(
        code,
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(took < Duration::from_secs(5), "stop took {took:?}");
    let status = retained(broker.port, "tidemark/gw/status");
    assert_eq!(status.len(), 1, "{status:?}");
    assert_eq!(status[0].json()["state"], "offline");
    assert!(status[0].retain);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("stopped"), "{text}");
    // The rest while it is down, then a new start.
    while fleet.send(&mut publisher, 10) {}
    publisher.flush();
    let gw = Gateway::start(&config, &log);
    wait_counted(&fleet, &up, &log, 2 * MIN);
    let status = retained(broker.port, "tidemark/gw/status");
    assert_eq!(status[0].json()["state"], "online");
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
}

#[test]
fn source_broker_restart_mid_stream_loses_no_acknowledged_message() {
    let source = Mosquitto::start(true);
    let mut source = source;
    let upstream = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &source, &upstream, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(upstream.port, "tidemark/gw/windows/#", "restart-collector");
    let mut fleet = Fleet::new(10, 600);
    let gw = Gateway::start(&config, &log);
    let mut publisher = Publisher::connect(source.port, "restart-fleet");
    while fleet.next < fleet.total() / 2 {
        fleet.send(&mut publisher, 50);
        std::thread::sleep(Duration::from_millis(5));
    }
    // Restart while the fleet publishes and the gateway works through its queue.
    source.restart();
    while fleet.send(&mut publisher, 50) {
        std::thread::sleep(Duration::from_millis(5));
    }
    publisher.flush();
    wait_counted(&fleet, &up, &log, 2 * MIN);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("source disconnected"), "{text}");
    assert!(text.matches("source connected").count() >= 2, "{text}");
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
}

#[test]
fn upstream_outage_of_30_s_under_load_delivers_everything_in_order() {
    let source = Mosquitto::start(false);
    let mut upstream = Mosquitto::start(true);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &source, &upstream, FLEET);
    let log = dir.path().join("gw.log");
    let up = Collector::start(upstream.port, "tidemark/gw/windows/#", "outage-collector");
    let mut publisher = Publisher::connect(source.port, "outage-fleet");
    let mut fleet = Fleet::new(10, 3000);
    let gw = Gateway::start(&config, &log);
    while fleet.next < fleet.total() / 10 {
        fleet.send(&mut publisher, 10);
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_until(MIN, "first results", || !up.all().is_empty());
    upstream.stop();
    // 30 s of load while the uplink is down.
    let per_tick = (fleet.total() * 8 / 10) / 3000;
    for _ in 0..3000 {
        fleet.send(&mut publisher, per_tick.max(1));
        std::thread::sleep(Duration::from_millis(10));
    }
    upstream.restart();
    while fleet.send(&mut publisher, 50) {}
    publisher.flush();
    wait_counted(&fleet, &up, &log, 3 * MIN);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    // Ingest went on during the outage: the outbox grew while the sink was down.
    let max_depth = text
        .lines()
        .filter(|l| l.contains("sink disconnected"))
        .filter_map(|l| l.split("outbox_depth=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    assert!(
        max_depth > 100,
        "outbox depth during the outage: {max_depth}\n{text}"
    );
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
    // Per-topic order: first deliveries of each device's results come in window order.
    let mut last: BTreeMap<String, (i64, u64)> = BTreeMap::new();
    let mut seen_ids = std::collections::BTreeSet::new();
    for s in up.all() {
        let v = s.json();
        if !seen_ids.insert(v["id"].as_str().unwrap_or("").to_string()) {
            continue;
        }
        let key = (
            v["start"].as_i64().unwrap_or(0),
            v["revision"].as_u64().unwrap_or(0),
        );
        if let Some(prev) = last.insert(s.topic.clone(), key) {
            assert!(prev < key, "{}: {prev:?} then {key:?}", s.topic);
        }
    }
}

#[test]
fn local_config_with_the_embedded_broker_turns_a_reading_into_a_window_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = support::free_port();
    let url = format!("mqtt://127.0.0.1:{port}");
    let log = dir.path().join("gw.log");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/local.toml");
    let f = std::fs::File::create(&log).expect("log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .env("TIDEMARK__BROKER__LISTEN", format!("127.0.0.1:{port}"))
        .env("TIDEMARK__SOURCE__URL", &url)
        .env("TIDEMARK__SINK__URL", &url)
        .env("TIDEMARK__GATEWAY__STATE_DIR", dir.path().join("state"))
        .stdout(std::process::Stdio::null())
        .stderr(f)
        .spawn()
        .expect("start tidemark");
    let gw = Gateway::adopt(child, &log);
    let up = Collector::start(port, "tidemark/#", "local-collector");
    let mut p = Publisher::connect(port, "local-sensor");
    let ts = now_ms();
    p.send(
        "sensors/lab/t1/reading",
        format!(r#"{{"ts": {ts}, "temp": 21.5}}"#).as_bytes(),
    );
    p.flush();
    wait_or_explain(
        MIN,
        || !up.on("/windows/lab/t1").is_empty(),
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    let w = up.on("/windows/lab/t1")[0].json();
    assert_eq!(w["count"], 1);
    assert_eq!(w["metrics"]["temp"]["last"], 21.5);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}

fn sh(dir: &Path, cmd: &str) {
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("sh");
    assert!(st.success(), "{cmd}");
}

/// mqtts with a private CA, a client certificate and a password file on both links.
#[test]
fn mutual_tls_with_password_file_on_source_and_sink() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    support::which("openssl");
    sh(
        d,
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=tidemark-test-ca",
    );
    sh(
        d,
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost",
    );
    sh(
        d,
        "printf 'subjectAltName=DNS:localhost\\n' > san.ext && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext",
    );
    // X.509 v3 (an extension file) throughout: rustls refuses v1 certificates.
    sh(
        d,
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=gw && openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 2 -extfile client.ext",
    );
    sh(d, "chmod 644 *.key *.crt");
    let passwd = support::which("mosquitto_passwd");
    sh(
        d,
        &format!(
            "{} -b -c passwd gw s3cret && chmod 644 passwd",
            passwd.display()
        ),
    );
    std::fs::write(d.join("gw.password"), "s3cret\n").expect("password");
    let (tls_port, plain_port) = (support::free_port(), support::free_port());
    std::fs::write(
        d.join("m.conf"),
        format!(
            "per_listener_settings true\n\
             listener {tls_port} 127.0.0.1\ncafile {d}/ca.crt\ncertfile {d}/server.crt\nkeyfile {d}/server.key\n\
             require_certificate true\nallow_anonymous false\npassword_file {d}/passwd\n\
             listener {plain_port} 127.0.0.1\nallow_anonymous true\n",
            d = d.display()
        ),
    )
    .expect("conf");
    let mut broker = std::process::Command::new(support::which("mosquitto"))
        .arg("-c")
        .arg(d.join("m.conf"))
        .stderr(std::fs::File::create(d.join("mosquitto.log")).expect("log"))
        .spawn()
        .expect("mosquitto");
    wait_until(MIN, "broker", || {
        std::net::TcpStream::connect(("127.0.0.1", plain_port)).is_ok()
            && std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_ok()
    });
    let tls = format!(
        "url = \"mqtts://localhost:{tls_port}\"\nusername = \"gw\"\npassword_file = \"{d}/gw.password\"\n\
         ca_file = \"{d}/ca.crt\"\ncert_file = \"{d}/client.crt\"\nkey_file = \"{d}/client.key\"\n",
        d = d.display()
    );
    let config = d.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nid = \"gw\"\nstate_dir = \"{}\"\n[source]\n{tls}[sink]\n{tls}\
             [time]\npolicy = \"device\"\n[group_defaults]\nidle_timeout_ms = 500\nout_of_orderness_ms = 0\n\
             [metrics]\ninterval_s = 1\n",
            d.join("state").display()
        ),
    )
    .expect("config");
    let up = Collector::start(plain_port, "tidemark/#", "tls-collector");
    let log = d.join("gw.log");
    let gw = Gateway::start(&config, &log);
    let mut p = Publisher::connect(plain_port, "tls-sensor");
    let ts = now_ms() - 120_000;
    p.send(
        "sensors/secure/s1/reading",
        format!(r#"{{"ts": {ts}, "temp": 4.5}}"#).as_bytes(),
    );
    p.flush();
    wait_or_explain(
        MIN,
        || !up.on("/windows/secure/s1").is_empty(),
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    assert_eq!(up.on("/windows/secure/s1")[0].json()["count"], 1);
    wait_until(MIN, "gateway metrics upstream", || {
        !up.on("/metrics").is_empty()
    });
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    let _ = broker.kill();
    let _ = broker.wait();
    // Secrets stay secret: the password and the private key appear in no log
    // line, no upstream message (metrics included) and no `inspect` output.
    let key = std::fs::read_to_string(d.join("client.key")).expect("key");
    let key_line = key.lines().nth(1).expect("a base64 line of the key");
    let mut seen: Vec<String> = vec![std::fs::read_to_string(&log).unwrap_or_default()];
    seen.extend(
        up.all()
            .iter()
            .map(|m| String::from_utf8_lossy(&m.payload).into_owned()),
    );
    for json in [false, true] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"));
        cmd.args(["inspect", "--state-dir"]).arg(d.join("state"));
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("inspect");
        assert_eq!(out.status.code(), Some(0));
        seen.push(String::from_utf8_lossy(&out.stdout).into_owned());
        seen.push(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    for text in &seen {
        assert!(!text.contains("s3cret"), "password leaked: {text}");
        assert!(!text.contains(key_line), "private key leaked");
    }
}

#[test]
fn mqtt_3_1_1_links_resume_the_session_and_count_exactly() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, FLEET);
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text
        .replace("[source]\n", "[source]\nprotocol = \"v311\"\n")
        .replace("[sink]\n", "[sink]\nprotocol = \"v311\"\n");
    std::fs::write(&config, text).expect("config");
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/windows/#", "v311-collector");
    let mut publisher = Publisher::connect(broker.port, "v311-fleet");
    let mut fleet = Fleet::new(5, 200);
    let gw = Gateway::start(&config, &log);
    fleet.send(&mut publisher, fleet.total() / 2);
    publisher.flush();
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    while fleet.send(&mut publisher, 100) {}
    publisher.flush();
    let gw = Gateway::start(&config, &log);
    assert!(
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("session resumed")
    );
    wait_counted(&fleet, &up, &log, 2 * MIN);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    assert_exact(&fleet, &up);
}

#[test]
fn unusable_state_file_stops_run_with_exit_1_naming_the_file_and_leaves_it_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let file = state.join("tidemark.redb");
    let garbage = vec![0x5a; 8192];
    std::fs::write(&file, &garbage).expect("garbage");
    let config = dir.path().join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nid = \"gw\"\nstate_dir = \"{}\"\n",
            state.display()
        ),
    )
    .expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("--config")
        .arg(&config)
        .env_remove("RUST_LOG")
        .output()
        .expect("tidemark");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = err.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(file.to_str().expect("path")), "{err}");
    assert_eq!(
        std::fs::read(&file).expect("read"),
        garbage,
        "state file modified"
    );
}

#[test]
fn capture_records_live_traffic_that_replay_reads_even_when_killed_mid_line() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("capture.jsonl");
    let log = dir.path().join("capture.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "capture",
            "--url",
            &broker.url(),
            "--topic",
            "sensors/#",
            "--output",
        ])
        .arg(&file)
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("capture");
    wait_or_explain(
        MIN,
        || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("capture subscribed")
        },
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    let mut p = Publisher::connect(broker.port, "capture-fleet");
    let ts = now_ms() - 60_000;
    p.send(
        "sensors/g/d1/reading",
        format!(r#"{{"ts": {ts}, "temp": 1.5}}"#).as_bytes(),
    );
    p.send("sensors/g/d1/reading", &[0xa2, 0x01, 0xff]);
    p.send(
        "sensors/g/d1/reading",
        format!(r#"{{"ts": {}, "temp": 2.5}}"#, ts + 1000).as_bytes(),
    );
    p.flush();
    wait_until(MIN, "three captured lines", || {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .count()
            == 3
    });
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&file).expect("capture");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.contains("payload_b64")),
        "{text}"
    );
    // Each line carries the gateway's monotonic clock and the kernel's NTP state (SPEC §4).
    let mut last_mono = 0;
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).expect("capture line");
        let mono = v["mono"].as_i64().expect("mono");
        assert!(mono >= last_mono, "{l}");
        last_mono = mono;
        assert!(v["synced"].is_boolean(), "{l}");
    }
    // As if killed in the middle of a line.
    std::fs::write(&file, format!("{text}{{\"arrival\": 17964")).expect("torn");
    let config = dir.path().join("replay.toml");
    std::fs::write(&config, "[gateway]\nid = \"gw\"\n").expect("config");
    let replay = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(["replay", "--config"])
            .arg(&config)
            .arg("--input")
            .arg(&file)
            .args(extra)
            .output()
            .expect("replay")
    };
    // Without --flush the capture's last window is still open at its end.
    let open = replay(&[]);
    assert_eq!(open.status.code(), Some(0));
    let open_total: u64 = final_windows(&support::replay_lines(&String::from_utf8_lossy(
        &open.stdout,
    )))
    .values()
    .map(|w| w["count"].as_u64().unwrap_or(0))
    .sum();
    assert_eq!(open_total, 0);
    // --flush closes it, as a final watermark at +infinity would.
    let out = replay(&["--flush"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("torn last line"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"decode_error\""), "{stdout}");
    let seen = support::replay_lines(&stdout);
    let total: u64 = final_windows(&seen)
        .values()
        .map(|w| w["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(total, 2, "{stdout}");
}

/// The value of an unlabelled Prometheus sample.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn systemd_notify_watchdog_and_the_local_http_endpoint() {
    use std::os::unix::net::UnixDatagram;
    let mut broker = Mosquitto::start(true);
    let dir = tempfile::tempdir().expect("tempdir");
    let http_port = support::free_port();
    let config = write_config(
        dir.path(),
        &broker,
        &broker,
        &format!("listen = \"127.0.0.1:{http_port}\"\nhealth_timeout_s = 2\n{DEVICE_POLICY}"),
    );
    let log = dir.path().join("gw.log");
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let f = std::fs::File::create(&log).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .stderr(f)
        .spawn()
        .expect("start tidemark");
    let gw = Gateway::adopt(child, &log);
    let notes = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let notes = notes.clone();
        let sock = sock.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match sock.recv(&mut buf) {
                    Ok(n) => notes
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(_) => return,
                }
                if notes
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|n| n.contains("STOPPING=1"))
                {
                    return;
                }
            }
        })
    };
    let count = |what: &str| {
        notes
            .lock()
            .unwrap()
            .iter()
            .filter(|n| n.contains(what))
            .count()
    };
    wait_until(MIN, "READY=1", || count("READY=1") == 1);
    // Watchdog pings keep coming at half the period while the engine is healthy.
    wait_until(MIN, "watchdog pings", || count("WATCHDOG=1") >= 5);

    // Metrics in Prometheus text, moving with the input.
    let mut publisher = Publisher::connect(broker.port, "http-fleet");
    let ts = now_ms();
    for seq in 0..5 {
        publisher.send(
            "sensors/hall/d1/reading",
            &reading(ts + seq, seq as u64, 20.0),
        );
    }
    publisher.send("sensors/hall/d1/bogus", b"{}");
    publisher.flush();
    wait_until(MIN, "accepted in /metrics", || {
        let (code, body) = support::http_get(http_port, "/metrics");
        code == 200 && sample(&body, "tidemark_accepted_total") == Some(5.0)
    });
    let (_, body) = support::http_get(http_port, "/metrics");
    assert!(
        body.contains("# TYPE tidemark_received_total counter"),
        "{body}"
    );
    assert!(
        body.contains("tidemark_rejected_total{reason=\"bad_topic\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("tidemark_connected{link=\"source\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("tidemark_group_devices{group=\"hall\",state=\"active\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("tidemark_group_watermark_seconds{group=\"hall\"}"),
        "{body}"
    );
    assert_eq!(
        support::http_get(http_port, "/healthz"),
        (200, "ok\n".to_owned())
    );
    assert_eq!(support::http_get(http_port, "/nope").0, 404);

    // The source down past health_timeout_s: /healthz fails and says why; the
    // watchdog keeps pinging (a restart would not bring the broker back).
    broker.stop();
    let pings = count("WATCHDOG=1");
    wait_until(MIN, "healthz 503", || {
        support::http_get(http_port, "/healthz").0 == 503
    });
    let (_, why) = support::http_get(http_port, "/healthz");
    assert!(why.contains("source down for"), "{why}");
    wait_until(MIN, "pings while the source is down", || {
        count("WATCHDOG=1") >= pings + 3
    });
    broker.restart();
    wait_until(2 * MIN, "healthz back to 200", || {
        support::http_get(http_port, "/healthz").0 == 200
    });

    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    reader.join().unwrap();
    assert_eq!(count("STOPPING=1"), 1);
    let n = notes.lock().unwrap();
    assert!(n[0].contains("READY=1"), "{n:?}");
}

#[test]
fn simulate_to_run_to_upstream_accounts_for_every_message() {
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &broker, &broker, DEVICE_POLICY);
    let log = dir.path().join("gw.log");
    let up = Collector::start(broker.port, "tidemark/gw/#", "sim-collector");
    let gw = Gateway::start(&config, &log);
    // A misbehaving fleet: disorder, late readings, redeliveries, garbage,
    // heartbeats, a device that falls silent, an outage and its backlog burst.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["simulate", "--url", &broker.url(), "--seed", "7"])
        .args([
            "--devices",
            "30",
            "--groups",
            "hall,lab,yard",
            "--format",
            "mixed",
        ])
        .args([
            "--rate",
            "2000",
            "--count",
            "12000",
            "--qos",
            "1",
            "--connections",
            "3",
        ])
        .args(["--out-of-order", "0.05", "--disorder-ms", "3000"])
        .args(["--late", "0.02", "--late-by-ms", "60000"])
        .args([
            "--duplicates",
            "0.03",
            "--malformed",
            "0.01",
            "--heartbeat-every",
            "10",
        ])
        .args(["--silent", "2", "--silence-at-s", "1", "--silence-s", "2"])
        .args(["--outage-at-s", "3", "--outage-s", "1", "--quiet"])
        .output()
        .expect("simulate");
    assert!(
        out.status.success(),
        "simulate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("summary");
    let sent = summary["sent"].as_u64().unwrap();
    assert_eq!(sent, 12_000, "{summary}");
    assert_eq!(summary["acked"].as_u64(), Some(sent), "{summary}");
    let m = &summary["messages"];
    for k in [
        "out_of_order",
        "late",
        "duplicates",
        "malformed",
        "heartbeats",
        "backlog",
    ] {
        assert!(m[k].as_u64().unwrap() > 0, "no {k} in {summary}");
    }

    // Every message ends in exactly one place: a window (as a reading or a
    // heartbeat), late, rejected, or a suppressed duplicate.
    let account = || {
        let seen = up.all();
        let windows = final_windows(&seen);
        let in_windows: u64 = windows
            .values()
            .map(|w| w["count"].as_u64().unwrap() + w["heartbeats"].as_u64().unwrap())
            .sum();
        let late = seen.iter().filter(|s| s.topic.contains("/late/")).count() as u64;
        let rejected = seen
            .iter()
            .filter(|s| s.topic.ends_with("/rejected"))
            .count() as u64;
        let dups = seen
            .iter()
            .rev()
            .find(|s| s.topic.ends_with("/metrics"))
            .map_or(0, |s| {
                s.json()["counters"]["duplicates"].as_u64().unwrap_or(0)
            });
        (in_windows, late, rejected, dups)
    };
    wait_or_explain(
        3 * MIN,
        || {
            let (w, l, r, d) = account();
            w + l + r + d == sent
        },
        || format!("accounted {:?} of {sent}; summary {summary}", account()),
    );
    let (w, l, r, d) = account();
    assert!(w > 0 && l > 0 && r > 0 && d > 0, "{:?}", (w, l, r, d));
    // The gateway's own counters say the same.
    let latest_metrics = || {
        up.all()
            .iter()
            .rev()
            .find(|s| s.topic.ends_with("/metrics"))
            .map(|s| s.json())
            .unwrap_or_default()
    };
    wait_until(MIN, "metrics after the last message", || {
        latest_metrics()["counters"]["received"].as_u64() == Some(sent)
    });
    let metrics = latest_metrics();
    let c = &metrics["counters"];
    assert_eq!(c["received"].as_u64(), Some(sent), "{metrics}");
    assert_eq!(c["late"].as_u64(), Some(l), "{metrics}");
    let rejected: u64 = c["rejected"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(rejected, r, "{metrics}");
    assert_eq!(rejected, m["malformed"].as_u64().unwrap(), "{summary}");
    assert_eq!(d, m["duplicates"].as_u64().unwrap(), "{summary}");
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}
