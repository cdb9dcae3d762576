//! `tidemark fleet` (docs/reference.md#remote-configuration-fleet): `keygen` writes a signing key, `push` signs a
//! config document for one gateway and waits for its result, `ls` lists the
//! gateways on an upstream broker from their retained status and latest metrics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::config::{Endpoint, parse_url};
use crate::fleet::{ConfigResult, Document, Outcome, PrivateKey};
use crate::sys::link::{self, Client, Event, LinkOptions, Loop};

/// Why a fleet command failed: `Usage` exits 2, the rest 1.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// Bad arguments or files.
    #[error("{0}")]
    Usage(String),
    /// The broker or the gateway did not do its part.
    #[error("{0}")]
    Failed(String),
}

impl From<link::LinkError> for FleetError {
    fn from(e: link::LinkError) -> Self {
        Self::Failed(e.to_string())
    }
}

/// `fleet keygen --out FILE`: the private key (0600) and `FILE.pub`.
pub fn keygen(out: &Path) -> Result<PathBuf, FleetError> {
    let key = PrivateKey::generate().map_err(|e| FleetError::Failed(e.to_string()))?;
    key.write(out)
        .map_err(|e| FleetError::Usage(format!("--out {}: {e}", out.display())))
}

/// `fleet push`'s arguments.
pub struct PushOptions<'a> {
    /// The upstream broker.
    pub url: &'a str,
    /// The signing key (PEM, PKCS#8).
    pub key: &'a Path,
    /// The gateway's id.
    pub gateway: &'a str,
    /// The output prefix with `{gateway}` (the gateway's `sink.topic_prefix`).
    pub prefix: &'a str,
    /// The document id: above the last one the gateway applied.
    pub id: u64,
    /// The TOML document.
    pub config: &'a Path,
    /// How long to wait for the result.
    pub timeout: Duration,
    /// Epoch ms after which the gateway refuses it.
    pub not_after: Option<i64>,
    /// Sign the v1 form (no targets) for a gateway of an earlier release.
    pub v1: bool,
}

/// The signing key and the document's TOML, checked.
pub(super) fn key_and_text(key: &Path, config: &Path) -> Result<(PrivateKey, String), FleetError> {
    if let Some(w) = crate::config::readable_by_others("--key", &key.display().to_string()) {
        eprintln!("warning: {w}");
    }
    let key = PrivateKey::read(key)
        .map_err(|e| FleetError::Usage(format!("--key {}: {e}", key.display())))?;
    let text = std::fs::read_to_string(config)
        .map_err(|e| FleetError::Usage(format!("{}: {e}", config.display())))?;
    if let Err(e) = toml::from_str::<toml::Table>(&text) {
        return Err(FleetError::Usage(format!(
            "{}: not TOML: {}",
            config.display(),
            e.message()
        )));
    }
    Ok((key, text))
}

/// Signs and publishes the document (v2, for this gateway), waits for its
/// result; `Ok(result)` whatever it says (the caller exits by it).
pub fn push(o: &PushOptions<'_>) -> Result<ConfigResult, FleetError> {
    let (key, text) = key_and_text(o.key, o.config)?;
    let prefix = o.prefix.replace("{gateway}", o.gateway);
    let doc = if o.v1 {
        if o.not_after.is_some() {
            return Err(FleetError::Usage(
                "--expires-in-s needs a v2 document (not with --v1)".into(),
            ));
        }
        Document::signed_v1(o.id, text, &key)
    } else {
        if !crate::fleet::valid_target(o.gateway) {
            return Err(FleetError::Usage(format!(
                "--gateway {:?}: a gateway id is [A-Za-z0-9_-]{{1,64}} (or \"*\")",
                o.gateway
            )));
        }
        let targets = vec![o.gateway.to_owned()];
        Document::signed(o.id, text, (targets, o.not_after), &key)
    };
    let doc = serde_json::to_vec(&doc).map_err(|e| FleetError::Failed(e.to_string()))?;
    let (client, mut lp) = connect(o.url, "push")?;
    let result_topic = format!("{prefix}/config/result");
    let set_topic = format!("{prefix}/config/set");
    runtime()?.block_on(async {
        let wait = async {
            let mut published = false;
            loop {
                match lp.poll().await {
                    Ok(Event::Connected { .. }) => {
                        client.subscribe(std::slice::from_ref(&result_topic), 1)?;
                    }
                    // Subscribed first, so the result cannot slip by.
                    Ok(Event::Subscribed { .. }) if !published => {
                        client.publish(&set_topic, doc.clone(), 1, false)?;
                        published = true;
                        eprintln!(
                            "document {} published to {set_topic}; waiting for the result",
                            o.id
                        );
                    }
                    // A retained result is an earlier document's.
                    Ok(Event::Message {
                        topic,
                        payload,
                        retained: false,
                        ..
                    }) if topic == result_topic => {
                        if let Some(r) = decode(&payload)
                            .and_then(|v| serde_json::from_value::<ConfigResult>(v).ok())
                            .filter(|r| r.id == Some(o.id))
                        {
                            return Ok(r);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        return Err(FleetError::Failed(format!("{}: {e}", o.url)));
                    }
                }
            }
        };
        let r = tokio::time::timeout(o.timeout, wait).await.map_err(|_| {
            FleetError::Failed(format!(
                "no result from gateway {} within {} s (is it online, with [fleet] enabled?)",
                o.gateway,
                o.timeout.as_secs()
            ))
        })?;
        let _ = client.disconnect();
        r
    })
}

/// Exit code of a result: 0 applied, 1 otherwise.
pub fn applied(r: &ConfigResult) -> bool {
    r.result == Outcome::Applied
}

/// One gateway as `fleet ls` shows it.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Row {
    /// Gateway id (the topic level before `status`).
    pub id: String,
    /// Its output prefix.
    pub prefix: String,
    /// `online` or `offline`.
    pub state: String,
    /// tidemark version.
    pub version: Option<String>,
    /// Config hash in force.
    pub config_hash: Option<String>,
    /// Epoch ms of its start.
    pub started_at: Option<i64>,
    /// Groups in its latest metrics.
    pub groups: Option<Vec<String>>,
    /// The largest watermark lag of its groups, ms.
    pub worst_lag_ms: Option<i64>,
    /// Outputs waiting in its outbox.
    pub outbox_depth: Option<u64>,
    /// Devices offline over all groups.
    pub devices_offline: Option<u64>,
    /// Its `gateway_clock` figures (verdict, error_ms, kernel_synced...).
    pub gateway_clock: Option<Value>,
    /// Epoch ms of the latest metrics.
    pub metrics_at: Option<i64>,
    /// The id of the remote document in force (its status's `config_id`).
    pub config_id: Option<u64>,
    /// The id of the retained desired document (`P/config/desired`).
    pub desired_id: Option<u64>,
    /// Its applied id is below the desired one.
    pub drift: bool,
}

/// `fleet ls`'s arguments.
pub struct LsOptions<'a> {
    /// The upstream broker.
    pub url: &'a str,
    /// Topic filter of the gateways' prefixes.
    pub prefix_filter: &'a str,
    /// JSON instead of a table.
    pub json: bool,
    /// Keep the table live until Ctrl-C.
    pub watch: bool,
    /// Longest wait for the metrics of gateways that are online.
    pub wait: Duration,
}

/// Lists the gateways; returns how many.
pub fn ls(o: &LsOptions<'_>) -> Result<usize, FleetError> {
    crate::topic::validate_filter(o.prefix_filter)
        .map_err(|e| FleetError::Usage(format!("--prefix-filter {:?}: {e}", o.prefix_filter)))?;
    let (client, mut lp) = connect(o.url, "ls")?;
    let filters = vec![
        format!("{}/status", o.prefix_filter),
        format!("{}/metrics", o.prefix_filter),
        format!("{}/config/desired", o.prefix_filter),
    ];
    runtime()?.block_on(async {
        let mut rows: BTreeMap<String, Row> = BTreeMap::new();
        let clock = crate::sys::clock::SystemClock::new();
        let mut subscribed_at: Option<i64> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let stop = crate::sys::shutdown_signal();
        tokio::pin!(stop);
        let mut drawn_at = clock.mono();
        loop {
            tokio::select! {
                ev = lp.poll() => match ev {
                    Ok(Event::Connected { .. }) => client.subscribe(&filters, 1)?,
                    Ok(Event::Subscribed { .. }) => {
                        subscribed_at.get_or_insert_with(|| clock.mono());
                    }
                    Ok(Event::Message { topic, payload, .. }) => seen(&mut rows, &topic, &payload),
                    Ok(_) => {}
                    Err(e) => return Err(FleetError::Failed(format!("{}: {e}", o.url))),
                },
                _ = tick.tick() => {
                    let Some(at) = subscribed_at else { continue };
                    if o.watch {
                        if clock.mono() - drawn_at >= 1000 {
                            drawn_at = clock.mono();
                            print!("\x1b[2J\x1b[H{}", table(&rows));
                        }
                        continue;
                    }
                    // Retained statuses come right after the SUBACK; metrics every interval_s.
                    let waited = clock.mono() - at;
                    let settled = waited >= 500;
                    let complete = rows.values().all(|r| r.state != "online" || r.metrics_at.is_some());
                    if settled && (complete || waited >= i64::try_from(o.wait.as_millis()).unwrap_or(i64::MAX)) {
                        break;
                    }
                }
                () = &mut stop => break,
            }
        }
        let _ = client.disconnect();
        if o.json {
            let list: Vec<&Row> = rows.values().collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&list).unwrap_or_default()
            );
        } else if !o.watch {
            print!("{}", table(&rows));
        }
        Ok(rows.len())
    })
}

pub(super) fn seen(rows: &mut BTreeMap<String, Row>, topic: &str, payload: &[u8]) {
    let (prefix, leaf) = match topic.strip_suffix("/config/desired") {
        Some(p) => (p, "desired"),
        None => topic.rsplit_once('/').unwrap_or((topic, "")),
    };
    // An emptied retained desired document: none any more.
    let v = if leaf == "desired" && payload.is_empty() {
        Value::Null
    } else {
        let Some(v) = decode(payload) else { return };
        v
    };
    let row = rows.entry(prefix.to_owned()).or_insert_with(|| Row {
        id: prefix.rsplit('/').next().unwrap_or(prefix).to_owned(),
        prefix: prefix.to_owned(),
        state: "unknown".into(),
        ..Row::default()
    });
    let s = |v: &Value| v.as_str().map(str::to_owned);
    match leaf {
        "status" => {
            row.state = s(&v["state"]).unwrap_or_else(|| "unknown".into());
            row.version = s(&v["version"]);
            row.config_hash = s(&v["config_hash"]);
            row.started_at = v["started_at"].as_i64();
            row.config_id = v["config_id"].as_u64();
        }
        "desired" => row.desired_id = v["id"].as_u64(),
        "metrics" => {
            let groups = v["groups"].as_object();
            row.groups = groups.map(|g| g.keys().cloned().collect());
            row.worst_lag_ms =
                groups.and_then(|g| g.values().filter_map(|g| g["lag_ms"].as_i64()).max());
            row.devices_offline = groups.map(|g| {
                g.values()
                    .filter_map(|g| g["devices_offline"].as_u64())
                    .sum()
            });
            row.outbox_depth = v["counters"]["outbox_depth"].as_u64();
            row.gateway_clock = v.get("gateway_clock").cloned();
            row.metrics_at = v["at"].as_i64();
            if row.state == "unknown" {
                row.state = "online".into();
            }
        }
        _ => {}
    }
    row.drift = row
        .desired_id
        .is_some_and(|d| row.config_id.unwrap_or(0) < d);
}

/// The table `fleet ls` prints.
pub fn table(rows: &BTreeMap<String, Row>) -> String {
    let dash = || "-".to_owned();
    let mut lines = vec![
        [
            "GATEWAY",
            "STATE",
            "VERSION",
            "CONFIG",
            "GROUPS",
            "WORST LAG",
            "OUTBOX",
            "OFFLINE",
            "CLOCK",
            "CONFIG ID",
            "DESIRED ID",
        ]
        .map(str::to_owned),
    ];
    for r in rows.values() {
        lines.push([
            r.id.clone(),
            r.state.clone(),
            r.version.clone().unwrap_or_else(dash),
            r.config_hash.clone().unwrap_or_else(dash),
            r.groups.as_ref().map_or_else(dash, |g| g.len().to_string()),
            r.worst_lag_ms
                .map_or_else(dash, |l| format!("{:.1}s", l as f64 / 1000.0)),
            r.outbox_depth.map_or_else(dash, |d| d.to_string()),
            r.devices_offline.map_or_else(dash, |d| d.to_string()),
            r.gateway_clock.as_ref().map_or_else(dash, clock),
            r.config_id.map_or_else(dash, |i| i.to_string()),
            match (r.desired_id, r.drift) {
                (None, _) => dash(),
                (Some(d), false) => d.to_string(),
                (Some(d), true) => format!("{d} drift"),
            },
        ]);
    }
    let widths: Vec<usize> = (0..11)
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str("(no gateway has published a status on this broker)\n");
    }
    out
}

/// `trusted`, or `wrong -86400024ms`.
fn clock(c: &Value) -> String {
    let verdict = c["verdict"].as_str().unwrap_or("-");
    match c["error_ms"].as_i64() {
        Some(e) if e != 0 => format!("{verdict} {e:+}ms"),
        _ => verdict.to_owned(),
    }
}

/// JSON or CBOR (`[sink] format`) into a JSON value.
pub(super) fn decode(payload: &[u8]) -> Option<Value> {
    serde_json::from_slice(payload)
        .ok()
        .or_else(|| ciborium::from_reader::<Value, _>(payload).ok())
}

pub(super) fn connect(url: &str, what: &str) -> Result<(Client, Loop), FleetError> {
    let (tls, host, port) = parse_url(url).map_err(|e| FleetError::Usage(format!("--url: {e}")))?;
    let endpoint = Endpoint::plain(
        tls,
        host,
        port,
        format!("tidemark-fleet-{what}-{}", std::process::id()),
        1,
    );
    Ok(link::build(&LinkOptions::tool(&endpoint, 10))?)
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime, FleetError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| FleetError::Failed(e.to_string()))
}
