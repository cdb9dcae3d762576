//! The optional embedded MQTT broker (`[broker] embedded = true`): rumqttd on
//! its own threads, MQTT 3.1.1 on `broker.listen`. It keeps everything in
//! memory and has no shutdown API, so it is for small sites and demos: the
//! durability guarantees start at tidemark's own commit.

use std::collections::HashMap;
use std::net::SocketAddr;

/// Starts the broker on background threads; returns once it was spawned.
#[cfg(feature = "embedded-broker")]
pub fn start(listen: SocketAddr) -> Result<(), BrokerError> {
    use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};
    let server = ServerSettings {
        name: "tidemark-embedded".into(),
        listen,
        tls: None,
        next_connection_delay_ms: 1,
        connections: ConnectionSettings {
            connection_timeout_ms: 60_000,
            max_payload_size: crate::sys::link::MAX_INCOMING_PACKET,
            // Acks are held until commit: leave the broker room for a commit's worth.
            max_inflight_count: 10_000,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        },
    };
    let config = Config {
        id: 0,
        router: RouterConfig {
            max_connections: 10_010,
            max_outgoing_packet_count: 200,
            max_segment_size: 100 * 1024 * 1024,
            max_segment_count: 10,
            ..RouterConfig::default()
        },
        v4: Some(HashMap::from([("1".to_string(), server)])),
        ..Config::default()
    };
    // Bind first, so a taken port is a clear startup error rather than a log line later.
    std::net::TcpListener::bind(listen).map_err(|source| BrokerError::Listen { listen, source })?;
    let mut broker = Broker::new(config);
    std::thread::Builder::new()
        .name("tidemark-broker".into())
        .spawn(move || {
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "embedded broker stopped");
            }
        })
        .map_err(BrokerError::Thread)?;
    Ok(())
}

/// Built without the `embedded-broker` feature.
#[cfg(not(feature = "embedded-broker"))]
pub fn start(listen: SocketAddr) -> Result<(), BrokerError> {
    let _ = HashMap::<(), ()>::new();
    Err(BrokerError::NotBuilt { listen })
}

/// Why the embedded broker did not start.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The listen address is taken or not ours.
    #[error("embedded broker cannot listen on {listen}: {source}")]
    Listen {
        /// `broker.listen`.
        listen: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// Its thread could not start.
    #[error("embedded broker thread: {0}")]
    Thread(#[source] std::io::Error),
    /// Built without the `embedded-broker` feature.
    #[error(
        "broker.embedded = true (listen {listen}), but this build has no embedded broker (cargo feature `embedded-broker`)"
    )]
    NotBuilt {
        /// `broker.listen`.
        listen: SocketAddr,
    },
}
