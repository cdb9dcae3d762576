//! `[sink.postgres]` and `[sink.influx]`: the database outputs, as written
//! (with their defaults) and as validated (docs/reference.md#sinkpostgres-and-sinkinflux).

use serde::{Deserialize, Serialize};

use super::checks::Problems;

/// `[sink.postgres]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPostgres {
    /// Write window results and alerts into PostgreSQL.
    pub enabled: bool,
    /// `postgresql://user@host:5432/dbname` (no password: `password_file`).
    pub url: String,
    /// The password is read from this file.
    pub password_file: String,
    /// CA certificate (PEM): TLS with the server's name checked when set.
    pub ca_file: String,
    /// Schema of the tables.
    pub schema: String,
    /// Prefix of the table names.
    pub table_prefix: String,
    /// `CREATE TABLE IF NOT EXISTS` at start.
    pub create_tables: bool,
    /// Rows per transaction.
    pub batch_max: u64,
}

impl Default for RawPostgres {
    fn default() -> Self {
        Self {
            enabled: false,
            url: String::new(),
            password_file: String::new(),
            ca_file: String::new(),
            schema: "public".into(),
            table_prefix: "tidemark_".into(),
            create_tables: true,
            batch_max: 1000,
        }
    }
}

/// `[sink.influx]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawInflux {
    /// Write window results and alerts into InfluxDB.
    pub enabled: bool,
    /// `http(s)://host:8086`.
    pub url: String,
    /// `v1` (`/write`) or `v2` (`/api/v2/write`).
    pub api: String,
    /// v1 database, v2 bucket.
    pub database: String,
    /// v2 organisation.
    pub org: String,
    /// v2: the API token; v1: `user:password` on one line.
    pub token_file: String,
    /// CA certificate (PEM) for https.
    pub ca_file: String,
    /// Points per request.
    pub batch_max: u64,
}

impl Default for RawInflux {
    fn default() -> Self {
        Self {
            enabled: false,
            url: String::new(),
            api: "v1".into(),
            database: "tidemark".into(),
            org: String::new(),
            token_file: String::new(),
            ca_file: String::new(),
            batch_max: 5000,
        }
    }
}

/// Where a database listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbAddress {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// TLS, checked against `ca_file`'s CA (None: plain TCP).
    pub ca_file: Option<String>,
}

/// `[sink.postgres]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Postgres {
    /// Server.
    pub address: DbAddress,
    /// Role.
    pub user: String,
    /// Database.
    pub dbname: String,
    /// From `password_file`.
    pub password: Option<String>,
    /// Schema, checked as an identifier.
    pub schema: String,
    /// Table prefix, checked as an identifier.
    pub prefix: String,
    /// Create the tables at start.
    pub create_tables: bool,
    /// Rows per transaction.
    pub batch_max: usize,
}

/// The write API of `[sink.influx]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfluxApi {
    /// `/write?db=…`
    V1,
    /// `/api/v2/write?org=…&bucket=…`
    V2,
}

/// `[sink.influx]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Influx {
    /// Server.
    pub address: DbAddress,
    /// Write API.
    pub api: InfluxApi,
    /// Database or bucket.
    pub database: String,
    /// v2 organisation.
    pub org: String,
    /// From `token_file` (v1: `user:password`).
    pub token: Option<String>,
    /// Points per request.
    pub batch_max: usize,
}

/// A secret file's first line (trailing newline dropped).
fn secret(p: &mut Problems, key: &str, file: &str) -> Option<String> {
    if file.is_empty() {
        return None;
    }
    match std::fs::read_to_string(file) {
        Ok(s) => Some(s.lines().next().unwrap_or("").to_string()),
        Err(e) => {
            p.add(key, format!("cannot read {file:?}: {e}"));
            None
        }
    }
}

/// A CA file that exists and holds a PEM certificate.
fn ca(p: &mut Problems, key: &str, file: &str, tls: bool) -> Option<String> {
    if file.is_empty() {
        return None;
    }
    if !tls {
        p.add(key, "is set but the url is not TLS (postgresql:// takes it, http:// does not: use https://)");
    }
    match std::fs::read_to_string(file) {
        Ok(s) if s.contains("-----BEGIN CERTIFICATE-----") => Some(file.to_string()),
        Ok(_) => {
            p.add(key, format!("{file:?} holds no PEM certificate"));
            None
        }
        Err(e) => {
            p.add(key, format!("cannot read {file:?}: {e}"));
            None
        }
    }
}

/// A SQL identifier we quote ourselves: letters, digits, `_`, not starting with a digit.
fn identifier(p: &mut Problems, key: &str, v: &str, may_be_empty: bool) {
    let ok = (may_be_empty || !v.is_empty())
        && v.len() <= 40
        && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !v.starts_with(|c: char| c.is_ascii_digit());
    if !ok {
        p.add(
            key,
            format!("{v:?} must be 1..40 chars of [A-Za-z0-9_], not starting with a digit"),
        );
    }
}

/// `host[:port]` with `port` as the default.
fn host_port(p: &mut Problems, key: &str, hp: &str, port: u16) -> (String, u16) {
    let (host, port) = match hp.rsplit_once(':') {
        Some((h, ps)) if !h.ends_with(']') || hp.starts_with('[') => match ps.parse::<u16>() {
            Ok(n) if n > 0 => (h.to_string(), n),
            _ => {
                p.add(key, format!("port {ps:?} is not 1..65535"));
                (h.to_string(), port)
            }
        },
        _ => (hp.to_string(), port),
    };
    if host.is_empty() {
        p.add(key, "names no host");
    }
    (host.trim_matches(['[', ']']).to_string(), port)
}

impl Postgres {
    pub(super) fn validate(p: &mut Problems, s: &RawPostgres) -> Option<Self> {
        if !s.enabled {
            return None;
        }
        let url = s.url.as_str();
        let Some(rest) = url
            .strip_prefix("postgresql://")
            .or_else(|| url.strip_prefix("postgres://"))
        else {
            p.add(
                "sink.postgres.url",
                format!("{url:?} must be postgresql://user@host[:port]/dbname"),
            );
            return None;
        };
        let rest = rest.split('?').next().unwrap_or(rest);
        let (authority, dbname) = rest.split_once('/').unwrap_or((rest, ""));
        let (user, hp) = authority.rsplit_once('@').unwrap_or(("", authority));
        if user.contains(':') {
            p.add(
                "sink.postgres.url",
                "a password in the URL is not allowed; use sink.postgres.password_file",
            );
        }
        if user.is_empty() || dbname.is_empty() {
            p.add(
                "sink.postgres.url",
                format!("{url:?} must name the user and the database: postgresql://user@host[:port]/dbname"),
            );
        }
        let (host, port) = host_port(p, "sink.postgres.url", hp, 5432);
        identifier(p, "sink.postgres.schema", &s.schema, false);
        identifier(p, "sink.postgres.table_prefix", &s.table_prefix, true);
        if s.batch_max == 0 || s.batch_max > 100_000 {
            p.add("sink.postgres.batch_max", "must be 1..=100000");
        }
        Some(Self {
            address: DbAddress {
                host,
                port,
                ca_file: ca(p, "sink.postgres.ca_file", &s.ca_file, true),
            },
            user: user.to_string(),
            dbname: dbname.to_string(),
            password: secret(p, "sink.postgres.password_file", &s.password_file),
            schema: s.schema.clone(),
            prefix: s.table_prefix.clone(),
            create_tables: s.create_tables,
            batch_max: usize::try_from(s.batch_max).unwrap_or(1000),
        })
    }

    /// `"schema"."{prefix}{name}"`.
    pub fn table(&self, name: &str) -> String {
        format!("\"{}\".\"{}{name}\"", self.schema, self.prefix)
    }
}

impl Influx {
    pub(super) fn validate(p: &mut Problems, s: &RawInflux) -> Option<Self> {
        if !s.enabled {
            return None;
        }
        let url = s.url.trim_end_matches('/');
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            p.add(
                "sink.influx.url",
                format!("{url:?} must be http://host[:port] or https://host[:port]"),
            );
            (false, "")
        };
        if rest.contains('/') || rest.contains('@') {
            p.add(
                "sink.influx.url",
                "must be only scheme, host and port (the path comes from sink.influx.api; credentials from token_file)",
            );
        }
        let (host, port) = host_port(p, "sink.influx.url", rest, 8086);
        let api = match s.api.as_str() {
            "v1" => InfluxApi::V1,
            "v2" => InfluxApi::V2,
            other => {
                p.add(
                    "sink.influx.api",
                    format!("{other:?} must be \"v1\" or \"v2\""),
                );
                InfluxApi::V1
            }
        };
        if s.database.is_empty() {
            p.add("sink.influx.database", "must not be empty");
        }
        if api == InfluxApi::V2 && s.org.is_empty() {
            p.add("sink.influx.org", "must be set with api = \"v2\"");
        }
        let token = secret(p, "sink.influx.token_file", &s.token_file);
        if api == InfluxApi::V1 && token.as_ref().is_some_and(|t| !t.contains(':')) {
            p.add(
                "sink.influx.token_file",
                "with api = \"v1\" must hold user:password on one line",
            );
        }
        if s.batch_max == 0 || s.batch_max > 100_000 {
            p.add("sink.influx.batch_max", "must be 1..=100000");
        }
        let ca_file = ca(p, "sink.influx.ca_file", &s.ca_file, tls);
        Some(Self {
            address: DbAddress {
                host,
                port,
                ca_file: if tls {
                    Some(ca_file.unwrap_or_default())
                } else {
                    None
                },
            },
            api,
            database: s.database.clone(),
            org: s.org.clone(),
            token,
            batch_max: usize::try_from(s.batch_max).unwrap_or(5000),
        })
    }
}
