//! MQTT 5 properties: one strict reader for every packet (allowed identifiers per packet,
//! duplicates refused, value ranges checked, property length honoured exactly) and
//! writers for each property set.

use bytes::Bytes;

use super::wire::{Reader, Sink};
use super::DecodeError;
use crate::packet::UserProperty;

pub(crate) const PAYLOAD_FORMAT_INDICATOR: u8 = 1;
pub(crate) const MESSAGE_EXPIRY_INTERVAL: u8 = 2;
pub(crate) const CONTENT_TYPE: u8 = 3;
pub(crate) const RESPONSE_TOPIC: u8 = 8;
pub(crate) const CORRELATION_DATA: u8 = 9;
pub(crate) const SUBSCRIPTION_IDENTIFIER: u8 = 11;
pub(crate) const SESSION_EXPIRY_INTERVAL: u8 = 17;
pub(crate) const ASSIGNED_CLIENT_IDENTIFIER: u8 = 18;
pub(crate) const SERVER_KEEP_ALIVE: u8 = 19;
pub(crate) const AUTHENTICATION_METHOD: u8 = 21;
pub(crate) const AUTHENTICATION_DATA: u8 = 22;
pub(crate) const REQUEST_PROBLEM_INFORMATION: u8 = 23;
pub(crate) const WILL_DELAY_INTERVAL: u8 = 24;
pub(crate) const REQUEST_RESPONSE_INFORMATION: u8 = 25;
pub(crate) const RESPONSE_INFORMATION: u8 = 26;
pub(crate) const SERVER_REFERENCE: u8 = 28;
pub(crate) const REASON_STRING: u8 = 31;
pub(crate) const RECEIVE_MAXIMUM: u8 = 33;
pub(crate) const TOPIC_ALIAS_MAXIMUM: u8 = 34;
pub(crate) const TOPIC_ALIAS: u8 = 35;
pub(crate) const MAXIMUM_QOS: u8 = 36;
pub(crate) const RETAIN_AVAILABLE: u8 = 37;
pub(crate) const USER_PROPERTY: u8 = 38;
pub(crate) const MAXIMUM_PACKET_SIZE: u8 = 39;
pub(crate) const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 40;
pub(crate) const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 41;
pub(crate) const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 42;

/// A set of property identifiers (bit n = identifier n).
#[derive(Clone, Copy)]
pub(crate) struct Allowed(u64);

const fn set(ids: &[u8]) -> Allowed {
    let mut m = 0u64;
    let mut i = 0;
    while i < ids.len() {
        m |= 1u64 << ids[i];
        i += 1;
    }
    Allowed(m)
}

pub(crate) const CONNECT: Allowed = set(&[
    SESSION_EXPIRY_INTERVAL,
    RECEIVE_MAXIMUM,
    MAXIMUM_PACKET_SIZE,
    TOPIC_ALIAS_MAXIMUM,
    REQUEST_RESPONSE_INFORMATION,
    REQUEST_PROBLEM_INFORMATION,
    USER_PROPERTY,
    AUTHENTICATION_METHOD,
    AUTHENTICATION_DATA,
]);
pub(crate) const WILL: Allowed = set(&[
    WILL_DELAY_INTERVAL,
    PAYLOAD_FORMAT_INDICATOR,
    MESSAGE_EXPIRY_INTERVAL,
    CONTENT_TYPE,
    RESPONSE_TOPIC,
    CORRELATION_DATA,
    USER_PROPERTY,
]);
pub(crate) const CONNACK: Allowed = set(&[
    SESSION_EXPIRY_INTERVAL,
    RECEIVE_MAXIMUM,
    MAXIMUM_QOS,
    RETAIN_AVAILABLE,
    MAXIMUM_PACKET_SIZE,
    ASSIGNED_CLIENT_IDENTIFIER,
    TOPIC_ALIAS_MAXIMUM,
    REASON_STRING,
    USER_PROPERTY,
    WILDCARD_SUBSCRIPTION_AVAILABLE,
    SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    SHARED_SUBSCRIPTION_AVAILABLE,
    SERVER_KEEP_ALIVE,
    RESPONSE_INFORMATION,
    SERVER_REFERENCE,
    AUTHENTICATION_METHOD,
    AUTHENTICATION_DATA,
]);
pub(crate) const PUBLISH: Allowed = set(&[
    PAYLOAD_FORMAT_INDICATOR,
    MESSAGE_EXPIRY_INTERVAL,
    TOPIC_ALIAS,
    RESPONSE_TOPIC,
    CORRELATION_DATA,
    USER_PROPERTY,
    SUBSCRIPTION_IDENTIFIER,
    CONTENT_TYPE,
]);
/// PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK.
pub(crate) const ACK: Allowed = set(&[REASON_STRING, USER_PROPERTY]);
pub(crate) const SUBSCRIBE: Allowed = set(&[SUBSCRIPTION_IDENTIFIER, USER_PROPERTY]);
pub(crate) const UNSUBSCRIBE: Allowed = set(&[USER_PROPERTY]);
pub(crate) const DISCONNECT: Allowed = set(&[SESSION_EXPIRY_INTERVAL, REASON_STRING, USER_PROPERTY, SERVER_REFERENCE]);
pub(crate) const AUTH: Allowed = set(&[AUTHENTICATION_METHOD, AUTHENTICATION_DATA, REASON_STRING, USER_PROPERTY]);

impl Allowed {
    fn contains(self, id: u8) -> bool {
        id < 64 && self.0 & (1u64 << id) != 0
    }
}

/// Every property any packet can carry, as decoded.
#[derive(Debug, Default)]
pub(crate) struct Props {
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub subscription_identifiers: Vec<u32>,
    pub session_expiry_interval: Option<u32>,
    pub assigned_client_identifier: Option<String>,
    pub server_keep_alive: Option<u16>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
    pub request_problem_information: Option<u8>,
    pub will_delay_interval: Option<u32>,
    pub request_response_information: Option<u8>,
    pub response_information: Option<String>,
    pub server_reference: Option<String>,
    pub reason_string: Option<String>,
    pub receive_maximum: Option<u16>,
    pub topic_alias_maximum: Option<u16>,
    pub topic_alias: Option<u16>,
    pub maximum_qos: Option<u8>,
    pub retain_available: Option<u8>,
    pub user_properties: Vec<UserProperty>,
    pub maximum_packet_size: Option<u32>,
    pub wildcard_subscription_available: Option<u8>,
    pub subscription_identifiers_available: Option<u8>,
    pub shared_subscription_available: Option<u8>,
}

fn once<T>(slot: &mut Option<T>, v: T) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DecodeError::Protocol("property included more than once"));
    }
    *slot = Some(v);
    Ok(())
}

fn flag(v: u8) -> Result<u8, DecodeError> {
    if v > 1 {
        return Err(DecodeError::Protocol("property value must be 0 or 1"));
    }
    Ok(v)
}

fn nonzero_u16(v: u16) -> Result<u16, DecodeError> {
    if v == 0 {
        return Err(DecodeError::Protocol("property value must not be 0"));
    }
    Ok(v)
}

/// Reads a property length and the properties it covers. `multi_sub_ids` allows more
/// than one Subscription Identifier (PUBLISH only).
pub(crate) fn read(r: &mut Reader, allowed: Allowed, multi_sub_ids: bool) -> Result<Props, DecodeError> {
    let len = r.varint()? as usize;
    let mut p = Props::default();
    if len == 0 {
        return Ok(p);
    }
    let mut r = Reader::new(r.take(len).map_err(|_| DecodeError::Malformed("property length exceeds packet"))?);
    while !r.is_empty() {
        let id = r.varint()?;
        let id = u8::try_from(id)
            .ok()
            .filter(|id| allowed.contains(*id))
            .ok_or(DecodeError::Malformed("property not valid for this packet"))?;
        match id {
            PAYLOAD_FORMAT_INDICATOR => once(&mut p.payload_format_indicator, flag(r.u8()?)?)?,
            MESSAGE_EXPIRY_INTERVAL => once(&mut p.message_expiry_interval, r.u32()?)?,
            CONTENT_TYPE => once(&mut p.content_type, r.string()?)?,
            RESPONSE_TOPIC => {
                let t = r.string()?;
                if t.is_empty() || t.contains(['+', '#']) {
                    return Err(DecodeError::Protocol("invalid response topic"));
                }
                once(&mut p.response_topic, t)?
            }
            CORRELATION_DATA => once(&mut p.correlation_data, r.binary()?)?,
            SUBSCRIPTION_IDENTIFIER => {
                let v = r.varint()?;
                if v == 0 {
                    return Err(DecodeError::Protocol("subscription identifier 0"));
                }
                if !multi_sub_ids && !p.subscription_identifiers.is_empty() {
                    return Err(DecodeError::Protocol("property included more than once"));
                }
                p.subscription_identifiers.push(v);
            }
            SESSION_EXPIRY_INTERVAL => once(&mut p.session_expiry_interval, r.u32()?)?,
            ASSIGNED_CLIENT_IDENTIFIER => once(&mut p.assigned_client_identifier, r.string()?)?,
            SERVER_KEEP_ALIVE => once(&mut p.server_keep_alive, r.u16()?)?,
            AUTHENTICATION_METHOD => once(&mut p.authentication_method, r.string()?)?,
            AUTHENTICATION_DATA => once(&mut p.authentication_data, r.binary()?)?,
            REQUEST_PROBLEM_INFORMATION => once(&mut p.request_problem_information, flag(r.u8()?)?)?,
            WILL_DELAY_INTERVAL => once(&mut p.will_delay_interval, r.u32()?)?,
            REQUEST_RESPONSE_INFORMATION => once(&mut p.request_response_information, flag(r.u8()?)?)?,
            RESPONSE_INFORMATION => once(&mut p.response_information, r.string()?)?,
            SERVER_REFERENCE => once(&mut p.server_reference, r.string()?)?,
            REASON_STRING => once(&mut p.reason_string, r.string()?)?,
            RECEIVE_MAXIMUM => once(&mut p.receive_maximum, nonzero_u16(r.u16()?)?)?,
            TOPIC_ALIAS_MAXIMUM => once(&mut p.topic_alias_maximum, r.u16()?)?,
            TOPIC_ALIAS => once(&mut p.topic_alias, r.u16()?)?,
            MAXIMUM_QOS => once(&mut p.maximum_qos, flag(r.u8()?)?)?,
            RETAIN_AVAILABLE => once(&mut p.retain_available, flag(r.u8()?)?)?,
            USER_PROPERTY => {
                let k = r.string()?;
                let v = r.string()?;
                p.user_properties.push((k, v));
            }
            MAXIMUM_PACKET_SIZE => {
                let v = r.u32()?;
                if v == 0 {
                    return Err(DecodeError::Protocol("maximum packet size 0"));
                }
                once(&mut p.maximum_packet_size, v)?
            }
            WILDCARD_SUBSCRIPTION_AVAILABLE => once(&mut p.wildcard_subscription_available, flag(r.u8()?)?)?,
            SUBSCRIPTION_IDENTIFIER_AVAILABLE => once(&mut p.subscription_identifiers_available, flag(r.u8()?)?)?,
            SHARED_SUBSCRIPTION_AVAILABLE => once(&mut p.shared_subscription_available, flag(r.u8()?)?)?,
            _ => return Err(DecodeError::Malformed("unknown property")),
        }
    }
    if p.authentication_data.is_some() && p.authentication_method.is_none() && allowed.contains(AUTHENTICATION_METHOD) {
        return Err(DecodeError::Protocol("authentication data without method"));
    }
    Ok(p)
}

/// Writes properties of one kind; called twice (count, then write).
pub(crate) trait PropSet {
    fn put<S: Sink>(&self, s: &mut S);
}

/// Writes `props` with its length prefix.
pub(crate) fn write<S: Sink, P: PropSet + ?Sized>(s: &mut S, props: &P) {
    let mut c = super::wire::Counter::default();
    props.put(&mut c);
    s.put_varint(c.len);
    props.put(s);
}

pub(crate) fn opt_u8<S: Sink>(s: &mut S, id: u8, v: Option<u8>) {
    if let Some(v) = v {
        s.put_u8(id);
        s.put_u8(v);
    }
}
pub(crate) fn opt_bool<S: Sink>(s: &mut S, id: u8, v: Option<bool>) {
    opt_u8(s, id, v.map(u8::from));
}
pub(crate) fn opt_u16<S: Sink>(s: &mut S, id: u8, v: Option<u16>) {
    if let Some(v) = v {
        s.put_u8(id);
        s.put_u16(v);
    }
}
pub(crate) fn opt_u32<S: Sink>(s: &mut S, id: u8, v: Option<u32>) {
    if let Some(v) = v {
        s.put_u8(id);
        s.put_u32(v);
    }
}
pub(crate) fn opt_str<S: Sink>(s: &mut S, id: u8, v: Option<&str>) {
    if let Some(v) = v {
        s.put_u8(id);
        s.put_str(v);
    }
}
pub(crate) fn opt_bin<S: Sink>(s: &mut S, id: u8, v: Option<&[u8]>) {
    if let Some(v) = v {
        s.put_u8(id);
        s.put_binary(v);
    }
}
pub(crate) fn users<S: Sink>(s: &mut S, v: &[UserProperty]) {
    for (k, val) in v {
        s.put_u8(USER_PROPERTY);
        s.put_str(k);
        s.put_str(val);
    }
}

/// Reason string and user properties of acks, DISCONNECT and AUTH.
pub(crate) struct ReasonProps<'a> {
    pub reason_string: Option<&'a str>,
}

impl PropSet for ReasonProps<'_> {
    fn put<S: Sink>(&self, s: &mut S) {
        opt_str(s, REASON_STRING, self.reason_string);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(bytes: &'static [u8], allowed: Allowed) -> Result<Props, DecodeError> {
        read(&mut Reader::new(Bytes::from_static(bytes)), allowed, false)
    }

    #[test]
    fn duplicates_refused() {
        assert!(matches!(
            props(&[6, MESSAGE_EXPIRY_INTERVAL, 0, 0, 0, 1, MESSAGE_EXPIRY_INTERVAL], PUBLISH),
            Err(DecodeError::Malformed(_))
        ));
        assert_eq!(
            props(&[4, TOPIC_ALIAS, 0, 1, TOPIC_ALIAS], PUBLISH).unwrap_err(),
            DecodeError::Malformed("truncated field")
        );
        assert_eq!(
            props(&[6, TOPIC_ALIAS, 0, 1, TOPIC_ALIAS, 0, 2], PUBLISH).unwrap_err(),
            DecodeError::Protocol("property included more than once")
        );
        assert_eq!(
            props(&[4, SUBSCRIPTION_IDENTIFIER, 1, SUBSCRIPTION_IDENTIFIER, 2], SUBSCRIBE).unwrap_err(),
            DecodeError::Protocol("property included more than once")
        );
        let p = read(
            &mut Reader::new(Bytes::from_static(&[4, SUBSCRIPTION_IDENTIFIER, 1, SUBSCRIPTION_IDENTIFIER, 2])),
            PUBLISH,
            true,
        )
        .unwrap();
        assert_eq!(p.subscription_identifiers, vec![1, 2]);
    }

    #[test]
    fn values_checked() {
        assert!(matches!(props(&[2, PAYLOAD_FORMAT_INDICATOR, 2], PUBLISH), Err(DecodeError::Protocol(_))));
        assert!(matches!(props(&[2, SUBSCRIPTION_IDENTIFIER, 0], SUBSCRIBE), Err(DecodeError::Protocol(_))));
        assert!(matches!(props(&[3, RECEIVE_MAXIMUM, 0, 0], CONNECT), Err(DecodeError::Protocol(_))));
        assert!(matches!(props(&[5, MAXIMUM_PACKET_SIZE, 0, 0, 0, 0], CONNECT), Err(DecodeError::Protocol(_))));
        assert!(matches!(props(&[3, AUTHENTICATION_DATA, 0, 0], CONNECT), Err(DecodeError::Protocol(_))));
        assert!(matches!(props(&[4, RESPONSE_TOPIC, 0, 1, b'#'], PUBLISH), Err(DecodeError::Protocol(_))));
        // Not allowed in this packet / unknown identifier: malformed.
        assert!(matches!(props(&[3, TOPIC_ALIAS, 0, 1], CONNECT), Err(DecodeError::Malformed(_))));
        assert!(matches!(props(&[2, 0x7F, 0], CONNECT), Err(DecodeError::Malformed(_))));
        // Property crossing the property length boundary.
        assert!(matches!(props(&[2, TOPIC_ALIAS, 0, 1], PUBLISH), Err(DecodeError::Malformed(_))));
        // Property length beyond the packet.
        assert!(matches!(props(&[9, TOPIC_ALIAS, 0, 1], PUBLISH), Err(DecodeError::Malformed(_))));
    }
}
