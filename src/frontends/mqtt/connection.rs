//! One task per MQTT socket: owns the socket and its `ferrymq_mqtt::Connection`, reads
//! and writes the socket, and dispatches protocol events to the modules that handle them
//! (`connect`, `publish`, `deliver`, `subscribe`, `close`). Everything the task owns is in
//! `Task`; those modules extend it.
//!
//! The task holds no core lock while it waits. Inbound QoS 1/2 acks are released in
//! order once the core reports the message durable; outbound deliveries are bounded by
//! the client's receive maximum, and a slow socket stops the task from pulling more.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferrymq_mqtt::{Config as ProtoConfig, Connection, Event, IdMap, ProtocolLevel, ReasonCode, Will};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::deliver::{Origin, Pending, OFFSET_PKIDS};
use super::publish::PendingAck;
use super::refused::Refusals;
use super::session::{ConnectionSignals, Control, Persistent, Subscriptions};
use super::MqttContext;
use crate::access::authz::{Access, Request};
use crate::composition::config::MqttSection;
use crate::core::connections::{ConnectionInfo, Listener};
use crate::core::delivery::{LinkEvent, LinkReceiver, QueueDelivery, SessionLink, SpillLimits};
use crate::core::queue::ConsumerEvent;
use crate::core::router::{Destination, RouteCache};
use crate::core::stats::Stats;
use crate::core::store::QueueId;
use crate::transport::socket::{discard_until_eof, front_stored, transfer, trim_drained, Io, ReadBuffer, CLOSE_FLUSH};
use crate::transport::tls::ClientCert;

/// Stop pulling deliveries while this many bytes wait to be written.
const WRITE_HIGH_WATER: usize = 256 * 1024;
/// A read smaller than this that leaves nothing behind marks a quiet connection: the
/// protocol's buffers are given back too.
const QUIET_READ: usize = 512;
/// How often a publisher blocked by the memory alarm looks whether it was cleared.
const ALARM_RECHECK: Duration = Duration::from_millis(100);
/// Largest read chunk the buffer grows to under load.
const READ_MAX: usize = 64 * 1024;
/// Deliveries taken from the channels per wake-up.
const PULL_BATCH: usize = 256;
/// Reads a taken-over connection makes before it closes.
const LAST_READS: usize = 16;
/// How long a taken-over connection waits for its first last read: bytes already sent may
/// not be marked readable yet (the runtime learns of them from its reactor), and a silent
/// peer costs the take-over this much.
const LAST_READ_WAIT: Duration = Duration::from_millis(20);

/// Session state of the connection once CONNECT is accepted.
pub(super) struct SessionState {
    pub(super) client_id: Arc<str>,
    /// Fast-path handle (clean sessions).
    pub(super) link: Option<Arc<SessionLink>>,
    /// Queue + stored state (persistent sessions, and resumed ones with expiry 0).
    pub(super) persistent: Option<Persistent>,
    /// Session expiry in effect (seconds).
    pub(super) expiry_secs: u32,
    /// Current subscriptions by full filter.
    pub(super) subs: Subscriptions,
}

impl SessionState {
    /// Where this session's (non-shared) subscriptions deliver.
    pub(super) fn dest(&self) -> Option<Destination> {
        match (&self.persistent, &self.link) {
            (Some(p), _) => Some(Destination::Queue(p.queue)),
            (None, Some(link)) => Some(Destination::Session(link.clone())),
            (None, None) => None,
        }
    }
}

/// Serves one MQTT connection until it closes; `guard` (such as the connection's permit
/// under the connection limit) is dropped when it has.
///
/// The guard is held here rather than by a wrapping future, which would carry this
/// future twice (once before it is polled, once as its awaitee).
pub(crate) fn serve<S, G>(
    ctx: Arc<MqttContext>,
    stream: S,
    peer: SocketAddr,
    listener: Listener,
    cert: Option<Arc<ClientCert>>,
    guard: G,
) -> impl Future<Output = ()> + Send
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    G: Send,
{
    // The task is made here, so that the future holds it once (not also its parts).
    let conn_id = ctx.broker.next_id();
    let mut task = Task::new(ctx, conn_id, peer, listener);
    task.cert = cert;
    run(task, stream, guard)
}

/// Serves a connection the broker made to itself (`listener.internal`: a bridge's local
/// side), counting what the rules refuse it in `refusals`.
pub(crate) fn serve_internal<S>(
    ctx: Arc<MqttContext>,
    stream: S,
    peer: SocketAddr,
    listener: Listener,
    refusals: Arc<Refusals>,
) -> impl Future<Output = ()> + Send
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let conn_id = ctx.broker.next_id();
    let mut task = Task::new(ctx, conn_id, peer, listener);
    task.refusals = Some(refusals);
    run(task, stream, ())
}

/// The connection's life: the socket loop, then the clean-up.
///
/// An `async move` block rather than an `async fn`: an `async fn` moves its arguments
/// into locals of its body, and the future then holds both the arguments and the locals
/// (the task twice, about 800 bytes more per connection); the block uses what it
/// captured in place.
#[allow(clippy::manual_async_fn)] // on purpose: see above
fn run<S, G>(mut task: Task, mut stream: S, guard: G) -> impl Future<Output = ()> + Send
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    G: Send,
{
    async move {
        let unfinished = task.run(&mut stream).await;
        // Boxed: a rare, large future that every idle connection would otherwise carry.
        Box::pin(task.cleanup()).await;
        // The broker closed while the client may still be writing: read and drop what it
        // sends (bounded), so that it reads the DISCONNECT instead of a reset. The session
        // is released first, so a take-over does not wait for this.
        // Boxed, like the cleanup: it is rare.
        if unfinished {
            let _ = Box::pin(tokio::time::timeout(CLOSE_FLUSH, discard_until_eof(&mut stream))).await;
        }
        drop(guard);
    }
}

/// A connection's state: the protocol machine, its session, what is in flight both ways.
pub(super) struct Task {
    pub(super) ctx: Arc<MqttContext>,
    pub(super) conn_id: u64,
    pub(super) peer: SocketAddr,
    /// The listener the connection came in on.
    pub(super) listener: Listener,
    /// The verified client certificate of a TLS connection that presented one.
    pub(super) cert: Option<Arc<ClientCert>>,
    /// The connection as the management API sees it (registered at CONNECT).
    pub(super) info: Option<Arc<ConnectionInfo>>,
    /// The connection counted against the `max-connections` of `/` and of its user (from
    /// CONNECT; boxed: most of a fleet's connections are idle and this is rarely read).
    pub(super) admission: Option<Box<crate::core::connections::Admission>>,
    pub(super) proto: Connection,
    pub(super) session: Option<SessionState>,
    /// Boxed: most connections have none, and it is large.
    pub(super) will: Option<Box<Will>>,
    /// Client asked to publish the will with DISCONNECT 0x04, or never sent DISCONNECT.
    pub(super) publish_will: bool,
    /// Made at the first publish (most devices of a fleet only subscribe, or publish rarely).
    pub(super) route_cache: Option<Box<RouteCache>>,
    /// What the client may publish, subscribe to and receive: made at CONNECT when MQTT
    /// authorization is on (boxed; `None` allows everything).
    pub(super) access: Option<Box<Access>>,
    pub(super) inflight: IdMap<Origin>,
    pub(super) pending_out: VecDeque<Pending>,
    pub(super) pending_acks: VecDeque<PendingAck>,
    /// PUBRELs waiting for their PUBREC's release to be durable, in PUBREC order.
    pub(super) pending_releases: VecDeque<(u16, tokio::sync::oneshot::Receiver<()>)>,
    /// A clean session's fast path (made at CONNECT).
    pub(super) direct: Option<LinkReceiver>,
    /// The queues consumed and their deliveries; made at the first attach (boxed: most
    /// connections consume none).
    pub(super) consuming: Option<Box<Consuming>>,
    /// Take-over and shutdown are told here; the cleanup's end is told from here.
    pub(super) signals: Arc<ConnectionSignals>,
    /// Credit granted to each attached queue.
    pub(super) window: u32,
    pub(super) level: ProtocolLevel,
    /// The client is a Mosquitto bridge (`try_private`).
    pub(super) bridge: bool,
    /// The client has published (flow control applies to it).
    pub(super) publishing: bool,
    /// Publishes dropped without telling the client (for the log).
    pub(super) dropped_publishes: u64,
    /// Since when bytes have waited to be written without the socket taking any.
    pub(super) stalled_since: Option<Instant>,
    /// The earliest deadline armed on the timer wheel and not yet passed.
    pub(super) armed: Option<Instant>,
    /// Disconnected as a slow consumer (logged and counted once).
    pub(super) slow: bool,
    /// The subscriber took something since the stall clock last started: bytes from the
    /// socket buffer, or an acknowledgement of an outbound QoS 1/2 delivery.
    pub(super) progress: bool,
    /// The broker is shutting down (no lingering on the socket after the DISCONNECT).
    pub(super) shutting_down: bool,
    pub(super) publishes_in: u64,
    /// PUBLISH packets that matched no subscription, since the last turn.
    pub(super) publishes_unrouted: u64,
    /// Deliveries dropped for this client (not sent: expired, too large), since connect.
    pub(super) dropped: u64,
    pub(super) publishes_out: u64,
    /// A bridge's local side: what the rules refuse it is counted for the bridge.
    pub(super) refusals: Option<Arc<Refusals>>,
    /// Why the connection ended (the first reason seen), logged once when it has.
    pub(super) end: Option<End>,
}

/// Why a connection ended, as its last log line says it.
pub(super) struct End {
    why: std::borrow::Cow<'static, str>,
    /// Logged at warn (the client misbehaved), else at info.
    warn: bool,
}

/// The protocol settings every connection of the front-end shares.
pub(super) fn protocol_config(cfg: &MqttSection) -> ProtoConfig {
    ProtoConfig {
        // PUBREL once the PUBREC's release is durable (deliver.rs `on_pubrec`).
        release_when_told: true,
        max_packet_size: cfg.max_packet_size,
        receive_maximum: cfg.receive_maximum,
        topic_alias_maximum: cfg.topic_alias_maximum,
        max_topic_levels: cfg.max_topic_levels,
        server_keep_alive: None,
        max_keep_alive: (cfg.max_keepalive_secs > 0).then_some(cfg.max_keepalive_secs),
        connect_timeout: cfg.connect_timeout,
        allow_v3_1: cfg.allow_v3_1,
        retain_available: true,
        outbound_topic_aliases: true,
        pkid_range: (OFFSET_PKIDS as u16 + 1)..=u16::MAX,
        max_inflight: cfg.max_inflight,
    }
}

impl Task {
    /// A task for a new connection; nothing is sent before CONNECT.
    fn new(ctx: Arc<MqttContext>, conn_id: u64, peer: SocketAddr, listener: Listener) -> Task {
        let proto = Connection::new(ctx.protocol.clone(), Instant::now());
        Task {
            ctx,
            conn_id,
            peer,
            listener,
            cert: None,
            info: None,
            admission: None,
            proto,
            session: None,
            will: None,
            publish_will: true,
            route_cache: None,
            access: None,
            inflight: IdMap::default(),
            pending_out: VecDeque::new(),
            pending_acks: VecDeque::new(),
            pending_releases: VecDeque::new(),
            direct: None,
            consuming: None,
            signals: Arc::default(),
            window: 1,
            level: ProtocolLevel::V3_1_1,
            bridge: false,
            publishing: false,
            dropped_publishes: 0,
            stalled_since: None,
            armed: None,
            slow: false,
            progress: false,
            shutting_down: false,
            publishes_in: 0,
            publishes_unrouted: 0,
            dropped: 0,
            publishes_out: 0,
            refusals: None,
            end: None,
        }
    }

    /// Records why the connection ends, unless a reason was recorded already.
    pub(super) fn ended(&mut self, why: impl Into<std::borrow::Cow<'static, str>>) {
        self.end.get_or_insert_with(|| End { why: why.into(), warn: false });
    }

    /// [`Task::ended`] for a client that misbehaved (logged at warn).
    pub(super) fn ended_badly(&mut self, why: impl Into<std::borrow::Cow<'static, str>>) {
        self.end.get_or_insert_with(|| End { why: why.into(), warn: true });
    }

    /// The connection's last line: the client disconnected, and why (as Mosquitto logs
    /// each disconnect).
    pub(super) fn log_end(&self) {
        match &self.end {
            Some(End { why, warn: true }) => conn_log!(warn, self, reason = %why, "client disconnected"),
            Some(End { why, warn: false }) => conn_log!(info, self, reason = %why, "client disconnected"),
            None => conn_log!(info, self, reason = "closed by the server", "client disconnected"),
        }
    }

    /// True when the client may make `request` (always, with MQTT authorization off).
    pub(super) fn permitted(&mut self, request: Request<'_>) -> bool {
        self.access.as_mut().is_none_or(|a| a.mqtt(request))
    }

    /// Runs the connection until it closes; true when the peer has not closed its side
    /// yet (the caller drains it).
    async fn run<S>(&mut self, stream: &mut S) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let mut rbuf = ReadBuffer::new(READ_MAX);
        let mut wbuf = BytesMut::new();
        let mut eof = false;
        let mut was_blocked = false;
        loop {
            self.drain_pending_out();
            self.proto.poll_transmit(&mut wbuf);
            if self.proto.is_closed() || eof {
                break;
            }
            // Under the memory alarm a connection that publishes is not read (RabbitMQ's
            // MQTT plugin does the same); its keep-alive clock restarts when it resumes.
            let blocked = self.publishing && self.ctx.alarm.is_raised();
            if blocked != was_blocked {
                if blocked {
                    conn_log!(info, self, "memory alarm: not reading this publisher");
                } else {
                    self.proto.restart_keep_alive(Instant::now());
                }
                was_blocked = blocked;
            }
            self.publish_client_gauge();
            let can_pull = self.pending_out.is_empty() && wbuf.len() < WRITE_HIGH_WATER && self.session.is_some();
            self.watch_for_stall(!wbuf.is_empty());
            self.arm_timer(blocked);
            let ack_ready = self.pending_acks.front().is_some_and(|a| a.signal.is_some());
            // The handlers do not wait: what needs to is done after the select, so that
            // its output is not part of the connection's future.
            let then = tokio::select! {
                biased;
                signal = next_signal(&self.signals, &self.direct, can_pull, self.armed) => match signal {
                    Signal::Timer => {
                        self.armed = None;
                        let due = self.next_timer(blocked).is_some_and(|at| at <= Instant::now());
                        if due { Then::OnTimer } else { Then::Loop }
                    }
                    Signal::Told(Control::TakenOver) => Then::TakenOver,
                    Signal::Told(Control::Kicked) => {
                        self.ended("closed by an operator");
                        self.proto.disconnect(ReasonCode::ADMINISTRATIVE_ACTION, Some("closed by an administrator"));
                        Then::Loop
                    }
                    Signal::Told(Control::Shutdown) => {
                        self.ended("server shutting down");
                        self.publish_will = false;
                        self.shutting_down = true;
                        self.proto.disconnect(ReasonCode::SERVER_SHUTTING_DOWN, Some("server shutting down"));
                        Then::Loop
                    }
                    // Take what is waiting in one go: one wake-up, one write.
                    Signal::Link(LinkEvent::Readable) => {
                        if let Some(LinkReceiver(link)) = &self.direct {
                            let out = &mut self.pending_out;
                            link.take(PULL_BATCH, |d| out.push_back(Pending::Direct(d)));
                        }
                        Then::Loop
                    }
                    Signal::Link(LinkEvent::Changed) => { self.on_link_changed(); Then::Loop }
                },
                io = transfer(stream, &mut rbuf, &mut wbuf, !blocked) => match io {
                    Io::Wrote(Ok(n)) => {
                        Stats::add(&self.ctx.broker.stats().bytes_sent, n as u64);
                        if let Some(info) = &self.info { info.sent(n); }
                        trim_drained(&mut wbuf, n);
                        self.progress |= n > 0;
                        Then::Loop
                    }
                    Io::Wrote(Err(e)) => { self.ended(format!("socket error: {e}")); eof = true; Then::Loop }
                    Io::Read(Ok(0)) => { self.ended("connection closed by the client"); eof = true; Then::Loop }
                    Io::Read(Ok(n)) => {
                        Stats::add(&self.ctx.broker.stats().bytes_received, n as u64);
                        if let Some(info) = &self.info { info.received(n); }
                        let full = rbuf.is_full();
                        self.proto.handle_input(rbuf.bytes(), Instant::now());
                            Then::HandleEvents { read: n, full }
                    }
                    Io::Read(Err(e)) if crate::transport::websocket::FrameTooLarge::is(&e) => {
                        // Over WebSocket a packet too large shows as a frame too large.
                        self.ended_badly(format!("packet too large: {e}"));
                        self.proto.disconnect(ReasonCode::PACKET_TOO_LARGE, Some("packet too large"));
                        Then::Loop
                    }
                    Io::Read(Err(e)) => { self.ended(format!("socket error: {e}")); eof = true; Then::Loop }
                },
                stored = front_stored(&mut self.pending_acks, PendingAck::signal), if ack_ready => {
                    self.on_front_stored(stored);
                    Then::Loop
                }
                _ = front_release(&mut self.pending_releases), if !self.pending_releases.is_empty() => {
                    // Durable (or the queue is gone, when the sender was dropped): PUBREL.
                    if let Some((pkid, _)) = self.pending_releases.pop_front() {
                        self.proto.release(pkid);
                    }
                    Then::Loop
                }
                q = recv_queued(&mut self.consuming), if can_pull => {
                    if let Some(q) = q {
                        self.take_queued(q);
                        while self.pending_out.len() < PULL_BATCH {
                            let Some(consuming) = self.consuming.as_mut() else { break };
                            match consuming.rx.try_recv() {
                                Ok(ConsumerEvent::Deliver(q)) => self.take_queued(q),
                                Ok(ConsumerEvent::Cancelled { .. }) => {}
                                Err(_) => break,
                            }
                        }
                    }
                    Then::Loop
                }
            };
            match then {
                Then::Loop => {}
                Then::OnTimer => self.on_timer(blocked).await,
                Then::TakenOver => {
                    // What the client sent before it connected again is handled first: a
                    // DISCONNECT with a session expiry of 0 already in the socket must
                    // still end the session the new connection would otherwise resume.
                    eof |= self.read_what_is_there(stream, &mut rbuf).await;
                    if !self.proto.is_closed() {
                        self.ended("session taken over by a new connection");
                        self.proto.disconnect(
                            ReasonCode::SESSION_TAKEN_OVER,
                            Some("session taken over by another connection"),
                        );
                    }
                }
                Then::HandleEvents { read, full } => {
                    // Boxed: the future of a read's events is large and lives only while
                    // they are handled (one allocation per read, not per packet).
                    Box::pin(self.handle_events()).await;
                    rbuf.resize(read, full);
                    if read < QUIET_READ && rbuf.capacity() == 0 {
                        self.release_idle_memory();
                    }
                }
            }
        }
        // Flush what the protocol queued (CONNACK refusal, DISCONNECT), bounded in time.
        self.proto.poll_transmit(&mut wbuf);
        if !wbuf.is_empty() && !eof {
            let _ = tokio::time::timeout(CLOSE_FLUSH, stream.write_all(&wbuf)).await;
        }
        let _ = tokio::time::timeout(CLOSE_FLUSH, stream.shutdown()).await;
        // (Not while the broker shuts down: it waits for its connections.)
        !eof && !self.shutting_down
    }

    /// Reads and handles whatever the socket holds (bounded: the first read waits up to
    /// [`LAST_READ_WAIT`], later ones not at all); true when the peer closed its side or
    /// the read failed.
    async fn read_what_is_there<S>(&mut self, stream: &mut S, rbuf: &mut ReadBuffer) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        for i in 0..LAST_READS {
            if self.proto.is_closed() {
                return false;
            }
            let read = if i == 0 {
                match tokio::time::timeout(LAST_READ_WAIT, rbuf.read_from(&mut *stream)).await {
                    Ok(r) => Poll::Ready(r),
                    Err(_) => Poll::Pending,
                }
            } else {
                std::future::poll_fn(|cx| Poll::Ready(rbuf.poll_read_from(&mut *stream, cx))).await
            };
            match read {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(n)) => {
                    Stats::add(&self.ctx.broker.stats().bytes_received, n as u64);
                    let full = rbuf.is_full();
                    self.proto.handle_input(rbuf.bytes(), Instant::now());
                    Box::pin(self.handle_events()).await;
                    rbuf.resize(n, full);
                }
                Poll::Pending => return false,
            }
        }
        false
    }

    /// The connection's one timer: the protocol's deadline (keep-alive, CONNECT time-out),
    /// the stall clock, or (for a publisher blocked by the memory alarm) its next look at
    /// the alarm, whichever is first.
    fn next_timer(&self, blocked: bool) -> Option<Instant> {
        let stall_at = self.stalled_since.map(|t| t + self.slow_consumer_timeout());
        let proto_at = self.proto.poll_timeout().filter(|_| !blocked);
        // A blocked publisher looks at the alarm again now and then (a wait on the alarm
        // itself would make every connection's future larger).
        let recheck_at = blocked.then(|| Instant::now() + ALARM_RECHECK);
        [stall_at, proto_at, recheck_at].into_iter().flatten().min()
    }

    /// Arms the connection's next deadline on the shared timer wheel, unless an earlier
    /// one is armed: when that one rings, the next is armed (so a keep-alive that every
    /// packet moves later costs the wheel nothing per packet).
    fn arm_timer(&mut self, blocked: bool) {
        let Some(at) = self.next_timer(blocked) else { return };
        if self.armed.is_none_or(|armed| at < armed) {
            self.ctx.timers.arm(self.conn_id, at, &self.signals);
            self.armed = Some(at);
        }
    }

    /// The timer fired: whichever of [`Task::next_timer`]'s deadlines passed is handled.
    async fn on_timer(&mut self, blocked: bool) {
        let now = Instant::now();
        if self.stalled_since.is_some_and(|t| t + self.slow_consumer_timeout() <= now) {
            self.slow_consumer("its socket stayed unread");
        } else if !blocked && self.proto.poll_timeout().is_some_and(|t| t <= now) {
            self.proto.handle_timeout(now);
            Box::pin(self.handle_events()).await;
        }
    }

    /// Where the session's (non-shared) subscriptions deliver; a clean session's fast
    /// path is made here, at its first subscription (a device that only publishes never
    /// needs one).
    pub(super) fn subscription_dest(&mut self) -> Option<Destination> {
        let session = self.session.as_mut()?;
        if session.persistent.is_none() && session.link.is_none() {
            let cfg = &self.ctx.cfg;
            let limits = SpillLimits { messages: cfg.max_queued_messages, bytes: cfg.max_queued_bytes };
            let wake = self.signals.clone();
            let link =
                Arc::new(SessionLink::new(self.conn_id, session.client_id.clone(), cfg.max_online_queue, limits, wake));
            session.link = Some(link.clone());
            self.direct = Some(LinkReceiver(link));
        }
        session.dest()
    }

    /// The client id for log lines (empty before CONNECT is accepted).
    pub(super) fn log_client_id(&self) -> &str {
        self.session.as_ref().map_or("", |s| &s.client_id)
    }

    /// Gives back what a quiet connection's emptied queues and maps still hold.
    fn release_idle_memory(&mut self) {
        self.proto.release_idle_memory();
        if self.pending_out.is_empty() {
            self.pending_out.shrink_to_fit();
        }
        if self.pending_acks.is_empty() {
            self.pending_acks.shrink_to_fit();
        }
        if self.inflight.is_empty() {
            self.inflight.shrink_to_fit();
        }
    }

    /// How long the socket may stay unread while bytes wait (`slow_consumer_timeout_secs`).
    /// Writes the client's delivery state for the management API (in flight, waiting,
    /// dropped): a few relaxed stores per wake-up, never per message.
    fn publish_client_gauge(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(info) = &self.info else { return };
        let link = self.direct.as_ref().map(|LinkReceiver(l)| l);
        let g = &info.mqtt;
        g.inflight.store(self.inflight.len() as u64, Relaxed);
        g.queued.store(self.pending_out.len() as u64 + link.map_or(0, |l| l.queued()), Relaxed);
        g.dropped.store(self.dropped + link.map_or(0, |l| l.dropped()), Relaxed);
    }

    fn slow_consumer_timeout(&self) -> Duration {
        self.ctx.cfg.slow_consumer_timeout.max(Duration::from_secs(1))
    }

    /// Keeps the stall clock: it runs while deliveries wait for this subscriber (bytes
    /// unwritten, deliveries outside its receive window, or a spilled backlog) and it takes
    /// nothing; it restarts whenever it takes something. See [`Task::slow_consumer`].
    fn watch_for_stall(&mut self, bytes_waiting: bool) {
        let spilled = self.session.as_ref().and_then(|s| s.link.as_ref()).is_some_and(|l| l.is_spilling());
        let waiting = bytes_waiting || !self.pending_out.is_empty() || spilled;
        if !waiting {
            self.stalled_since = None;
        } else if std::mem::take(&mut self.progress) || self.stalled_since.is_none() {
            self.stalled_since = Some(Instant::now());
        }
    }

    /// Hands every event the protocol produced to its handler, then sends the acks that
    /// need no wait.
    async fn handle_events(&mut self) {
        let mut packets = 0u64;
        let mut yielded = false;
        while let Some(event) = self.proto.poll_event() {
            packets += 1;
            match event {
                // Rare and large: boxed so that idle connections do not carry them.
                Event::Connect(c) => Box::pin(self.on_connect(*c)).await,
                Event::Publish(p) => {
                    // A subscription applies to every publish read after it, as far as
                    // the broker can tell: before the first publish of a read is routed,
                    // the tasks woken with this one run (the runtime polls the last woken
                    // task first, so a SUBSCRIBE another connection read just before would
                    // otherwise be applied after it). A SUBSCRIBE on another socket that
                    // arrives within some tens of microseconds of this read may still be
                    // read after it, by another worker.
                    if !std::mem::replace(&mut yielded, true) {
                        tokio::task::yield_now().await;
                    }
                    self.on_publish(p).await
                }
                Event::PubRel { pkid } => self.on_pubrel(pkid).await,
                Event::PubAck { pkid } | Event::PubComp { pkid } => self.on_outbound_complete(pkid),
                Event::PubRec { pkid } => self.on_pubrec(pkid),
                Event::Subscribe(s) => Box::pin(self.on_subscribe(s)).await,
                Event::Unsubscribe(u) => Box::pin(self.on_unsubscribe(u)).await,
                Event::Disconnect(d) => {
                    match d.reason {
                        ReasonCode::SUCCESS => self.ended("client sent DISCONNECT"),
                        r => self.ended(format!("client sent DISCONNECT with reason {:#04x}", r.0)),
                    }
                    self.publish_will = d.reason == ReasonCode::DISCONNECT_WITH_WILL;
                    if let (Some(expiry), Some(s)) = (d.session_expiry_interval, self.session.as_mut()) {
                        s.expiry_secs = expiry.min(self.ctx.cfg.max_session_expiry_secs);
                    }
                }
                Event::Error(e) => match e {
                    ferrymq_mqtt::ProtocolError::KeepAliveTimeout => self.ended(e.to_string()),
                    e => self.ended_badly(format!("protocol error: {e}")),
                },
            }
        }
        let stats = self.ctx.broker.stats();
        Stats::add(&stats.messages_received, packets);
        Stats::add(&stats.publish_received, std::mem::take(&mut self.publishes_in));
        Stats::add(&stats.dropped_no_subscribers, std::mem::take(&mut self.publishes_unrouted));
        if let Some(cache) = &mut self.route_cache {
            Stats::add(&stats.route_lookups, cache.take_lookups());
        }
        self.release_ready_acks();
    }
}

/// Next queue delivery (a deleted group queue's cancellation is skipped: the group is
/// gone with its last member).
fn recv_queued(consuming: &mut Option<Box<Consuming>>) -> impl Future<Output = Option<QueueDelivery>> + '_ {
    // A poll function: it holds nothing but the reference.
    std::future::poll_fn(move |cx| {
        let Some(consuming) = consuming else { return Poll::Pending };
        loop {
            match std::task::ready!(consuming.rx.poll_recv(cx)) {
                Some(ConsumerEvent::Deliver(d)) => return Poll::Ready(Some(d)),
                Some(ConsumerEvent::Cancelled { .. }) => continue,
                None => return Poll::Ready(None),
            }
        }
    })
}

/// The queues a connection consumes (its persistent session's, shared groups', its clean
/// session's spill queue), with the one channel they deliver through.
#[derive(Debug)]
pub(super) struct Consuming {
    /// Handed to each queue attached.
    pub(super) tx: mpsc::UnboundedSender<ConsumerEvent>,
    pub(super) rx: mpsc::UnboundedReceiver<ConsumerEvent>,
    /// Queues attached.
    pub(super) attached: Vec<QueueId>,
    /// Shared group queue -> full filter, for subscription ids of group deliveries.
    pub(super) group_filters: BTreeMap<QueueId, String>,
    /// The clean session's spill queue, once attached.
    pub(super) spill_queue: Option<QueueId>,
}

impl Default for Consuming {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Consuming { tx, rx, attached: Vec::new(), group_filters: BTreeMap::new(), spill_queue: None }
    }
}

/// What the connection does after its wait, outside it.
enum Then {
    /// Nothing more: wait again.
    Loop,
    /// A new connection takes the session over: handle what was already sent, then close.
    TakenOver,
    /// Handle the protocol's timeout.
    OnTimer,
    /// Handle the events of a read of `read` bytes (`full`: it filled the buffer).
    HandleEvents { read: usize, full: bool },
}

/// What rang a connection's doorbell.
#[derive(Debug)]
enum Signal {
    /// A take-over or the shutdown.
    Told(Control),
    /// The armed deadline passed.
    Timer,
    /// The clean session's fast path.
    Link(LinkEvent),
}

/// Waits for the doorbell until a control message was told, the `armed` deadline passed,
/// or the clean session's fast path has deliveries to take (if `take`) or a change of
/// its spill state. (A poll function: no state of its own beyond its arguments.)
/// Resolves when the front PUBREL may go.
async fn front_release(pending: &mut VecDeque<(u16, tokio::sync::oneshot::Receiver<()>)>) {
    match pending.front_mut() {
        Some((_, rx)) => {
            let _ = rx.await;
        }
        None => std::future::pending().await,
    }
}

fn next_signal<'a>(
    signals: &'a ConnectionSignals,
    direct: &'a Option<LinkReceiver>,
    take: bool,
    armed: Option<Instant>,
) -> impl Future<Output = Signal> + 'a {
    std::future::poll_fn(move |cx| {
        // Listening first: a ring after a check below wakes this task again.
        signals.listen(cx.waker());
        if let Some(c) = signals.take_control() {
            return Poll::Ready(Signal::Told(c));
        }
        if armed.is_some_and(|at| at <= Instant::now()) {
            return Poll::Ready(Signal::Timer);
        }
        match direct.as_ref().and_then(|LinkReceiver(link)| link.event(take)) {
            Some(ev) => Poll::Ready(Signal::Link(ev)),
            None => Poll::Pending,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::message::{Message, Properties};
    use bytes::Bytes;

    fn delivery(offset: u64) -> QueueDelivery {
        let msg = Message {
            exchange: "amq.topic".into(),
            routing_key: "a".into(),
            payload: Bytes::from_static(b"x"),
            qos: 1,
            retain: false,
            props: Properties::default(),
            timestamp_ms: 0,
        };
        QueueDelivery {
            queue: QueueId(1),
            offset,
            msg: Arc::new(msg),
            qos: 1,
            redelivered: false,
            released: false,
            consumer: 7,
            delivery_count: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn queue_deliveries_skip_cancellations_and_wait_without_a_channel() {
        let consuming = Consuming::default();
        let tx = consuming.tx.clone();
        let mut queued = Some(Box::new(consuming));
        tx.send(ConsumerEvent::Cancelled { queue: QueueId(1), consumer: 7 }).unwrap();
        tx.send(ConsumerEvent::Deliver(delivery(5))).unwrap();
        let d = recv_queued(&mut queued).await.expect("a delivery");
        assert_eq!(d.offset, 5, "the cancellation of a deleted group queue is skipped");

        let mut none = None;
        let waited = tokio::time::timeout(Duration::from_secs(60), recv_queued(&mut none)).await;
        assert!(waited.is_err(), "nothing attached yet: no delivery, no wake-up");
        let signals = ConnectionSignals::default();
        let waited = tokio::time::timeout(Duration::from_secs(60), next_signal(&signals, &None, true, None)).await;
        assert!(waited.is_err(), "no fast path, nothing told: no wake-up");
        signals.tell(Control::Shutdown);
        signals.tell(Control::TakenOver);
        let told = tokio::time::timeout(Duration::from_secs(1), next_signal(&signals, &None, true, None)).await;
        assert!(matches!(told, Ok(Signal::Told(Control::Shutdown))), "the first told wins: {told:?}");
    }
}
