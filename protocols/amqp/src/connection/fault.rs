//! Connection errors detected while reading: the [`ProtocolError`] reported to the broker
//! with its reply code, and the [`Fault`] that carries it into Connection.Close
//! (RabbitMQ-style text, offending class/method ids) with whether the byte stream can
//! still be followed afterwards.

use crate::frame::FrameError;
use crate::reply;

/// Protocol violations detected by the connection itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Wrong protocol header (the supported header was sent back).
    #[error("bad protocol header")]
    BadHeader,
    /// Frame error (501): a frame that cannot be delimited (unknown type, too large, bad
    /// frame end), or a payload that does not decode (as RabbitMQ: "cannot decode"), or a
    /// body frame running past the announced body size.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Frame that is not valid now (505 UNEXPECTED_FRAME): content frames out of
    /// sequence, frames on a channel other than 0 before the connection is open,
    /// heartbeats on a channel other than 0.
    #[error("unexpected frame: {0}")]
    Unexpected(&'static str),
    /// Channel number out of range or not open, a second Channel.Open, or a method on
    /// channel 0 that is not valid in the connection's state (504 CHANNEL_ERROR, as
    /// RabbitMQ).
    #[error("channel error: {0}")]
    Channel(&'static str),
    /// Handshake not completed in time.
    #[error("handshake timeout")]
    HandshakeTimeout,
    /// Nothing received for two heartbeat intervals.
    #[error("missed heartbeats")]
    HeartbeatTimeout,
    /// A method only a server sends, received on a channel (503 COMMAND_INVALID).
    #[error("command invalid: {0}")]
    CommandInvalid(&'static str),
    /// Unsupported SASL mechanism or malformed SASL response in Start-Ok (403
    /// ACCESS_REFUSED).
    #[error("access refused: {0}")]
    AccessRefused(&'static str),
    /// Tune-Ok outside the limits (530 NOT_ALLOWED, as RabbitMQ).
    #[error("not allowed: {0}")]
    NotAllowed(&'static str),
    /// A class/method id pair AMQP 0-9-1 does not define (540 NOT_IMPLEMENTED).
    #[error("not implemented: {0}")]
    NotImplemented(&'static str),
}

impl ProtocolError {
    /// AMQP reply code for Connection.Close (0: the connection is dropped without one).
    pub fn reply_code(&self) -> u16 {
        match self {
            ProtocolError::BadHeader => 0,
            ProtocolError::Frame(_) => reply::FRAME_ERROR,
            ProtocolError::Unexpected(_) => reply::UNEXPECTED_FRAME,
            ProtocolError::Channel(_) => reply::CHANNEL_ERROR,
            ProtocolError::HandshakeTimeout | ProtocolError::HeartbeatTimeout => 0,
            ProtocolError::CommandInvalid(_) => reply::COMMAND_INVALID,
            ProtocolError::AccessRefused(_) => reply::ACCESS_REFUSED,
            ProtocolError::NotAllowed(_) => reply::NOT_ALLOWED,
            ProtocolError::NotImplemented(_) => reply::NOT_IMPLEMENTED,
        }
    }
}

/// A connection error found in the client's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fault {
    /// Reported in `CloseReason::Error`.
    pub error: ProtocolError,
    /// Reply text (`"NAME - explanation"`).
    pub text: String,
    /// Class id of the offending method (0 if none).
    pub class_id: u16,
    /// Method id of the offending method (0 if none).
    pub method_id: u16,
    /// Frame boundaries are lost: discard all further input instead of looking for
    /// Close-Ok.
    pub lost_sync: bool,
}

impl Fault {
    /// A fault with the reply code of `error`.
    pub(super) fn new(error: ProtocolError, explanation: &str, ids: (u16, u16)) -> Self {
        let text = reply::text(error.reply_code(), explanation);
        Fault { error, text, class_id: ids.0, method_id: ids.1, lost_sync: false }
    }

    /// A frame that cannot be delimited (type, size, heartbeat payload, frame end).
    pub(super) fn framing(e: FrameError) -> Self {
        let text = reply::text(reply::FRAME_ERROR, &e.to_string());
        Fault { error: ProtocolError::Frame(e), text, class_id: 0, method_id: 0, lost_sync: true }
    }

    /// A delimited frame whose payload is malformed (501 FRAME_ERROR).
    pub(super) fn malformed(explanation: String, ids: (u16, u16)) -> Self {
        let text = reply::text(reply::FRAME_ERROR, &explanation);
        Fault {
            error: ProtocolError::Frame(FrameError::Malformed(explanation)),
            text,
            class_id: ids.0,
            method_id: ids.1,
            lost_sync: false,
        }
    }

    /// 505 UNEXPECTED_FRAME.
    pub(super) fn unexpected(explanation: &'static str, ids: (u16, u16)) -> Self {
        Fault::new(ProtocolError::Unexpected(explanation), explanation, ids)
    }

    /// 504 CHANNEL_ERROR.
    pub(super) fn channel(explanation: &'static str, ids: (u16, u16)) -> Self {
        Fault::new(ProtocolError::Channel(explanation), explanation, ids)
    }
}
