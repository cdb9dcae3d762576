//! `[sink.influx]`: line protocol over HTTP, one batch in flight, each write of
//! a window with every field (docs/reference.md#sinkpostgres-and-sinkinflux).

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;

use super::rows::{AlertRow, ConditionRow, Row, WindowRow};
use super::{Failed, Refusals};
use crate::config::{Influx, InfluxApi};

/// A request unanswered this long: the database is out.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of an answer read at most.
const ANSWER_MAX: usize = 64 * 1024;

/// A byte stream to the server, plain or TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// The InfluxDB output.
pub struct Writer {
    cfg: Influx,
    gateway: String,
    path: String,
    auth: Option<String>,
    conn: Option<SendRequest<Full<Bytes>>>,
}

/// `,`, `=` and space escaped (tag keys, tag values, field keys).
fn key(out: &mut String, s: &str) {
    for c in s.chars() {
        if matches!(c, ',' | '=' | ' ' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// A string field value.
fn string_field(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// `,name=value` unless the value is empty (line protocol has no empty tag values).
fn tag(out: &mut String, name: &str, v: &str) {
    if !v.is_empty() {
        out.push(',');
        out.push_str(name);
        out.push('=');
        key(out, v);
    }
}

/// One point of a window: every field, so a later revision replaces the whole point.
fn window_line(out: &mut String, gateway: &str, w: &WindowRow) {
    out.push_str("tidemark_windows");
    tag(out, "device", &w.device);
    tag(out, "gateway", gateway);
    tag(out, "group", &w.group);
    let _ = write!(
        out,
        " revision={}i,readings={}i,heartbeats={}i",
        w.revision, w.readings, w.heartbeats
    );
    for (metric, aggs) in &w.metrics {
        let Some(aggs) = aggs.as_object() else {
            continue;
        };
        for (agg, v) in aggs {
            let Some(x) = v.as_f64().filter(|x| x.is_finite()) else {
                continue;
            };
            out.push(',');
            key(out, metric);
            out.push('_');
            key(out, agg);
            out.push('=');
            match (agg.as_str(), v.as_i64()) {
                ("count", Some(n)) => {
                    let _ = write!(out, "{n}i");
                }
                _ => {
                    let _ = write!(out, "{x:?}");
                }
            }
        }
    }
    let _ = writeln!(out, " {}", w.start);
}

fn alert_line(out: &mut String, gateway: &str, a: &AlertRow) {
    out.push_str("tidemark_alerts");
    tag(out, "device", &a.device);
    tag(out, "gateway", gateway);
    tag(out, "group", &a.group);
    tag(out, "type", &a.kind);
    out.push_str(" body=");
    string_field(out, &a.body.to_string());
    let _ = writeln!(out, " {}", a.at);
}

fn condition_line(out: &mut String, gateway: &str, c: &ConditionRow) {
    out.push_str("tidemark_conditions");
    tag(out, "device", &c.device);
    tag(out, "gateway", gateway);
    tag(out, "group", &c.group);
    tag(out, "name", &c.name);
    tag(out, "state", &c.state);
    out.push_str(" id=");
    string_field(out, &c.id);
    let _ = write!(out, ",window_end={}i,at={}i,body=", c.end, c.at);
    string_field(out, &c.body.to_string());
    let _ = writeln!(out, " {}", c.start);
}

/// The line protocol of `rows`.
pub fn lines(gateway: &str, rows: &[&Row]) -> String {
    let mut out = String::with_capacity(rows.len() * 256);
    for r in rows {
        match r {
            Row::Window(w) => window_line(&mut out, gateway, w),
            Row::Alert(a) => alert_line(&mut out, gateway, a),
            Row::Condition(c) => condition_line(&mut out, gateway, c),
        }
    }
    out
}

/// What the server said.
enum Answer {
    Written,
    /// Refused for the content (4xx): the message.
    Refused(String),
}

fn outage(e: impl std::fmt::Display) -> Failed {
    Failed::Outage(format!("influx: {e}"))
}

impl Writer {
    /// Not connected until the first write.
    pub fn new(cfg: Influx, gateway: String) -> Self {
        let q = |pairs: &[(&str, &str)]| {
            let mut s = form_urlencoded::Serializer::new(String::new());
            for (k, v) in pairs {
                s.append_pair(k, v);
            }
            s.finish()
        };
        let (path, auth) = match cfg.api {
            InfluxApi::V1 => (
                format!(
                    "/write?{}",
                    q(&[("db", &cfg.database), ("precision", "ms")])
                ),
                cfg.token.as_ref().map(|t| {
                    use base64::Engine as _;
                    format!(
                        "Basic {}",
                        base64::engine::general_purpose::STANDARD.encode(t)
                    )
                }),
            ),
            InfluxApi::V2 => (
                format!(
                    "/api/v2/write?{}",
                    q(&[
                        ("org", &cfg.org),
                        ("bucket", &cfg.database),
                        ("precision", "ms")
                    ])
                ),
                cfg.token.as_ref().map(|t| format!("Token {t}")),
            ),
        };
        Self {
            cfg,
            gateway,
            path,
            auth,
            conn: None,
        }
    }

    /// Points per request.
    pub fn batch_max(&self) -> usize {
        self.cfg.batch_max
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, Failed> {
        let a = &self.cfg.address;
        let tcp = tokio::net::TcpStream::connect((a.host.as_str(), a.port))
            .await
            .map_err(outage)?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = match &a.ca_file {
            None => Box::new(tcp),
            Some(ca) => {
                let cfg = super::tls::client_config(Some(ca)).map_err(outage)?;
                let name =
                    rustls::pki_types::ServerName::try_from(a.host.clone()).map_err(outage)?;
                Box::new(
                    tokio_rustls::TlsConnector::from(cfg)
                        .connect(name, tcp)
                        .await
                        .map_err(outage)?,
                )
            }
        };
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(outage)?;
        tokio::spawn(conn);
        Ok(send)
    }

    async fn post(&mut self, body: String) -> Result<Answer, Failed> {
        if self.conn.as_ref().is_none_or(|c| c.is_closed()) {
            self.conn = Some(self.connect().await?);
        }
        let Some(send) = self.conn.as_mut() else {
            return Err(outage("not connected"));
        };
        let a = &self.cfg.address;
        let mut req = hyper::Request::post(&self.path)
            .header(hyper::header::HOST, format!("{}:{}", a.host, a.port))
            .header(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8");
        if let Some(auth) = &self.auth {
            req = req.header(hyper::header::AUTHORIZATION, auth);
        }
        let req = req.body(Full::new(Bytes::from(body))).map_err(outage)?;
        let res = send.send_request(req).await.map_err(outage)?;
        let status = res.status().as_u16();
        // An answer is a status and a short error: a server sending more is cut off there.
        let body = http_body_util::Limited::new(res.into_body(), ANSWER_MAX)
            .collect()
            .await
            .map_err(outage)?
            .to_bytes();
        let msg = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| Some(v.get("error").or(v.get("message"))?.as_str()?.to_string()))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_string());
        match status {
            200..=299 => Ok(Answer::Written),
            // Not the content: credentials, a missing database, a rate limit.
            401 | 403 | 404 | 408 | 429 => Err(outage(format!("HTTP {status}: {msg}"))),
            400..=499 => Ok(Answer::Refused(format!("HTTP {status}: {msg}"))),
            _ => Err(outage(format!("HTTP {status}: {msg}"))),
        }
    }

    async fn post_in_time(&mut self, body: String) -> Result<Answer, Failed> {
        match tokio::time::timeout(TIMEOUT, self.post(body)).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(f)) => {
                self.conn = None;
                Err(f)
            }
            Err(_) => {
                self.conn = None;
                Err(outage("write timed out"))
            }
        }
    }

    /// The batch in one request; refused, each point alone (a point the batch
    /// had written is the same point again), the refused ones named.
    pub async fn write(&mut self, rows: &[Row]) -> Result<Refusals, Failed> {
        let mut keyed: Vec<(usize, Row)> = rows.iter().cloned().enumerate().collect();
        super::rows::dedup(&mut keyed);
        let all: Vec<&Row> = keyed.iter().map(|(_, r)| r).collect();
        let gateway = self.gateway.clone();
        match self.post_in_time(lines(&gateway, &all)).await? {
            Answer::Written => return Ok(Vec::new()),
            Answer::Refused(msg) if keyed.len() == 1 => return Ok(vec![(keyed[0].0, msg)]),
            Answer::Refused(_) => {}
        }
        let mut refusals = Vec::new();
        for (i, row) in &keyed {
            if let Answer::Refused(msg) = self.post_in_time(lines(&gateway, &[row])).await? {
                refusals.push((*i, msg));
            }
        }
        Ok(refusals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_one_point_with_every_field_and_ints_marked() {
        let m = serde_json::json!({"temp": {"count": 3, "sum": 6.5, "mean": 2.1666666666666665, "min": -1.0}});
        let w = Row::Window(WindowRow {
            id: "g/d/1000/2".into(),
            group: "g".into(),
            device: "d 1".into(),
            start: 1000,
            end: 2000,
            revision: 2,
            readings: 3,
            heartbeats: 1,
            metrics: m.as_object().unwrap().clone(),
        });
        let l = lines("gw", &[&w]);
        assert_eq!(
            l,
            "tidemark_windows,device=d\\ 1,gateway=gw,group=g revision=2i,readings=3i,heartbeats=1i,temp_count=3i,temp_mean=2.1666666666666665,temp_min=-1.0,temp_sum=6.5 1000\n"
        );
        let a = Row::Alert(AlertRow {
            group: String::new(),
            device: String::new(),
            kind: "gateway_clock".into(),
            at: 5,
            body: serde_json::json!({"type": "gateway_clock", "note": "a \"b\""}),
        });
        assert_eq!(
            lines("gw", &[&a]),
            "tidemark_alerts,gateway=gw,type=gateway_clock body=\"{\\\"note\\\":\\\"a \\\\\\\"b\\\\\\\"\\\",\\\"type\\\":\\\"gateway_clock\\\"}\" 5\n"
        );
    }
}
