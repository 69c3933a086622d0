//! Conversions between MQTT publishes and core messages.

use ferrymq_mqtt::{Publish, PublishProperties, QoS};

use crate::core::message::{Message, Properties};

/// QoS as a number.
pub fn qos_u8(q: QoS) -> u8 {
    q as u8
}

/// QoS from a number (clamped to 2).
pub fn qos_of(n: u8) -> QoS {
    match n {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

/// Core properties from MQTT 5 publish properties, received at `now_ms`.
pub fn properties_in(p: &PublishProperties, now_ms: u64) -> Properties {
    Properties {
        content_type: p.content_type.clone(),
        correlation_data: p.correlation_data.clone(),
        response_topic: p.response_topic.clone(),
        payload_format: p.payload_format_indicator,
        user_properties: p.user_properties.clone(),
        expires_at_ms: p.message_expiry_interval.map(|s| now_ms + s as u64 * 1000),
    }
}

/// A core message from an inbound PUBLISH (topic already resolved and validated).
pub fn message_in(p: Publish, topic: String, now_ms: u64) -> Message {
    Message {
        props: properties_in(&p.properties, now_ms),
        topic,
        payload: p.payload,
        qos: qos_u8(p.qos),
        retain: p.retain,
        timestamp_ms: now_ms,
    }
}

/// MQTT 5 properties for delivering `msg` at `now_ms` (expiry counts down).
pub fn properties_out(msg: &Message, subscription_ids: Vec<u32>, now_ms: u64) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: msg.props.payload_format,
        message_expiry_interval: msg.remaining_expiry_secs(now_ms),
        topic_alias: None,
        response_topic: msg.props.response_topic.clone(),
        correlation_data: msg.props.correlation_data.clone(),
        user_properties: msg.props.user_properties.clone(),
        subscription_identifiers: subscription_ids,
        content_type: msg.props.content_type.clone(),
    }
}
