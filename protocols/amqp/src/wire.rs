//! Encoding: frames, field tables, basic properties and the methods a server sends, written
//! straight into the output `BytesMut` (no allocation beyond growing it).
//!
//! `amq-protocol`'s generators are not used on this path: they allocate per call (every
//! bit-flag method builds a `Vec<(String, bool)>`, every length prefix goes through a
//! temporary `Vec` when writing into a `Vec`), `debug_assert!` (panic) on short strings
//! over 255 bytes and truncate the length byte in release, and write
//! `AMQPValue::ShortString` with the type tag `'_'` that no peer can read. Methods only a
//! client sends fall back to `amq_protocol::protocol::gen_class`, written into a slice of
//! the output buffer.

use amq_protocol::frame::WriteContext;
use amq_protocol::protocol::{access, basic, channel, confirm, connection, exchange, gen_class, queue, tx, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable};
use bytes::{BufMut, BytesMut};

use crate::BasicProperties;

/// Method frame type.
pub(crate) const FRAME_METHOD: u8 = 1;
/// Content header frame type.
pub(crate) const FRAME_HEADER: u8 = 2;
/// Content body frame type.
pub(crate) const FRAME_BODY: u8 = 3;
/// Heartbeat frame type.
pub(crate) const FRAME_HEARTBEAT: u8 = 8;
/// Frame-end octet.
pub(crate) const FRAME_END: u8 = 0xCE;
/// Frame header (type, channel, size) plus the frame-end octet.
pub(crate) const FRAME_OVERHEAD: usize = 8;

/// `s` cut to at most 255 bytes on a character boundary (the longest short string).
pub(crate) fn short(s: &str) -> &str {
    if s.len() <= 255 {
        return s;
    }
    let mut end = 255;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// Writes a short string (cut to 255 bytes).
pub(crate) fn put_shortstr(out: &mut BytesMut, s: &str) {
    let s = short(s);
    out.put_u8(u8::try_from(s.len()).unwrap_or(u8::MAX));
    out.put_slice(s.as_bytes());
}

/// Writes a long string (cut to 4 GiB, which no frame can carry anyway).
pub(crate) fn put_longstr(out: &mut BytesMut, b: &[u8]) {
    let n = u32::try_from(b.len()).unwrap_or(u32::MAX);
    out.put_u32(n);
    out.put_slice(b.get(..n as usize).unwrap_or(b));
}

/// Reserves a 4-byte length at the end of `out`; returns its position for [`end_len`].
fn begin_len(out: &mut BytesMut) -> usize {
    let at = out.len();
    out.put_u32(0);
    at
}

/// Fills the length reserved at `at` with the number of bytes written after it.
fn end_len(out: &mut BytesMut, at: usize) {
    let n = out.len().saturating_sub(at + 4);
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    if let Some(slot) = out.get_mut(at..at + 4) {
        slot.copy_from_slice(&n.to_be_bytes());
    }
}

/// Writes a field table.
pub(crate) fn put_table(out: &mut BytesMut, table: &FieldTable) {
    let at = begin_len(out);
    for (key, value) in table {
        put_shortstr(out, key.as_str());
        put_value(out, value);
    }
    end_len(out, at);
}

fn put_array(out: &mut BytesMut, array: &FieldArray) {
    let at = begin_len(out);
    for value in array.as_slice() {
        put_value(out, value);
    }
    end_len(out, at);
}

/// Writes a typed field value with the type tags RabbitMQ uses (and `amq-protocol` reads).
pub(crate) fn put_value(out: &mut BytesMut, value: &AMQPValue) {
    match value {
        AMQPValue::Boolean(b) => {
            out.put_u8(b't');
            out.put_u8(u8::from(*b));
        }
        AMQPValue::ShortShortInt(v) => {
            out.put_u8(b'b');
            out.put_i8(*v);
        }
        AMQPValue::ShortShortUInt(v) => {
            out.put_u8(b'B');
            out.put_u8(*v);
        }
        AMQPValue::ShortInt(v) => {
            out.put_u8(b's');
            out.put_i16(*v);
        }
        AMQPValue::ShortUInt(v) => {
            out.put_u8(b'u');
            out.put_u16(*v);
        }
        AMQPValue::LongInt(v) => {
            out.put_u8(b'I');
            out.put_i32(*v);
        }
        AMQPValue::LongUInt(v) => {
            out.put_u8(b'i');
            out.put_u32(*v);
        }
        AMQPValue::LongLongInt(v) => {
            out.put_u8(b'l');
            out.put_i64(*v);
        }
        AMQPValue::Float(v) => {
            out.put_u8(b'f');
            out.put_f32(*v);
        }
        AMQPValue::Double(v) => {
            out.put_u8(b'd');
            out.put_f64(*v);
        }
        AMQPValue::DecimalValue(d) => {
            out.put_u8(b'D');
            out.put_u8(d.scale);
            out.put_u32(d.value);
        }
        // There is no short-string field type in 0-9-1 as RabbitMQ reads it ('s' is a
        // short int): send it as a long string.
        AMQPValue::ShortString(s) => {
            out.put_u8(b'S');
            put_longstr(out, s.as_str().as_bytes());
        }
        AMQPValue::LongString(s) => {
            out.put_u8(b'S');
            put_longstr(out, s.as_bytes());
        }
        AMQPValue::FieldArray(a) => {
            out.put_u8(b'A');
            put_array(out, a);
        }
        AMQPValue::Timestamp(t) => {
            out.put_u8(b'T');
            out.put_u64(*t);
        }
        AMQPValue::FieldTable(t) => {
            out.put_u8(b'F');
            put_table(out, t);
        }
        AMQPValue::ByteArray(a) => {
            out.put_u8(b'x');
            put_longstr(out, a.as_slice());
        }
        AMQPValue::Void => out.put_u8(b'V'),
    }
}

/// Writes basic properties: the flag word, then the present properties in order.
pub(crate) fn put_properties(out: &mut BytesMut, p: &BasicProperties) {
    out.put_u16(p.bitmask());
    let s = |out: &mut BytesMut, v: &Option<amq_protocol::types::ShortString>| {
        if let Some(v) = v {
            put_shortstr(out, v.as_str());
        }
    };
    s(out, p.content_type());
    s(out, p.content_encoding());
    if let Some(h) = p.headers() {
        put_table(out, h);
    }
    if let Some(v) = p.delivery_mode() {
        out.put_u8(*v);
    }
    if let Some(v) = p.priority() {
        out.put_u8(*v);
    }
    s(out, p.correlation_id());
    s(out, p.reply_to());
    s(out, p.expiration());
    s(out, p.message_id());
    if let Some(v) = p.timestamp() {
        out.put_u64(*v);
    }
    s(out, p.kind());
    s(out, p.user_id());
    s(out, p.app_id());
    s(out, p.cluster_id());
}

/// Starts a frame; returns the position of its size field for [`end_frame`].
pub(crate) fn begin_frame(out: &mut BytesMut, kind: u8, channel: u16) -> usize {
    out.put_u8(kind);
    out.put_u16(channel);
    begin_len(out)
}

/// Completes a frame started with [`begin_frame`]: size and frame-end octet.
pub(crate) fn end_frame(out: &mut BytesMut, size_at: usize) {
    end_len(out, size_at);
    out.put_u8(FRAME_END);
}

/// Writes a heartbeat frame.
pub(crate) fn put_heartbeat(out: &mut BytesMut) {
    out.put_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
}

/// Writes a whole method frame.
pub(crate) fn put_method_frame(out: &mut BytesMut, channel: u16, method: &AMQPClass) {
    let at = begin_frame(out, FRAME_METHOD, channel);
    put_method(out, method);
    end_frame(out, at);
}

/// Writes a content header frame and the body frames (payload at most `frame_max - 8`).
pub(crate) fn put_content(out: &mut BytesMut, channel: u16, properties: &BasicProperties, body: &[u8], frame_max: u32) {
    let at = begin_frame(out, FRAME_HEADER, channel);
    out.put_u16(60);
    out.put_u16(0);
    out.put_u64(body.len() as u64);
    put_properties(out, properties);
    end_frame(out, at);
    let chunk = (frame_max as usize).saturating_sub(FRAME_OVERHEAD).max(1);
    let frames = body.len().div_ceil(chunk);
    out.reserve(body.len() + frames * FRAME_OVERHEAD);
    for part in body.chunks(chunk) {
        let at = begin_frame(out, FRAME_BODY, channel);
        out.put_slice(part);
        end_frame(out, at);
    }
}

/// Writes one bit-flags octet.
fn flags(out: &mut BytesMut, bits: &[bool]) {
    let mut b = 0u8;
    for (i, set) in bits.iter().enumerate() {
        if *set {
            b |= 1 << i;
        }
    }
    out.put_u8(b);
}

/// Writes a method payload (class id, method id, arguments).
pub(crate) fn put_method(out: &mut BytesMut, method: &AMQPClass) {
    let start = out.len();
    if !put_server_method(out, method) {
        out.truncate(start);
        put_generated(out, method);
    }
}

/// The methods a server sends, written by hand; false if `method` is not one of them.
fn put_server_method(out: &mut BytesMut, method: &AMQPClass) -> bool {
    out.put_u16(method.get_amqp_class_id());
    out.put_u16(method.get_amqp_method_id());
    match method {
        AMQPClass::Connection(m) => match m {
            connection::AMQPMethod::Start(m) => {
                out.put_u8(m.version_major);
                out.put_u8(m.version_minor);
                put_table(out, &m.server_properties);
                put_longstr(out, m.mechanisms.as_bytes());
                put_longstr(out, m.locales.as_bytes());
            }
            connection::AMQPMethod::Secure(m) => put_longstr(out, m.challenge.as_bytes()),
            connection::AMQPMethod::Tune(m) => {
                out.put_u16(m.channel_max);
                out.put_u32(m.frame_max);
                out.put_u16(m.heartbeat);
            }
            connection::AMQPMethod::OpenOk(_) => put_shortstr(out, ""),
            connection::AMQPMethod::Close(m) => {
                out.put_u16(m.reply_code);
                put_shortstr(out, m.reply_text.as_str());
                out.put_u16(m.class_id);
                out.put_u16(m.method_id);
            }
            connection::AMQPMethod::Blocked(m) => put_shortstr(out, m.reason.as_str()),
            connection::AMQPMethod::CloseOk(_)
            | connection::AMQPMethod::Unblocked(_)
            | connection::AMQPMethod::UpdateSecretOk(_) => {}
            _ => return false,
        },
        AMQPClass::Channel(m) => match m {
            channel::AMQPMethod::OpenOk(_) => put_longstr(out, b""),
            channel::AMQPMethod::Flow(m) => flags(out, &[m.active]),
            channel::AMQPMethod::FlowOk(m) => flags(out, &[m.active]),
            channel::AMQPMethod::Close(m) => {
                out.put_u16(m.reply_code);
                put_shortstr(out, m.reply_text.as_str());
                out.put_u16(m.class_id);
                out.put_u16(m.method_id);
            }
            channel::AMQPMethod::CloseOk(_) => {}
            _ => return false,
        },
        AMQPClass::Access(access::AMQPMethod::RequestOk(_)) => out.put_u16(1),
        AMQPClass::Exchange(
            exchange::AMQPMethod::DeclareOk(_)
            | exchange::AMQPMethod::DeleteOk(_)
            | exchange::AMQPMethod::BindOk(_)
            | exchange::AMQPMethod::UnbindOk(_),
        ) => {}
        AMQPClass::Queue(m) => match m {
            queue::AMQPMethod::DeclareOk(m) => {
                put_shortstr(out, m.queue.as_str());
                out.put_u32(m.message_count);
                out.put_u32(m.consumer_count);
            }
            queue::AMQPMethod::PurgeOk(m) => out.put_u32(m.message_count),
            queue::AMQPMethod::DeleteOk(m) => out.put_u32(m.message_count),
            queue::AMQPMethod::BindOk(_) | queue::AMQPMethod::UnbindOk(_) => {}
            _ => return false,
        },
        AMQPClass::Basic(m) => match m {
            basic::AMQPMethod::QosOk(_) | basic::AMQPMethod::RecoverOk(_) => {}
            basic::AMQPMethod::ConsumeOk(m) => put_shortstr(out, m.consumer_tag.as_str()),
            basic::AMQPMethod::Cancel(m) => {
                put_shortstr(out, m.consumer_tag.as_str());
                flags(out, &[m.nowait]);
            }
            basic::AMQPMethod::CancelOk(m) => put_shortstr(out, m.consumer_tag.as_str()),
            basic::AMQPMethod::Return(m) => {
                put_return(out, m.reply_code, m.reply_text.as_str(), m.exchange.as_str(), m.routing_key.as_str())
            }
            basic::AMQPMethod::Deliver(m) => put_deliver(
                out,
                m.consumer_tag.as_str(),
                m.delivery_tag,
                m.redelivered,
                m.exchange.as_str(),
                m.routing_key.as_str(),
            ),
            basic::AMQPMethod::GetOk(m) => put_get_ok(
                out,
                m.delivery_tag,
                m.redelivered,
                m.exchange.as_str(),
                m.routing_key.as_str(),
                m.message_count,
            ),
            basic::AMQPMethod::GetEmpty(_) => put_shortstr(out, ""),
            basic::AMQPMethod::Ack(m) => {
                out.put_u64(m.delivery_tag);
                flags(out, &[m.multiple]);
            }
            basic::AMQPMethod::Nack(m) => {
                out.put_u64(m.delivery_tag);
                flags(out, &[m.multiple, m.requeue]);
            }
            _ => return false,
        },
        AMQPClass::Tx(tx::AMQPMethod::SelectOk(_) | tx::AMQPMethod::CommitOk(_) | tx::AMQPMethod::RollbackOk(_)) => {}
        AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(_)) => {}
        _ => return false,
    }
    true
}

/// Basic.Deliver arguments.
pub(crate) fn put_deliver(
    out: &mut BytesMut,
    consumer_tag: &str,
    delivery_tag: u64,
    redelivered: bool,
    exchange: &str,
    routing_key: &str,
) {
    put_shortstr(out, consumer_tag);
    out.put_u64(delivery_tag);
    flags(out, &[redelivered]);
    put_shortstr(out, exchange);
    put_shortstr(out, routing_key);
}

/// Basic.Get-Ok arguments.
pub(crate) fn put_get_ok(
    out: &mut BytesMut,
    delivery_tag: u64,
    redelivered: bool,
    exchange: &str,
    routing_key: &str,
    message_count: u32,
) {
    out.put_u64(delivery_tag);
    flags(out, &[redelivered]);
    put_shortstr(out, exchange);
    put_shortstr(out, routing_key);
    out.put_u32(message_count);
}

/// Basic.Return arguments.
pub(crate) fn put_return(out: &mut BytesMut, reply_code: u16, reply_text: &str, exchange: &str, routing_key: &str) {
    out.put_u16(reply_code);
    put_shortstr(out, reply_text);
    put_shortstr(out, exchange);
    put_shortstr(out, routing_key);
}

/// Basic.Ack / Basic.Nack (requeue false) frame for a publisher confirm.
pub(crate) fn put_confirm(out: &mut BytesMut, channel: u16, delivery_tag: u64, multiple: bool, ack: bool) {
    let at = begin_frame(out, FRAME_METHOD, channel);
    out.put_u16(60);
    out.put_u16(if ack { 80 } else { 120 });
    out.put_u64(delivery_tag);
    flags(out, &[multiple]);
    end_frame(out, at);
}

/// Channel.Close (channel > 0) or Connection.Close (channel 0), text cut to 255 bytes.
pub(crate) fn put_close(out: &mut BytesMut, channel: u16, code: u16, text: &str, class_id: u16, method_id: u16) {
    let at = begin_frame(out, FRAME_METHOD, channel);
    if channel == 0 {
        out.put_u16(10);
        out.put_u16(50);
    } else {
        out.put_u16(20);
        out.put_u16(40);
    }
    out.put_u16(code);
    put_shortstr(out, text);
    out.put_u16(class_id);
    out.put_u16(method_id);
    end_frame(out, at);
}

/// Connection.Blocked.
pub(crate) fn put_blocked(out: &mut BytesMut, reason: &str) {
    let at = begin_frame(out, FRAME_METHOD, 0);
    out.put_u16(10);
    out.put_u16(60);
    put_shortstr(out, reason);
    end_frame(out, at);
}

/// Connection.Unblocked.
pub(crate) fn put_unblocked(out: &mut BytesMut) {
    let at = begin_frame(out, FRAME_METHOD, 0);
    out.put_u16(10);
    out.put_u16(61);
    end_frame(out, at);
}

/// Any other method (only clients send them), through `amq-protocol`'s generator. It
/// writes into a scratch `Vec` (an allocation, on a path a server does not take in
/// practice): generating into a slice of the output, as cookie-factory allows, panics
/// (`split_at_mut`) instead of failing when fewer than 4 bytes are left at a length
/// prefix.
fn put_generated(out: &mut BytesMut, method: &AMQPClass) {
    if let Ok(ctx) = gen_class(method)(WriteContext::from(Vec::new())) {
        out.extend_from_slice(&ctx.write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_cuts_on_char_boundary() {
        let s = "é".repeat(200); // 400 bytes
        let cut = short(&s);
        assert!(cut.len() <= 255);
        assert_eq!(cut.len(), 254);
        assert_eq!(short("abc"), "abc");
    }

    #[test]
    fn generated_fallback_any_size() {
        // Sizes around every power of two: a slice-based generator would panic when a
        // length prefix falls in the last 3 bytes of its buffer.
        for n in (0..1100).chain(5000..5010) {
            let mut table = FieldTable::default();
            table.insert("k".into(), AMQPValue::LongString(vec![b'x'; n].into()));
            let m = AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: "q".into(),
                arguments: table,
                ..Default::default()
            }));
            let mut out = BytesMut::new();
            out.put_slice(b"prefix");
            put_method(&mut out, &m);
            let (rest, parsed) = amq_protocol::protocol::parse_class(&out[6..]).expect("parse");
            assert!(rest.is_empty());
            assert_eq!(parsed, m);
        }
    }
}
