//! `tidemark status`: a running gateway's live status (docs/reference.md#reload-sighup-systemctl-reload-tidemark) in a terminal,
//! read from its HTTP endpoint.

use std::fmt::Write as _;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use serde_json::Value;

use crate::engine::Liveness;
use crate::model::Millis;
use crate::run::status::api::{ClockState, DevicePage, DeviceRow, Status};
use crate::time::gateway::Verdict;

/// What to show, from where.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    /// `http://HOST:PORT` of the gateway's `[metrics] listen`.
    pub url: String,
    /// Bearer token (`metrics.token_file`'s content).
    pub token: Option<String>,
    /// One JSON document instead of tables.
    pub json: bool,
    /// Only devices of this group.
    pub group: Option<String>,
    /// Only devices in this state.
    pub state: Option<String>,
}

/// Why no status could be shown.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The URL is not `http://host:port`.
    #[error("--url {0:?}: want http://HOST:PORT (the gateway's metrics.listen)")]
    Url(String),
    /// No connection.
    #[error(
        "cannot reach the gateway at {url}: {source} (is it running, with [metrics] listen set to this address?)"
    )]
    Connect {
        /// The URL.
        url: String,
        /// Why.
        source: std::io::Error,
    },
    /// The endpoint said no.
    #[error("{path}: HTTP {status}: {body}")]
    Http {
        /// Path asked for.
        path: String,
        /// Status code.
        status: u16,
        /// Its explanation.
        body: String,
    },
    /// Anything else on the wire.
    #[error("{0}")]
    Wire(String),
}

/// `host:port` of `url`.
fn authority(url: &str) -> Result<String, StatusError> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || rest.contains("://") || !rest.contains(':') {
        return Err(StatusError::Url(url.to_owned()));
    }
    Ok(rest.to_owned())
}

struct Client {
    authority: String,
    url: String,
    token: Option<String>,
}

impl Client {
    async fn get(&self, path: &str) -> Result<Value, StatusError> {
        let wire = |e: &dyn std::fmt::Display| StatusError::Wire(format!("{path}: {e}"));
        let tcp = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| StatusError::Connect {
            url: self.url.clone(),
            source: std::io::ErrorKind::TimedOut.into(),
        })?
        .map_err(|source| StatusError::Connect {
            url: self.url.clone(),
            source,
        })?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| wire(&e))?;
        tokio::spawn(conn);
        let mut req = hyper::Request::get(path).header(hyper::header::HOST, &self.authority);
        if let Some(t) = &self.token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| wire(&e))?;
        let res = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
            .await
            .map_err(|_| wire(&"no answer within 10 s"))?
            .map_err(|e| wire(&e))?;
        let status = res.status().as_u16();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| wire(&e))?
            .to_bytes();
        let doc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status != 200 {
            let body = doc["error"].as_str().map_or_else(
                || String::from_utf8_lossy(&body).trim().to_owned(),
                str::to_owned,
            );
            return Err(StatusError::Http {
                path: path.to_owned(),
                status,
                body,
            });
        }
        Ok(doc)
    }

    /// `path` as the API's own type: a field renamed on one side is an error
    /// naming it, not a blank in the table.
    async fn typed<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, StatusError> {
        let doc = self.get(path).await?;
        serde_path_to_error::deserialize(doc).map_err(|e| {
            StatusError::Wire(format!(
                "{path}: the gateway answers in another layout (a different version?): {e}"
            ))
        })
    }
}

/// Everything shown: the status, the devices asked for (every page), the latest alerts.
struct Shown {
    status: Status,
    devices: Vec<DeviceRow>,
    /// `P/alerts` payloads, newest first.
    alerts: Vec<Value>,
}

async fn fetch(c: &Client, o: &StatusOptions) -> Result<Shown, StatusError> {
    let status = c.typed("/api/v1/status").await?;
    let alerts = c.typed("/api/v1/alerts?limit=20").await?;
    let mut devices = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("limit", "1000");
        if let Some(g) = &o.group {
            q.append_pair("group", g);
        }
        if let Some(s) = &o.state {
            q.append_pair("state", s);
        }
        if let Some(a) = &after {
            q.append_pair("after", a);
        }
        let page: DevicePage = c.typed(&format!("/api/v1/devices?{}", q.finish())).await?;
        devices.extend(page.devices);
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    Ok(Shown {
        status,
        devices,
        alerts,
    })
}

/// Shows the status; the text (or JSON) to print.
pub fn run(o: &StatusOptions) -> Result<String, StatusError> {
    let c = Client {
        authority: authority(&o.url)?,
        url: o.url.clone(),
        token: o.token.clone(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StatusError::Wire(e.to_string()))?;
    let shown = rt.block_on(fetch(&c, o))?;
    if o.json {
        let doc = serde_json::json!({
            "status": shown.status,
            "devices": shown.devices,
            "alerts": shown.alerts,
        });
        return Ok(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n");
    }
    let mut t = String::new();
    header(&mut t, &shown.status);
    groups(&mut t, &shown.status);
    devices(&mut t, &shown.devices, o);
    alerts(&mut t, &shown.alerts);
    Ok(t)
}

fn utc(t: Option<Millis>) -> String {
    t.map_or_else(
        || "-".into(),
        |t| crate::time::utc(t)[..19].replace('T', " "),
    )
}

fn dur(ms: Option<Millis>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    let a = ms.unsigned_abs();
    let sign = if ms < 0 { "-" } else { "" };
    match a {
        0..10_000 => format!("{sign}{a} ms"),
        10_000..120_000 => format!("{sign}{:.1} s", a as f64 / 1000.0),
        120_000..7_200_000 => format!("{sign}{} min", a / 60_000),
        _ => format!("{sign}{:.1} h", a as f64 / 3_600_000.0),
    }
}

/// Resident set against the limit, and the holds (docs/reference.md#memory).
fn memory_line(m: &crate::run::ceiling::MemoryStatus) -> String {
    let mib = |b: u64| b >> 20;
    let limit = m.limit_bytes.map_or_else(
        || "no limit".to_owned(),
        |l| format!("of {} MiB ({})", mib(l), m.limit_from),
    );
    let now = if m.held { "  INPUT HELD now" } else { "" };
    format!(
        "memory  {} MiB {limit}  input held {} times, {} in all{now}",
        mib(m.rss_bytes),
        m.holds,
        dur(Some(Millis::try_from(m.held_ms).unwrap_or(Millis::MAX)))
    )
}

/// One line for the standby pair (docs/reference.md#standby--two-boards-one-gateway).
fn pair_line(p: &crate::pair::Status) -> String {
    use crate::pair::{PeerStateName, Role};
    let role = match p.role {
        Role::Active => "active",
        Role::Standby => "standby",
    };
    let peer = match p.peer.state {
        PeerStateName::Synced => "synced",
        PeerStateName::CatchingUp => "CATCHING UP",
        PeerStateName::Lost => "LOST",
    };
    let other = if p.peer.node.is_empty() {
        "none heard"
    } else {
        p.peer.node.as_str()
    };
    format!(
        "pair    node {} {role}, epoch {}  peer {other} {peer}, last seen {} UTC  lag {} records, {}",
        p.node,
        p.epoch,
        utc(p.peer.last_seen),
        p.lag_records,
        dur(i64::try_from(p.lag_ms).ok())
    )
}

/// The gateway, its links, store, clock and counters.
fn header(t: &mut String, s: &Status) {
    let up = i64::try_from(s.uptime_s.saturating_mul(1000)).ok();
    let _ = writeln!(
        t,
        "gateway {}  version {}  config {}  up {}  (as of {} UTC)",
        s.gateway,
        s.version,
        s.config_hash,
        dur(up),
        utc(Some(s.at))
    );
    let link = |up: bool| if up { "connected" } else { "DOWN" };
    let c = &s.counters;
    let _ = writeln!(
        t,
        "source  {} since {} UTC  path proven {} ago, found dead {} times",
        link(s.source.connected),
        utc(Some(s.source.since)),
        dur(Some(s.source.proven_ago_ms)),
        c.source_path_down
    );
    let _ = writeln!(
        t,
        "sink    {}  outbox {} waiting, {} dropped  found dead {} times",
        link(s.sink.connected),
        s.sink.outbox_depth,
        s.sink.outbox_dropped,
        c.sink_path_down
    );
    let _ = writeln!(
        t,
        "store   {}  last commit {} UTC",
        if s.store.healthy {
            "ok".to_owned()
        } else {
            format!("FAILING: {}", s.store.detail.as_deref().unwrap_or("?"))
        },
        utc(s.store.last_commit_at)
    );
    if let Some(m) = &s.memory {
        let _ = writeln!(t, "{}", memory_line(m));
    }
    if let Some(p) = &s.pair {
        let _ = writeln!(t, "{}", pair_line(p));
    }
    for o in &s.outputs {
        let _ = writeln!(
            t,
            "output  {:<9} {}  {} pending, {} written, {} refused{}",
            o.name,
            link(o.connected),
            o.pending,
            o.written,
            o.refused,
            o.last_error
                .as_ref()
                .map_or(String::new(), |e| format!("  last error: {e}"))
        );
    }
    let gc = &s.gateway_clock;
    let _ = writeln!(
        t,
        "clock   {}{}",
        match gc.verdict {
            Verdict::Wrong => format!(
                "WRONG by {} (event times follow the devices)",
                dur(Some(gc.error_ms))
            ),
            Verdict::Trusted => "trusted".into(),
            Verdict::Unsure => "not judged yet".into(),
        },
        if gc.kernel_synced {
            ""
        } else {
            " (kernel reports it unsynchronized)"
        }
    );
    let _ = writeln!(
        t,
        "counts  received {} accepted {} late {} rejected {} duplicates {} missing {} windows {}",
        c.received,
        c.accepted,
        c.late,
        c.rejected.values().sum::<u64>(),
        c.duplicates,
        c.readings_missing,
        c.windows_emitted
    );
    let k = &c.conditions;
    if k.raised + k.cleared + k.retracted > 0 || s.groups.iter().any(|g| g.conditions_raised > 0) {
        let _ = writeln!(
            t,
            "conditions  raised now on {} devices  records: raised {} cleared {} retracted {}",
            s.groups.iter().map(|g| g.conditions_raised).sum::<u64>(),
            k.raised,
            k.cleared,
            k.retracted
        );
    }
}

fn groups(t: &mut String, s: &Status) {
    let _ = writeln!(
        t,
        "\n{:<20} {:<20} {:>10} {:>7} {:>6} {:>8} {:>13} {:>8} {:>9}",
        "GROUP",
        "WATERMARK (UTC)",
        "LAG",
        "ACTIVE",
        "IDLE",
        "OFFLINE",
        "OPEN WINDOWS",
        "BOUND",
        "LATENESS"
    );
    for g in &s.groups {
        let _ = writeln!(
            t,
            "{:<20} {:<20} {:>10} {:>7} {:>6} {:>8} {:>13} {:>8} {:>9}",
            g.group,
            utc(g.watermark),
            dur(g.lag_ms),
            g.devices_active,
            g.devices_idle,
            g.devices_offline,
            g.open_windows,
            dur(Some(g.bound_ms)),
            dur(Some(g.lateness_ms))
        );
    }
}

fn devices(t: &mut String, devices: &[DeviceRow], o: &StatusOptions) {
    // Asked for nothing in particular: the devices that need a look.
    let filtered = o.group.is_some() || o.state.is_some();
    let attention = |d: &&DeviceRow| {
        d.state != Liveness::Active
            || d.clock == ClockState::Distrusted
            || d.late > 0
            || !d.conditions.is_empty()
    };
    let shown: Vec<&DeviceRow> = if filtered {
        devices.iter().collect()
    } else {
        devices.iter().filter(attention).collect()
    };
    let _ = writeln!(
        t,
        "\n{:<20} {:<24} {:<8} {:<12} {:>10} {:<20} {:>9} {:>6} {:>6} {:>8}  RAISED",
        "GROUP",
        "DEVICE",
        "STATE",
        "CLOCK",
        "OFFSET MS",
        "LAST SEEN (UTC)",
        "ACCEPTED",
        "LATE",
        "DUPS",
        "MISSING"
    );
    for d in &shown {
        let _ = writeln!(
            t,
            "{:<20} {:<24} {:<8} {:<12} {:>10} {:<20} {:>9} {:>6} {:>6} {:>8}  {}",
            d.group,
            d.device,
            word(&d.state),
            word(&d.clock),
            d.offset_ms.map_or_else(|| "-".into(), |v| v.to_string()),
            utc(d.last_seen),
            d.accepted,
            d.late,
            d.duplicates,
            d.readings_missing,
            d.conditions.join(",")
        );
    }
    if !filtered {
        let _ = writeln!(
            t,
            "({} of {} devices need a look: idle, offline, distrusted clock, late readings \
             or a condition raised; \
             --state or --group lists others)",
            shown.len(),
            devices.len()
        );
    }
}

/// An enum as the API spells it.
fn word(v: &impl serde::Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn alerts(t: &mut String, list: &[Value]) {
    let _ = writeln!(t, "\nRECENT ALERTS (newest first)");
    if list.is_empty() {
        let _ = writeln!(t, "none");
    }
    for a in list.iter().take(10) {
        let who = match (a["group"].as_str(), a["device"].as_str()) {
            (Some(g), Some(d)) => format!("{g}/{d}"),
            _ => "gateway".into(),
        };
        let _ = writeln!(
            t,
            "{}  {:<16} {}",
            utc(a["at"].as_i64()),
            a["type"].as_str().unwrap_or("?"),
            who
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_host_and_port() {
        assert_eq!(
            authority("http://127.0.0.1:9464").unwrap(),
            "127.0.0.1:9464"
        );
        assert_eq!(authority("127.0.0.1:9464/").unwrap(), "127.0.0.1:9464");
        assert!(authority("https://x:1").is_err());
        assert!(authority("http://x").is_err());
        assert!(authority("http://x:1/api").is_err());
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(dur(Some(250)), "250 ms");
        assert_eq!(dur(Some(-15_000)), "-15.0 s");
        assert_eq!(dur(Some(600_000)), "10 min");
        assert_eq!(dur(Some(86_400_000)), "24.0 h");
        assert_eq!(dur(None), "-");
    }
}
