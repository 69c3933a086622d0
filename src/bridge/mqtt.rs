//! One MQTT bridge task: connects to the remote broker and to FerryMQ, subscribes on both
//! as the topic lines say, carries messages across with the acks chained end to end, and
//! reconnects with backoff when either link fails.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ferrymq_mqtt::{
    Client, ClientError, ClientEvent, ClientOptions, ProtocolLevel, Publish, PublishProperties, QoS, SubscribeFilter,
};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::topic::{route_in, route_out, TopicRule};
use super::{BridgeStatus, MqttBridgeEntry};
use crate::core::connections::Listener;
use crate::mqtt::MqttContext;

/// Longest wait for a TCP connect, a TLS handshake or a CONNACK.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes the in-process pipe to FerryMQ buffers each way.
const PIPE: usize = 256 * 1024;
/// Largest packet taken from either side.
const MAX_PACKET: usize = 256 * 1024 * 1024;
/// A link that stayed up this long starts the next backoff from its base again.
const STABLE: Duration = Duration::from_secs(30);

/// Why a link went down.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// Connecting or reading/writing failed.
    #[error("{side}: {error}")]
    Io {
        /// `remote` or `local`.
        side: &'static str,
        /// The I/O error.
        error: io::Error,
    },
    /// The protocol failed.
    #[error("{side}: {error}")]
    Protocol {
        /// `remote` or `local`.
        side: &'static str,
        /// The protocol error.
        error: ClientError,
    },
    /// CONNACK refused.
    #[error("{side}: connection refused with reason {reason:#04x}")]
    Refused {
        /// `remote` or `local`.
        side: &'static str,
        /// The reason code.
        reason: u8,
    },
    /// The other side sent DISCONNECT or closed.
    #[error("{side}: disconnected ({why})")]
    Closed {
        /// `remote` or `local`.
        side: &'static str,
        /// Reason code or EOF.
        why: String,
    },
    /// No answer in time.
    #[error("{0}: timed out")]
    Timeout(&'static str),
    /// TLS could not be set up or the name is not one TLS can check.
    #[error("remote: TLS: {0}")]
    Tls(String),
}

/// A byte stream the bridge reads and writes (TCP, TLS, the in-process pipe).
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One side of the bridge: a client machine and its stream.
struct Side {
    name: &'static str,
    client: Client,
    io: Box<dyn Stream>,
    rbuf: BytesMut,
    wbuf: BytesMut,
}

impl Side {
    fn new(name: &'static str, opts: ClientOptions, io: Box<dyn Stream>) -> Result<Side, BridgeError> {
        let client = Client::new(opts, Instant::now()).map_err(|error| BridgeError::Protocol { side: name, error })?;
        Ok(Side { name, client, io, rbuf: BytesMut::with_capacity(8192), wbuf: BytesMut::new() })
    }

    /// Writes what the client queued.
    async fn flush(&mut self) -> Result<(), BridgeError> {
        if self.client.poll_transmit(&mut self.wbuf) {
            let write = async {
                self.io.write_all(&self.wbuf).await?;
                self.io.flush().await
            };
            // A remote that stops reading must not hold the bridge forever.
            match tokio::time::timeout(CONNECT_TIMEOUT, write).await {
                Ok(r) => r.map_err(|error| BridgeError::Io { side: self.name, error })?,
                Err(_) => return Err(BridgeError::Timeout(self.name)),
            }
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Takes in what was read (`n` bytes; 0 is the end of the stream).
    fn on_read(&mut self, n: io::Result<usize>) -> Result<(), BridgeError> {
        match n {
            Ok(0) => Err(BridgeError::Closed { side: self.name, why: "connection closed".into() }),
            Ok(_) => self.client.handle_input(&mut self.rbuf, Instant::now()).map_err(|e| self.fail(e)),
            Err(error) => Err(BridgeError::Io { side: self.name, error }),
        }
    }

    fn fail(&self, error: ClientError) -> BridgeError {
        BridgeError::Protocol { side: self.name, error }
    }

    /// Waits for CONNACK.
    async fn connected(&mut self) -> Result<bool, BridgeError> {
        self.flush().await?;
        let wait = async {
            loop {
                while let Some(ev) = self.client.poll_event() {
                    match ev {
                        ClientEvent::Connected { session_present } => return Ok(session_present),
                        ClientEvent::Refused(r) => return Err(BridgeError::Refused { side: self.name, reason: r.0 }),
                        ClientEvent::Disconnected(r) => {
                            return Err(BridgeError::Closed { side: self.name, why: format!("reason {:#04x}", r.0) })
                        }
                        _ => {}
                    }
                }
                let n = self.io.read_buf(&mut self.rbuf).await;
                self.on_read(n)?;
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, wait).await.map_err(|_| BridgeError::Timeout(self.name))?
    }
}

/// Runs the bridge until `stop` turns true.
pub async fn run(
    ctx: Arc<MqttContext>,
    cfg: MqttBridgeEntry,
    rules: Vec<TopicRule>,
    status: Arc<Mutex<BridgeStatus>>,
    mut stop: watch::Receiver<bool>,
) {
    let base = Duration::from_secs_f64(cfg.restart_timeout.first().copied().unwrap_or(5.0));
    let cap = Duration::from_secs_f64(cfg.restart_timeout.get(1).copied().unwrap_or(30.0)).max(base);
    let mut backoff = base;
    let mut last_error = String::new();
    while !*stop.borrow() {
        let started = Instant::now();
        let mut link_stop = stop.clone();
        let outcome = tokio::select! {
            biased;
            r = link(&ctx, &cfg, &rules, &status, &mut link_stop) => r,
            _ = stop.changed() => Ok(()),
        };
        status.lock().connected = false;
        match outcome {
            Ok(()) => return,
            Err(e) => {
                let e = e.to_string();
                // Logged once per kind of failure: a remote that stays away must not
                // flood the log.
                if e != last_error {
                    warn!(bridge = %cfg.connection, address = %cfg.address, error = %e, "bridge down; reconnecting with backoff");
                } else {
                    debug!(bridge = %cfg.connection, error = %e, "bridge still down");
                }
                status.lock().last_error = Some(e.clone());
                last_error = e;
            }
        }
        if started.elapsed() > STABLE {
            backoff = base;
        }
        // Jitter spreads the reconnects of many edge brokers after an outage of the remote.
        let jitter = 0.75 + 0.5 * unit_random();
        let wait = backoff.mul_f64(jitter);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(cap);
    }
}

/// A number in [0, 1], from the random keys std's hash maps are seeded with.
fn unit_random() -> f64 {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(0u8);
    (r >> 11) as f64 / (1u64 << 53) as f64
}

/// Connects to the remote broker over TCP or TLS.
async fn connect_remote(cfg: &MqttBridgeEntry) -> Result<Box<dyn Stream>, BridgeError> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&cfg.address))
        .await
        .map_err(|_| BridgeError::Timeout("remote"))?
        .map_err(|error| BridgeError::Io { side: "remote", error })?;
    let _ = tcp.set_nodelay(true);
    if cfg.bridge_cafile.is_empty() {
        return Ok(Box::new(tcp));
    }
    let connector = crate::tls::connector(&cfg.bridge_cafile, &cfg.bridge_certfile, &cfg.bridge_keyfile)
        .map_err(|e| BridgeError::Tls(e.to_string()))?;
    let host = cfg.address.rsplit_once(':').map(|(h, _)| h).unwrap_or(&cfg.address);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls_pki_types::ServerName::try_from(host.to_owned()).map_err(|e| BridgeError::Tls(e.to_string()))?;
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
        .await
        .map_err(|_| BridgeError::Timeout("remote"))?
        .map_err(|error| BridgeError::Io { side: "remote", error })?;
    Ok(Box::new(tls))
}

/// Opens the in-process link to FerryMQ: its far end is served as a client connection.
fn connect_local(ctx: &Arc<MqttContext>) -> Box<dyn Stream> {
    let (near, far) = tokio::io::duplex(PIPE);
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let listener = Listener { addr, tls: false, local_only: true, internal: true };
    tokio::spawn(crate::mqtt::connection::serve(ctx.clone(), far, addr, listener, None, ()));
    Box::new(near)
}

/// Subscriptions of one side: the rules' filters on it, no-local (what the bridge
/// publishes there does not come back), retain flags as published.
fn filters(rules: &[TopicRule], local: bool) -> Vec<SubscribeFilter> {
    rules
        .iter()
        .filter(|r| if local { r.direction.out() } else { r.direction.inbound() })
        .map(|r| SubscribeFilter {
            filter: if local { r.local_filter() } else { r.remote_filter() },
            qos: r.qos,
            no_local: true,
            retain_as_published: true,
            retain_handling: 0,
        })
        .collect()
}

/// A message waiting for room in flight on the side it goes to, with the id to ack on
/// the side it came from (`None`: nothing to ack).
struct Waiting {
    publish: Publish,
    from_pkid: Option<u16>,
}

/// What is in flight one way: the id on the side a message went to -> the id to ack on
/// the side it came from.
#[derive(Default)]
struct Leg {
    in_flight: HashMap<u16, u16>,
    waiting: VecDeque<Waiting>,
}

/// One life of the bridge: connect both links, then carry messages until one fails.
async fn link(
    ctx: &Arc<MqttContext>,
    cfg: &MqttBridgeEntry,
    rules: &[TopicRule],
    status: &Arc<Mutex<BridgeStatus>>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), BridgeError> {
    let level = if cfg.bridge_protocol_version == "mqttv50" { ProtocolLevel::V5 } else { ProtocolLevel::V3_1_1 };
    let remote_opts = ClientOptions {
        level,
        client_id: or(&cfg.remote_clientid, || format!("ferrymq.{}", cfg.connection)),
        clean_start: cfg.cleansession,
        keep_alive: cfg.keepalive_interval,
        username: (!cfg.remote_username.is_empty()).then(|| cfg.remote_username.clone()),
        password: (!cfg.remote_password.is_empty()).then(|| Bytes::from(cfg.remote_password.clone().into_bytes())),
        session_expiry: (!cfg.cleansession).then_some(u32::MAX),
        receive_maximum: cfg.max_inflight,
        max_packet_size: MAX_PACKET,
        bridge: cfg.try_private,
    };
    let mut remote = Side::new("remote", remote_opts, connect_remote(cfg).await?)?;
    remote.connected().await?;
    let local_opts = ClientOptions {
        level: ProtocolLevel::V5,
        client_id: or(&cfg.local_clientid, || format!("local.{}", cfg.connection)),
        clean_start: false,
        keep_alive: 0,
        username: (!cfg.local_username.is_empty()).then(|| cfg.local_username.clone()),
        password: None,
        session_expiry: Some(u32::MAX),
        receive_maximum: cfg.max_inflight,
        max_packet_size: MAX_PACKET,
        bridge: false,
    };
    let mut local = Side::new("local", local_opts, connect_local(ctx))?;
    local.connected().await?;
    let now = Instant::now();
    // The bridge counts as connected once both sides answered their SUBSCRIBE: from then
    // on, whatever is published on either side crosses.
    let mut awaiting_subacks = 0;
    for (side, is_local) in [(&mut remote, false), (&mut local, true)] {
        let f = filters(rules, is_local);
        if !f.is_empty() {
            side.client.subscribe(f, now).map_err(|e| side.fail(e))?;
            awaiting_subacks += 1;
        }
    }
    let on_subscribed = |awaiting: &mut i32| {
        *awaiting -= 1;
        if *awaiting == 0 {
            let mut s = status.lock();
            s.connected = true;
            s.connects += 1;
            s.last_error = None;
            drop(s);
            info!(bridge = %cfg.connection, address = %cfg.address, "bridge connected");
        }
    };
    let mut out = Leg::default(); // local -> remote
    let mut inbound = Leg::default(); // remote -> local
    let mut warned_refusal = false;
    loop {
        remote.flush().await?;
        local.flush().await?;
        let deadline = remote.client.poll_timeout();
        tokio::select! {
            n = remote.io.read_buf(&mut remote.rbuf) => remote.on_read(n)?,
            n = local.io.read_buf(&mut local.rbuf) => local.on_read(n)?,
            _ = crate::socket::sleep_until(deadline) => {
                remote.client.handle_timeout(Instant::now()).map_err(|e| remote.fail(e))?;
            }
            _ = stop.changed() => {
                remote.client.disconnect(Instant::now());
                local.client.disconnect(Instant::now());
                let _ = remote.flush().await;
                let _ = local.flush().await;
                return Ok(());
            }
        }
        let now = Instant::now();
        while let Some(ev) = local.client.poll_event() {
            match ev {
                ClientEvent::Publish(p) => {
                    let from = (p.qos != QoS::AtMostOnce).then_some(p.pkid);
                    match route_out(rules, &p.topic) {
                        Some((rule, topic)) => {
                            out.waiting.push_back(Waiting { publish: crossing(p, topic, rule.qos), from_pkid: from })
                        }
                        // Subscribed by a rule, so always routed; acked anyway.
                        None => ack(&mut local, from, now)?,
                    }
                }
                ClientEvent::Delivered { pkid, .. } => {
                    if let Some(from) = inbound.in_flight.remove(&pkid) {
                        remote.client.ack(from, now).map_err(|e| remote.fail(e))?;
                    }
                }
                ClientEvent::SubAck { .. } => on_subscribed(&mut awaiting_subacks),
                ev => closed(&local, ev)?,
            }
        }
        while let Some(ev) = remote.client.poll_event() {
            match ev {
                ClientEvent::Publish(p) => {
                    let from = (p.qos != QoS::AtMostOnce).then_some(p.pkid);
                    match route_in(rules, &p.topic) {
                        Some((rule, topic)) => inbound
                            .waiting
                            .push_back(Waiting { publish: crossing(p, topic, rule.qos), from_pkid: from }),
                        None => ack(&mut remote, from, now)?,
                    }
                }
                ClientEvent::Delivered { pkid, reason } => {
                    if reason.is_error() && !warned_refusal {
                        warned_refusal = true;
                        warn!(bridge = %cfg.connection, reason = reason.0, "the remote broker refused a message (later refusals are not logged)");
                    }
                    if let Some(from) = out.in_flight.remove(&pkid) {
                        local.client.ack(from, now).map_err(|e| local.fail(e))?;
                    }
                }
                ClientEvent::SubAck { reasons, .. } => {
                    if reasons.iter().any(|r| r.is_error()) {
                        warn!(bridge = %cfg.connection, ?reasons, "the remote broker refused a subscription");
                    }
                    on_subscribed(&mut awaiting_subacks);
                }
                ev => closed(&remote, ev)?,
            }
        }
        let sent = send_waiting(&mut out, &mut remote, &mut local, now)?;
        let received = send_waiting(&mut inbound, &mut local, &mut remote, now)?;
        if sent + received > 0 {
            let mut s = status.lock();
            s.sent += sent;
            s.received += received;
        }
    }
}

/// The message as it leaves on the other side: its new topic, at most the rule's QoS.
fn crossing(mut p: Publish, topic: String, max: QoS) -> Publish {
    p.topic = topic;
    p.qos = p.qos.min(max);
    // Subscription identifiers and aliases belong to the link the message came from.
    p.properties = PublishProperties { subscription_identifiers: Vec::new(), topic_alias: None, ..p.properties };
    p
}

/// Publishes what waits on `to` as far as its room in flight allows; messages sent at
/// QoS 0 are acked on `from` at once. Returns how many were sent.
fn send_waiting(leg: &mut Leg, to: &mut Side, from: &mut Side, now: Instant) -> Result<u64, BridgeError> {
    let mut sent = 0;
    while let Some(w) = leg.waiting.front() {
        let qos0 = w.publish.qos == QoS::AtMostOnce;
        if !qos0 && to.client.send_capacity() == 0 {
            break;
        }
        let Some(w) = leg.waiting.pop_front() else { break };
        let pkid = to.client.publish(w.publish, now).map_err(|e| to.fail(e))?;
        match (qos0, w.from_pkid) {
            (true, from_pkid) => ack(from, from_pkid, now)?,
            (false, Some(from_pkid)) => {
                leg.in_flight.insert(pkid, from_pkid);
            }
            (false, None) => {}
        }
        sent += 1;
    }
    Ok(sent)
}

fn ack(side: &mut Side, pkid: Option<u16>, now: Instant) -> Result<(), BridgeError> {
    match pkid {
        Some(id) => side.client.ack(id, now).map_err(|e| side.fail(e)),
        None => Ok(()),
    }
}

/// An event that ends the link (DISCONNECT), or one out of place.
fn closed(side: &Side, ev: ClientEvent) -> Result<(), BridgeError> {
    match ev {
        ClientEvent::Disconnected(r) => {
            Err(BridgeError::Closed { side: side.name, why: format!("reason {:#04x}", r.0) })
        }
        ClientEvent::Connected { .. } | ClientEvent::Refused(_) => {
            Err(BridgeError::Protocol { side: side.name, error: ClientError::Protocol("a CONNACK out of place") })
        }
        _ => Ok(()),
    }
}

fn or(s: &str, default: impl FnOnce() -> String) -> String {
    if s.is_empty() {
        default()
    } else {
        s.to_owned()
    }
}
