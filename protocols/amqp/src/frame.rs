//! AMQP 0-9-1 frames: our own reader (frame header first, `frame_max` enforced before the
//! payload is buffered, body payloads sliced without copying) and writer; method and
//! content-header payloads go through `amq-protocol`.

use bytes::{Bytes, BytesMut};

use crate::{AMQPClass, BasicProperties};

/// The AMQP 0-9-1 protocol header a client sends first.
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A method frame.
    Method {
        /// Channel.
        channel: u16,
        /// The method.
        method: Box<AMQPClass>,
    },
    /// A content header frame.
    Header {
        /// Channel.
        channel: u16,
        /// Class id (60 for basic).
        class_id: u16,
        /// Total body size announced.
        body_size: u64,
        /// Properties.
        properties: Box<BasicProperties>,
    },
    /// A content body frame (payload sliced from the read buffer).
    Body {
        /// Channel.
        channel: u16,
        /// Payload.
        payload: Bytes,
    },
    /// A heartbeat frame.
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
        /// The limit.
        max: u32,
    },
    /// Unknown frame type, missing frame-end octet, or an undecodable payload.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Reads one frame from the front of `buf`; `Ok(None)` when more bytes are needed.
pub fn read_frame(buf: &mut BytesMut, frame_max: u32) -> Result<Option<Frame>, FrameError> {
    let _ = (buf, frame_max);
    todo!()
}

/// Appends a method frame.
pub fn write_method(out: &mut BytesMut, channel: u16, method: &AMQPClass) {
    let _ = (out, channel, method);
    todo!()
}

/// Appends a content header frame and the body split into frames of at most `frame_max`.
pub fn write_content(out: &mut BytesMut, channel: u16, properties: &BasicProperties, body: &Bytes, frame_max: u32) {
    let _ = (out, channel, properties, body, frame_max);
    todo!()
}
