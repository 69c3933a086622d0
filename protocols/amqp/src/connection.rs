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

mod channels;
mod fault;
mod handshake;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use amq_protocol::protocol::{access, basic, channel, confirm, connection, tx};
use bytes::{Buf, Bytes, BytesMut};

use self::channels::{Assembly, Channel, Channels, Mode, Partial};
use self::fault::Fault;
use crate::decode::{self, MethodError};
use crate::frame::{self, FrameError, Kind, FRAME_HEADER_SIZE};
use crate::{reply, sasl, wire};
use crate::{AMQPClass, BasicProperties, FieldTable, ShortString};

/// How long the server waits for Close-Ok after sending Connection.Close (its own
/// [`Connection::connection_error`], a login refusal or a protocol error) before the
/// connection is finished anyway.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Server-side limits and identity.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest frame accepted and proposed in Tune (the client may ask for less; values
    /// under 4096, including 0, are raised to 4096). Also the limit before Tune-Ok.
    pub frame_max: u32,
    /// Highest channel number proposed in Tune (0 = 65535).
    pub channel_max: u16,
    /// Heartbeat interval proposed in Tune, seconds (0 = none).
    pub heartbeat: u16,
    /// Time allowed from the socket's accept to a completed Open (Open-Ok sent).
    pub handshake_timeout: Duration,
    /// `product` (and `cluster_name`) in the server properties.
    pub product: String,
    /// `version` in the server properties (empty: this crate's version).
    pub version: String,
    /// Largest message body accepted: a content header announcing more closes the channel
    /// with 406 PRECONDITION_FAILED (as RabbitMQ does) and its body frames are discarded.
    pub max_message_size: u64,
    /// Offer SASL `EXTERNAL` too (the connection carries a verified client certificate;
    /// the user comes from it, decided by the caller at [`Event::Login`]).
    pub sasl_external: bool,
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
            sasl_external: false,
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
        /// Reply text the client sent (free-form, for logs).
        text: String,
    },
    /// The broker closed it ([`Connection::connection_error`] or shutdown) and the
    /// handshake of the close finished or timed out.
    ServerClosed {
        /// Reply code of the broker's Connection.Close.
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

/// What the connection reports to the broker.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Start-Ok arrived: check the credentials, then call [`Connection::accept_login`] or
    /// [`Connection::refuse_login`]. (An unsupported mechanism is refused here.)
    Login {
        /// `PLAIN` or `AMQPLAIN`.
        mechanism: String,
        /// User name from the SASL response (PLAIN authcid, AMQPLAIN `LOGIN`).
        username: String,
        /// Password from the SASL response, in clear (PLAIN passwd, AMQPLAIN `PASSWORD`).
        password: String,
        /// Client properties (capabilities, product, ...).
        client_properties: FieldTable,
    },
    /// Connection.Open: call [`Connection::open_ok`] or [`Connection::connection_error`]
    /// (530 NOT_ALLOWED for an unknown vhost).
    Open {
        /// Virtual host named in Connection.Open, as the client sent it (e.g. `/`).
        vhost: String,
    },
    /// Channel.Open: call [`Connection::channel_open_ok`] or
    /// [`Connection::connection_error`] (530 NOT_ALLOWED past a channel limit); input is
    /// held until then.
    ChannelOpened {
        /// Number of the channel just opened (1..=negotiated channel_max).
        channel: u16,
    },
    /// A channel ended: the client closed it (Close-Ok sent), or it acknowledged the
    /// broker's [`Connection::channel_error`]. Its consumers are gone and its unacked
    /// deliveries must be requeued; its delivery tags and confirm counter restart.
    ChannelClosed {
        /// Number of the channel that ended; a new Channel.Open may reuse it.
        channel: u16,
    },
    /// Channel.Flow from the client (Flow-Ok already sent): stop/resume deliveries.
    ChannelFlow {
        /// Channel whose deliveries stop or resume.
        channel: u16,
        /// True to resume.
        active: bool,
    },
    /// Confirm.Select (Select-Ok already sent unless nowait): from now on every publish on
    /// the channel carries a confirm sequence number.
    ConfirmSelected {
        /// Channel now in confirm mode: its publishes carry [`Publish::confirm_tag`].
        channel: u16,
    },
    /// A method for the broker on an open channel: exchange.*, queue.*, basic.qos/
    /// consume/cancel/get/ack/nack/reject/recover(-async), tx.*. The broker answers with
    /// [`Connection::reply`] (unless the method's `nowait` is set) or
    /// [`Connection::channel_error`]. Also Connection.Update-Secret on channel 0 (answer
    /// `reply(0, UpdateSecretOk)` or [`Connection::connection_error`]).
    ///
    /// Tx.Select is reported here after the connection checked that the channel is not
    /// in confirm mode; Confirm.Select likewise checks tx mode (406 channel error).
    Method {
        /// Channel the method arrived on (0 only for Connection.Update-Secret).
        channel: u16,
        /// The decoded method with its arguments.
        method: Box<AMQPClass>,
    },
    /// A complete message: Basic.Publish with its content header and body.
    Publish(Box<Publish>),
    /// The connection is finished: flush the output and close the socket. Reported once;
    /// every channel still open is gone with it (no [`Event::ChannelClosed`] for them).
    Closed(CloseReason),
}

/// A published message, assembled.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// Channel it was published on: confirms and Basic.Return go back there.
    pub channel: u16,
    /// Exchange name ("" = default exchange).
    pub exchange: ShortString,
    /// Routing key of Basic.Publish, matched against the exchange's bindings.
    pub routing_key: ShortString,
    /// Basic.Publish `mandatory`: an unroutable message comes back as Basic.Return (312 NO_ROUTE).
    pub mandatory: bool,
    /// Basic.Publish `immediate`; the broker refuses `true` with 540 NOT_IMPLEMENTED, as RabbitMQ.
    pub immediate: bool,
    /// Content header properties (content type, headers, delivery mode, expiration, ...).
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
    /// Content header properties, written into the content header frame.
    pub properties: &'a BasicProperties,
    /// Body (written into body frames split at the negotiated frame_max).
    pub body: &'a Bytes,
}

/// Where the connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the protocol header.
    Header,
    /// Start sent, waiting for Start-Ok.
    StartOk,
    /// [`Event::Login`] reported, waiting for the broker; input is held.
    Login,
    /// Tune sent, waiting for Tune-Ok.
    TuneOk,
    /// Tuned, waiting for Connection.Open.
    Open,
    /// [`Event::Open`] reported, waiting for the broker; input is held.
    OpenOk,
    /// Open-Ok sent: channels may be used.
    Running,
    /// Connection.Close sent, waiting for Close-Ok (bounded by [`CLOSE_TIMEOUT`]).
    Closing,
    /// [`Event::Closed`] reported: no more input is consumed.
    Closed,
}

impl Phase {
    /// Name used in "unexpected method in connection state X" (RabbitMQ's names).
    fn name(self) -> &'static str {
        match self {
            Phase::Header | Phase::StartOk | Phase::Login => "starting",
            Phase::TuneOk => "tuning",
            Phase::Open | Phase::OpenOk => "opening",
            Phase::Running => "running",
            Phase::Closing | Phase::Closed => "closing",
        }
    }

    /// Input is held until the broker answers the last event.
    fn holds_input(self) -> bool {
        matches!(self, Phase::Login | Phase::OpenOk)
    }

    /// Tune-Ok was received (heartbeats run) and the connection is not closing.
    fn tuned(self) -> bool {
        matches!(self, Phase::Open | Phase::OpenOk | Phase::Running)
    }
}

/// The close handshake in progress.
#[derive(Debug, Clone)]
struct Closing {
    /// Finish at this instant without Close-Ok.
    deadline: Instant,
    /// Reported when finished.
    reason: CloseReason,
    /// Frame boundaries are lost: discard all input.
    lost_sync: bool,
}

/// Connection.Blocked state.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Blocked {
    /// Not blocked: initially, and after [`Connection::unblocked`].
    No,
    /// [`Connection::blocked`] called before Open-Ok: sent then, with this reason.
    Pending(String),
    /// Connection.Blocked sent.
    Sent,
}

/// Offending class/method ids of Basic.Publish, for content errors.
const PUBLISH_IDS: (u16, u16) = (60, 40);

/// State machine of one AMQP connection (server side).
///
/// Between [`Event::Login`] and [`Connection::accept_login`] / [`Connection::refuse_login`],
/// between [`Event::Open`] and [`Connection::open_ok`] / [`Connection::connection_error`],
/// and between [`Event::ChannelOpened`] and [`Connection::channel_open_ok`] /
/// [`Connection::connection_error`], input is held (up to four frames of `frame_max`;
/// more is a 505 connection error) and processed by the answer, so pipelined frames are
/// handled after it, as RabbitMQ does. Events produced then are polled as usual.
///
/// Output for a channel that is not open (or closing after
/// [`Connection::channel_error`]) and output before Open-Ok or after the connection
/// started closing is dropped: the broker learns about channel ends through
/// [`Event::ChannelClosed`] and requeues what it delivered there.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    phase: Phase,
    /// Negotiated frame_max (the server's before Tune-Ok).
    frame_max: u32,
    /// Highest channel number allowed: negotiated in Tune-Ok (the server's until then).
    channel_max: u16,
    /// Negotiated heartbeat, seconds.
    heartbeat: u16,
    /// Latest instant seen (new / handle_input / handle_timeout).
    clock: Instant,
    handshake_deadline: Instant,
    last_recv: Instant,
    /// When output was last produced (at the clock of the time).
    last_send: Instant,
    /// Length of the partial frame left in the caller's buffer by the last call.
    left_len: usize,
    held: BytesMut,
    events: VecDeque<Event>,
    out: BytesMut,
    channels: Channels,
    /// The client announced `connection.blocked`.
    cap_blocked: bool,
    blocked: Blocked,
    closing: Option<Closing>,
    /// A channel whose Channel.Open waits for the broker's answer (input is held).
    opening: Option<u16>,
}

impl Connection {
    /// A new connection whose socket was accepted at `now`.
    pub fn new(config: Config, now: Instant) -> Self {
        Connection {
            frame_max: handshake::server_frame_max(&config),
            channel_max: handshake::server_channel_max(&config),
            // Clamped: `Instant + Duration` panics on overflow.
            handshake_deadline: now + config.handshake_timeout.min(Duration::from_secs(365 * 86_400)),
            config,
            phase: Phase::Header,
            heartbeat: 0,
            clock: now,
            last_recv: now,
            last_send: now,
            left_len: 0,
            held: BytesMut::new(),
            events: VecDeque::new(),
            out: BytesMut::new(),
            channels: Channels::default(),
            cap_blocked: false,
            blocked: Blocked::No,
            closing: None,
            opening: None,
        }
    }

    /// Consumes every complete frame at the front of `buf` (the protocol header first),
    /// leaving a partial one. While waiting for the broker's answer to [`Event::Login`]
    /// or [`Event::Open`], input is moved into the connection and processed by the
    /// answer. While closing (Connection.Close sent), frames are read only to find
    /// Close-Ok or the client's own Close, and discarded; after a framing error everything
    /// is discarded. Once closed nothing more is consumed.
    pub fn handle_input(&mut self, buf: &mut BytesMut, now: Instant) {
        if self.phase == Phase::Closed {
            return;
        }
        self.tick(now);
        if buf.len() > self.left_len {
            self.last_recv = self.clock;
        }
        if !self.held.is_empty() {
            self.held.extend_from_slice(buf);
            buf.clear();
            std::mem::swap(buf, &mut self.held);
        }
        self.process(buf);
        if self.holds_input() && !buf.is_empty() {
            if buf.len() > self.hold_limit() {
                self.fail(Fault::unexpected("too much input before the handshake completed", (0, 0)));
                buf.clear();
            } else {
                std::mem::swap(buf, &mut self.held);
            }
        }
        self.left_len = buf.len();
    }

    /// Next event for the broker.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Moves pending output bytes into `out`; true if any were added.
    pub fn poll_transmit(&mut self, out: &mut BytesMut) -> bool {
        if self.out.is_empty() {
            return false;
        }
        if out.is_empty() {
            std::mem::swap(out, &mut self.out);
        } else {
            out.extend_from_slice(&self.out);
            self.out.clear();
        }
        true
    }

    /// Bytes of output waiting for [`Connection::poll_transmit`].
    pub fn pending_output(&self) -> usize {
        self.out.len()
    }

    /// Earliest instant at which [`Connection::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closed => None,
            Phase::Closing => self.closing.as_ref().map(|c| c.deadline),
            phase => {
                let handshake = (phase != Phase::Running).then_some(self.handshake_deadline);
                let heartbeat = self.heartbeat_deadlines().map(|(send, recv)| send.min(recv));
                match (handshake, heartbeat) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
        }
    }

    /// Advances timers: handshake timeout, sending heartbeats, missed-heartbeat close,
    /// the close handshake's timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.phase == Phase::Closed {
            return;
        }
        self.tick(now);
        if self.phase == Phase::Closing {
            if let Some(c) = &self.closing {
                if now >= c.deadline {
                    let reason = c.reason.clone();
                    self.finish(reason);
                }
            }
            return;
        }
        if self.phase != Phase::Running && now >= self.handshake_deadline {
            self.drop_connection(ProtocolError::HandshakeTimeout);
            return;
        }
        if let Some((send, recv)) = self.heartbeat_deadlines() {
            if now >= recv {
                self.drop_connection(ProtocolError::HeartbeatTimeout);
            } else if now >= send {
                wire::put_heartbeat(self.output());
            }
        }
    }

    /// True once finished: flush the output, then close the socket.
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Negotiated frame_max (after Tune-Ok; the server's limit before).
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// Negotiated channel_max (after Tune-Ok; the server's limit before).
    pub fn channel_max(&self) -> u16 {
        self.channel_max
    }

    /// Negotiated heartbeat interval in seconds (0: none, or not tuned yet).
    pub fn heartbeat(&self) -> u16 {
        self.heartbeat
    }

    /// True if `channel` is open (and not closing after [`Connection::channel_error`]).
    pub fn is_channel_open(&self, channel: u16) -> bool {
        self.phase == Phase::Running && self.channels.is_open(channel)
    }

    /// Accepts the login: sends Connection.Tune.
    pub fn accept_login(&mut self) {
        if self.phase != Phase::Login {
            return;
        }
        let tune = connection::Tune {
            channel_max: handshake::server_channel_max(&self.config),
            frame_max: handshake::server_frame_max(&self.config),
            heartbeat: self.config.heartbeat,
        };
        wire::put_method_frame(self.output(), 0, &AMQPClass::Connection(connection::AMQPMethod::Tune(tune)));
        self.phase = Phase::TuneOk;
        self.resume();
    }

    /// Refuses the login: Connection.Close 403 ACCESS_REFUSED with `text` (clients that
    /// announce `authentication_failure_close` expect exactly this), then closes (after
    /// the client's Close-Ok, or [`CLOSE_TIMEOUT`]).
    pub fn refuse_login(&mut self, text: &str) {
        if self.phase != Phase::Login {
            return;
        }
        self.send_close(
            reply::ACCESS_REFUSED,
            text,
            (10, 11),
            CloseReason::ServerClosed { code: reply::ACCESS_REFUSED },
            false,
        );
    }

    /// Answers the Channel.Open reported as [`Event::ChannelOpened`] with Open-Ok; held
    /// input is then processed.
    pub fn channel_open_ok(&mut self, channel: u16) {
        if self.opening != Some(channel) || self.phase != Phase::Running {
            return;
        }
        self.opening = None;
        wire::put_method_frame(
            self.output(),
            channel,
            &AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
        );
        self.resume();
    }

    /// Input waits for the broker's answer to an event.
    fn holds_input(&self) -> bool {
        self.phase.holds_input() || self.opening.is_some()
    }

    /// Answers Connection.Open with Open-Ok.
    pub fn open_ok(&mut self) {
        if self.phase != Phase::OpenOk {
            return;
        }
        wire::put_method_frame(
            self.output(),
            0,
            &AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
        );
        self.phase = Phase::Running;
        if let Blocked::Pending(reason) = std::mem::replace(&mut self.blocked, Blocked::No) {
            self.blocked(&reason);
        }
        self.resume();
    }

    /// Sends a method on an open channel (an -Ok reply, Basic.Cancel from the server, ...),
    /// or a connection method on channel 0 (Update-Secret-Ok). Channel.Close goes through
    /// [`Connection::channel_error`] and Connection.Close through
    /// [`Connection::connection_error`]. Dropped before Open-Ok, once closing, or if the
    /// channel is not open.
    pub fn reply(&mut self, channel: u16, method: AMQPClass) {
        if self.phase != Phase::Running {
            return;
        }
        match &method {
            AMQPClass::Channel(channel::AMQPMethod::Close(c)) if channel != 0 => {
                self.channel_error(channel, c.reply_code, c.reply_text.as_str(), c.class_id, c.method_id);
                return;
            }
            AMQPClass::Connection(connection::AMQPMethod::Close(c)) => {
                self.connection_error(c.reply_code, c.reply_text.as_str(), c.class_id, c.method_id);
                return;
            }
            _ => {}
        }
        let allowed =
            if channel == 0 { matches!(method, AMQPClass::Connection(_)) } else { self.channels.is_open(channel) };
        if allowed {
            wire::put_method_frame(self.output(), channel, &method);
        }
    }

    /// Sends Basic.Deliver with the content.
    pub fn deliver(
        &mut self,
        channel: u16,
        consumer_tag: &str,
        delivery_tag: u64,
        redelivered: bool,
        content: Content<'_>,
    ) {
        if !self.is_channel_open(channel) {
            return;
        }
        let out = self.output();
        let at = wire::begin_frame(out, wire::FRAME_METHOD, channel);
        out.extend_from_slice(&[0, 60, 0, 60]);
        wire::put_deliver(out, consumer_tag, delivery_tag, redelivered, content.exchange, content.routing_key);
        wire::end_frame(out, at);
        self.put_content(channel, &content);
    }

    /// Sends Basic.Get-Ok with the content.
    pub fn get_ok(
        &mut self,
        channel: u16,
        delivery_tag: u64,
        redelivered: bool,
        message_count: u32,
        content: Content<'_>,
    ) {
        if !self.is_channel_open(channel) {
            return;
        }
        let out = self.output();
        let at = wire::begin_frame(out, wire::FRAME_METHOD, channel);
        out.extend_from_slice(&[0, 60, 0, 71]);
        wire::put_get_ok(out, delivery_tag, redelivered, content.exchange, content.routing_key, message_count);
        wire::end_frame(out, at);
        self.put_content(channel, &content);
    }

    /// Sends Basic.Return (e.g. 312 NO_ROUTE for a mandatory publish) with the content.
    pub fn basic_return(&mut self, channel: u16, reply_code: u16, reply_text: &str, content: Content<'_>) {
        if !self.is_channel_open(channel) {
            return;
        }
        let out = self.output();
        let at = wire::begin_frame(out, wire::FRAME_METHOD, channel);
        out.extend_from_slice(&[0, 60, 0, 50]);
        wire::put_return(out, reply_code, reply_text, content.exchange, content.routing_key);
        wire::end_frame(out, at);
        self.put_content(channel, &content);
    }

    fn put_content(&mut self, channel: u16, content: &Content<'_>) {
        let frame_max = self.frame_max;
        wire::put_content(self.output(), channel, content.properties, content.body, frame_max);
    }

    /// Sends a publisher confirm: Basic.Ack (`ack`) or Basic.Nack for `delivery_tag`
    /// (and every earlier one when `multiple`).
    pub fn confirm(&mut self, channel: u16, delivery_tag: u64, multiple: bool, ack: bool) {
        if !self.is_channel_open(channel) {
            return;
        }
        wire::put_confirm(self.output(), channel, delivery_tag, multiple, ack);
    }

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

    /// Sends Connection.Blocked (memory alarm) if the client announced the capability
    /// (before Open-Ok: sent right after it).
    pub fn blocked(&mut self, reason: &str) {
        match self.phase {
            Phase::Closing | Phase::Closed => {}
            Phase::Running => {
                if self.cap_blocked && self.blocked != Blocked::Sent {
                    wire::put_blocked(self.output(), reason);
                    self.blocked = Blocked::Sent;
                }
            }
            _ => self.blocked = Blocked::Pending(reason.to_owned()),
        }
    }

    /// Sends Connection.Unblocked if Blocked was sent.
    pub fn unblocked(&mut self) {
        if self.blocked == Blocked::Sent && self.phase == Phase::Running {
            wire::put_unblocked(self.output());
        }
        if self.phase != Phase::Closed {
            self.blocked = Blocked::No;
        }
    }

    // ----------------------------------------------------------------------------------
    // Internals.

    /// Advances the clock (never backwards).
    fn tick(&mut self, now: Instant) {
        if now > self.clock {
            self.clock = now;
        }
    }

    /// The output buffer, marking that something was sent now (heartbeat clock).
    fn output(&mut self) -> &mut BytesMut {
        self.last_send = self.clock;
        &mut self.out
    }

    /// (send heartbeat at, give up at) once tuned with a heartbeat.
    fn heartbeat_deadlines(&self) -> Option<(Instant, Instant)> {
        if self.heartbeat == 0 || !self.phase.tuned() {
            return None;
        }
        let h = u64::from(self.heartbeat);
        Some((self.last_send + Duration::from_millis(h * 500), self.last_recv + Duration::from_secs(h * 2)))
    }

    /// Most bytes held while waiting for the broker.
    fn hold_limit(&self) -> usize {
        (self.frame_max as usize).saturating_mul(4)
    }

    /// Processes held input after the broker answered.
    fn resume(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut held = std::mem::take(&mut self.held);
        self.process(&mut held);
        if self.phase != Phase::Closed && self.held.is_empty() {
            self.held = held;
        }
    }

    /// Reports the end of the connection.
    fn finish(&mut self, reason: CloseReason) {
        if self.phase == Phase::Closed {
            return;
        }
        self.phase = Phase::Closed;
        self.closing = None;
        self.held = BytesMut::new();
        self.events.push_back(Event::Closed(reason));
    }

    /// Ends the connection without Connection.Close (timeouts, bad header).
    fn drop_connection(&mut self, error: ProtocolError) {
        self.finish(CloseReason::Error(error));
    }

    /// Sends Connection.Close and waits for Close-Ok.
    fn send_close(&mut self, code: u16, text: &str, ids: (u16, u16), reason: CloseReason, lost_sync: bool) {
        wire::put_close(self.output(), 0, code, text, ids.0, ids.1);
        self.phase = Phase::Closing;
        self.held = BytesMut::new();
        self.opening = None;
        self.closing = Some(Closing { deadline: self.clock + CLOSE_TIMEOUT, reason, lost_sync });
    }

    /// Closes the connection for a protocol error.
    fn fail(&mut self, fault: Fault) {
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

    /// Consumes what can be consumed from the front of `buf`.
    fn process(&mut self, buf: &mut BytesMut) {
        loop {
            match self.phase {
                Phase::Closed | Phase::Login | Phase::OpenOk => return,
                _ if self.opening.is_some() => return,
                Phase::Header => {
                    if !self.read_protocol_header(buf) {
                        return;
                    }
                    continue;
                }
                Phase::Closing if self.closing.as_ref().is_none_or(|c| c.lost_sync) => {
                    buf.clear();
                    return;
                }
                _ => {}
            }
            let head = match frame::peek(buf, self.frame_max) {
                Ok(Some(head)) => head,
                Ok(None) => return,
                Err(e) => {
                    // Frame boundaries are lost: close (or, already closing, stop looking
                    // for Close-Ok) and discard everything from here on.
                    match &mut self.closing {
                        Some(c) => c.lost_sync = true,
                        None => self.fail(Fault::framing(e)),
                    }
                    if self.phase != Phase::Closed {
                        buf.clear();
                    }
                    return;
                }
            };
            buf.advance(FRAME_HEADER_SIZE);
            if head.kind == Kind::Body {
                let payload = buf.split_to(head.size).freeze();
                buf.advance(1);
                self.on_body(head.channel, payload);
            } else {
                let payload = buf.get(..head.size).unwrap_or_default();
                self.on_frame(head.kind, head.channel, payload);
                buf.advance(head.size + 1);
            }
        }
    }

    /// Checks the protocol header; sends Start. False if more bytes are needed or the
    /// header is wrong (then the supported header is sent and the connection finished).
    fn read_protocol_header(&mut self, buf: &mut BytesMut) -> bool {
        let n = buf.len().min(frame::PROTOCOL_HEADER.len());
        if buf.get(..n) != frame::PROTOCOL_HEADER.get(..n) {
            self.output().extend_from_slice(frame::PROTOCOL_HEADER);
            self.drop_connection(ProtocolError::BadHeader);
            return false;
        }
        if n < frame::PROTOCOL_HEADER.len() {
            return false;
        }
        buf.advance(n);
        let start = handshake::start(&self.config);
        wire::put_method_frame(self.output(), 0, &AMQPClass::Connection(connection::AMQPMethod::Start(start)));
        self.phase = Phase::StartOk;
        true
    }

    /// A method, header or heartbeat frame.
    fn on_frame(&mut self, kind: Kind, channel: u16, payload: &[u8]) {
        if self.phase == Phase::Closing {
            self.on_frame_closing(kind, channel, payload);
            return;
        }
        match kind {
            Kind::Heartbeat if channel == 0 => {}
            Kind::Heartbeat => self.fail(Fault::unexpected("heartbeat frame on a channel other than 0", (0, 0))),
            Kind::Method if channel == 0 => self.on_connection_method(payload),
            _ if channel == 0 => self.fail(Fault::unexpected("content frame on channel 0", (0, 0))),
            _ if self.phase != Phase::Running => {
                self.fail(Fault::unexpected("frame on a channel before the connection is open", (0, 0)))
            }
            Kind::Method => self.on_channel_method(channel, payload),
            Kind::Header => self.on_header(channel, payload),
            Kind::Body => {}
        }
    }

    /// While closing, only Connection.Close and Close-Ok count.
    fn on_frame_closing(&mut self, kind: Kind, channel: u16, payload: &[u8]) {
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

    /// Decodes a method payload; a fault closes the connection.
    fn decode(&mut self, payload: &[u8]) -> Option<AMQPClass> {
        match decode::decode_method(payload) {
            Ok(m) => Some(m),
            Err(e) => {
                let text = frame::method_error_text(e);
                let fault = match e {
                    MethodError::Truncated => Fault::malformed(text, (0, 0)),
                    MethodError::Unknown { class_id, method_id } => {
                        Fault::new(ProtocolError::NotImplemented("unknown method"), &text, (class_id, method_id))
                    }
                    MethodError::Invalid { class_id, method_id } => Fault::malformed(text, (class_id, method_id)),
                };
                self.fail(fault);
                None
            }
        }
    }

    /// A method on channel 0.
    fn on_connection_method(&mut self, payload: &[u8]) {
        let Some(method) = self.decode(payload) else {
            return;
        };
        let ids = (method.get_amqp_class_id(), method.get_amqp_method_id());
        let AMQPClass::Connection(m) = method else {
            self.fail(self.wrong_state(ids));
            return;
        };
        match (self.phase, m) {
            (_, connection::AMQPMethod::Close(c)) => {
                wire::put_method_frame(
                    self.output(),
                    0,
                    &AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
                );
                self.finish(CloseReason::ClientClosed { code: c.reply_code, text: c.reply_text.to_string() });
            }
            (Phase::StartOk, connection::AMQPMethod::StartOk(s)) => self.on_start_ok(s),
            (Phase::TuneOk, connection::AMQPMethod::TuneOk(t)) => self.on_tune_ok(&t),
            (Phase::Open, connection::AMQPMethod::Open(o)) => {
                self.phase = Phase::OpenOk;
                self.events.push_back(Event::Open { vhost: o.virtual_host.to_string() });
            }
            (Phase::Running, m @ connection::AMQPMethod::UpdateSecret(_)) => {
                self.events.push_back(Event::Method { channel: 0, method: Box::new(AMQPClass::Connection(m)) });
            }
            _ => self.fail(self.wrong_state(ids)),
        }
    }

    /// 504 for a method not valid on channel 0 now (RabbitMQ's wording).
    fn wrong_state(&self, ids: (u16, u16)) -> Fault {
        let text = format!("unexpected method in connection state {}", self.phase.name());
        Fault::new(ProtocolError::Channel("unexpected method on channel 0"), &text, ids)
    }

    fn on_start_ok(&mut self, start_ok: connection::StartOk) {
        let mechanism = start_ok.mechanism.as_str();
        match sasl::credentials(mechanism, start_ok.response.as_bytes(), self.config.sasl_external) {
            Ok((username, password)) => {
                self.cap_blocked = handshake::has_capability(&start_ok.client_properties, "connection.blocked");
                self.phase = Phase::Login;
                self.events.push_back(Event::Login {
                    mechanism: mechanism.to_owned(),
                    username,
                    password,
                    client_properties: start_ok.client_properties,
                });
            }
            Err(sasl::SaslError::UnsupportedMechanism) => {
                let text = format!("unsupported authentication mechanism '{}'", wire::short(mechanism));
                self.fail(Fault::new(
                    ProtocolError::AccessRefused("unsupported authentication mechanism"),
                    &text,
                    (10, 11),
                ));
            }
            Err(sasl::SaslError::Malformed) => {
                let text = format!("invalid {mechanism} response");
                self.fail(Fault::new(ProtocolError::AccessRefused("malformed SASL response"), &text, (10, 11)));
            }
        }
    }

    fn on_tune_ok(&mut self, tune_ok: &connection::TuneOk) {
        match handshake::negotiate(&self.config, tune_ok) {
            Ok(t) => {
                self.frame_max = t.frame_max;
                self.channel_max = t.channel_max;
                self.heartbeat = t.heartbeat;
                self.last_recv = self.clock;
                self.last_send = self.clock;
                self.phase = Phase::Open;
            }
            Err(text) => {
                self.fail(Fault::new(ProtocolError::NotAllowed("tune-ok outside the server's limits"), &text, (10, 30)))
            }
        }
    }

    /// A method on channel 1..=65535 of a running connection.
    fn on_channel_method(&mut self, channel: u16, payload: &[u8]) {
        let ids = decode::method_ids(payload);
        let Some(ch) = self.channels.get(channel) else {
            // Not open: only Channel.Open; a stray Close-Ok (after crossed closes) is
            // ignored.
            match ids {
                Some((20, 41)) => {}
                Some((20, 10)) => {
                    if self.decode(payload).is_some() {
                        self.open_channel(channel);
                    }
                }
                _ => {
                    if let Some(m) = self.decode(payload) {
                        let ids = (m.get_amqp_class_id(), m.get_amqp_method_id());
                        self.fail(Fault::channel("expected 'channel.open'", ids));
                    }
                }
            }
            return;
        };
        if ch.closing {
            // Waiting for Close-Ok: everything else is discarded.
            match ids {
                Some((20, 40)) => {
                    wire::put_method_frame(
                        self.output(),
                        channel,
                        &AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                    );
                    self.close_channel(channel);
                }
                Some((20, 41)) => self.close_channel(channel),
                _ => {}
            }
            return;
        }
        match ch.content {
            Assembly::Idle => {}
            Assembly::Header(_) => {
                return self.fail(Fault::unexpected(
                    "expected content header for class 60, got non content header frame instead",
                    PUBLISH_IDS,
                ));
            }
            Assembly::Body(_) => {
                return self
                    .fail(Fault::unexpected("expected content body, got non content body frame instead", PUBLISH_IDS));
            }
        }
        let Some(method) = self.decode(payload) else {
            return;
        };
        self.on_open_channel_method(channel, method);
    }

    fn open_channel(&mut self, channel: u16) {
        if channel > self.channel_max {
            return self.fail(Fault::channel("channel number out of range", (20, 10)));
        }
        self.channels.insert(channel, Channel::new());
        self.opening = Some(channel);
        self.events.push_back(Event::ChannelOpened { channel });
    }

    fn close_channel(&mut self, channel: u16) {
        if self.channels.remove(channel).is_some() {
            self.events.push_back(Event::ChannelClosed { channel });
        }
    }

    /// A decoded method on an open channel with no content pending.
    fn on_open_channel_method(&mut self, channel: u16, method: AMQPClass) {
        let ids = (method.get_amqp_class_id(), method.get_amqp_method_id());
        let mode = self.channels.get(channel).map_or(Mode::Plain, |c| c.mode);
        match method {
            AMQPClass::Basic(basic::AMQPMethod::Publish(p)) => {
                if let Some(ch) = self.channels.get_mut(channel) {
                    ch.content = Assembly::Header(p);
                }
            }
            AMQPClass::Channel(m) => match m {
                channel::AMQPMethod::Open(_) => self.fail(Fault::channel("second 'channel.open' seen", ids)),
                channel::AMQPMethod::Close(_) => {
                    wire::put_method_frame(
                        self.output(),
                        channel,
                        &AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                    );
                    self.close_channel(channel);
                }
                channel::AMQPMethod::CloseOk(_) => {}
                channel::AMQPMethod::Flow(f) => {
                    wire::put_method_frame(
                        self.output(),
                        channel,
                        &AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk { active: f.active })),
                    );
                    self.events.push_back(Event::ChannelFlow { channel, active: f.active });
                }
                channel::AMQPMethod::OpenOk(_) | channel::AMQPMethod::FlowOk(_) => self.command_invalid(ids),
            },
            AMQPClass::Confirm(confirm::AMQPMethod::Select(s)) => {
                if mode == Mode::Tx {
                    let text = reply::text(reply::PRECONDITION_FAILED, "cannot switch from tx to confirm mode");
                    self.channel_error(channel, reply::PRECONDITION_FAILED, &text, ids.0, ids.1);
                    return;
                }
                if let Some(ch) = self.channels.get_mut(channel) {
                    if ch.mode == Mode::Plain {
                        ch.mode = Mode::Confirm { next: 1 };
                    }
                }
                if !s.nowait {
                    wire::put_method_frame(
                        self.output(),
                        channel,
                        &AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
                    );
                }
                self.events.push_back(Event::ConfirmSelected { channel });
            }
            AMQPClass::Tx(tx::AMQPMethod::Select(s)) => {
                if matches!(mode, Mode::Confirm { .. }) {
                    let text = reply::text(reply::PRECONDITION_FAILED, "cannot switch from confirm to tx mode");
                    self.channel_error(channel, reply::PRECONDITION_FAILED, &text, ids.0, ids.1);
                    return;
                }
                if let Some(ch) = self.channels.get_mut(channel) {
                    ch.mode = Mode::Tx;
                }
                self.forward(channel, AMQPClass::Tx(tx::AMQPMethod::Select(s)));
            }
            AMQPClass::Access(access::AMQPMethod::Request(_)) => {
                // Deprecated in 0-9-1; RabbitMQ answers with ticket 1.
                wire::put_method_frame(
                    self.output(),
                    channel,
                    &AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {})),
                );
            }
            m if is_client_method(&m) => self.forward(channel, m),
            _ => self.command_invalid(ids),
        }
    }

    fn forward(&mut self, channel: u16, method: AMQPClass) {
        self.events.push_back(Event::Method { channel, method: Box::new(method) });
    }

    /// 503 for a method a client does not send on a channel.
    fn command_invalid(&mut self, ids: (u16, u16)) {
        self.fail(Fault::new(ProtocolError::CommandInvalid("unimplemented method"), "unimplemented method", ids));
    }

    /// A content header frame on a running channel.
    fn on_header(&mut self, channel: u16, payload: &[u8]) {
        let max_size = self.config.max_message_size;
        let Some(ch) = self.channels.get_mut(channel) else {
            return self.fail(Fault::unexpected("expected method frame, got non method frame instead", (0, 0)));
        };
        if ch.closing {
            return;
        }
        let publish = match std::mem::take(&mut ch.content) {
            Assembly::Header(p) => p,
            Assembly::Idle => {
                return self.fail(Fault::unexpected("expected method frame, got non method frame instead", (0, 0)));
            }
            Assembly::Body(_) => {
                return self
                    .fail(Fault::unexpected("expected content body, got non content body frame instead", PUBLISH_IDS));
            }
        };
        let Some(prefix) = decode::header_prefix(payload) else {
            return self.fail(Fault::malformed("cannot decode content header".into(), PUBLISH_IDS));
        };
        if prefix.class_id != 60 {
            return self.fail(Fault::unexpected(
                "expected content header for class 60, got one for another class instead",
                PUBLISH_IDS,
            ));
        }
        if prefix.body_size > max_size {
            let text = reply::text(
                reply::PRECONDITION_FAILED,
                &format!("message size {} is larger than configured max size {max_size}", prefix.body_size),
            );
            self.channel_error(channel, reply::PRECONDITION_FAILED, &text, PUBLISH_IDS.0, PUBLISH_IDS.1);
            return;
        }
        let Some(properties) = decode::decode_properties(payload) else {
            return self.fail(Fault::malformed("cannot decode content header".into(), PUBLISH_IDS));
        };
        let partial = Partial {
            publish,
            properties,
            size: prefix.body_size,
            remaining: prefix.body_size,
            parts: Default::default(),
        };
        if prefix.body_size == 0 {
            self.complete(channel, partial);
        } else if let Some(ch) = self.channels.get_mut(channel) {
            ch.content = Assembly::Body(Box::new(partial));
        }
    }

    /// A content body frame: appended to the channel's message; the last one completes it.
    fn on_body(&mut self, channel: u16, payload: Bytes) {
        match self.phase {
            Phase::Closing | Phase::Closed => return,
            Phase::Running if channel != 0 => {}
            _ if channel == 0 => return self.fail(Fault::unexpected("content frame on channel 0", (0, 0))),
            _ => return self.fail(Fault::unexpected("frame on a channel before the connection is open", (0, 0))),
        }
        let Some(ch) = self.channels.get_mut(channel) else {
            return self.fail(Fault::unexpected("expected method frame, got non method frame instead", (0, 0)));
        };
        if ch.closing {
            return;
        }
        let partial = match &mut ch.content {
            Assembly::Body(p) => p,
            Assembly::Idle => {
                return self.fail(Fault::unexpected("expected method frame, got non method frame instead", (0, 0)));
            }
            Assembly::Header(_) => {
                return self.fail(Fault::unexpected(
                    "expected content header for class 60, got non content header frame instead",
                    PUBLISH_IDS,
                ));
            }
        };
        let len = payload.len() as u64;
        if len > partial.remaining {
            return self
                .fail(Fault::malformed("content body frame exceeds remaining content size".into(), PUBLISH_IDS));
        }
        partial.remaining -= len;
        partial.parts.push(payload);
        if partial.remaining == 0 {
            if let Assembly::Body(partial) = std::mem::take(&mut ch.content) {
                self.complete(channel, *partial);
            }
        }
    }

    /// Reports an assembled message.
    fn complete(&mut self, channel: u16, partial: Partial) {
        let confirm_tag = match self.channels.get_mut(channel) {
            Some(Channel { mode: Mode::Confirm { next }, .. }) => {
                let tag = *next;
                *next = next.saturating_add(1);
                Some(tag)
            }
            _ => None,
        };
        let size = usize::try_from(partial.size).unwrap_or(usize::MAX);
        self.events.push_back(Event::Publish(Box::new(Publish {
            channel,
            exchange: partial.publish.exchange,
            routing_key: partial.publish.routing_key,
            mandatory: partial.publish.mandatory,
            immediate: partial.publish.immediate,
            properties: partial.properties,
            body: partial.parts.into_body(size),
            confirm_tag,
        })));
    }
}

/// Methods a client sends on a channel that are the broker's business.
fn is_client_method(m: &AMQPClass) -> bool {
    use amq_protocol::protocol::{exchange, queue};
    match m {
        AMQPClass::Exchange(e) => matches!(
            e,
            exchange::AMQPMethod::Declare(_)
                | exchange::AMQPMethod::Delete(_)
                | exchange::AMQPMethod::Bind(_)
                | exchange::AMQPMethod::Unbind(_)
        ),
        AMQPClass::Queue(q) => matches!(
            q,
            queue::AMQPMethod::Declare(_)
                | queue::AMQPMethod::Bind(_)
                | queue::AMQPMethod::Purge(_)
                | queue::AMQPMethod::Delete(_)
                | queue::AMQPMethod::Unbind(_)
        ),
        AMQPClass::Basic(b) => matches!(
            b,
            basic::AMQPMethod::Qos(_)
                | basic::AMQPMethod::Consume(_)
                | basic::AMQPMethod::Cancel(_)
                | basic::AMQPMethod::Get(_)
                | basic::AMQPMethod::Ack(_)
                | basic::AMQPMethod::Reject(_)
                | basic::AMQPMethod::RecoverAsync(_)
                | basic::AMQPMethod::Recover(_)
                | basic::AMQPMethod::Nack(_)
        ),
        AMQPClass::Tx(t) => {
            matches!(t, tx::AMQPMethod::Select(_) | tx::AMQPMethod::Commit(_) | tx::AMQPMethod::Rollback(_))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
