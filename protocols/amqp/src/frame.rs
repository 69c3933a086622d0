//! AMQP 0-9-1 frames: our own reader (frame header first, `frame_max` enforced before the
//! payload is buffered, body payloads sliced without copying) and writer; method and
//! content-header payloads go through `amq-protocol` (see the crate doc for where our
//! own code replaces it).
//!
//! A frame is `type:u8 channel:u16 size:u32 payload[size] 0xCE`. The reader looks at the
//! 7-byte header as soon as it is there: an unknown type, a size above `frame_max` or a
//! heartbeat with a payload is refused before any of the payload is waited for.

use bytes::{Buf, Bytes, BytesMut};

use crate::decode::{self, MethodError};
use crate::wire::{self, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD};
use crate::{AMQPClass, BasicProperties};

/// The AMQP 0-9-1 protocol header a client sends first.
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";

/// Length of a frame header (type, channel, size).
pub const FRAME_HEADER_SIZE: usize = 7;

/// Bytes a frame adds to its payload (header and frame-end octet): a body frame carries
/// at most `frame_max - FRAME_OVERHEAD` bytes.
pub const FRAME_OVERHEAD: usize = wire::FRAME_OVERHEAD;

/// Smallest `frame_max` a peer may negotiate (RabbitMQ's `FRAME_MIN_SIZE`).
pub const FRAME_MIN_SIZE: u32 = 4096;

/// One frame, as [`read_frame`] returns it and [`write_frame`] writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Method frame (type 1): one method with its arguments.
    Method {
        /// Channel it travels on (0 = the connection itself).
        channel: u16,
        /// The decoded method with its arguments.
        method: Box<AMQPClass>,
    },
    /// Content header frame (type 2): follows a content-bearing method such as Basic.Publish.
    Header {
        /// Channel of the method this content belongs to.
        channel: u16,
        /// Class id (60 for basic).
        class_id: u16,
        /// Total body size announced.
        body_size: u64,
        /// Basic content properties (content type, headers, delivery mode, ...).
        properties: Box<BasicProperties>,
    },
    /// A content body frame (payload sliced from the read buffer).
    Body {
        /// Channel of the content this frame continues.
        channel: u16,
        /// This frame's part of the body; the parts add up to the header's `body_size`.
        payload: Bytes,
    },
    /// Heartbeat frame (type 8): channel 0, empty payload.
    Heartbeat,
}

/// Why bytes could not be read as a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame is larger than the negotiated `frame_max` (checked before buffering).
    #[error("frame of {size} bytes exceeds frame_max {max}")]
    TooLarge {
        /// Announced payload size.
        size: u32,
        /// The `frame_max` it was checked against.
        max: u32,
    },
    /// Unknown frame type, missing frame-end octet, or an undecodable payload.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Kind of a frame, from its type octet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Method frame (type octet 1).
    Method,
    /// Content header frame (type octet 2).
    Header,
    /// Content body frame (type octet 3).
    Body,
    /// Heartbeat frame (type octet 8).
    Heartbeat,
}

/// Header of a complete frame at the front of a buffer (payload and frame end present and
/// the frame end checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    /// Frame type, from the type octet.
    pub kind: Kind,
    /// Channel number from the frame header.
    pub channel: u16,
    /// Payload length in bytes (without the 7-byte header and the frame-end octet).
    pub size: usize,
}

/// Looks at the front of `buf`: `Ok(None)` until a whole frame is there. The type, the
/// size (against `frame_max`) and a heartbeat's empty payload are checked from the
/// 7-byte header alone; the frame-end octet once the frame is complete.
pub(crate) fn peek(buf: &[u8], frame_max: u32) -> Result<Option<Head>, FrameError> {
    let Some(&[kind, c0, c1, s0, s1, s2, s3]) = buf.get(..FRAME_HEADER_SIZE) else {
        return Ok(None);
    };
    let kind = match kind {
        FRAME_METHOD => Kind::Method,
        FRAME_HEADER => Kind::Header,
        FRAME_BODY => Kind::Body,
        FRAME_HEARTBEAT => Kind::Heartbeat,
        other => return Err(FrameError::Malformed(format!("unknown frame type {other}"))),
    };
    let channel = u16::from_be_bytes([c0, c1]);
    let size32 = u32::from_be_bytes([s0, s1, s2, s3]);
    if size32 > frame_max {
        return Err(FrameError::TooLarge { size: size32, max: frame_max });
    }
    if kind == Kind::Heartbeat && size32 != 0 {
        return Err(FrameError::Malformed(format!("heartbeat frame with a payload of {size32} bytes")));
    }
    let size = usize::try_from(size32).map_err(|_| FrameError::TooLarge { size: size32, max: frame_max })?;
    let end_at = FRAME_HEADER_SIZE.saturating_add(size);
    match buf.get(end_at) {
        None => Ok(None),
        Some(&FRAME_END) => Ok(Some(Head { kind, channel, size })),
        Some(other) => Err(FrameError::Malformed(format!("invalid frame end octet 0x{other:02x}"))),
    }
}

/// Text for a method payload that did not decode.
pub(crate) fn method_error_text(e: MethodError) -> String {
    match e {
        MethodError::Truncated => "method frame shorter than its class and method ids".to_owned(),
        MethodError::Unknown { class_id, method_id } => format!("unknown method {class_id}.{method_id}"),
        MethodError::Invalid { class_id, method_id } => format!("cannot decode method {class_id}.{method_id}"),
    }
}

/// Reads one frame from the front of `buf`; `Ok(None)` when more bytes are needed.
///
/// A body payload is split off `buf` without copying. Errors found in the frame header
/// (type, size, heartbeat payload) or the frame-end octet consume nothing; a complete
/// frame whose payload does not decode is consumed, then reported. A heartbeat on a
/// channel other than 0 is malformed.
pub fn read_frame(buf: &mut BytesMut, frame_max: u32) -> Result<Option<Frame>, FrameError> {
    let Some(head) = peek(buf, frame_max)? else {
        return Ok(None);
    };
    buf.advance(FRAME_HEADER_SIZE);
    let channel = head.channel;
    if head.kind == Kind::Body {
        let payload = buf.split_to(head.size).freeze();
        buf.advance(1);
        return Ok(Some(Frame::Body { channel, payload }));
    }
    let result = match head.kind {
        Kind::Method => match buf.get(..head.size).map(decode::decode_method) {
            Some(Ok(method)) => Ok(Frame::Method { channel, method: Box::new(method) }),
            Some(Err(e)) => Err(FrameError::Malformed(method_error_text(e))),
            None => Err(FrameError::Malformed("truncated".into())),
        },
        Kind::Header => {
            let payload = buf.get(..head.size).unwrap_or_default();
            match (decode::header_prefix(payload), decode::decode_properties(payload)) {
                (Some(prefix), Some(properties)) => Ok(Frame::Header {
                    channel,
                    class_id: prefix.class_id,
                    body_size: prefix.body_size,
                    properties: Box::new(properties),
                }),
                _ => Err(FrameError::Malformed("cannot decode content header".into())),
            }
        }
        Kind::Heartbeat if channel == 0 => Ok(Frame::Heartbeat),
        Kind::Heartbeat => Err(FrameError::Malformed(format!("heartbeat on channel {channel}"))),
        Kind::Body => Err(FrameError::Malformed("unreachable".into())),
    };
    buf.advance(head.size + 1);
    result.map(Some)
}

/// Appends a method frame.
pub fn write_method(out: &mut BytesMut, channel: u16, method: &AMQPClass) {
    wire::put_method_frame(out, channel, method);
}

/// Appends a content header frame and the body split into frames of at most `frame_max`
/// (payloads of at most `frame_max - 8` bytes; no body frame for an empty body).
pub fn write_content(out: &mut BytesMut, channel: u16, properties: &BasicProperties, body: &Bytes, frame_max: u32) {
    wire::put_content(out, channel, properties, body, frame_max);
}

/// Appends a heartbeat frame.
pub fn write_heartbeat(out: &mut BytesMut) {
    wire::put_heartbeat(out);
}

/// Appends any frame as is (a header frame with its class id and body size, a body frame
/// with its payload whatever its length).
pub fn write_frame(out: &mut BytesMut, frame: &Frame) {
    use bytes::BufMut;
    match frame {
        Frame::Method { channel, method } => wire::put_method_frame(out, *channel, method),
        Frame::Header { channel, class_id, body_size, properties } => {
            let at = wire::begin_frame(out, FRAME_HEADER, *channel);
            out.put_u16(*class_id);
            out.put_u16(0);
            out.put_u64(*body_size);
            wire::put_properties(out, properties);
            wire::end_frame(out, at);
        }
        Frame::Body { channel, payload } => {
            let at = wire::begin_frame(out, FRAME_BODY, *channel);
            out.put_slice(payload);
            wire::end_frame(out, at);
        }
        Frame::Heartbeat => wire::put_heartbeat(out),
    }
}

#[cfg(test)]
mod tests;
