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
    Will,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::topic::{route_in, route_out, TopicRule};
use super::{local_clientid, Bridge, MqttBridgeEntry};
use crate::core::broker::Commit;
use crate::core::connections::Listener;
use crate::core::store::StoreWrite;
use crate::frontends::mqtt::MqttContext;

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
pub(crate) enum BridgeError {
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
    /// The main address accepts connections again: the bridge leaves the fail-over one.
    #[error("the main address is back")]
    MainBack,
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
pub(crate) async fn run(
    ctx: Arc<MqttContext>,
    cfg: MqttBridgeEntry,
    rules: Vec<TopicRule>,
    bridge: Arc<Bridge>,
    mut stop: watch::Receiver<bool>,
) {
    let status = &bridge.status;
    let base = Duration::from_secs_f64(cfg.restart_timeout.first().copied().unwrap_or(5.0));
    let cap = Duration::from_secs_f64(cfg.restart_timeout.get(1).copied().unwrap_or(30.0)).max(base);
    let state_topic = notification_topic(&cfg);
    status.lock().state_topic = cfg.notifications.then(|| state_topic.clone());
    let mut backoff = base;
    let mut last_error = String::new();
    // The address tried next, and failed attempts since the bridge was last up.
    let (mut at, mut failures) = (0usize, 0usize);
    // The remote the last link that came up relayed from.
    let mut last_up: Option<String> = None;
    while !*stop.borrow() {
        let started = Instant::now();
        let address = cfg.address[at].clone();
        status.lock().address = address.clone();
        // On a fail-over address the main one is probed, unless all are equals.
        let main = (at != 0 && !cfg.round_robin).then(|| (cfg.address[0].as_str(), base));
        let new_remote = last_up.as_ref().is_some_and(|a| *a != address);
        let attempt = Attempt { address: &address, main, new_remote };
        let mut link_stop = stop.clone();
        let outcome = tokio::select! {
            biased;
            r = link(&ctx, &cfg, &rules, &bridge, &mut link_stop, attempt) => r,
            _ = stop.changed() => Ok(()),
        };
        let was_up = std::mem::replace(&mut status.lock().connected, false);
        if was_up {
            failures = 0;
            last_up = Some(address.clone());
            if cfg.notifications {
                crate::frontends::mqtt::sys::publish(&ctx, &state_topic, "0".into()).await;
            }
        }
        match outcome {
            Ok(()) => return,
            Err(BridgeError::MainBack) => {
                info!(bridge = %cfg.connection, address = %cfg.address[0], "the main address is back; the bridge moves to it");
                (at, failures, backoff) = (0, 0, base);
                continue;
            }
            Err(e) => {
                let e = e.to_string();
                // Logged once per kind of failure: a remote that stays away must not
                // flood the log.
                if e != last_error {
                    warn!(bridge = %cfg.connection, address = %address, error = %e, "bridge down; reconnecting with backoff");
                } else {
                    debug!(bridge = %cfg.connection, address = %address, error = %e, "bridge still down");
                }
                status.lock().last_error = Some(e.clone());
                last_error = e;
            }
        }
        if started.elapsed() > STABLE {
            backoff = base;
        }
        // The next address at once (after the base wait); the backoff grows only when
        // every address failed in turn.
        failures += 1;
        at = (at + 1) % cfg.address.len();
        let wait = if failures % cfg.address.len() != 0 {
            base
        } else {
            let w = backoff;
            backoff = (backoff * 2).min(cap);
            w
        };
        // Jitter spreads the reconnects of many edge brokers after an outage of the remote.
        let jitter = 0.75 + 0.5 * unit_random();
        tokio::select! {
            _ = tokio::time::sleep(wait.mul_f64(jitter)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The bridge's client id at the remote broker.
fn remote_clientid(cfg: &MqttBridgeEntry) -> String {
    or(&cfg.remote_clientid, || format!("ferrymq.{}", cfg.connection))
}

/// Where the bridge's state is published (Mosquitto's default topic).
fn notification_topic(cfg: &MqttBridgeEntry) -> String {
    or(&cfg.notification_topic, || format!("$SYS/broker/connection/{}/state", remote_clientid(cfg)))
}

/// The bridge's state as a retained QoS 1 message.
fn state_message(topic: &str, up: bool, qos: QoS) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: true,
        topic: topic.to_owned(),
        pkid: 0,
        payload: Bytes::from_static(if up { b"1" } else { b"0" }),
        properties: PublishProperties::default(),
    }
}

/// Resolves once `main` accepts a TCP connection again, probed every `every`.
async fn main_back(main: Option<(&str, Duration)>) {
    let Some((address, every)) = main else { return std::future::pending().await };
    loop {
        tokio::time::sleep(every).await;
        if let Ok(Ok(_)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            return;
        }
    }
}

/// A number in [0, 1], from the random keys std's hash maps are seeded with.
fn unit_random() -> f64 {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(0u8);
    (r >> 11) as f64 / (1u64 << 53) as f64
}

/// Connects to the remote broker at `address` over TCP or TLS.
async fn connect_remote(cfg: &MqttBridgeEntry, address: &str) -> Result<Box<dyn Stream>, BridgeError> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
        .await
        .map_err(|_| BridgeError::Timeout("remote"))?
        .map_err(|error| BridgeError::Io { side: "remote", error })?;
    let _ = tcp.set_nodelay(true);
    if cfg.bridge_cafile.is_empty() {
        return Ok(Box::new(tcp));
    }
    let connector = crate::transport::tls::connector(
        &cfg.bridge_cafile,
        &cfg.bridge_certfile,
        &cfg.bridge_keyfile,
        cfg.bridge_insecure,
        crate::transport::tls::BRIDGE_SETTINGS,
    )
    .map_err(|e| BridgeError::Tls(e.to_string()))?;
    let host = address.rsplit_once(':').map(|(h, _)| h).unwrap_or(address);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls_pki_types::ServerName::try_from(host.to_owned()).map_err(|e| BridgeError::Tls(e.to_string()))?;
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
        .await
        .map_err(|_| BridgeError::Timeout("remote"))?
        .map_err(|error| BridgeError::Io { side: "remote", error })?;
    Ok(Box::new(tls))
}

/// The bridge moved to another remote broker: the QoS 2 packet ids FerryMQ's session
/// still holds from the previous one (stored, waiting for a PUBREL that broker will send
/// when the bridge is back there, and that is then completed as unknown) would make this
/// broker's messages under the same ids look like re-sends. They are released.
async fn forget_inbound_qos2(ctx: &MqttContext, local_id: &str) {
    let qos2 = &ctx.broker.stores().inbound_qos2;
    let pending = qos2.pending(local_id).await.unwrap_or_default();
    if pending.is_empty() {
        return;
    }
    let write = pending.iter().fold(StoreWrite::none(), |w, &id| w.and(qos2.released(local_id, id)));
    // The session's ids are read at its CONNECT below once this is applied.
    if let Err(e) = ctx.broker.commit(write, Commit::Queued).await {
        warn!(error = %e, "cannot release the previous remote's QoS 2 ids");
    }
}

/// Opens the in-process link to FerryMQ: its far end is served as a client connection
/// whose refusals count for the bridge.
fn connect_local(ctx: &Arc<MqttContext>, bridge: &Bridge) -> Box<dyn Stream> {
    let (near, far) = tokio::io::duplex(PIPE);
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let listener = Listener { addr, tls: false, local_only: true, internal: true };
    let refusals = bridge.refusals.clone();
    tokio::spawn(crate::frontends::mqtt::connection::serve_internal(ctx.clone(), far, addr, listener, refusals));
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

/// A message waiting for room in flight on the side it goes to, with the QoS it came in
/// at (its packet id is the one it had on the side it came from).
struct Waiting {
    publish: Publish,
    from_qos: QoS,
}

/// Where a relayed QoS 1/2 message is. It keeps its packet id on both sides, so after a
/// crash of FerryMQ the sessions on either side hold the same id and a re-sent PUBLISH or
/// PUBREL is recognised as one by the side it goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Sent on at QoS 1: its PUBACK there acks it here (`from_qos2`: with PUBREC).
    AwaitAck { from_qos2: bool },
    /// Sent on at QoS 2: its PUBREC there is passed back here.
    AwaitRec,
    /// PUBREC'd on both sides: PUBREL here is passed on there.
    AwaitRel,
    /// PUBREL passed on: PUBCOMP there is passed back here.
    AwaitComp,
    /// A QoS 2 message acked here with nothing left in flight there (sent on at QoS 0 or
    /// 1, or refused): PUBREL here is completed at once.
    Settled,
}

/// One direction of the bridge: messages waiting for room, and the stage of each one in
/// flight by its packet id.
#[derive(Default)]
struct Leg {
    stages: HashMap<u16, Stage>,
    waiting: VecDeque<Waiting>,
    /// PUBRELs from the source (a resumed session's) that came before the link was up:
    /// passed on once it is, so that none meets the bridge's own SUBSCRIBE or state
    /// message under the same id.
    held_releases: Vec<u16>,
}

impl Leg {
    /// A PUBLISH from the source side: queued to go on (routed by a topic line), or acked
    /// at once.
    fn take(
        &mut self,
        p: Publish,
        route: Option<(&TopicRule, String)>,
        from: &mut Side,
        now: Instant,
    ) -> Result<(), BridgeError> {
        let from_qos = p.qos;
        match route {
            Some((rule, topic)) => self.waiting.push_back(Waiting { publish: crossing(p, topic, rule.qos), from_qos }),
            // Subscribed by a rule, so always routed; acked anyway.
            None => self.settle(p.pkid, from_qos, from, now)?,
        }
        Ok(())
    }

    /// Acks a message on the source side that has nothing in flight on the other.
    fn settle(&mut self, pkid: u16, from_qos: QoS, from: &mut Side, now: Instant) -> Result<(), BridgeError> {
        if from_qos == QoS::AtMostOnce {
            return Ok(());
        }
        from.client.ack(pkid, now).map_err(|e| from.fail(e))?;
        if from_qos == QoS::ExactlyOnce {
            self.stages.insert(pkid, Stage::Settled);
        }
        Ok(())
    }

    /// Publishes what waits on `to` as far as its room in flight allows. Returns how many
    /// were sent.
    fn send_waiting(&mut self, to: &mut Side, from: &mut Side, now: Instant) -> Result<u64, BridgeError> {
        let mut sent = 0;
        while let Some(w) = self.waiting.front() {
            if w.publish.qos != QoS::AtMostOnce && to.client.send_capacity() == 0 {
                break;
            }
            let Some(Waiting { publish, from_qos }) = self.waiting.pop_front() else { break };
            let (pkid, qos) = (publish.pkid, publish.qos);
            to.client.publish_with_id(publish, now).map_err(|e| to.fail(e))?;
            match qos {
                QoS::AtMostOnce => self.settle(pkid, from_qos, from, now)?,
                QoS::AtLeastOnce => {
                    self.stages.insert(pkid, Stage::AwaitAck { from_qos2: from_qos == QoS::ExactlyOnce });
                }
                QoS::ExactlyOnce => {
                    self.stages.insert(pkid, Stage::AwaitRec);
                }
            }
            sent += 1;
        }
        Ok(sent)
    }

    /// The destination's PUBACK, PUBCOMP or failing PUBREC.
    fn delivered(&mut self, pkid: u16, from: &mut Side, now: Instant) -> Result<(), BridgeError> {
        match self.stages.remove(&pkid) {
            Some(Stage::AwaitAck { from_qos2 }) => {
                let qos = if from_qos2 { QoS::ExactlyOnce } else { QoS::AtLeastOnce };
                self.settle(pkid, qos, from, now)
            }
            Some(Stage::AwaitRec) => self.settle(pkid, QoS::ExactlyOnce, from, now),
            Some(Stage::AwaitComp) => from.client.complete(pkid, now).map_err(|e| from.fail(e)),
            Some(stage) => {
                self.stages.insert(pkid, stage);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The destination's PUBREC: passed back to the source.
    fn received(&mut self, pkid: u16, from: &mut Side, now: Instant) -> Result<(), BridgeError> {
        if self.stages.get(&pkid) == Some(&Stage::AwaitRec) {
            self.stages.insert(pkid, Stage::AwaitRel);
            from.client.ack(pkid, now).map_err(|e| from.fail(e))?;
        }
        Ok(())
    }

    /// The source's PUBREL: passed on, or completed when nothing is in flight there. An
    /// id this link does not know is from before a reconnect: passed on too (the far side
    /// completes an id it no longer knows).
    fn released(&mut self, pkid: u16, from: &mut Side, to: &mut Side, now: Instant) -> Result<(), BridgeError> {
        match self.stages.get(&pkid) {
            Some(Stage::Settled) => {
                self.stages.remove(&pkid);
                from.client.complete(pkid, now).map_err(|e| from.fail(e))
            }
            Some(Stage::AwaitRel) | None => {
                self.stages.insert(pkid, Stage::AwaitComp);
                to.client.release(pkid, now).map_err(|e| to.fail(e))
            }
            // Out of order (PUBREL before PUBREC): nothing to pass on yet.
            Some(_) => Ok(()),
        }
    }
}

/// Where one life of the bridge connects.
#[derive(Clone, Copy)]
struct Attempt<'a> {
    /// The remote address.
    address: &'a str,
    /// On a fail-over address: the main one, probed this often.
    main: Option<(&'a str, Duration)>,
    /// Another remote than the last link that came up relayed from.
    new_remote: bool,
}

/// One life of the bridge: connect both links, then carry messages until one fails.
async fn link(
    ctx: &Arc<MqttContext>,
    cfg: &MqttBridgeEntry,
    rules: &[TopicRule],
    bridge: &Arc<Bridge>,
    stop: &mut watch::Receiver<bool>,
    attempt: Attempt<'_>,
) -> Result<(), BridgeError> {
    let status = &bridge.status;
    let Attempt { address, main, new_remote } = attempt;
    // The state at the remote: `1` published below, `0` by the will if the link drops.
    let notify_remote = (cfg.notifications && !cfg.notifications_local_only).then(|| notification_topic(cfg));
    let level = if cfg.bridge_protocol_version == "mqttv50" { ProtocolLevel::V5 } else { ProtocolLevel::V3_1_1 };
    let remote_opts = ClientOptions {
        level,
        client_id: remote_clientid(cfg),
        clean_start: cfg.cleansession,
        keep_alive: cfg.keepalive_interval,
        username: (!cfg.remote_username.is_empty()).then(|| cfg.remote_username.clone()),
        password: (!cfg.remote_password.is_empty()).then(|| Bytes::from(cfg.remote_password.clone().into_bytes())),
        session_expiry: (!cfg.cleansession).then_some(u32::MAX),
        receive_maximum: cfg.max_inflight,
        max_packet_size: MAX_PACKET,
        bridge: cfg.try_private,
        owner_releases: true,
        will: notify_remote.as_deref().map(|t| {
            let m = state_message(t, false, QoS::AtLeastOnce);
            Will {
                topic: m.topic,
                payload: m.payload,
                qos: m.qos,
                retain: true,
                delay_interval: None,
                properties: m.properties,
            }
        }),
    };
    let mut remote = Side::new("remote", remote_opts, connect_remote(cfg, address).await?)?;
    remote.connected().await?;
    let local_opts = ClientOptions {
        level: ProtocolLevel::V5,
        client_id: local_clientid(cfg),
        clean_start: false,
        keep_alive: 0,
        username: (!cfg.local_username.is_empty()).then(|| cfg.local_username.clone()),
        password: None,
        session_expiry: Some(u32::MAX),
        receive_maximum: cfg.max_inflight,
        max_packet_size: MAX_PACKET,
        bridge: false,
        owner_releases: true,
        will: None,
    };
    if new_remote {
        forget_inbound_qos2(ctx, &local_opts.client_id).await;
    }
    let mut local = Side::new("local", local_opts, connect_local(ctx, bridge))?;
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
    // The remote's PUBACK of the state counts as one more answer to wait for.
    let mut notify_pkid = match &notify_remote {
        Some(t) => {
            awaiting_subacks += 1;
            Some(remote.client.publish(state_message(t, true, QoS::AtLeastOnce), now).map_err(|e| remote.fail(e))?)
        }
        None => None,
    };
    let state_topic = notification_topic(cfg);
    let on_subscribed = |awaiting: &mut i32| {
        *awaiting -= 1;
        if *awaiting == 0 {
            let mut s = status.lock();
            s.connected = true;
            s.connects += 1;
            s.last_error = None;
            drop(s);
            info!(bridge = %cfg.connection, address = %address, "bridge connected");
            return true;
        }
        false
    };
    let mut out = Leg::default(); // local -> remote
    let mut inbound = Leg::default(); // remote -> local
    let mut warned_refusal = false;
    let mut just_up = false;
    let mut main_back = std::pin::pin!(main_back(main));
    // Leaving for the main address: nothing new is sent, and what is in flight is
    // finished first (up to a deadline), so no QoS 2 exchange is left half done here.
    let mut draining: Option<Instant> = None;
    loop {
        if std::mem::take(&mut just_up) && cfg.notifications {
            crate::frontends::mqtt::sys::publish(ctx, &state_topic, "1".into()).await;
        }
        remote.flush().await?;
        local.flush().await?;
        let deadline = remote.client.poll_timeout();
        tokio::select! {
            n = remote.io.read_buf(&mut remote.rbuf) => remote.on_read(n)?,
            n = local.io.read_buf(&mut local.rbuf) => local.on_read(n)?,
            _ = crate::transport::socket::sleep_until(deadline) => {
                remote.client.handle_timeout(Instant::now()).map_err(|e| remote.fail(e))?;
            }
            _ = stop.changed() => {
                leave(&mut remote, &mut local, notify_remote.as_deref()).await;
                return Ok(());
            }
            _ = &mut main_back, if draining.is_none() => {
                draining = Some(Instant::now() + CONNECT_TIMEOUT);
            }
            _ = crate::transport::socket::sleep_until(draining), if draining.is_some() => {}
        }
        let now = Instant::now();
        while let Some(ev) = local.client.poll_event() {
            match ev {
                ClientEvent::Publish(p) => {
                    let route = route_out(rules, &p.topic);
                    out.take(p, route, &mut local, now)?
                }
                ClientEvent::Released { pkid } if awaiting_subacks > 0 => out.held_releases.push(pkid),
                ClientEvent::Released { pkid } => out.released(pkid, &mut local, &mut remote, now)?,
                ClientEvent::Received { pkid } => inbound.received(pkid, &mut remote, now)?,
                ClientEvent::Delivered { pkid, .. } => inbound.delivered(pkid, &mut remote, now)?,
                ClientEvent::SubAck { reasons, .. } => {
                    if reasons.iter().any(|r| r.is_error()) && !bridge.refusals.subscription_refused() {
                        warn!(bridge = %cfg.connection, ?reasons, "FerryMQ refused the bridge's subscription: local messages on its out topics are not carried (give local_username the right to read them)");
                    }
                    just_up |= on_subscribed(&mut awaiting_subacks)
                }
                ev => closed(&local, ev)?,
            }
        }
        while let Some(ev) = remote.client.poll_event() {
            match ev {
                ClientEvent::Publish(p) => {
                    let route = route_in(rules, &p.topic);
                    inbound.take(p, route, &mut remote, now)?
                }
                ClientEvent::Released { pkid } if awaiting_subacks > 0 => inbound.held_releases.push(pkid),
                ClientEvent::Released { pkid } => inbound.released(pkid, &mut remote, &mut local, now)?,
                ClientEvent::Received { pkid } => out.received(pkid, &mut local, now)?,
                ClientEvent::Delivered { pkid, .. } if notify_pkid == Some(pkid) => {
                    notify_pkid = None;
                    just_up |= on_subscribed(&mut awaiting_subacks);
                }
                ClientEvent::Delivered { pkid, reason } => {
                    if reason.is_error() && !warned_refusal {
                        warned_refusal = true;
                        warn!(bridge = %cfg.connection, reason = reason.0, "the remote broker refused a message (later refusals are not logged)");
                    }
                    out.delivered(pkid, &mut local, now)?
                }
                ClientEvent::SubAck { reasons, .. } => {
                    if reasons.iter().any(|r| r.is_error()) {
                        warn!(bridge = %cfg.connection, ?reasons, "the remote broker refused a subscription");
                    }
                    just_up |= on_subscribed(&mut awaiting_subacks);
                }
                ev => closed(&remote, ev)?,
            }
        }
        // Nothing goes on before both SUBACKs: a relayed packet id must not meet the
        // SUBSCRIBE's on either side.
        if awaiting_subacks > 0 {
            continue;
        }
        for pkid in std::mem::take(&mut out.held_releases) {
            out.released(pkid, &mut local, &mut remote, now)?;
        }
        for pkid in std::mem::take(&mut inbound.held_releases) {
            inbound.released(pkid, &mut remote, &mut local, now)?;
        }
        if let Some(deadline) = draining {
            if (out.stages.is_empty() && inbound.stages.is_empty()) || now >= deadline {
                leave(&mut remote, &mut local, notify_remote.as_deref()).await;
                return Err(BridgeError::MainBack);
            }
            continue;
        }
        let sent = out.send_waiting(&mut remote, &mut local, now)?;
        let received = inbound.send_waiting(&mut local, &mut remote, now)?;
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

/// Ends the link cleanly: the state `0` at the remote (DISCONNECT does not publish the
/// will), then DISCONNECT on both sides.
async fn leave(remote: &mut Side, local: &mut Side, notify_remote: Option<&str>) {
    let now = Instant::now();
    if let Some(topic) = notify_remote {
        let _ = remote.client.publish(state_message(topic, false, QoS::AtMostOnce), now);
    }
    remote.client.disconnect(now);
    local.client.disconnect(now);
    let _ = remote.flush().await;
    let _ = local.flush().await;
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
