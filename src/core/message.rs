//! The core `Message`: what every front-end turns a publish into, and its record-header
//! encoding in the commit log.
//!
//! The body is a `Bytes` slice of the connection's read buffer; fan-out clones the `Arc`,
//! never the body.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::tag_filter::{tag_hash_of, TAG_HEADER};
use super::value::{decode_table, encode_table, Value};

/// Normalized message properties shared by MQTT 5 and AMQP.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    /// Content type (MQTT 5 content type / AMQP content_type).
    pub content_type: Option<String>,
    /// AMQP content_encoding.
    pub content_encoding: Option<String>,
    /// AMQP headers / MQTT 5 user properties (as strings), in order, duplicates kept.
    pub headers: Vec<(String, Value)>,
    /// Correlation data (MQTT 5) / correlation id (AMQP).
    pub correlation_data: Option<Bytes>,
    /// AMQP reply-to / MQTT 5 response topic, in routing-key form (an MQTT response
    /// topic `rpc/resp` is `rpc.resp`, so an AMQP responder publishing to `amq.topic` with
    /// `reply_to` as the key reaches the MQTT requester).
    pub reply_to: Option<String>,
    /// MQTT 5 payload format indicator.
    pub payload_format: Option<u8>,
    /// Absolute expiry, milliseconds since the Unix epoch.
    pub expires_at_ms: Option<u64>,
    /// AMQP `expiration` as published (milliseconds), re-emitted to AMQP consumers.
    pub expiration_ms: Option<u64>,
    /// AMQP message_id.
    pub message_id: Option<String>,
    /// AMQP timestamp (seconds since the epoch).
    pub timestamp: Option<u64>,
    /// AMQP type.
    pub kind: Option<String>,
    /// AMQP user_id.
    pub user_id: Option<String>,
    /// AMQP app_id.
    pub app_id: Option<String>,
    /// AMQP cluster_id.
    pub cluster_id: Option<String>,
    /// AMQP priority.
    pub priority: Option<u8>,
    /// AMQP delivery_mode as published (2 = persistent).
    pub delivery_mode: Option<u8>,
}

impl Properties {
    /// The first header with this name.
    pub fn header(&self, name: &str) -> Option<&Value> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

/// A message as the core routes, queues and stores it, whichever protocol published it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Exchange it was published to (MQTT publishes: the configured `mqtt.exchange`, `amq.topic` by default).
    pub exchange: String,
    /// Routing key (an MQTT topic `a/b/c` is the key `a.b.c`: see [`mqtt_to_key`]).
    pub routing_key: String,
    /// Body bytes as published (AMQP body, MQTT payload), never copied by fan-out.
    pub payload: Bytes,
    /// Delivery guarantee: the MQTT QoS it was published with; AMQP persistent messages
    /// are 2 and transient ones 0. Above 0 the message is persistent.
    pub qos: u8,
    /// RETAIN flag as published.
    pub retain: bool,
    /// Properties both protocols map onto: content type, headers, expiry, ids, priority, ...
    pub props: Properties,
    /// Time the broker received it, ms since the epoch.
    pub timestamp_ms: u64,
}

/// Shared handle: routing and fan-out pass this around.
pub type SharedMessage = Arc<Message>;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// An MQTT topic (or filter) as an AMQP routing key (or binding key): levels become words,
/// so `/` and `.` swap places, as RabbitMQ's MQTT plugin does (`a/b.c` <-> `a.b/c`).
pub fn mqtt_to_key(topic: &str) -> String {
    // Both separators are ASCII, so swapping bytes keeps the text valid UTF-8 (a byte of a
    // multi-byte character is never one of them): one copy, no per-character pushes.
    let mut bytes = topic.as_bytes().to_vec();
    for b in &mut bytes {
        match *b {
            b'/' => *b = b'.',
            b'.' => *b = b'/',
            _ => {}
        }
    }
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// An AMQP routing key as an MQTT topic (the inverse of [`mqtt_to_key`]).
pub fn key_to_mqtt(key: &str) -> String {
    mqtt_to_key(key)
}

/// Headers whose string value is a message key (AMQP `x-key`; MQTT 5 user property `key`,
/// which the gateway carries as a header of that name).
pub const KEY_HEADERS: [&str; 2] = ["x-key", "key"];

impl Message {
    /// What the storage key index files this message under: its `message_id` and the
    /// values of the [`KEY_HEADERS`]; `None` when it has none.
    pub fn index_keys(&self) -> Option<ferrymq_storage::MessageKeys> {
        let headers = self
            .props
            .headers
            .iter()
            .filter(|(k, _)| KEY_HEADERS.contains(&k.as_str()))
            .filter_map(|(_, v)| v.as_str());
        let mut keys: Vec<Bytes> = Vec::new();
        for k in self.props.message_id.as_deref().into_iter().chain(headers) {
            if !k.is_empty() && !keys.iter().any(|x| x == k.as_bytes()) {
                keys.push(Bytes::copy_from_slice(k.as_bytes()));
            }
        }
        (!keys.is_empty()).then_some(ferrymq_storage::MessageKeys { timestamp_ms: self.timestamp_ms, keys })
    }

    /// The routing key as an MQTT topic (key `a.b/c` is topic `a/b.c`).
    pub fn topic(&self) -> String {
        key_to_mqtt(&self.routing_key)
    }

    /// True for a persistent message (QoS > 0 / AMQP delivery mode 2).
    pub fn is_persistent(&self) -> bool {
        self.qos > 0
    }

    /// True when the message carries an expiry that has passed at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        matches!(self.props.expires_at_ms, Some(at) if at <= now_ms)
    }

    /// Remaining expiry interval in whole seconds (rounded up), if the message expires.
    pub fn remaining_expiry_secs(&self, now_ms: u64) -> Option<u32> {
        self.props.expires_at_ms.map(|at| (at.saturating_sub(now_ms).div_ceil(1000)).min(u32::MAX as u64) as u32)
    }

    /// The message's tag: the `x-tag` header (MQTT 5 user property `tag`), if a string.
    pub fn tag(&self) -> Option<&str> {
        self.props.header(TAG_HEADER).and_then(Value::as_str)
    }

    /// The hash of the tag kept in consume-queue entries ([`NO_TAG`] when untagged).
    ///
    /// [`NO_TAG`]: super::tag_filter::NO_TAG
    pub fn tag_hash(&self) -> u32 {
        tag_hash_of(self.tag())
    }

    /// Bytes the message occupies in queues (payload + routing key), for byte limits.
    pub fn weight(&self) -> u64 {
        (self.payload.len() + self.routing_key.len()) as u64
    }

    /// Encodes everything except the body as a commit-log record header.
    pub fn encode_header(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(48 + self.routing_key.len() + self.exchange.len());
        b.put_u8(HEADER_VERSION);
        let mut flags = self.qos & 0b11;
        if self.retain {
            flags |= 0b100;
        }
        b.put_u8(flags);
        b.put_u64(self.timestamp_ms);
        put_str(&mut b, &self.exchange);
        put_str(&mut b, &self.routing_key);
        let p = &self.props;
        let strings = [
            &p.content_type,
            &p.content_encoding,
            &p.reply_to,
            &p.message_id,
            &p.kind,
            &p.user_id,
            &p.app_id,
            &p.cluster_id,
        ];
        let mut present = 0u32;
        for (i, v) in strings.iter().enumerate() {
            present |= (v.is_some() as u32) << i;
        }
        present |= (p.correlation_data.is_some() as u32) << 8;
        present |= (p.payload_format.is_some() as u32) << 9;
        present |= (p.expires_at_ms.is_some() as u32) << 10;
        present |= (p.expiration_ms.is_some() as u32) << 11;
        present |= (p.timestamp.is_some() as u32) << 12;
        present |= (p.priority.is_some() as u32) << 13;
        present |= (p.delivery_mode.is_some() as u32) << 14;
        present |= (!p.headers.is_empty() as u32) << 15;
        b.put_u32(present);
        for v in strings.into_iter().flatten() {
            put_str(&mut b, v);
        }
        if let Some(v) = &p.correlation_data {
            put_bytes(&mut b, v);
        }
        if let Some(v) = p.payload_format {
            b.put_u8(v);
        }
        for v in [p.expires_at_ms, p.expiration_ms, p.timestamp].into_iter().flatten() {
            b.put_u64(v);
        }
        for v in [p.priority, p.delivery_mode].into_iter().flatten() {
            b.put_u8(v);
        }
        if !p.headers.is_empty() {
            encode_table(&p.headers, &mut b);
        }
        b.freeze()
    }

    /// Rebuilds a message from a record header and body.
    pub fn decode(mut header: Bytes, payload: Bytes) -> Result<Message, HeaderError> {
        let h = &mut header;
        if get_u8(h)? != HEADER_VERSION {
            return Err(HeaderError);
        }
        let flags = get_u8(h)?;
        let timestamp_ms = get_u64(h)?;
        let exchange = get_str(h)?;
        let routing_key = get_str(h)?;
        let present = get_u32(h)?;
        let mut p = Properties::default();
        let mut strings: [&mut Option<String>; 8] = [
            &mut p.content_type,
            &mut p.content_encoding,
            &mut p.reply_to,
            &mut p.message_id,
            &mut p.kind,
            &mut p.user_id,
            &mut p.app_id,
            &mut p.cluster_id,
        ];
        for (i, slot) in strings.iter_mut().enumerate() {
            if present & (1 << i) != 0 {
                **slot = Some(get_str(h)?);
            }
        }
        if present & (1 << 8) != 0 {
            p.correlation_data = Some(get_bytes(h)?);
        }
        if present & (1 << 9) != 0 {
            p.payload_format = Some(get_u8(h)?);
        }
        if present & (1 << 10) != 0 {
            p.expires_at_ms = Some(get_u64(h)?);
        }
        if present & (1 << 11) != 0 {
            p.expiration_ms = Some(get_u64(h)?);
        }
        if present & (1 << 12) != 0 {
            p.timestamp = Some(get_u64(h)?);
        }
        if present & (1 << 13) != 0 {
            p.priority = Some(get_u8(h)?);
        }
        if present & (1 << 14) != 0 {
            p.delivery_mode = Some(get_u8(h)?);
        }
        if present & (1 << 15) != 0 {
            p.headers = decode_table(h, 0)?;
        }
        Ok(Message {
            exchange,
            routing_key,
            payload,
            qos: flags & 0b11,
            retain: flags & 0b100 != 0,
            props: p,
            timestamp_ms,
        })
    }
}

/// A record header that cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("undecodable message header")]
pub struct HeaderError;

const HEADER_VERSION: u8 = 2;

fn put_str(b: &mut BytesMut, s: &str) {
    put_bytes(b, s.as_bytes());
}

fn put_bytes(b: &mut BytesMut, s: &[u8]) {
    b.put_u32(s.len() as u32);
    b.put_slice(s);
}

fn get_u8(b: &mut Bytes) -> Result<u8, HeaderError> {
    if b.remaining() < 1 {
        return Err(HeaderError);
    }
    Ok(b.get_u8())
}

fn get_u32(b: &mut Bytes) -> Result<u32, HeaderError> {
    if b.remaining() < 4 {
        return Err(HeaderError);
    }
    Ok(b.get_u32())
}

fn get_u64(b: &mut Bytes) -> Result<u64, HeaderError> {
    if b.remaining() < 8 {
        return Err(HeaderError);
    }
    Ok(b.get_u64())
}

fn get_bytes(b: &mut Bytes) -> Result<Bytes, HeaderError> {
    let n = get_u32(b)? as usize;
    if b.remaining() < n {
        return Err(HeaderError);
    }
    Ok(b.split_to(n))
}

fn get_str(b: &mut Bytes) -> Result<String, HeaderError> {
    String::from_utf8(get_bytes(b)?.to_vec()).map_err(|_| HeaderError)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_keys_are_the_message_id_and_key_headers() {
        let mut m = Message {
            exchange: String::new(),
            routing_key: "k".into(),
            payload: Bytes::new(),
            qos: 0,
            retain: false,
            props: Properties::default(),
            timestamp_ms: 77,
        };
        assert_eq!(m.index_keys(), None);
        m.props.message_id = Some("id-1".into());
        m.props.headers = vec![
            ("x-key".into(), Value::Str("order-7".into())),
            ("key".into(), Value::Str("id-1".into())), // MQTT 5 user property `key`; duplicate
            ("other".into(), Value::Str("no".into())),
            ("x-key".into(), Value::Int(5)), // not a string: not a key
        ];
        let k = m.index_keys().unwrap();
        assert_eq!(k.timestamp_ms, 77);
        assert_eq!(k.keys, [Bytes::from_static(b"id-1"), Bytes::from_static(b"order-7")]);
    }

    #[test]
    fn header_round_trip() {
        let m = Message {
            exchange: "amq.topic".into(),
            routing_key: "a.b".into(),
            payload: Bytes::from_static(b"hello"),
            qos: 2,
            retain: true,
            props: Properties {
                content_type: Some("text/plain".into()),
                content_encoding: Some("gzip".into()),
                headers: vec![("k".into(), Value::Str("v".into())), ("k".into(), Value::Int(3))],
                correlation_data: Some(Bytes::from_static(b"\x00\x01")),
                reply_to: Some("r.t".into()),
                payload_format: Some(1),
                expires_at_ms: Some(42),
                expiration_ms: Some(1000),
                message_id: Some("id-1".into()),
                timestamp: Some(1_700_000_000),
                kind: Some("t".into()),
                user_id: Some("guest".into()),
                app_id: Some("app".into()),
                cluster_id: Some("c".into()),
                priority: Some(5),
                delivery_mode: Some(2),
            },
            timestamp_ms: 7,
        };
        let back = Message::decode(m.encode_header(), m.payload.clone()).unwrap();
        assert_eq!(back, m);
        let plain = Message { props: Properties::default(), retain: false, qos: 0, ..m };
        assert_eq!(Message::decode(plain.encode_header(), plain.payload.clone()).unwrap(), plain);
    }

    #[test]
    fn topics_and_keys_swap_separators() {
        assert_eq!(mqtt_to_key("a/b.c/d"), "a.b/c.d");
        assert_eq!(key_to_mqtt("a.b/c.d"), "a/b.c/d");
        assert_eq!(mqtt_to_key("sport/+/#"), "sport.+.#");
        assert_eq!(mqtt_to_key("häuser/€.1/日本"), "häuser.€/1.日本", "multi-byte characters kept");
        assert_eq!(key_to_mqtt(""), "");
    }

    #[test]
    fn garbage_header_is_an_error() {
        for n in 0..40 {
            let junk = Bytes::from(vec![2u8; n]);
            let _ = Message::decode(junk, Bytes::new());
        }
        assert!(Message::decode(Bytes::from_static(&[9]), Bytes::new()).is_err());
    }
}
