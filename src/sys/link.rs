//! One MQTT connection over rumqttc, MQTT 5 or 3.1.1 behind one small
//! interface: the source and the sink see connects, publishes and acks, not
//! protocol versions.

use std::time::Duration;

use rumqttc::{TlsConfiguration, Transport};

use crate::config::Endpoint;

/// Largest packet taken from the source broker. Payloads above the contract's 64 KiB
/// are still received, so they can be rejected visibly and acknowledged
/// (rumqttc would otherwise drop the connection and the broker redeliver forever).
pub const MAX_INCOMING_PACKET: usize = 1024 * 1024;

/// A received message whose acknowledgement is held until its commit: only its
/// packet id and QoS, what the acknowledgement is made of (holding the whole packet
/// kept its payload, and the read buffer the payload points into, alive until the commit).
#[derive(Debug, Clone, Copy)]
pub enum Held {
    /// MQTT 3.1.1.
    V4(u16, rumqttc::QoS),
    /// MQTT 5.
    V5(u16, rumqttc::v5::mqttbytes::QoS),
}

/// What the event loop reported.
#[derive(Debug)]
pub enum Event {
    /// Connected; whether the broker resumed our session.
    Connected {
        /// Session present flag of the CONNACK.
        session_present: bool,
        /// The broker's Receive Maximum (MQTT 5; absent: 65 535): publishes it
        /// takes unacknowledged at once, which caps the client's in-flight window.
        receive_max: Option<u16>,
    },
    /// An application message.
    Message {
        /// Topic.
        topic: String,
        /// Payload.
        payload: bytes::Bytes,
        /// Held for a manual ack (QoS 1), None for QoS 0.
        held: Option<Held>,
        /// A retained message sent because of a new subscription.
        retained: bool,
    },
    /// PUBACK of our oldest outstanding QoS 1 publish; false for a v5 negative reason code.
    PubAck {
        /// The broker took the message.
        ok: bool,
        /// Reason code text (v5 failures).
        reason: String,
    },
    /// SUBACK: how many filters the broker refused.
    Subscribed {
        /// Refused filters.
        refused: usize,
    },
    /// UNSUBACK: the broker has read every packet sent before the UNSUBSCRIBE.
    UnsubAck,
    /// A PINGREQ went out: the broker owes a PINGRESP.
    PingSent,
    /// A PUBLISH left the request queue for the connection.
    Published,
    /// Another packet from the broker (a PINGRESP, an UNSUBACK): the path works.
    Heard,
    /// Nothing of interest (our own outgoing packets).
    Other,
}

/// Options for building a link.
pub struct LinkOptions<'a> {
    /// The broker.
    pub endpoint: &'a Endpoint,
    /// MQTT 5 when true.
    pub v5: bool,
    /// Keep the session across connections (source) or start clean (sink).
    pub persistent: bool,
    /// v5 session expiry, seconds.
    pub session_expiry_s: u32,
    /// Acks are sent by the caller.
    pub manual_acks: bool,
    /// Last will: topic, payload, at QoS 1.
    pub will: Option<(String, Vec<u8>)>,
    /// The will is retained (a status); Sparkplug's NDEATH is not.
    pub will_retain: bool,
    /// Outgoing in-flight QoS 1 publishes at most.
    pub inflight: u16,
}

impl<'a> LinkOptions<'a> {
    /// A tool's own link (capture, fleet): MQTT 5, a clean session, automatic
    /// acks, no will.
    pub fn tool(endpoint: &'a Endpoint, inflight: u16) -> Self {
        Self {
            endpoint,
            v5: true,
            persistent: false,
            session_expiry_s: 0,
            manual_acks: false,
            will: None,
            will_retain: false,
            inflight,
        }
    }
}

/// The client half (requests); cheap to clone.
#[derive(Clone)]
pub enum Client {
    /// MQTT 3.1.1.
    V4(rumqttc::AsyncClient),
    /// MQTT 5.
    V5(rumqttc::v5::AsyncClient),
}

/// The event loop half; must be polled continuously.
pub enum Loop {
    /// MQTT 3.1.1.
    V4(Box<rumqttc::EventLoop>),
    /// MQTT 5.
    V5(Box<rumqttc::v5::EventLoop>),
}

/// Errors of a link (all transient for the caller: it reconnects with backoff).
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Connection-level failure (MQTT 3.1.1).
    #[error(transparent)]
    Connection(Box<rumqttc::ConnectionError>),
    /// Connection-level failure (MQTT 5).
    #[error(transparent)]
    Connection5(Box<rumqttc::v5::ConnectionError>),
    /// A request could not be queued (MQTT 3.1.1).
    #[error("request not queued: {0}")]
    Request(#[source] Box<rumqttc::ClientError>),
    /// A request could not be queued (MQTT 5).
    #[error("request not queued: {0}")]
    Request5(#[source] Box<rumqttc::v5::ClientError>),
    /// An ack for a message of the other protocol's link.
    #[error("ack on a link of another protocol")]
    Protocol,
    /// TLS material could not be read.
    #[error("reading {path}: {source}")]
    Tls {
        /// The file.
        path: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

// Boxed: the rumqttc errors are large, and every link call returns them.
macro_rules! boxed_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for LinkError {
            fn from(e: $t) -> Self {
                LinkError::$v(Box::new(e))
            }
        }
    )*};
}

boxed_from!(
    rumqttc::ConnectionError => Connection,
    rumqttc::v5::ConnectionError => Connection5,
    rumqttc::ClientError => Request,
    rumqttc::v5::ClientError => Request5
);

fn tls(ep: &Endpoint) -> Result<Option<Transport>, LinkError> {
    if !ep.tls {
        return Ok(None);
    }
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|source| LinkError::Tls {
            path: p.to_path_buf(),
            source,
        })
    };
    // No silent "insecure" mode: server certificates are always verified, against
    // `ca_file` or the system roots.
    let ca = match &ep.ca_file {
        Some(p) => read(p)?,
        None => read(std::path::Path::new("/etc/ssl/certs/ca-certificates.crt"))?,
    };
    let client_auth = match &ep.client_cert {
        Some((c, k)) => Some((read(c)?, read(k)?)),
        None => None,
    };
    Ok(Some(Transport::tls_with_config(TlsConfiguration::Simple {
        ca,
        alpn: None,
        client_auth,
    })))
}

/// Builds a client and its event loop (nothing is connected until the loop is polled).
pub fn build(o: &LinkOptions<'_>) -> Result<(Client, Loop), LinkError> {
    let ep = o.endpoint;
    let transport = tls(ep)?;
    let keep_alive = Duration::from_secs(u64::from(ep.keep_alive_s.max(5)));
    let cap = usize::from(o.inflight).max(64) * 4;
    if o.v5 {
        use rumqttc::v5::mqttbytes::{QoS, v5::LastWill};
        let mut m = rumqttc::v5::MqttOptions::new(&ep.client_id, &ep.host, ep.port);
        m.set_keep_alive(keep_alive)
            .set_clean_start(!o.persistent)
            .set_manual_acks(o.manual_acks)
            .set_receive_maximum(Some(u16::MAX))
            .set_max_packet_size(Some(u32::try_from(MAX_INCOMING_PACKET).unwrap_or(u32::MAX)))
            .set_outgoing_inflight_upper_limit(o.inflight)
            .set_request_channel_capacity(cap);
        if o.persistent {
            m.set_session_expiry_interval(Some(o.session_expiry_s));
        }
        if let (Some(u), p) = (&ep.username, &ep.password) {
            m.set_credentials(u, p.clone().unwrap_or_default());
        }
        if let Some((topic, payload)) = &o.will {
            m.set_last_will(LastWill::new(
                topic.clone(),
                payload.clone(),
                QoS::AtLeastOnce,
                o.will_retain,
                None,
            ));
        }
        if let Some(t) = transport {
            m.set_transport(t);
        }
        let (c, l) = rumqttc::v5::AsyncClient::new(m, cap);
        Ok((Client::V5(c), Loop::V5(Box::new(l))))
    } else {
        use rumqttc::{LastWill, QoS};
        let mut m = rumqttc::MqttOptions::new(&ep.client_id, &ep.host, ep.port);
        m.set_keep_alive(keep_alive)
            .set_clean_session(!o.persistent)
            .set_manual_acks(o.manual_acks)
            .set_max_packet_size(MAX_INCOMING_PACKET, MAX_INCOMING_PACKET)
            .set_inflight(o.inflight)
            .set_request_channel_capacity(cap);
        if let (Some(u), p) = (&ep.username, &ep.password) {
            m.set_credentials(u, p.clone().unwrap_or_default());
        }
        if let Some((topic, payload)) = &o.will {
            m.set_last_will(LastWill::new(
                topic.clone(),
                payload.clone(),
                QoS::AtLeastOnce,
                o.will_retain,
            ));
        }
        if let Some(t) = transport {
            m.set_transport(t);
        }
        let (c, l) = rumqttc::AsyncClient::new(m, cap);
        Ok((Client::V4(c), Loop::V4(Box::new(l))))
    }
}

impl Client {
    /// Queues a subscription to every filter at `qos`.
    pub fn subscribe(&self, filters: &[String], qos: u8) -> Result<(), LinkError> {
        match self {
            Client::V4(c) => {
                let q = qos4(qos);
                c.try_subscribe_many(
                    filters
                        .iter()
                        .map(|f| rumqttc::SubscribeFilter::new(f.clone(), q)),
                )
                .map_err(LinkError::from)
            }
            Client::V5(c) => {
                let q = qos5(qos);
                c.try_subscribe_many(filters.iter().map(|f| filter5(f.clone(), q)))
                    .map_err(LinkError::from)
            }
        }
    }

    /// Subscribes, waiting for room in the request channel (never call from the polling task).
    pub async fn subscribe_wait(&self, filters: Vec<String>, qos: u8) -> Result<(), LinkError> {
        match self {
            Client::V4(c) => {
                let q = qos4(qos);
                c.subscribe_many(
                    filters
                        .into_iter()
                        .map(|f| rumqttc::SubscribeFilter::new(f, q)),
                )
                .await
                .map_err(LinkError::from)
            }
            Client::V5(c) => {
                let q = qos5(qos);
                c.subscribe_many(filters.into_iter().map(|f| filter5(f, q)))
                    .await
                    .map_err(LinkError::from)
            }
        }
    }

    /// Queues a publish.
    pub fn publish(
        &self,
        topic: &str,
        payload: impl Into<bytes::Bytes>,
        qos: u8,
        retain: bool,
    ) -> Result<(), LinkError> {
        let payload = payload.into();
        match self {
            Client::V4(c) => c
                .try_publish(topic, qos4(qos), retain, Vec::from(payload))
                .map_err(LinkError::from),
            Client::V5(c) => c
                .try_publish(topic, qos5(qos), retain, payload)
                .map_err(LinkError::from),
        }
    }

    /// Queues a publish, waiting for room in the request channel.
    pub async fn publish_wait(
        &self,
        topic: &str,
        payload: Vec<u8>,
        qos: u8,
    ) -> Result<(), LinkError> {
        match self {
            Client::V4(c) => c
                .publish(topic, qos4(qos), false, payload)
                .await
                .map_err(LinkError::from),
            Client::V5(c) => c
                .publish(topic, qos5(qos), false, payload)
                .await
                .map_err(LinkError::from),
        }
    }

    /// Sends the ack of a held message (waits for room in the request channel).
    pub async fn ack(&self, held: &Held) -> Result<(), LinkError> {
        match (self, held) {
            // The client builds the acknowledgement from the QoS and packet id alone.
            (Client::V4(c), &Held::V4(pkid, qos)) => {
                let mut p = rumqttc::Publish::new("", qos, Vec::new());
                p.pkid = pkid;
                c.ack(&p).await.map_err(LinkError::from)
            }
            (Client::V5(c), &Held::V5(pkid, qos)) => {
                let mut p =
                    rumqttc::v5::mqttbytes::v5::Publish::new("", qos, bytes::Bytes::new(), None);
                p.pkid = pkid;
                c.ack(&p).await.map_err(LinkError::from)
            }
            _ => Err(LinkError::Protocol),
        }
    }

    /// Queues an unsubscription of one filter.
    pub fn unsubscribe(&self, filter: &str) -> Result<(), LinkError> {
        match self {
            Client::V4(c) => c.try_unsubscribe(filter).map_err(LinkError::from),
            Client::V5(c) => c.try_unsubscribe(filter).map_err(LinkError::from),
        }
    }

    /// Queues a clean disconnect.
    pub fn disconnect(&self) -> Result<(), LinkError> {
        match self {
            Client::V4(c) => c.try_disconnect().map_err(LinkError::from),
            Client::V5(c) => c.try_disconnect().map_err(LinkError::from),
        }
    }
}

fn qos4(q: u8) -> rumqttc::QoS {
    if q == 0 {
        rumqttc::QoS::AtMostOnce
    } else {
        rumqttc::QoS::AtLeastOnce
    }
}

fn qos5(q: u8) -> rumqttc::v5::mqttbytes::QoS {
    if q == 0 {
        rumqttc::v5::mqttbytes::QoS::AtMostOnce
    } else {
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce
    }
}

/// A v5 filter that, subscribed again on a resumed session, does not send
/// retained messages a second time.
fn filter5(path: String, qos: rumqttc::v5::mqttbytes::QoS) -> rumqttc::v5::mqttbytes::v5::Filter {
    let mut f = rumqttc::v5::mqttbytes::v5::Filter::new(path, qos);
    f.retain_forward_rule = rumqttc::v5::mqttbytes::v5::RetainForwardRule::OnNewSubscribe;
    f
}

impl Loop {
    /// The will of the next connection (QoS 1, not retained).
    pub fn set_will(&mut self, topic: &str, payload: Vec<u8>) {
        match self {
            Loop::V4(l) => {
                l.mqtt_options.set_last_will(rumqttc::LastWill::new(
                    topic,
                    payload,
                    rumqttc::QoS::AtLeastOnce,
                    false,
                ));
            }
            Loop::V5(l) => {
                l.options
                    .set_last_will(rumqttc::v5::mqttbytes::v5::LastWill::new(
                        topic,
                        payload,
                        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                        false,
                        None,
                    ));
            }
        }
    }

    /// Polls once; reconnects on the next call after an error.
    pub async fn poll(&mut self) -> Result<Event, LinkError> {
        match self {
            Loop::V4(l) => {
                use rumqttc::{Event as E, Packet};
                match l.poll().await {
                    Ok(E::Incoming(Packet::ConnAck(c))) => Ok(Event::Connected {
                        session_present: c.session_present,
                        receive_max: None,
                    }),
                    Ok(E::Incoming(Packet::Publish(p))) => Ok(Event::Message {
                        topic: p.topic.clone(),
                        payload: p.payload.clone(),
                        held: (p.qos != rumqttc::QoS::AtMostOnce)
                            .then_some(Held::V4(p.pkid, p.qos)),
                        retained: p.retain,
                    }),
                    Ok(E::Incoming(Packet::PubAck(_))) => Ok(Event::PubAck {
                        ok: true,
                        reason: String::new(),
                    }),
                    Ok(E::Incoming(Packet::SubAck(a))) => Ok(Event::Subscribed {
                        refused: a
                            .return_codes
                            .iter()
                            .filter(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure))
                            .count(),
                    }),
                    Ok(E::Incoming(Packet::UnsubAck(_))) => Ok(Event::UnsubAck),
                    Ok(E::Incoming(_)) => Ok(Event::Heard),
                    Ok(E::Outgoing(rumqttc::Outgoing::PingReq)) => Ok(Event::PingSent),
                    Ok(E::Outgoing(rumqttc::Outgoing::Publish(_))) => Ok(Event::Published),
                    Ok(_) => Ok(Event::Other),
                    Err(e) => Err(e.into()),
                }
            }
            Loop::V5(l) => {
                use rumqttc::v5::Event as E;
                use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason};
                match l.poll().await {
                    Ok(E::Incoming(Packet::ConnAck(c))) => {
                        let receive_max = c.properties.as_ref().and_then(|p| p.receive_max);
                        fit_inflight(l, receive_max);
                        Ok(Event::Connected {
                            session_present: c.session_present,
                            receive_max,
                        })
                    }
                    Ok(E::Incoming(Packet::Publish(p))) => Ok(Event::Message {
                        topic: String::from_utf8_lossy(&p.topic).into_owned(),
                        payload: p.payload.clone(),
                        held: (p.qos != rumqttc::v5::mqttbytes::QoS::AtMostOnce)
                            .then_some(Held::V5(p.pkid, p.qos)),
                        retained: p.retain,
                    }),
                    Ok(E::Incoming(Packet::PubAck(a))) => Ok(Event::PubAck {
                        ok: matches!(
                            a.reason,
                            PubAckReason::Success | PubAckReason::NoMatchingSubscribers
                        ),
                        reason: format!("{:?}", a.reason),
                    }),
                    Ok(E::Incoming(Packet::SubAck(a))) => Ok(Event::Subscribed {
                        refused: a
                            .return_codes
                            .iter()
                            .filter(|c| {
                                !matches!(
                                    c,
                                    rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                                )
                            })
                            .count(),
                    }),
                    Ok(E::Incoming(Packet::UnsubAck(_))) => Ok(Event::UnsubAck),
                    Ok(E::Incoming(_)) => Ok(Event::Heard),
                    Ok(E::Outgoing(rumqttc::Outgoing::PingReq)) => Ok(Event::PingSent),
                    Ok(E::Outgoing(rumqttc::Outgoing::Publish(_))) => Ok(Event::Published),
                    Ok(_) => Ok(Event::Other),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

/// rumqttc keeps a slot per packet id up to the configured in-flight limit for the
/// whole connection (~216 bytes each: 885 KB at the default 4096), while the broker's
/// Receive Maximum caps what may be in flight (20 on a stock mosquitto). At the
/// CONNACK, before anything is sent on the connection, the table is rebuilt at the
/// smaller of the two, never below a packet id still owed from the last session.
fn fit_inflight(l: &mut rumqttc::v5::EventLoop, receive_max: Option<u16>) {
    use rumqttc::v5::{MqttState, Request};
    let limit = l
        .options
        .get_outgoing_inflight_upper_limit()
        .unwrap_or(u16::MAX);
    let owed = l
        .pending
        .iter()
        .map(|r| match r {
            Request::Publish(p) => p.pkid,
            Request::PubRel(r) => r.pkid,
            _ => 0,
        })
        .chain(l.state.collision.as_ref().map(|p| p.pkid))
        .max()
        .unwrap_or(0);
    let fit = receive_max.unwrap_or(u16::MAX).min(limit).max(owed).max(1);
    let mut state = MqttState::new(fit, l.options.manual_acks());
    state.broker_topic_alias_max = l.state.broker_topic_alias_max;
    state.events = std::mem::take(&mut l.state.events);
    state.collision = l.state.collision.take();
    l.state = state;
}

#[cfg(test)]
mod tests {
    use rumqttc::v5::mqttbytes::{QoS, v5::Publish};
    use rumqttc::v5::{AsyncClient, MqttOptions, Request};

    fn publish(pkid: u16) -> Request {
        let mut p = Publish::new("t", QoS::AtLeastOnce, "x", None);
        p.pkid = pkid;
        Request::Publish(p)
    }

    #[test]
    fn the_inflight_table_fits_the_receive_maximum_and_what_is_owed() {
        let mut o = MqttOptions::new("c", "localhost", 1883);
        o.set_outgoing_inflight_upper_limit(4096);
        let (_c, mut l) = AsyncClient::new(o, 10);
        l.pending.push_back(publish(300));
        super::fit_inflight(&mut l, Some(20));
        // Packet id 300 is owed, so the table keeps it; 301 is past the table.
        assert!(l.state.handle_outgoing_packet(publish(300)).is_ok());
        assert!(l.state.handle_outgoing_packet(publish(301)).is_err());

        l.pending.clear();
        super::fit_inflight(&mut l, Some(20));
        assert!(l.state.handle_outgoing_packet(publish(20)).is_ok());
        assert!(l.state.handle_outgoing_packet(publish(21)).is_err());
        // No Receive Maximum: the configured limit.
        super::fit_inflight(&mut l, None);
        assert!(l.state.handle_outgoing_packet(publish(4096)).is_ok());
        assert!(l.state.handle_outgoing_packet(publish(4097)).is_err());
    }
}
