//! PUBLISH, hand-written for speed: the payload is a zero-copy slice of the frame on
//! decode and a single `extend_from_slice` on encode.

use super::props::{self, PropSet};
use super::wire::{self, Reader, Sink};
use super::DecodeError;
use crate::packet::*;

pub(crate) fn read_publish(flags: u8, r: &mut Reader, level: ProtocolLevel) -> Result<Publish, DecodeError> {
    let qos = QoS::from_u8((flags >> 1) & 0x03).ok_or(DecodeError::Malformed("PUBLISH with QoS 3"))?;
    let dup = flags & 0x08 != 0;
    let retain = flags & 0x01 != 0;
    let topic = r.binary()?;
    let topic = wire::utf8(&topic)?;
    if topic.contains(['+', '#']) {
        return Err(DecodeError::TopicName("wildcard in PUBLISH topic name"));
    }
    let topic = topic.to_owned();
    let pkid = if qos == QoS::AtMostOnce {
        0
    } else {
        let id = r.u16()?;
        if id == 0 {
            return Err(DecodeError::Protocol("packet identifier 0"));
        }
        id
    };
    let properties = if level.is_v5() {
        let p = props::read(r, props::PUBLISH, true)?;
        PublishProperties {
            payload_format_indicator: p.payload_format_indicator,
            message_expiry_interval: p.message_expiry_interval,
            topic_alias: p.topic_alias,
            response_topic: p.response_topic,
            correlation_data: p.correlation_data,
            user_properties: p.user_properties,
            subscription_identifiers: p.subscription_identifiers,
            content_type: p.content_type,
        }
    } else {
        PublishProperties::default()
    };
    Ok(Publish { dup, qos, retain, topic, pkid, payload: r.rest(), properties })
}

impl PropSet for PublishProperties {
    fn put<S: Sink>(&self, s: &mut S) {
        props::opt_u8(s, props::PAYLOAD_FORMAT_INDICATOR, self.payload_format_indicator);
        props::opt_u32(s, props::MESSAGE_EXPIRY_INTERVAL, self.message_expiry_interval);
        props::opt_u16(s, props::TOPIC_ALIAS, self.topic_alias);
        props::opt_str(s, props::RESPONSE_TOPIC, self.response_topic.as_deref());
        props::opt_bin(s, props::CORRELATION_DATA, self.correlation_data.as_deref());
        props::users(s, &self.user_properties);
        for id in &self.subscription_identifiers {
            s.put_u8(props::SUBSCRIPTION_IDENTIFIER);
            s.put_varint(*id as usize);
        }
        props::opt_str(s, props::CONTENT_TYPE, self.content_type.as_deref());
    }
}

/// First byte of a PUBLISH.
pub(crate) fn byte1(p: &Publish) -> u8 {
    0x30 | (u8::from(p.dup && p.qos != QoS::AtMostOnce) << 3) | ((p.qos as u8) << 1) | u8::from(p.retain)
}

pub(crate) fn put_publish<S: Sink>(p: &Publish, level: ProtocolLevel, s: &mut S) {
    s.put_str(&p.topic);
    if p.qos != QoS::AtMostOnce {
        s.put_u16(p.pkid);
    }
    if level.is_v5() {
        let empty = p.properties.payload_format_indicator.is_none()
            && p.properties.message_expiry_interval.is_none()
            && p.properties.topic_alias.is_none()
            && p.properties.response_topic.is_none()
            && p.properties.correlation_data.is_none()
            && p.properties.user_properties.is_empty()
            && p.properties.subscription_identifiers.is_empty()
            && p.properties.content_type.is_none();
        if empty {
            s.put_u8(0);
        } else {
            props::write(s, &p.properties);
        }
    }
    s.put_raw(&p.payload);
}
