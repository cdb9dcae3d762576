//! The local HTTP endpoint (`[metrics] listen`): Prometheus `/metrics`,
//! `/healthz`, `/readyz`, the live status API and page (docs/reference.md#reload-sighup-systemctl-reload-tidemark).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;
use tokio::sync::mpsc::Sender;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::engine::Liveness;
use crate::model::Millis;
use crate::run::events::Inbound;
use crate::run::status::api::{self, Answer, DeviceFilter, Query};
use crate::run::status::registry::Registry;

/// The local HTTP endpoint, rebound when `[metrics]` changes.
pub struct Http {
    task: Option<JoinHandle<()>>,
    registry: Arc<Registry>,
    core: Sender<Inbound>,
    stop: watch::Receiver<bool>,
}

impl Http {
    /// Binds `addr` (a reload binds before it applies anything).
    pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
        tokio::net::TcpListener::bind(addr).await
    }

    /// Serves on `listener`, if any, with the `[metrics]` settings `cfg`.
    pub fn start(
        listener: Option<tokio::net::TcpListener>,
        cfg: &crate::config::Metrics,
        (registry, core): (Arc<Registry>, Sender<Inbound>),
        stop: watch::Receiver<bool>,
    ) -> Self {
        let mut h = Self {
            task: None,
            registry,
            core,
            stop,
        };
        h.serve(listener, cfg);
        h
    }

    /// Serves on `listener` (the one before is stopped).
    pub fn serve(
        &mut self,
        listener: Option<tokio::net::TcpListener>,
        cfg: &crate::config::Metrics,
    ) {
        if let Some(old) = self.task.take() {
            old.abort();
        }
        self.task = listener.map(|l| {
            let api = Api {
                registry: self.registry.clone(),
                core: self.core.clone(),
                limit_ms: cfg.health_timeout_ms,
                token: cfg.token.clone(),
            };
            tokio::spawn(serve(l, api, self.stop.clone()))
        });
    }

    /// Waits for the server to finish (after the stop).
    pub async fn finished(self) {
        if let Some(t) = self.task {
            let _ = t.await;
        }
    }

    /// Stops serving at once.
    pub fn abort(&self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Connections the HTTP endpoint serves at once.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a request waits for the core's answer before it is told the engine is busy.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The status page: one file, no external scripts, fonts or styles.
const PAGE: &str = include_str!("page.html");

/// What the endpoint serves from.
pub struct Api {
    /// Counters, health, alerts.
    pub registry: Arc<Registry>,
    /// Where status questions go.
    pub core: mpsc::Sender<Inbound>,
    /// `/healthz` fails past this.
    pub limit_ms: Millis,
    /// `Authorization: Bearer` token every request but the probes needs, if set.
    pub token: Option<String>,
}

/// Serves `api` on `listener` until `stop`.
pub async fn serve(listener: tokio::net::TcpListener, api: Api, mut stop: watch::Receiver<bool>) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            listen = %addr,
            token = api.token.is_some(),
            "HTTP endpoint: / (status page), /api/v1/…, /metrics, /healthz, /readyz"
        );
    }
    let api = Arc::new(api);
    // A flood of connections costs at most this many tasks and sockets; the
    // rest are closed at once (a scraper needs one).
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut refused: u64 = 0;
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("HTTP accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    refused,
                    "HTTP endpoint: {MAX_CONNECTIONS} connections open, closing new ones"
                );
            }
            drop(tcp);
            continue;
        };
        let api = api.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(respond(&req, &api).await) }
            });
            // Slow or garbage clients: headers within 5 s and 16 KiB, one request
            // per connection (no idle keep-alive holding a slot).
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .max_buf_size(16 * 1024)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
            drop(slot);
        });
    }
}

fn reply(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(hyper::header::CONTENT_TYPE, ctype.parse().expect("static"));
    h.insert(
        hyper::header::CACHE_CONTROL,
        "no-store".parse().expect("static"),
    );
    r
}

fn json(status: StatusCode, v: &impl serde::Serialize) -> Response<Full<Bytes>> {
    reply(
        status,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

fn error(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": msg }))
}

/// The bearer token matches (compared in constant time).
fn authorized<B>(req: &Request<B>, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `/healthz` and `/readyz`: open to all (a supervisor asks them), none for other paths.
fn probe(path: &str, api: &Api) -> Option<Response<Full<Bytes>>> {
    let health = &api.registry.health;
    match path {
        "/healthz" => {
            let mut problems = health.state().problems(api.limit_ms);
            // At once, not after a limit: the store is refusing commits right now.
            if let Some(p) = health.store_detail() {
                problems.insert(0, p);
            }
            Some(if problems.is_empty() {
                reply(StatusCode::OK, "text/plain", "ok\n")
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("unhealthy: {}\n", problems.join("; ")),
                )
            })
        }
        // Ready: state restored and input flowing in (what a tool or a test waits for).
        "/readyz" => Some(if health.subscribed.load(Ordering::Relaxed) {
            reply(StatusCode::OK, "text/plain", "ready\n")
        } else {
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "not ready: source not subscribed\n",
            )
        }),
        _ => None,
    }
}

/// `/api/v1/devices/{group}/{device}`, percent-decoded.
async fn device(api: &Api, rest: &str) -> Response<Full<Bytes>> {
    let parts: Vec<String> = rest
        .split('/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    match &parts[..] {
        [g, d] if !g.is_empty() && !d.is_empty() => {
            ask(
                api,
                Query::Device {
                    group: g.clone(),
                    device: d.clone(),
                },
            )
            .await
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "want /api/v1/devices/{group}/{device}",
        ),
    }
}

async fn respond<B>(req: &Request<B>, api: &Api) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    let path = req.uri().path();
    if let Some(r) = probe(path, api) {
        return r;
    }
    let health = &api.registry.health;
    let allowed = api.token.as_deref().is_none_or(|t| authorized(req, t));
    if path == "/" {
        // The page holds no data: without the token it still loads, asks for the
        // token and sends it with every API request.
        let status = if allowed {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        };
        return reply(status, "text/html; charset=utf-8", PAGE);
    }
    if !allowed {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "this endpoint needs `Authorization: Bearer TOKEN` (the token in metrics.token_file)",
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            "Bearer realm=\"tidemark\"".parse().expect("static"),
        );
        return r;
    }
    let params: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    match path {
        "/metrics" => {
            let text = health
                .prometheus
                .lock()
                .map(|p| p.clone())
                .unwrap_or_default();
            reply(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        "/api/v1/status" => ask(api, Query::Status).await,
        "/api/v1/alerts" => match limit(param("limit"), 100) {
            Ok(n) => json(StatusCode::OK, &api.registry.alerts.latest(n)),
            Err(e) => error(StatusCode::BAD_REQUEST, &e),
        },
        "/api/v1/devices" => match filter(&param) {
            Ok(f) => ask(api, Query::Devices(f)).await,
            Err(e) => error(StatusCode::BAD_REQUEST, &e),
        },
        p if p.starts_with("/api/v1/devices/") => device(api, &p["/api/v1/devices/".len()..]).await,
        _ => error(
            StatusCode::NOT_FOUND,
            "try /, /api/v1/status, /api/v1/devices, /api/v1/alerts, /metrics, /healthz or /readyz",
        ),
    }
}

/// `limit=N`: 1 or more, at most [`api::PAGE_MAX`] (larger asks get the largest page).
fn limit(v: Option<&str>, default: usize) -> Result<usize, String> {
    match v {
        None => Ok(default),
        Some(s) => match s.parse::<usize>() {
            Ok(0) | Err(_) => Err(format!(
                "limit {s:?}: want a whole number from 1 to {}",
                api::PAGE_MAX
            )),
            Ok(n) => Ok(n.min(api::PAGE_MAX)),
        },
    }
}

fn filter<'a>(param: &impl Fn(&str) -> Option<&'a str>) -> Result<DeviceFilter, String> {
    let state = match param("state") {
        None | Some("") => None,
        Some(s) => Some(
            Liveness::parse(s)
                .ok_or_else(|| format!("state {s:?}: want active, idle or offline"))?,
        ),
    };
    let after = match param("after") {
        None | Some("") => None,
        Some(k) => Some(
            api::parse_key(k)
                .ok_or_else(|| format!("after {k:?}: want the `next` of the previous page"))?,
        ),
    };
    let raised = match param("raised") {
        None | Some("" | "0" | "false") => false,
        Some("1" | "true") => true,
        Some(v) => return Err(format!("raised {v:?}: want true or false")),
    };
    Ok(DeviceFilter {
        group: param("group").filter(|g| !g.is_empty()).map(str::to_owned),
        state,
        limit: limit(param("limit"), api::PAGE_DEFAULT)?,
        after,
        raised,
    })
}

/// Asks the core and encodes its answer here, off the engine's thread.
async fn ask(api: &Api, q: Query) -> Response<Full<Bytes>> {
    let (tx, rx) = oneshot::channel();
    let answered = async {
        api.core.send(Inbound::Query(q, tx)).await.ok()?;
        rx.await.ok()
    };
    match tokio::time::timeout(ANSWER_WITHIN, answered).await {
        Ok(Some(Answer::Status(s))) => json(StatusCode::OK, &s),
        Ok(Some(Answer::Devices(p))) => json(StatusCode::OK, &p),
        Ok(Some(Answer::Device(Some(d)))) => json(StatusCode::OK, &d),
        Ok(Some(Answer::Device(None))) => error(StatusCode::NOT_FOUND, "no such device"),
        Ok(None) => error(StatusCode::SERVICE_UNAVAILABLE, "the gateway is stopping"),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine did not answer within 5 s (a long commit or a full disk?)",
        ),
    }
}
