//! AMQP 0-9-1 test helpers: one target broker per test (FerryMQ, or a RabbitMQ reference
//! node), `lapin` helpers with bounded waits, and a raw-frame client for what `lapin` cannot
//! send (bad headers, oversized frames, a silent peer).
//!
//! By default every test starts its own FerryMQ (`Broker::start`) and connects to the
//! `amqp=` address of its READY line. With `FERRYMQ_TEST_RABBITMQ=amqp://guest:guest@HOST:PORT/%2f`
//! set, the tests run against that RabbitMQ instead (the reference behaviour); the tests that
//! need a broker restart, a crash, broker configuration or a FerryMQ-only feature call
//! [`skip_on_rabbitmq`] first and return. `FERRYMQ_TEST_RABBITMQ_MQTT=HOST:PORT` names the
//! reference node's MQTT listener (rabbitmq_mqtt) for the gateway tests.
//!
//! Tests can run concurrently against one RabbitMQ: names come from [`unique`].

pub use super::{eventually, eventually_every, WAIT};
use super::{Broker, Opts};

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub use lapin::message::{BasicGetMessage, Delivery};
pub use lapin::options::*;
pub use lapin::types::{AMQPValue, DecimalValue, FieldTable};
pub use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer, Event, ExchangeKind,
};

/// Environment variable naming the reference RabbitMQ's AMQP URI.
pub const RABBITMQ_ENV: &str = "FERRYMQ_TEST_RABBITMQ";
/// Environment variable naming the reference RabbitMQ's MQTT listener (`HOST:PORT`).
pub const RABBITMQ_MQTT_ENV: &str = "FERRYMQ_TEST_RABBITMQ_MQTT";

/// The reference RabbitMQ URI, when the tests run against RabbitMQ.
pub fn rabbitmq_uri() -> Option<String> {
    std::env::var(RABBITMQ_ENV).ok().filter(|s| !s.trim().is_empty())
}

/// True when the tests run against the reference RabbitMQ.
pub fn against_rabbitmq() -> bool {
    rabbitmq_uri().is_some()
}

/// For tests that only make sense against FerryMQ (restart, crash, configuration, FerryMQ
/// extensions): prints why and returns true when running against RabbitMQ, so the test can
/// `return` (it then counts as passed, with the reason in its output).
pub fn skip_on_rabbitmq(why: &str) -> bool {
    if against_rabbitmq() {
        super::skipped(&format!("against RabbitMQ (FerryMQ-only): {why}"));
        true
    } else {
        false
    }
}

/// A name no other test (or earlier run) uses: `prefix-<pid>-<counter>-<random>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    format!("{prefix}-{}-{}-{:06x}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), h.finish() & 0xff_ffff)
}

/// The broker a test talks to.
pub struct Target {
    /// The FerryMQ process (None against RabbitMQ).
    pub broker: Option<Broker>,
    /// AMQP URI with guest/guest and the default vhost.
    pub uri: String,
    /// AMQP listener address.
    pub addr: SocketAddr,
    /// MQTT listener address (FerryMQ's, or the reference node's if configured).
    pub mqtt: Option<SocketAddr>,
}

/// `amqp://guest:guest@ADDR/%2f` for a FerryMQ broker; fails clearly when the broker has no
/// AMQP listener.
pub fn amqp_addr(broker: &Broker) -> SocketAddr {
    broker.amqp.unwrap_or_else(|| {
        panic!(
            "FerryMQ has no amqp= address in its READY line (the AMQP front-end is not listening); log:\n{}",
            broker.log()
        )
    })
}

impl Target {
    /// FerryMQ with defaults, or the reference RabbitMQ when `FERRYMQ_TEST_RABBITMQ` is set.
    pub fn start() -> Target {
        match rabbitmq_uri() {
            Some(uri) => Self::rabbitmq(uri),
            None => Self::ferrymq(Broker::start()),
        }
    }

    /// FerryMQ started with options (configuration tests; FerryMQ-only).
    pub fn start_with(opts: Opts) -> Target {
        Self::ferrymq(Broker::start_with(opts))
    }

    /// Wraps a running FerryMQ.
    pub fn ferrymq(broker: Broker) -> Target {
        let addr = amqp_addr(&broker);
        let uri = format!("amqp://guest:guest@{addr}/%2f");
        let mqtt = Some(broker.mqtt);
        Target { broker: Some(broker), uri, addr, mqtt }
    }

    fn rabbitmq(uri: String) -> Target {
        let hostport = uri.split("://").nth(1).and_then(|r| r.rsplit('@').next()).and_then(|r| r.split('/').next());
        let addr = hostport
            .and_then(|hp| hp.to_socket_addrs().ok())
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("cannot read HOST:PORT from {RABBITMQ_ENV}={uri}"));
        let mqtt =
            std::env::var(RABBITMQ_MQTT_ENV).ok().and_then(|m| m.to_socket_addrs().ok()).and_then(|mut a| a.next());
        Target { broker: None, uri, addr, mqtt }
    }

    /// True against the reference RabbitMQ.
    pub fn is_rabbitmq(&self) -> bool {
        self.broker.is_none()
    }

    /// A URI for other credentials / vhost (vhost given unescaped; `/` becomes `%2f`).
    pub fn uri_for(&self, user: &str, pass: &str, vhost: &str) -> String {
        format!("amqp://{user}:{pass}@{}/{}", self.addr, vhost.replace('/', "%2f"))
    }

    /// Connects with guest/guest (bounded).
    pub async fn connect(&self) -> Connection {
        connect_uri(&self.uri).await.unwrap_or_else(|e| panic!("AMQP connect to {} failed: {e:?}", self.uri))
    }

    /// A connection and one channel on it.
    pub async fn channel(&self) -> (Connection, Channel) {
        let conn = self.connect().await;
        let ch = open_channel(&conn).await;
        (conn, ch)
    }
}

/// Connects to a URI; the whole handshake is bounded by [`WAIT`].
pub async fn connect_uri(uri: &str) -> lapin::Result<Connection> {
    match tokio::time::timeout(WAIT, Connection::connect(uri, ConnectionProperties::default())).await {
        Ok(r) => r,
        Err(_) => panic!("AMQP connect to {uri} did not finish within {WAIT:?}"),
    }
}

/// Opens a channel (bounded).
pub async fn open_channel(conn: &Connection) -> Channel {
    bounded("channel.open", conn.create_channel()).await.expect("channel.open")
}

/// Awaits `f` for at most [`WAIT`], panicking with `what` on time-out.
pub async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {WAIT:?}"),
    }
}

// ----- errors -------------------------------------------------------------------------------

/// The AMQP reply code and text of a channel or connection close reported by lapin.
pub fn amqp_error(e: &lapin::Error) -> Option<(u16, String)> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(err) => Some((err.get_id(), err.get_message().to_string())),
        _ => None,
    }
}

/// Asserts that `r` failed with AMQP reply `code` (channel or connection close); returns
/// the reply text.
#[track_caller]
pub fn expect_code<T: std::fmt::Debug>(r: lapin::Result<T>, code: u16) -> String {
    match r {
        Ok(v) => panic!("expected AMQP error {code}, got Ok({v:?})"),
        Err(e) => match amqp_error(&e) {
            Some((c, text)) => {
                eprintln!("AMQP close {c}: {text}");
                assert_eq!(c, code, "expected reply code {code}, got {c} {text:?}");
                text
            }
            None => panic!("expected AMQP error {code}, got {e:?}"),
        },
    }
}

/// A connection's event stream (`connection.blocked` / `unblocked`, channel and connection
/// errors). lapin only queues events for listeners that exist when the event happens:
/// create it before the action whose outcome it should see.
pub type Events = std::pin::Pin<Box<dyn futures_util::Stream<Item = Event> + Send>>;

/// Starts listening to a connection's events.
pub fn events(conn: &Connection) -> Events {
    Box::pin(conn.events_listener())
}

/// Waits until the server closes a channel (or the connection) with an error — e.g. after
/// an asynchronous error such as a publish to an internal exchange — and returns the reply
/// code and text. lapin reports a server-sent channel.close / connection.close as an
/// `Event::Error(ProtocolError)` on the connection's event stream.
pub async fn server_closed(events: &mut Events) -> (u16, String) {
    loop {
        match next_event(events).await {
            Event::Error(e) => match amqp_error(&e) {
                Some(reason) => {
                    eprintln!("AMQP close {}: {}", reason.0, reason.1);
                    return reason;
                }
                None => panic!("connection error without an AMQP close: {e:?}"),
            },
            _ => continue,
        }
    }
}

/// Waits for the next connection-level event from a listener created with
/// `conn.events_listener()` (bounded); skips `Connected`.
pub async fn next_event(events: &mut Events) -> Event {
    loop {
        match bounded("connection event", events.next()).await {
            Some(Event::Connected) => continue,
            Some(e) => return e,
            None => panic!("connection event stream ended"),
        }
    }
}

// ----- tables and properties -----------------------------------------------------------------

/// A field table from `(key, value)` pairs.
pub fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

/// A 32-bit signed integer value (`I`).
pub fn int(v: i32) -> AMQPValue {
    AMQPValue::LongInt(v)
}

/// A long-string value (`S`).
pub fn string(v: &str) -> AMQPValue {
    AMQPValue::LongString(v.into())
}

/// Looks up `key` in a field table.
pub fn field<'a>(t: &'a FieldTable, key: &str) -> Option<&'a AMQPValue> {
    t.inner().get(key)
}

/// The headers of a message (empty table if none).
pub fn headers(p: &BasicProperties) -> FieldTable {
    p.headers().clone().unwrap_or_default()
}

/// Reads an integer field of any integer type.
pub fn as_i64(v: &AMQPValue) -> Option<i64> {
    Some(match v {
        AMQPValue::ShortShortInt(x) => *x as i64,
        AMQPValue::ShortShortUInt(x) => *x as i64,
        AMQPValue::ShortInt(x) => *x as i64,
        AMQPValue::ShortUInt(x) => *x as i64,
        AMQPValue::LongInt(x) => *x as i64,
        AMQPValue::LongUInt(x) => *x as i64,
        AMQPValue::LongLongInt(x) => *x,
        AMQPValue::Timestamp(x) => *x as i64,
        _ => return None,
    })
}

/// Reads a string field (short or long string, or byte array).
pub fn as_str(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        AMQPValue::ByteArray(b) => Some(String::from_utf8_lossy(b.as_slice()).into_owned()),
        _ => None,
    }
}

/// Persistent delivery mode properties.
pub fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

// ----- declarations ---------------------------------------------------------------------------

/// Declares a (non-durable, non-exclusive) queue with arguments; returns its name.
pub async fn declare_queue(ch: &Channel, name: &str, args: FieldTable) -> String {
    declare_queue_with(ch, name, QueueDeclareOptions::default(), args).await.name().to_string()
}

/// Declares an exclusive, server-named queue; returns its name.
pub async fn declare_exclusive(ch: &Channel) -> String {
    let opts = QueueDeclareOptions { exclusive: true, ..Default::default() };
    declare_queue_with(ch, "", opts, FieldTable::default()).await.name().to_string()
}

/// Declares a queue with options and arguments (panics on error).
pub async fn declare_queue_with(ch: &Channel, name: &str, opts: QueueDeclareOptions, args: FieldTable) -> lapin::Queue {
    bounded("queue.declare", ch.queue_declare(name.into(), opts, args))
        .await
        .unwrap_or_else(|e| panic!("queue.declare {name}: {e:?}"))
}

/// Declares an exchange (panics on error).
pub async fn declare_exchange(
    ch: &Channel,
    name: &str,
    kind: ExchangeKind,
    opts: ExchangeDeclareOptions,
    args: FieldTable,
) {
    bounded("exchange.declare", ch.exchange_declare(name.into(), kind, opts, args))
        .await
        .unwrap_or_else(|e| panic!("exchange.declare {name}: {e:?}"))
}

/// Binds a queue (panics on error).
pub async fn bind(ch: &Channel, queue: &str, exchange: &str, key: &str, args: FieldTable) {
    bounded("queue.bind", ch.queue_bind(queue.into(), exchange.into(), key.into(), QueueBindOptions::default(), args))
        .await
        .unwrap_or_else(|e| panic!("queue.bind {queue} -> {exchange} ({key}): {e:?}"))
}

/// Deletes a queue, ignoring errors (clean-up against a shared RabbitMQ).
pub async fn delete_queue(ch: &Channel, queue: &str) {
    let _ = tokio::time::timeout(WAIT, ch.queue_delete(queue.into(), QueueDeleteOptions::default())).await;
}

/// Deletes an exchange, ignoring errors (clean-up against a shared RabbitMQ).
pub async fn delete_exchange(ch: &Channel, exchange: &str) {
    let _ = tokio::time::timeout(WAIT, ch.exchange_delete(exchange.into(), ExchangeDeleteOptions::default())).await;
}

/// Passive queue.declare: `Ok((messages, consumers))` if it exists, else the error.
pub async fn queue_counts(ch: &Channel, queue: &str) -> lapin::Result<(u32, u32)> {
    bounded(
        "passive queue.declare",
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions { passive: true, ..Default::default() },
            FieldTable::default(),
        ),
    )
    .await
    .map(|q| (q.message_count(), q.consumer_count()))
}

/// True if the queue exists (passive declare on a throw-away channel).
pub async fn queue_exists(conn: &Connection, queue: &str) -> bool {
    let ch = open_channel(conn).await;
    match queue_counts(&ch, queue).await {
        Ok(_) => {
            let _ = ch.close(200, "OK".into()).await;
            true
        }
        Err(e) => match amqp_error(&e).map(|c| c.0) {
            Some(404) => false,
            // Exclusive to another connection (which may be closing): it still exists.
            Some(405) => true,
            _ => panic!("passive declare failed otherwise: {e:?}"),
        },
    }
}

/// True if the exchange exists (passive declare on a throw-away channel).
pub async fn exchange_exists(conn: &Connection, exchange: &str) -> bool {
    let ch = open_channel(conn).await;
    let r = bounded(
        "passive exchange.declare",
        ch.exchange_declare(
            exchange.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions { passive: true, ..Default::default() },
            FieldTable::default(),
        ),
    )
    .await;
    match r {
        Ok(()) => {
            let _ = ch.close(200, "OK".into()).await;
            true
        }
        Err(e) => {
            assert_eq!(amqp_error(&e).map(|c| c.0), Some(404), "passive declare failed otherwise: {e:?}");
            false
        }
    }
}

// ----- publishing -----------------------------------------------------------------------------

/// Publishes (no confirm wait).
pub async fn publish(ch: &Channel, exchange: &str, key: &str, body: &[u8], props: BasicProperties) {
    publish_opts(ch, exchange, key, BasicPublishOptions::default(), body, props).await;
}

/// Publishes with options (no confirm wait); returns the confirm future.
pub async fn publish_opts(
    ch: &Channel,
    exchange: &str,
    key: &str,
    opts: BasicPublishOptions,
    body: &[u8],
    props: BasicProperties,
) -> lapin::PublisherConfirm {
    bounded("basic.publish", ch.basic_publish(exchange.into(), key.into(), opts, body, props))
        .await
        .unwrap_or_else(|e| panic!("basic.publish to {exchange:?}/{key:?}: {e:?}"))
}

/// Publishes on a channel in confirm mode and waits for the broker's ack or nack.
pub async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    key: &str,
    body: &[u8],
    props: BasicProperties,
) -> Confirmation {
    let c = publish_opts(ch, exchange, key, BasicPublishOptions::default(), body, props).await;
    bounded("publisher confirm", c).await.expect("publisher confirm")
}

/// Publishes `body` to `queue` (default exchange) from a task, since lapin holds outgoing
/// frames while the connection is blocked, and waits in `events` (the connection's, taken
/// before the alarm was raised) for connection.blocked; returns its reason and the task,
/// which resolves to the publish's confirmation (it must not resolve while the connection
/// stays blocked: checked here for 500 ms).
pub async fn publish_into_a_block(
    conn: &Connection,
    events: &mut Events,
    ch: &Channel,
    queue: &str,
    body: &'static [u8],
) -> (String, tokio::task::JoinHandle<lapin::Result<Confirmation>>) {
    let mut publisher = {
        let (ch, q) = (ch.clone(), queue.to_string());
        tokio::spawn(async move {
            let confirm = ch
                .basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default(),
                )
                .await?;
            confirm.await
        })
    };
    let reason = match next_event(events).await {
        Event::ConnectionBlocked(reason) => reason.to_string(),
        other => panic!("expected connection.blocked, got {other:?}"),
    };
    assert!(conn.status().blocked());
    // Bounded negative wait: the confirm must not come while blocked.
    if let Ok(done) = tokio::time::timeout(Duration::from_millis(500), &mut publisher).await {
        panic!("the publish finished while blocked: {done:?}");
    }
    (reason, publisher)
}

/// Enables publisher confirms.
pub async fn confirm_select(ch: &Channel) {
    bounded("confirm.select", ch.confirm_select(ConfirmSelectOptions::default())).await.expect("confirm.select");
}

/// Publishes `bodies` to the default exchange → `queue` with confirms, and waits for all acks.
pub async fn fill(ch: &Channel, queue: &str, bodies: &[&str]) {
    for b in bodies {
        publish(ch, "", queue, b.as_bytes(), BasicProperties::default()).await;
    }
    if ch.status().confirm() {
        bounded("confirms", ch.wait_for_confirms()).await.expect("wait_for_confirms");
    } else {
        // Without confirms, a round trip on the channel orders after the publishes.
        queue_counts(ch, queue).await.expect("passive declare after publishes");
    }
}

// ----- consuming -------------------------------------------------------------------------------

/// Starts a consumer with a server-generated tag.
pub async fn consume(ch: &Channel, queue: &str, opts: BasicConsumeOptions, args: FieldTable) -> Consumer {
    bounded("basic.consume", ch.basic_consume(queue.into(), "".into(), opts, args))
        .await
        .unwrap_or_else(|e| panic!("basic.consume {queue}: {e:?}"))
}

/// The next delivery (bounded by [`WAIT`]); panics on cancel or error.
pub async fn next_delivery(c: &mut Consumer) -> Delivery {
    next_delivery_within(c, WAIT).await
}

/// The next delivery within `d`; panics on cancel, error or time-out.
pub async fn next_delivery_within(c: &mut Consumer, d: Duration) -> Delivery {
    match tokio::time::timeout(d, c.next()).await {
        Ok(Some(Ok(del))) => del,
        Ok(Some(Err(e))) => panic!("consumer {} failed: {e:?}", c.tag()),
        Ok(None) => panic!("consumer {} was cancelled", c.tag()),
        Err(_) => panic!("no delivery for consumer {} within {d:?}", c.tag()),
    }
}

/// Asserts that nothing is delivered within `d`. A bounded negative wait: there is no event
/// for "the broker decided not to deliver", so the test waits a short, fixed time.
pub async fn expect_no_delivery(c: &mut Consumer, d: Duration) {
    match tokio::time::timeout(d, c.next()).await {
        Err(_) => {}
        Ok(Some(Ok(del))) => {
            panic!("unexpected delivery {:?} ({:?})", String::from_utf8_lossy(&del.data), del.routing_key)
        }
        Ok(Some(Err(e))) => panic!("consumer failed: {e:?}"),
        Ok(None) => panic!("consumer was cancelled"),
    }
}

/// Waits until the consumer's stream ends (a server-sent basic.cancel); panics on a
/// delivery or time-out.
pub async fn expect_cancelled(c: &mut Consumer) {
    match tokio::time::timeout(WAIT, c.next()).await {
        Ok(None) => {}
        Ok(Some(Ok(d))) => panic!("expected cancel, got a delivery {:?}", String::from_utf8_lossy(&d.data)),
        Ok(Some(Err(e))) => panic!("expected cancel, got an error {e:?}"),
        Err(_) => panic!("consumer {} not cancelled within {WAIT:?}", c.tag()),
    }
}

/// Takes `n` deliveries and returns their bodies.
pub async fn take(c: &mut Consumer, n: usize) -> Vec<Delivery> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(next_delivery(c).await);
    }
    v
}

/// The body as text.
pub fn text(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.data).into_owned()
}

/// The bodies as text.
pub fn texts(ds: &[Delivery]) -> Vec<String> {
    ds.iter().map(text).collect()
}

/// basic.get (bounded); `None` on get-empty.
pub async fn get(ch: &Channel, queue: &str, no_ack: bool) -> Option<BasicGetMessage> {
    bounded("basic.get", ch.basic_get(queue.into(), BasicGetOptions { no_ack }))
        .await
        .unwrap_or_else(|e| panic!("basic.get {queue}: {e:?}"))
}

/// basic.get with auto-ack of every message until empty; returns the bodies in order.
pub async fn drain(ch: &Channel, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(m) = get(ch, queue, true).await {
        out.push(String::from_utf8_lossy(&m.delivery.data).into_owned());
    }
    out
}

// ----- raw frames -----------------------------------------------------------------------------

/// The AMQP 0-9-1 protocol header.
pub const PROTOCOL_HEADER: &[u8] = b"AMQP\x00\x00\x09\x01";

/// One frame read from the wire.
#[derive(Debug, Clone)]
pub struct Frame {
    /// 1 method, 2 header, 3 body, 8 heartbeat.
    pub kind: u8,
    /// Channel number.
    pub channel: u16,
    /// Payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// (class id, method id) of a method frame.
    pub fn method(&self) -> Option<(u16, u16)> {
        (self.kind == 1 && self.payload.len() >= 4).then(|| {
            (
                u16::from_be_bytes([self.payload[0], self.payload[1]]),
                u16::from_be_bytes([self.payload[2], self.payload[3]]),
            )
        })
    }

    /// (reply code, reply text) of a connection.close or channel.close frame.
    pub fn close_reason(&self) -> Option<(u16, String)> {
        match self.method() {
            Some((10, 50)) | Some((20, 40)) => {
                let p = &self.payload[4..];
                let code = u16::from_be_bytes([p[0], p[1]]);
                let n = p[2] as usize;
                Some((code, String::from_utf8_lossy(&p[3..3 + n]).into_owned()))
            }
            _ => None,
        }
    }
}

/// Encodes a frame.
pub fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![kind];
    v.extend_from_slice(&channel.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v.push(0xCE);
    v
}

/// Encodes a method frame from class, method and encoded arguments.
pub fn method_frame(channel: u16, class: u16, method: u16, args: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&class.to_be_bytes());
    p.extend_from_slice(&method.to_be_bytes());
    p.extend_from_slice(args);
    frame(1, channel, &p)
}

/// Encodes a short string.
pub fn shortstr(s: &str) -> Vec<u8> {
    let mut v = vec![s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}

/// Encodes a long string.
pub fn longstr(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

/// A raw AMQP client over any byte stream (TCP or TLS).
pub struct RawAmqp<S> {
    /// The stream.
    pub stream: S,
    buf: Vec<u8>,
}

impl RawAmqp<TcpStream> {
    /// Connects over TCP.
    pub async fn connect(addr: SocketAddr) -> Self {
        RawAmqp::new(bounded("tcp connect", TcpStream::connect(addr)).await.expect("tcp connect"))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> RawAmqp<S> {
    /// Wraps a connected stream.
    pub fn new(stream: S) -> Self {
        RawAmqp { stream, buf: Vec::new() }
    }

    /// Writes bytes.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
        self.stream.flush().await.expect("flush");
    }

    /// Reads more bytes into the buffer within `d`: Some(true) data, Some(false) EOF / error,
    /// None time-out.
    async fn fill(&mut self, d: Duration) -> Option<bool> {
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout(d, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => Some(false),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Some(true)
            }
            Err(_) => None,
        }
    }

    /// Reads exactly `n` raw bytes (e.g. the server's protocol header answer); returns fewer
    /// if the server closed first.
    pub async fn read_raw(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            match self.fill(WAIT).await {
                Some(true) => {}
                Some(false) => break,
                None => panic!("nothing from the server within {WAIT:?} (buffered {:02x?})", self.buf),
            }
        }
        let k = n.min(self.buf.len());
        self.buf.drain(..k).collect()
    }

    /// The next frame within `d` (heartbeats included): `Ok(None)` if the server closed the
    /// connection, `Err(())` if nothing complete arrived in time.
    pub async fn try_read_frame(&mut self, d: Duration) -> Result<Option<Frame>, ()> {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            if self.buf.len() >= 7 {
                let size = u32::from_be_bytes([self.buf[3], self.buf[4], self.buf[5], self.buf[6]]) as usize;
                if self.buf.len() >= 8 + size {
                    let f = Frame {
                        kind: self.buf[0],
                        channel: u16::from_be_bytes([self.buf[1], self.buf[2]]),
                        payload: self.buf[7..7 + size].to_vec(),
                    };
                    assert_eq!(self.buf[7 + size], 0xCE, "frame end octet");
                    self.buf.drain(..8 + size);
                    return Ok(Some(f));
                }
            }
            match self.fill(deadline.saturating_duration_since(tokio::time::Instant::now())).await {
                Some(true) => {}
                Some(false) => return Ok(None),
                None => return Err(()),
            }
        }
    }

    /// The next frame within `d` (heartbeats included); `None` if the server closed the
    /// connection; panics on time-out.
    pub async fn read_frame_within(&mut self, d: Duration) -> Option<Frame> {
        match self.try_read_frame(d).await {
            Ok(f) => f,
            Err(()) => panic!("no frame from the server within {d:?} (buffered {:02x?})", self.buf),
        }
    }

    /// The next non-heartbeat frame (bounded by [`WAIT`]); `None` on close.
    pub async fn read_frame(&mut self) -> Option<Frame> {
        loop {
            match self.read_frame_within(WAIT).await {
                Some(f) if f.kind == 8 => continue,
                other => return other,
            }
        }
    }

    /// The next method frame; panics unless it is (class, method).
    pub async fn expect_method(&mut self, class: u16, method: u16) -> Frame {
        let f =
            self.read_frame().await.unwrap_or_else(|| panic!("connection closed, expected method {class}.{method}"));
        assert_eq!(
            f.method(),
            Some((class, method)),
            "expected method {class}.{method}, got {f:?} (close: {:?})",
            f.close_reason()
        );
        f
    }

    /// Sends the protocol header and answers Start / Tune, then sends connection.open.
    /// `frame_max` 0 accepts the server's proposal; `heartbeat` is sent as is.
    /// Returns the connection.start frame and the server's tune (channel_max, frame_max,
    /// heartbeat). The caller reads the answer to open (open-ok or close).
    pub async fn handshake_until_open(
        &mut self,
        user: &str,
        pass: &str,
        vhost: &str,
        frame_max: u32,
        heartbeat: u16,
    ) -> (Frame, (u16, u32, u16)) {
        self.send(PROTOCOL_HEADER).await;
        let start = self.expect_method(10, 10).await;
        let mut args = Vec::new();
        args.extend_from_slice(&0u32.to_be_bytes()); // client-properties: empty table
        args.extend(shortstr("PLAIN"));
        args.extend(longstr(format!("\0{user}\0{pass}").as_bytes()));
        args.extend(shortstr("en_US"));
        self.send(&method_frame(0, 10, 11, &args)).await;
        let tune = self.expect_method(10, 30).await;
        let p = &tune.payload[4..];
        let server = (
            u16::from_be_bytes([p[0], p[1]]),
            u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
            u16::from_be_bytes([p[6], p[7]]),
        );
        let mut args = Vec::new();
        args.extend_from_slice(&server.0.to_be_bytes());
        // 0 = take the server's frame_max (RabbitMQ refuses an unlimited frame_max).
        let frame_max = if frame_max == 0 { server.1 } else { frame_max };
        args.extend_from_slice(&frame_max.to_be_bytes());
        args.extend_from_slice(&heartbeat.to_be_bytes());
        self.send(&method_frame(0, 10, 31, &args)).await;
        let mut args = shortstr(vhost);
        args.extend(shortstr(""));
        args.push(0);
        self.send(&method_frame(0, 10, 40, &args)).await;
        (start, server)
    }

    /// Full handshake as guest/guest on `/`, up to connection.open-ok.
    pub async fn handshake(&mut self, frame_max: u32, heartbeat: u16) -> (u16, u32, u16) {
        let (_, tune) = self.handshake_until_open("guest", "guest", "/", frame_max, heartbeat).await;
        self.expect_method(10, 41).await;
        tune
    }

    /// Opens channel `n` (channel.open / open-ok).
    pub async fn open_channel(&mut self, n: u16) {
        self.send(&method_frame(n, 20, 10, &shortstr(""))).await;
        self.expect_method(20, 11).await;
    }

    /// Reads frames until a connection.close arrives; answers close-ok and returns its
    /// reason. Panics if the server just drops the connection.
    pub async fn expect_connection_close(&mut self) -> (u16, String) {
        loop {
            let f = self.read_frame().await.expect("server closed the socket without connection.close");
            if f.method() == Some((10, 50)) {
                let reason = f.close_reason().unwrap();
                self.send(&method_frame(0, 10, 51, &[])).await;
                return reason;
            }
        }
    }

    /// Reads until the server closes the socket (bounded by `d`); returns the frames seen.
    pub async fn read_until_closed(&mut self, d: Duration) -> Vec<Frame> {
        let deadline = tokio::time::Instant::now() + d;
        let mut frames = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(!left.is_zero(), "connection still open after {d:?}; frames: {frames:?}");
            match self.try_read_frame(left).await {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => return frames,
                Err(()) => panic!("connection still open after {d:?}; frames: {frames:?}"),
            }
        }
    }
}

/// basic.publish + header + body frames for a message of `body_len` bytes, split into body
/// frames of at most `chunk` bytes.
pub fn publish_frames(channel: u16, exchange: &str, key: &str, body: &[u8], chunk: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut args = 0u16.to_be_bytes().to_vec();
    args.extend(shortstr(exchange));
    args.extend(shortstr(key));
    args.push(0);
    out.extend(method_frame(channel, 60, 40, &args));
    let mut header = Vec::new();
    header.extend_from_slice(&60u16.to_be_bytes());
    header.extend_from_slice(&0u16.to_be_bytes());
    header.extend_from_slice(&(body.len() as u64).to_be_bytes());
    header.extend_from_slice(&0u16.to_be_bytes());
    out.extend(frame(2, channel, &header));
    for part in body.chunks(chunk.max(1)) {
        out.extend(frame(3, channel, part));
    }
    out
}

// ----- FerryMQ configuration reload ------------------------------------------------------------

/// Rewrites the broker's `--config` file (the harness writes it at `dir.with_extension("toml")`)
/// and sends SIGHUP so the broker reloads it.
pub fn rewrite_config_and_reload(broker: &Broker, toml: &str) {
    let path = broker.dir.with_extension("toml");
    assert!(path.exists(), "the broker was not started with a config file ({path:?})");
    std::fs::write(&path, toml).unwrap();
    let pid = broker.pid().expect("broker is running");
    let status = std::process::Command::new("kill").arg("-HUP").arg(pid.to_string()).status().unwrap();
    assert!(status.success(), "kill -HUP {pid}");
}

// ----- streams ---------------------------------------------------------------------------------

/// Queue arguments of a stream (`x-queue-type: stream`) plus `extra`.
pub fn stream_args(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut pairs = vec![("x-queue-type", string("stream"))];
    pairs.extend(extra.iter().cloned());
    table(&pairs)
}

/// Declares a durable stream.
pub async fn declare_stream(ch: &Channel, name: &str, extra: &[(&str, AMQPValue)]) {
    declare_queue_with(ch, name, QueueDeclareOptions { durable: true, ..Default::default() }, stream_args(extra)).await;
}

/// A channel with prefetch `n` (required to consume a stream).
pub async fn stream_channel(conn: &Connection, n: u16) -> Channel {
    let ch = open_channel(conn).await;
    bounded("basic.qos", ch.basic_qos(n, BasicQosOptions::default())).await.expect("basic.qos");
    ch
}

/// A consumer of `stream` with `args` on a channel of its own with prefetch `n`.
pub async fn stream_consumer(conn: &Connection, n: u16, stream: &str, args: FieldTable) -> (Channel, Consumer) {
    let ch = stream_channel(conn, n).await;
    let c = consume(&ch, stream, BasicConsumeOptions::default(), args).await;
    (ch, c)
}

/// Consume arguments `x-stream-offset: v`.
pub fn offset_arg(v: AMQPValue) -> FieldTable {
    table(&[("x-stream-offset", v)])
}

/// The `x-stream-offset` header of a delivery (RabbitMQ sends a long).
pub fn offset_of(d: &Delivery) -> i64 {
    let h = headers(&d.properties);
    let v = field(&h, "x-stream-offset").unwrap_or_else(|| panic!("no x-stream-offset header in {h:?}"));
    assert!(matches!(v, AMQPValue::LongLongInt(_)), "x-stream-offset is a long: {v:?}");
    as_i64(v).unwrap()
}

/// The entries of the `x-death` header.
pub fn x_death(d: &Delivery) -> Vec<FieldTable> {
    match field(&headers(&d.properties), "x-death") {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .map(|v| match v {
                AMQPValue::FieldTable(t) => t.clone(),
                other => panic!("x-death entry is not a table: {other:?}"),
            })
            .collect(),
        other => panic!("no x-death array in {:?} (found {other:?})", d.properties.headers()),
    }
}

/// A string field of a table (panics naming the field when it is missing).
pub fn str_field(t: &FieldTable, k: &str) -> String {
    field(t, k).and_then(as_str).unwrap_or_else(|| panic!("{k} missing or not a string in {t:?}"))
}
