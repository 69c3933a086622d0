//! CONNECT (all levels, including MQTT 3.1 `MQIsdp`) and CONNACK (3.x return codes are
//! mapped to and from [`ReasonCode`]).

use super::props::{self, PropSet, Props};
use super::wire::{Reader, Sink};
use super::DecodeError;
use crate::packet::*;
use crate::reason::{ReasonCode, ReasonContext};

/// Protocol name and level of a CONNECT.
fn protocol(name: &[u8], level: u8) -> Result<ProtocolLevel, DecodeError> {
    match (name, level) {
        (b"MQTT", 4) => Ok(ProtocolLevel::V3_1_1),
        (b"MQTT", 5) => Ok(ProtocolLevel::V5),
        (b"MQIsdp", 3) => Ok(ProtocolLevel::V3_1),
        _ => Err(DecodeError::UnsupportedProtocol),
    }
}

/// The protocol name and raw level byte at the start of a CONNECT body, if readable.
pub(crate) fn peek_protocol(body: &[u8]) -> Option<(&[u8], u8)> {
    let n = usize::from(u16::from_be_bytes([*body.first()?, *body.get(1)?]));
    let name = body.get(2..2 + n)?;
    let level = *body.get(2 + n)?;
    Some((name, level))
}

pub(crate) fn read_connect(r: &mut Reader) -> Result<Connect, DecodeError> {
    let name = r.binary()?;
    let raw = r.u8()?;
    // Mosquitto's bridges set the top bit of a 3.x level (never of 5).
    let bridge = raw & 0x80 != 0 && matches!(raw & 0x7F, 3 | 4);
    let level = protocol(&name, if bridge { raw & 0x7F } else { raw })?;
    let flags = r.u8()?;
    if flags & 0x01 != 0 {
        return Err(DecodeError::Malformed("reserved CONNECT flag set"));
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    let password_flag = flags & 0x40 != 0;
    let username_flag = flags & 0x80 != 0;
    if will_qos == 3 {
        return Err(DecodeError::Malformed("will QoS 3"));
    }
    if !will_flag && (will_qos != 0 || will_retain) {
        return Err(DecodeError::Protocol("will QoS or retain set without will flag"));
    }
    if !level.is_v5() && password_flag && !username_flag {
        return Err(DecodeError::Protocol("password without user name"));
    }
    let keep_alive = r.u16()?;
    let p = if level.is_v5() { props::read(r, props::CONNECT, false)? } else { Props::default() };
    let client_id = r.string()?;
    let will = if will_flag {
        let wp = if level.is_v5() { props::read(r, props::WILL, false)? } else { Props::default() };
        let topic = r.string()?;
        if topic.is_empty() || topic.contains(['+', '#']) {
            return Err(DecodeError::Protocol("invalid will topic"));
        }
        let payload = r.binary()?;
        Some(Will {
            topic,
            payload,
            qos: QoS::from_u8(will_qos).unwrap_or(QoS::AtMostOnce),
            retain: will_retain,
            delay_interval: wp.will_delay_interval,
            properties: PublishProperties {
                payload_format_indicator: wp.payload_format_indicator,
                message_expiry_interval: wp.message_expiry_interval,
                topic_alias: None,
                response_topic: wp.response_topic,
                correlation_data: wp.correlation_data,
                user_properties: wp.user_properties,
                subscription_identifiers: Vec::new(),
                content_type: wp.content_type,
            },
        })
    } else {
        None
    };
    let username = if username_flag { Some(r.string()?) } else { None };
    let password = if password_flag { Some(r.binary()?) } else { None };
    if !r.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes after CONNECT payload"));
    }
    Ok(Connect {
        level,
        client_id,
        clean_start,
        keep_alive,
        username,
        password,
        will,
        bridge,
        properties: ConnectProperties {
            session_expiry_interval: p.session_expiry_interval,
            receive_maximum: p.receive_maximum,
            maximum_packet_size: p.maximum_packet_size,
            topic_alias_maximum: p.topic_alias_maximum,
            request_response_information: p.request_response_information,
            request_problem_information: p.request_problem_information,
            user_properties: p.user_properties,
            authentication_method: p.authentication_method,
            authentication_data: p.authentication_data,
        },
    })
}

impl PropSet for ConnectProperties {
    fn put<S: Sink>(&self, s: &mut S) {
        props::opt_u32(s, props::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        props::opt_u16(s, props::RECEIVE_MAXIMUM, self.receive_maximum);
        props::opt_u32(s, props::MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        props::opt_u16(s, props::TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        props::opt_u8(s, props::REQUEST_RESPONSE_INFORMATION, self.request_response_information);
        props::opt_u8(s, props::REQUEST_PROBLEM_INFORMATION, self.request_problem_information);
        props::users(s, &self.user_properties);
        props::opt_str(s, props::AUTHENTICATION_METHOD, self.authentication_method.as_deref());
        props::opt_bin(s, props::AUTHENTICATION_DATA, self.authentication_data.as_deref());
    }
}

impl PropSet for Will {
    fn put<S: Sink>(&self, s: &mut S) {
        let p = &self.properties;
        props::opt_u32(s, props::WILL_DELAY_INTERVAL, self.delay_interval);
        props::opt_u8(s, props::PAYLOAD_FORMAT_INDICATOR, p.payload_format_indicator);
        props::opt_u32(s, props::MESSAGE_EXPIRY_INTERVAL, p.message_expiry_interval);
        props::opt_str(s, props::CONTENT_TYPE, p.content_type.as_deref());
        props::opt_str(s, props::RESPONSE_TOPIC, p.response_topic.as_deref());
        props::opt_bin(s, props::CORRELATION_DATA, p.correlation_data.as_deref());
        props::users(s, &p.user_properties);
    }
}

/// The level byte's bridge bit.
fn bridge_bit(c: &Connect) -> u8 {
    if c.bridge {
        0x80
    } else {
        0
    }
}

pub(crate) fn put_connect<S: Sink>(c: &Connect, level: ProtocolLevel, s: &mut S) {
    match level {
        ProtocolLevel::V3_1 => {
            s.put_str("MQIsdp");
            s.put_u8(3 | bridge_bit(c));
        }
        ProtocolLevel::V3_1_1 => {
            s.put_str("MQTT");
            s.put_u8(4 | bridge_bit(c));
        }
        ProtocolLevel::V5 => {
            s.put_str("MQTT");
            s.put_u8(5);
        }
    }
    let mut flags = 0u8;
    if c.clean_start {
        flags |= 0x02;
    }
    if let Some(w) = &c.will {
        flags |= 0x04 | ((w.qos as u8) << 3);
        if w.retain {
            flags |= 0x20;
        }
    }
    if c.password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    s.put_u8(flags);
    s.put_u16(c.keep_alive);
    if level.is_v5() {
        props::write(s, &c.properties);
    }
    s.put_str(&c.client_id);
    if let Some(w) = &c.will {
        if level.is_v5() {
            props::write(s, w);
        }
        s.put_str(&w.topic);
        s.put_binary(&w.payload);
    }
    if let Some(u) = &c.username {
        s.put_str(u);
    }
    if let Some(p) = &c.password {
        s.put_binary(p);
    }
}

pub(crate) fn read_connack(r: &mut Reader, level: ProtocolLevel) -> Result<Packet, DecodeError> {
    let flags = r.u8()?;
    if flags & 0xFE != 0 {
        return Err(DecodeError::Malformed("reserved CONNACK flags set"));
    }
    let session_present = flags & 0x01 != 0;
    let code = r.u8()?;
    let (reason, properties) = if level.is_v5() {
        let reason = ReasonCode(code);
        if !reason.valid_in(ReasonContext::ConnAck) {
            return Err(DecodeError::Protocol("invalid CONNACK reason code"));
        }
        let p = props::read(r, props::CONNACK, false)?;
        let to_bool = |v: Option<u8>| v.map(|v| v == 1);
        let props = ConnAckProperties {
            session_expiry_interval: p.session_expiry_interval,
            receive_maximum: p.receive_maximum,
            maximum_qos: p.maximum_qos,
            retain_available: to_bool(p.retain_available),
            maximum_packet_size: p.maximum_packet_size,
            assigned_client_identifier: p.assigned_client_identifier,
            topic_alias_maximum: p.topic_alias_maximum,
            reason_string: p.reason_string,
            user_properties: p.user_properties,
            wildcard_subscription_available: to_bool(p.wildcard_subscription_available),
            subscription_identifiers_available: to_bool(p.subscription_identifiers_available),
            shared_subscription_available: to_bool(p.shared_subscription_available),
            server_keep_alive: p.server_keep_alive,
            response_information: p.response_information,
            server_reference: p.server_reference,
        };
        (reason, props)
    } else {
        let reason = ReasonCode::from_v3_connack(code).ok_or(DecodeError::Malformed("reserved CONNACK return code"))?;
        (reason, ConnAckProperties::default())
    };
    if !r.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes after CONNACK"));
    }
    Ok(Packet::ConnAck { session_present, reason, properties: Box::new(properties) })
}

impl PropSet for ConnAckProperties {
    fn put<S: Sink>(&self, s: &mut S) {
        props::opt_u32(s, props::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        props::opt_u16(s, props::RECEIVE_MAXIMUM, self.receive_maximum);
        props::opt_u8(s, props::MAXIMUM_QOS, self.maximum_qos);
        props::opt_bool(s, props::RETAIN_AVAILABLE, self.retain_available);
        props::opt_u32(s, props::MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        props::opt_str(s, props::ASSIGNED_CLIENT_IDENTIFIER, self.assigned_client_identifier.as_deref());
        props::opt_u16(s, props::TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        props::opt_str(s, props::REASON_STRING, self.reason_string.as_deref());
        props::users(s, &self.user_properties);
        props::opt_bool(s, props::WILDCARD_SUBSCRIPTION_AVAILABLE, self.wildcard_subscription_available);
        props::opt_bool(s, props::SUBSCRIPTION_IDENTIFIER_AVAILABLE, self.subscription_identifiers_available);
        props::opt_bool(s, props::SHARED_SUBSCRIPTION_AVAILABLE, self.shared_subscription_available);
        props::opt_u16(s, props::SERVER_KEEP_ALIVE, self.server_keep_alive);
        props::opt_str(s, props::RESPONSE_INFORMATION, self.response_information.as_deref());
        props::opt_str(s, props::SERVER_REFERENCE, self.server_reference.as_deref());
    }
}

pub(crate) fn put_connack<S: Sink>(
    session_present: bool,
    reason: ReasonCode,
    properties: &ConnAckProperties,
    level: ProtocolLevel,
    s: &mut S,
) {
    if level.is_v5() {
        s.put_u8(u8::from(session_present && !reason.is_error()));
        s.put_u8(reason.0);
        props::write(s, properties);
    } else {
        let code = reason.to_v3_connack();
        // MQTT 3.1 has no session present flag: the byte is reserved and must be 0.
        let flag = level == ProtocolLevel::V3_1_1 && session_present && code == 0;
        s.put_u8(u8::from(flag));
        s.put_u8(code);
    }
}
