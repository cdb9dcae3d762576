//! Upstream publishing. The outbox is the session: the sink connects with a
//! clean session and, on every CONNACK, publishes from the oldest entry not
//! yet acknowledged. An entry is delivered on its PUBACK (matched FIFO: the
//! broker acknowledges QoS 1 publishes in the order it received them). Live
//! outputs come straight from the commit; a backlog is read from the outbox in
//! order, so per-topic order holds and a long backlog never blocks ingest.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::Shared;
use super::clock::Backoff;
use super::link::{Client, Event, Loop};
use crate::store::{OutboxEntry, OutboxReader};

/// Input of the sink task.
#[derive(Debug)]
pub enum SinkMsg {
    /// Outputs of a commit, with their outbox sequence numbers.
    Live(Vec<(u64, OutboxEntry)>),
    /// A gateway-level alert for `P/alerts`, published as it is (the state
    /// store may be what it is about); kept until the uplink is up.
    Alert(Vec<u8>),
    /// The last commit is done: drain for a few seconds, then go offline.
    Stop,
}

/// Live outputs kept in memory at most; beyond it they are read back from the outbox.
const LIVE_MAX: usize = 50_000;
/// Gateway alerts kept while the uplink is down (the newest).
const ALERTS_KEPT: usize = 64;
/// Outbox entries read per backlog step.
const BACKLOG_READ: usize = 512;
/// Time given to the uplink to drain at shutdown.
const DRAIN: Duration = Duration::from_secs(3);

/// Sink settings.
pub struct SinkOptions {
    /// Publish QoS.
    pub qos: u8,
    /// `P/status` topic.
    pub status_topic: String,
    /// Online status payload.
    pub online: Vec<u8>,
    /// Offline status payload (also the last will).
    pub offline: Vec<u8>,
    /// `P/metrics` topic.
    pub metrics_topic: String,
    /// `P/alerts`.
    pub alerts_topic: String,
    /// In-flight publishes at most (≤ the client's inflight limit).
    pub window: usize,
    /// For logs.
    pub url: String,
}

/// What a published packet was, in PUBACK order.
#[derive(Debug, Clone, Copy)]
enum Flight {
    Entry(u64),
    Status,
}

struct State {
    /// Oldest sequence number not yet acknowledged.
    acked_upto: u64,
    /// Next sequence number to publish.
    cursor: u64,
    inflight: VecDeque<Flight>,
    live: VecDeque<(u64, OutboxEntry)>,
    backlog: VecDeque<(u64, OutboxEntry)>,
    /// A v5 negative PUBACK: publish again from here once the window is empty.
    retry_from: Option<u64>,
    connected: bool,
    /// One past the last sequence number known to exist (u64::MAX: not known yet).
    end: u64,
}

/// Runs until stopped; `metrics` carries `P/metrics` payloads from the core.
#[allow(clippy::too_many_lines)]
#[allow(clippy::too_many_arguments)]
pub async fn run(
    mut lp: Loop,
    client: Client,
    opts: SinkOptions,
    reader: OutboxReader,
    mut rx: UnboundedReceiver<SinkMsg>,
    mut metrics: UnboundedReceiver<Vec<u8>>,
    shared: Arc<Shared>,
    seed: u64,
) {
    let first = match read_from(&reader, None).await {
        Ok(v) => v.first().map_or(u64::MAX, |(s, _)| *s),
        Err(e) => {
            tracing::error!(error = %e, "reading the outbox");
            u64::MAX
        }
    };
    let mut st = State {
        acked_upto: 0,
        cursor: 0,
        inflight: VecDeque::new(),
        live: VecDeque::new(),
        backlog: VecDeque::new(),
        retry_from: None,
        connected: false,
        end: u64::MAX,
    };
    if first != u64::MAX {
        st.acked_upto = first;
        st.cursor = first;
        let depth = shared.outbox_depth.load(Ordering::Relaxed);
        tracing::info!(depth, "outbox backlog to deliver upstream");
    }
    let mut backoff = Backoff::new(seed);
    let mut drain: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut rx_open = true;
    // Gateway alerts waiting for the uplink (a few: they report state changes).
    let mut alerts: VecDeque<Vec<u8>> = VecDeque::new();
    loop {
        if st.connected {
            while let Some(a) = alerts.pop_front() {
                if client
                    .publish(&opts.alerts_topic, a.clone(), opts.qos, false)
                    .is_err()
                {
                    alerts.push_front(a);
                    break;
                }
                if opts.qos > 0 {
                    st.inflight.push_back(Flight::Status);
                }
            }
        }
        if st.connected && st.retry_from.is_none() {
            fill(&mut st, &client, &reader, &opts).await;
        }
        if drain.is_some()
            && st.inflight.is_empty()
            && st.live.is_empty()
            && st.backlog.is_empty()
            && st.cursor >= st.end
        {
            break;
        }
        tokio::select! {
            ev = lp.poll() => match ev {
                Ok(Event::Connected { .. }) => {
                    backoff.reset();
                    st.connected = true;
                    shared.sink_up.store(true, Ordering::Relaxed);
                    st.inflight.clear();
                    st.retry_from = None;
                    st.cursor = st.acked_upto;
                    st.backlog.clear();
                    let depth = shared.outbox_depth.load(Ordering::Relaxed);
                    tracing::info!(url = %opts.url, outbox_depth = depth, "sink connected");
                    if client.publish(&opts.status_topic, opts.online.clone(), 1, true).is_ok() {
                        st.inflight.push_back(Flight::Status);
                    }
                }
                Ok(Event::PubAck { ok, reason }) => on_puback(&mut st, ok, &reason, &shared),
                Ok(_) => {}
                Err(e) => {
                    if st.connected {
                        st.connected = false;
                        shared.sink_up.store(false, Ordering::Relaxed);
                    }
                    if drain.is_some() {
                        break;
                    }
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        url = %opts.url, cause = %e, retry_in_ms = delay.as_millis() as u64,
                        outbox_depth = shared.outbox_depth.load(Ordering::Relaxed),
                        "sink disconnected; outputs kept in the outbox"
                    );
                    tokio::time::sleep(delay).await;
                }
            },
            msg = rx.recv(), if rx_open => match msg {
                Some(SinkMsg::Live(list)) => {
                    if let Some((last, _)) = list.last() {
                        st.end = st.end.max(last + 1);
                        if st.end == u64::MAX { st.end = last + 1; }
                    }
                    for item in list {
                        if st.live.len() < LIVE_MAX {
                            st.live.push_back(item);
                        }
                    }
                }
                Some(SinkMsg::Alert(a)) => {
                    if alerts.len() >= ALERTS_KEPT {
                        alerts.pop_front();
                    }
                    alerts.push_back(a);
                }
                Some(SinkMsg::Stop) | None => {
                    rx_open = false;
                    drain = Some(Box::pin(tokio::time::sleep(DRAIN)));
                }
            },
            m = metrics.recv() => if let Some(payload) = m && st.connected {
                let _ = client.publish(&opts.metrics_topic, payload, 0, false);
            },
            () = async { if let Some(d) = drain.as_mut() { d.await } }, if drain.is_some() => {
                tracing::warn!(
                    outbox_depth = shared.outbox_depth.load(Ordering::Relaxed),
                    "uplink not drained at shutdown; the rest stays in the outbox"
                );
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(200)), if st.retry_from.is_some() && st.inflight.is_empty() => {
                if let Some(from) = st.retry_from.take() {
                    st.cursor = from;
                    st.backlog.clear();
                }
            }
        }
    }
    // Offline status, retained, then a clean disconnect (the last will covers a crash).
    if st.connected
        && client
            .publish(&opts.status_topic, opts.offline.clone(), 1, true)
            .is_ok()
    {
        st.inflight.push_back(Flight::Status);
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while !st.inflight.is_empty() {
                match lp.poll().await {
                    Ok(Event::PubAck { ok, reason }) => on_puback(&mut st, ok, &reason, &shared),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        })
        .await;
        let _ = client.disconnect();
        let _ = tokio::time::timeout(Duration::from_millis(500), async {
            while lp.poll().await.is_ok() {}
        })
        .await;
    }
}

fn on_puback(st: &mut State, ok: bool, reason: &str, shared: &Shared) {
    let Some(f) = st.inflight.pop_front() else {
        return;
    };
    let Flight::Entry(seq) = f else { return };
    if !ok {
        tracing::warn!(seq, reason, "upstream refused an output; retrying");
        st.retry_from = Some(st.retry_from.map_or(seq, |r| r.min(seq)));
        return;
    }
    if st.retry_from.is_none() {
        st.acked_upto = seq + 1;
        shared.delivered.store(seq + 1, Ordering::Release);
    }
}

/// Publishes until the in-flight window is full or nothing is left.
async fn fill(st: &mut State, client: &Client, reader: &OutboxReader, opts: &SinkOptions) {
    while st.inflight.len() < opts.window {
        // Entries below the cursor were already sent (from the other queue).
        while st.live.front().is_some_and(|(s, _)| *s < st.cursor) {
            st.live.pop_front();
        }
        while st.backlog.front().is_some_and(|(s, _)| *s < st.cursor) {
            st.backlog.pop_front();
        }
        let next = if st.live.front().is_some_and(|(s, _)| *s == st.cursor) {
            st.live.pop_front()
        } else if let Some(b) = st.backlog.pop_front() {
            Some(b)
        } else if st.cursor < st.end {
            // A gap before the live queue (a backlog, or live entries over LIVE_MAX).
            let before_live = st.live.front().map(|(s, _)| *s);
            match read_from(reader, st.cursor.checked_sub(1)).await {
                Ok(v) => {
                    let found = !v.is_empty();
                    st.backlog.extend(
                        v.into_iter()
                            .take_while(|(s, _)| before_live.is_none_or(|l| *s < l)),
                    );
                    match (st.backlog.pop_front(), before_live) {
                        (Some(b), _) => Some(b),
                        // Nothing stored before the live queue: it starts right there.
                        (None, Some(l)) => {
                            st.cursor = l;
                            continue;
                        }
                        (None, None) => {
                            if !found {
                                st.end = st.cursor;
                            }
                            None
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "reading the outbox");
                    None
                }
            }
        } else {
            None
        };
        let Some((seq, e)) = next else { break };
        if client
            .publish(&e.topic, e.payload, opts.qos, e.retain)
            .is_err()
        {
            // The request channel is full; the entry is read again from the outbox.
            st.end = st.end.max(seq + 1);
            break;
        }
        st.cursor = seq + 1;
        if opts.qos == 0 {
            st.acked_upto = seq + 1;
        } else {
            st.inflight.push_back(Flight::Entry(seq));
        }
    }
}

async fn read_from(
    reader: &OutboxReader,
    after: Option<u64>,
) -> Result<Vec<(u64, OutboxEntry)>, crate::store::StoreError> {
    let r = reader.clone();
    tokio::task::spawn_blocking(move || r.outbox_after(after, BACKLOG_READ))
        .await
        .unwrap_or_else(|e| {
            Ok({
                tracing::error!(error = %e, "outbox reader task failed");
                Vec::new()
            })
        })
}
