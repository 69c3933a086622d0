//! Conversions between MQTT publishes and core messages.

use bytes::Bytes;
use ferrymq_mqtt::{Publish, PublishProperties, QoS, Will};

use crate::core::message::{key_to_mqtt, mqtt_to_key, Message, Properties};
use crate::core::tag_filter::{MQTT_TAG_PROPERTY, TAG_HEADER};
use crate::core::value::Value;

/// QoS as a number.
pub(crate) fn qos_u8(q: QoS) -> u8 {
    q as u8
}

/// QoS from a number (clamped to 2).
pub(crate) fn qos_of(n: u8) -> QoS {
    match n {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

/// Core properties from MQTT 5 publish properties, received at `now_ms`. The user
/// property `tag` becomes the message's tag (the header `x-tag`).
pub(crate) fn properties_in(p: &PublishProperties, now_ms: u64) -> Properties {
    Properties {
        content_type: p.content_type.clone(),
        correlation_data: p.correlation_data.clone(),
        reply_to: p.response_topic.as_deref().map(mqtt_to_key),
        payload_format: p.payload_format_indicator,
        headers: p.user_properties.iter().map(|(k, v)| (header_name_in(k), Value::Str(v.clone()))).collect(),
        expires_at_ms: p.message_expiry_interval.map(|s| now_ms + s as u64 * 1000),
        ..Properties::default()
    }
}

/// A core message from an inbound PUBLISH (topic resolved and validated), routed through
/// the MQTT exchange `exchange` with the topic as routing key.
pub(crate) fn message_in(p: Publish, topic: &str, exchange: &str, now_ms: u64) -> Message {
    mqtt_message(exchange, topic, p.payload, p.qos, p.retain, &p.properties, now_ms)
}

/// The core message of a will, published through the MQTT exchange `exchange`.
pub(crate) fn will_message(w: &Will, exchange: &str, now_ms: u64) -> Message {
    mqtt_message(exchange, &w.topic, w.payload.clone(), w.qos, w.retain, &w.properties, now_ms)
}

fn mqtt_message(
    exchange: &str,
    topic: &str,
    payload: Bytes,
    qos: QoS,
    retain: bool,
    props: &PublishProperties,
    now_ms: u64,
) -> Message {
    Message {
        exchange: exchange.to_owned(),
        routing_key: mqtt_to_key(topic),
        props: Properties {
            // MQTT QoS >= 1 is persistent for AMQP consumers (delivery mode 2), QoS 0 not.
            delivery_mode: Some(if qos == QoS::AtMostOnce { 1 } else { 2 }),
            ..properties_in(props, now_ms)
        },
        payload,
        qos: qos_u8(qos),
        retain,
        timestamp_ms: now_ms,
    }
}

/// MQTT 5 properties for delivering `msg` at `now_ms` (expiry counts down; AMQP headers
/// become user properties as text, the tag header `x-tag` the user property `tag`).
pub(crate) fn properties_out(msg: &Message, subscription_ids: Vec<u32>, now_ms: u64) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: msg.props.payload_format,
        message_expiry_interval: msg.remaining_expiry_secs(now_ms),
        topic_alias: None,
        response_topic: msg.props.reply_to.as_deref().map(key_to_mqtt),
        correlation_data: msg.props.correlation_data.clone(),
        user_properties: msg.props.headers.iter().map(|(k, v)| (user_property_out(k), v.to_text())).collect(),
        subscription_identifiers: subscription_ids,
        content_type: msg.props.content_type.clone(),
    }
}

/// The core header name of an MQTT 5 user property: `tag` is the tag header `x-tag`.
fn header_name_in(name: &str) -> String {
    if name == MQTT_TAG_PROPERTY {
        TAG_HEADER.to_owned()
    } else {
        name.to_owned()
    }
}

/// The MQTT 5 user property name of a core header: the tag header `x-tag` is `tag`.
fn user_property_out(name: &str) -> String {
    if name == TAG_HEADER {
        MQTT_TAG_PROPERTY.to_owned()
    } else {
        name.to_owned()
    }
}
