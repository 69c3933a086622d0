//! The test client.

use std::time::{Duration, Instant};

use amq_protocol::auth::{Credentials, SASLMechanism};
use amq_protocol::frame::{gen_frame, parse_frame, AMQPContentHeader, AMQPFrame, WriteContext};
use amq_protocol::protocol::{basic, channel, confirm, connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable};
use bytes::{Bytes, BytesMut};

use crate::connection::{CloseReason, Config, Connection, Event};
use crate::frame::PROTOCOL_HEADER;
use crate::BasicProperties;

/// Encodes a frame with amq-protocol.
pub fn encode(frame: &AMQPFrame) -> Vec<u8> {
    let ctx = gen_frame(frame)(WriteContext::from(Vec::new())).expect("gen");
    ctx.write
}

/// A client talking to one server `Connection`.
pub struct Client {
    pub conn: Connection,
    pub now: Instant,
    /// Bytes from the client not yet consumed by the server.
    pub inbuf: BytesMut,
    /// Bytes from the server not yet parsed.
    outbuf: BytesMut,
}

pub fn client_properties(blocked_capability: bool) -> FieldTable {
    let mut caps = FieldTable::default();
    caps.insert("authentication_failure_close".into(), AMQPValue::Boolean(true));
    caps.insert("connection.blocked".into(), AMQPValue::Boolean(blocked_capability));
    let mut props = FieldTable::default();
    props.insert("product".into(), AMQPValue::LongString("test-client".into()));
    props.insert("capabilities".into(), AMQPValue::FieldTable(caps));
    props
}

impl Client {
    pub fn new(config: Config) -> Self {
        let now = Instant::now();
        Client { conn: Connection::new(config, now), now, inbuf: BytesMut::new(), outbuf: BytesMut::new() }
    }

    /// Client and server through Open-Ok, output and events drained.
    pub fn open(config: Config) -> Self {
        let mut c = Client::new(config);
        c.handshake(true);
        c
    }

    /// Feeds raw bytes to the server.
    pub fn raw(&mut self, bytes: &[u8]) {
        self.inbuf.extend_from_slice(bytes);
        self.conn.handle_input(&mut self.inbuf, self.now);
    }

    pub fn send(&mut self, frame: AMQPFrame) {
        self.raw(&encode(&frame));
    }

    pub fn method(&mut self, channel: u16, method: AMQPClass) {
        self.send(AMQPFrame::Method(channel, method));
    }

    pub fn header(&mut self, channel: u16, body_size: u64, properties: BasicProperties) {
        self.send(AMQPFrame::Header(channel, AMQPContentHeader { class_id: 60, body_size, properties }));
    }

    pub fn body(&mut self, channel: u16, data: &[u8]) {
        self.send(AMQPFrame::Body(channel, data.to_vec()));
    }

    /// Frames the server sent since the last call, parsed by amq-protocol.
    pub fn recv(&mut self) -> Vec<AMQPFrame> {
        self.conn.poll_transmit(&mut self.outbuf);
        let mut frames = Vec::new();
        loop {
            let parsed = parse_frame(&self.outbuf[..]).map(|(rest, f)| (self.outbuf.len() - rest.len(), f));
            match parsed {
                Ok((used, f)) => {
                    let _ = self.outbuf.split_to(used);
                    frames.push(f);
                }
                Err(amq_protocol::frame::ParserError::Incomplete(_)) => break,
                Err(e) => panic!("server output does not parse: {e:?} in {:?}", &self.outbuf[..]),
            }
        }
        frames
    }

    /// Methods the server sent since the last call (other frames are an error).
    pub fn recv_methods(&mut self) -> Vec<(u16, AMQPClass)> {
        self.recv()
            .into_iter()
            .map(|f| match f {
                AMQPFrame::Method(ch, m) => (ch, m),
                other => panic!("expected a method frame, got {other:?}"),
            })
            .collect()
    }

    /// Events since the last call.
    pub fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.conn.poll_event()).collect()
    }

    /// Advances the clock and runs the timers.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.conn.handle_timeout(self.now);
    }

    pub fn start_ok(&mut self, mechanism: &str, response: Vec<u8>, blocked_capability: bool) {
        self.method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties: client_properties(blocked_capability),
                mechanism: mechanism.into(),
                response: response.into(),
                locale: "en_US".into(),
            })),
        );
    }

    pub fn plain(user: &str, pass: &str) -> Vec<u8> {
        Credentials::new(user.into(), pass.into()).sasl_auth_string(SASLMechanism::Plain).as_bytes().to_vec()
    }

    pub fn tune_ok(&mut self, channel_max: u16, frame_max: u32, heartbeat: u16) {
        self.method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
                channel_max,
                frame_max,
                heartbeat,
            })),
        );
    }

    pub fn connection_open(&mut self, vhost: &str) {
        self.method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open { virtual_host: vhost.into() })),
        );
    }

    /// Full handshake with heartbeats off; asserts each step.
    pub fn handshake(&mut self, blocked_capability: bool) {
        self.raw(PROTOCOL_HEADER);
        let start = self.recv_methods();
        assert!(matches!(start.as_slice(), [(0, AMQPClass::Connection(connection::AMQPMethod::Start(_)))]));
        self.start_ok("PLAIN", Client::plain("guest", "guest"), blocked_capability);
        assert!(matches!(self.events().as_slice(), [Event::Login { .. }]));
        self.conn.accept_login();
        assert!(matches!(
            self.recv_methods().as_slice(),
            [(0, AMQPClass::Connection(connection::AMQPMethod::Tune(_)))]
        ));
        self.tune_ok(0, 0, 0);
        self.connection_open("/");
        assert_eq!(self.events(), vec![Event::Open { vhost: "/".into() }]);
        self.conn.open_ok();
        assert_eq!(
            self.recv_methods(),
            vec![(0, AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})))]
        );
    }

    pub fn open_channel(&mut self, ch: u16) {
        self.method(ch, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})));
        assert!(self.recv().is_empty(), "Open-Ok waits for the broker");
        assert_eq!(self.events(), vec![Event::ChannelOpened { channel: ch }]);
        self.conn.channel_open_ok(ch);
        assert_eq!(
            self.recv_methods(),
            vec![(ch, AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})))]
        );
    }

    pub fn publish_method(&mut self, ch: u16, routing_key: &str) {
        self.method(
            ch,
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "".into(),
                routing_key: routing_key.into(),
                mandatory: false,
                immediate: false,
            })),
        );
    }

    /// Publishes `body` in frames of `chunk` bytes.
    pub fn publish(&mut self, ch: u16, routing_key: &str, body: &[u8], chunk: usize) {
        self.publish_method(ch, routing_key);
        self.header(ch, body.len() as u64, BasicProperties::default());
        for part in body.chunks(chunk.max(1)) {
            self.body(ch, part);
        }
    }

    pub fn confirm_select(&mut self, ch: u16, nowait: bool) {
        self.method(ch, AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select { nowait })));
    }

    /// The single Connection.Close the server sent: (code, text, class, method).
    pub fn expect_connection_close(&mut self) -> (u16, String, u16, u16) {
        let frames = self.recv();
        match frames.as_slice() {
            [AMQPFrame::Method(0, AMQPClass::Connection(connection::AMQPMethod::Close(c)))] => {
                (c.reply_code, c.reply_text.to_string(), c.class_id, c.method_id)
            }
            other => panic!("expected Connection.Close, got {other:?}"),
        }
    }

    /// The single Channel.Close the server sent on `ch`: (code, text, class, method).
    pub fn expect_channel_close(&mut self, ch: u16) -> (u16, String, u16, u16) {
        let frames = self.recv();
        match frames.as_slice() {
            [AMQPFrame::Method(c, AMQPClass::Channel(channel::AMQPMethod::Close(m)))] if *c == ch => {
                (m.reply_code, m.reply_text.to_string(), m.class_id, m.method_id)
            }
            other => panic!("expected Channel.Close on {ch}, got {other:?}"),
        }
    }

    /// Answers the server's Connection.Close and checks the close reason.
    pub fn close_ok_and_expect(&mut self, reason: CloseReason) {
        self.method(0, AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})));
        assert_eq!(self.events(), vec![Event::Closed(reason)]);
        assert!(self.conn.is_closed());
    }

    /// Expects a connection error with this code and ids, then finishes the close.
    pub fn expect_error(&mut self, code: u16, ids: (u16, u16)) -> String {
        let (c, text, class, method) = self.expect_connection_close();
        assert_eq!((c, (class, method)), (code, ids), "{text}");
        assert!(self.events().is_empty(), "no event before Close-Ok");
        self.method(0, AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})));
        match self.events().as_slice() {
            [Event::Closed(CloseReason::Error(e))] => assert_eq!(e.reply_code(), code),
            other => panic!("expected Closed(Error), got {other:?}"),
        }
        text
    }
}

/// Shorthand for a body.
pub fn bytes(s: &'static [u8]) -> Bytes {
    Bytes::from_static(s)
}
