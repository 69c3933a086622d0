//! Reading and writing [`Packet`]s per protocol level, on top of `mqttbytes` 0.6.
//!
//! Framing is two-step: the fixed header is checked (and a remaining length above the
//! limit refused) before the body is buffered; "need more bytes" is `Ok(None)`, not an error.

use bytes::BytesMut;

use crate::packet::{Packet, ProtocolLevel};
use crate::reason::ReasonCode;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Remaining length announces more than the limit (checked before buffering).
    #[error("packet of {size} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Announced total size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Malformed packet (bad remaining length, bad UTF-8, truncated fields, ...).
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// Well-formed but violates the protocol (reserved flags, QoS 3, wildcard topic, ...).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
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
            DecodeError::UnsupportedProtocol => ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
        }
    }
}

/// Error while encoding.
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
pub fn decode(
    buf: &mut BytesMut,
    level: Option<ProtocolLevel>,
    max_packet_size: usize,
) -> Result<Option<Packet>, DecodeError> {
    let _ = (buf, level, max_packet_size);
    todo!()
}

/// Appends the encoding of `packet` at `level` to `out`; returns the bytes written.
pub fn encode(packet: &Packet, level: ProtocolLevel, out: &mut BytesMut) -> Result<usize, EncodeError> {
    let _ = (packet, level, out);
    todo!()
}
