//! Decoding client bytes and reacting to each packet: the CONNECT handshake, inbound
//! publishes (aliases, receive maximum, QoS 2 de-duplication) and acks of our publishes.

use bytes::BytesMut;

use super::inbound::InState;
use super::outbound::OutState;
use super::{Connection, Event, Peer, ProtocolError, State};
use crate::codec::{self, DecodeError};
use crate::packet::*;
use crate::reason::ReasonCode;
use crate::topic;

/// How to answer a CONNECT that cannot be accepted, judged from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectFraming {
    /// Protocol name `MQTT` with level 5: MQTT 5 CONNACK.
    V5,
    /// `MQTT` or `MQIsdp` with any other level: MQTT 3.x CONNACK (an unknown level gets
    /// return code 0x01 in the 3.x format, as Mosquitto answers).
    V3,
    /// Unknown protocol name or not enough bytes: close without answer.
    Unknown,
}

fn framing(buf: &[u8]) -> ConnectFraming {
    match codec::peek_connect_protocol(buf) {
        Some((b"MQTT", 5)) => ConnectFraming::V5,
        Some((b"MQTT" | b"MQIsdp", _)) => ConnectFraming::V3,
        _ => ConnectFraming::Unknown,
    }
}

impl Connection {
    /// Decodes and handles packets while the state allows.
    pub(super) fn process(&mut self, buf: &mut BytesMut) {
        loop {
            match self.state {
                State::AwaitConnect => {
                    let Some(&first) = buf.first() else {
                        return;
                    };
                    if first >> 4 != 1 {
                        self.fail(ProtocolError::Unexpected("first packet was not CONNECT"));
                        return;
                    }
                    let framing = framing(buf);
                    match codec::decode(buf, None, self.config.max_packet_size as usize) {
                        Ok(None) => return,
                        Ok(Some(Packet::Connect(c))) => self.on_connect(c),
                        Ok(Some(_)) => self.fail(ProtocolError::Unexpected("first packet was not CONNECT")),
                        Err(e) => self.refuse_connect(e, framing),
                    }
                }
                State::Connected => match codec::decode(buf, self.level, self.config.max_packet_size as usize) {
                    Ok(None) => return,
                    Ok(Some(p)) => self.on_packet(p),
                    Err(e) => self.fail(ProtocolError::Decode(e)),
                },
                State::AwaitAccept | State::Closed => return,
            }
        }
    }

    /// Answers a CONNECT that could not be decoded (or is not allowed) and closes.
    fn refuse_connect(&mut self, err: DecodeError, framing: ConnectFraming) {
        let (level, reason) = match (framing, &err) {
            (ConnectFraming::V5, e) => (Some(ProtocolLevel::V5), e.reason()),
            (ConnectFraming::V3, DecodeError::UnsupportedProtocol) => {
                (Some(ProtocolLevel::V3_1_1), ReasonCode::UNSUPPORTED_PROTOCOL_VERSION)
            }
            _ => (None, ReasonCode::UNSPECIFIED_ERROR),
        };
        if let Some(level) = level {
            let connack = Packet::ConnAck { session_present: false, reason, properties: Box::default() };
            let _ = codec::encode(&connack, level, &mut self.out);
        }
        self.events.push_back(Event::Error(ProtocolError::Decode(err)));
        self.close();
    }

    fn on_connect(&mut self, c: Box<Connect>) {
        if c.level == ProtocolLevel::V3_1 && !self.config.allow_v3_1 {
            self.refuse_connect(DecodeError::UnsupportedProtocol, ConnectFraming::V3);
            return;
        }
        self.level = Some(c.level);
        if !c.level.is_v5() && c.client_id.is_empty() && (!c.clean_start || c.level == ProtocolLevel::V3_1) {
            // MQTT-3.1.3-8 (3.1.1), and 3.1 requires a client id: identifier rejected.
            self.state = State::AwaitAccept;
            self.fail_connack(ProtocolError::Violation(
                ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
                "empty client id needs a clean session",
            ));
            return;
        }
        if c.level.is_v5() {
            let p = &c.properties;
            self.peer = Peer {
                receive_maximum: p.receive_maximum.unwrap_or(u16::MAX),
                maximum_packet_size: p.maximum_packet_size,
                problem_information: p.request_problem_information != Some(0),
                session_expiry: p.session_expiry_interval.unwrap_or(0),
                keep_alive: c.keep_alive,
            };
            let max = p.topic_alias_maximum.unwrap_or(0);
            if self.config.outbound_topic_aliases && max > 0 {
                self.out_aliases = Some(Box::new(super::OutboundAliases::new(max)));
            }
            self.keep_alive = c.keep_alive;
            if let Some(k) = self.config.server_keep_alive {
                self.keep_alive = k;
                self.server_keep_alive = Some(k);
            } else if let Some(m) = self.config.max_keep_alive {
                if c.keep_alive == 0 || c.keep_alive > m {
                    self.keep_alive = m;
                    self.server_keep_alive = Some(m);
                }
            }
        } else {
            self.keep_alive = c.keep_alive;
        }
        self.state = State::AwaitAccept;
        self.events.push_back(Event::Connect(c));
    }

    /// Refuses a decoded CONNECT with a CONNACK carrying the error's reason code.
    fn fail_connack(&mut self, err: ProtocolError) {
        self.queue(Packet::ConnAck { session_present: false, reason: err.reason(), properties: Box::default() });
        self.events.push_back(Event::Error(err));
        self.close();
    }

    fn on_packet(&mut self, packet: Packet) {
        match packet {
            Packet::Publish(p) => self.on_publish(p),
            // An acknowledgement of the wrong kind for the packet id's QoS (PUBACK for a
            // QoS 2 delivery, PUBREC or PUBCOMP for a QoS 1 one) is a protocol violation,
            // as Mosquitto treats it; an unknown id is a stale ack and ignored.
            Packet::PubAck { pkid, .. } => match self.outbound.get(pkid) {
                Some(OutState::Ack) => {
                    self.outbound.remove(pkid);
                    self.events.push_back(Event::PubAck { pkid });
                }
                Some(OutState::Rec | OutState::Received | OutState::Comp) => {
                    self.wrong_ack("PUBACK for a QoS 2 message")
                }
                None => {}
            },
            Packet::PubRec { pkid, reason, .. } => self.on_pubrec(pkid, reason),
            Packet::PubRel { pkid, .. } => self.on_pubrel(pkid),
            Packet::PubComp { pkid, .. } => match self.outbound.get(pkid) {
                Some(OutState::Comp) => {
                    self.outbound.remove(pkid);
                    self.events.push_back(Event::PubComp { pkid });
                }
                Some(OutState::Ack) => self.wrong_ack("PUBCOMP for a QoS 1 message"),
                Some(OutState::Rec) => self.wrong_ack("PUBCOMP before PUBREC"),
                Some(OutState::Received) => self.wrong_ack("PUBCOMP before PUBREL"),
                None => {}
            },
            Packet::Subscribe(s) => {
                let shared_no_local = s.filters.iter().any(|f| f.no_local && f.filter.starts_with("$share/"));
                if self.is_v5() && shared_no_local {
                    self.fail(ProtocolError::Violation(
                        ReasonCode::PROTOCOL_ERROR,
                        "no local on a shared subscription",
                    ));
                } else if self.is_v5() && s.filters.iter().any(|f| is_malformed_filter(&f.filter)) {
                    self.fail(MALFORMED_FILTER);
                } else {
                    self.events.push_back(Event::Subscribe(s));
                }
            }
            Packet::Unsubscribe(u) if self.is_v5() && u.filters.iter().any(|f| is_malformed_filter(f)) => {
                self.fail(MALFORMED_FILTER);
            }
            Packet::Unsubscribe(u) => self.events.push_back(Event::Unsubscribe(u)),
            Packet::PingReq => self.queue(Packet::PingResp),
            Packet::Disconnect(d) => {
                let expiry_set = d.session_expiry_interval.is_some_and(|e| e != 0);
                if self.is_v5() && self.peer.session_expiry == 0 && expiry_set {
                    self.fail(ProtocolError::Violation(
                        ReasonCode::PROTOCOL_ERROR,
                        "session expiry set on DISCONNECT after 0 in CONNECT",
                    ));
                } else {
                    self.events.push_back(Event::Disconnect(d));
                    self.close();
                }
            }
            Packet::Connect(_) => self.fail(ProtocolError::Unexpected("second CONNECT")),
            Packet::Auth { .. } => {
                self.fail(ProtocolError::Violation(ReasonCode::PROTOCOL_ERROR, "AUTH without enhanced authentication"))
            }
            Packet::ConnAck { .. } | Packet::SubAck { .. } | Packet::UnsubAck { .. } | Packet::PingResp => {
                self.fail(ProtocolError::Violation(ReasonCode::PROTOCOL_ERROR, "server-to-client packet from client"))
            }
        }
    }

    fn on_publish(&mut self, mut p: Publish) {
        if p.qos as u8 > self.max_qos {
            return self.fail(ProtocolError::Violation(ReasonCode::QOS_NOT_SUPPORTED, "QoS not supported"));
        }
        if p.retain && !self.retain_available {
            return self.fail(ProtocolError::Violation(ReasonCode::RETAIN_NOT_SUPPORTED, "retain not supported"));
        }
        if !p.properties.subscription_identifiers.is_empty() {
            return self.fail(ProtocolError::Violation(
                ReasonCode::PROTOCOL_ERROR,
                "subscription identifier in PUBLISH from client",
            ));
        }
        let max_levels = self.config.max_topic_levels;
        if let Some(alias) = p.properties.topic_alias.take() {
            if alias == 0 || alias > self.config.topic_alias_maximum {
                return self.fail(ProtocolError::TopicAliasInvalid);
            }
            if p.topic.is_empty() {
                match self.in_aliases.as_ref().and_then(|a| a.get(alias)) {
                    Some(t) => p.topic.clone_from(t),
                    None => {
                        return self.fail(ProtocolError::Violation(ReasonCode::PROTOCOL_ERROR, "unknown topic alias"))
                    }
                }
            } else if topic::validate_topic_name(&p.topic, max_levels).is_ok() {
                self.in_aliases.get_or_insert_default().set(alias, &p.topic);
            }
        }
        if topic::validate_topic_name(&p.topic, max_levels).is_err() {
            return self.fail(ProtocolError::TopicNameInvalid);
        }
        let pkid = p.pkid;
        match (p.qos, self.inbound.get(&pkid).copied()) {
            (QoS::AtMostOnce, _) => {}
            (QoS::AtLeastOnce, Some(InState::Qos1)) => {}
            (QoS::ExactlyOnce, Some(InState::Qos2Pending)) => return,
            (QoS::ExactlyOnce, Some(InState::Qos2Answered)) => {
                self.qos2_resends += 1;
                if self.is_v5() && self.qos2_resends > self.qos2_resends_allowed {
                    return self.fail(ProtocolError::Violation(
                        ReasonCode::PROTOCOL_ERROR,
                        "QoS 2 PUBLISH resent on the same connection",
                    ));
                }
                return self.queue(Packet::PubRec { pkid, reason: ReasonCode::SUCCESS, reason_string: None });
            }
            (_, Some(_)) => {
                return self
                    .fail(ProtocolError::Violation(ReasonCode::PROTOCOL_ERROR, "packet id in use with another QoS"))
            }
            (qos, None) => {
                if self.is_v5() && self.inbound.len() >= usize::from(self.config.receive_maximum) {
                    return self.fail(ProtocolError::ReceiveMaximumExceeded);
                }
                let st = if qos == QoS::AtLeastOnce { InState::Qos1 } else { InState::Qos2Pending };
                self.inbound.insert(pkid, st);
            }
        }
        self.events.push_back(Event::Publish(p));
    }

    /// Closes the connection for an acknowledgement that does not match the delivery's
    /// QoS (MQTT 5: DISCONNECT 0x82 Protocol error).
    fn wrong_ack(&mut self, what: &'static str) {
        self.fail(ProtocolError::Violation(ReasonCode::PROTOCOL_ERROR, what));
    }

    fn on_pubrec(&mut self, pkid: u16, reason: ReasonCode) {
        match self.outbound.get(pkid) {
            Some(OutState::Rec) => {
                if reason.is_error() {
                    // The client refused the message: the flow ends here.
                    self.outbound.remove(pkid);
                    self.events.push_back(Event::PubComp { pkid });
                } else if self.config.release_when_told {
                    self.outbound.set(pkid, OutState::Received);
                    self.events.push_back(Event::PubRec { pkid });
                } else {
                    self.outbound.set(pkid, OutState::Comp);
                    self.queue(Packet::PubRel { pkid, reason: ReasonCode::SUCCESS });
                    self.events.push_back(Event::PubRec { pkid });
                }
            }
            // PUBREC again: its PUBREL is on its way once the broker releases it.
            Some(OutState::Received) => {}
            Some(OutState::Comp) => self.queue(Packet::PubRel { pkid, reason: ReasonCode::SUCCESS }),
            Some(OutState::Ack) => self.wrong_ack("PUBREC for a QoS 1 message"),
            None => {
                if self.is_v5() {
                    self.queue(Packet::PubRel { pkid, reason: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND });
                }
            }
        }
    }

    fn on_pubrel(&mut self, pkid: u16) {
        match self.inbound.get(&pkid).copied() {
            Some(InState::Qos2Answered | InState::Qos2Pending) => {
                self.inbound.remove(&pkid);
                self.queue(Packet::PubComp { pkid, reason: ReasonCode::SUCCESS });
                self.events.push_back(Event::PubRel { pkid });
            }
            _ => {
                let reason = if self.is_v5() { ReasonCode::PACKET_IDENTIFIER_NOT_FOUND } else { ReasonCode::SUCCESS };
                self.queue(Packet::PubComp { pkid, reason });
            }
        }
    }
}

/// The error for a 5.0 SUBSCRIBE or UNSUBSCRIBE with a malformed topic filter.
const MALFORMED_FILTER: ProtocolError =
    ProtocolError::Violation(ReasonCode::MALFORMED_PACKET, "malformed topic filter");

/// True for a topic filter that breaks the filter syntax itself: empty (MQTT-4.7.3-1),
/// a wildcard not alone in its level or `#` not last (MQTT-4.7.1-1, -2), or a null
/// character. In MQTT 5 that makes the packet malformed (DISCONNECT 0x81); a well-formed
/// filter the broker does not allow (too many levels, a bad `$share/` group) gets its
/// SUBACK reason code instead.
fn is_malformed_filter(filter: &str) -> bool {
    matches!(
        crate::topic::parse_filter(filter, 0),
        Err(crate::topic::TopicError::Empty | crate::topic::TopicError::Wildcard | crate::topic::TopicError::NullChar)
    )
}
