//! `[sink.postgres]`: batched upserts guarded by revision, one transaction per
//! batch (docs/reference.md#sinkpostgres-and-sinkinflux).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::{Client, NoTls, Socket, Statement};

use super::rows::{AlertRow, ConditionRow, Row, WindowRow};
use super::{Failed, Refusals};
use crate::config::Postgres;

/// A statement or a connect that takes longer: the database is out.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The tables (docs/reference.md#sinkpostgres-and-sinkinflux).
pub fn ddl(cfg: &Postgres) -> String {
    let (w, a, c) = (
        cfg.table("windows"),
        cfg.table("alerts"),
        cfg.table("conditions"),
    );
    format!(
        "CREATE TABLE IF NOT EXISTS {w} (
  result_id text NOT NULL, gateway text NOT NULL, group_id text NOT NULL, device text NOT NULL,
  window_start timestamptz NOT NULL, window_end timestamptz NOT NULL, revision integer NOT NULL,
  readings bigint NOT NULL, heartbeats bigint NOT NULL, metrics jsonb NOT NULL,
  written_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (gateway, group_id, device, window_start));
CREATE TABLE IF NOT EXISTS {a} (
  gateway text NOT NULL, group_id text NOT NULL, device text NOT NULL, type text NOT NULL,
  at timestamptz NOT NULL, body jsonb NOT NULL,
  PRIMARY KEY (gateway, group_id, device, type, at));
CREATE TABLE IF NOT EXISTS {c} (
  id text NOT NULL, gateway text NOT NULL, group_id text NOT NULL, device text NOT NULL,
  name text NOT NULL, state text NOT NULL, window_start timestamptz NOT NULL,
  window_end timestamptz NOT NULL, at timestamptz NOT NULL, body jsonb NOT NULL,
  PRIMARY KEY (gateway, id));"
    )
}

/// ms since the epoch as a `timestamptz`, exactly.
const TS: &str = "'epoch'::timestamptz + interval '1 millisecond' *";

fn upsert_windows(cfg: &Postgres) -> String {
    let w = cfg.table("windows");
    format!(
        "INSERT INTO {w} AS t (result_id, gateway, group_id, device, window_start, window_end, revision, readings, heartbeats, metrics, written_at)
SELECT u.id, $1, u.g, u.d, {TS} u.s, {TS} u.e, u.rev, u.n, u.hb, u.m::jsonb, now()
FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::int4[], $8::int8[], $9::int8[], $10::text[])
  AS u(id, g, d, s, e, rev, n, hb, m)
ON CONFLICT (gateway, group_id, device, window_start) DO UPDATE SET
  result_id = excluded.result_id, window_end = excluded.window_end, revision = excluded.revision,
  readings = excluded.readings, heartbeats = excluded.heartbeats, metrics = excluded.metrics,
  written_at = excluded.written_at
WHERE excluded.revision > t.revision"
    )
}

fn insert_alerts(cfg: &Postgres) -> String {
    let a = cfg.table("alerts");
    format!(
        "INSERT INTO {a} (gateway, group_id, device, type, at, body)
SELECT $1, u.g, u.d, u.k, {TS} u.at, u.b::jsonb
FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[], $6::text[]) AS u(g, d, k, at, b)
ON CONFLICT DO NOTHING"
    )
}

/// A record again (the same transition after its retraction) replaces the older one.
fn upsert_conditions(cfg: &Postgres) -> String {
    let c = cfg.table("conditions");
    format!(
        "INSERT INTO {c} AS t (id, gateway, group_id, device, name, state, window_start, window_end, at, body)
SELECT u.id, $1, u.g, u.d, u.n, u.st, {TS} u.s, {TS} u.e, {TS} u.at, u.b::jsonb
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], $8::int8[], $9::int8[], $10::text[])
  AS u(id, g, d, n, st, s, e, at, b)
ON CONFLICT (gateway, id) DO UPDATE SET at = excluded.at, body = excluded.body
WHERE excluded.at > t.at"
    )
}

/// A connection with its statements prepared.
struct Session {
    client: Client,
    windows: Statement,
    alerts: Statement,
    conditions: Statement,
}

/// The PostgreSQL output.
pub struct Writer {
    cfg: Postgres,
    gateway: String,
    session: Option<Session>,
}

/// A refusal for the row's content (data exception, integrity constraint), not an outage.
fn refused(e: &tokio_postgres::Error) -> Option<String> {
    let code = e.code()?.code();
    (code.starts_with("22") || code.starts_with("23")).then(|| {
        e.as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_string())
    })
}

fn outage(e: impl std::fmt::Display) -> Failed {
    Failed::Outage(format!("postgres: {e}"))
}

/// A PostgreSQL failure that is not about the rows, with its causes.
fn lost(e: tokio_postgres::Error) -> Failed {
    outage(chain(&e))
}

/// An error with its causes (tokio-postgres says "error performing TLS handshake"; the cause says why).
fn chain(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Column arrays of some window rows.
#[derive(Default)]
struct WindowCols {
    id: Vec<String>,
    g: Vec<String>,
    d: Vec<String>,
    s: Vec<i64>,
    e: Vec<i64>,
    rev: Vec<i32>,
    n: Vec<i64>,
    hb: Vec<i64>,
    m: Vec<String>,
}

impl WindowCols {
    fn push(&mut self, w: &WindowRow) {
        self.id.push(w.id.clone());
        self.g.push(w.group.clone());
        self.d.push(w.device.clone());
        self.s.push(w.start);
        self.e.push(w.end);
        self.rev.push(i32::try_from(w.revision).unwrap_or(i32::MAX));
        self.n.push(w.readings);
        self.hb.push(w.heartbeats);
        self.m
            .push(serde_json::Value::Object(w.metrics.clone()).to_string());
    }
}

/// Column arrays of some alert rows.
#[derive(Default)]
struct AlertCols {
    g: Vec<String>,
    d: Vec<String>,
    k: Vec<String>,
    at: Vec<i64>,
    b: Vec<String>,
}

impl AlertCols {
    fn push(&mut self, a: &AlertRow) {
        self.g.push(a.group.clone());
        self.d.push(a.device.clone());
        self.k.push(a.kind.clone());
        self.at.push(a.at);
        self.b.push(a.body.to_string());
    }
}

/// Column arrays of some condition records.
#[derive(Default)]
struct ConditionCols {
    id: Vec<String>,
    g: Vec<String>,
    d: Vec<String>,
    n: Vec<String>,
    st: Vec<String>,
    s: Vec<i64>,
    e: Vec<i64>,
    at: Vec<i64>,
    b: Vec<String>,
}

impl ConditionCols {
    fn push(&mut self, c: &ConditionRow) {
        self.id.push(c.id.clone());
        self.g.push(c.group.clone());
        self.d.push(c.device.clone());
        self.n.push(c.name.clone());
        self.st.push(c.state.clone());
        self.s.push(c.start);
        self.e.push(c.end);
        self.at.push(c.at);
        self.b.push(c.body.to_string());
    }
}

/// Writes `rows` inside `tx` (the caller commits).
async fn put(
    tx: &tokio_postgres::Transaction<'_>,
    (windows, alerts, conditions): (&Statement, &Statement, &Statement),
    gateway: &str,
    rows: &[&Row],
) -> Result<(), tokio_postgres::Error> {
    let mut w = WindowCols::default();
    let mut a = AlertCols::default();
    let mut c = ConditionCols::default();
    for r in rows {
        match r {
            Row::Window(x) => w.push(x),
            Row::Alert(x) => a.push(x),
            Row::Condition(x) => c.push(x),
        }
    }
    if !c.id.is_empty() {
        tx.execute(
            conditions,
            &[
                &gateway, &c.id, &c.g, &c.d, &c.n, &c.st, &c.s, &c.e, &c.at, &c.b,
            ],
        )
        .await?;
    }
    if !w.id.is_empty() {
        tx.execute(
            windows,
            &[
                &gateway, &w.id, &w.g, &w.d, &w.s, &w.e, &w.rev, &w.n, &w.hb, &w.m,
            ],
        )
        .await?;
    }
    if !a.k.is_empty() {
        tx.execute(alerts, &[&gateway, &a.g, &a.d, &a.k, &a.at, &a.b])
            .await?;
    }
    Ok(())
}

impl Writer {
    /// Not connected until the first write.
    pub fn new(cfg: Postgres, gateway: String) -> Self {
        Self {
            cfg,
            gateway,
            session: None,
        }
    }

    /// Rows per transaction.
    pub fn batch_max(&self) -> usize {
        self.cfg.batch_max
    }

    async fn connect(&self) -> Result<Session, Failed> {
        let c = &self.cfg;
        let mut pg = tokio_postgres::Config::new();
        pg.host(&c.address.host)
            .port(c.address.port)
            .user(&c.user)
            .dbname(&c.dbname)
            .application_name("tidemark")
            .connect_timeout(TIMEOUT);
        if let Some(p) = &c.password {
            pg.password(p);
        }
        let client = match &c.address.ca_file {
            Some(ca) => {
                let tls = super::tls::client_config(Some(ca)).map_err(outage)?;
                pg.ssl_mode(tokio_postgres::config::SslMode::Require);
                let (client, conn) = pg.connect(RustlsConnect(tls)).await.map_err(lost)?;
                tokio::spawn(conn);
                client
            }
            None => {
                pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
                let (client, conn) = pg.connect(NoTls).await.map_err(lost)?;
                tokio::spawn(conn);
                client
            }
        };
        if c.create_tables {
            if c.schema != "public" {
                let s = format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", c.schema);
                client.batch_execute(&s).await.map_err(lost)?;
            }
            client.batch_execute(&ddl(c)).await.map_err(lost)?;
        }
        let windows = client.prepare(&upsert_windows(c)).await.map_err(lost)?;
        let alerts = client.prepare(&insert_alerts(c)).await.map_err(lost)?;
        let conditions = client.prepare(&upsert_conditions(c)).await.map_err(lost)?;
        tracing::info!(host = %c.address.host, port = c.address.port, database = %c.dbname, "postgres output connected");
        Ok(Session {
            client,
            windows,
            alerts,
            conditions,
        })
    }

    /// One transaction for the batch; on a refusal, each row in its own
    /// savepoint so the others are written and the refused ones named.
    pub async fn write(&mut self, rows: &[Row]) -> Result<Refusals, Failed> {
        let mut keyed: Vec<(usize, Row)> = rows.iter().cloned().enumerate().collect();
        super::rows::dedup(&mut keyed);
        if self.session.is_none() {
            self.session = Some(
                tokio::time::timeout(TIMEOUT, self.connect())
                    .await
                    .map_err(|_| outage("connect timed out"))??,
            );
        }
        let r = tokio::time::timeout(TIMEOUT, self.attempt(&keyed)).await;
        match r {
            Ok(Ok(refusals)) => Ok(refusals),
            Ok(Err(f)) => {
                self.session = None;
                Err(f)
            }
            Err(_) => {
                self.session = None;
                Err(outage("write timed out"))
            }
        }
    }

    async fn attempt(&mut self, keyed: &[(usize, Row)]) -> Result<Refusals, Failed> {
        let gateway = self.gateway.clone();
        let Some(s) = self.session.as_mut() else {
            return Err(outage("not connected"));
        };
        let stmts = (&s.windows.clone(), &s.alerts.clone(), &s.conditions.clone());
        let all: Vec<&Row> = keyed.iter().map(|(_, r)| r).collect();
        let tx = s.client.transaction().await.map_err(lost)?;
        match put(&tx, stmts, &gateway, &all).await {
            Ok(()) => {
                tx.commit().await.map_err(lost)?;
                return Ok(Vec::new());
            }
            Err(e) if refused(&e).is_none() => return Err(lost(e)),
            Err(_) => drop(tx),
        }
        let mut tx = s.client.transaction().await.map_err(lost)?;
        let mut refusals = Vec::new();
        for (i, row) in keyed {
            let sp = tx.savepoint("row").await.map_err(lost)?;
            match put(&sp, stmts, &gateway, &[row]).await {
                Ok(()) => sp.commit().await.map_err(lost)?,
                Err(e) => match refused(&e) {
                    Some(msg) => {
                        sp.rollback().await.map_err(lost)?;
                        refusals.push((*i, msg));
                    }
                    None => return Err(lost(e)),
                },
            }
        }
        tx.commit().await.map_err(lost)?;
        Ok(refusals)
    }
}

/// TLS by rustls for tokio-postgres.
struct RustlsConnect(Arc<rustls::ClientConfig>);

struct RustlsConnectOne {
    cfg: Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
}

/// A TLS connection to the server.
pub struct Tls(tokio_rustls::client::TlsStream<Socket>);

impl MakeTlsConnect<Socket> for RustlsConnect {
    type Stream = Tls;
    type TlsConnect = RustlsConnectOne;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnectOne, Self::Error> {
        Ok(RustlsConnectOne {
            cfg: self.0.clone(),
            name: rustls::pki_types::ServerName::try_from(domain.to_string())?,
        })
    }
}

impl TlsConnect<Socket> for RustlsConnectOne {
    type Stream = Tls;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Tls>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            tokio_rustls::TlsConnector::from(self.cfg)
                .connect(self.name, stream)
                .await
                .map(Tls)
        })
    }
}

impl TlsStream for Tls {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for Tls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
