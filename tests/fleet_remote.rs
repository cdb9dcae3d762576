//! A fleet of two real gateways on one stock upstream mosquitto (docs/reference.md#remote-configuration-fleet),
//! each under a QoS 1 fleet of devices: `fleet ls` lists them; `fleet push`
//! applies a signed document in place (same process), which a restart keeps;
//! bad signature, untrusted key, stale id, invalid key, restart-only key,
//! another gateway's document, an expired one and a v1 one are each rejected
//! with their reason and change nothing (v1 applies where `accept_v1` is on);
//! a v2 document signed by OpenSSL by hand applies; one that breaks the source is rolled back within
//! `confirm_s` with no reading lost; a gateway killed with -9 shows offline.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::fleet::Fleet;
use support::remote::*;
use support::*;
use tidemark::fleet::Document;

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn two_gateways_take_signed_documents_reject_bad_ones_roll_back_a_broken_source_and_show_in_fleet_ls()
 {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let up = Mosquitto::stock();
    let site = Mosquitto::stock();
    let dead = free_port();

    // Keys: ours from `fleet keygen`, one from OpenSSL, one nobody trusts.
    let key = d.join("op.key");
    support::fleet::keygen(&key);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let ossl = d.join("ossl.key");
    let ossl_pub = d.join("ossl.pub");
    let run = |args: &[&str]| {
        let o = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl");
        assert!(o.status.success(), "openssl {args:?}: {}", text(&o));
        o.stdout
    };
    run(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-out",
        &ossl.display().to_string(),
    ]);
    run(&[
        "pkey",
        "-in",
        &ossl.display().to_string(),
        "-pubout",
        "-out",
        &ossl_pub.display().to_string(),
    ]);
    // OpenSSL reads the public key `keygen` wrote as its own.
    let derived = run(&["pkey", "-in", &key.display().to_string(), "-pubout"]);
    assert_eq!(
        String::from_utf8_lossy(&derived),
        std::fs::read_to_string(d.join("op.key.pub")).unwrap()
    );
    let stranger = d.join("stranger.key");
    support::fleet::keygen(&stranger);

    let results = Collector::start(up.port, "tidemark/+/config/result", "results");
    let up_all = Collector::start(up.port, "tidemark/gw1/windows/#", "windows");
    let mut gw1 = Gw::new(
        d,
        "gw1",
        (&site, &up),
        &[&d.join("op.key.pub"), &ossl_pub],
        "",
    );
    let mut gw2 = Gw::new(
        d,
        "gw2",
        (&site, &up),
        &[&d.join("op.key.pub")],
        "accept_v1 = true",
    );
    let mut devices = Publisher::connect(site.port, "devices");
    let mut fleet = Fleet::new(3, 400);
    fleet.send(&mut devices, 300);

    // Inventory: both online, with version, hash and metrics.
    let rows = ls(&up);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r["state"], "online", "{r}");
        assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
        assert!(
            r["config_hash"].as_str().is_some_and(|h| h.len() == 16),
            "{r}"
        );
        assert!(
            r["metrics_at"].is_i64() && r["groups"] == serde_json::json!(["fleet"]),
            "{r}"
        );
        assert!(r["gateway_clock"]["verdict"].is_string(), "{r}");
        assert_eq!(r["outbox_depth"].as_u64().map(|_| ()), Some(()), "{r}");
    }
    let table = run_tidemark(&["fleet", "ls", "--url", &up.url()]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.starts_with("GATEWAY") && table.contains("gw1") && table.contains("gw2"),
        "{table}"
    );
    let hash0 = status(&up, "gw1")["config_hash"]
        .as_str()
        .unwrap()
        .to_owned();
    let hash_gw2 = status(&up, "gw2")["config_hash"].clone();
    let pid = gw1.pid();

    // Applied: a window rule for a group of its own, in place.
    let doc1 = "[groups.probe]\nwindow = { kind = \"tumbling\", size_ms = 4000 }\n";
    let doc1_path = write(d, "doc1.toml", doc1);
    let pushed = now_ms();
    let (code, r) = push(&up, &key, "gw1", 1, &doc1_path);
    eprintln!("fleet push to applied: {} ms", now_ms() - pushed);
    assert_eq!(
        (code, &r["result"]),
        (0, &Value::from("applied")),
        "{r}\n{}",
        gw1.log_text()
    );
    let hash1 = r["hash"].as_str().unwrap().to_owned();
    assert_ne!(hash1, hash0);
    wait_until(Duration::from_secs(10), "status with the new hash", || {
        status(&up, "gw1")["config_hash"] == hash1.as_str()
    });
    assert_eq!(gw1.pid(), pid);
    assert!(
        gw1.proc
            .as_mut()
            .unwrap()
            .child
            .try_wait()
            .unwrap()
            .is_none()
    );
    assert_eq!(gw1.log_text().matches("tidemark running").count(), 1);
    assert_eq!(status(&up, "gw2")["config_hash"], hash_gw2, "gw2 untouched");
    let remote_file = std::fs::read_to_string(d.join("gw1-state/remote.toml")).unwrap();
    assert!(
        remote_file.contains(doc1) && remote_file.contains("# id = 1"),
        "{remote_file}"
    );
    // The visible effect: a probe reading lands in a 4 s window.
    let base = now_ms() / 4000 * 4000 - 60_000;
    devices.send(
        "sensors/probe/p1/reading",
        &support::fleet::reading(base + 100, 0, 2.0),
    );
    wait_until(Duration::from_secs(20), "a 4 s probe window", || {
        up_all.on("/windows/").iter().map(Seen::json).any(|w| {
            w["group"] == "probe"
                && w["end"]
                    .as_i64()
                    .zip(w["start"].as_i64())
                    .map(|(e, s)| e - s)
                    == Some(4000)
        })
    });
    // `check` names the remote layer as the origin of its keys.
    let check = run_tidemark(&["check", "--config", &gw1.config.display().to_string()]);
    let check_out = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(check.status.success(), "{}", text(&check));
    assert!(
        check_out
            .lines()
            .any(|l| l.contains("size_ms = 4000") && l.ends_with("# from remote")),
        "{check_out}"
    );
    fleet.send(&mut devices, 300);

    // Rejected, each for its reason, nothing changed.
    let unchanged = |why: &str| {
        assert_eq!(status(&up, "gw1")["config_hash"], hash1.as_str(), "{why}");
        assert!(
            std::fs::read_to_string(d.join("gw1-state/remote.toml"))
                .unwrap()
                .contains("# id = 1\n"),
            "{why}"
        );
    };
    let (code, r) = push(&up, &stranger, "gw1", 2, &doc1_path);
    assert_eq!(
        (code, r["result"].as_str(), r["errors"][0].as_str()),
        (1, Some("rejected"), Some("untrusted_key")),
        "{r}"
    );
    unchanged("untrusted key");
    let (code, r) = push(&up, &key, "gw1", 1, &doc1_path);
    assert_eq!(
        (code, r["errors"][0].as_str()),
        (1, Some("stale_id")),
        "{r}"
    );
    unchanged("stale id");
    let bad = write(
        d,
        "bad.toml",
        "[group_defaults]\nidle_timeout_ms = \"soon\"\n[sink]\nbogus = 1\n",
    );
    let (code, r) = push(&up, &key, "gw1", 2, &bad);
    let errors: Vec<&str> = r["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(code, 1, "{r}");
    assert!(errors.iter().all(|e| e.starts_with("invalid: ")), "{r}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("group_defaults.idle_timeout_ms")),
        "{r}"
    );
    assert!(errors.iter().any(|e| e.contains("bogus")), "{r}");
    unchanged("invalid");
    let restart = write(d, "restart.toml", "[broker]\nembedded = true\n");
    let (code, r) = push(&up, &key, "gw1", 2, &restart);
    assert_eq!(
        (code, r["errors"][0].as_str()),
        (1, Some("needs_restart: broker.embedded")),
        "{r}"
    );
    unchanged("restart-only");
    let fleet_keys = write(d, "fleet.toml", "[fleet]\nconfirm_s = 600\n");
    let (code, r) = push(&up, &key, "gw1", 2, &fleet_keys);
    assert_eq!(code, 1, "{r}");
    assert!(
        r["errors"][0]
            .as_str()
            .unwrap()
            .starts_with("invalid: fleet"),
        "{r}"
    );
    unchanged("fleet section");
    // The same keys by other spellings (docs/reference.md#remote-configuration-fleet): judged on the merged result.
    for (name, doc, named) in [
        ("quoted", "\"fleet.accept_v1\" = true\n", "fleet.accept_v1"),
        ("quoted off", "\"fleet.enabled\" = false\n", "fleet.enabled"),
        ("inline", "fleet = { confirm_s = 5 }\n", "fleet.confirm_s"),
    ] {
        let path = write(d, &format!("{name}.toml"), doc);
        let (code, r) = push(&up, &key, "gw1", 2, &path);
        assert_eq!(code, 1, "{name}: {r}");
        assert_eq!(
            r["errors"][0].as_str(),
            Some(format!("invalid: {named} is local only").as_str()),
            "{name}: {r}"
        );
        unchanged(name);
    }
    let op = tidemark::fleet::PrivateKey::read(&key).unwrap();
    let signed = |id: u64, targets: &[&str], not_after: Option<i64>| {
        let targets = targets.iter().map(|t| (*t).to_owned()).collect();
        serde_json::to_value(Document::signed(
            id,
            doc1.to_owned(),
            (targets, not_after),
            &op,
        ))
        .unwrap()
    };
    let mut tampered = signed(2, &["gw1"], None);
    tampered["config"] = Value::from(format!("{doc1}[log]\nlevel = \"trace\"\n"));
    let r = send_raw(
        &up,
        &results,
        "gw1",
        2,
        &serde_json::to_vec(&tampered).unwrap(),
    );
    assert_eq!(
        (r["result"].as_str(), r["errors"][0].as_str()),
        (Some("rejected"), Some("signature")),
        "{r}"
    );
    let r = send_raw(&up, &results, "gw1", 0, b"{\"id\": 0, \"config\": 5}");
    assert!(
        r["errors"][0]
            .as_str()
            .unwrap()
            .starts_with("invalid: message"),
        "{r}"
    );
    unchanged("bad signature");

    // Bound to their gateways (docs/reference.md#remote-configuration-fleet v2): a document signed for gw2 and
    // published to gw1, an expired one, a v1 one (gw1 does not accept v1).
    let for_gw2 = serde_json::to_vec(&signed(2, &["gw2"], None)).unwrap();
    let r = send_raw(&up, &results, "gw1", 2, &for_gw2);
    assert_eq!(
        (r["result"].as_str(), r["errors"][0].as_str()),
        (Some("rejected"), Some("not_for_this_gateway")),
        "{r}"
    );
    unchanged("another gateway's document");
    let expired = signed(2, &["gw1", "gw2"], Some(now_ms() - 1000));
    let r = send_raw(
        &up,
        &results,
        "gw1",
        2,
        &serde_json::to_vec(&expired).unwrap(),
    );
    assert_eq!(
        (r["result"].as_str(), r["errors"][0].as_str()),
        (Some("rejected"), Some("expired")),
        "{r}"
    );
    unchanged("expired");
    let v1 = serde_json::to_vec(&Document::signed_v1(2, doc1.to_owned(), &op)).unwrap();
    let r = send_raw(&up, &results, "gw1", 2, &v1);
    assert_eq!(
        (r["result"].as_str(), r["errors"][0].as_str()),
        (Some("rejected"), Some("unsigned_target")),
        "{r}"
    );
    unchanged("v1");
    // gw2 has `accept_v1 = true`: the same v1 document applies there, and so
    // does one `fleet push --v1` signs (for gateways of an earlier release).
    let r = send_raw(&up, &results, "gw2", 2, &v1);
    assert_eq!(r["result"], "applied", "{r}\n{}", gw2.log_text());
    wait_until(
        Duration::from_secs(10),
        "gw2's status names document 2",
        || status(&up, "gw2")["config_id"] == 2,
    );
    let o = run_tidemark(&[
        "fleet",
        "push",
        "--url",
        &up.url(),
        "--key",
        &key.display().to_string(),
        "--gateway",
        "gw2",
        "--id",
        "3",
        "--v1",
        &doc1_path.display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    wait_until(
        Duration::from_secs(10),
        "gw2's status names document 3",
        || status(&up, "gw2")["config_id"] == 3,
    );
    assert!(
        status(&up, "gw1")["config_id"] == 1,
        "{}",
        status(&up, "gw1")
    );

    // Signed by OpenSSL (`pkeyutl -sign -rawin`) over the v2 bytes, sent without
    // a key name: applied.
    let doc2 = format!("{doc1}[log]\nlevel = \"debug\"\n");
    let not_after = now_ms() + 3_600_000;
    let signed = write(
        d,
        "doc2.signed",
        &format!("tidemark-config-v2\ngw1,gw9\n3\n{not_after}\n{doc2}"),
    );
    let sig = run(&[
        "pkeyutl",
        "-sign",
        "-rawin",
        "-inkey",
        &ossl.display().to_string(),
        "-in",
        &signed.display().to_string(),
    ]);
    use base64::Engine as _;
    let msg = serde_json::json!({
        "id": 3,
        "targets": ["gw1", "gw9"],
        "not_after": not_after,
        "config": doc2,
        "signature": base64::engine::general_purpose::STANDARD.encode(sig),
    });
    let r = send_raw(&up, &results, "gw1", 3, &serde_json::to_vec(&msg).unwrap());
    assert_eq!(r["result"], "applied", "{r}\n{}", gw1.log_text());
    let hash3 = r["hash"].as_str().unwrap().to_owned();
    assert_ne!(hash3, hash1);

    // Broken source: rolled back within confirm_s, readings sent meanwhile all arrive.
    let broken = write(
        d,
        "broken.toml",
        &format!("{doc1}[source]\nurl = \"mqtt://127.0.0.1:{dead}\"\n"),
    );
    let started = now_ms();
    let pusher = {
        let (url, key, broken) = (up.url(), key.clone(), broken.clone());
        std::thread::spawn(move || push_cmd(&url, &key, "gw1", 4, &broken, 120))
    };
    wait_until(
        Duration::from_secs(20),
        "the source moved to the dead port",
        || gw1.log_text().contains("on probation"),
    );
    while fleet.send(&mut devices, 50) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = pusher.join().unwrap();
    let took = now_ms() - started;
    let r: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(r["result"], "rolled_back", "{r}");
    assert_eq!(
        r["errors"],
        serde_json::json!(["not_connected: source"]),
        "{r}"
    );
    assert_eq!(r["hash"], hash3.as_str(), "{r}");
    eprintln!("fleet push to rolled back (confirm_s {CONFIRM_S}): {took} ms");
    // It waited out confirm_s (the mechanism bounds it), and came before the push gave up.
    let confirm_ms = i64::try_from(CONFIRM_S).unwrap() * 1000;
    assert!(took >= confirm_ms - 500 && took < 120_000, "{took} ms");
    devices.flush();
    wait_or_explain(
        Duration::from_secs(60),
        || counted(&up_all) >= fleet.total(),
        || {
            format!(
                "counted {} of {}\n{}",
                counted(&up_all),
                fleet.total(),
                gw1.log_text()
            )
        },
    );
    assert_eq!(counted(&up_all), fleet.total());
    assert!(up_all.on("/late/").is_empty());
    // Broken sink: the result comes back through the old uplink once rolled back.
    let broken_sink = write(
        d,
        "broken-sink.toml",
        &format!("{doc2}[sink]\nurl = \"mqtt://127.0.0.1:{dead}\"\n"),
    );
    let (code, r) = push(&up, &key, "gw1", 5, &broken_sink);
    assert_eq!(
        (code, &r["result"]),
        (1, &Value::from("rolled_back")),
        "{r}\n{}",
        gw1.log_text()
    );
    assert_eq!(
        r["errors"],
        serde_json::json!(["not_connected: sink"]),
        "{r}"
    );
    assert_eq!(r["hash"], hash3.as_str(), "{r}");
    wait_until(Duration::from_secs(20), "gw1 online again", || {
        let s = status(&up, "gw1");
        s["state"] == "online" && s["config_hash"] == hash3.as_str()
    });
    // The rolled-back id stays taken.
    let (code, r) = push(&up, &key, "gw1", 4, &doc1_path);
    assert_eq!(
        (code, r["errors"][0].as_str()),
        (1, Some("stale_id")),
        "{r}"
    );

    // A restart keeps the remote layer.
    let (code, _) = gw1.proc.take().unwrap().terminate();
    assert_eq!(code, Some(0));
    gw1.proc = Some(Gateway::start(&gw1.config, &gw1.log));
    wait_until(Duration::from_secs(20), "status after the restart", || {
        let s = status(&up, "gw1");
        s["state"] == "online" && s["config_hash"] == hash3.as_str()
    });

    // The last id lives in the state store (docs/reference.md#remote-configuration-fleet): document 6 applied, the
    // gateway killed, remote.toml corrupted; after the restart 5 and 6 are stale.
    let (code, r) = push(&up, &key, "gw1", 6, &doc1_path);
    assert_eq!((code, &r["result"]), (0, &Value::from("applied")), "{r}");
    let before = status(&up, "gw1")["started_at"].clone();
    gw1.proc.take().unwrap().kill9();
    std::fs::write(d.join("gw1-state/remote.toml"), "garbage, not a header\n").unwrap();
    gw1.proc = Some(Gateway::start(&gw1.config, &gw1.log));
    wait_until(Duration::from_secs(20), "gw1 online after the kill", || {
        let s = status(&up, "gw1");
        s["state"] == "online" && s["started_at"] != before
    });
    for stale in [5, 6] {
        let (code, r) = push(&up, &key, "gw1", stale, &doc1_path);
        assert_eq!(
            (code, r["errors"][0].as_str()),
            (1, Some("stale_id")),
            "document {stale} after remote.toml was lost: {r}"
        );
    }

    // kill -9: the will marks gw2 offline, gw1 stays online.
    gw2.proc.take().unwrap().kill9();
    let mut rows = Vec::new();
    wait_until(Duration::from_secs(30), "gw2 offline in fleet ls", || {
        rows = ls(&up);
        rows.iter()
            .any(|r| r["id"] == "gw2" && r["state"] == "offline")
    });
    assert!(
        rows.iter()
            .any(|r| r["id"] == "gw1" && r["state"] == "online"),
        "{rows:?}"
    );
    // An unreachable gateway: push gives up with exit 1.
    let o = push_cmd(&up.url(), &key, gw2.id, 9, &doc1_path, 2);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // Bad arguments: exit 2.
    let o = push_cmd(
        &up.url(),
        Path::new("/nonexistent"),
        "gw1",
        9,
        &doc1_path,
        2,
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    gw1.proc.take().unwrap().terminate();
}
