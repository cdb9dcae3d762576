//! Hostile input cannot cost results or memory (docs/reference.md#guarantees): a flood of
//! 1 M malformed messages while the uplink is down leaves every window result
//! of the fleet beside it to be delivered; Sparkplug births far over the caps,
//! past the edge-node and device limits, and 10 000 NCMD rebirths leave RSS
//! where it was, the gateway up and every one counted.

mod support;

use std::time::Duration;

use rumqttc::{Client, MqttOptions, QoS};
use support::fleet::*;
use support::*;

/// A QoS 0 publisher that sends as fast as the broker takes it.
fn flood(port: u16, id: &str, n: u64, topic: impl Fn(u64) -> String, payload: &[u8]) {
    let mut o = MqttOptions::new(id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(2 << 20, 2 << 20);
    let (client, mut conn) = Client::new(o, 1000);
    let pump = std::thread::spawn(move || {
        for ev in conn.iter() {
            if ev.is_err() {
                break;
            }
        }
    });
    for i in 0..n {
        client
            .publish(topic(i), QoS::AtMostOnce, false, payload.to_vec())
            .expect("publish");
    }
    // Queued behind every publish: the pump ends once they are all written.
    let _ = client.disconnect();
    let _ = pump.join();
}

#[test]
fn a_flood_of_bad_input_while_the_uplink_is_down_costs_no_window_result() {
    // 1 M with the release binary (about 15 s); the debug build the suite runs
    // takes ~4 k msg/s, so there 200 000: still ten times the outbox bound below.
    const FLOOD: u64 = if cfg!(debug_assertions) {
        200_000
    } else {
        1_000_000
    };
    let site = Mosquitto::start(false);
    let up = Mosquitto::start(false);
    let link = Proxy::start(up.port);
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    let config = GatewayConfig::new("gw", &dir.path().join("state"), &site, &up)
        .set("sink", &format!("url = \"mqtt://127.0.0.1:{}\"", link.port))
        .set("sink", "outbox_max_messages = 20000")
        .http(http)
        .merge("metrics", FLEET)
        .write(&dir.path().join("gw.toml"));
    let log = dir.path().join("gw.log");
    let results = Collector::start(up.port, "tidemark/gw/windows/#", "flood-results");
    let gw = Gateway::start(&config, &log);
    link.set_down(true);
    let mut publisher = Publisher::connect(site.port, "flood-fleet");
    let mut fleet = Fleet::new(20, 300);
    let started = now_ms();
    let flooder = {
        let port = site.port;
        std::thread::spawn(move || {
            flood(
                port,
                "flood",
                FLOOD,
                |i| format!("sensors/fleet/bad{}/reading", i % 16),
                b"{not json",
            )
        })
    };
    while fleet.send(&mut publisher, 20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    publisher.flush();
    flooder.join().unwrap();
    // The gateway has taken the flood (rejections counted) and the bound is at
    // work before the uplink returns.
    wait_or_explain(
        Duration::from_secs(240),
        || {
            let m = metrics(http);
            total(&m, "tidemark_received_total") >= fleet.total() + FLOOD * 9 / 10
                && total(&m, "tidemark_outbox_dropped_total") > 0
        },
        || format!("{}\n{}", metrics(http), gw.log_text()),
    );
    eprintln!("flood of {FLOOD} taken in {} ms", now_ms() - started);
    link.set_down(false);
    wait_counted(&fleet, &results, &log, 3 * MIN);
    assert_exact(&fleet, &results);
    // Started with the test's umask (022), the state is still the gateway's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let state = dir.path().join("state");
    assert_eq!(mode(&state), 0o700, "state dir");
    for f in ["tidemark.redb", "tidemark.wal"] {
        let p = state.join(f);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{f}");
        }
    }
    assert!(state.join("tidemark.redb").exists());
    let _ = gw.terminate();
}

fn birth(seq: u64, metrics: usize, name_len: usize) -> Vec<u8> {
    use prost::Message as _;
    use tidemark::sparkplug::{Metric, Payload, datatype};
    Payload {
        timestamp: u64::try_from(now_ms()).ok(),
        seq: Some(seq),
        metrics: (0..metrics)
            .map(|i| Metric {
                name: Some(format!("{i:0name_len$}")),
                alias: Some(i as u64),
                datatype: Some(datatype::DOUBLE),
                double_value: Some(1.0),
                ..Metric::default()
            })
            .collect(),
        ..Payload::default()
    }
    .encode_to_vec()
}

/// Sends `msgs` at QoS 1, at most 20 unacknowledged at once (a 900 KB payload each).
fn send_paced(p: &mut Publisher, msgs: impl IntoIterator<Item = (String, Vec<u8>)>) {
    let mut sent = p.acked();
    for (topic, payload) in msgs {
        p.send(&topic, &payload);
        sent += 1;
        while sent - p.acked() > 20 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    p.flush();
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn sparkplug_input_over_every_bound_and_a_rebirth_storm_hold_no_memory_and_are_counted() {
    const BIG: u64 = 1000;
    const WIDE: u64 = 20;
    const NODES: u64 = 150;
    const DEVICES: u64 = 1100;
    const REBIRTHS: u64 = 10_000;
    let broker = Mosquitto::start(false);
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    let config = GatewayConfig::new("gw", &dir.path().join("state"), &broker, &broker)
        .http(http)
        .set(
            "sparkplug",
            "enabled = true\ngroup_ids = [\"plant\"]\nmax_edge_nodes = 100",
        )
        .set("sink.sparkplug", "enabled = true")
        .write(&dir.path().join("gw.toml"));
    let log = dir.path().join("gw.log");
    let births = Collector::start(broker.port, "spBv1.0/tidemark/NBIRTH/#", "spb-births");
    let mut gw = Gateway::start(&config, &log);
    wait_until(Duration::from_secs(20), "the edge node's NBIRTH", || {
        !births.all().is_empty()
    });
    let mut p = Publisher::connect(broker.port, "spb-attacker");
    // A real edge node with a device, then readings: the gateway at work.
    send_paced(
        &mut p,
        [("spBv1.0/plant/NBIRTH/n0".to_owned(), birth(0, 4, 4))],
    );
    let rejected = |m: &str| total(m, "tidemark_rejected_total{reason=\"decode_error\"}");
    wait_until(Duration::from_secs(20), "the first birth taken", || {
        total(&metrics(http), "tidemark_received_total") >= 1
    });
    std::thread::sleep(Duration::from_secs(1));
    let pid = gw.child.id();
    let before = rss_kib(pid);

    let big = birth(0, 22_500, 20);
    assert!(
        (850_000..1_000_000).contains(&big.len()),
        "{} bytes",
        big.len()
    );
    let wide = birth(0, 1100, 4);
    assert!(wide.len() < 64 * 1024, "{} bytes", wide.len());
    send_paced(
        &mut p,
        (0..BIG).map(|_| ("spBv1.0/plant/NBIRTH/big".to_owned(), big.clone())),
    );
    send_paced(
        &mut p,
        (0..WIDE).map(|_| ("spBv1.0/plant/NBIRTH/wide".to_owned(), wide.clone())),
    );
    send_paced(
        &mut p,
        (1..=NODES).map(|n| (format!("spBv1.0/plant/NBIRTH/n{n}"), birth(0, 4, 4))),
    );
    send_paced(
        &mut p,
        (0..DEVICES).map(|d| {
            let seq = (d + 1) % 256;
            (format!("spBv1.0/plant/DBIRTH/n0/d{d}"), birth(seq, 4, 4))
        }),
    );
    // n0 plus 99 more edge nodes fit max_edge_nodes; 1 024 devices fit one edge node.
    let expected = BIG + WIDE + (NODES - 99) + (DEVICES - 1024);
    wait_or_explain(
        Duration::from_secs(120),
        || rejected(&metrics(http)) >= expected,
        || format!("{}\n{}", metrics(http), gw.log_text()),
    );
    let nbirths_before = births.all().len() as u64;
    send_paced(
        &mut p,
        (0..REBIRTHS).map(|_| {
            (
                "spBv1.0/tidemark/NCMD/gw".to_owned(),
                tidemark::sparkplug::rebirth_command(now_ms()),
            )
        }),
    );
    let answered = || births.all().len() as u64 - nbirths_before;
    let refused = || total(&metrics(http), "tidemark_sparkplug_rebirths_refused_total");
    wait_or_explain(
        Duration::from_secs(60),
        || answered() + refused() == REBIRTHS,
        || {
            format!(
                "answered {} refused {}\n{}",
                answered(),
                refused(),
                gw.log_text()
            )
        },
    );
    let after = rss_kib(pid);
    let m = metrics(http);
    eprintln!(
        "RSS {before} KiB before, {after} KiB after; rejected {}; rebirths answered {} refused {}",
        rejected(&m),
        answered(),
        refused()
    );
    assert_eq!(rejected(&m), expected, "{m}");
    assert!(
        answered() >= 1 && answered() <= 1 + 60 / 5,
        "{}",
        answered()
    );
    assert!(
        after <= before + 32 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert!(
        matches!(gw.child.try_wait(), Ok(None)),
        "the gateway exited"
    );
    let log_text = gw.log_text();
    assert_eq!(gw.terminate().0, Some(0), "{log_text}");
}
