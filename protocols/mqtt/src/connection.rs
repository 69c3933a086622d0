//! The per-connection MQTT state machine.
//!
//! Owns everything about one connection that the protocol defines: the CONNECT handshake,
//! packet ids and the QoS 1/2 handshakes in both directions, inbound QoS 2 de-duplication,
//! receive maximum both ways, topic aliases both ways, maximum packet size both ways,
//! keep-alive and the CONNECT timeout, and closing with the right reason code. The broker
//! decides what to do with publishes and subscriptions; this type decides how they look
//! on the wire.

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::codec::DecodeError;
use crate::packet::*;
use crate::reason::ReasonCode;

/// Server-side limits and capabilities of a connection.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest packet accepted from the client, in bytes (whole packet).
    pub max_packet_size: u32,
    /// Server receive maximum: inbound QoS 1/2 publishes the client may have unacknowledged.
    pub receive_maximum: u16,
    /// Inbound topic aliases allowed (MQTT 5 Topic Alias Maximum in CONNACK).
    pub topic_alias_maximum: u16,
    /// Maximum topic levels in names and filters (0 = unlimited).
    pub max_topic_levels: usize,
    /// Keep-alive imposed on clients (MQTT 5 server keep alive); `None` keeps the client's.
    pub server_keep_alive: Option<u16>,
    /// Longest keep-alive accepted; larger (or 0 when this is set) is clamped for MQTT 5
    /// clients through server keep alive.
    pub max_keep_alive: Option<u16>,
    /// Time allowed between accepting the socket and a complete CONNECT.
    pub connect_timeout: Duration,
    /// Accept MQTT 3.1 (`MQIsdp`, level 3) clients.
    pub allow_v3_1: bool,
    /// Retained messages supported (MQTT 5 Retain Available).
    pub retain_available: bool,
    /// Use outbound topic aliases when the client allows them.
    pub outbound_topic_aliases: bool,
    /// Packet ids the connection allocates for [`Outgoing::pkid`] `None`; the broker keeps
    /// ids outside this range for itself.
    pub pkid_range: RangeInclusive<u16>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_packet_size: 2 * 1024 * 1024,
            receive_maximum: 1024,
            topic_alias_maximum: 64,
            max_topic_levels: 0,
            server_keep_alive: None,
            max_keep_alive: None,
            connect_timeout: Duration::from_secs(10),
            allow_v3_1: true,
            retain_available: true,
            outbound_topic_aliases: true,
            pkid_range: 1..=u16::MAX,
        }
    }
}

/// The broker's positive answer to [`Event::Connect`].
#[derive(Debug, Clone, Default)]
pub struct Accept {
    /// Session present flag.
    pub session_present: bool,
    /// Client id assigned by the broker (MQTT 5: sent as Assigned Client Identifier).
    pub assigned_client_id: Option<String>,
    /// Session expiry the broker grants, if different from the requested one (MQTT 5).
    pub session_expiry_interval: Option<u32>,
    /// Inbound QoS 2 packet ids of a resumed session that still await PUBREL: a PUBLISH
    /// resent with one of them is answered with PUBREC and not delivered again; a PUBREL
    /// for one of them is answered with PUBCOMP and reported as [`Event::PubRel`].
    pub inbound_qos2: Vec<u16>,
    /// Extra CONNACK properties (user properties, response information, ...); the
    /// connection fills in the limits from [`Config`] itself.
    pub properties: ConnAckProperties,
}

/// A message the broker sends to the client.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Topic name.
    pub topic: String,
    /// Payload.
    pub payload: Bytes,
    /// Delivery QoS (already min(publish, granted)).
    pub qos: QoS,
    /// RETAIN flag as it should appear to the client.
    pub retain: bool,
    /// DUP flag (set when redelivering to a resumed session).
    pub dup: bool,
    /// `Some(id)` to use that packet id (must lie outside [`Config::pkid_range`] and not be
    /// in flight); `None` to let the connection allocate one (QoS > 0).
    pub pkid: Option<u16>,
    /// MQTT 5 properties (subscription identifiers included); ignored for 3.x.
    pub properties: PublishProperties,
}

/// Why [`Connection::send_publish`] did not send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The client's receive maximum (or the packet id space) is used up; try again after
    /// an ack event.
    #[error("client receive maximum reached")]
    WindowFull,
    /// The encoded packet exceeds the client's maximum packet size: the server must not
    /// send it (MQTT 5 §3.1.2.11.4); treat it as delivered.
    #[error("packet exceeds the client's maximum packet size")]
    TooLarge,
    /// The requested packet id is already in flight.
    #[error("packet id in use")]
    PacketIdInUse,
    /// The connection is not (or no longer) established.
    #[error("connection not established")]
    NotConnected,
}

/// Why the connection closed itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Bytes could not be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// First packet was not CONNECT, or a second CONNECT arrived.
    #[error("unexpected packet: {0}")]
    Unexpected(&'static str),
    /// No complete CONNECT within the CONNECT timeout.
    #[error("no CONNECT within the timeout")]
    ConnectTimeout,
    /// Nothing received for 1.5 x keep-alive.
    #[error("keep-alive timeout")]
    KeepAliveTimeout,
    /// Client exceeded the server receive maximum.
    #[error("receive maximum exceeded")]
    ReceiveMaximumExceeded,
    /// Unknown or out-of-range topic alias.
    #[error("invalid topic alias")]
    TopicAliasInvalid,
    /// Invalid topic name in PUBLISH.
    #[error("invalid topic name")]
    TopicNameInvalid,
    /// Other protocol violation, with the reason code to report.
    #[error("protocol violation: {1}")]
    Violation(ReasonCode, &'static str),
}

impl ProtocolError {
    /// Reason code reported to an MQTT 5 client in DISCONNECT (or CONNACK before CONNECT
    /// completed).
    pub fn reason(&self) -> ReasonCode {
        match self {
            ProtocolError::Decode(e) => e.reason(),
            ProtocolError::Unexpected(_) => ReasonCode::PROTOCOL_ERROR,
            ProtocolError::ConnectTimeout => ReasonCode::MAXIMUM_CONNECT_TIME,
            ProtocolError::KeepAliveTimeout => ReasonCode::KEEP_ALIVE_TIMEOUT,
            ProtocolError::ReceiveMaximumExceeded => ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
            ProtocolError::TopicAliasInvalid => ReasonCode::TOPIC_ALIAS_INVALID,
            ProtocolError::TopicNameInvalid => ReasonCode::TOPIC_NAME_INVALID,
            ProtocolError::Violation(r, _) => *r,
        }
    }
}

/// What the connection reports to the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A valid CONNECT; answer with [`Connection::accept`] or [`Connection::refuse`].
    /// (Unsupported levels and malformed CONNECTs are refused by the connection itself.)
    Connect(Box<Connect>),
    /// A valid PUBLISH (topic alias resolved, topic validated). QoS 1/2: answer with
    /// [`Connection::ack_publish`] once handled. A QoS 2 resend of a packet id that is
    /// still pending is not reported again.
    Publish(Publish),
    /// PUBREL for an inbound QoS 2 packet id; PUBCOMP has been queued.
    PubRel {
        /// Packet id.
        pkid: u16,
    },
    /// PUBACK for an outbound QoS 1 publish: delivery complete.
    PubAck {
        /// Packet id.
        pkid: u16,
    },
    /// PUBREC for an outbound QoS 2 publish; PUBREL has been queued.
    PubRec {
        /// Packet id.
        pkid: u16,
    },
    /// PUBCOMP for an outbound QoS 2 publish: delivery complete.
    PubComp {
        /// Packet id.
        pkid: u16,
    },
    /// A SUBSCRIBE whose filters are syntactically valid or not (the broker validates the
    /// rest); answer with [`Connection::ack_subscribe`].
    Subscribe(Subscribe),
    /// An UNSUBSCRIBE; answer with [`Connection::ack_unsubscribe`].
    Unsubscribe(Unsubscribe),
    /// The client sent DISCONNECT; the connection is closed. A reason of
    /// [`ReasonCode::DISCONNECT_WITH_WILL`] asks for the will to be published.
    Disconnect(Disconnect),
    /// The connection closed itself for a protocol error or timeout; an MQTT 5 DISCONNECT
    /// (or CONNACK) with the reason code is queued for transmission when applicable.
    Error(ProtocolError),
}

/// State machine of one MQTT connection (server side).
#[derive(Debug)]
pub struct Connection {
    _private: (),
}

impl Connection {
    /// A new connection whose socket was accepted at `now`.
    pub fn new(config: Config, now: Instant) -> Self {
        let _ = (config, now);
        todo!()
    }

    /// Consumes every complete packet at the front of `buf`, leaving a partial one.
    /// Produces events and output; after an error nothing more is consumed.
    pub fn handle_input(&mut self, buf: &mut BytesMut, now: Instant) {
        let _ = (buf, now);
        todo!()
    }

    /// Next event for the broker.
    pub fn poll_event(&mut self) -> Option<Event> {
        todo!()
    }

    /// Moves pending output bytes into `out`; returns true if any were added.
    pub fn poll_transmit(&mut self, out: &mut BytesMut) -> bool {
        let _ = out;
        todo!()
    }

    /// Bytes of output waiting to be taken by [`Connection::poll_transmit`].
    pub fn pending_output(&self) -> usize {
        todo!()
    }

    /// Earliest instant at which [`Connection::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }

    /// Advances timers: CONNECT timeout, keep-alive (1.5 x).
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    /// True once the connection is finished: flush output, then close the socket.
    pub fn is_closed(&self) -> bool {
        todo!()
    }

    /// Protocol level once CONNECT was read.
    pub fn level(&self) -> Option<ProtocolLevel> {
        todo!()
    }

    /// Keep-alive in effect (after CONNECT and any server override), seconds.
    pub fn keep_alive(&self) -> u16 {
        todo!()
    }

    /// Accepts the CONNECT: queues CONNACK (success) with the server's limits.
    pub fn accept(&mut self, accept: Accept) {
        let _ = accept;
        todo!()
    }

    /// Refuses the CONNECT with `reason` (mapped to a 3.x return code) and closes.
    pub fn refuse(&mut self, reason: ReasonCode) {
        let _ = reason;
        todo!()
    }

    /// Answers an inbound QoS 1 (PUBACK) or QoS 2 (PUBREC) publish. An error reason on
    /// MQTT 3.x closes the connection instead (3.x acks carry no reason). For QoS 2 with
    /// an error reason the packet id is released at once.
    pub fn ack_publish(&mut self, pkid: u16, reason: ReasonCode) {
        let _ = (pkid, reason);
        todo!()
    }

    /// Answers a SUBSCRIBE with one reason code per filter (3.x: 0x00-0x02 or 0x80).
    pub fn ack_subscribe(&mut self, pkid: u16, reasons: Vec<ReasonCode>) {
        let _ = (pkid, reasons);
        todo!()
    }

    /// Answers an UNSUBSCRIBE (reason codes are dropped for 3.x).
    pub fn ack_unsubscribe(&mut self, pkid: u16, reasons: Vec<ReasonCode>) {
        let _ = (pkid, reasons);
        todo!()
    }

    /// Sends a PUBLISH to the client. QoS > 0 takes a slot of the client's receive maximum
    /// until [`Event::PubAck`] / [`Event::PubComp`]. Returns the packet id used (0 for QoS 0).
    pub fn send_publish(&mut self, publish: Outgoing) -> Result<u16, SendError> {
        let _ = publish;
        todo!()
    }

    /// Resends PUBREL for an outbound QoS 2 message whose PUBREC arrived on an earlier
    /// connection of the session; takes a receive-maximum slot until [`Event::PubComp`].
    pub fn send_pubrel(&mut self, pkid: u16) -> Result<(), SendError> {
        let _ = pkid;
        todo!()
    }

    /// Outbound QoS > 0 publishes that may be sent now.
    pub fn send_capacity(&self) -> usize {
        todo!()
    }

    /// Closes the connection from the server side: MQTT 5 gets DISCONNECT with `reason`
    /// (and the reason string if the client did not turn problem information off).
    pub fn disconnect(&mut self, reason: ReasonCode, reason_string: Option<&str>) {
        let _ = (reason, reason_string);
        todo!()
    }
}
