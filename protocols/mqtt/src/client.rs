//! The client side of one MQTT connection, sans-IO: what FerryMQ's bridges speak to another
//! broker (and, through an in-process pipe, to FerryMQ itself).
//!
//! ```text
//! socket bytes ─▶ Client::handle_input ─▶ poll_event() ─▶ the bridge decides
//!                                                          │
//! socket ◀─ poll_transmit() ◀─ subscribe / publish / ack / disconnect ◀┘
//! timers: poll_timeout() -> handle_timeout(now)   (keep-alive PINGREQ, PINGRESP overdue)
//! ```
//!
//! Inbound QoS 1/2 publishes are acknowledged by the caller ([`Client::ack`]) once it has
//! handed them on, so nothing is acknowledged before the next hop has it. An inbound QoS 2
//! id is remembered from the PUBLISH until PUBREL: a re-sent PUBLISH with that id is not
//! handed on twice. Outbound QoS 1/2 publishes end in [`ClientEvent::Delivered`] (PUBACK,
//! or PUBCOMP after the PUBREC/PUBREL exchange).
//!
//! With [`ClientOptions::owner_releases`] the second half of QoS 2 is the owner's too, so
//! a relay can chain it hop by hop with the same packet ids on both sides: PUBREC raises
//! [`ClientEvent::Received`] (the owner answers with [`Client::release`]), PUBREL raises
//! [`ClientEvent::Released`] (the owner answers with [`Client::complete`]), and
//! [`Client::publish_with_id`] sends under the id the previous hop used. A relay that
//! crashes then leaves both hops' sessions holding the same id, and a re-send is
//! recognised as one on the far side.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::codec::{self, DecodeError, EncodeError};
use crate::packet::{
    Connect, ConnectProperties, Disconnect, Packet, ProtocolLevel, Publish, QoS, Subscribe, SubscribeFilter, Will,
};
use crate::reason::ReasonCode;

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Protocol level of the connection.
    pub level: ProtocolLevel,
    /// Client identifier.
    pub client_id: String,
    /// Clean session (3.x) / clean start (5).
    pub clean_start: bool,
    /// Keep-alive in seconds (0: none).
    pub keep_alive: u16,
    /// User name.
    pub username: Option<String>,
    /// Password.
    pub password: Option<Bytes>,
    /// Session expiry interval (MQTT 5).
    pub session_expiry: Option<u32>,
    /// Receive Maximum announced (MQTT 5): inbound QoS 1/2 publishes unacknowledged at once.
    pub receive_maximum: u16,
    /// Largest packet accepted from the server.
    pub max_packet_size: usize,
    /// Announce a bridge (Mosquitto's `try_private`; 3.x only).
    pub bridge: bool,
    /// PUBREC and PUBREL are answered by the owner (see the module doc), not at once.
    pub owner_releases: bool,
    /// The will the server publishes if the connection ends without DISCONNECT.
    pub will: Option<Will>,
}

/// What the client tells its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// CONNACK with success.
    Connected {
        /// The server resumed a stored session.
        session_present: bool,
    },
    /// CONNACK refused the connection.
    Refused(ReasonCode),
    /// An inbound PUBLISH to hand on; QoS 1/2 wait for [`Client::ack`].
    Publish(Publish),
    /// An outbound QoS 1/2 publish completed: PUBACK, or PUBCOMP (or a failing PUBREC).
    Delivered {
        /// Its packet id.
        pkid: u16,
        /// The server's reason (an error code: the server did not take the message).
        reason: ReasonCode,
    },
    /// With [`ClientOptions::owner_releases`]: a successful PUBREC of an outbound QoS 2
    /// publish, waiting for [`Client::release`].
    Received {
        /// Its packet id.
        pkid: u16,
    },
    /// With [`ClientOptions::owner_releases`]: PUBREL of an inbound QoS 2 publish (one
    /// this connection saw or one from before a reconnect), waiting for
    /// [`Client::complete`].
    Released {
        /// Its packet id.
        pkid: u16,
    },
    /// SUBACK: one reason per filter (an error code: refused).
    SubAck {
        /// The SUBSCRIBE's packet id.
        pkid: u16,
        /// Granted QoS or error, per filter.
        reasons: Vec<ReasonCode>,
    },
    /// The server sent DISCONNECT.
    Disconnected(ReasonCode),
}

/// Why the connection cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The server's bytes did not decode.
    #[error("bad packet from the server: {0}")]
    Decode(#[from] DecodeError),
    /// A packet out of place (before CONNACK, an ack of nothing in flight, ...).
    #[error("protocol error from the server: {0}")]
    Protocol(&'static str),
    /// No PINGRESP within the keep-alive.
    #[error("the server did not answer PINGREQ")]
    KeepAliveTimeout,
    /// A packet could not be encoded (too large).
    #[error("cannot encode: {0}")]
    Encode(#[from] EncodeError),
    /// No packet id is free (65,535 in flight).
    #[error("no packet id free")]
    NoPacketId,
}

/// The ack an outbound QoS 1/2 publish waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outbound {
    /// Sent at QoS 1, waiting for PUBACK.
    Ack,
    /// Sent at QoS 2, waiting for PUBREC.
    Rec,
    /// PUBREC arrived; the owner has not released it yet.
    Received,
    /// PUBREL sent, waiting for PUBCOMP.
    Comp,
}

/// One client connection.
#[derive(Debug)]
pub struct Client {
    opts: ClientOptions,
    connected: bool,
    events: VecDeque<ClientEvent>,
    out: BytesMut,
    next_pkid: u16,
    outbound: HashMap<u16, Outbound>,
    /// Inbound QoS 1/2 publishes handed on and not yet acked, with their QoS.
    unacked: HashMap<u16, QoS>,
    /// Inbound QoS 2 ids PUBREC'd, waiting for PUBREL.
    awaiting_rel: HashSet<u16>,
    /// Server's Receive Maximum (MQTT 5; 3.x: unlimited here, the server queues).
    send_maximum: usize,
    last_sent: Instant,
    ping_sent: Option<Instant>,
}

impl Client {
    /// A client whose CONNECT is queued for transmission.
    pub fn new(opts: ClientOptions, now: Instant) -> Result<Client, ClientError> {
        let connect = Connect {
            level: opts.level,
            client_id: opts.client_id.clone(),
            clean_start: opts.clean_start,
            keep_alive: opts.keep_alive,
            username: opts.username.clone(),
            password: opts.password.clone(),
            will: opts.will.clone(),
            bridge: opts.bridge && !opts.level.is_v5(),
            properties: ConnectProperties {
                session_expiry_interval: opts.session_expiry.filter(|_| opts.level.is_v5()),
                receive_maximum: Some(opts.receive_maximum.max(1)),
                maximum_packet_size: u32::try_from(opts.max_packet_size).ok(),
                ..ConnectProperties::default()
            },
        };
        let mut c = Client {
            opts,
            connected: false,
            events: VecDeque::new(),
            out: BytesMut::new(),
            next_pkid: 0,
            outbound: HashMap::new(),
            unacked: HashMap::new(),
            awaiting_rel: HashSet::new(),
            send_maximum: usize::from(u16::MAX),
            last_sent: now,
            ping_sent: None,
        };
        c.send(&Packet::Connect(Box::new(connect)), now)?;
        Ok(c)
    }

    /// The protocol level.
    pub fn level(&self) -> ProtocolLevel {
        self.opts.level
    }

    /// CONNACK accepted the connection.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Outbound QoS 1/2 publishes that may be sent now (the server's Receive Maximum less
    /// those in flight).
    pub fn send_capacity(&self) -> usize {
        self.send_maximum.saturating_sub(self.outbound.len())
    }

    /// Outbound QoS 1/2 publishes in flight.
    pub fn in_flight(&self) -> usize {
        self.outbound.len()
    }

    /// Decodes what the server sent (consumed from the front of `buf`).
    pub fn handle_input(&mut self, buf: &mut BytesMut, now: Instant) -> Result<(), ClientError> {
        while let Some(packet) = codec::decode(buf, Some(self.opts.level), self.opts.max_packet_size)? {
            self.on_packet(packet, now)?;
        }
        Ok(())
    }

    fn on_packet(&mut self, packet: Packet, now: Instant) -> Result<(), ClientError> {
        if !self.connected && !matches!(packet, Packet::ConnAck { .. } | Packet::Disconnect(_)) {
            return Err(ClientError::Protocol("a packet before CONNACK"));
        }
        match packet {
            Packet::ConnAck { session_present, reason, properties } => {
                if self.connected {
                    return Err(ClientError::Protocol("a second CONNACK"));
                }
                if reason.is_error() {
                    self.events.push_back(ClientEvent::Refused(reason));
                } else {
                    self.connected = true;
                    if let Some(max) = properties.receive_maximum {
                        self.send_maximum = usize::from(max);
                    }
                    self.events.push_back(ClientEvent::Connected { session_present });
                }
            }
            Packet::Publish(p) => self.on_publish(p, now)?,
            Packet::PubAck { pkid, reason, .. } => match self.outbound.get(&pkid) {
                Some(Outbound::Ack) => {
                    self.outbound.remove(&pkid);
                    self.events.push_back(ClientEvent::Delivered { pkid, reason });
                }
                _ => return Err(ClientError::Protocol("PUBACK of no QoS 1 publish in flight")),
            },
            Packet::PubRec { pkid, reason, .. } => match self.outbound.get(&pkid) {
                Some(Outbound::Rec) if reason.is_error() => {
                    self.outbound.remove(&pkid);
                    self.events.push_back(ClientEvent::Delivered { pkid, reason });
                }
                Some(Outbound::Rec) if self.opts.owner_releases => {
                    self.outbound.insert(pkid, Outbound::Received);
                    self.events.push_back(ClientEvent::Received { pkid });
                }
                // A PUBREC again: the owner is still to release it.
                Some(Outbound::Received) => {}
                Some(Outbound::Rec | Outbound::Comp) => {
                    self.outbound.insert(pkid, Outbound::Comp);
                    self.send(&Packet::PubRel { pkid, reason: ReasonCode::SUCCESS }, now)?;
                }
                _ => return Err(ClientError::Protocol("PUBREC of no QoS 2 publish in flight")),
            },
            Packet::PubComp { pkid, reason } => match self.outbound.get(&pkid) {
                Some(Outbound::Comp) => {
                    self.outbound.remove(&pkid);
                    self.events.push_back(ClientEvent::Delivered { pkid, reason });
                }
                _ => return Err(ClientError::Protocol("PUBCOMP of no PUBREL sent")),
            },
            Packet::PubRel { pkid, .. } => {
                // Answered whether or not the id is known: the server may re-send PUBREL
                // after a reconnect of a session whose PUBCOMP was lost.
                self.awaiting_rel.remove(&pkid);
                if self.opts.owner_releases {
                    self.events.push_back(ClientEvent::Released { pkid });
                } else {
                    self.send(&Packet::PubComp { pkid, reason: ReasonCode::SUCCESS }, now)?;
                }
            }
            Packet::SubAck { pkid, reasons, .. } => self.events.push_back(ClientEvent::SubAck { pkid, reasons }),
            Packet::UnsubAck { .. } => {}
            Packet::PingResp => self.ping_sent = None,
            Packet::Disconnect(d) => self.events.push_back(ClientEvent::Disconnected(d.reason)),
            Packet::Connect(_)
            | Packet::Subscribe(_)
            | Packet::Unsubscribe(_)
            | Packet::PingReq
            | Packet::Auth { .. } => return Err(ClientError::Protocol("a packet only clients send")),
        }
        Ok(())
    }

    fn on_publish(&mut self, p: Publish, now: Instant) -> Result<(), ClientError> {
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => {
                if self.unacked.insert(p.pkid, QoS::AtLeastOnce).is_some() {
                    // A re-send of one not yet acked: it is handed on once.
                    return Ok(());
                }
            }
            QoS::ExactlyOnce => {
                if self.awaiting_rel.contains(&p.pkid) {
                    // Already handed on and PUBREC'd: only the PUBREC went missing.
                    return self
                        .send(&Packet::PubRec { pkid: p.pkid, reason: ReasonCode::SUCCESS, reason_string: None }, now);
                }
                if self.unacked.insert(p.pkid, QoS::ExactlyOnce).is_some() {
                    return Ok(());
                }
            }
        }
        if self.unacked.len() > usize::from(self.opts.receive_maximum.max(1)) && self.opts.level.is_v5() {
            return Err(ClientError::Protocol("more QoS 1/2 publishes than the Receive Maximum"));
        }
        self.events.push_back(ClientEvent::Publish(p));
        Ok(())
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// Moves the bytes to send into `out`; true when there were any.
    pub fn poll_transmit(&mut self, out: &mut BytesMut) -> bool {
        crate::codec::move_output(&mut self.out, out)
    }

    /// Subscribes; the SUBACK arrives as [`ClientEvent::SubAck`] with the returned id.
    pub fn subscribe(&mut self, filters: Vec<SubscribeFilter>, now: Instant) -> Result<u16, ClientError> {
        let pkid = self.take_pkid()?;
        let sub = Subscribe { pkid, filters, subscription_identifier: None, user_properties: Vec::new() };
        self.send(&Packet::Subscribe(sub), now)?;
        Ok(pkid)
    }

    /// Publishes `p` (its packet id is assigned here, `dup` cleared); returns the id (0
    /// for QoS 0). QoS 1/2 end in [`ClientEvent::Delivered`].
    pub fn publish(&mut self, mut p: Publish, now: Instant) -> Result<u16, ClientError> {
        p.dup = false;
        p.pkid = match p.qos {
            QoS::AtMostOnce => 0,
            _ => self.take_pkid()?,
        };
        self.send_publish(p, now)
    }

    /// Publishes `p` under its own packet id and DUP flag (a relay passing on the id the
    /// previous hop used); fails when a QoS 1/2 id is 0 or already in flight.
    pub fn publish_with_id(&mut self, p: Publish, now: Instant) -> Result<u16, ClientError> {
        if p.qos != QoS::AtMostOnce && (p.pkid == 0 || self.outbound.contains_key(&p.pkid)) {
            return Err(ClientError::Protocol("a packet id already in flight"));
        }
        self.send_publish(p, now)
    }

    fn send_publish(&mut self, p: Publish, now: Instant) -> Result<u16, ClientError> {
        let (pkid, awaits) = match p.qos {
            QoS::AtMostOnce => (0, None),
            QoS::AtLeastOnce => (p.pkid, Some(Outbound::Ack)),
            QoS::ExactlyOnce => (p.pkid, Some(Outbound::Rec)),
        };
        // A 3.x connection carries no properties; the codec leaves them out.
        self.send(&Packet::Publish(p), now)?;
        if let Some(awaits) = awaits {
            self.outbound.insert(pkid, awaits);
        }
        Ok(pkid)
    }

    /// Acknowledges the inbound QoS 1/2 publish `pkid` (PUBACK, or PUBREC for QoS 2);
    /// unknown ids are ignored.
    pub fn ack(&mut self, pkid: u16, now: Instant) -> Result<(), ClientError> {
        match self.unacked.remove(&pkid) {
            Some(QoS::AtLeastOnce) => {
                self.send(&Packet::PubAck { pkid, reason: ReasonCode::SUCCESS, reason_string: None }, now)
            }
            Some(QoS::ExactlyOnce) => {
                self.awaiting_rel.insert(pkid);
                self.send(&Packet::PubRec { pkid, reason: ReasonCode::SUCCESS, reason_string: None }, now)
            }
            _ => Ok(()),
        }
    }

    /// Sends PUBREL for the outbound QoS 2 publish `pkid` ([`ClientEvent::Received`], or
    /// one from before a reconnect); it ends in [`ClientEvent::Delivered`] at PUBCOMP.
    pub fn release(&mut self, pkid: u16, now: Instant) -> Result<(), ClientError> {
        if matches!(self.outbound.get(&pkid), Some(Outbound::Ack | Outbound::Rec)) {
            return Err(ClientError::Protocol("PUBREL for a packet id in flight otherwise"));
        }
        self.outbound.insert(pkid, Outbound::Comp);
        self.send(&Packet::PubRel { pkid, reason: ReasonCode::SUCCESS }, now)
    }

    /// Sends PUBCOMP for the inbound QoS 2 publish `pkid` ([`ClientEvent::Released`]).
    pub fn complete(&mut self, pkid: u16, now: Instant) -> Result<(), ClientError> {
        self.send(&Packet::PubComp { pkid, reason: ReasonCode::SUCCESS }, now)
    }

    /// Queues DISCONNECT (normal disconnection: a will is not published).
    pub fn disconnect(&mut self, now: Instant) {
        let d = Disconnect {
            reason: ReasonCode::SUCCESS,
            session_expiry_interval: None,
            reason_string: None,
            server_reference: None,
        };
        let _ = self.send(&Packet::Disconnect(d), now);
    }

    /// When [`Client::handle_timeout`] wants to run: the next PINGREQ, or the deadline of
    /// the one outstanding.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let keep_alive = self.keep_alive()?;
        Some(match self.ping_sent {
            Some(sent) => sent + keep_alive,
            None => self.last_sent + keep_alive,
        })
    }

    /// Sends PINGREQ when the connection was quiet for the keep-alive; fails when the last
    /// one went unanswered as long.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ClientError> {
        let Some(keep_alive) = self.keep_alive() else { return Ok(()) };
        match self.ping_sent {
            Some(sent) if now >= sent + keep_alive => Err(ClientError::KeepAliveTimeout),
            None if self.connected && now >= self.last_sent + keep_alive => {
                self.send(&Packet::PingReq, now)?;
                self.ping_sent = Some(now);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn keep_alive(&self) -> Option<Duration> {
        (self.opts.keep_alive > 0).then(|| Duration::from_secs(u64::from(self.opts.keep_alive)))
    }

    fn take_pkid(&mut self) -> Result<u16, ClientError> {
        for _ in 0..u16::MAX {
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            if !self.outbound.contains_key(&self.next_pkid) {
                return Ok(self.next_pkid);
            }
        }
        Err(ClientError::NoPacketId)
    }

    fn send(&mut self, packet: &Packet, now: Instant) -> Result<(), ClientError> {
        codec::encode(packet, self.opts.level, &mut self.out)?;
        self.last_sent = now;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
