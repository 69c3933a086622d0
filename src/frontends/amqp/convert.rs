//! Conversions between AMQP wire types and the core: field tables <-> typed header values,
//! content properties <-> message properties (the gateway mapping), and messages for
//! delivery.

use bytes::Bytes;
use ferrymq_amqp::{AMQPValue, BasicProperties, FieldTable, LongString, ShortString};

use crate::core::message::{Message, Properties};
use crate::core::value::Value;

/// A short string, cut at 255 bytes on a character boundary (AMQP's limit) instead of
/// failing: names that come from MQTT clients can be longer.
pub(crate) fn short(s: &str) -> ShortString {
    let mut end = s.len().min(255);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    ShortString::try_new(&s[..end]).unwrap_or_default()
}

/// A field table as core header values (table order: AMQP tables are unordered maps).
pub(crate) fn table_in(t: &FieldTable) -> Vec<(String, Value)> {
    t.inner().iter().map(|(k, v)| (k.as_str().to_owned(), value_in(v))).collect()
}

/// One AMQP field value as a core value (widths kept).
pub(crate) fn value_in(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(i) => Value::Int8(*i),
        AMQPValue::ShortShortUInt(i) => Value::UInt8(*i),
        AMQPValue::ShortInt(i) => Value::Int16(*i),
        AMQPValue::ShortUInt(i) => Value::UInt16(*i),
        AMQPValue::LongInt(i) => Value::Int32(*i),
        AMQPValue::LongUInt(i) => Value::UInt32(*i),
        AMQPValue::LongLongInt(i) => Value::Int(*i),
        AMQPValue::Float(f) => Value::Float(*f),
        AMQPValue::Double(f) => Value::Double(*f),
        AMQPValue::DecimalValue(d) => Value::Decimal(d.scale, d.value),
        AMQPValue::ShortString(s) => Value::Str(s.as_str().to_owned()),
        AMQPValue::LongString(s) => match std::str::from_utf8(s.as_bytes()) {
            Ok(text) => Value::Str(text.to_owned()),
            Err(_) => Value::Bytes(Bytes::copy_from_slice(s.as_bytes())),
        },
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(value_in).collect()),
        AMQPValue::Timestamp(t) => Value::Timestamp(*t),
        AMQPValue::FieldTable(t) => Value::Table(table_in(t)),
        AMQPValue::ByteArray(b) => Value::Bytes(Bytes::copy_from_slice(b.as_slice())),
        AMQPValue::Void => Value::Void,
    }
}

/// Core header values as a field table (a repeated name keeps its last value).
pub(crate) fn table_out(fields: &[(String, Value)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in fields {
        t.insert(short(k), value_out(v));
    }
    t
}

/// One core value as an AMQP field value.
pub(crate) fn value_out(v: &Value) -> AMQPValue {
    match v {
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Int8(i) => AMQPValue::ShortShortInt(*i),
        Value::UInt8(i) => AMQPValue::ShortShortUInt(*i),
        Value::Int16(i) => AMQPValue::ShortInt(*i),
        Value::UInt16(i) => AMQPValue::ShortUInt(*i),
        Value::Int32(i) => AMQPValue::LongInt(*i),
        Value::UInt32(i) => AMQPValue::LongUInt(*i),
        Value::Int(i) => AMQPValue::LongLongInt(*i),
        Value::UInt(u) => AMQPValue::LongLongInt(i64::try_from(*u).unwrap_or(i64::MAX)),
        Value::Float(f) => AMQPValue::Float(*f),
        Value::Double(f) => AMQPValue::Double(*f),
        Value::Decimal(scale, value) => AMQPValue::DecimalValue(amq_protocol_decimal(*scale, *value)),
        Value::Str(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Value::Bytes(b) => AMQPValue::ByteArray(b.to_vec().into()),
        Value::Timestamp(t) => AMQPValue::Timestamp(*t),
        Value::Array(items) => AMQPValue::FieldArray(items.iter().map(value_out).collect::<Vec<_>>().into()),
        Value::Table(fields) => AMQPValue::FieldTable(table_out(fields)),
        Value::Void => AMQPValue::Void,
    }
}

fn amq_protocol_decimal(scale: u8, value: u32) -> amq_protocol::types::DecimalValue {
    amq_protocol::types::DecimalValue { scale, value }
}

/// Message properties from AMQP content properties, received at `now_ms`.
/// `expiration` (ms, as text) becomes an absolute expiry; an unparsable one is ignored.
pub(crate) fn properties_in(p: &BasicProperties, now_ms: u64) -> Properties {
    let expiration_ms = p.expiration().as_ref().and_then(|e| e.as_str().trim().parse::<u64>().ok());
    Properties {
        content_type: p.content_type().as_ref().map(|s| s.as_str().to_owned()),
        content_encoding: p.content_encoding().as_ref().map(|s| s.as_str().to_owned()),
        headers: p.headers().as_ref().map(table_in).unwrap_or_default(),
        correlation_data: p.correlation_id().as_ref().map(|s| Bytes::copy_from_slice(s.as_str().as_bytes())),
        reply_to: p.reply_to().as_ref().map(|s| s.as_str().to_owned()),
        payload_format: None,
        expires_at_ms: expiration_ms.map(|ms| now_ms.saturating_add(ms)),
        expiration_ms,
        message_id: p.message_id().as_ref().map(|s| s.as_str().to_owned()),
        timestamp: *p.timestamp(),
        kind: p.kind().as_ref().map(|s| s.as_str().to_owned()),
        user_id: p.user_id().as_ref().map(|s| s.as_str().to_owned()),
        app_id: p.app_id().as_ref().map(|s| s.as_str().to_owned()),
        cluster_id: p.cluster_id().as_ref().map(|s| s.as_str().to_owned()),
        priority: *p.priority(),
        delivery_mode: *p.delivery_mode(),
    }
}

/// AMQP content properties for delivering `msg`. Messages that came from MQTT get the
/// gateway mapping: QoS >= 1 is delivery mode 2, MQTT 5 user properties are headers (as
/// long strings), correlation data is the correlation id, the response topic the reply-to
/// (in routing-key form), message expiry the expiration, and a retained message carries
/// the header `x-mqtt-retain: true`. `extra` headers (e.g. `x-delivery-count`) are added.
pub(crate) fn properties_out(msg: &Message, now_ms: u64, extra: &[(String, Value)]) -> BasicProperties {
    let p = &msg.props;
    let mut out = BasicProperties::default();
    if let Some(v) = &p.content_type {
        out = out.with_content_type(short(v));
    }
    if let Some(v) = &p.content_encoding {
        out = out.with_content_encoding(short(v));
    }
    let mut headers = p.headers.clone();
    if msg.retain {
        headers.push(("x-mqtt-retain".to_owned(), Value::Bool(true)));
    }
    headers.extend(extra.iter().cloned());
    if !headers.is_empty() {
        out = out.with_headers(table_out(&headers));
    }
    if let Some(mode) = p.delivery_mode {
        out = out.with_delivery_mode(mode);
    }
    if let Some(v) = p.priority {
        out = out.with_priority(v);
    }
    if let Some(v) = &p.correlation_data {
        out = out.with_correlation_id(short(&String::from_utf8_lossy(v)));
    }
    if let Some(v) = &p.reply_to {
        out = out.with_reply_to(short(v));
    }
    let expiration = p.expiration_ms.or_else(|| p.expires_at_ms.map(|at| at.saturating_sub(now_ms).max(1)));
    if let Some(ms) = expiration {
        out = out.with_expiration(short(&ms.to_string()));
    }
    if let Some(v) = &p.message_id {
        out = out.with_message_id(short(v));
    }
    if let Some(v) = p.timestamp {
        out = out.with_timestamp(v);
    }
    if let Some(v) = &p.kind {
        out = out.with_type(short(v));
    }
    if let Some(v) = &p.user_id {
        out = out.with_user_id(short(v));
    }
    if let Some(v) = &p.app_id {
        out = out.with_app_id(short(v));
    }
    if let Some(v) = &p.cluster_id {
        out = out.with_cluster_id(short(v));
    }
    out
}

/// The delivery guarantee of an AMQP publish: persistent (delivery mode 2) is QoS 2 in the
/// core, so an MQTT QoS 2 subscriber gets it exactly once; transient is QoS 0.
pub(crate) fn qos_of(p: &BasicProperties) -> u8 {
    if *p.delivery_mode() == Some(2) {
        2
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip_with_widths() {
        let mut t = FieldTable::default();
        t.insert("a".into(), AMQPValue::LongInt(5));
        t.insert("b".into(), AMQPValue::LongLongInt(-5));
        t.insert("c".into(), AMQPValue::ShortShortUInt(7));
        t.insert("d".into(), AMQPValue::LongString("text".into()));
        t.insert("e".into(), AMQPValue::FieldArray(vec![AMQPValue::Void, AMQPValue::Boolean(true)].into()));
        let mut inner = FieldTable::default();
        inner.insert("x".into(), AMQPValue::Double(1.5));
        t.insert("f".into(), AMQPValue::FieldTable(inner));
        t.insert("g".into(), AMQPValue::Timestamp(17));
        assert_eq!(table_out(&table_in(&t)), t);
    }

    #[test]
    fn long_names_are_cut_not_panicking() {
        let long = "é".repeat(200);
        assert!(short(&long).as_str().len() <= 255);
    }
}
