//! The checks every section shares: the problem list, durations, and MQTT
//! endpoints (URL, credentials, TLS files).

use std::path::PathBuf;

/// Problems found so far, `key: problem` each.
pub(super) struct Problems(pub(super) Vec<String>);

impl Problems {
    pub(super) fn add(&mut self, key: &str, msg: impl std::fmt::Display) {
        self.0.push(format!("{key}: {msg}"));
    }
    pub(super) fn positive(&mut self, key: &str, v: u64) {
        if v == 0 {
            self.add(key, "must be > 0");
        }
    }
}

/// Largest duration accepted anywhere (about 100 years): keeps i64 math safe.
const MAX_DURATION_MS: u64 = 1 << 42;

pub(super) fn ms(p: &mut Problems, key: &str, v: u64) -> i64 {
    if v > MAX_DURATION_MS {
        p.add(key, format!("must be <= {MAX_DURATION_MS}"));
        return 1;
    }
    i64::try_from(v).unwrap_or(1)
}

/// An MQTT endpoint from the connection keys of `[section]`.
pub(super) fn endpoint(
    p: &mut Problems,
    section: &str,
    k: &LinkKeys<'_>,
    default_client_id: &str,
) -> Endpoint {
    let key = format!("{section}.url");
    let parsed = parse_url(k.url);
    if let Err(e) = &parsed {
        p.add(&key, e);
    }
    if k.qos > 1 {
        p.add(
            &format!("{section}.qos"),
            format!("{} is not supported (0 or 1)", k.qos),
        );
    }
    if k.client_id.len() > 128 {
        p.add(
            &format!("{section}.client_id"),
            "must be at most 128 characters",
        );
    }
    let password = if k.password_file.is_empty() {
        None
    } else {
        match std::fs::read_to_string(k.password_file) {
            Ok(s) => Some(s.trim_end_matches(['\n', '\r']).to_string()),
            Err(e) => {
                p.add(
                    &format!("{section}.password_file"),
                    format!("cannot read {:?}: {e}", k.password_file),
                );
                None
            }
        }
    };
    let is_tls = matches!(parsed, Ok((true, _, _)));
    tls_files(p, section, k, is_tls, parsed.is_ok());
    if k.keep_alive_s > u64::from(u16::MAX) {
        p.add(
            &format!("{section}.keep_alive_s"),
            format!("{} is above the MQTT limit of {}", k.keep_alive_s, u16::MAX),
        );
    }
    let (tls, host, port) = parsed.unwrap_or((false, String::new(), 0));
    Endpoint {
        tls,
        host,
        port,
        client_id: if k.client_id.is_empty() {
            default_client_id.to_string()
        } else {
            k.client_id.to_string()
        },
        username: (!k.username.is_empty()).then(|| k.username.to_string()),
        password,
        ca_file: (!k.ca_file.is_empty()).then(|| PathBuf::from(k.ca_file)),
        client_cert: (!k.cert_file.is_empty())
            .then(|| (PathBuf::from(k.cert_file), PathBuf::from(k.key_file))),
        keep_alive_s: u16::try_from(k.keep_alive_s).unwrap_or(u16::MAX),
        qos: k.qos,
    }
}

/// The CA and client certificate files exist, and only with `mqtts://`.
fn tls_files(p: &mut Problems, section: &str, k: &LinkKeys<'_>, is_tls: bool, url_ok: bool) {
    if !k.ca_file.is_empty() {
        if let Err(e) = std::fs::metadata(k.ca_file) {
            p.add(
                &format!("{section}.ca_file"),
                format!("cannot read {:?}: {e}", k.ca_file),
            );
        } else if url_ok && !is_tls {
            p.add(
                &format!("{section}.ca_file"),
                "set, but url is not mqtts://",
            );
        }
    }
    let (cert, key) = (k.cert_file, k.key_file);
    for (name, f) in [("cert_file", cert), ("key_file", key)] {
        if f.is_empty() {
            continue;
        }
        if let Err(e) = std::fs::metadata(f) {
            p.add(
                &format!("{section}.{name}"),
                format!("cannot read {f:?}: {e}"),
            );
        } else if !is_tls && url_ok {
            p.add(&format!("{section}.{name}"), "set, but url is not mqtts://");
        }
    }
    if cert.is_empty() != key.is_empty() {
        let missing = if cert.is_empty() {
            "cert_file"
        } else {
            "key_file"
        };
        p.add(
            &format!("{section}.{missing}"),
            "mutual TLS needs both cert_file and key_file",
        );
    }
}

/// Parses `mqtt://host[:port][/]` or `mqtts://...`.
pub fn parse_url(url: &str) -> Result<(bool, String, u16), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{url:?} is not a URL (expected mqtt://host:port or mqtts://host:port)"
        ));
    };
    let (tls, default_port) = match scheme {
        "mqtt" | "tcp" => (false, 1883),
        "mqtts" | "ssl" => (true, 8883),
        other => {
            return Err(format!(
                "unsupported scheme {other:?} (expected mqtt or mqtts)"
            ));
        }
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(
            "credentials in the URL are not allowed; use username and password_file".into(),
        );
    }
    if rest.contains('/') || rest.contains('?') {
        return Err(format!("{url:?} must not have a path or query"));
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{url:?}: unterminated [ in host"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| format!("{url:?}: bad port {p:?}"))?,
            None if after.is_empty() => default_port,
            None => return Err(format!("{url:?}: junk after host")),
        };
        (h.to_string(), port)
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse::<u16>()
                    .map_err(|_| format!("{url:?}: bad port {p:?}"))?,
            ),
            None => (rest.to_string(), default_port),
        }
    };
    if host.is_empty() {
        return Err(format!("{url:?}: missing host"));
    }
    if port == 0 {
        return Err(format!("{url:?}: port must be > 0"));
    }
    Ok((tls, host, port))
}

/// The connection keys `[source]` and `[sink]` share, as written.
pub(crate) struct LinkKeys<'a> {
    pub url: &'a str,
    pub client_id: &'a str,
    pub username: &'a str,
    pub password_file: &'a str,
    pub ca_file: &'a str,
    pub cert_file: &'a str,
    pub key_file: &'a str,
    pub keep_alive_s: u64,
    pub qos: u8,
}

/// `impl $t { fn link() }`: the connection keys of `[source]` or `[sink]`.
macro_rules! link_keys {
    ($t:ty) => {
        impl $t {
            /// The connection keys.
            pub(crate) fn link(&self) -> super::checks::LinkKeys<'_> {
                super::checks::LinkKeys {
                    url: &self.url,
                    client_id: &self.client_id,
                    username: &self.username,
                    password_file: &self.password_file,
                    ca_file: &self.ca_file,
                    cert_file: &self.cert_file,
                    key_file: &self.key_file,
                    keep_alive_s: self.keep_alive_s,
                    qos: self.qos,
                }
            }
        }
    };
}
pub(crate) use link_keys;

/// An MQTT connection endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `mqtts://`.
    pub tls: bool,
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Client id (defaults filled in).
    pub client_id: String,
    /// User name, if any.
    pub username: Option<String>,
    /// Password read from `password_file`, if any.
    pub password: Option<String>,
    /// Extra CA file.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Keep-alive in seconds (0: off).
    pub keep_alive_s: u16,
    /// QoS 0 or 1.
    pub qos: u8,
}

impl Endpoint {
    /// `mqtt[s]://host:port`, for logs.
    pub fn url(&self) -> String {
        format!(
            "{}://{}:{}",
            if self.tls { "mqtts" } else { "mqtt" },
            self.host,
            self.port
        )
    }

    /// A tool's own connection (capture, simulate, demo): no credentials or
    /// client certificate, system CA roots for `mqtts`, 30 s keep-alive.
    pub fn plain(tls: bool, host: String, port: u16, client_id: String, qos: u8) -> Self {
        Self {
            tls,
            host,
            port,
            client_id,
            username: None,
            password: None,
            ca_file: None,
            client_cert: None,
            keep_alive_s: 30,
            qos,
        }
    }
}
