//! Upstream publishing: the async task around [`Delivery`], which decides what
//! goes next; this task only moves events between it, the link and the outbox.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::Shared;
use super::delivery::{Acked, Delivery, Next};
use crate::store::{OutboxEntry, OutboxReader};
use crate::sys::clock::Backoff;
use crate::sys::link::{Client, Event, Loop};

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

/// Runs until stopped; `metrics` carries `P/metrics` payloads from the core.
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
        Ok(v) => v.first().map(|(s, _)| *s),
        Err(e) => {
            tracing::error!(error = %e, "reading the outbox");
            None
        }
    };
    let mut d = Delivery::new(first, opts.window, opts.qos);
    if first.is_some() {
        let depth = shared.outbox_depth.load(Ordering::Relaxed);
        tracing::info!(depth, "outbox backlog to deliver upstream");
    }
    let mut backoff = Backoff::new(seed);
    let mut drain: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut rx_open = true;
    // Gateway alerts waiting for the uplink (a few: they report state changes).
    let mut alerts: VecDeque<Vec<u8>> = VecDeque::new();
    loop {
        if d.is_connected() {
            while let Some(a) = alerts.pop_front() {
                if client
                    .publish(&opts.alerts_topic, a.clone(), opts.qos, false)
                    .is_err()
                {
                    alerts.push_front(a);
                    break;
                }
                d.other_sent(opts.qos);
            }
        }
        fill(&mut d, &client, &reader, opts.qos).await;
        if drain.is_some() && d.drained() {
            break;
        }
        tokio::select! {
            ev = lp.poll() => match ev {
                Ok(Event::Connected { receive_max, .. }) => {
                    backoff.reset();
                    d.connected(receive_max);
                    shared.sink_up.store(true, Ordering::Relaxed);
                    let depth = shared.outbox_depth.load(Ordering::Relaxed);
                    // What bounds the uplink's rate over a long round trip: the smaller of the two.
                    let broker_max = receive_max.unwrap_or(u16::MAX);
                    tracing::info!(url = %opts.url, outbox_depth = depth, max_inflight = opts.window,
                        broker_receive_maximum = broker_max, "sink connected");
                    if broker_max < u16::try_from(opts.window).unwrap_or(u16::MAX) {
                        tracing::info!(broker_receive_maximum = broker_max,
                            "the upstream broker takes fewer unacknowledged publishes than sink.max_inflight: its limit applies");
                    }
                    if client.publish(&opts.status_topic, opts.online.clone(), 1, true).is_ok() {
                        d.other_sent(1);
                    }
                }
                Ok(Event::PubAck { ok, reason }) => on_puback(&mut d, ok, &reason, &shared),
                Ok(_) => {}
                Err(e) => {
                    if d.is_connected() {
                        d.disconnected();
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
                Some(SinkMsg::Live(list)) => d.live(list),
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
            m = metrics.recv() => if let Some(payload) = m && d.is_connected() {
                let _ = client.publish(&opts.metrics_topic, payload, 0, false);
            },
            () = async { if let Some(d) = drain.as_mut() { d.await } }, if drain.is_some() => {
                tracing::warn!(
                    outbox_depth = shared.outbox_depth.load(Ordering::Relaxed),
                    "uplink not drained at shutdown; the rest stays in the outbox"
                );
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(200)), if d.retry_due() => d.retry(),
        }
    }
    // Offline status, retained, then a clean disconnect (the last will covers a crash).
    if d.is_connected()
        && client
            .publish(&opts.status_topic, opts.offline.clone(), 1, true)
            .is_ok()
    {
        d.other_sent(1);
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while d.in_flight() > 0 {
                match lp.poll().await {
                    Ok(Event::PubAck { ok, reason }) => on_puback(&mut d, ok, &reason, &shared),
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

fn on_puback(d: &mut Delivery, ok: bool, reason: &str, shared: &Shared) {
    match d.puback(ok) {
        Acked::Delivered(upto) => shared.delivered.store(upto, Ordering::Release),
        Acked::Refused(seq) => tracing::warn!(seq, reason, "upstream refused an output; retrying"),
        Acked::Nothing => {}
    }
}

/// Publishes until the in-flight window is full or nothing is left.
async fn fill(d: &mut Delivery, client: &Client, reader: &OutboxReader, qos: u8) {
    loop {
        match d.next() {
            Next::Publish(seq, e) => {
                if client.publish(&e.topic, e.payload, qos, e.retain).is_err() {
                    d.unsent(seq);
                    return;
                }
                d.sent(seq);
            }
            Next::Read(after) => match read_from(reader, after).await {
                Ok(v) => d.read(v),
                Err(e) => {
                    tracing::error!(error = %e, "reading the outbox");
                    return;
                }
            },
            Next::Wait => return,
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
