//! The per-connection MQTT state machine.
//!
//! Owns everything about one connection that the protocol defines: the CONNECT handshake,
//! packet ids and the QoS 1/2 handshakes in both directions, inbound QoS 2 de-duplication,
//! receive maximum both ways, topic aliases both ways, maximum packet size both ways,
//! keep-alive and the CONNECT timeout, and closing with the right reason code. The broker
//! decides what to do with publishes and subscriptions; this type decides how they look
//! on the wire.

mod alias;
pub mod idmap;
mod inbound;
mod outbound;
mod receive;

use std::collections::VecDeque;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use self::alias::{InboundAliases, OutboundAliases};
use self::idmap::IdMap;
use self::inbound::InState;
use self::outbound::{OutState, Outbound};
use crate::codec::{self, DecodeError};
use crate::packet::*;
use crate::reason::ReasonCode;

/// QoS 2 resends an MQTT 5 client may make on one connection beyond one per packet id
/// restored at CONNECT, before it is closed with 0x82 Protocol error.
pub const QOS2_RESEND_SLACK: u32 = 16;

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
    /// Most outbound QoS 1/2 publishes in flight, whatever the client's receive maximum
    /// allows (the smaller of the two applies).
    pub max_inflight: u16,
    /// The PUBREL answering a PUBREC waits for [`Connection::release`] (the broker sends
    /// it once what the PUBREC changes is durable), instead of going at once.
    pub release_when_told: bool,
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
            max_inflight: u16::MAX,
            release_when_told: false,
        }
    }
}

/// The broker's positive answer to [`Event::Connect`].
#[derive(Debug, Clone, Default)]
pub struct Accept {
    /// CONNACK Session Present: true when the broker resumed a stored session.
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
    /// Full topic name; on MQTT 5 the connection may send an outbound topic alias instead.
    pub topic: String,
    /// Application payload, sent unchanged.
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
    /// still pending is not reported again. The topic alias property is cleared once
    /// resolved, so the publish can be forwarded as is.
    Publish(Publish),
    /// PUBREL for an inbound QoS 2 packet id; PUBCOMP has been queued.
    PubRel {
        /// Packet Identifier of the inbound QoS 2 publish now released.
        pkid: u16,
    },
    /// PUBACK for an outbound QoS 1 publish: delivery complete.
    PubAck {
        /// Packet Identifier of the publish; its receive-maximum slot is free again.
        pkid: u16,
    },
    /// PUBREC for an outbound QoS 2 publish; PUBREL has been queued.
    PubRec {
        /// Packet Identifier of the QoS 2 publish; it stays in flight until PUBCOMP.
        pkid: u16,
    },
    /// PUBCOMP for an outbound QoS 2 publish: delivery complete.
    PubComp {
        /// Packet Identifier of the QoS 2 publish; its receive-maximum slot is free again.
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

/// Lifecycle of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for a complete CONNECT.
    AwaitConnect,
    /// CONNECT reported, waiting for [`Connection::accept`] / [`Connection::refuse`];
    /// further input is held, not decoded.
    AwaitAccept,
    /// CONNACK (success) sent.
    Connected,
    /// Finished ([`Connection::is_closed`]): nothing more is consumed or produced.
    Closed,
}

/// What the client announced about itself in CONNECT.
#[derive(Debug, Clone)]
struct Peer {
    /// Client receive maximum (3.x: the packet id space).
    receive_maximum: u16,
    /// Client maximum packet size (MQTT 5).
    maximum_packet_size: Option<u32>,
    /// Reason strings / user properties allowed on packets other than PUBLISH, CONNACK
    /// and DISCONNECT.
    problem_information: bool,
    /// Session expiry interval in CONNECT (absent: 0).
    session_expiry: u32,
    /// Keep alive in CONNECT, seconds.
    keep_alive: u16,
}

/// State machine of one MQTT connection (server side).
///
/// Between [`Event::Connect`] and [`Connection::accept`] / [`Connection::refuse`], bytes
/// given to [`Connection::handle_input`] are held (up to [`Config::max_packet_size`] plus
/// what one call brings) and decoded by `accept`, so pipelined packets are reported only
/// after the broker accepted the client and their answers follow CONNACK.
#[derive(Debug)]
pub struct Connection {
    config: Arc<Config>,
    state: State,
    level: Option<ProtocolLevel>,
    keep_alive: u16,
    /// Server keep alive to announce in CONNACK (MQTT 5).
    server_keep_alive: Option<u16>,
    connect_deadline: Instant,
    last_recv: Instant,
    /// The keep-alive clock restarts at the next call that brings a time after accept.
    rearm_keep_alive: bool,
    /// Length of the partial packet left in the caller's buffer by the last call.
    left_len: usize,
    held: BytesMut,
    events: VecDeque<Event>,
    out: BytesMut,
    peer: Peer,
    /// Highest QoS the client may publish with (MQTT 5 Maximum QoS in CONNACK).
    max_qos: u8,
    /// Retained publishes allowed from the client.
    retain_available: bool,
    inbound: IdMap<InState>,
    /// QoS 2 PUBLISHes received again for an id awaiting PUBREL, and how many of those
    /// this connection may get (MQTT 5 allows a resend only after a reconnect: once per
    /// id restored at CONNECT, plus [`QOS2_RESEND_SLACK`]).
    qos2_resends: u32,
    qos2_resends_allowed: u32,
    /// Boxed, made when the client first sets an alias (most never do).
    in_aliases: Option<Box<InboundAliases>>,
    outbound: Outbound,
    /// Boxed, made at CONNECT when the client allows aliases.
    out_aliases: Option<Box<OutboundAliases>>,
}

impl Connection {
    /// A new connection whose socket was accepted at `now`. Connections of one listener
    /// can share their `config` (an `Arc`).
    pub fn new(config: impl Into<Arc<Config>>, now: Instant) -> Self {
        let config = config.into();
        let outbound = Outbound::new(&config.pkid_range);
        Connection {
            connect_deadline: now + config.connect_timeout,
            retain_available: config.retain_available,
            config,
            state: State::AwaitConnect,
            level: None,
            keep_alive: 0,
            server_keep_alive: None,
            last_recv: now,
            rearm_keep_alive: false,
            left_len: 0,
            held: BytesMut::new(),
            events: VecDeque::new(),
            out: BytesMut::new(),
            peer: Peer {
                receive_maximum: u16::MAX,
                maximum_packet_size: None,
                problem_information: true,
                session_expiry: 0,
                keep_alive: 0,
            },
            max_qos: 2,
            inbound: IdMap::default(),
            qos2_resends: 0,
            qos2_resends_allowed: QOS2_RESEND_SLACK,
            in_aliases: None,
            outbound,
            out_aliases: None,
        }
    }

    /// Consumes every complete packet at the front of `buf`, leaving a partial one.
    /// Produces events and output; after an error nothing more is consumed.
    pub fn handle_input(&mut self, buf: &mut BytesMut, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        if buf.len() > self.left_len || self.rearm_keep_alive {
            self.last_recv = now;
            self.rearm_keep_alive = false;
        }
        if !self.held.is_empty() {
            self.held.extend_from_slice(buf);
            buf.clear();
            std::mem::swap(buf, &mut self.held);
        }
        self.process(buf);
        if self.state == State::AwaitAccept && !buf.is_empty() {
            let cap = self.config.max_packet_size as usize;
            if self.held.is_empty() {
                std::mem::swap(buf, &mut self.held);
            } else if self.held.len() < cap {
                self.held.extend_from_slice(buf);
                buf.clear();
            }
        }
        self.left_len = buf.len();
    }

    /// Next event for the broker.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Moves pending output bytes into `out`; returns true if any were added.
    pub fn poll_transmit(&mut self, out: &mut BytesMut) -> bool {
        crate::codec::move_output(&mut self.out, out)
    }

    /// Gives back the memory of emptied internal buffers (call when the connection is
    /// quiet: the next packet allocates them again).
    pub fn release_idle_memory(&mut self) {
        if self.events.is_empty() {
            self.events = VecDeque::new();
        }
        if self.held.is_empty() {
            self.held = BytesMut::new();
        }
        if self.out.is_empty() {
            self.out = BytesMut::new();
        }
    }

    /// Bytes of output waiting to be taken by [`Connection::poll_transmit`].
    pub fn pending_output(&self) -> usize {
        self.out.len()
    }

    /// Earliest instant at which [`Connection::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitConnect => Some(self.connect_deadline),
            State::Connected if self.keep_alive > 0 => Some(self.keep_alive_deadline()),
            _ => None,
        }
    }

    fn keep_alive_deadline(&self) -> Instant {
        self.last_recv + Duration::from_millis(u64::from(self.keep_alive) * 1500)
    }

    /// Restarts the keep-alive clock from `now`: for a server that stopped reading the
    /// socket (flow control), whose silence was its own doing.
    pub fn restart_keep_alive(&mut self, now: Instant) {
        self.last_recv = now;
    }

    /// Advances timers: CONNECT timeout, keep-alive (1.5 x).
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::AwaitConnect if now >= self.connect_deadline => {
                self.fail(ProtocolError::ConnectTimeout);
            }
            // The keep-alive clock runs from the last packet received (CONNECT at the
            // latest): a timer firing is not traffic from the client.
            State::Connected if self.keep_alive > 0 && now >= self.keep_alive_deadline() => {
                self.fail(ProtocolError::KeepAliveTimeout);
            }
            _ => {}
        }
    }

    /// True once the connection is finished: flush output, then close the socket.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Protocol level once CONNECT was read.
    pub fn level(&self) -> Option<ProtocolLevel> {
        self.level
    }

    /// Keep-alive in effect (after CONNECT and any server override), seconds.
    pub fn keep_alive(&self) -> u16 {
        self.keep_alive
    }

    fn is_v5(&self) -> bool {
        self.level == Some(ProtocolLevel::V5)
    }

    /// Accepts the CONNECT: queues CONNACK (success) with the server's limits.
    ///
    /// MQTT 5: receive maximum, maximum packet size, topic alias maximum and server keep
    /// alive come from [`Config`] (a server keep alive in `accept.properties` replaces
    /// the configured one and becomes the keep-alive in effect); retain available is
    /// false if either the config or `accept.properties` says so; wildcard, subscription
    /// identifier and shared subscriptions default to available; every other property is
    /// taken from `accept.properties`. Does nothing unless a CONNECT awaits an answer.
    pub fn accept(&mut self, accept: Accept) {
        if self.state != State::AwaitAccept {
            return;
        }
        let packet = if self.is_v5() {
            let mut p = accept.properties;
            p.receive_maximum = Some(self.config.receive_maximum.max(1));
            p.maximum_packet_size = Some(self.config.max_packet_size.max(1));
            p.topic_alias_maximum = Some(self.config.topic_alias_maximum);
            let retain = self.config.retain_available && p.retain_available.unwrap_or(true);
            p.retain_available = Some(retain);
            p.wildcard_subscription_available.get_or_insert(true);
            p.subscription_identifiers_available.get_or_insert(true);
            p.shared_subscription_available.get_or_insert(true);
            match p.server_keep_alive {
                Some(k) => self.keep_alive = k,
                None => p.server_keep_alive = self.server_keep_alive,
            }
            if accept.assigned_client_id.is_some() {
                p.assigned_client_identifier = accept.assigned_client_id;
            }
            if accept.session_expiry_interval.is_some() {
                p.session_expiry_interval = accept.session_expiry_interval;
            }
            self.max_qos = p.maximum_qos.unwrap_or(2);
            self.retain_available = retain;
            let mut packet = Packet::ConnAck {
                session_present: accept.session_present,
                reason: ReasonCode::SUCCESS,
                properties: Box::new(p),
            };
            // MQTT-3.2.0-1: the CONNACK comes first, so it must fit the client's Maximum
            // Packet Size: optional properties go until it does; if it cannot, the client
            // is refused with 0x95 Packet too large (sent if even that fits).
            if let Some(max) = self.peer.maximum_packet_size {
                if !shrink_connack_to(&mut packet, max as usize, &self.peer) {
                    self.refuse(ReasonCode::PACKET_TOO_LARGE);
                    return;
                }
            }
            packet
        } else {
            Packet::ConnAck {
                session_present: accept.session_present,
                reason: ReasonCode::SUCCESS,
                properties: Box::default(),
            }
        };
        self.queue(packet);
        self.qos2_resends_allowed = QOS2_RESEND_SLACK.saturating_add(accept.inbound_qos2.len() as u32);
        for id in accept.inbound_qos2 {
            if id != 0 {
                self.inbound.insert(id, InState::Qos2Answered);
            }
        }
        self.state = State::Connected;
        self.rearm_keep_alive = true;
        let mut held = std::mem::take(&mut self.held);
        self.process(&mut held);
        if self.state != State::Closed && !held.is_empty() {
            self.held = held;
        }
        self.left_len = 0;
    }

    /// Refuses the CONNECT with `reason` (mapped to a 3.x return code) and closes.
    /// A success code is replaced by Unspecified error (0x80).
    pub fn refuse(&mut self, reason: ReasonCode) {
        if self.state != State::AwaitAccept {
            return;
        }
        let reason = if reason.is_error() { reason } else { ReasonCode::UNSPECIFIED_ERROR };
        self.queue(Packet::ConnAck { session_present: false, reason, properties: Box::default() });
        self.close();
    }

    /// Answers an inbound QoS 1 (PUBACK) or QoS 2 (PUBREC) publish. An error reason on
    /// MQTT 3.x closes the connection instead (3.x acks carry no reason). For QoS 2 with
    /// an error reason the packet id is released at once. Unknown or already answered
    /// packet ids are ignored.
    pub fn ack_publish(&mut self, pkid: u16, reason: ReasonCode) {
        if self.state != State::Connected {
            return;
        }
        let Some(state) = self.inbound.get(&pkid).copied() else {
            return;
        };
        if state == InState::Qos2Answered {
            return;
        }
        if reason.is_error() && !self.is_v5() {
            self.inbound.remove(&pkid);
            self.close();
            return;
        }
        let packet = if state == InState::Qos1 {
            self.inbound.remove(&pkid);
            Packet::PubAck { pkid, reason, reason_string: None }
        } else {
            if reason.is_error() {
                self.inbound.remove(&pkid);
            } else {
                self.inbound.insert(pkid, InState::Qos2Answered);
            }
            Packet::PubRec { pkid, reason, reason_string: None }
        };
        self.queue(packet);
    }

    /// Answers a SUBSCRIBE with one reason code per filter (3.x: 0x00-0x02 or 0x80).
    pub fn ack_subscribe(&mut self, pkid: u16, reasons: Vec<ReasonCode>) {
        if self.state == State::Connected {
            self.queue(Packet::SubAck { pkid, reasons, reason_string: None });
        }
    }

    /// Answers an UNSUBSCRIBE (reason codes are dropped for 3.x).
    pub fn ack_unsubscribe(&mut self, pkid: u16, reasons: Vec<ReasonCode>) {
        if self.state == State::Connected {
            self.queue(Packet::UnsubAck { pkid, reasons, reason_string: None });
        }
    }

    /// Outbound in-flight limit: the client's receive maximum (3.x: the id space).
    fn send_window(&self) -> usize {
        usize::from(self.peer.receive_maximum.min(self.config.max_inflight.max(1)))
    }

    /// Sends a PUBLISH to the client. QoS > 0 takes a slot of the client's receive maximum
    /// until [`Event::PubAck`] / [`Event::PubComp`]. Returns the packet id used (0 for QoS 0).
    ///
    /// `Outgoing::pkid` of `Some(0)` is treated as `None`. Outbound topic aliases are
    /// managed here (any alias in `publish.properties` is replaced).
    pub fn send_publish(&mut self, publish: Outgoing) -> Result<u16, SendError> {
        if self.state != State::Connected {
            return Err(SendError::NotConnected);
        }
        let Some(level) = self.level else {
            return Err(SendError::NotConnected);
        };
        let pkid = if publish.qos == QoS::AtMostOnce {
            0
        } else {
            if self.outbound.len() >= self.send_window() {
                return Err(SendError::WindowFull);
            }
            match publish.pkid {
                Some(id) if id != 0 => {
                    if self.outbound.contains(id) {
                        return Err(SendError::PacketIdInUse);
                    }
                    id
                }
                _ => self.outbound.allocate().ok_or(SendError::WindowFull)?,
            }
        };
        let mut properties = if level.is_v5() { publish.properties } else { PublishProperties::default() };
        properties.topic_alias = None;
        let mut topic = publish.topic;
        let mut new_alias = None;
        if let Some(aliases) = self.out_aliases.as_deref().filter(|a| level.is_v5() && a.enabled()) {
            if let Some(a) = aliases.lookup(&topic) {
                properties.topic_alias = Some(a);
                topic = String::new();
            } else if let Some(a) = aliases.next_free() {
                properties.topic_alias = Some(a);
                new_alias = Some(a);
            }
        }
        let packet = Packet::Publish(Publish {
            dup: publish.dup,
            qos: publish.qos,
            retain: publish.retain,
            topic,
            pkid,
            payload: publish.payload,
            properties,
        });
        if let Some(max) = self.peer.maximum_packet_size {
            let len = codec::encoded_len(&packet, level).map_err(|_| SendError::TooLarge)?;
            if len > max as usize {
                return Err(SendError::TooLarge);
            }
        }
        codec::encode(&packet, level, &mut self.out).map_err(|_| SendError::TooLarge)?;
        if let (Some(a), Packet::Publish(p), Some(aliases)) = (new_alias, packet, self.out_aliases.as_mut()) {
            aliases.insert(p.topic, a);
        }
        match publish.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.outbound.set(pkid, OutState::Ack),
            QoS::ExactlyOnce => self.outbound.set(pkid, OutState::Rec),
        }
        Ok(pkid)
    }

    /// Sends the PUBREL of an outbound QoS 2 message whose PUBREC arrived on this
    /// connection ([`Config::release_when_told`]); other ids are ignored.
    pub fn release(&mut self, pkid: u16) {
        if self.state == State::Connected && self.outbound.get(pkid) == Some(OutState::Received) {
            self.outbound.set(pkid, OutState::Comp);
            self.queue(Packet::PubRel { pkid, reason: ReasonCode::SUCCESS });
        }
    }

    /// Resends PUBREL for an outbound QoS 2 message whose PUBREC arrived on an earlier
    /// connection of the session; takes a receive-maximum slot until [`Event::PubComp`].
    /// Packet id 0 is refused as [`SendError::PacketIdInUse`].
    pub fn send_pubrel(&mut self, pkid: u16) -> Result<(), SendError> {
        if self.state != State::Connected {
            return Err(SendError::NotConnected);
        }
        if pkid == 0 || self.outbound.contains(pkid) {
            return Err(SendError::PacketIdInUse);
        }
        if self.outbound.len() >= self.send_window() {
            return Err(SendError::WindowFull);
        }
        self.outbound.set(pkid, OutState::Comp);
        self.queue(Packet::PubRel { pkid, reason: ReasonCode::SUCCESS });
        Ok(())
    }

    /// Outbound QoS > 0 publishes that may be sent now.
    pub fn send_capacity(&self) -> usize {
        if self.state != State::Connected {
            return 0;
        }
        self.send_window().saturating_sub(self.outbound.len()).min(self.outbound.free_ids())
    }

    /// Closes the connection from the server side: MQTT 5 gets DISCONNECT with `reason`
    /// (and the reason string if the client did not turn problem information off).
    /// Before CONNACK this is [`Connection::refuse`].
    pub fn disconnect(&mut self, reason: ReasonCode, reason_string: Option<&str>) {
        match self.state {
            State::Closed => {}
            State::AwaitConnect => self.close(),
            State::AwaitAccept => self.refuse(reason),
            State::Connected => {
                if self.is_v5() {
                    let reason_string = reason_string.filter(|_| self.peer.problem_information).map(str::to_owned);
                    self.queue(Packet::Disconnect(Disconnect {
                        reason,
                        session_expiry_interval: None,
                        reason_string,
                        server_reference: None,
                    }));
                }
                self.close();
            }
        }
    }

    /// Marks the connection closed; nothing more is consumed or produced.
    fn close(&mut self) {
        self.state = State::Closed;
        self.held = BytesMut::new();
    }

    /// Closes for a protocol error: MQTT 5 gets CONNACK (before CONNACK was sent) or
    /// DISCONNECT with the reason code; the broker gets [`Event::Error`].
    fn fail(&mut self, err: ProtocolError) {
        if self.state == State::Closed {
            return;
        }
        if self.is_v5() {
            let reason = err.reason();
            match self.state {
                State::AwaitAccept => {
                    self.queue(Packet::ConnAck { session_present: false, reason, properties: Box::default() })
                }
                State::Connected => self.queue(Packet::Disconnect(Disconnect {
                    reason,
                    session_expiry_interval: None,
                    reason_string: None,
                    server_reference: None,
                })),
                _ => {}
            }
        }
        self.events.push_back(Event::Error(err));
        self.close();
    }

    /// Encodes `packet` into the output at the connection's level, honouring Request
    /// Problem Information and the client's Maximum Packet Size (reason strings and user
    /// properties are dropped first; a packet still too large is not sent).
    fn queue(&mut self, mut packet: Packet) {
        let Some(level) = self.level else {
            return;
        };
        if level.is_v5() {
            if !self.peer.problem_information {
                strip_problem_info(&mut packet, false);
            }
            if let Some(max) = self.peer.maximum_packet_size {
                let fits = |p: &Packet| codec::encoded_len(p, level).is_ok_and(|n| n <= max as usize);
                if !fits(&packet) {
                    strip_problem_info(&mut packet, true);
                    if !fits(&packet) {
                        return;
                    }
                }
            }
        }
        // Only `TooLarge` can fail here, for packets the broker built oversized: drop.
        let _ = codec::encode(&packet, level, &mut self.out);
    }
}

/// Drops a 5.0 CONNACK's optional properties, least needed first, until it encodes in
/// `max` bytes: the problem information and the properties that carry no information
/// (they restate a default or what the client's CONNECT said), then the limits a client
/// may do without (topic aliases are then not used; the broker still enforces its packet
/// size and receive maximum, with the reason codes the client would see), then the
/// assigned client identifier. False when even the bare CONNACK is larger.
fn shrink_connack_to(packet: &mut Packet, max: usize, peer: &Peer) -> bool {
    let fits = |p: &Packet| codec::encoded_len(p, ProtocolLevel::V5).is_ok_and(|n| n <= max);
    if fits(packet) {
        return true;
    }
    strip_problem_info(packet, true);
    if let Packet::ConnAck { properties, .. } = packet {
        drop_restated(properties, peer);
    }
    let steps: [fn(&mut ConnAckProperties); 6] = [
        |p| p.response_information = None,
        |p| p.server_reference = None,
        |p| p.topic_alias_maximum = None,
        |p| p.maximum_packet_size = None,
        |p| p.receive_maximum = None,
        |p| p.assigned_client_identifier = None,
    ];
    for step in steps {
        if fits(packet) {
            return true;
        }
        if let Packet::ConnAck { properties, .. } = packet {
            step(properties);
        }
    }
    fits(packet)
}

/// Removes the CONNACK properties whose absence means the same (MQTT 5 §3.2.2.3): a
/// session expiry or keep alive equal to the client's own, a receive maximum of 65,535,
/// a topic alias maximum of 0.
fn drop_restated(p: &mut ConnAckProperties, peer: &Peer) {
    if p.session_expiry_interval == Some(peer.session_expiry) {
        p.session_expiry_interval = None;
    }
    if p.server_keep_alive == Some(peer.keep_alive) {
        p.server_keep_alive = None;
    }
    if p.receive_maximum == Some(u16::MAX) {
        p.receive_maximum = None;
    }
    if p.topic_alias_maximum == Some(0) {
        p.topic_alias_maximum = None;
    }
}

/// Removes reason strings and user properties from a packet the server sends; CONNACK
/// and DISCONNECT keep theirs unless `all` (which also drops CONNACK properties whose
/// value is the default).
fn strip_problem_info(packet: &mut Packet, all: bool) {
    match packet {
        Packet::PubAck { reason_string, .. }
        | Packet::PubRec { reason_string, .. }
        | Packet::SubAck { reason_string, .. }
        | Packet::UnsubAck { reason_string, .. } => *reason_string = None,
        Packet::ConnAck { properties, .. } if all => {
            properties.reason_string = None;
            properties.user_properties.clear();
            // Absent means available: these can go without changing their meaning.
            for flag in [
                &mut properties.retain_available,
                &mut properties.wildcard_subscription_available,
                &mut properties.subscription_identifiers_available,
                &mut properties.shared_subscription_available,
            ] {
                if *flag == Some(true) {
                    *flag = None;
                }
            }
        }
        Packet::Disconnect(d) if all => d.reason_string = None,
        _ => {}
    }
}

#[cfg(test)]
mod tests;
