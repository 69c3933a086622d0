//! Reading and writing [`Packet`]s per protocol level; `mqttbytes` 0.6 serves only as the
//! tests' reference implementation.
//!
//! Framing is two-step: the fixed header is checked (and a remaining length above the
//! limit refused) before the body is buffered; "need more bytes" is `Ok(None)`, not an error.
//!
//! Everything is our own code (see the crate doc for why `mqttbytes` is not on the
//! decode/encode path): `header` frames, `wire` reads and writes primitives,
//! `props` handles MQTT 5 properties, and one module per packet family does the rest.
//! Encoding is two-pass through the same function (count, then write), so the remaining
//! length can never disagree with the bytes written and nothing is written on error.

mod ack;
mod connect;
mod control;
mod header;
mod props;
mod publish;
mod subscribe;
mod wire;

use bytes::{BufMut, BytesMut};

use self::wire::{Counter, Reader, Sink, Writer, VARINT_MAX};
use crate::packet::{Packet, ProtocolLevel};
use crate::reason::{ReasonCode, ReasonContext};

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Remaining length announces more than the limit (checked before buffering).
    #[error("packet of {size} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Total packet size announced (fixed header plus remaining length), in bytes.
        size: usize,
        /// The `max_packet_size` it exceeds.
        max: usize,
    },
    /// Malformed packet (bad remaining length, bad UTF-8, truncated fields, ...).
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// Well-formed but violates the protocol (reserved flags, QoS 3, wildcard topic, ...).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A PUBLISH topic name that is well-formed but not valid (wildcards).
    #[error("invalid topic name: {0}")]
    TopicName(&'static str),
    /// CONNECT with an unknown protocol name or level.
    #[error("unsupported protocol name or level")]
    UnsupportedProtocol,
}

impl DecodeError {
    /// The MQTT 5 reason code to send in DISCONNECT / CONNACK for this error.
    pub fn reason(&self) -> ReasonCode {
        match self {
            DecodeError::TooLarge { .. } => ReasonCode::PACKET_TOO_LARGE,
            DecodeError::Malformed(_) => ReasonCode::MALFORMED_PACKET,
            DecodeError::Protocol(_) => ReasonCode::PROTOCOL_ERROR,
            DecodeError::TopicName(_) => ReasonCode::TOPIC_NAME_INVALID,
            DecodeError::UnsupportedProtocol => ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
        }
    }
}

/// Why a packet could not be encoded (nothing is written then).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The packet would exceed 268,435,455 bytes or the peer's maximum.
    #[error("packet too large to encode")]
    TooLarge,
    /// The packet does not exist at this protocol level.
    #[error("packet not valid at this protocol level")]
    WrongLevel,
}

/// Decodes one packet from the front of `buf`. `level` is `None` until CONNECT has been
/// read (then only CONNECT is accepted). Returns `Ok(None)` when more bytes are needed.
///
/// The fixed header is checked first: a packet whose total size exceeds
/// `max_packet_size` is refused with [`DecodeError::TooLarge`] before its body arrives.
/// On error the offending frame may or may not have been removed from `buf`; the
/// connection must be closed anyway.
pub fn decode(
    buf: &mut BytesMut,
    level: Option<ProtocolLevel>,
    max_packet_size: usize,
) -> Result<Option<Packet>, DecodeError> {
    let Some(h) = header::parse(buf)? else {
        return Ok(None);
    };
    header::check_flags(h.byte1, level)?;
    if h.total() > max_packet_size {
        return Err(DecodeError::TooLarge { size: h.total(), max: max_packet_size });
    }
    if level.is_none() && h.packet_type() != header::CONNECT {
        return Err(DecodeError::Protocol("first packet must be CONNECT"));
    }
    if buf.len() < h.total() {
        return Ok(None);
    }
    let frame = buf.split_to(h.total()).freeze();
    let mut r = Reader::new(frame.slice(h.header_len..));
    // Before CONNECT only CONNECT gets here, and it carries its own level.
    let level = level.unwrap_or(ProtocolLevel::V3_1_1);
    let packet = match h.packet_type() {
        header::CONNECT => Packet::Connect(Box::new(connect::read_connect(&mut r)?)),
        header::CONNACK => connect::read_connack(&mut r, level)?,
        header::PUBLISH => Packet::Publish(publish::read_publish(h.flags(), &mut r, level)?),
        header::PUBACK => {
            let a = ack::read_ack(&mut r, level, ReasonContext::PubAck)?;
            Packet::PubAck { pkid: a.pkid, reason: a.reason, reason_string: a.reason_string }
        }
        header::PUBREC => {
            let a = ack::read_ack(&mut r, level, ReasonContext::PubAck)?;
            Packet::PubRec { pkid: a.pkid, reason: a.reason, reason_string: a.reason_string }
        }
        header::PUBREL => {
            let a = ack::read_ack(&mut r, level, ReasonContext::PubRel)?;
            Packet::PubRel { pkid: a.pkid, reason: a.reason }
        }
        header::PUBCOMP => {
            let a = ack::read_ack(&mut r, level, ReasonContext::PubRel)?;
            Packet::PubComp { pkid: a.pkid, reason: a.reason }
        }
        header::SUBSCRIBE => Packet::Subscribe(subscribe::read_subscribe(&mut r, level)?),
        header::SUBACK => subscribe::read_sub_ack(&mut r, level, true)?,
        header::UNSUBSCRIBE => Packet::Unsubscribe(subscribe::read_unsubscribe(&mut r, level)?),
        header::UNSUBACK => subscribe::read_sub_ack(&mut r, level, false)?,
        header::PINGREQ | header::PINGRESP => {
            if !r.is_empty() {
                return Err(DecodeError::Malformed("PINGREQ/PINGRESP with a body"));
            }
            if h.packet_type() == header::PINGREQ {
                Packet::PingReq
            } else {
                Packet::PingResp
            }
        }
        header::DISCONNECT => Packet::Disconnect(control::read_disconnect(&mut r, level)?),
        header::AUTH => {
            if !level.is_v5() {
                return Err(DecodeError::Protocol("AUTH requires MQTT 5"));
            }
            control::read_auth(&mut r)?
        }
        _ => return Err(DecodeError::Protocol("reserved packet type")),
    };
    Ok(Some(packet))
}

/// Protocol name and raw level byte of a (possibly incomplete) CONNECT at the front of
/// `buf`, when enough bytes are there to read them.
pub(crate) fn peek_connect_protocol(buf: &[u8]) -> Option<(&[u8], u8)> {
    let h = header::parse(buf).ok()??;
    if h.packet_type() != header::CONNECT {
        return None;
    }
    connect::peek_protocol(buf.get(h.header_len..)?)
}

/// First byte of the fixed header of `packet`.
fn byte1(packet: &Packet) -> u8 {
    match packet {
        Packet::Connect(_) => 0x10,
        Packet::ConnAck { .. } => 0x20,
        Packet::Publish(p) => publish::byte1(p),
        Packet::PubAck { .. } => 0x40,
        Packet::PubRec { .. } => 0x50,
        Packet::PubRel { .. } => 0x62,
        Packet::PubComp { .. } => 0x70,
        Packet::Subscribe(_) => 0x82,
        Packet::SubAck { .. } => 0x90,
        Packet::Unsubscribe(_) => 0xA2,
        Packet::UnsubAck { .. } => 0xB0,
        Packet::PingReq => 0xC0,
        Packet::PingResp => 0xD0,
        Packet::Disconnect(_) => 0xE0,
        Packet::Auth { .. } => 0xF0,
    }
}

/// Variable header and payload of `packet`.
fn put_body<S: Sink>(packet: &Packet, level: ProtocolLevel, s: &mut S) -> Result<(), EncodeError> {
    match packet {
        Packet::Connect(c) => connect::put_connect(c, level, s),
        Packet::ConnAck { session_present, reason, properties } => {
            connect::put_connack(*session_present, *reason, properties, level, s)
        }
        Packet::Publish(p) => publish::put_publish(p, level, s),
        Packet::PubAck { pkid, reason, reason_string } | Packet::PubRec { pkid, reason, reason_string } => {
            ack::put_ack(*pkid, *reason, reason_string.as_deref(), level, s)
        }
        Packet::PubRel { pkid, reason } | Packet::PubComp { pkid, reason } => {
            ack::put_ack(*pkid, *reason, None, level, s)
        }
        Packet::Subscribe(sub) => subscribe::put_subscribe(sub, level, s),
        Packet::SubAck { pkid, reasons, reason_string } => {
            subscribe::put_sub_ack(*pkid, reasons, reason_string.as_deref(), level, true, s)
        }
        Packet::Unsubscribe(u) => subscribe::put_unsubscribe(u, level, s),
        Packet::UnsubAck { pkid, reasons, reason_string } => {
            subscribe::put_sub_ack(*pkid, reasons, reason_string.as_deref(), level, false, s)
        }
        Packet::PingReq | Packet::PingResp => {}
        Packet::Disconnect(d) => control::put_disconnect(d, level, s),
        Packet::Auth { reason, method, data } => {
            if !level.is_v5() {
                return Err(EncodeError::WrongLevel);
            }
            control::put_auth(*reason, method.as_deref(), data.as_ref(), s)
        }
    }
    Ok(())
}

/// Remaining length of `packet` at `level`, checked against the protocol limits.
fn remaining_len(packet: &Packet, level: ProtocolLevel) -> Result<usize, EncodeError> {
    let mut c = Counter::default();
    put_body(packet, level, &mut c)?;
    if c.overflow || c.len > VARINT_MAX {
        return Err(EncodeError::TooLarge);
    }
    Ok(c.len)
}

/// Size in bytes of the encoding of `packet` at `level`, without encoding it.
pub fn encoded_len(packet: &Packet, level: ProtocolLevel) -> Result<usize, EncodeError> {
    let rem = remaining_len(packet, level)?;
    Ok(1 + wire::varint_len(rem) + rem)
}

/// Appends the encoding of `packet` at `level` to `out`; returns the bytes written.
/// Nothing is written on error. Fields a level lacks (properties, reason codes on 3.x)
/// are left out.
pub fn encode(packet: &Packet, level: ProtocolLevel, out: &mut BytesMut) -> Result<usize, EncodeError> {
    let rem = remaining_len(packet, level)?;
    let total = 1 + wire::varint_len(rem) + rem;
    out.reserve(total);
    out.put_u8(byte1(packet));
    let mut w = Writer(out);
    w.put_varint(rem);
    put_body(packet, level, &mut w)?;
    Ok(total)
}

/// Moves encoded bytes waiting in `pending` to the end of `out` (a swap when `out` is
/// empty); true when there were any. Both connection sides hand their output on with it.
pub(crate) fn move_output(pending: &mut BytesMut, out: &mut BytesMut) -> bool {
    if pending.is_empty() {
        return false;
    }
    if out.is_empty() {
        std::mem::swap(out, pending);
    } else {
        out.extend_from_slice(pending);
        pending.clear();
    }
    true
}

#[cfg(test)]
mod tests;
