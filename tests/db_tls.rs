//! The database outputs over TLS with a private CA (docs/reference.md#sinkpostgres-and-sinkinflux):
//! PostgreSQL with `ca_file` and a SCRAM password from `password_file`, InfluxDB over
//! https with `user:password` from `token_file`; a server whose certificate the CA
//! did not sign gets nothing.
mod support;

use support::sh;

use std::path::{Path, PathBuf};

use support::db::{Influx, Postgres};
use support::fleet::{Fleet, MIN};
use support::{Gateway, GatewayConfig, Mosquitto, Publisher, wait_or_explain};

/// A CA, a server certificate for localhost signed by it, and a second CA that signed nothing.
fn pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    support::which("openssl");
    sh(
        dir,
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=tidemark-db-ca",
    );
    sh(
        dir,
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost",
    );
    sh(
        dir,
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext",
    );
    sh(
        dir,
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 2 -subj /CN=someone-else",
    );
    sh(dir, "chmod 644 server.key");
    (
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
        dir.join("other.crt"),
    )
}

fn outputs(http: u16) -> serde_json::Value {
    let (_, body) = support::http_get(http, "/api/v1/status");
    serde_json::from_str::<serde_json::Value>(&body).expect("status")["outputs"].clone()
}

fn output(http: u16, name: &str) -> serde_json::Value {
    outputs(http)
        .as_array()
        .and_then(|a| a.iter().find(|o| o["name"] == name).cloned())
        .unwrap_or_default()
}

fn gateway(
    dir: &Path,
    name: &str,
    broker: &Mosquitto,
    (pg, ix): (&Postgres, &Influx),
    (ca, pw, token): (&Path, &Path, &Path),
) -> (Gateway, u16, PathBuf) {
    let http = support::free_port();
    let url = pg.url().replace("127.0.0.1", "localhost");
    let config = GatewayConfig::new(name, &dir.join(format!("{name}-state")), broker, broker)
        .merge("metrics", support::fleet::FLEET)
        .set("source", &format!("client_id = \"{name}-in\""))
        .set("sink", &format!("client_id = \"{name}-out\""))
        .set(
            "sink.postgres",
            &format!(
                "enabled = true\nurl = \"{url}\"\nca_file = {:?}\npassword_file = {:?}",
                ca.display().to_string(),
                pw.display().to_string()
            ),
        )
        .set(
            "sink.influx",
            &format!(
                "enabled = true\nurl = \"{}\"\nca_file = {:?}\ntoken_file = {:?}",
                ix.url(),
                ca.display().to_string(),
                token.display().to_string()
            ),
        )
        .http(http)
        .write(&dir.join(format!("{name}.toml")));
    let log = dir.join(format!("{name}.log"));
    (Gateway::start(&config, &log), http, log)
}

#[test]
fn tls_with_a_checked_certificate_and_a_password_file_and_nothing_for_an_unknown_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = dir.path().join("tls");
    std::fs::create_dir_all(&tls).expect("tls dir");
    let (ca, cert, key, other) = pki(&tls);
    let broker = Mosquitto::start(false);
    let mut pg = Postgres::start(dir.path());
    pg.require_tls_and_password(&cert, &key, "s3cret-pw");
    let mut ix = Influx::start_tls(dir.path(), (&ca, &cert, &key));
    ix.require_auth("writer", "influx-pw");
    let (pw, token) = (
        dir.path().join("pg-password"),
        dir.path().join("influx-token"),
    );
    use std::os::unix::fs::PermissionsExt;
    for (f, text) in [(&pw, "s3cret-pw\n"), (&token, "writer:influx-pw\n")] {
        std::fs::write(f, text).expect("secret file");
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let (gw, http, log) = gateway(dir.path(), "gw", &broker, (&pg, &ix), (&ca, &pw, &token));
    let mut publisher = Publisher::connect(broker.port, "tls-fleet");
    let mut fleet = Fleet::new(4, 60);
    while fleet.send(&mut publisher, 4) {}
    publisher.flush();
    let total = fleet.total().to_string();
    wait_or_explain(
        MIN,
        || {
            pg.try_psql("site", "SELECT sum(readings) FROM tidemark_windows")
                .is_ok_and(|s| s == total)
        },
        || {
            format!(
                "{}\n{}",
                outputs(http),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    let sum = ix.query("SELECT sum(readings) FROM tidemark_windows");
    assert_eq!(
        sum["results"][0]["series"][0]["values"][0][1].to_string(),
        total,
        "InfluxDB over https: {sum}"
    );
    let ssl = pg.psql(
        "site",
        "SELECT bool_and(ssl) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE application_name = 'tidemark'",
    );
    assert_eq!(ssl, "t", "the gateway's session is TLS");
    for name in ["postgres", "influx"] {
        let o = output(http, name);
        assert_eq!(o["connected"], true, "{o}");
        assert!(o.get("last_error").is_none(), "{o}");
    }
    let _ = gw.terminate();

    // A CA that did not sign the servers' certificates: nothing is written, the error says why.
    let (gw, http, log) = gateway(
        dir.path(),
        "gw2",
        &broker,
        (&pg, &ix),
        (&other, &pw, &token),
    );
    let mut publisher = Publisher::connect(broker.port, "tls-fleet-2");
    let mut fleet = Fleet::new(2, 40);
    while fleet.send(&mut publisher, 2) {}
    publisher.flush();
    wait_or_explain(
        MIN,
        || {
            ["postgres", "influx"].iter().all(|n| {
                let o = output(http, n);
                o["written"] == 0
                    && o["last_error"]
                        .as_str()
                        .is_some_and(|e| e.to_lowercase().contains("certificate"))
            })
        },
        || {
            format!(
                "{}\n{}",
                outputs(http),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    let _ = gw.terminate();
}
