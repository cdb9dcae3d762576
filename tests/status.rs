//! The live status (docs/reference.md#reload-sighup-systemctl-reload-tidemark) of the real binary against a simulated fleet on a
//! stock mosquitto, with devices that go offline and one clock two hours
//! ahead: the API, `tidemark status --json`, `P/metrics` and the page in a real
//! Chromium agree; paging returns every device once; with `token_file` every
//! request but the probes needs the bearer token.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use support::*;

const DEVICES: u32 = 12;
const SILENT: u32 = 3;

fn api(port: u16, path: &str) -> Value {
    let (status, body) = http_get(port, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

fn simulate(broker: &Mosquitto, seconds: u32) -> std::process::Output {
    support::tidemark()
        .args(["simulate", "--url", &broker.url(), "--quiet", "--seed", "7"])
        .args(["--devices", &DEVICES.to_string(), "--rate", "24"])
        .args(["--duration-s", &seconds.to_string(), "--duplicates", "0.05"])
        .args(["--silent", &SILENT.to_string(), "--silence-at-s", "3"])
        .args(["--silence-s", "600", "--clock-offset", "1:7200000"])
        .output()
        .expect("simulate")
}

/// Every device by following `next` with pages of `limit`.
fn all_pages(port: u16, query: &str, limit: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = String::new();
    for _ in 0..100 {
        let page = api(
            port,
            &format!("/api/v1/devices?limit={limit}{query}&after={after}"),
        );
        let list = page["devices"].as_array().expect("devices").clone();
        assert!(list.len() <= limit);
        out.extend(list);
        match page["next"].as_str() {
            Some(n) => after = n.to_owned(),
            None => return out,
        }
    }
    panic!("paging did not end");
}

fn names(devices: &[Value]) -> Vec<String> {
    devices
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["group"].as_str().unwrap(),
                d["device"].as_str().unwrap()
            )
        })
        .collect()
}

/// The figures every view must agree on.
fn figures(counters: &Value, groups: &[(String, Value)]) -> Value {
    let mut c = counters.clone();
    // outbox_depth moves with every delivery; the rest only with input.
    c.as_object_mut().unwrap().remove("outbox_depth");
    let g: Vec<Value> = groups
        .iter()
        .map(|(name, g)| {
            // The watermark of an idle group moves on with processing time, so
            // it is compared apart (a later view never shows an earlier one).
            serde_json::json!([
                name,
                g["devices_active"],
                g["devices_idle"],
                g["devices_offline"],
                g["bound_ms"],
                g["lateness_ms"]
            ])
        })
        .collect();
    serde_json::json!({ "counters": c, "groups": g })
}

fn status_figures(status: &Value) -> Value {
    let groups: Vec<(String, Value)> = status["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["group"].as_str().unwrap().to_owned(), g.clone()))
        .collect();
    figures(&status["counters"], &groups)
}

fn metrics_figures(m: &Value) -> Value {
    let groups: Vec<(String, Value)> = m["groups"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    figures(&m["counters"], &groups)
}

fn status_cli(args: &[&str]) -> std::process::Output {
    support::tidemark()
        .arg("status")
        .args(args)
        .output()
        .expect("tidemark status")
}

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
#[test]
fn api_status_cli_metrics_and_the_page_in_chromium_agree_on_a_fleet_with_offline_devices_and_a_wrong_clock()
 {
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
        "[group_defaults]\nidle_timeout_ms = 2000\nheartbeat_timeout_ms = 3000\n\
         window = { kind = \"tumbling\", size_ms = 2000 }\n\
         [[group_defaults.conditions]]\nname = \"heard\"\nwhen = \"count >= 1\"\n\
         [groups.lab]\nout_of_orderness_ms = \"auto\"\nallowed_lateness_ms = \"auto\"\n",
    );
    let up = Collector::start(broker.port, "tidemark/gw/#", "status-test-up");
    let gw = Gateway::start(&cfg, &dir.path().join("gw.log"));
    let sim = simulate(&broker, 10);
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
    let sent: Value = serde_json::from_slice(&sim.stdout).expect("simulate summary");

    // Quiet: everything sent is counted, the silent devices are offline.
    wait_or_explain(
        Duration::from_secs(60),
        || {
            let s = api(http, "/api/v1/status");
            s["counters"]["received"] == sent["sent"]
                && s["groups"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g["devices_offline"].as_u64().unwrap())
                    .sum::<u64>()
                    >= u64::from(SILENT)
        },
        || {
            format!(
                "not quiet: {}\n{}",
                http_get(http, "/api/v1/status").1,
                gw.log_text()
            )
        },
    );

    // Paging: every device exactly once, in (group, device) order, at any page size.
    let whole = all_pages(http, "", 1000);
    assert_eq!(whole.len(), DEVICES as usize, "{whole:?}");
    let keys = names(&whole);
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    for limit in [1, 5, 7] {
        assert_eq!(names(&all_pages(http, "", limit)), keys, "limit {limit}");
    }
    // Filters: one group; one state (paged too).
    let hall = all_pages(http, "&group=hall", 2);
    assert!(!hall.is_empty() && hall.iter().all(|d| d["group"] == "hall"));
    assert_eq!(
        hall.len(),
        whole.iter().filter(|d| d["group"] == "hall").count()
    );
    let offline = all_pages(http, "&state=offline", 2);
    assert!(offline.len() >= SILENT as usize, "{offline:?}");
    assert!(offline.iter().all(|d| d["state"] == "offline"));
    // The clock two hours ahead is distrusted, the others calibrated.
    let distrusted: Vec<&Value> = whole
        .iter()
        .filter(|d| d["clock"] == "distrusted")
        .collect();
    assert_eq!(distrusted.len(), 1, "{whole:?}");
    assert!(distrusted[0]["offset_ms"].as_i64().unwrap() < -7_000_000);
    assert!(whole.iter().any(|d| d["duplicates"].as_u64() > Some(0)));
    let per_device: u64 = whole.iter().map(|d| d["accepted"].as_u64().unwrap()).sum();

    // One device with its open windows; an unknown one is 404; bad parameters are named.
    let one = &whole[0];
    let path = format!(
        "/api/v1/devices/{}/{}",
        one["group"].as_str().unwrap(),
        one["device"].as_str().unwrap()
    );
    let detail = api(http, &path);
    assert_eq!(detail["device"], one["device"]);
    assert!(detail["open_windows"].is_array());
    assert_eq!(http_get(http, "/api/v1/devices/hall/nobody").0, 404);
    let (code, body) = http_get(http, "/api/v1/devices?state=asleep");
    assert_eq!(code, 400);
    assert!(body.contains("state"), "{body}");

    // Alerts: the offline devices and the distrusted clock, newest first.
    let alerts = api(http, "/api/v1/alerts?limit=1000");
    let kinds: BTreeSet<&str> = alerts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["type"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains("offline") && kinds.contains("clock_skew"),
        "{alerts}"
    );
    let at: Vec<i64> = alerts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["at"].as_i64().unwrap())
        .collect();
    assert!(at.windows(2).all(|w| w[0] >= w[1]), "{at:?}");

    // API, `status --json` and P/metrics agree: each status read is compared with
    // the first P/metrics published after it (every `interval_s`).
    let url = format!("http://127.0.0.1:{http}");
    let why = std::cell::RefCell::new(String::new());
    wait_or_explain(
        Duration::from_secs(60),
        || {
            let s = api(http, "/api/v1/status");
            let cli = status_cli(&["--url", &url, "--json"]);
            let cli: Value = serde_json::from_slice(&cli.stdout).unwrap_or(Value::Null);
            let after = s["at"].as_i64().unwrap();
            let next_metrics = || {
                up.on("/metrics")
                    .into_iter()
                    .map(|m| m.json())
                    .find(|m| m["at"].as_i64().unwrap_or(0) > after)
            };
            // Up to 25 s, well past one `interval_s`.
            let Some(m) = (0..500).find_map(|_| {
                let m = next_metrics();
                if m.is_none() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                m
            }) else {
                *why.borrow_mut() = format!("no P/metrics after {after}");
                return false;
            };
            let f = status_figures(&s);
            let marks = |groups: &[Value]| -> Vec<i64> {
                groups
                    .iter()
                    .map(|g| g["watermark"].as_i64().unwrap_or(i64::MIN))
                    .collect()
            };
            let api_marks = marks(s["groups"].as_array().unwrap());
            let cli_marks = marks(cli["status"]["groups"].as_array().map_or(&[][..], |g| g));
            let m_marks: Vec<i64> = m["groups"]
                .as_object()
                .unwrap()
                .values()
                .map(|g| g["watermark"].as_i64().unwrap_or(i64::MIN))
                .collect();
            let not_before = |later: &[i64]| {
                later.len() == api_marks.len() && later.iter().zip(&api_marks).all(|(l, a)| l >= a)
            };
            let mut w = why.borrow_mut();
            *w = if !not_before(&cli_marks) || !not_before(&m_marks) {
                format!(
                    "watermarks went back: API {api_marks:?}, status --json {cli_marks:?}, P/metrics {m_marks:?}"
                )
            } else if cli["devices"].as_array().map(Vec::len) != Some(DEVICES as usize) {
                format!("status --json devices: {cli}")
            } else if f != status_figures(&cli["status"]) {
                format!(
                    "API {f} vs status --json {}",
                    status_figures(&cli["status"])
                )
            } else if f != metrics_figures(&m) {
                format!("API {f} vs P/metrics {}", metrics_figures(&m))
            } else if s["counters"]["accepted"].as_u64() != Some(per_device) {
                format!(
                    "accepted {} vs sum over devices {per_device}",
                    s["counters"]["accepted"]
                )
            } else {
                return true;
            };
            false
        },
        || format!("views disagree: {}", why.borrow()),
    );
    // The bound in force: hall's fixed value, what lab learned (docs/reference.md#group_defaults-and-groupsname), in every view.
    let s = api(http, "/api/v1/status");
    let group = |name: &str| {
        s["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["group"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        (
            group("hall")["bound_ms"].as_i64(),
            group("hall")["lateness_ms"].as_i64()
        ),
        (Some(2000), Some(30_000))
    );
    let lab = group("lab")["bound_ms"].as_i64().unwrap();
    assert!((100..=600_000).contains(&lab), "{lab}");
    let prom = support::metrics(http);
    assert!(
        prom.contains("tidemark_watermark_bound_ms{group=\"hall\"} 2000")
            && prom.contains("tidemark_watermark_bound_ms{group=\"lab\"}")
            && prom.contains("tidemark_group_allowed_lateness_seconds{group=\"hall\"} 30.000"),
        "{prom}"
    );
    // Conditions (docs/conditions.md): every record published is counted, in
    // the API and on /metrics; the devices with one raised are listed and filtered.
    wait_or_explain(
        Duration::from_secs(30),
        || {
            let c = &api(http, "/api/v1/status")["counters"]["conditions"];
            let published = up.on("/conditions/").len() as u64;
            let prom = support::metrics(http);
            let raised: u64 = prom
                .lines()
                .filter(|l| {
                    l.starts_with("tidemark_conditions_total{") && l.contains("state=\"raised\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum();
            published > 0 && c["raised"].as_u64() == Some(published) && raised == published
        },
        || {
            format!(
                "status {} published {}",
                api(http, "/api/v1/status")["counters"]["conditions"],
                up.on("/conditions/").len()
            )
        },
    );
    let raised = all_pages(http, "&raised=true", 3);
    assert!(!raised.is_empty());
    assert!(
        raised
            .iter()
            .all(|d| d["conditions"] == serde_json::json!(["heard"]))
    );
    let every = all_pages(http, "", 1000);
    let with: Vec<&Value> = every
        .iter()
        .filter(|d| d.get("conditions").is_some())
        .collect();
    assert_eq!(
        names(&raised),
        names(&with.into_iter().cloned().collect::<Vec<_>>())
    );
    // The text view names what needs a look.
    let text = status_cli(&["--url", &url]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("distrusted") && text.contains("offline") && text.contains("BOUND"),
        "{text}"
    );
    assert!(
        text.contains("conditions  raised now on") && text.contains(" heard"),
        "{text}"
    );
    // Filters: only the offline devices of lab, the same ones the API lists (states
    // move on as the fleet stays quiet, so both are read again until they agree).
    wait_or_explain(
        Duration::from_secs(30),
        || {
            let text = status_cli(&["--url", &url, "--state", "offline", "--group", "lab"]);
            let text = String::from_utf8_lossy(&text.stdout).into_owned();
            let rows: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("lab ") || l.starts_with("hall "))
                .filter(|l| l.split_whitespace().nth(2) == Some("offline"))
                .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join("/"))
                .collect();
            let api = names(&all_pages(http, "&state=offline&group=lab", 1000));
            rows.len() >= 2 && rows == api
        },
        || "status --state offline --group lab disagrees with the API".into(),
    );

    // The page, rendered by a real browser against the running gateway.
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let dom = chromium(&url, &["--dump-dom"]);
    assert!(
        dom.contains("data-loaded=\"1\""),
        "page did not load its data:\n{dom}"
    );
    for d in &keys {
        let (g, id) = d.split_once('/').unwrap();
        assert!(
            dom.contains(&format!("<td>{g}</td><td>{id}</td>")),
            "{d} missing from the page"
        );
    }
    assert!(dom.contains(">distrusted<") && dom.contains(">offline<"));
    assert!(
        dom.contains("conditions raised</th>") && dom.contains("<td class=\"bad\">heard</td>"),
        "conditions column"
    );
    assert!(
        dom.contains(">bound</th>") && dom.contains(">2000 ms</td>"),
        "bound column"
    );
    assert!(
        dom.contains("<div class=\"k\">memory</div><div class=\"v \">") && dom.contains(" MiB"),
        "memory card"
    );
    let received = api(http, "/api/v1/status")["counters"]["received"].to_string();
    assert!(
        dom.contains(&format!("<div class=\"v \">{received}</div>")),
        "received {received}"
    );
    chromium(
        &url,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1100,1400",
        ],
    );
    assert!(
        std::fs::metadata(&shot)
            .map(|m| m.len() > 10_000)
            .unwrap_or(false)
    );
    gw.terminate();
}

fn get_with(port: u16, path: &str, token: &str) -> (u16, String) {
    http_request(
        port,
        path,
        "1.1",
        &format!("Authorization: Bearer {token}\r\n"),
    )
}

#[test]
fn with_a_token_file_every_request_but_the_probes_needs_the_bearer_token_and_any_address_may_listen()
 {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::stock();
    let http = free_port();
    // Without a token a non-loopback address is refused, naming the key.
    let open = gateway_config(
        dir.path(),
        &dir.path().join("state"),
        broker.port,
        &broker,
        http,
        "",
        "",
    );
    let text = std::fs::read_to_string(&open)
        .unwrap()
        .replace("127.0.0.1:{http}", "");
    let text = text.replace(
        &format!("listen = \"127.0.0.1:{http}\""),
        &format!("listen = \"0.0.0.0:{http}\""),
    );
    std::fs::write(&open, &text).unwrap();
    let check = support::tidemark()
        .args(["check", "--config"])
        .arg(&open)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&check.stderr).contains("metrics.listen"));
    // A token too short is refused as well.
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "short\n").unwrap();
    std::fs::write(
        &open,
        format!("{text}token_file = \"{}\"\n", token_file.display()),
    )
    .unwrap();
    let check = support::tidemark()
        .args(["check", "--config"])
        .arg(&open)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&check.stderr).contains("metrics.token_file"));

    let token = "3b8f0d6c2a914e57b1c0aa7d55e2f019";
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let gw = Gateway::start(&open, &dir.path().join("gw.log"));
    wait_until(Duration::from_secs(30), "endpoint up", || {
        http_get(http, "/healthz").0 == 200
    });
    assert_eq!(http_get(http, "/readyz").0, 200);
    for path in [
        "/api/v1/status",
        "/api/v1/devices",
        "/api/v1/alerts",
        "/metrics",
        "/api/v1/devices/g/d",
    ] {
        assert_eq!(http_get(http, path).0, 401, "{path} without a token");
        assert_eq!(
            get_with(http, path, "wrong-token-of-the-same-length!!").0,
            401,
            "{path}"
        );
    }
    // The page loads without the token (it holds no data) and asks for it.
    let (code, page) = http_get(http, "/");
    assert_eq!(code, 401);
    assert!(page.contains("prompt("));
    let (code, body) = get_with(http, "/api/v1/status", token);
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["gateway"],
        "gw"
    );
    assert_eq!(get_with(http, "/metrics", token).0, 200);
    // `tidemark status` takes the token from the config, or fails saying why.
    let url = format!("http://127.0.0.1:{http}");
    let ok = status_cli(&["--config", open.to_str().unwrap(), "--url", &url]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let denied = status_cli(&["--url", &url]);
    assert_eq!(denied.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&denied.stderr).contains("401"));
    let ok = status_cli(&[
        "--url",
        &url,
        "--token-file",
        token_file.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok.status.success());
    gw.terminate();
}
