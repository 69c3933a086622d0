//! The per-connection AMQP 0-9-1 state machine (server side).
//!
//! Owns what the protocol defines about one connection: the protocol header check, the
//! Start/Start-Ok/Tune/Tune-Ok/Open handshake (SASL PLAIN and AMQPLAIN parsed here, checked
//! by the broker), heartbeats both ways, channel lifecycle (open, close both ways,
//! flow), content assembly (method + header + body frames into one message), publisher
//! confirm sequence numbers, server-initiated channel and connection closes with reply
//! code, text and class/method ids, and `connection.blocked`/`unblocked`. The broker
//! decides what methods mean (exchanges, queues, consumers); this type decides how they
//! look on the wire.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::frame::FrameError;
use crate::{AMQPClass, BasicProperties, FieldTable, ShortString};

/// Server-side limits and identity.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest frame accepted and proposed in Tune (the client may ask for less).
    pub frame_max: u32,
    /// Most channels per connection proposed in Tune.
    pub channel_max: u16,
    /// Heartbeat interval proposed in Tune, seconds (0 = none).
    pub heartbeat: u16,
    /// Time allowed from the socket's accept to a completed Open.
    pub handshake_timeout: Duration,
    /// `product` in the server properties.
    pub product: String,
    /// `version` in the server properties.
    pub version: String,
    /// Largest message body accepted: a content header announcing more closes the channel
    /// with 406 PRECONDITION_FAILED (as RabbitMQ does) and its body frames are discarded.
    pub max_message_size: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            frame_max: 131_072,
            channel_max: 2047,
            heartbeat: 60,
            handshake_timeout: Duration::from_secs(10),
            product: "FerryMQ".into(),
            version: String::new(),
            max_message_size: 128 * 1024 * 1024,
        }
    }
}

/// Why the connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The client sent Connection.Close (and got Close-Ok).
    ClientClosed {
        /// Reply code the client sent.
        code: u16,
        /// Reply text.
        text: String,
    },
    /// The broker closed it ([`Connection::connection_error`] or shutdown) and the
    /// handshake of the close finished or timed out.
    ServerClosed {
        /// Reply code sent.
        code: u16,
    },
    /// A protocol error detected here (bad header, bad frame, heartbeat timeout, ...);
    /// Connection.Close with the matching code was queued when the protocol allows it.
    Error(ProtocolError),
}

/// Protocol violations detected by the connection itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Wrong protocol header (the supported header was sent back).
    #[error("bad protocol header")]
    BadHeader,
    /// Frame error (501).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Frame or method that is not valid now (503 COMMAND_INVALID / 505 UNEXPECTED_FRAME).
    #[error("unexpected frame: {0}")]
    Unexpected(&'static str),
    /// Channel number out of range or not open (504 CHANNEL_ERROR).
    #[error("channel error: {0}")]
    Channel(&'static str),
    /// Handshake not completed in time.
    #[error("handshake timeout")]
    HandshakeTimeout,
    /// Nothing received for two heartbeat intervals.
    #[error("missed heartbeats")]
    HeartbeatTimeout,
}

impl ProtocolError {
    /// AMQP reply code for Connection.Close.
    pub fn reply_code(&self) -> u16 {
        match self {
            ProtocolError::BadHeader => 0,
            ProtocolError::Frame(_) => 501,
            ProtocolError::Unexpected(_) => 505,
            ProtocolError::Channel(_) => 504,
            ProtocolError::HandshakeTimeout | ProtocolError::HeartbeatTimeout => 0,
        }
    }
}

/// What the connection reports to the broker.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Start-Ok arrived: check the credentials, then call [`Connection::accept_login`] or
    /// [`Connection::refuse_login`]. (An unsupported mechanism is refused here.)
    Login {
        /// `PLAIN` or `AMQPLAIN`.
        mechanism: String,
        /// User name.
        username: String,
        /// Password.
        password: String,
        /// Client properties (capabilities, product, ...).
        client_properties: FieldTable,
    },
    /// Connection.Open: call [`Connection::open_ok`] or [`Connection::connection_error`]
    /// (530 NOT_ALLOWED for an unknown vhost).
    Open {
        /// Virtual host.
        vhost: String,
    },
    /// A channel was opened (Open-Ok already sent).
    ChannelOpened {
        /// Channel.
        channel: u16,
    },
    /// A channel ended: the client closed it (Close-Ok sent), or it acknowledged the
    /// broker's [`Connection::channel_error`]. Its consumers are gone and its unacked
    /// deliveries must be requeued; its delivery tags and confirm counter restart.
    ChannelClosed {
        /// Channel.
        channel: u16,
    },
    /// Channel.Flow from the client (Flow-Ok already sent): stop/resume deliveries.
    ChannelFlow {
        /// Channel.
        channel: u16,
        /// True to resume.
        active: bool,
    },
    /// Confirm.Select (Select-Ok already sent unless nowait): from now on every publish on
    /// the channel carries a confirm sequence number.
    ConfirmSelected {
        /// Channel.
        channel: u16,
    },
    /// A method for the broker on an open channel: exchange.*, queue.*, basic.qos/
    /// consume/cancel/get/ack/nack/reject/recover(-async), tx.*. The broker answers with
    /// [`Connection::reply`] (unless the method's `nowait` is set) or
    /// [`Connection::channel_error`].
    Method {
        /// Channel.
        channel: u16,
        /// The method.
        method: Box<AMQPClass>,
    },
    /// A complete message: Basic.Publish with its content header and body.
    Publish(Box<Publish>),
    /// The connection is finished: flush the output and close the socket.
    Closed(CloseReason),
}

/// A published message, assembled.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// Channel.
    pub channel: u16,
    /// Exchange name ("" = default exchange).
    pub exchange: ShortString,
    /// Routing key.
    pub routing_key: ShortString,
    /// Mandatory flag.
    pub mandatory: bool,
    /// Immediate flag.
    pub immediate: bool,
    /// Content properties.
    pub properties: BasicProperties,
    /// Body: the body frame's payload when it came in one frame (no copy), else the
    /// frames concatenated once.
    pub body: Bytes,
    /// Confirm sequence number (delivery tag of the confirm) when the channel is in
    /// confirm mode.
    pub confirm_tag: Option<u64>,
}

/// A message the broker sends to a consumer or as a Get-Ok / Return.
#[derive(Debug, Clone)]
pub struct Content<'a> {
    /// Exchange it was published to.
    pub exchange: &'a str,
    /// Routing key it was published with.
    pub routing_key: &'a str,
    /// Properties.
    pub properties: &'a BasicProperties,
    /// Body (written into body frames split at the negotiated frame_max).
    pub body: &'a Bytes,
}

/// State machine of one AMQP connection (server side).
#[derive(Debug)]
pub struct Connection {
    _private: (),
}

impl Connection {
    /// A new connection whose socket was accepted at `now`.
    pub fn new(config: Config, now: Instant) -> Self {
        let _ = (config, now);
        todo!()
    }

    /// Consumes every complete frame at the front of `buf` (the protocol header first),
    /// leaving a partial one. After a connection error nothing more is consumed.
    pub fn handle_input(&mut self, buf: &mut BytesMut, now: Instant) {
        let _ = (buf, now);
        todo!()
    }

    /// Next event for the broker.
    pub fn poll_event(&mut self) -> Option<Event> {
        todo!()
    }

    /// Moves pending output bytes into `out`; true if any were added.
    pub fn poll_transmit(&mut self, out: &mut BytesMut) -> bool {
        let _ = out;
        todo!()
    }

    /// Bytes of output waiting for [`Connection::poll_transmit`].
    pub fn pending_output(&self) -> usize {
        todo!()
    }

    /// Earliest instant at which [`Connection::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }

    /// Advances timers: handshake timeout, sending heartbeats, missed-heartbeat close.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    /// True once finished: flush the output, then close the socket.
    pub fn is_closed(&self) -> bool {
        todo!()
    }

    /// Negotiated frame_max (after Tune-Ok).
    pub fn frame_max(&self) -> u32 {
        todo!()
    }

    /// Accepts the login: sends Connection.Tune.
    pub fn accept_login(&mut self) {
        todo!()
    }

    /// Refuses the login: Connection.Close 403 ACCESS_REFUSED with `text` (clients that
    /// announce `authentication_failure_close` expect exactly this), then closes.
    pub fn refuse_login(&mut self, text: &str) {
        let _ = text;
        todo!()
    }

    /// Answers Connection.Open with Open-Ok.
    pub fn open_ok(&mut self) {
        todo!()
    }

    /// Sends a method on an open channel (an -Ok reply, Basic.Cancel from the server, ...).
    pub fn reply(&mut self, channel: u16, method: AMQPClass) {
        let _ = (channel, method);
        todo!()
    }

    /// Sends Basic.Deliver with the content.
    pub fn deliver(&mut self, channel: u16, consumer_tag: &str, delivery_tag: u64, redelivered: bool, content: Content<'_>) {
        let _ = (channel, consumer_tag, delivery_tag, redelivered, content);
        todo!()
    }

    /// Sends Basic.Get-Ok with the content.
    pub fn get_ok(&mut self, channel: u16, delivery_tag: u64, redelivered: bool, message_count: u32, content: Content<'_>) {
        let _ = (channel, delivery_tag, redelivered, message_count, content);
        todo!()
    }

    /// Sends Basic.Return (e.g. 312 NO_ROUTE for a mandatory publish) with the content.
    pub fn basic_return(&mut self, channel: u16, reply_code: u16, reply_text: &str, content: Content<'_>) {
        let _ = (channel, reply_code, reply_text, content);
        todo!()
    }

    /// Sends a publisher confirm: Basic.Ack (`ack`) or Basic.Nack for `delivery_tag`
    /// (and every earlier one when `multiple`).
    pub fn confirm(&mut self, channel: u16, delivery_tag: u64, multiple: bool, ack: bool) {
        let _ = (channel, delivery_tag, multiple, ack);
        todo!()
    }

    /// Closes a channel with a channel exception (403, 404, 405, 406, ...): sends
    /// Channel.Close with code, text and the offending class/method ids; frames for the
    /// channel are then ignored until Close-Ok, which produces [`Event::ChannelClosed`].
    pub fn channel_error(&mut self, channel: u16, code: u16, text: &str, class_id: u16, method_id: u16) {
        let _ = (channel, code, text, class_id, method_id);
        todo!()
    }

    /// Closes the connection with a connection exception (320, 501, 502, 503, 504, 505,
    /// 530, 540, ...): sends Connection.Close and waits (bounded) for Close-Ok.
    pub fn connection_error(&mut self, code: u16, text: &str, class_id: u16, method_id: u16) {
        let _ = (code, text, class_id, method_id);
        todo!()
    }

    /// Sends Connection.Blocked (memory alarm) if the client announced the capability.
    pub fn blocked(&mut self, reason: &str) {
        let _ = reason;
        todo!()
    }

    /// Sends Connection.Unblocked if Blocked was sent.
    pub fn unblocked(&mut self) {
        todo!()
    }
}
