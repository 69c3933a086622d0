//! One task per MQTT socket: owns the socket and its `ferrymq_mqtt::Connection`, turns
//! protocol events into core commands (publish, subscribe, session take-over), feeds
//! deliveries from the core back to the client, and cleans up when the socket closes
//! (will message, session expiry, consumer detach).
//!
//! The task holds no core lock while it waits. Inbound QoS 1/2 acks are released in
//! order once the journal reports the message durable; outbound deliveries are bounded
//! by the client's receive maximum, and a slow socket stops the task from pulling more.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferrymq_mqtt::topic::{matches, parse_filter, validate_topic_name};
use ferrymq_mqtt::{
    Accept, Config as ProtoConfig, Connect, Connection, Event, Outgoing, ProtocolLevel, Publish, QoS, ReasonCode,
    SendError, Subscribe, Unsubscribe, Will,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, field, info, warn, Instrument};

use super::convert::{message_in, properties_out, qos_of, qos_u8, will_message};
use super::session::{wait_finished, Control, Online, Persistent};
use super::shared::JoinError;
use super::{split_share, MqttContext, SESSION_QUEUE_PREFIX};
use crate::auth::AuthError;
use crate::core::broker::{Commit, DurableSignal, RetainMode};
use crate::core::delivery::{Direct, QueueDelivery, SessionLink};
use crate::core::message::{now_ms, Message, SharedMessage};
use crate::core::queue::{Consumer, ConsumerEvent};
use crate::core::router::{mqtt_filter_to_pattern, Destination, RouteCache, Routes, MQTT_VHOST};
use crate::core::shards::ShardCmd;
use crate::core::stats::Stats;
use crate::core::store::{QueueId, StoreWrite, StoredSession, SubOptions, NEVER};
use crate::core::tag_filter::{TagFilter, MQTT_TAG_FILTER_PROPERTY};

/// Packet ids of deliveries from the session's own queue are derived from the queue
/// offset, `1 + offset % OFFSET_PKIDS`, so a resumed session resends with the same ids;
/// the connection allocates the rest of the id space itself.
const OFFSET_PKIDS: u64 = 32767;
/// Stop pulling deliveries while this many bytes wait to be written.
const WRITE_HIGH_WATER: usize = 256 * 1024;
/// Smallest read buffer (what an idle connection keeps).
const READ_MIN: usize = 512;
/// Largest read chunk the buffer grows to under load.
const READ_MAX: usize = 64 * 1024;
/// Drained buffers larger than this are given back.
const BUFFER_KEEP: usize = 64 * 1024;
/// Deliveries taken from the channels per wake-up.
const PULL_BATCH: usize = 256;
/// Longest wait for a taken-over connection to clean up.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);
/// Longest time spent flushing the last bytes to a closing socket.
const CLOSE_FLUSH: Duration = Duration::from_secs(2);
/// Topic prefix of delayed publishes.
const DELAYED_PREFIX: &str = "$delayed/";
/// Longest delay of `$delayed/{seconds}/...`.
const MAX_DELAY_SECS: u64 = 4_294_967;

/// Where an in-flight outbound packet id came from.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// Fast path: nothing to acknowledge in the core.
    Direct,
    /// A queue entry to ack when the client completes it.
    Queue(QueueId, u64),
}

/// Something waiting for room in the client's receive window.
#[derive(Debug)]
enum Pending {
    Direct(Direct),
    Queued(QueueDelivery),
}

/// An inbound QoS 1/2 publish waiting for its ack.
struct PendingAck {
    pkid: u16,
    signal: Option<DurableSignal>,
    reason: ReasonCode,
}

/// Session state of the connection once CONNECT is accepted.
struct SessionState {
    client_id: Arc<str>,
    /// Fast-path handle (clean sessions).
    link: Option<Arc<SessionLink>>,
    /// Queue + stored state (persistent sessions, and resumed ones with expiry 0).
    persistent: Option<Persistent>,
    /// Session expiry in effect (seconds).
    expiry_secs: u32,
    /// Current subscriptions by full filter.
    subs: BTreeMap<String, SubOptions>,
}

impl SessionState {
    /// Where this session's (non-shared) subscriptions deliver.
    fn dest(&self) -> Option<Destination> {
        match (&self.persistent, &self.link) {
            (Some(p), _) => Some(Destination::Queue(p.queue)),
            (None, Some(link)) => Some(Destination::Session(link.clone())),
            (None, None) => None,
        }
    }
}

/// Serves one MQTT connection until it closes.
pub async fn serve<S>(ctx: Arc<MqttContext>, stream: S, peer: SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let span = tracing::info_span!("mqtt", peer = %peer, client_id = field::Empty);
    async move {
        let conn_id = ctx.broker.next_id();
        let mut task = Task::new(ctx, conn_id, peer.ip());
        task.run(stream).await;
        // Boxed: a rare, large future that every idle connection would otherwise carry.
        Box::pin(task.cleanup()).await;
    }
    .instrument(span)
    .await
}

struct Task {
    ctx: Arc<MqttContext>,
    conn_id: u64,
    peer: IpAddr,
    proto: Connection,
    session: Option<SessionState>,
    will: Option<Will>,
    /// Client asked to publish the will with DISCONNECT 0x04, or never sent DISCONNECT.
    publish_will: bool,
    route_cache: RouteCache,
    inflight: HashMap<u16, Origin>,
    pending_out: VecDeque<Pending>,
    pending_acks: VecDeque<PendingAck>,
    direct_rx: Option<mpsc::Receiver<Direct>>,
    /// Queue deliveries (own session queue, shared groups); made on first attach.
    queued: Option<(mpsc::UnboundedSender<ConsumerEvent>, mpsc::UnboundedReceiver<ConsumerEvent>)>,
    control_tx: mpsc::UnboundedSender<Control>,
    control_rx: mpsc::UnboundedReceiver<Control>,
    finished_tx: watch::Sender<bool>,
    /// Queues this connection consumes from (own queue, shared groups).
    attached: Vec<QueueId>,
    /// Shared group queue -> full filter, for subscription ids of group deliveries.
    group_filters: HashMap<QueueId, String>,
    /// Credit granted to each attached queue.
    window: u32,
    level: ProtocolLevel,
    /// The client has published (flow control applies to it).
    publishing: bool,
    /// Publishes dropped without telling the client (for the log).
    dropped_publishes: u64,
    publishes_in: u64,
    publishes_out: u64,
}

impl Task {
    fn new(ctx: Arc<MqttContext>, conn_id: u64, peer: IpAddr) -> Task {
        let cfg = &ctx.cfg;
        let proto = Connection::new(
            ProtoConfig {
                max_packet_size: cfg.max_packet_size,
                receive_maximum: cfg.receive_maximum,
                topic_alias_maximum: cfg.topic_alias_maximum,
                max_topic_levels: cfg.max_topic_levels,
                server_keep_alive: None,
                max_keep_alive: (cfg.max_keepalive_secs > 0).then_some(cfg.max_keepalive_secs),
                connect_timeout: Duration::from_secs(cfg.connect_timeout_secs),
                allow_v3_1: cfg.allow_v3_1,
                retain_available: true,
                outbound_topic_aliases: true,
                pkid_range: (OFFSET_PKIDS as u16 + 1)..=u16::MAX,
                max_inflight: cfg.max_inflight,
            },
            Instant::now(),
        );
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (finished_tx, _) = watch::channel(false);
        Task {
            ctx,
            conn_id,
            peer,
            proto,
            session: None,
            will: None,
            publish_will: true,
            route_cache: RouteCache::default(),
            inflight: HashMap::new(),
            pending_out: VecDeque::new(),
            pending_acks: VecDeque::new(),
            direct_rx: None,
            queued: None,
            control_tx,
            control_rx,
            finished_tx,
            attached: Vec::new(),
            group_filters: HashMap::new(),
            window: 1,
            level: ProtocolLevel::V3_1_1,
            publishing: false,
            dropped_publishes: 0,
            publishes_in: 0,
            publishes_out: 0,
        }
    }

    async fn run<S>(&mut self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (mut reader, mut writer) = tokio::io::split(stream);
        // Buffers start small (idle connections are the common case for IoT fleets), grow
        // while traffic fills them and are given back once drained.
        let mut rbuf = BytesMut::with_capacity(READ_MIN);
        let mut wbuf = BytesMut::new();
        let mut eof = false;
        let mut alarm = self.ctx.alarm.subscribe();
        let mut was_blocked = false;
        loop {
            self.drain_pending_out();
            self.proto.poll_transmit(&mut wbuf);
            if self.proto.is_closed() || eof {
                break;
            }
            // Under the memory alarm a connection that publishes is not read (RabbitMQ's
            // MQTT plugin does the same); its keep-alive clock restarts when it resumes.
            let blocked = self.publishing && *alarm.borrow();
            if blocked != was_blocked {
                if blocked {
                    info!("memory alarm: not reading this publisher");
                } else {
                    self.proto.restart_keep_alive(Instant::now());
                }
                was_blocked = blocked;
            }
            let can_pull = self.pending_out.is_empty() && wbuf.len() < WRITE_HIGH_WATER && self.session.is_some();
            let deadline = self.proto.poll_timeout();
            let ack_ready = self.pending_acks.front().is_some_and(|a| a.signal.is_some());
            tokio::select! {
                biased;
                ctrl = self.control_rx.recv() => match ctrl {
                    Some(Control::TakenOver) => {
                        info!("session taken over by a new connection");
                        self.proto.disconnect(ReasonCode::SESSION_TAKEN_OVER, Some("session taken over by another connection"));
                    }
                    Some(Control::Shutdown) => {
                        self.publish_will = false;
                        self.proto.disconnect(ReasonCode::SERVER_SHUTTING_DOWN, Some("server shutting down"));
                    }
                    None => {}
                },
                res = writer.write_buf(&mut wbuf), if !wbuf.is_empty() => match res {
                    Ok(n) => {
                        Stats::add(&self.ctx.broker.stats.bytes_sent, n as u64);
                        if wbuf.is_empty() && wbuf.capacity() > BUFFER_KEEP {
                            wbuf = BytesMut::new();
                        }
                    }
                    Err(e) => { debug!(error = %e, "write failed"); eof = true; }
                },
                res = reader.read_buf(&mut rbuf), if !blocked => match res {
                    Ok(0) => { debug!("peer closed the connection"); eof = true; }
                    Ok(n) => {
                        Stats::add(&self.ctx.broker.stats.bytes_received, n as u64);
                        let filled = rbuf.capacity() == rbuf.len();
                        self.proto.handle_input(&mut rbuf, Instant::now());
                        self.handle_events().await;
                        if rbuf.is_empty() && rbuf.capacity() > BUFFER_KEEP {
                            rbuf = BytesMut::with_capacity(READ_MIN);
                        } else if filled || rbuf.capacity() - rbuf.len() < READ_MIN {
                            // The read filled the buffer: there is more; read bigger chunks.
                            rbuf.reserve((rbuf.capacity() * 2).clamp(READ_MIN, READ_MAX));
                        }
                    }
                    Err(e) => { debug!(error = %e, "read failed"); eof = true; }
                },
                stored = front_signal(&mut self.pending_acks), if ack_ready => {
                    if let Some(mut ack) = self.pending_acks.pop_front() {
                        if !stored {
                            warn!("message could not be stored; refusing it");
                            ack.reason = ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR;
                        }
                        self.proto.ack_publish(ack.pkid, ack.reason);
                    }
                    self.release_ready_acks();
                }
                d = recv_direct(&mut self.direct_rx), if can_pull => {
                    if let Some(d) = d {
                        self.pending_out.push_back(Pending::Direct(d));
                        // Take what else is waiting in one go: one wake-up, one write.
                        if let Some(rx) = self.direct_rx.as_mut() {
                            while self.pending_out.len() < PULL_BATCH {
                                let Ok(d) = rx.try_recv() else { break };
                                self.pending_out.push_back(Pending::Direct(d));
                            }
                        }
                    }
                }
                q = recv_queued(&mut self.queued), if can_pull => {
                    if let Some(q) = q {
                        self.pending_out.push_back(Pending::Queued(q));
                        if let Some((_, rx)) = self.queued.as_mut() {
                            while self.pending_out.len() < PULL_BATCH {
                                match rx.try_recv() {
                                    Ok(ConsumerEvent::Deliver(q)) => self.pending_out.push_back(Pending::Queued(q)),
                                    Ok(ConsumerEvent::Cancelled { .. }) => {}
                                    Err(_) => break,
                                }
                            }
                        }
                    }
                }
                _ = slow_consumer(&self.session), if self.session.as_ref().is_some_and(|s| s.link.is_some()) => {
                    warn!("slow consumer: its buffer stayed full; disconnecting");
                    self.proto.disconnect(ReasonCode::QUOTA_EXCEEDED, Some("slow consumer: message buffer full"));
                }
                _ = alarm.changed() => {}
                _ = sleep_until(deadline), if deadline.is_some() && !blocked => {
                    self.proto.handle_timeout(Instant::now());
                    self.handle_events().await;
                }
            }
        }
        // Flush what the protocol queued (CONNACK refusal, DISCONNECT), bounded in time.
        self.proto.poll_transmit(&mut wbuf);
        if !wbuf.is_empty() && !eof {
            let _ = tokio::time::timeout(CLOSE_FLUSH, writer.write_all(&wbuf)).await;
        }
        let _ = tokio::time::timeout(CLOSE_FLUSH, writer.shutdown()).await;
    }

    /// Sends inbound acks at the front of the queue that need no durability wait.
    fn release_ready_acks(&mut self) {
        while self.pending_acks.front().is_some_and(|a| a.signal.is_none()) {
            if let Some(a) = self.pending_acks.pop_front() {
                self.proto.ack_publish(a.pkid, a.reason);
            }
        }
    }

    async fn handle_events(&mut self) {
        let mut packets = 0u64;
        while let Some(event) = self.proto.poll_event() {
            packets += 1;
            match event {
                // Rare and large: boxed so that idle connections do not carry them.
                Event::Connect(c) => Box::pin(self.on_connect(*c)).await,
                Event::Publish(p) => self.on_publish(p).await,
                Event::PubRel { pkid } => self.on_pubrel(pkid).await,
                Event::PubAck { pkid } | Event::PubComp { pkid } => self.on_outbound_complete(pkid),
                Event::PubRec { pkid } => self.on_pubrec(pkid),
                Event::Subscribe(s) => Box::pin(self.on_subscribe(s)).await,
                Event::Unsubscribe(u) => Box::pin(self.on_unsubscribe(u)).await,
                Event::Disconnect(d) => {
                    debug!(reason = d.reason.0, "client disconnected");
                    self.publish_will = d.reason == ReasonCode::DISCONNECT_WITH_WILL;
                    if let (Some(expiry), Some(s)) = (d.session_expiry_interval, self.session.as_mut()) {
                        s.expiry_secs = expiry.min(self.ctx.cfg.max_session_expiry_secs);
                    }
                }
                Event::Error(e) => {
                    let level_warn = !matches!(e, ferrymq_mqtt::ProtocolError::KeepAliveTimeout);
                    if level_warn {
                        warn!(error = %e, "closing connection: protocol error");
                    } else {
                        info!(error = %e, "closing connection");
                    }
                }
            }
        }
        let stats = &self.ctx.broker.stats;
        Stats::add(&stats.messages_received, packets);
        Stats::add(&stats.publish_received, std::mem::take(&mut self.publishes_in));
        self.release_ready_acks();
    }

    // ----- CONNECT ---------------------------------------------------------------------

    /// Checks CONNECT's user name and password against the user store when `auth.mqtt`
    /// is on: no user name is NOT_AUTHORIZED (Mosquitto without anonymous access), a
    /// wrong one BAD_USER_NAME_OR_PASSWORD, a loopback-only user from afar NOT_AUTHORIZED.
    fn authenticate(&self, c: &Connect) -> Result<(), ReasonCode> {
        let Some(users) = &self.ctx.users else { return Ok(()) };
        let Some(username) = c.username.as_deref() else {
            info!("connection refused: no user name");
            return Err(ReasonCode::NOT_AUTHORIZED);
        };
        let password = c.password.as_deref().map(std::str::from_utf8).unwrap_or(Ok(""));
        let Ok(password) = password else {
            info!(username, "connection refused: password is not UTF-8");
            return Err(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        };
        users.check(username, password, self.peer, "MQTT").map_err(|e| {
            info!(username, error = %e, "connection refused");
            match e {
                AuthError::BadCredentials(_) => ReasonCode::BAD_USER_NAME_OR_PASSWORD,
                AuthError::LoopbackOnly(_) => ReasonCode::NOT_AUTHORIZED,
            }
        })
    }

    async fn on_connect(&mut self, c: Connect) {
        self.level = c.level;
        let cfg = &self.ctx.cfg;
        let mut assigned = None;
        let client_id: Arc<str> = if c.client_id.is_empty() {
            let allowed = match c.level {
                ProtocolLevel::V5 => true,
                ProtocolLevel::V3_1_1 => c.clean_start,
                ProtocolLevel::V3_1 => false,
            };
            if !allowed {
                self.proto.refuse(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
                return;
            }
            let id = format!("ferrymq-{:016x}", rand_id(self.conn_id));
            if c.level.is_v5() {
                assigned = Some(id.clone());
            }
            Arc::from(id.as_str())
        } else {
            Arc::from(c.client_id.as_str())
        };
        if c.properties.authentication_method.is_some() {
            self.proto.refuse(ReasonCode::BAD_AUTHENTICATION_METHOD);
            return;
        }
        if let Err(reason) = self.authenticate(&c) {
            self.proto.refuse(reason);
            return;
        }
        tracing::Span::current().record("client_id", &*client_id);

        // Take over a connection that holds the same client id.
        let online =
            Online { conn_id: self.conn_id, control: self.control_tx.clone(), finished: self.finished_tx.subscribe() };
        let mut claim = self.ctx.sessions.claim(&client_id, online);
        if let Some(prev) = claim.previous.take() {
            claim.previous_existed = true;
            let _ = prev.control.send(Control::TakenOver);
            wait_finished(prev.finished, TAKEOVER_WAIT).await;
        }
        // The previous connection may have just updated the persistent state.
        let mut existing =
            if claim.previous_existed { self.ctx.sessions.persistent(&client_id) } else { claim.persistent };

        let expiry = match c.level {
            ProtocolLevel::V5 => c.properties.session_expiry_interval.unwrap_or(0),
            _ if c.clean_start => 0,
            _ => NEVER,
        }
        .min(cfg.max_session_expiry_secs);

        if c.clean_start {
            if let Some(p) = existing.take() {
                self.ctx.discard_persistent(&client_id, &p).await;
                self.ctx.sessions.set_persistent(&client_id, None);
            }
        }
        let session_present = existing.is_some();
        let mut inbound_qos2 = Vec::new();

        let mut session = SessionState {
            client_id: client_id.clone(),
            link: None,
            persistent: None,
            expiry_secs: expiry,
            subs: BTreeMap::new(),
        };
        match existing {
            Some(mut p) => {
                session.subs = p.stored.subscriptions.clone();
                p.stored.expiry_secs = expiry;
                p.stored.disconnected_at_ms = None;
                inbound_qos2 = self.load_inbound_qos2(&client_id);
                session.persistent = Some(p);
            }
            None if expiry > 0 => {
                match self.ctx.broker.stores.catalog.queue_id(&format!("{SESSION_QUEUE_PREFIX}{client_id}")) {
                    Ok(queue) => {
                        session.persistent = Some(Persistent {
                            queue,
                            stored: StoredSession {
                                queue: queue.0,
                                expiry_secs: expiry,
                                subscriptions: BTreeMap::new(),
                                disconnected_at_ms: None,
                            },
                        });
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot create session queue");
                        self.proto.refuse(ReasonCode::SERVER_UNAVAILABLE);
                        self.ctx.sessions.release(&client_id, self.conn_id, None, None);
                        return;
                    }
                }
            }
            None => {
                let (tx, rx) = mpsc::channel(cfg.max_online_queue);
                session.link = Some(Arc::new(SessionLink::new(self.conn_id, client_id.clone(), tx)));
                self.direct_rx = Some(rx);
            }
        }
        if let Some(p) = &session.persistent {
            self.ctx.sessions.set_persistent(&client_id, Some(p.clone()));
            let write = self.ctx.broker.stores.sessions.save(&client_id, &p.stored);
            if let Err(e) = self.ctx.broker.commit(write, Commit::Durable).await {
                warn!(error = %e, "cannot store session");
                self.proto.refuse(ReasonCode::SERVER_UNAVAILABLE);
                self.ctx.sessions.release(&client_id, self.conn_id, None, None);
                return;
            }
        }
        let client_window = c.properties.receive_maximum.unwrap_or(u16::MAX);
        self.window = (cfg.max_inflight.min(client_window) as u32).clamp(1, OFFSET_PKIDS as u32);
        self.will = c.will;
        self.ctx.broker.stats.connected();
        info!(level = ?c.level, clean_start = c.clean_start, session_present, expiry, "client connected");
        self.proto.accept(Accept {
            session_present,
            assigned_client_id: assigned,
            session_expiry_interval: (c.level.is_v5() && c.properties.session_expiry_interval != Some(expiry))
                .then_some(expiry),
            inbound_qos2,
            properties: Default::default(),
        });
        // Resume consumption: own queue first, then shared groups of a resumed session.
        if let Some(p) = &session.persistent {
            self.attach(p.queue, 2);
        }
        let shared: Vec<(String, u8)> =
            session.subs.iter().filter(|(f, _)| f.starts_with("$share/")).map(|(f, o)| (f.clone(), o.qos)).collect();
        self.session = Some(session);
        for (filter, qos) in shared {
            if let Some((group, f)) = split_share(&filter) {
                if let Some(q) = self.ctx.groups.queue_of(group, f) {
                    self.group_filters.insert(q, filter.clone());
                    self.attach(q, qos);
                }
            }
        }
    }

    fn load_inbound_qos2(&self, client_id: &str) -> Vec<u16> {
        self.ctx.broker.stores.inbound_qos2.pending(client_id).unwrap_or_else(|e| {
            warn!(error = %e, "cannot read inbound QoS 2 state");
            Vec::new()
        })
    }

    fn attach(&mut self, queue: QueueId, max_qos: u8) {
        self.attached.push(queue);
        self.ctx.broker.shards.send(ShardCmd::Attach {
            queue,
            consumer: Consumer {
                id: self.conn_id,
                tx: self.queued.get_or_insert_with(mpsc::unbounded_channel).0.clone(),
                credit: self.window,
                max_qos,
                priority: 0,
            },
        });
    }

    fn detach(&mut self, queue: QueueId) {
        self.attached.retain(|q| *q != queue);
        self.ctx.broker.shards.send(ShardCmd::Detach { queue, consumer: self.conn_id });
    }

    // ----- inbound PUBLISH -------------------------------------------------------------

    async fn on_publish(&mut self, mut p: Publish) {
        self.publishes_in += 1;
        self.publishing = true;
        let Some(session) = self.session.as_ref() else { return };
        let client_id = session.client_id.clone();
        let persistent = session.persistent.is_some();
        let (pkid, qos) = (p.pkid, p.qos);
        let now = now_ms();

        if p.properties.payload_format_indicator == Some(1) && std::str::from_utf8(&p.payload).is_err() {
            self.refuse_publish(pkid, qos, ReasonCode::PAYLOAD_FORMAT_INVALID, "payload is not UTF-8");
            return;
        }
        if let Some(rest) = p.topic.strip_prefix(DELAYED_PREFIX) {
            let parsed = rest.split_once('/').and_then(|(secs, topic)| {
                let secs: u64 = secs.parse().ok().filter(|s| *s <= MAX_DELAY_SECS)?;
                validate_topic_name(topic, self.ctx.cfg.max_topic_levels).ok()?;
                (!topic.starts_with('$')).then(|| (secs, topic.to_owned()))
            });
            let Some((secs, topic)) = parsed else {
                self.refuse_publish(pkid, qos, ReasonCode::TOPIC_NAME_INVALID, "malformed $delayed topic");
                return;
            };
            let msg: SharedMessage = Arc::new(message_in(p, &topic, self.ctx.broker.router.mqtt_exchange(), now));
            let signal = self.ctx.broker.schedule(MQTT_VHOST, &msg, now + secs * 1000, StoreWrite::none()).await;
            self.push_ack(pkid, qos, Some(signal), ReasonCode::SUCCESS);
            return;
        }
        if p.topic.starts_with("$SYS") || p.topic.starts_with("$share/") {
            // Reserved for the broker; Mosquitto drops these silently too.
            debug!(topic = %p.topic, "publish to a reserved topic dropped");
            self.push_ack(pkid, qos, None, ReasonCode::SUCCESS);
            return;
        }
        let retain = if p.retain { RetainMode::Persist } else { RetainMode::None };
        let topic = std::mem::take(&mut p.topic);
        let msg: SharedMessage = Arc::new(message_in(p, &topic, self.ctx.broker.router.mqtt_exchange(), now));
        let routes = self.route_cache.resolve(&self.ctx.broker.router, &msg, &client_id);
        // A persistent session remembers the id until PUBREL, in the message's submission.
        let along = if qos == QoS::ExactlyOnce && persistent {
            self.ctx.broker.stores.inbound_qos2.received(&client_id, pkid)
        } else {
            StoreWrite::none()
        };
        let signal = self.ctx.broker.publish(&msg, &routes, retain, along).await;
        let reason = if routes.is_empty() && self.level.is_v5() {
            ReasonCode::NO_MATCHING_SUBSCRIBERS
        } else {
            ReasonCode::SUCCESS
        };
        self.push_ack(pkid, qos, signal, reason);
    }

    fn push_ack(&mut self, pkid: u16, qos: QoS, signal: Option<DurableSignal>, reason: ReasonCode) {
        if qos == QoS::AtMostOnce {
            return;
        }
        self.pending_acks.push_back(PendingAck { pkid, signal, reason });
    }

    fn refuse_publish(&mut self, pkid: u16, qos: QoS, reason: ReasonCode, why: &str) {
        if qos == QoS::AtMostOnce || !self.level.is_v5() {
            // The client is not told (QoS 0, or MQTT 3.x acks without a reason): log it,
            // at info the first time per connection (a client must not flood the log).
            self.dropped_publishes += 1;
            if self.dropped_publishes == 1 {
                info!(why, "publish dropped (later drops on this connection are logged at debug)");
            } else {
                debug!(why, dropped = self.dropped_publishes, "publish dropped");
            }
        } else {
            debug!(why, "publish refused");
        }
        if qos == QoS::AtMostOnce {
            return;
        }
        if self.level.is_v5() {
            self.pending_acks.push_back(PendingAck { pkid, signal: None, reason });
        } else {
            // MQTT 3.x acks carry no reason: acknowledge and drop, as Mosquitto does.
            self.pending_acks.push_back(PendingAck { pkid, signal: None, reason: ReasonCode::SUCCESS });
        }
    }

    async fn on_pubrel(&mut self, pkid: u16) {
        let Some(s) = self.session.as_ref() else { return };
        if s.persistent.is_some() {
            // Durable: a stale pending id after a power cut would swallow the client's next
            // message that reuses it.
            let write = self.ctx.broker.stores.inbound_qos2.released(&s.client_id, pkid);
            if let Err(e) = self.ctx.broker.commit(write, Commit::Queued).await {
                warn!(error = %e, "cannot clear inbound QoS 2 state");
            }
        }
    }

    // ----- outbound --------------------------------------------------------------------

    fn on_outbound_complete(&mut self, pkid: u16) {
        if let Some(Origin::Queue(queue, offset)) = self.inflight.remove(&pkid) {
            self.ctx.broker.shards.send(ShardCmd::Ack { queue, offset });
        }
    }

    fn on_pubrec(&mut self, pkid: u16) {
        if let Some(Origin::Queue(queue, offset)) = self.inflight.get(&pkid).copied() {
            if self.own_queue() == Some(queue) {
                self.ctx.broker.shards.send(ShardCmd::Release { queue, offset });
            } else {
                // Shared group: the member has the message; only the PUBREL/PUBCOMP
                // exchange is left, which belongs to this connection.
                self.inflight.insert(pkid, Origin::Direct);
                self.ctx.broker.shards.send(ShardCmd::Ack { queue, offset });
            }
        }
    }

    fn own_queue(&self) -> Option<QueueId> {
        self.session.as_ref().and_then(|s| s.persistent.as_ref()).map(|p| p.queue)
    }

    /// Sends what waits in `pending_out` while the client's window has room.
    fn drain_pending_out(&mut self) {
        while let Some(item) = self.pending_out.pop_front() {
            if let Err(item) = self.send_out(item) {
                self.pending_out.push_front(item);
                break;
            }
        }
        let sent = std::mem::take(&mut self.publishes_out);
        Stats::add(&self.ctx.broker.stats.publish_sent, sent);
        Stats::add(&self.ctx.broker.stats.messages_sent, sent);
    }

    /// Sends one delivery; gives it back when the window is full.
    fn send_out(&mut self, item: Pending) -> Result<(), Pending> {
        let now = now_ms();
        match item {
            Pending::Direct(d) => {
                if d.msg.is_expired(now) {
                    return Ok(());
                }
                let qos = d.msg.qos.min(d.qos);
                let out = outgoing(
                    &d.msg,
                    qos,
                    d.retain_as_published && d.msg.retain,
                    false,
                    None,
                    d.subscription_ids.clone(),
                    now,
                );
                match self.proto.send_publish(out) {
                    Ok(pkid) => {
                        self.publishes_out += 1;
                        if qos > 0 {
                            self.inflight.insert(pkid, Origin::Direct);
                        }
                        Ok(())
                    }
                    Err(SendError::WindowFull) | Err(SendError::PacketIdInUse) => Err(Pending::Direct(d)),
                    Err(e) => {
                        debug!(error = %e, "delivery dropped");
                        Stats::add(&self.ctx.broker.stats.publish_dropped, 1);
                        Ok(())
                    }
                }
            }
            Pending::Queued(q) => {
                let own = self.own_queue() == Some(q.queue);
                let pkid = own.then(|| 1 + (q.offset % OFFSET_PKIDS) as u16);
                if q.msg.is_expired(now) && !q.released {
                    self.ack_queue(q.queue, q.offset);
                    return Ok(());
                }
                if q.released {
                    if let Some(pkid) = pkid {
                        return match self.proto.send_pubrel(pkid) {
                            Ok(()) => {
                                self.inflight.insert(pkid, Origin::Queue(q.queue, q.offset));
                                Ok(())
                            }
                            Err(SendError::WindowFull) | Err(SendError::PacketIdInUse) => Err(Pending::Queued(q)),
                            Err(_) => {
                                self.ack_queue(q.queue, q.offset);
                                Ok(())
                            }
                        };
                    }
                }
                let (sub_ids, rap) = self.delivery_options(&q);
                let out = outgoing(&q.msg, q.qos, rap && q.msg.retain, q.redelivered && q.qos > 0, pkid, sub_ids, now);
                match self.proto.send_publish(out) {
                    Ok(pkid) => {
                        self.publishes_out += 1;
                        if q.qos > 0 {
                            self.inflight.insert(pkid, Origin::Queue(q.queue, q.offset));
                        } else {
                            self.ack_queue(q.queue, q.offset);
                        }
                        Ok(())
                    }
                    Err(SendError::WindowFull) | Err(SendError::PacketIdInUse) => Err(Pending::Queued(q)),
                    Err(e) => {
                        debug!(error = %e, "queued delivery dropped");
                        Stats::add(&self.ctx.broker.stats.publish_dropped, 1);
                        self.ack_queue(q.queue, q.offset);
                        Ok(())
                    }
                }
            }
        }
    }

    fn ack_queue(&self, queue: QueueId, offset: u64) {
        self.ctx.broker.shards.send(ShardCmd::Ack { queue, offset });
    }

    /// Subscription identifiers and retain-as-published for a queue delivery, from the
    /// session's current subscriptions.
    fn delivery_options(&self, q: &QueueDelivery) -> (Vec<u32>, bool) {
        let Some(s) = self.session.as_ref() else { return (Vec::new(), false) };
        if let Some(filter) = self.group_filters.get(&q.queue) {
            return match s.subs.get(filter) {
                Some(o) => (o.subscription_id.into_iter().collect(), o.retain_as_published),
                None => (Vec::new(), false),
            };
        }
        let mut ids = Vec::new();
        let mut rap = false;
        let topic = q.msg.topic();
        for (filter, o) in &s.subs {
            if !filter.starts_with("$share/") && matches(filter, &topic) {
                ids.extend(o.subscription_id);
                rap |= o.retain_as_published;
            }
        }
        (ids, rap)
    }

    // ----- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------

    async fn on_subscribe(&mut self, s: Subscribe) {
        let Some(session) = self.session.as_ref() else { return };
        let client_id = session.client_id.clone();
        let mut reasons = Vec::with_capacity(s.filters.len());
        let mut retained: Vec<Direct> = Vec::new();
        let mut changed = false;
        // The user property `tag-filter` applies to every filter of the packet.
        let tag_filter = match s.user_properties.iter().find(|(k, _)| k == MQTT_TAG_FILTER_PROPERTY) {
            None => Ok(None),
            Some((_, expr)) => TagFilter::parse(expr).map(|f| Some((expr.clone(), Arc::new(f)))),
        };
        for f in &s.filters {
            let tag_filter = match &tag_filter {
                Ok(t) => t.clone(),
                Err(e) => {
                    debug!(filter = %f.filter, error = %e, "invalid tag filter");
                    reasons.push(ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR);
                    continue;
                }
            };
            let parsed = match parse_filter(&f.filter, self.ctx.cfg.max_topic_levels) {
                Ok(p) => p,
                Err(e) => {
                    debug!(filter = %f.filter, error = %e, "invalid subscription filter");
                    reasons.push(ReasonCode::TOPIC_FILTER_INVALID);
                    continue;
                }
            };
            if parsed.share_group.is_some() && f.no_local {
                reasons.push(ReasonCode::PROTOCOL_ERROR);
                continue;
            }
            let granted = qos_u8(f.qos).min(2);
            let opts = SubOptions {
                qos: granted,
                no_local: f.no_local,
                retain_as_published: f.retain_as_published,
                subscription_id: s.subscription_identifier,
                tag_filter: tag_filter.as_ref().map(|(expr, _)| expr.clone()),
            };
            let existed = self.session.as_ref().is_some_and(|s| s.subs.contains_key(&f.filter));
            if let Some(group) = parsed.share_group {
                let expr = tag_filter.as_ref().map(|(expr, _)| expr.as_str());
                match self.ctx.groups.join(&self.ctx.broker, group, parsed.filter, &client_id, expr) {
                    Ok(queue) => {
                        if !existed {
                            self.group_filters.insert(queue, f.filter.clone());
                            self.attach(queue, granted);
                        } else {
                            // Granted QoS may have changed: re-attach with the new one.
                            self.detach(queue);
                            self.attach(queue, granted);
                        }
                    }
                    Err(e @ JoinError::TagFilterMismatch { .. }) => {
                        debug!(filter = %f.filter, error = %e, "shared subscription refused");
                        reasons.push(ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR);
                        continue;
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot create shared subscription queue");
                        reasons.push(ReasonCode::UNSPECIFIED_ERROR);
                        continue;
                    }
                }
            } else {
                let Some(session) = self.session.as_ref() else { return };
                let Some(dest) = session.dest() else { return };
                self.ctx.broker.router.subscribe(parsed.filter, dest, opts.binding_options(&client_id));
                let send_retained = match f.retain_handling {
                    0 => true,
                    1 => !existed,
                    _ => false,
                };
                if send_retained {
                    for msg in self.ctx.broker.retained.matching(&mqtt_filter_to_pattern(parsed.filter)) {
                        if tag_filter.as_ref().is_some_and(|(_, f)| !f.matches(msg.tag())) {
                            continue;
                        }
                        retained.push(Direct {
                            msg,
                            qos: granted,
                            retain_as_published: true,
                            subscription_ids: s.subscription_identifier.into_iter().collect(),
                        });
                    }
                }
            }
            if let Some(session) = self.session.as_mut() {
                session.subs.insert(f.filter.clone(), opts);
            }
            changed = true;
            reasons.push(ReasonCode(granted));
        }
        if changed {
            self.store_session().await;
        }
        self.proto.ack_subscribe(s.pkid, reasons);
        self.pending_out.extend(retained.into_iter().map(Pending::Direct));
    }

    async fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut reasons = Vec::with_capacity(u.filters.len());
        let mut changed = false;
        for filter in &u.filters {
            let Some(session) = self.session.as_mut() else { return };
            if session.subs.remove(filter).is_none() {
                reasons.push(ReasonCode::NO_SUBSCRIPTION_EXISTED);
                continue;
            }
            changed = true;
            let dest = session.dest();
            let client_id = session.client_id.clone();
            if let Some((group, f)) = split_share(filter) {
                if let Some(q) = self.ctx.groups.queue_of(group, f) {
                    self.group_filters.remove(&q);
                    self.detach(q);
                }
                if let Some(q) = self.ctx.groups.leave(&self.ctx.broker, group, f, &client_id) {
                    self.ctx.broker.shards.delete(q).await;
                }
            } else if let Some(dest) = &dest {
                self.ctx.broker.router.unsubscribe(filter, dest);
            }
            reasons.push(ReasonCode::SUCCESS);
        }
        if changed {
            self.store_session().await;
        }
        self.proto.ack_unsubscribe(u.pkid, reasons);
    }

    /// Stores the persistent session's subscriptions.
    async fn store_session(&mut self) {
        let Some(s) = self.session.as_mut() else { return };
        let Some(p) = s.persistent.as_mut() else { return };
        p.stored.subscriptions = s.subs.clone();
        self.ctx.sessions.update_stored(&s.client_id, &p.stored);
        let write = self.ctx.broker.stores.sessions.save(&s.client_id, &p.stored);
        if let Err(e) = self.ctx.broker.commit(write, Commit::Durable).await {
            warn!(error = %e, "cannot store session");
        }
    }

    // ----- close -----------------------------------------------------------------------

    async fn cleanup(&mut self) {
        let Some(session) = self.session.take() else {
            let _ = self.finished_tx.send(true);
            return;
        };
        self.ctx.broker.stats.disconnected();
        for q in std::mem::take(&mut self.attached) {
            self.ctx.broker.shards.send(ShardCmd::Detach { queue: q, consumer: self.conn_id });
        }
        // Fast-path deliveries still buffered for a clean session are gone with it.
        let client_id = session.client_id.clone();
        let persistent_ends = session.expiry_secs == 0;
        if let Some(link) = &session.link {
            let dest = Destination::Session(link.clone());
            for filter in session.subs.keys() {
                if split_share(filter).is_none() {
                    self.ctx.broker.router.unsubscribe(filter, &dest);
                }
            }
        }
        let will = if self.publish_will { self.will.take() } else { None };
        let will_delay = will.as_ref().and_then(|w| w.delay_interval).unwrap_or(0).min(session.expiry_secs);
        let mut pending_will = None;
        if let Some(w) = will {
            if will_delay == 0 {
                publish_will(&self.ctx, &client_id, w).await;
            } else {
                let (cancel_tx, cancel_rx) = oneshot::channel();
                pending_will = Some(cancel_tx);
                let ctx = self.ctx.clone();
                let cid = client_id.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(will_delay as u64)) => publish_will(&ctx, &cid, w).await,
                        r = cancel_rx => if r.is_err() { publish_will(&ctx, &cid, w).await },
                    }
                });
            }
        }
        let still_ours;
        if persistent_ends || session.persistent.is_none() {
            if let Some(p) = &session.persistent {
                self.ctx.discard_persistent(&client_id, p).await;
                self.ctx.sessions.set_persistent(&client_id, None);
            } else {
                for filter in session.subs.keys() {
                    if let Some((group, f)) = split_share(filter) {
                        if let Some(q) = self.ctx.groups.leave(&self.ctx.broker, group, f, &client_id) {
                            self.ctx.broker.shards.delete(q).await;
                        }
                    }
                }
            }
            still_ours = self.ctx.sessions.release(&client_id, self.conn_id, None, pending_will);
        } else if let Some(mut p) = session.persistent {
            let now = now_ms();
            p.stored.subscriptions = session.subs.clone();
            p.stored.expiry_secs = session.expiry_secs;
            p.stored.disconnected_at_ms = Some(now);
            let expires = (session.expiry_secs != NEVER).then(|| now + session.expiry_secs as u64 * 1000);
            self.ctx.sessions.set_persistent(&client_id, Some(p.clone()));
            let write = self.ctx.broker.stores.sessions.save(&client_id, &p.stored);
            if let Err(e) = self.ctx.broker.commit(write, Commit::Queued).await {
                warn!(error = %e, "cannot store session at disconnect");
            }
            still_ours = self.ctx.sessions.release(&client_id, self.conn_id, expires, pending_will);
        } else {
            still_ours = false;
        }
        debug!(still_ours, "connection cleaned up");
        let _ = self.finished_tx.send(true);
    }
}

/// Publishes a will message.
async fn publish_will(ctx: &MqttContext, client_id: &str, w: Will) {
    let now = now_ms();
    let msg: SharedMessage = Arc::new(will_message(&w, ctx.broker.router.mqtt_exchange(), now));
    let routes: Routes = ctx.broker.router.resolve(&msg, client_id);
    let retain = if w.retain { RetainMode::Persist } else { RetainMode::None };
    info!(topic = %w.topic, "publishing will message");
    if let Some(signal) = ctx.broker.publish(&msg, &routes, retain, StoreWrite::none()).await {
        let _ = signal.await;
    }
}

fn outgoing(
    msg: &Message,
    qos: u8,
    retain: bool,
    dup: bool,
    pkid: Option<u16>,
    subscription_ids: Vec<u32>,
    now: u64,
) -> Outgoing {
    Outgoing {
        topic: msg.topic(),
        payload: msg.payload.clone(),
        qos: qos_of(qos),
        retain,
        dup,
        pkid,
        properties: properties_out(msg, subscription_ids, now),
    }
}

/// Waits for the durability signal of the front pending ack; true when stored.
async fn front_signal(acks: &mut VecDeque<PendingAck>) -> bool {
    match acks.front_mut().and_then(|a| a.signal.as_mut()) {
        Some(signal) => matches!(signal.await, Ok(Ok(()))),
        None => std::future::pending().await,
    }
}

async fn slow_consumer(session: &Option<SessionState>) {
    match session.as_ref().and_then(|s| s.link.as_ref()) {
        Some(link) => link.slow_consumer().await,
        None => std::future::pending().await,
    }
}

/// Next queue delivery (a deleted group queue's cancellation is skipped: the group is
/// gone with its last member).
async fn recv_queued(
    queued: &mut Option<(mpsc::UnboundedSender<ConsumerEvent>, mpsc::UnboundedReceiver<ConsumerEvent>)>,
) -> Option<QueueDelivery> {
    match queued {
        Some((_, rx)) => loop {
            match rx.recv().await? {
                ConsumerEvent::Deliver(d) => return Some(d),
                ConsumerEvent::Cancelled { .. } => continue,
            }
        },
        None => std::future::pending().await,
    }
}

async fn recv_direct(rx: &mut Option<mpsc::Receiver<Direct>>) -> Option<Direct> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

/// A cheap unique-enough suffix for assigned client ids.
fn rand_id(seed: u64) -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    (t ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)).rotate_left(17)
}
