//! Property tests: arbitrary bytes in arbitrary chunkings never panic the connection
//! (before or after a valid handshake), random valid/invalid client frame sequences never
//! panic it and keep its output well formed, and methods, properties and content
//! round-trip between our codec and `amq-protocol`'s.

use std::time::{Duration, Instant};

use amq_protocol::frame::{gen_frame, parse_frame, AMQPContentHeader, AMQPFrame, WriteContext};
use amq_protocol::protocol::{basic, channel, confirm, connection, exchange, queue, tx};
use bytes::{Bytes, BytesMut};
use ferrymq_amqp::frame::{read_frame, write_content, write_frame, write_method, Frame, PROTOCOL_HEADER};
use ferrymq_amqp::*;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Client-side helpers.

fn encode(frame: &AMQPFrame) -> Vec<u8> {
    let ctx = gen_frame(frame)(WriteContext::from(Vec::new())).expect("gen");
    ctx.write
}

fn method(channel: u16, m: AMQPClass) -> Vec<u8> {
    encode(&AMQPFrame::Method(channel, m))
}

/// Bytes of a client handshake up to Connection.Open.
fn handshake_bytes() -> Vec<u8> {
    let mut v = PROTOCOL_HEADER.to_vec();
    v.extend(method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
            client_properties: FieldTable::default(),
            mechanism: "PLAIN".into(),
            response: "\0guest\0guest".into(),
            locale: "en_US".into(),
        })),
    ));
    v.extend(method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
            channel_max: 16,
            frame_max: 4096,
            heartbeat: 5,
        })),
    ));
    v.extend(method(
        0,
        AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open { virtual_host: "/".into() })),
    ));
    v
}

/// A broker that answers everything and sends a little traffic back; checks the
/// connection's invariants as it goes.
struct Broker {
    closed_events: usize,
    output: BytesMut,
    /// Channels the server sent Channel.Close on (the client answers them).
    server_closed: Vec<u16>,
    /// Calls to `drive`, mixed into the decisions.
    calls: u8,
}

impl Broker {
    fn new() -> Self {
        Broker { closed_events: 0, output: BytesMut::new(), server_closed: Vec::new(), calls: 0 }
    }

    fn drive(&mut self, conn: &mut Connection, salt: u8) {
        self.calls = self.calls.wrapping_add(1);
        let salt = salt.wrapping_add(self.calls);
        while let Some(ev) = conn.poll_event() {
            assert_eq!(self.closed_events, 0, "no event after Closed");
            match ev {
                Event::Login { .. } => conn.accept_login(),
                Event::Open { .. } => conn.open_ok(),
                Event::Method { channel, method } => match (salt % 4, *method) {
                    (0, _) => conn.channel_error(channel, 404, "NOT_FOUND - x", 50, 10),
                    (1, AMQPClass::Basic(basic::AMQPMethod::Consume(c))) => {
                        conn.reply(
                            channel,
                            AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
                                consumer_tag: c.consumer_tag,
                            })),
                        );
                    }
                    _ => conn.reply(channel, AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {}))),
                },
                Event::Publish(p) => {
                    if let Some(tag) = p.confirm_tag {
                        conn.confirm(p.channel, tag, salt.is_multiple_of(2), !salt.is_multiple_of(3));
                    }
                    let content = Content {
                        exchange: p.exchange.as_str(),
                        routing_key: p.routing_key.as_str(),
                        properties: &p.properties,
                        body: &p.body,
                    };
                    conn.deliver(p.channel, "ctag", 1, false, content.clone());
                    if p.mandatory {
                        conn.basic_return(p.channel, 312, "NO_ROUTE", content);
                    }
                }
                Event::ChannelOpened { channel } if salt.is_multiple_of(7) => {
                    conn.channel_error(channel, 406, "x", 0, 0)
                }
                Event::ChannelOpened { .. } if salt.is_multiple_of(17) => {
                    conn.connection_error(530, "NOT_ALLOWED - x", 0, 0)
                }
                Event::ChannelOpened { channel } => conn.channel_open_ok(channel),
                Event::Closed(_) => {
                    self.closed_events += 1;
                    assert!(conn.is_closed());
                }
                _ => {}
            }
        }
        if salt.is_multiple_of(11) {
            conn.blocked("alarm");
        } else if salt.is_multiple_of(13) {
            conn.unblocked();
        }
        conn.poll_transmit(&mut self.output);
        // Everything the server writes parses (a bad-header reply is the protocol header).
        loop {
            match parse_frame(&self.output[..]) {
                Ok((rest, frame)) => {
                    if let AMQPFrame::Method(ch, AMQPClass::Channel(channel::AMQPMethod::Close(_))) = frame {
                        self.server_closed.push(ch);
                    }
                    let used = self.output.len() - rest.len();
                    let _ = self.output.split_to(used);
                }
                Err(amq_protocol::frame::ParserError::Incomplete(_)) => break,
                Err(e) => panic!("server output does not parse: {e:?}"),
            }
        }
        assert!(self.closed_events <= 1);
    }
}

fn feed(prefix: &[u8], data: &[u8], chunk: usize) -> Connection {
    let t0 = Instant::now();
    let mut conn = Connection::new(Config { max_message_size: 1000, ..Config::default() }, t0);
    let mut broker = Broker::new();
    let mut buf = BytesMut::new();
    for (i, piece) in prefix.chunks(chunk.max(1)).chain(data.chunks(chunk.max(1))).enumerate() {
        let i = i as u64;
        buf.extend_from_slice(piece);
        let now = t0 + Duration::from_millis(i * 10);
        conn.handle_input(&mut buf, now);
        broker.drive(&mut conn, i as u8);
        if let Some(t) = conn.poll_timeout() {
            if t <= now + Duration::from_millis(10) {
                conn.handle_timeout(t);
                broker.drive(&mut conn, i as u8);
            }
        }
    }
    conn.handle_timeout(t0 + Duration::from_secs(3600));
    broker.drive(&mut conn, 0);
    conn.handle_timeout(t0 + Duration::from_secs(7200));
    broker.drive(&mut conn, 0);
    assert!(conn.is_closed(), "everything ends: timeouts or close");
    assert_eq!(broker.closed_events, 1);
    conn
}

// ---------------------------------------------------------------------------------------
// Strategies.

fn short_string() -> impl Strategy<Value = ShortString> {
    prop_oneof![
        8 => "[a-zA-Z0-9._ é✓-]{0,20}",
        1 => "[a-z]{200,255}",
    ]
    .prop_map(|s: String| ShortString::try_new(s).expect("short"))
}

fn long_string() -> impl Strategy<Value = LongString> {
    prop::collection::vec(any::<u8>(), 0..40).prop_map(LongString::from)
}

fn leaf_value() -> impl Strategy<Value = AMQPValue> {
    use amq_protocol::types::DecimalValue;
    prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        (-1e6f32..1e6).prop_map(AMQPValue::Float),
        (-1e12f64..1e12).prop_map(AMQPValue::Double),
        (any::<u8>(), any::<u32>()).prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
        long_string().prop_map(AMQPValue::LongString),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        prop::collection::vec(any::<u8>(), 0..20).prop_map(|v| AMQPValue::ByteArray(v.into())),
        Just(AMQPValue::Void),
    ]
}

fn value() -> impl Strategy<Value = AMQPValue> {
    leaf_value().prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(|v| AMQPValue::FieldArray(v.into())),
            prop::collection::btree_map(short_string(), inner, 0..5).prop_map(|m| AMQPValue::FieldTable(m.into())),
        ]
    })
}

fn table() -> impl Strategy<Value = FieldTable> {
    prop::collection::btree_map(short_string(), value(), 0..6).prop_map(FieldTable::from)
}

fn properties() -> impl Strategy<Value = BasicProperties> {
    (
        (
            prop::option::of(short_string()),
            prop::option::of(short_string()),
            prop::option::of(table()),
            prop::option::of(any::<u8>()),
            prop::option::of(any::<u8>()),
            prop::option::of(short_string()),
            prop::option::of(short_string()),
        ),
        (
            prop::option::of(short_string()),
            prop::option::of(short_string()),
            prop::option::of(any::<u64>()),
            prop::option::of(short_string()),
            prop::option::of(short_string()),
            prop::option::of(short_string()),
            prop::option::of(short_string()),
        ),
    )
        .prop_map(|((ct, ce, h, dm, pr, ci, rt), (ex, mi, ts, ty, ui, ai, cl))| {
            let mut p = BasicProperties::default();
            macro_rules! set {
                ($opt:expr, $with:ident) => {
                    if let Some(v) = $opt {
                        p = p.$with(v);
                    }
                };
            }
            set!(ct, with_content_type);
            set!(ce, with_content_encoding);
            set!(h, with_headers);
            set!(dm, with_delivery_mode);
            set!(pr, with_priority);
            set!(ci, with_correlation_id);
            set!(rt, with_reply_to);
            set!(ex, with_expiration);
            set!(mi, with_message_id);
            set!(ts, with_timestamp);
            set!(ty, with_type);
            set!(ui, with_user_id);
            set!(ai, with_app_id);
            set!(cl, with_cluster_id);
            p
        })
}

/// Methods a server sends (written by our own encoders).
fn server_method() -> impl Strategy<Value = AMQPClass> {
    prop_oneof![
        (short_string(), any::<u64>(), any::<bool>(), short_string(), short_string()).prop_map(|(t, d, r, e, k)| {
            AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
                consumer_tag: t,
                delivery_tag: d,
                redelivered: r,
                exchange: e,
                routing_key: k,
            }))
        }),
        (any::<u64>(), any::<bool>(), short_string(), short_string(), any::<u32>()).prop_map(|(d, r, e, k, n)| {
            AMQPClass::Basic(basic::AMQPMethod::GetOk(basic::GetOk {
                delivery_tag: d,
                redelivered: r,
                exchange: e,
                routing_key: k,
                message_count: n,
            }))
        }),
        (any::<u16>(), short_string(), short_string(), short_string()).prop_map(|(c, t, e, k)| {
            AMQPClass::Basic(basic::AMQPMethod::Return(basic::Return {
                reply_code: c,
                reply_text: t,
                exchange: e,
                routing_key: k,
            }))
        }),
        (any::<u64>(), any::<bool>())
            .prop_map(|(d, m)| AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack { delivery_tag: d, multiple: m }))),
        (any::<u64>(), any::<bool>(), any::<bool>()).prop_map(|(d, m, r)| {
            AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack { delivery_tag: d, multiple: m, requeue: r }))
        }),
        (short_string(), any::<bool>()).prop_map(|(t, n)| AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
            consumer_tag: t,
            nowait: n
        }))),
        short_string()
            .prop_map(|t| AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk { consumer_tag: t }))),
        (short_string(), any::<u32>(), any::<u32>()).prop_map(|(q, m, c)| {
            AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                queue: q,
                message_count: m,
                consumer_count: c,
            }))
        }),
        (any::<u16>(), short_string(), any::<u16>(), any::<u16>()).prop_map(|(c, t, k, m)| {
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: c,
                reply_text: t,
                class_id: k,
                method_id: m,
            }))
        }),
        (any::<u16>(), short_string(), any::<u16>(), any::<u16>()).prop_map(|(c, t, k, m)| {
            AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
                reply_code: c,
                reply_text: t,
                class_id: k,
                method_id: m,
            }))
        }),
        (any::<u16>(), any::<u32>(), any::<u16>()).prop_map(|(c, f, h)| {
            AMQPClass::Connection(connection::AMQPMethod::Tune(connection::Tune {
                channel_max: c,
                frame_max: f,
                heartbeat: h,
            }))
        }),
        table().prop_map(|t| AMQPClass::Connection(connection::AMQPMethod::Start(connection::Start {
            version_major: 0,
            version_minor: 9,
            server_properties: t,
            mechanisms: "PLAIN".into(),
            locales: "en_US".into(),
        }))),
        any::<bool>().prop_map(|a| AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk { active: a }))),
        short_string()
            .prop_map(|r| AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked { reason: r }))),
    ]
}

/// Methods a client sends (decoded by our reader).
fn client_method() -> impl Strategy<Value = AMQPClass> {
    prop_oneof![
        (short_string(), short_string(), any::<bool>(), any::<bool>()).prop_map(|(e, k, m, i)| {
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: e,
                routing_key: k,
                mandatory: m,
                immediate: i,
            }))
        }),
        (any::<u64>(), any::<bool>())
            .prop_map(|(d, m)| AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack { delivery_tag: d, multiple: m }))),
        (any::<u64>(), any::<bool>(), any::<bool>()).prop_map(|(d, m, r)| {
            AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack { delivery_tag: d, multiple: m, requeue: r }))
        }),
        (any::<u64>(), any::<bool>()).prop_map(|(d, r)| AMQPClass::Basic(basic::AMQPMethod::Reject(basic::Reject {
            delivery_tag: d,
            requeue: r
        }))),
        (short_string(), short_string(), any::<[bool; 4]>(), table()).prop_map(|(q, t, f, a)| {
            AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
                queue: q,
                consumer_tag: t,
                no_local: f[0],
                no_ack: f[1],
                exclusive: f[2],
                nowait: f[3],
                arguments: a,
            }))
        }),
        (short_string(), any::<[bool; 5]>(), table()).prop_map(|(q, f, a)| {
            AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: q,
                passive: f[0],
                durable: f[1],
                exclusive: f[2],
                auto_delete: f[3],
                nowait: f[4],
                arguments: a,
            }))
        }),
        (short_string(), short_string(), short_string(), any::<bool>(), table()).prop_map(|(d, s, k, n, a)| {
            AMQPClass::Exchange(exchange::AMQPMethod::Bind(exchange::Bind {
                destination: d,
                source: s,
                routing_key: k,
                nowait: n,
                arguments: a,
            }))
        }),
        (any::<u16>(), any::<bool>())
            .prop_map(|(p, g)| AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos { prefetch_count: p, global: g }))),
        (table(), short_string(), long_string(), short_string()).prop_map(|(c, m, r, l)| {
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties: c,
                mechanism: m,
                response: r,
                locale: l,
            }))
        }),
        any::<bool>().prop_map(|n| AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select { nowait: n }))),
        Just(AMQPClass::Tx(tx::AMQPMethod::Select(tx::Select {}))),
        Just(AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {}))),
        Just(AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {}))),
        any::<bool>().prop_map(|a| AMQPClass::Channel(channel::AMQPMethod::Flow(channel::Flow { active: a }))),
    ]
}

/// Methods a client sends on an open channel, without Channel.Open, connection methods
/// and a Basic.Publish without its content.
fn channel_method() -> impl Strategy<Value = AMQPClass> {
    client_method().prop_filter("channel method", |m| {
        !matches!(
            m,
            AMQPClass::Channel(channel::AMQPMethod::Open(_))
                | AMQPClass::Connection(_)
                | AMQPClass::Basic(basic::AMQPMethod::Publish(_))
        )
    })
}

/// One client action for the state-machine test.
#[derive(Debug, Clone)]
enum Action {
    Method(u16, AMQPClass),
    Header(u16, u64, BasicProperties),
    Body(u16, Vec<u8>),
    Publish(u16, bool, Vec<u8>),
    Heartbeat,
    Garbage(Vec<u8>),
    Wait(u16),
    Seq(Vec<Action>),
}

/// Valid actions on channels 1-3 (opened first); a closed channel is reopened at once.
fn valid_action() -> impl Strategy<Value = Action> {
    let open = 1u16..4;
    let reopen = |c: u16, m: AMQPClass| {
        Action::Seq(vec![
            Action::Method(c, m),
            Action::Method(c, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {}))),
        ])
    };
    prop_oneof![
        10 => (open.clone(), any::<bool>(), prop::collection::vec(any::<u8>(), 0..3000)).prop_map(|(c, m, b)| Action::Publish(c, m, b)),
        6 => (open.clone(), channel_method()).prop_map(|(c, m)| Action::Method(c, m)),
        1 => open.clone().prop_map(move |c| reopen(c, AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close::default())))),
        2 => (open, any::<bool>()).prop_map(|(c, n)| Action::Method(c, AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select { nowait: n })))),
        1 => Just(Action::Heartbeat),
        1 => (0u16..3000).prop_map(Action::Wait),
    ]
}

/// Actions that are (mostly) protocol errors.
fn invalid_action() -> impl Strategy<Value = Action> {
    prop_oneof![
        (0u16..6, client_method()).prop_map(|(c, m)| Action::Method(c, m)),
        (0u16..5, 0u64..3000, properties()).prop_map(|(c, s, p)| Action::Header(c, s, p)),
        (0u16..5, prop::collection::vec(any::<u8>(), 0..100)).prop_map(|(c, b)| Action::Body(c, b)),
        prop::collection::vec(any::<u8>(), 1..12).prop_map(Action::Garbage),
        (10_000u16..30_000).prop_map(Action::Wait),
    ]
}

/// Valid actions with, in half the cases, invalid ones mixed in.
fn actions() -> impl Strategy<Value = Vec<Action>> {
    (
        prop::collection::vec(valid_action(), 0..40),
        prop::collection::vec((any::<prop::sample::Index>(), invalid_action()), 0..3),
        any::<bool>(),
    )
        .prop_map(|(mut valid, invalid, mix)| {
            if mix {
                for (at, a) in invalid {
                    let i = at.index(valid.len() + 1);
                    valid.insert(i, a);
                }
            }
            valid
        })
}

fn action_bytes(a: &Action) -> Vec<u8> {
    match a {
        Action::Method(c, m) => method(*c, m.clone()),
        Action::Header(c, size, p) => {
            encode(&AMQPFrame::Header(*c, AMQPContentHeader { class_id: 60, body_size: *size, properties: p.clone() }))
        }
        Action::Body(c, b) => encode(&AMQPFrame::Body(*c, b.clone())),
        Action::Publish(c, mandatory, body) => {
            let mut v = method(
                *c,
                AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                    exchange: "".into(),
                    routing_key: "k".into(),
                    mandatory: *mandatory,
                    immediate: false,
                })),
            );
            v.extend(encode(&AMQPFrame::Header(
                *c,
                AMQPContentHeader {
                    class_id: 60,
                    body_size: body.len() as u64,
                    properties: BasicProperties::default(),
                },
            )));
            for part in body.chunks(4088) {
                v.extend(encode(&AMQPFrame::Body(*c, part.to_vec())));
            }
            v
        }
        Action::Heartbeat => encode(&AMQPFrame::Heartbeat),
        Action::Garbage(g) => g.clone(),
        Action::Wait(_) => Vec::new(),
        Action::Seq(actions) => actions.iter().flat_map(action_bytes).collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Properties.

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..2000), chunk in 1usize..64) {
        feed(&[], &data, chunk);
    }

    #[test]
    fn arbitrary_bytes_after_the_handshake_never_panic(
        data in prop::collection::vec(any::<u8>(), 0..3000),
        chunk in 1usize..200,
    ) {
        feed(&handshake_bytes(), &data, chunk);
    }

    #[test]
    fn frames_after_a_protocol_header_never_panic(data in prop::collection::vec(any::<u8>(), 0..500)) {
        // Mostly well-delimited garbage frames.
        let mut framed = PROTOCOL_HEADER.to_vec();
        for piece in data.chunks(9) {
            framed.push(piece.first().map_or(1, |b| [1u8, 2, 3, 8][usize::from(*b % 4)]));
            framed.extend_from_slice(&[0, 0, 0, 0, 0, piece.len() as u8]);
            framed.extend_from_slice(piece);
            framed.push(0xCE);
        }
        feed(&[], &framed, 7);
    }

    #[test]
    fn random_frame_sequences_never_panic(
        actions in actions(),
        chunk in prop_oneof![1usize..16, 100usize..5000],
    ) {
        let t0 = Instant::now();
        let mut conn = Connection::new(Config { max_message_size: 2000, ..Config::default() }, t0);
        let mut broker = Broker::new();
        let mut now = t0;
        let mut buf = BytesMut::new();
        let mut pending = handshake_bytes();
        for ch in 1..4 {
            pending.extend(method(ch, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {}))));
        }
        for (i, a) in actions.iter().enumerate() {
            if let Action::Wait(ms) = a {
                now += Duration::from_millis(u64::from(*ms));
                if conn.poll_timeout().is_some_and(|t| t <= now) {
                    conn.handle_timeout(now);
                }
            }
            pending.extend(action_bytes(a));
            let mut at = 0;
            let mut reopened = 0;
            while at < pending.len() {
                let end = (at + chunk).min(pending.len());
                buf.extend_from_slice(&pending[at..end]);
                at = end;
                conn.handle_input(&mut buf, now);
                broker.drive(&mut conn, i as u8);
                // Like a real client: answer the server's Channel.Close and reopen.
                for ch in std::mem::take(&mut broker.server_closed) {
                    reopened += 1;
                    if reopened > 3 {
                        break;
                    }
                    pending.extend(method(ch, AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {}))));
                    pending.extend(method(ch, AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {}))));
                }
            }
            pending.clear();
        }
        conn.handle_input(&mut buf, now);
        broker.drive(&mut conn, 0);
        conn.connection_error(320, "CONNECTION_FORCED - test over", 0, 0);
        conn.handle_timeout(now + Duration::from_secs(3600));
        broker.drive(&mut conn, 0);
        prop_assert!(conn.is_closed());
        prop_assert_eq!(broker.closed_events, 1);
    }

    #[test]
    fn server_methods_round_trip_through_amq_protocol(m in server_method(), ch in any::<u16>()) {
        let mut out = BytesMut::new();
        write_method(&mut out, ch, &m);
        let (rest, parsed) = parse_frame(&out[..]).expect("amq-protocol parses our method");
        prop_assert!(rest.is_empty());
        prop_assert_eq!(parsed, AMQPFrame::Method(ch, m.clone()));
        // And our reader reads it back.
        prop_assert_eq!(read_frame(&mut out, u32::MAX), Ok(Some(Frame::Method { channel: ch, method: Box::new(m) })));
    }

    #[test]
    fn client_methods_decode_as_amq_protocol_encodes_them(m in client_method(), ch in any::<u16>()) {
        let bytes = encode(&AMQPFrame::Method(ch, m.clone()));
        let mut buf = BytesMut::from(&bytes[..]);
        prop_assert_eq!(read_frame(&mut buf, u32::MAX), Ok(Some(Frame::Method { channel: ch, method: Box::new(m.clone()) })));
        // Our fallback writer produces the same bytes.
        let mut ours = BytesMut::new();
        write_method(&mut ours, ch, &m);
        prop_assert_eq!(&ours[..], &bytes[..]);
    }

    #[test]
    fn content_round_trips(
        props in properties(),
        body in prop::collection::vec(any::<u8>(), 0..20_000),
        frame_max in 4096u32..70_000,
        ch in 1u16..,
    ) {
        let body = Bytes::from(body);
        let mut out = BytesMut::new();
        write_content(&mut out, ch, &props, &body, frame_max);
        // amq-protocol reads our header.
        let (_, header) = parse_frame(&out[..]).expect("header parses");
        prop_assert_eq!(header, AMQPFrame::Header(ch, AMQPContentHeader { class_id: 60, body_size: body.len() as u64, properties: props.clone() }));
        // The header may be larger than frame_max (big headers tables); the bodies not.
        let first = read_frame(&mut out, u32::MAX);
        let Ok(Some(Frame::Header { channel, class_id: 60, body_size, properties })) = first else {
            panic!("header expected: {first:?}");
        };
        prop_assert_eq!((channel, body_size, *properties), (ch, body.len() as u64, props));
        let mut got = Vec::new();
        while let Some(f) = read_frame(&mut out, frame_max).expect("body frames") {
            let Frame::Body { channel, payload } = f else { panic!("body expected") };
            prop_assert_eq!(channel, ch);
            prop_assert!(!payload.is_empty() && payload.len() <= frame_max as usize - 8);
            got.extend_from_slice(&payload);
        }
        prop_assert_eq!(&got[..], &body[..]);
    }

    #[test]
    fn frames_round_trip(props in properties(), body in prop::collection::vec(any::<u8>(), 0..100), ch in any::<u16>(), size in any::<u64>()) {
        for frame in [
            Frame::Header { channel: ch, class_id: 60, body_size: size, properties: Box::new(props.clone()) },
            Frame::Body { channel: ch, payload: Bytes::from(body.clone()) },
        ] {
            let mut out = BytesMut::new();
            write_frame(&mut out, &frame);
            prop_assert_eq!(read_frame(&mut out, u32::MAX), Ok(Some(frame)));
            prop_assert!(out.is_empty());
        }
    }
}
