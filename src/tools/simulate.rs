//! `tidemark simulate`: publishes a [`Fleet`](crate::sim::Fleet) to a broker at
//! a target rate (or as fast as the broker takes it) over several connections,
//! with a progress line each second and a JSON summary at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::config::{Endpoint, parse_url};
use crate::sim::{Fleet, SimConfig, Tally};
use crate::sys::clock::SystemClock;
use crate::sys::link::{self, Event, LinkOptions};

/// How to publish.
#[derive(Debug, Clone)]
pub struct SimulateOptions {
    /// Broker URL.
    pub url: String,
    /// Messages per second in all; 0: as fast as the broker takes them.
    pub rate: f64,
    /// Stop after this many messages.
    pub count: Option<u64>,
    /// Stop after this many seconds.
    pub duration_s: Option<f64>,
    /// 0 or 1.
    pub qos: u8,
    /// Connections to publish over.
    pub connections: u32,
    /// MQTT 5 when true.
    pub v5: bool,
    /// Progress lines on stderr.
    pub progress: bool,
}

/// Simulate failures.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// The URL does not parse.
    #[error("--url: {0}")]
    Url(String),
    /// The link could not be built.
    #[error(transparent)]
    Link(#[from] link::LinkError),
    /// The runtime could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// Acks did not arrive.
    #[error("{0} QoS 1 messages were not acknowledged by the broker")]
    Unacked(u64),
    /// No broker answered a CONNECT, in either MQTT version.
    #[error("no MQTT broker answers at {url} (tried for {secs} s: {cause}); is it running?")]
    NoBroker {
        /// `--url`.
        url: String,
        /// How long it was tried.
        secs: u64,
        /// The last connection error.
        cause: String,
    },
}

/// How long `simulate` tries to reach a broker before it gives up.
const REACH_S: u64 = 10;

/// The MQTT version to publish with: `v5` as asked when the broker takes it, else
/// 3.1.1 when it answers only that (the embedded broker, older brokers); an error
/// when nothing answers within [`REACH_S`].
async fn reach(endpoint: &Endpoint, v5: bool, url: &str) -> Result<bool, SimulateError> {
    let clock = SystemClock::new();
    let start = clock.mono();
    let mut cause = String::from("no answer");
    let versions: &[bool] = if v5 { &[true, false] } else { &[false] };
    while clock.mono() - start < i64::try_from(REACH_S * 1000).unwrap_or(i64::MAX) {
        for &version in versions {
            let (client, mut lp) = link::build(&LinkOptions {
                endpoint,
                v5: version,
                persistent: false,
                session_expiry_s: 0,
                manual_acks: false,
                will: None,
                will_retain: true,
                inflight: 10,
            })?;
            let answer = tokio::time::timeout(Duration::from_secs(3), async {
                loop {
                    match lp.poll().await {
                        Ok(Event::Connected { .. }) => return Ok(()),
                        Ok(_) => {}
                        Err(e) => return Err(e.to_string()),
                    }
                }
            })
            .await;
            let _ = client.disconnect();
            match answer {
                Ok(Ok(())) => {
                    if v5 && !version {
                        tracing::warn!(%url, "the broker does not take MQTT 5: simulate publishes over MQTT 3.1.1");
                    }
                    return Ok(version);
                }
                Ok(Err(e)) => cause = e,
                Err(_) => cause = "no CONNACK within 3 s".into(),
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(SimulateError::NoBroker {
        url: url.to_owned(),
        secs: REACH_S,
        cause,
    })
}

/// The final summary (stdout, one JSON object).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Messages handed to the broker.
    pub sent: u64,
    /// QoS 1 acknowledgements received.
    pub acked: u64,
    /// Connection errors seen.
    pub errors: u64,
    /// Seconds from the first to the last send.
    pub elapsed_s: f64,
    /// sent / elapsed_s.
    pub rate: f64,
    /// By kind.
    pub messages: Tally,
}

struct Conn {
    client: link::Client,
    sent: AtomicU64,
    acked: AtomicU64,
    up: AtomicBool,
}

/// Publishes until `count`, `duration_s` or Ctrl-C; returns the summary.
pub fn run(o: &SimulateOptions, fleet: SimConfig) -> Result<Summary, SimulateError> {
    let (tls, host, port) = parse_url(&o.url).map_err(SimulateError::Url)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let endpoint = |name: String| Endpoint::plain(tls, host.clone(), port, name, o.qos);
    let pid = std::process::id();
    let v5 = rt.block_on(reach(
        &endpoint(format!("tidemark-sim-{pid}-probe")),
        o.v5,
        &o.url,
    ))?;
    let mut conns = Vec::new();
    let mut loops = Vec::new();
    for c in 0..o.connections.max(1) {
        let (client, lp) = link::build(&LinkOptions {
            endpoint: &endpoint(format!("tidemark-sim-{pid}-{c}")),
            v5,
            persistent: false,
            session_expiry_s: 0,
            manual_acks: false,
            will: None,
            will_retain: true,
            inflight: 1000,
        })?;
        conns.push(Arc::new(Conn {
            client,
            sent: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            up: AtomicBool::new(false),
        }));
        loops.push(lp);
    }
    let sim = Sim {
        o,
        conns,
        errors: Arc::new(AtomicU64::new(0)),
        clock: SystemClock::new(),
    };
    rt.block_on(sim.run(loops, Fleet::new(fleet)))
}

/// The publishing side of a run.
struct Sim<'a> {
    o: &'a SimulateOptions,
    conns: Vec<Arc<Conn>>,
    errors: Arc<AtomicU64>,
    clock: SystemClock,
}

impl Sim<'_> {
    async fn run(
        &self,
        loops: Vec<link::Loop>,
        mut fleet: Fleet,
    ) -> Result<Summary, SimulateError> {
        let stopping = Arc::new(AtomicBool::new(false));
        let pollers: Vec<_> = self
            .conns
            .iter()
            .cloned()
            .zip(loops)
            .map(|(conn, lp)| tokio::spawn(poll(conn, lp, self.errors.clone(), stopping.clone())))
            .collect();
        // Every connection up before the clock starts.
        let wait_start = self.clock.mono();
        while !self.conns.iter().all(|c| c.up.load(Ordering::Relaxed)) {
            if self.clock.mono() - wait_start > 30_000 {
                tracing::error!(url = %self.o.url, "simulate: broker not reachable for 30 s");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let start = self.clock.mono();
        let (mut sent, mut tally) = self.publish(&mut fleet).await;
        // Sparkplug: the edge nodes go, as their wills would say (offline at once upstream).
        for m in fleet.finish() {
            let conn = self.conn(m.device);
            if conn
                .client
                .publish_wait(&m.topic, m.payload, self.o.qos)
                .await
                .is_ok()
            {
                conn.sent.fetch_add(1, Ordering::Relaxed);
                tally.record(m.kind, false);
                sent += 1;
            }
        }
        let elapsed_s = ((self.clock.mono() - start) as f64 / 1000.0).max(0.001);
        let unacked = self.settle().await;
        stopping.store(true, Ordering::Relaxed);
        for c in &self.conns {
            let _ = c.client.disconnect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        for p in pollers {
            p.abort();
        }
        if unacked > 0 {
            return Err(SimulateError::Unacked(unacked));
        }
        Ok(Summary {
            sent,
            acked: self.acked(),
            errors: self.errors.load(Ordering::Relaxed),
            elapsed_s,
            rate: sent as f64 / elapsed_s,
            messages: tally,
        })
    }

    fn conn(&self, device: u32) -> &Conn {
        let n = u32::try_from(self.conns.len()).unwrap_or(1).max(1);
        &self.conns[(device % n) as usize]
    }

    fn acked(&self) -> u64 {
        self.conns
            .iter()
            .map(|c| c.acked.load(Ordering::Relaxed))
            .sum()
    }

    /// The fleet's schedule at the target rate until `count`, `duration_s` or Ctrl-C.
    async fn publish(&self, fleet: &mut Fleet) -> (u64, Tally) {
        let o = self.o;
        let start = self.clock.now();
        let deadline_ms = o
            .duration_s
            .map_or(i64::MAX, |s| (s * 1000.0).round() as i64);
        let stop = Arc::new(AtomicBool::new(false));
        {
            let stop = stop.clone();
            tokio::spawn(async move {
                crate::sys::shutdown_signal().await;
                stop.store(true, Ordering::Relaxed);
            });
        }
        let (mut sent, mut tally, mut slots) = (0u64, Tally::default(), 0u64);
        let (mut next_progress, mut last_sent) = (1000, 0u64);
        let full = |sent: u64| o.count.is_some_and(|c| sent >= c);
        loop {
            let now = self.clock.now();
            let elapsed = now.mono - start.mono;
            if stop.load(Ordering::Relaxed) || elapsed >= deadline_ms || full(sent) {
                return (sent, tally);
            }
            if o.progress && elapsed >= next_progress {
                eprintln!(
                    "simulate: {:>6.1} s  sent {sent:>9}  {:>8} msg/s  acked {:>9}  held {:>6}  errors {}",
                    elapsed as f64 / 1000.0,
                    sent - last_sent,
                    self.acked(),
                    fleet.held(),
                    self.errors.load(Ordering::Relaxed)
                );
                last_sent = sent;
                next_progress += 1000;
            }
            // The schedule's slots due now by the target rate; when unlimited, as
            // many as the connections take (publish waits for room).
            let due = if o.rate > 0.0 {
                ((elapsed as f64 / 1000.0) * o.rate) as u64
            } else {
                slots + 256
            };
            let mut batch = Vec::new();
            while let Some(m) = fleet.release(elapsed) {
                batch.push(m);
                if batch.len() >= 256 {
                    break;
                }
            }
            while batch.len() < 256 && slots < due {
                slots += 1;
                batch.extend(fleet.next(now.wall, elapsed));
            }
            if batch.is_empty() {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
            for m in batch {
                if full(sent) {
                    return (sent, tally);
                }
                let conn = self.conn(m.device);
                let (kind, backlog) = (m.kind, m.backlog);
                if let Err(e) = conn.client.publish_wait(&m.topic, m.payload, o.qos).await {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("simulate: publish: {e}");
                    continue;
                }
                conn.sent.fetch_add(1, Ordering::Relaxed);
                tally.record(kind, backlog);
                sent += 1;
            }
        }
    }

    /// QoS 1: waits (bounded) for the broker's acks; the count still missing.
    async fn settle(&self) -> u64 {
        if self.o.qos != 1 {
            // QoS 0: give the client a moment to write what it queued.
            tokio::time::sleep(Duration::from_millis(200)).await;
            return 0;
        }
        let t0 = self.clock.mono();
        loop {
            let unacked = self
                .conns
                .iter()
                .map(|c| {
                    c.sent
                        .load(Ordering::Relaxed)
                        .saturating_sub(c.acked.load(Ordering::Relaxed))
                })
                .sum::<u64>();
            if unacked == 0 || self.clock.mono() - t0 > 30_000 {
                return unacked;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Polls one connection: connects, counts PUBACKs, backs off on errors.
async fn poll(
    conn: Arc<Conn>,
    mut lp: link::Loop,
    errors: Arc<AtomicU64>,
    stopping: Arc<AtomicBool>,
) {
    loop {
        match lp.poll().await {
            Ok(Event::Connected { .. }) => conn.up.store(true, Ordering::Relaxed),
            Ok(Event::PubAck { .. }) => {
                conn.acked.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(_) if stopping.load(Ordering::Relaxed) => return,
            Err(e) => {
                conn.up.store(false, Ordering::Relaxed);
                if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!("simulate: connection error: {e}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
