//! Ingest from the site broker: a persistent session, QoS 1 messages handed to
//! the core with their ack held, acks sent in receive order after the commit
//! that covers them, reconnects with capped exponential backoff.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc::{Sender, UnboundedReceiver};
use tokio::sync::watch;

use super::Shared;
use super::core::Inbound;
use super::storer::AckJob;
use crate::sys::clock::Backoff;
use crate::sys::link::{Client, Event, Loop};

/// What the source subscribes to.
pub struct Subscription {
    /// Topic filters.
    pub topics: Vec<String>,
    /// Subscription QoS.
    pub qos: u8,
    /// For logs.
    pub url: String,
    /// Sparkplug host STATE (topic, online, offline payloads): online published
    /// retained on every connect, offline before a clean disconnect (the will covers the rest).
    pub host_state: Option<(String, Vec<u8>, Vec<u8>)>,
}

/// Polls the source link until the ack task has flushed the final acks (or
/// `stop` fires while disconnected). Never exits because the broker is down.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    mut lp: Loop,
    client: Client,
    sub: Subscription,
    core: Sender<Inbound>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    mut flushed: watch::Receiver<bool>,
    seed: u64,
) {
    let mut backoff = Backoff::new(seed);
    let mut connected = false;
    let mut stopping = false;
    let mut received_since_connect: u64 = 0;
    let mut was_paused = false;
    // Looks at the store's state even when no message comes.
    let mut look = tokio::time::interval(std::time::Duration::from_millis(200));
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        // The state store cannot commit: stop taking messages (the broker keeps
        // them; a long pause drops the connection and they come again).
        let paused = shared.store_blocked.load(Ordering::Acquire) && !stopping;
        if paused != was_paused {
            was_paused = paused;
            // To the core a pause is a disconnect: the broker's backlog grows,
            // so processing time must not advance anything meanwhile (SPEC §5).
            let ev = if paused {
                tracing::warn!(url = %sub.url, "source paused: the state store cannot commit");
                Inbound::Disconnected
            } else {
                tracing::info!(url = %sub.url, "source resumed");
                Inbound::Connected
            };
            if connected && core.send(ev).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = look.tick() => {}
            ev = lp.poll(), if !paused => match ev {
                Ok(Event::Connected {
                    session_present, ..
                }) => {
                    let generation = shared.source_gen.fetch_add(1, Ordering::AcqRel) + 1;
                    connected = true;
                    received_since_connect = 0;
                    backoff.reset();
                    if session_present {
                        tracing::info!(url = %sub.url, generation, "source connected, session resumed");
                    } else {
                        tracing::info!(url = %sub.url, generation, "source connected, new session: subscribing");
                    }
                    // Subscribed on every connect: a kept session does not prove our
                    // subscription is in it (a SUBSCRIBE lost in a cut before its SUBACK;
                    // a CONNECT the broker took whose CONNACK never came back), and without
                    // it the source is deaf for good. Again is harmless (v5: retained
                    // messages are not sent again).
                    if client.subscribe(&sub.topics, sub.qos).is_err() {
                        // The request channel is full (acks): wait for room off the polling task.
                        let (c, topics, qos) = (client.clone(), sub.topics.clone(), sub.qos);
                        tokio::spawn(async move {
                            if let Err(e) = c.subscribe_wait(topics, qos).await {
                                tracing::error!(error = %e, "source subscribe failed");
                            }
                        });
                    }
                    if let Some((topic, online, _)) = &sub.host_state
                        && let Err(e) = client.publish(topic, online.clone(), 1, true)
                    {
                        tracing::warn!(error = %e, "Sparkplug host STATE not published");
                    }
                    if core.send(Inbound::Connected).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Message { topic, payload, held }) => {
                    if stopping {
                        // Not acknowledged: the broker keeps it for the next start.
                        continue;
                    }
                    received_since_connect += 1;
                    if received_since_connect == 10_000 {
                        tracing::info!("source: 10000 messages since connect (backlog draining)");
                    }
                    let generation = shared.source_gen.load(Ordering::Acquire);
                    let held = held.map(|h| (generation, h));
                    // Waits when the core is behind: the broker's window fills and ingest slows.
                    if core.send(Inbound::Message { topic, payload, held }).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Subscribed { refused }) => {
                    if refused == 0 {
                        shared.health.subscribed(true);
                        tracing::info!(topics = ?sub.topics, "source subscribed");
                    } else {
                        tracing::error!(refused, topics = ?sub.topics, "source broker refused topic filters");
                    }
                }
                Ok(Event::PubAck { .. } | Event::Other) => {}
                Err(e) => {
                    if stopping && (*flushed.borrow() || !connected) {
                        return;
                    }
                    if connected {
                        connected = false;
                        shared.health.subscribed(false);
                        // Ack tokens of this connection are stale from now on.
                        shared.source_gen.fetch_add(1, Ordering::AcqRel);
                        let _ = core.send(Inbound::Disconnected).await;
                    }
                    let delay = backoff.next_delay();
                    tracing::warn!(url = %sub.url, cause = %e, retry_in_ms = delay.as_millis() as u64, "source disconnected");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = stop.changed(), if !stopping => { stopping = true; }
                    }
                    if stopping && !connected {
                        return;
                    }
                }
            },
            _ = stop.changed(), if !stopping => {
                stopping = true;
            }
            _ = flushed.changed() => {
                if *flushed.borrow() {
                    // Final acks are queued before the disconnect request: poll until it is out.
                    if let Some((topic, _, offline)) = &sub.host_state
                        && connected
                    {
                        let _ = client.publish(topic, offline.clone(), 1, true);
                    }
                    let _ = client.disconnect();
                    let deadline = tokio::time::sleep(std::time::Duration::from_secs(2));
                    tokio::pin!(deadline);
                    loop {
                        tokio::select! {
                            r = lp.poll() => if r.is_err() { return },
                            () = &mut deadline => return,
                        }
                    }
                }
            }
        }
    }
}

/// Sends acks in receive order; a token from an earlier connection is dropped
/// (the broker redelivers that message, and seq deduplication makes it harmless).
pub async fn acks(
    client: Client,
    mut rx: UnboundedReceiver<AckJob>,
    shared: Arc<Shared>,
    flushed: watch::Sender<bool>,
) {
    while let Some(job) = rx.recv().await {
        match job {
            AckJob::Acks(list) => {
                let current = shared.source_gen.load(Ordering::Acquire);
                let mut stale = 0u64;
                for (generation, held) in list {
                    if generation != current {
                        stale += 1;
                        continue;
                    }
                    if let Err(e) = client.ack(&held).await {
                        tracing::warn!(error = %e, "ack not sent; the broker will redeliver");
                    }
                }
                if stale > 0 {
                    tracing::debug!(stale, "acks of an earlier connection dropped");
                }
            }
            AckJob::Done => break,
        }
    }
    let _ = flushed.send(true);
}
