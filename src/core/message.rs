//! The core `Message`: what every front-end turns a publish into, and its record-header
//! encoding in the commit log.
//!
//! The body is a `Bytes` slice of the connection's read buffer; fan-out clones the `Arc`,
//! never the body.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Normalized message properties shared by MQTT 5 and AMQP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    /// Content type (MQTT 5 content type / AMQP content_type).
    pub content_type: Option<String>,
    /// Correlation data (MQTT 5) / correlation id (AMQP).
    pub correlation_data: Option<Bytes>,
    /// Response topic (MQTT 5) / reply-to (AMQP).
    pub response_topic: Option<String>,
    /// MQTT 5 payload format indicator.
    pub payload_format: Option<u8>,
    /// User properties (MQTT 5) / headers (AMQP), in order.
    pub user_properties: Vec<(String, String)>,
    /// Absolute expiry, milliseconds since the Unix epoch.
    pub expires_at_ms: Option<u64>,
}

/// A message in the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// MQTT topic name (`a/b/c`); the routing key on `amq.topic` is derived from it.
    pub topic: String,
    /// Body.
    pub payload: Bytes,
    /// QoS the publisher used (MQTT); 1 for persistent AMQP messages.
    pub qos: u8,
    /// RETAIN flag as published.
    pub retain: bool,
    /// Properties.
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

impl Message {
    /// True when the message carries an expiry that has passed at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        matches!(self.props.expires_at_ms, Some(at) if at <= now_ms)
    }

    /// Remaining expiry interval in whole seconds (rounded up), if the message expires.
    pub fn remaining_expiry_secs(&self, now_ms: u64) -> Option<u32> {
        self.props
            .expires_at_ms
            .map(|at| (at.saturating_sub(now_ms).div_ceil(1000)).min(u32::MAX as u64) as u32)
    }

    /// Bytes the message occupies in queues (payload + topic), for byte limits.
    pub fn weight(&self) -> u64 {
        (self.payload.len() + self.topic.len()) as u64
    }

    /// Encodes everything except the body as a commit-log record header.
    pub fn encode_header(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(32 + self.topic.len());
        b.put_u8(HEADER_VERSION);
        let mut flags = self.qos & 0b11;
        if self.retain {
            flags |= 0b100;
        }
        b.put_u8(flags);
        b.put_u64(self.timestamp_ms);
        put_str(&mut b, &self.topic);
        let p = &self.props;
        let mut present = 0u8;
        present |= p.content_type.is_some() as u8;
        present |= (p.correlation_data.is_some() as u8) << 1;
        present |= (p.response_topic.is_some() as u8) << 2;
        present |= (p.payload_format.is_some() as u8) << 3;
        present |= (p.expires_at_ms.is_some() as u8) << 4;
        present |= (!p.user_properties.is_empty() as u8) << 5;
        b.put_u8(present);
        if let Some(v) = &p.content_type {
            put_str(&mut b, v);
        }
        if let Some(v) = &p.correlation_data {
            put_bytes(&mut b, v);
        }
        if let Some(v) = &p.response_topic {
            put_str(&mut b, v);
        }
        if let Some(v) = p.payload_format {
            b.put_u8(v);
        }
        if let Some(v) = p.expires_at_ms {
            b.put_u64(v);
        }
        if !p.user_properties.is_empty() {
            b.put_u32(p.user_properties.len() as u32);
            for (k, v) in &p.user_properties {
                put_str(&mut b, k);
                put_str(&mut b, v);
            }
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
        let topic = get_str(h)?;
        let present = get_u8(h)?;
        let mut props = Properties::default();
        if present & 1 != 0 {
            props.content_type = Some(get_str(h)?);
        }
        if present & 2 != 0 {
            props.correlation_data = Some(get_bytes(h)?);
        }
        if present & 4 != 0 {
            props.response_topic = Some(get_str(h)?);
        }
        if present & 8 != 0 {
            props.payload_format = Some(get_u8(h)?);
        }
        if present & 16 != 0 {
            props.expires_at_ms = Some(get_u64(h)?);
        }
        if present & 32 != 0 {
            let n = get_u32(h)? as usize;
            let mut v = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                let k = get_str(h)?;
                v.push((k, get_str(h)?));
            }
            props.user_properties = v;
        }
        Ok(Message { topic, payload, qos: flags & 0b11, retain: flags & 0b100 != 0, props, timestamp_ms })
    }
}

/// A record header that cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("undecodable message header")]
pub struct HeaderError;

const HEADER_VERSION: u8 = 1;

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
    fn header_round_trip() {
        let m = Message {
            topic: "a/b".into(),
            payload: Bytes::from_static(b"hello"),
            qos: 2,
            retain: true,
            props: Properties {
                content_type: Some("text/plain".into()),
                correlation_data: Some(Bytes::from_static(b"\x00\x01")),
                response_topic: Some("r/t".into()),
                payload_format: Some(1),
                user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
                expires_at_ms: Some(42),
            },
            timestamp_ms: 7,
        };
        let back = Message::decode(m.encode_header(), m.payload.clone()).unwrap();
        assert_eq!(back, m);
        let plain = Message { props: Properties::default(), retain: false, qos: 0, ..m };
        assert_eq!(Message::decode(plain.encode_header(), plain.payload.clone()).unwrap(), plain);
    }

    #[test]
    fn garbage_header_is_an_error() {
        for n in 0..20 {
            let junk = Bytes::from(vec![1u8; n]);
            let _ = Message::decode(junk, Bytes::new());
        }
        assert!(Message::decode(Bytes::from_static(&[9]), Bytes::new()).is_err());
    }
}
