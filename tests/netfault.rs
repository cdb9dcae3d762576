//! Network faults no RST reveals (docs/reference.md#group_defaults-and-groupsname "Processing time needs a proven path"):
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
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::netns::*;
use support::{Mosquitto, Seen, now_ms, wait_or_explain};

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
    // Counted before the link returns: the gateway may subscribe again within
    // milliseconds of it, before a count taken after would see it.
    let subscribed = site.log_text().matches("source subscribed").count();
    let blind_to = now_ms();
    site.net.heal();
    let healed = Instant::now();
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
    // then W runs at the gateway clock's pace (docs/reference.md#group_defaults-and-groupsname).
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
/// it (exit 1), not a gateway that reconnects forever (docs/reference.md#group_defaults-and-groupsname): the publish
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
