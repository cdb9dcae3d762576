//! Real databases from Debian for the database outputs: PostgreSQL 15 and
//! InfluxDB 1.6, each started by the test as an unprivileged user on a free
//! port in a temp dir, stopped and started again at will.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, wait_or_explain};

/// Runs `bin` as `nobody` when the tests run as root (PostgreSQL refuses root).
fn unprivileged(bin: &Path) -> Command {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

/// A directory the unprivileged user may write.
fn owned_dir(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("db dir");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let out = Command::new("chown")
            .args(["-R", "nobody:nogroup"])
            .arg(dir)
            .status()
            .expect("chown");
        assert!(out.success());
    }
    dir.to_path_buf()
}

fn pg_bin(name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed (scripts/test.sh installs it)")
        .filter_map(|e| Some(e.ok()?.path().join("bin").join(name)))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found
        .pop()
        .unwrap_or_else(|| panic!("no {name} under /usr/lib/postgresql"))
}

/// A PostgreSQL server with a trust-authenticated role `tidemark` and database `site`.
pub struct Postgres {
    pub port: u16,
    data: PathBuf,
    child: Option<Child>,
    log: PathBuf,
    /// Set by [`Postgres::require_tls_and_password`]: the test's own psql uses it too.
    password: Option<String>,
    extra: Vec<String>,
}

impl Postgres {
    pub fn start(dir: &Path) -> Self {
        let root = owned_dir(&dir.join("pg"));
        let data = root.join("data");
        let out = unprivileged(&pg_bin("initdb"))
            .args([
                "-U",
                "tidemark",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .output()
            .expect("initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Self {
            port: free_port(),
            data,
            child: None,
            log: root.join("postgres.log"),
            password: None,
            extra: Vec::new(),
        };
        pg.run();
        pg.psql("postgres", "CREATE DATABASE site");
        pg
    }

    fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("pg log");
        let child = unprivileged(&pg_bin("postgres"))
            .arg("-D")
            .arg(&self.data)
            .args([
                "-p",
                &self.port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
            ])
            .args(["-c", "fsync=off", "-c", "unix_socket_directories="])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("postgres");
        self.child = Some(child);
        wait_or_explain(
            Duration::from_secs(120),
            || self.try_psql("postgres", "SELECT 1").is_ok(),
            || {
                format!(
                    "{:?}\n{}",
                    self.try_psql("postgres", "SELECT 1"),
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                )
            },
        );
    }

    /// `postgresql://tidemark@127.0.0.1:PORT/site`.
    pub fn url(&self) -> String {
        format!("postgresql://tidemark@127.0.0.1:{}/site", self.port)
    }

    pub fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut cmd = Command::new(pg_bin("psql"));
        if let Some(p) = &self.password {
            cmd.env("PGPASSWORD", p);
        }
        let out = cmd
            .args([
                "-X",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "tidemark",
            ])
            .args(["-p", &self.port.to_string(), "-d", db, "-c", sql])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    /// Runs `sql` in `db`, which must succeed; its rows, `|`-separated.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        self.try_psql(db, sql)
            .unwrap_or_else(|e| panic!("psql {sql:?}: {e}"))
    }

    /// A fast shutdown (SIGINT): connections are cut, as a database restart does.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            super::signal(&c, "INT");
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.run();
    }

    pub fn start_again(&mut self) {
        self.run();
    }

    /// From now on only TLS connections (this certificate and key, PEM) with
    /// SCRAM password `password` are accepted.
    pub fn require_tls_and_password(&mut self, cert: &Path, key: &Path, password: &str) {
        self.psql(
            "postgres",
            &format!("ALTER ROLE tidemark PASSWORD '{password}'"),
        );
        let dir = self.data.clone();
        for (f, name) in [(cert, "server.crt"), (key, "server.key")] {
            std::fs::copy(f, dir.join(name)).expect("copy tls file");
        }
        std::fs::write(
            dir.join("pg_hba.conf"),
            "hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl all all ::1/128 scram-sha-256\n",
        )
        .expect("pg_hba");
        owned_dir(&dir);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("key mode");
        self.extra = vec!["-c".into(), "ssl=on".into()];
        self.stop();
        self.password = Some(password.to_string());
        self.run();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An InfluxDB 1.x server with database `tidemark`.
pub struct Influx {
    pub port: u16,
    conf: PathBuf,
    child: Option<Child>,
    log: PathBuf,
    /// HTTPS with this CA's certificate: the test talks to it through curl.
    ca: Option<PathBuf>,
    /// `user:password` once authentication is on (through curl too).
    auth: Option<String>,
}

impl Influx {
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, None)
    }

    /// HTTPS only, with `cert` and `key` (PEM) issued by `ca`.
    pub fn start_tls(dir: &Path, (ca, cert, key): (&Path, &Path, &Path)) -> Self {
        Self::start_with(dir, Some((ca, cert, key)))
    }

    fn start_with(dir: &Path, tls: Option<(&Path, &Path, &Path)>) -> Self {
        let root = owned_dir(&dir.join("influx"));
        let port = free_port();
        let conf = root.join("influxdb.conf");
        let d = root.display();
        std::fs::write(
            &conf,
            format!(
                "reporting-disabled = true\nbind-address = \"127.0.0.1:{}\"\n\
                 [meta]\ndir = \"{d}/meta\"\n\
                 [data]\ndir = \"{d}/data\"\nwal-dir = \"{d}/wal\"\nquery-log-enabled = false\n\
                 [http]\nbind-address = \"127.0.0.1:{port}\"\nlog-enabled = false\n{}\
                 [monitor]\nstore-enabled = false\n",
                free_port(),
                tls.map_or(String::new(), |(_, cert, key)| format!(
                    "https-enabled = true\nhttps-certificate = {:?}\nhttps-private-key = {:?}\n",
                    cert.display().to_string(),
                    key.display().to_string()
                ))
            ),
        )
        .expect("influx conf");
        owned_dir(&root);
        let mut ix = Self {
            port,
            conf,
            child: None,
            log: root.join("influxd.log"),
            ca: tls.map(|(ca, _, _)| ca.to_path_buf()),
            auth: None,
        };
        ix.run();
        ix.query("CREATE DATABASE tidemark");
        ix
    }

    fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("influx log");
        let child = unprivileged(&super::which("influxd"))
            .args(["run", "-config"])
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("influxd");
        self.child = Some(child);
        wait_or_explain(
            Duration::from_secs(120),
            || {
                self.request("GET", "/ping", "")
                    .is_ok_and(|(s, _)| s == 204)
            },
            || std::fs::read_to_string(&self.log).unwrap_or_default(),
        );
    }

    /// From now on only user `user` with `password` may write or query.
    pub fn require_auth(&mut self, user: &str, password: &str) {
        self.query(&format!(
            "CREATE USER \"{user}\" WITH PASSWORD '{password}' WITH ALL PRIVILEGES"
        ));
        let conf = std::fs::read_to_string(&self.conf).expect("influx conf");
        std::fs::write(
            &self.conf,
            conf.replace("[http]\n", "[http]\nauth-enabled = true\n"),
        )
        .expect("influx conf");
        self.stop();
        self.auth = Some(format!("{user}:{password}"));
        self.run();
        let auth = self.auth.take();
        let (status, body) = self
            .request("POST", "/write?db=tidemark", "m v=1 1")
            .unwrap_or_default();
        self.auth = auth;
        assert_eq!(status, 401, "authentication is on: {body}");
    }

    pub fn url(&self) -> String {
        match self.ca {
            Some(_) => format!("https://localhost:{}", self.port),
            None => format!("http://127.0.0.1:{}", self.port),
        }
    }

    /// Over HTTP, or HTTPS through curl checking the CA: (status, body).
    fn request(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        if self.ca.is_none() && self.auth.is_none() {
            return http(self.port, method, path, body);
        }
        let mut curl = Command::new("curl");
        if let Some(a) = &self.auth {
            curl.args(["-u", a]);
        }
        if let Some(ca) = &self.ca {
            curl.arg("--cacert").arg(ca);
        }
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        let out = curl
            .args([
                "-s",
                "-X",
                method,
                "--data-binary",
                body,
                "-w",
                "\n%{http_code}",
            ])
            .arg(format!("{scheme}://localhost:{}{path}", self.port))
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok((code.trim().parse().unwrap_or(0), body.to_string()))
    }

    /// An InfluxQL statement on database `tidemark`: the JSON answer.
    pub fn query(&self, q: &str) -> serde_json::Value {
        let path = format!(
            "/query?db=tidemark&epoch=ms&q={}",
            form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
        );
        let (status, body) = self.request("POST", &path, "").expect("influx query");
        assert_eq!(status, 200, "{q}: {body}");
        serde_json::from_str(&body).expect("influx json")
    }

    /// Line protocol written as it is: the HTTP status.
    pub fn write(&self, lines: &str) -> u16 {
        self.request("POST", "/write?db=tidemark&precision=ms", lines)
            .expect("influx write")
            .0
    }

    /// The rows of a query's first series as (columns, values).
    pub fn series(&self, q: &str) -> (Vec<String>, Vec<Vec<serde_json::Value>>) {
        let v = self.query(q);
        let s = &v["results"][0]["series"][0];
        let cols = s["columns"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| c.as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default();
        let rows = s["values"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| r.as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        (cols, rows)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            super::signal(&c, "TERM");
            let _ = c.wait();
        }
    }

    pub fn start_again(&mut self) {
        self.run();
    }
}

impl Drop for Influx {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One HTTP/1.1 request on loopback, `Connection: close`: (status, body).
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = Vec::new();
    s.read_to_end(&mut text)?;
    let text = String::from_utf8_lossy(&text).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The ids of the condition records published upstream, each once, sorted.
pub fn condition_ids(up: &super::Collector) -> Vec<String> {
    let mut ids: Vec<String> = up
        .on("/conditions/")
        .iter()
        .map(|c| c.json()["id"].as_str().unwrap_or("").to_string())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Every condition record published is one row and one point, by its id.
pub fn conditions_once(up: &super::Collector, pg: &Postgres, ix: &Influx, want: usize) {
    let published = || condition_ids(up);
    let stored = || {
        let q = "SELECT id FROM tidemark_conditions";
        let mut rows: Vec<String> = pg.psql("site", q).lines().map(str::to_string).collect();
        rows.sort();
        rows
    };
    let points = || {
        let v = ix.query("SELECT id FROM tidemark_conditions");
        let mut ids: Vec<String> = v["results"][0]["series"][0]["values"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|r| r[1].as_str().map(str::to_string))
            .collect();
        ids.sort();
        ids
    };
    wait_or_explain(
        Duration::from_secs(120),
        || {
            let p = published();
            p.len() == want && stored() == p && points() == p
        },
        || {
            format!(
                "published {:?}\nstored {:?}\npoints {:?}",
                published(),
                stored(),
                points()
            )
        },
    );
}
