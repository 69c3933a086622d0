//! Closing: channel exceptions ([`Connection::channel_error`]), connection exceptions
//! from the broker ([`Connection::connection_error`]) or from a protocol fault found in
//! the input, the close handshake (Close, then Close-Ok or [`CLOSE_TIMEOUT`]) and the
//! end of the connection ([`Event::Closed`]).

use std::time::{Duration, Instant};

use amq_protocol::protocol::connection;
use bytes::BytesMut;

use super::content::Assembly;
use super::fault::Fault;
use super::{CloseReason, Connection, Event, Phase, ProtocolError};
use crate::frame::Kind;
use crate::{decode, wire, AMQPClass};

/// How long the server waits for Close-Ok after sending Connection.Close (its own
/// [`Connection::connection_error`], a login refusal or a protocol error) before the
/// connection is finished anyway.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The close handshake in progress.
#[derive(Debug, Clone)]
pub(super) struct Closing {
    /// Finish at this instant without Close-Ok.
    pub deadline: Instant,
    /// Reported when finished.
    pub reason: CloseReason,
    /// Frame boundaries are lost: discard all input.
    pub lost_sync: bool,
}

impl Connection {
    /// Closes a channel with a channel exception (403, 404, 405, 406, ...): sends
    /// Channel.Close with code, text and the offending class/method ids; frames for the
    /// channel are then ignored until Close-Ok, which produces [`Event::ChannelClosed`].
    /// (A Channel.Close from the client meanwhile is answered with Close-Ok and ends the
    /// channel the same way.) Does nothing if the channel is not open.
    pub fn channel_error(&mut self, channel: u16, code: u16, text: &str, class_id: u16, method_id: u16) {
        if self.phase != Phase::Running {
            return;
        }
        let Some(ch) = self.channels.get_mut(channel) else {
            return;
        };
        if ch.closing {
            return;
        }
        ch.closing = true;
        ch.content = Assembly::Idle;
        wire::put_close(self.output(), channel, code, text, class_id, method_id);
        if self.opening == Some(channel) {
            // Refused instead of Open-Ok: what the client sent after Channel.Open goes on.
            self.opening = None;
            self.resume();
        }
    }

    /// Closes the connection with a connection exception (320, 501, 502, 503, 504, 505,
    /// 530, 540, ...): sends Connection.Close and waits (up to [`CLOSE_TIMEOUT`]) for
    /// Close-Ok, then reports [`CloseReason::ServerClosed`]. Before the protocol header
    /// the connection is finished at once.
    pub fn connection_error(&mut self, code: u16, text: &str, class_id: u16, method_id: u16) {
        match self.phase {
            Phase::Closing | Phase::Closed => {}
            Phase::Header => self.finish(CloseReason::ServerClosed { code }),
            _ => self.send_close(code, text, (class_id, method_id), CloseReason::ServerClosed { code }, false),
        }
    }

    /// Closes the connection for a protocol error.
    pub(super) fn fail(&mut self, fault: Fault) {
        if matches!(self.phase, Phase::Closing | Phase::Closed) {
            return;
        }
        let code = fault.error.reply_code();
        if code == 0 || self.phase == Phase::Header {
            self.drop_connection(fault.error);
            return;
        }
        self.send_close(
            code,
            &fault.text,
            (fault.class_id, fault.method_id),
            CloseReason::Error(fault.error),
            fault.lost_sync,
        );
    }

    /// Sends Connection.Close and waits for Close-Ok.
    pub(super) fn send_close(&mut self, code: u16, text: &str, ids: (u16, u16), reason: CloseReason, lost_sync: bool) {
        wire::put_close(self.output(), 0, code, text, ids.0, ids.1);
        self.phase = Phase::Closing;
        self.held = BytesMut::new();
        self.opening = None;
        self.closing = Some(Closing { deadline: self.clock + CLOSE_TIMEOUT, reason, lost_sync });
    }

    /// Ends the connection without Connection.Close (timeouts, bad header).
    pub(super) fn drop_connection(&mut self, error: ProtocolError) {
        self.finish(CloseReason::Error(error));
    }

    /// Reports the end of the connection.
    pub(super) fn finish(&mut self, reason: CloseReason) {
        if self.phase == Phase::Closed {
            return;
        }
        self.phase = Phase::Closed;
        self.closing = None;
        self.held = BytesMut::new();
        self.events.push_back(Event::Closed(reason));
    }

    /// While closing, only Connection.Close and Close-Ok count.
    pub(super) fn on_frame_closing(&mut self, kind: Kind, channel: u16, payload: &[u8]) {
        if kind != Kind::Method || channel != 0 {
            return;
        }
        let reason = match &self.closing {
            Some(c) => c.reason.clone(),
            None => return,
        };
        match decode::method_ids(payload) {
            Some((10, 50)) => {
                wire::put_method_frame(
                    self.output(),
                    0,
                    &AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
                );
                self.finish(reason);
            }
            Some((10, 51)) => self.finish(reason),
            _ => {}
        }
    }
}
