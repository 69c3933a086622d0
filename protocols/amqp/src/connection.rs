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
//!
//! This module holds [`Connection`] itself, its [`Config`] and phases, the input loop that
//! cuts frames and hands each to its handler, and the timers (handshake deadline,
//! heartbeats). The rest is split by job, each a private module adding to
//! [`Connection`]:
//!
//! - `handshake`: the protocol header, Start/Start-Ok (SASL), Tune/Tune-Ok and Open, and
//!   the other methods on channel 0;
//! - `methods`: method dispatch on channels 1 and up: Channel.Open/Close/Flow,
//!   confirm/tx selection, and the methods forwarded to the broker as [`Event::Method`];
//! - `content`: content assembly (Basic.Publish, content header, body frames) into one
//!   [`Publish`], with its confirm sequence number;
//! - `channels`: the table of open channels and each one's confirm/tx mode;
//! - `outbound`: what the broker sends: method replies, Basic.Deliver, Get-Ok and Return
//!   with their [`Content`], publisher confirms, `connection.blocked`/`unblocked`;
//! - `closing`: channel and connection exceptions and the close handshake;
//! - `event`: what the connection reports ([`Event`], [`Publish`], [`CloseReason`]);
//! - `fault`: [`ProtocolError`] and the Connection.Close each error turns into.

mod channels;
mod closing;
mod content;
mod event;
mod fault;
mod handshake;
mod methods;
mod outbound;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};

use self::channels::Channels;
use self::closing::Closing;
use self::fault::Fault;
use self::outbound::Blocked;
use crate::decode::{self, MethodError};
use crate::frame::{self, Kind, FRAME_HEADER_SIZE};
use crate::wire;
use crate::AMQPClass;

pub use self::closing::CLOSE_TIMEOUT;
pub use self::event::{CloseReason, Event, Publish};
pub use self::fault::ProtocolError;
pub use self::outbound::Content;

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

    // ----------------------------------------------------------------------------------
    // Internals.

    /// Input waits for the broker's answer to an event.
    fn holds_input(&self) -> bool {
        self.phase.holds_input() || self.opening.is_some()
    }

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
}

#[cfg(test)]
mod tests;
