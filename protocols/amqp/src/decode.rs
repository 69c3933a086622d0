//! Decoding of method and content-header payloads: `amq-protocol`'s parsers behind the
//! nesting [`guard`], with hand-written fast paths for the methods a
//! publisher or consumer sends per message (basic.publish, ack, nack, reject), which
//! `amq-protocol` decodes with several allocations for the bit flags alone.

use amq_protocol::protocol::{basic, parse_class, AMQPClass};
use amq_protocol::types::ShortString;

use crate::guard;
use crate::BasicProperties;

/// Why a method payload was not decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MethodError {
    /// Shorter than the class and method ids.
    Truncated,
    /// A class/method pair AMQP 0-9-1 (as RabbitMQ extends it) does not define.
    Unknown {
        /// Class id read from the payload, echoed in the Connection.Close that follows.
        class_id: u16,
        /// Method id read from the payload, echoed likewise.
        method_id: u16,
    },
    /// Known ids, arguments that do not decode (or nest too deep).
    Invalid {
        /// Class id, echoed in the Connection.Close that follows.
        class_id: u16,
        /// Method id, echoed likewise.
        method_id: u16,
    },
}

/// The class and method ids at the front of a method payload.
pub(crate) fn method_ids(payload: &[u8]) -> Option<(u16, u16)> {
    match payload {
        [a, b, c, d, ..] => Some((u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d]))),
        _ => None,
    }
}

/// True for the class/method pairs `amq-protocol` knows (AMQP 0-9-1 with RabbitMQ's
/// extensions, without basic.credit).
pub(crate) fn is_known(class_id: u16, method_id: u16) -> bool {
    matches!(
        (class_id, method_id),
        (10, 10 | 11 | 20 | 21 | 30 | 31 | 40 | 41 | 50 | 51 | 60 | 61 | 70 | 71)
            | (20, 10 | 11 | 20 | 21 | 40 | 41)
            | (30, 10 | 11)
            | (40, 10 | 11 | 20 | 21 | 30 | 31 | 40 | 51)
            | (50, 10 | 11 | 20 | 21 | 30 | 31 | 40 | 41 | 50 | 51)
            | (60, 10 | 11 | 20 | 21 | 30 | 31 | 40 | 50 | 60 | 70 | 71 | 72 | 80 | 90 | 100 | 110 | 111 | 120)
            | (85, 10 | 11)
            | (90, 10 | 11 | 20 | 21 | 30 | 31)
    )
}

/// Decodes a whole method payload (ids and arguments, nothing after them).
pub(crate) fn decode_method(payload: &[u8]) -> Result<AMQPClass, MethodError> {
    let (class_id, method_id) = method_ids(payload).ok_or(MethodError::Truncated)?;
    let invalid = MethodError::Invalid { class_id, method_id };
    let args = payload.get(4..).unwrap_or_default();
    if class_id == 60 {
        if let Some(m) = fast_basic(method_id, args) {
            return m.ok_or(invalid);
        }
    }
    if !is_known(class_id, method_id) {
        return Err(MethodError::Unknown { class_id, method_id });
    }
    guard::check_method(class_id, method_id, args).map_err(|_| invalid)?;
    match parse_class(payload) {
        Ok(([], method)) => Ok(method),
        _ => Err(invalid),
    }
}

/// Byte reader for the fast paths.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*first)
    }

    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u16(&mut self) -> Option<u16> {
        self.bytes(2)?.try_into().ok().map(u16::from_be_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.bytes(8)?.try_into().ok().map(u64::from_be_bytes)
    }

    fn shortstr(&mut self) -> Option<ShortString> {
        let n = self.u8()?;
        let s = std::str::from_utf8(self.bytes(usize::from(n))?).ok()?;
        ShortString::try_new(s).ok()
    }

    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

/// basic.publish / ack / nack / reject decoded by hand: `None` if `method_id` is not one
/// of them, `Some(None)` if the arguments are invalid.
fn fast_basic(method_id: u16, args: &[u8]) -> Option<Option<AMQPClass>> {
    let mut r = Reader(args);
    let m = match method_id {
        40 => (|| {
            let _ticket = r.u16()?;
            let exchange = r.shortstr()?;
            let routing_key = r.shortstr()?;
            let bits = r.u8()?;
            r.end()?;
            Some(basic::AMQPMethod::Publish(basic::Publish {
                exchange,
                routing_key,
                mandatory: bits & 1 != 0,
                immediate: bits & 2 != 0,
            }))
        })(),
        80 => (|| {
            let delivery_tag = r.u64()?;
            let bits = r.u8()?;
            r.end()?;
            Some(basic::AMQPMethod::Ack(basic::Ack { delivery_tag, multiple: bits & 1 != 0 }))
        })(),
        90 => (|| {
            let delivery_tag = r.u64()?;
            let bits = r.u8()?;
            r.end()?;
            Some(basic::AMQPMethod::Reject(basic::Reject { delivery_tag, requeue: bits & 1 != 0 }))
        })(),
        120 => (|| {
            let delivery_tag = r.u64()?;
            let bits = r.u8()?;
            r.end()?;
            Some(basic::AMQPMethod::Nack(basic::Nack { delivery_tag, multiple: bits & 1 != 0, requeue: bits & 2 != 0 }))
        })(),
        _ => return None,
    };
    Some(m.map(AMQPClass::Basic))
}

/// The fixed part of a content header payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeaderPrefix {
    /// Class id (60 for basic).
    pub class_id: u16,
    /// Announced body size.
    pub body_size: u64,
}

/// Reads class id, weight and body size; `None` if the payload is shorter than that
/// plus the property flags.
pub(crate) fn header_prefix(payload: &[u8]) -> Option<HeaderPrefix> {
    let mut r = Reader(payload);
    let class_id = r.u16()?;
    let _weight = r.u16()?;
    let body_size = r.u64()?;
    if r.0.len() < 2 {
        return None;
    }
    Some(HeaderPrefix { class_id, body_size })
}

/// Decodes the basic properties of a content header payload (after the 12-byte prefix);
/// `None` if they do not decode exactly.
pub(crate) fn decode_properties(payload: &[u8]) -> Option<BasicProperties> {
    let props = payload.get(12..)?;
    guard::check_properties(props).ok()?;
    match basic::parse_properties(props) {
        Ok(([], p)) => Some(p),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;
    use bytes::BytesMut;

    fn encode(m: &AMQPClass) -> Vec<u8> {
        let ctx =
            amq_protocol::protocol::gen_class(m)(amq_protocol::frame::WriteContext::from(Vec::new())).expect("gen");
        ctx.write
    }

    #[test]
    fn fast_paths_match_amq_protocol() {
        let methods = [
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "ex".into(),
                routing_key: "rk".into(),
                mandatory: true,
                immediate: false,
            })),
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "".into(),
                routing_key: "".into(),
                mandatory: false,
                immediate: true,
            })),
            AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack { delivery_tag: u64::MAX, multiple: true })),
            AMQPClass::Basic(basic::AMQPMethod::Reject(basic::Reject { delivery_tag: 7, requeue: true })),
            AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack { delivery_tag: 9, multiple: false, requeue: true })),
        ];
        for m in methods {
            let bytes = encode(&m);
            assert_eq!(decode_method(&bytes), Ok(m.clone()));
            // Same as amq-protocol's own parser.
            assert_eq!(parse_class(&bytes[..]).map(|(_, m)| m), Ok(m));
            // Trailing and missing bytes are refused.
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(matches!(decode_method(&longer), Err(MethodError::Invalid { .. })));
            assert!(matches!(decode_method(&bytes[..bytes.len() - 1]), Err(MethodError::Invalid { .. })));
        }
    }

    #[test]
    fn unknown_and_truncated() {
        assert_eq!(decode_method(&[0, 60]), Err(MethodError::Truncated));
        assert_eq!(decode_method(&[0, 60, 0, 200]), Err(MethodError::Unknown { class_id: 60, method_id: 200 }));
        assert_eq!(decode_method(&[0, 99, 0, 1]), Err(MethodError::Unknown { class_id: 99, method_id: 1 }));
        // Known method, bad arguments.
        assert_eq!(decode_method(&[0, 20, 0, 10]), Err(MethodError::Invalid { class_id: 20, method_id: 10 }));
        // Invalid UTF-8 in a short string.
        assert_eq!(
            decode_method(&[0, 60, 0, 40, 0, 0, 1, 0xFF, 0, 0]),
            Err(MethodError::Invalid { class_id: 60, method_id: 40 })
        );
    }

    #[test]
    fn every_known_id_is_known_to_amq_protocol() {
        for class_id in 0..=100u16 {
            for method_id in 0..=130u16 {
                let known = is_known(class_id, method_id);
                // amq-protocol fails with an error (not Incomplete) only for unknown ids
                // when given enough zero bytes to satisfy any argument list.
                let mut payload = [0u8; 64];
                payload[..2].copy_from_slice(&class_id.to_be_bytes());
                payload[2..4].copy_from_slice(&method_id.to_be_bytes());
                let parsed = parse_class(&payload[..]).is_ok();
                assert_eq!(known, parsed, "{class_id}.{method_id}");
            }
        }
    }

    #[test]
    fn properties_round_trip() {
        let p = BasicProperties::default()
            .with_content_type("text/plain".into())
            .with_delivery_mode(2)
            .with_timestamp(12345);
        let mut out = BytesMut::new();
        out.extend_from_slice(&[0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
        wire::put_properties(&mut out, &p);
        assert_eq!(header_prefix(&out), Some(HeaderPrefix { class_id: 60, body_size: 5 }));
        assert_eq!(decode_properties(&out), Some(p));
        assert_eq!(header_prefix(&out[..13]), None);
    }
}
