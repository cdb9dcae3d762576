//! `tidemark run` over mqtts with a private CA, client certificates and password
//! files on both links, against real mosquitto processes.
mod support;

use support::sh;

use support::fleet::*;
use support::{Collector, Gateway, Publisher, now_ms, wait_or_explain, wait_until};

// One gateway (or pair) through one scenario, phase by phase: each phase needs
// the state the last one left; split into tests, each would start its own.
#[allow(clippy::too_many_lines)]
/// mqtts with a private CA, a client certificate and a password file on both links.
#[test]
fn mutual_tls_with_password_file_on_source_and_sink() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    support::which("openssl");
    sh(
        d,
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=tidemark-test-ca",
    );
    sh(
        d,
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost",
    );
    sh(
        d,
        "printf 'subjectAltName=DNS:localhost\\n' > san.ext && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext",
    );
    // X.509 v3 (an extension file) throughout: rustls refuses v1 certificates.
    sh(
        d,
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=gw && openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 2 -extfile client.ext",
    );
    sh(d, "chmod 644 *.key *.crt");
    let passwd = support::which("mosquitto_passwd");
    sh(
        d,
        &format!(
            "{} -b -c passwd gw s3cret && chmod 644 passwd",
            passwd.display()
        ),
    );
    std::fs::write(d.join("gw.password"), "s3cret\n").expect("password");
    let (tls_port, plain_port) = (support::free_port(), support::free_port());
    std::fs::write(
        d.join("m.conf"),
        format!(
            "per_listener_settings true\n\
             listener {tls_port} 127.0.0.1\ncafile {d}/ca.crt\ncertfile {d}/server.crt\nkeyfile {d}/server.key\n\
             require_certificate true\nallow_anonymous false\npassword_file {d}/passwd\n\
             listener {plain_port} 127.0.0.1\nallow_anonymous true\n",
            d = d.display()
        ),
    )
    .expect("conf");
    let mut broker = std::process::Command::new(support::which("mosquitto"))
        .arg("-c")
        .arg(d.join("m.conf"))
        .stderr(std::fs::File::create(d.join("mosquitto.log")).expect("log"))
        .spawn()
        .expect("mosquitto");
    wait_until(MIN, "broker", || {
        std::net::TcpStream::connect(("127.0.0.1", plain_port)).is_ok()
            && std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_ok()
    });
    let tls = format!(
        "url = \"mqtts://localhost:{tls_port}\"\nusername = \"gw\"\npassword_file = \"{d}/gw.password\"\n\
         ca_file = \"{d}/ca.crt\"\ncert_file = \"{d}/client.crt\"\nkey_file = \"{d}/client.key\"\n",
        d = d.display()
    );
    let config = d.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nid = \"gw\"\nstate_dir = \"{}\"\n[source]\n{tls}[sink]\n{tls}\
             [time]\npolicy = \"device\"\n[group_defaults]\nidle_timeout_ms = 500\nout_of_orderness_ms = 0\n\
             [metrics]\ninterval_s = 1\n",
            d.join("state").display()
        ),
    )
    .expect("config");
    let up = Collector::start(plain_port, "tidemark/#", "tls-collector");
    let log = d.join("gw.log");
    let gw = Gateway::start(&config, &log);
    let mut p = Publisher::connect(plain_port, "tls-sensor");
    let ts = now_ms() - 120_000;
    p.send(
        "sensors/secure/s1/reading",
        format!(r#"{{"ts": {ts}, "temp": 4.5}}"#).as_bytes(),
    );
    p.flush();
    wait_or_explain(
        MIN,
        || !up.on("/windows/secure/s1").is_empty(),
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    assert_eq!(up.on("/windows/secure/s1")[0].json()["count"], 1);
    wait_until(MIN, "gateway metrics upstream", || {
        !up.on("/metrics").is_empty()
    });
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
    let _ = broker.kill();
    let _ = broker.wait();
    // Secrets stay secret: the password and the private key appear in no log
    // line, no upstream message (metrics included) and no `inspect` output.
    let key = std::fs::read_to_string(d.join("client.key")).expect("key");
    let key_line = key.lines().nth(1).expect("a base64 line of the key");
    let mut seen: Vec<String> = vec![std::fs::read_to_string(&log).unwrap_or_default()];
    seen.extend(
        up.all()
            .iter()
            .map(|m| String::from_utf8_lossy(&m.payload).into_owned()),
    );
    for json in [false, true] {
        let mut cmd = support::tidemark();
        cmd.args(["inspect", "--state-dir"]).arg(d.join("state"));
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("inspect");
        assert_eq!(out.status.code(), Some(0));
        seen.push(String::from_utf8_lossy(&out.stdout).into_owned());
        seen.push(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    for text in &seen {
        assert!(!text.contains("s3cret"), "password leaked: {text}");
        assert!(!text.contains(key_line), "private key leaked");
    }
}
