//! The local HTTP endpoint under slow and garbage clients: a thousand
//! connections, slowloris, a 1 MB header, random bytes — while a fleet
//! publishes. The gateway takes every reading meanwhile, the endpoint answers
//! again afterwards, and its sockets are given back.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use support::*;

/// Room for a thousand client sockets here (and in the gateway, which inherits it).
fn raise_fd_limit() {
    // SAFETY: plain getrlimit/setrlimit on this process.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < 4096 {
            r.rlim_cur = r.rlim_max.min(8192);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Whether the server has closed `s` (EOF or an error on read).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200))).ok();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn the_http_endpoint_survives_floods_slowloris_and_huge_headers_without_stalling_ingest() {
    raise_fd_limit();
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::stock();
    let http = free_port();
    let cfg = gateway_config(
        dir.path(),
        &dir.path().join("state"),
        broker.port,
        &broker,
        http,
        "",
        "",
    );
    let gw = Gateway::start(&cfg, &dir.path().join("gateway.log"));
    let pid = gw.child.id();
    wait_until(Duration::from_secs(30), "healthz 200", || {
        http_get(http, "/healthz").0 == 200
    });
    let baseline = open_fds(pid);

    // A fleet publishing throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let (st, se, port) = (stop.clone(), sent.clone(), broker.port);
    let fleet = std::thread::spawn(move || {
        let mut p = Publisher::connect(port, "http-hostile-fleet");
        let mut seq = 0;
        while !st.load(Ordering::Relaxed) {
            se.fetch_add(send_fleet(&mut p, 8, seq..seq + 1), Ordering::Relaxed);
            seq += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    wait_until(Duration::from_secs(30), "the fleet flowing", || {
        total(&metrics(http), "tidemark_received_total") > 20
    });

    // A thousand connections held open.
    let mut flood: Vec<TcpStream> = (0..1000)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", http)).ok())
        .collect();
    assert!(flood.len() > 900, "{} connected", flood.len());
    // Slowloris on the first 40: a header byte every 300 ms, never finished.
    for s in flood.iter_mut().take(40) {
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-slow: ");
    }
    // Garbage on the next 40.
    for (i, s) in flood.iter_mut().skip(40).take(40).enumerate() {
        let junk: Vec<u8> = (0..512).map(|k| (k * 31 + i * 7) as u8).collect();
        let _ = s.write_all(&junk);
    }
    // A 1 MB header.
    let mut big = TcpStream::connect(("127.0.0.1", http)).expect("connect");
    let mut req = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-big: ".to_vec();
    req.extend(std::iter::repeat_n(b'a', 1 << 20));
    req.extend(b"\r\n\r\n");
    let _ = big.write_all(&req);
    let mut answer = Vec::new();
    big.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let _ = big.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty()
            || answer.starts_with("HTTP/1.1 431")
            || answer.starts_with("HTTP/1.1 400"),
        "{answer}"
    );
    // The slow clients keep trickling; the server drops them (headers within 5 s).
    wait_until(
        Duration::from_secs(30),
        "slowloris clients dropped by the server",
        || {
            for s in flood.iter_mut().take(40) {
                let _ = s.write_all(b"a");
            }
            std::thread::sleep(Duration::from_millis(300));
            flood.iter_mut().take(40).all(closed_by_server)
        },
    );
    drop(flood);
    drop(big);

    // The endpoint answers again, and gives its sockets back.
    wait_until(
        Duration::from_secs(30),
        "healthz 200 after the attack",
        || try_http_get(http, "/healthz").is_ok_and(|(code, _)| code == 200),
    );
    wait_until(Duration::from_secs(30), "sockets given back", || {
        open_fds(pid) <= baseline + 8
    });

    // Ingest never stalled: every reading sent during all this was taken.
    stop.store(true, Ordering::Relaxed);
    fleet.join().unwrap();
    let sent = sent.load(Ordering::Relaxed);
    wait_until(Duration::from_secs(60), "every reading received", || {
        total(&metrics(http), "tidemark_received_total") >= sent
    });
    assert_eq!(total(&metrics(http), "tidemark_received_total"), sent);
    let (code, _) = gw.terminate();
    assert_eq!(code, Some(0));
}
