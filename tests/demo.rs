//! `tidemark demo`, the README's first command: on a machine with no broker
//! and no config it shows windows, alerts and calibrated clocks within 30 s,
//! on a terminal (a pseudo-terminal here) and as plain lines, and stops
//! cleanly on Ctrl-C or by itself.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn demo() -> Command {
    let mut c = support::tidemark();
    c.arg("demo").env_remove("RUST_LOG");
    c
}

#[test]
fn a_terminal_gets_a_live_screen() {
    // util-linux `script` runs the demo on a pseudo-terminal.
    let out = Command::new("script")
        .args(["-qefc"])
        .arg(format!(
            "{} demo --duration 20",
            support::tidemark_argv().join(" ")
        ))
        .arg("/dev/null")
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.matches("\x1b[H\x1b[2J").count() >= 5,
        "no redraws in:\n{text}"
    );
    let last = text.rsplit("\x1b[H\x1b[2J").nth(1).unwrap_or_default();
    for want in [
        "GROUPS",
        "CLOCKS",
        "RECENT WINDOWS",
        "ALERTS",
        "watermark",
        "clock_skew",
        "script: hall/d0000 runs 17 min fast",
        "rev = revision",
    ] {
        assert!(last.contains(want), "no {want:?} on the screen:\n{last}");
    }
    assert!(text.contains("gateway stopped cleanly"), "{text}");
}

/// Plain lines (stdout is a pipe) until every behaviour has shown, then Ctrl-C.
#[test]
fn plain_lines_show_every_behaviour_and_ctrl_c_stops_everything_cleanly() {
    let mut child = demo()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("demo");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    let wants = [
        "window  ",
        "clock_skew lab/d0001   clock offset +1h59m",
        "hall/d0000  clock +17m00s  calibrated: its windows are on true time",
        "offline    hall/d0012",
        "online     hall/d0012",
        "offline    yard/",
        "late    ",
        "reject  ",
    ];
    let missing = || {
        let text = lines.lock().unwrap().join("\n");
        wants
            .iter()
            .filter(|w| !text.contains(*w))
            .copied()
            .collect::<Vec<_>>()
    };
    // A generous bound that ends as soon as everything has shown (~30 s here).
    for waited in 0.. {
        if missing().is_empty() {
            break;
        }
        assert!(
            waited < 1800,
            "missing {:?} in:\n{}",
            missing(),
            lines.lock().unwrap().join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let broker = lines.lock().unwrap()[0]
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .map(|w| w.trim_end_matches(';').to_owned())
        .expect("the broker's address in the first line");
    let pid = child.id().to_string();
    let state_dir = std::env::temp_dir().join(format!("tidemark-demo-{pid}"));
    assert!(state_dir.exists());
    Command::new("kill").args(["-INT", &pid]).status().unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let text = lines.lock().unwrap().join("\n");
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(text.contains("gateway stopped cleanly"), "{text}");
    // Not a screen: no terminal control sequences when stdout is a pipe.
    assert!(!text.contains('\x1b'), "{text}");
    // Its gateway and fleet are gone with it, and so are its files.
    assert!(!state_dir.exists(), "{} left behind", state_dir.display());
    let marker = state_dir.to_string_lossy().into_owned();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker) || c.contains(&format!("mqtt://{broker}")))
        .collect();
    assert!(left.is_empty(), "still running: {left:?}");
}
