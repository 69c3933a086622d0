//! Connection errors detected while reading: the [`ProtocolError`] reported to the broker
//! plus what goes into Connection.Close (RabbitMQ-style text, offending class/method ids)
//! and whether the byte stream can still be followed afterwards.

use super::ProtocolError;
use crate::frame::FrameError;
use crate::reply;

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
