//! A Node.js script from tests/sparkplug (Eclipse Tahu's packages) driven over
//! stdin, one JSON event per stdout line; killed when dropped.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::Value;

pub struct NodeScript {
    child: Child,
    stdin: ChildStdin,
    events: Arc<Mutex<Vec<Value>>>,
}

impl NodeScript {
    /// `node tests/sparkplug/{script} ARGS`; `package` must be installed there.
    pub fn start(script: &str, args: &[String], package: &str) -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sparkplug");
        assert!(
            dir.join("node_modules").join(package).exists(),
            "tests/sparkplug/node_modules missing: scripts/test.sh runs `npm ci` there"
        );
        let mut child = Command::new("node")
            .arg(dir.join(script))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node (scripts/test.sh installs nodejs)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let events = Arc::new(Mutex::new(Vec::new()));
        let ev = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    ev.lock().unwrap().push(v);
                }
            }
        });
        Self {
            child,
            stdin,
            events,
        }
    }

    /// Events whose `key` is `value`, in order.
    pub fn with(&self, key: &str, value: &str) -> Vec<Value> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v[key] == value)
            .cloned()
            .collect()
    }

    /// One line to the script.
    pub fn send(&mut self, op: &Value) {
        writeln!(self.stdin, "{op}").expect("node script stdin");
    }

    /// Stops it as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }
}

impl Drop for NodeScript {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
