//! TLS for the database outputs: rustls with the ring provider (the one the
//! MQTT links use), the server's certificate checked against `ca_file` or the
//! system roots; no insecure mode.

use std::sync::Arc;

/// The system's CA bundle (Debian's ca-certificates).
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A client config trusting the certificates in `ca_file` ("" or None: the system's).
pub fn client_config(ca_file: Option<&str>) -> Result<Arc<rustls::ClientConfig>, String> {
    let path = ca_file.filter(|p| !p.is_empty()).unwrap_or(SYSTEM_ROOTS);
    let pem = std::fs::read(path).map_err(|e| format!("reading {path:?}: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| format!("{path:?}: {e}"))?;
        // The system bundle holds a few a strict parser refuses; skip those.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(format!("{path:?} holds no usable CA certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}
