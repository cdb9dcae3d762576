//! The shipped Grafana dashboard and Prometheus rules against the real thing:
//! Debian's `prometheus` scrapes a running gateway while a simulated fleet
//! publishes (some devices falling silent); every dashboard query returns data,
//! the rules load and evaluate, the offline-devices alert goes pending live,
//! and `promtool` checks the rules and runs their unit tests (offline devices,
//! outbox growing, gateway down, source down, state store failing: firing).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One HTTP/1.0 GET (Prometheus answers it without chunked encoding).
fn get(port: u16, path: &str) -> (u16, String) {
    http_request(port, path, "1.0", "")
}

fn query(prom: u16, expr: &str) -> Vec<Value> {
    let (code, body) = get(prom, &format!("/api/v1/query?query={}", encode(expr)));
    assert_eq!(code, 200, "{expr}: {body}");
    let v: Value = serde_json::from_str(&body).expect("prometheus json");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_fire_the_alerts() {
    let dir = format!("{ROOT}/contrib/prometheus");
    let check = Command::new(which("promtool"))
        .args(["check", "rules", "tidemark-rules.yml"])
        .current_dir(&dir)
        .output()
        .expect("promtool");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let test = Command::new(which("promtool"))
        .args(["test", "rules", "tidemark-rules.test.yml"])
        .current_dir(&dir)
        .output()
        .expect("promtool");
    let out = String::from_utf8_lossy(&test.stdout);
    assert!(
        test.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&test.stderr)
    );
    // Every alert of docs/reference.md#reload-sighup-systemctl-reload-tidemark is in the rules.
    let rules = std::fs::read_to_string(format!("{dir}/tidemark-rules.yml")).unwrap();
    for a in [
        "TidemarkDown",
        "TidemarkSourceDown",
        "TidemarkOutboxGrowing",
        "TidemarkWatermarkLag",
        "TidemarkDevicesOffline",
        "TidemarkGatewayClockWrong",
        "TidemarkStateStoreFailing",
    ] {
        assert!(rules.contains(&format!("alert: {a}\n")), "{a}");
    }
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn a_real_prometheus_scrapes_the_gateway_and_every_dashboard_query_returns_data() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::stock();
    let http = free_port();
    let cfg = gateway_config(
        dir.path(),
        &dir.path().join("state"),
        broker.port,
        &broker,
        http,
        "",
        "[group_defaults]\nidle_timeout_ms = 2000\nheartbeat_timeout_ms = 3000\n",
    );
    let gw = Gateway::start(&cfg, &dir.path().join("gw.log"));
    let prom_port = free_port();
    let prom_cfg = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [\"{ROOT}/contrib/prometheus/tidemark-rules.yml\"]\n\
             scrape_configs:\n  - job_name: tidemark\n    static_configs:\n      - targets: [\"127.0.0.1:{http}\"]\n"
        ),
    )
    .unwrap();
    let _prom = Prometheus(
        Command::new(which("prometheus"))
            .arg(format!("--config.file={}", prom_cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus"),
    );
    // A fleet whose last devices fall silent (offline), while Prometheus scrapes.
    let sim = support::tidemark()
        .args([
            "simulate",
            "--url",
            &broker.url(),
            "--quiet",
            "--devices",
            "12",
        ])
        .args(["--rate", "48", "--duration-s", "12", "--silent", "3"])
        .args(["--silence-at-s", "2", "--silence-s", "600"])
        .args(["--late", "0.05", "--malformed", "0.05"])
        .output()
        .expect("simulate");
    assert!(sim.status.success());

    wait_or_explain(
        Duration::from_secs(60),
        || {
            std::net::TcpStream::connect(("127.0.0.1", prom_port)).is_ok()
                && query(prom_port, "tidemark_received_total > 0").len() == 1
        },
        || format!("no scrape:\n{}", gw.log_text()),
    );
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{ROOT}/contrib/grafana/tidemark.json")).unwrap(),
    )
    .expect("dashboard JSON");
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            exprs.push((
                p["title"].as_str().unwrap().to_owned(),
                t["expr"].as_str().unwrap().replace("$instance", ".*"),
            ));
        }
    }
    assert!(exprs.len() >= 20);
    for (title, e) in &exprs {
        wait_or_explain(
            Duration::from_secs(30),
            || !query(prom_port, e).is_empty(),
            || format!("panel {title:?}: {e} returns nothing"),
        );
    }
    // The rules loaded and evaluate, and a fleet with offline devices trips its alert.
    let (_, rules) = get(prom_port, "/api/v1/rules");
    let rules: Value = serde_json::from_str(&rules).unwrap();
    let list = rules["data"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .clone();
    assert_eq!(list.len(), 8, "{rules}");
    wait_or_explain(
        Duration::from_secs(30),
        || {
            let (_, r) = get(prom_port, "/api/v1/rules");
            let r: Value = serde_json::from_str(&r).unwrap();
            r["data"]["groups"][0]["rules"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["health"] == "ok")
        },
        || "a rule does not evaluate".into(),
    );
    wait_or_explain(
        Duration::from_secs(30),
        || !query(prom_port, "ALERTS{alertname=\"TidemarkDevicesOffline\"}").is_empty(),
        || {
            format!(
                "no offline alert: {:?}",
                query(prom_port, "tidemark_group_devices")
            )
        },
    );
    gw.terminate();
}
