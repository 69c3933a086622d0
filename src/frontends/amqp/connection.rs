//! One task per AMQP socket: owns the socket and its `ferrymq_amqp::Connection`, checks
//! the login, turns methods into core commands (declare, bind, consume, publish, ack),
//! feeds deliveries from queues to consumers under prefetch, sends publisher confirms in
//! order once messages are stored, and cleans up when the socket closes (unacked
//! messages requeued in order, exclusive queues deleted).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferrymq_amqp::connection::CloseReason;
use ferrymq_amqp::connection::Content;
use ferrymq_amqp::{AMQPClass, Config as ProtoConfig, Connection, Event};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::{debug, field, info, warn, Instrument};

use super::channel::{Channel, Settle};
use super::convert::properties_out;
use super::AmqpContext;
use crate::access::authz::{Access, Identity};
use crate::composition::config::CertLoginFrom;
use crate::core::alarm::Resource;
use crate::core::broker::DurableSignal;
use crate::core::connections::{Admission, ClientDetails, ConnectionInfo, LimitReached, Listener, Protocol};
use crate::core::delivery::QueueDelivery;
use crate::core::entities::QueueEntity;
use crate::core::limits::{LimitScope, MAX_CHANNELS};
use crate::core::message::now_ms;
use crate::core::queue::{ConsumerEvent, ConsumerId, RequeueCause};
use crate::core::router::RouteCache;
use crate::core::stats::{AmqpCounts, Stats};
use crate::core::value::Value;
use crate::transport::socket::{discard_until_eof, front_stored, sleep_until, trim_drained, ReadBuffer, CLOSE_FLUSH};
use crate::transport::tls::ClientCert;

/// Control messages a connection task may have waiting (see where the channel is made).
const CONTROL_CAPACITY: usize = 2;
/// Stop pulling deliveries while this many bytes wait to be written.
const WRITE_HIGH_WATER: usize = 512 * 1024;
/// Deliveries taken from the consumer channel per wake-up.
const PULL_BATCH: usize = 256;
/// Largest read chunk the buffer grows to under load.
const READ_MAX: usize = 128 * 1024;
/// Credit given to no-ack consumers (deliveries are settled as soon as they are written).
pub(super) const NO_ACK_CREDIT: u32 = 1000;

/// A publish waiting for its confirm.
pub(super) struct PendingConfirm {
    /// Channel in confirm mode the publish came on.
    pub channel: u16,
    /// Its delivery tag in the channel's confirm sequence.
    pub tag: u64,
    /// Resolves when the message is stored; `None` once it has (or when nothing is stored).
    pub signal: Option<DurableSignal>,
    /// Basic.Ack (true) or Basic.Nack (false, e.g. refused by a full queue).
    pub ack: bool,
}

impl PendingConfirm {
    /// The durability signal the confirm waits for.
    fn signal(&mut self) -> Option<&mut DurableSignal> {
        self.signal.as_mut()
    }
}

/// Control messages to a connection task.
#[derive(Debug)]
pub(crate) enum Control {
    /// The broker is shutting down (connection.close 320).
    Shutdown,
    /// An operator closed the connection (connection.close 320 with the reason).
    Close(String),
}

/// Who vouches for a SASL EXTERNAL login, offered only when someone does.
enum Vouch {
    /// Nobody: PLAIN and AMQPLAIN only.
    Nobody,
    /// A verified TLS client certificate names the user.
    Certificate(Arc<ClientCert>),
    /// The broker itself, for a connection it made to itself: the user it acts as (only
    /// shovels make such connections).
    #[cfg_attr(not(feature = "shovels"), allow(dead_code))]
    Broker(String),
}

/// Serves one AMQP connection until it closes.
pub(crate) async fn serve<S>(
    ctx: Arc<AmqpContext>,
    stream: S,
    peer: SocketAddr,
    listener: Listener,
    cert: Option<Arc<ClientCert>>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let vouch = match cert {
        Some(cert) => Vouch::Certificate(cert),
        None => Vouch::Nobody,
    };
    serve_as(ctx, stream, peer, listener, vouch).await
}

/// Serves a connection the broker made to itself over an in-process pipe (a shovel's
/// local side, `amqp://` without a host), as RabbitMQ's direct connections: it logs in
/// with SASL EXTERNAL as `user`, the broker vouching for it as a verified certificate
/// would (the user must exist and may log in from the loopback; no password), and is
/// then checked as every client is (virtual host access, permissions, connection and
/// channel limits). Operations list it as a `direct` connection.
#[cfg_attr(not(feature = "shovels"), allow(dead_code))]
pub(crate) async fn serve_direct<S>(ctx: Arc<AmqpContext>, stream: S, user: String)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let listener = Listener { addr, tls: false, local_only: true, internal: true };
    serve_as(ctx, stream, addr, listener, Vouch::Broker(user)).await
}

async fn serve_as<S>(ctx: Arc<AmqpContext>, stream: S, peer: SocketAddr, listener: Listener, vouch: Vouch)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let span = tracing::info_span!("amqp", peer = %peer, user = field::Empty, vhost = field::Empty);
    async move {
        let id = ctx.broker.next_id();
        // Bounded: the only control message is "shutting down" (a full channel drops a repeat).
        let (control_tx, control_rx) = mpsc::channel(CONTROL_CAPACITY);
        ctx.register(id, control_tx.clone());
        let mut task = Task::new(ctx.clone(), id, peer, control_rx, vouch);
        task.listener = Some((listener, control_tx));
        task.run(stream).await;
        if task.info.is_some() {
            // As RabbitMQ and Mosquitto log every disconnect, with its reason.
            let reason = task.end.as_deref().unwrap_or("closed by the server");
            info!(reason = %reason, "client disconnected");
        }
        Box::pin(task.cleanup()).await;
        ctx.unregister(id);
        ctx.broker.unregister_connection(id);
    }
    .instrument(span)
    .await
}

pub(super) struct Task {
    pub ctx: Arc<AmqpContext>,
    pub id: u64,
    pub peer: SocketAddr,
    pub proto: Connection,
    pub vhost: String,
    pub user: String,
    pub channels: HashMap<u16, Channel>,
    /// Consumer id -> channel number.
    pub consumer_channels: HashMap<ConsumerId, u16>,
    pub events_tx: mpsc::UnboundedSender<ConsumerEvent>,
    events_rx: mpsc::UnboundedReceiver<ConsumerEvent>,
    control_rx: mpsc::Receiver<Control>,
    pub route_cache: RouteCache,
    pub confirms: VecDeque<PendingConfirm>,
    /// Exclusive queues declared by this connection (deleted when it closes).
    pub exclusive: Vec<Arc<QueueEntity>>,
    /// The connection has published (the memory alarm blocks publishers only).
    pub publishing: bool,
    /// Published since the last barrier: queue operations wait until those publishes
    /// reached their queues, as they would have in RabbitMQ.
    pub unsettled: bool,
    /// A publish held back while the memory alarm is raised.
    deferred: Option<Event>,
    blocked_sent: bool,
    /// The client sent Connection.Close: it closes the socket after our Close-Ok.
    client_closed: bool,
    /// Where the connection came in and how to tell it to close, until it is registered.
    listener: Option<(Listener, mpsc::Sender<Control>)>,
    /// Start-Ok client properties, until the connection is registered at Open.
    client_properties: Vec<(String, Value)>,
    /// The SASL mechanism of the accepted login, until the connection is registered.
    auth_mechanism: String,
    /// The connection as the management API sees it (registered at Open).
    pub info: Option<Arc<ConnectionInfo>>,
    /// The connection counted against its vhost's and user's limits (from Open), with its
    /// channels against the user's `max-channels`.
    admission: Option<Admission>,
    /// Messages published, delivered, acknowledged since the last turn.
    pub counts: AmqpCounts,
    /// What the user may do in the open virtual host (decisions cached).
    pub access: Access,
    /// Who vouches for an EXTERNAL login: the verified client certificate of a TLS
    /// connection that presented one, or the broker for its own direct connections.
    vouch: Vouch,
    /// Why the connection ended (the first reason seen), logged when it has.
    pub end: Option<String>,
}

impl Task {
    fn new(
        ctx: Arc<AmqpContext>,
        id: u64,
        peer: SocketAddr,
        control_rx: mpsc::Receiver<Control>,
        vouch: Vouch,
    ) -> Task {
        let cfg = &ctx.cfg;
        let proto = Connection::new(
            ProtoConfig {
                frame_max: cfg.frame_max,
                channel_max: cfg.channel_max,
                heartbeat: cfg.heartbeat_secs,
                handshake_timeout: Duration::from_secs(10),
                product: "FerryMQ".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                max_message_size: cfg.max_message_size,
                sasl_external: !matches!(vouch, Vouch::Nobody),
            },
            Instant::now(),
        );
        // Unbounded, and bounded by credit: every consumer of this connection receives at
        // most its credit ahead of its acks (its prefetch; without one
        // `amqp.max_unacked_without_prefetch`; no-ack consumers get credit back as their
        // deliveries are written), plus one cancellation per queue.
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let access = ctx.authz.access(Identity::default(), "");
        Task {
            access,
            vouch,
            ctx,
            id,
            peer,
            proto,
            vhost: String::new(),
            user: String::new(),
            channels: HashMap::new(),
            consumer_channels: HashMap::new(),
            events_tx,
            events_rx,
            control_rx,
            route_cache: RouteCache::default(),
            confirms: VecDeque::new(),
            exclusive: Vec::new(),
            publishing: false,
            unsettled: false,
            deferred: None,
            blocked_sent: false,
            client_closed: false,
            listener: None,
            client_properties: Vec::new(),
            auth_mechanism: String::new(),
            info: None,
            admission: None,
            counts: AmqpCounts::default(),
            end: None,
        }
    }

    /// Records why the connection ends, unless a reason was recorded already.
    fn ended(&mut self, why: impl Into<String>) {
        self.end.get_or_insert_with(|| why.into());
    }

    /// Closes the connection with `connection.close` (`code`, `text`), the reason logged
    /// when it has closed.
    pub(super) fn close_connection(&mut self, code: u16, text: &str, class_id: u16, method_id: u16) {
        self.ended(text);
        self.proto.connection_error(code, text, class_id, method_id);
    }

    async fn run<S>(&mut self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (mut reader, mut writer) = tokio::io::split(stream);
        let mut rbuf = ReadBuffer::new(READ_MAX);
        let mut wbuf = BytesMut::new();
        let mut alarm = self.ctx.alarm.subscribe();
        let mut eof = false;
        loop {
            self.release_confirms();
            self.counts.flush(&self.ctx.broker.stats().amqp);
            // Before the transmit: a connection that published before the alarm was raised
            // hears connection.blocked now, not at its next event.
            let raised = *alarm.borrow();
            self.update_blocked(raised);
            self.proto.poll_transmit(&mut wbuf);
            if self.proto.is_closed() || eof {
                break;
            }
            // A blocked publisher is not read (RabbitMQ blocks the socket reader).
            let may_read = !(raised && self.publishing) && self.deferred.is_none();
            let can_pull = wbuf.len() < WRITE_HIGH_WATER;
            let deadline = self.proto.poll_timeout();
            let confirm_ready = self.confirms.front().is_some_and(|c| c.signal.is_some());
            tokio::select! {
                biased;
                ctrl = self.control_rx.recv() => {
                    match ctrl {
                        Some(Control::Shutdown) => {
                            self.close_connection(320, "CONNECTION_FORCED - broker shutdown", 0, 0);
                        }
                        Some(Control::Close(reason)) => {
                            self.ended(format!("closed by an operator: {reason}"));
                            self.proto.connection_error(320, &format!("CONNECTION_FORCED - {reason}"), 0, 0);
                        }
                        None => {}
                    }
                }
                res = writer.write_buf(&mut wbuf), if !wbuf.is_empty() => match res {
                    Ok(n) => {
                        if let Some(info) = &self.info { info.sent(n); }
                        trim_drained(&mut wbuf, n)
                    }
                    Err(e) => { self.ended(format!("socket error: {e}")); eof = true; }
                },
                res = rbuf.read_from(&mut reader), if may_read => match res {
                    Ok(0) => { self.ended("client closed the TCP connection without closing the AMQP connection"); eof = true; }
                    Ok(n) => {
                        if let Some(info) = &self.info { info.received(n); }
                        let full = rbuf.is_full();
                        self.proto.handle_input(rbuf.bytes(), Instant::now());
                        self.handle_events().await;
                        rbuf.resize(n, full);
                        Stats::add(&self.ctx.broker.stats().route_lookups, self.route_cache.take_lookups());
                    }
                    Err(e) => { self.ended(format!("socket error: {e}")); eof = true; }
                },
                stored = front_stored(&mut self.confirms, PendingConfirm::signal), if confirm_ready => {
                    if let Some(front) = self.confirms.front_mut() {
                        front.signal = None;
                        front.ack &= stored;
                    }
                }
                ev = self.events_rx.recv(), if can_pull => {
                    if let Some(ev) = ev {
                        self.on_consumer_event(ev);
                        let mut n = 1;
                        while n < PULL_BATCH {
                            let Ok(ev) = self.events_rx.try_recv() else { break };
                            self.on_consumer_event(ev);
                            n += 1;
                        }
                    }
                }
                _ = alarm.changed() => {
                    if !*alarm.borrow() {
                        self.update_blocked(false);
                        self.handle_events().await;
                    }
                }
                _ = sleep_until(deadline), if deadline.is_some() => {
                    self.proto.handle_timeout(Instant::now());
                    self.handle_events().await;
                }
            }
        }
        // What this connection published is in its queues before the client hears that
        // the connection is closed.
        self.settle_publishes().await;
        self.proto.poll_transmit(&mut wbuf);
        if !wbuf.is_empty() && !eof {
            let _ = tokio::time::timeout(CLOSE_FLUSH, writer.write_all(&wbuf)).await;
        }
        if self.client_closed && !eof {
            // As RabbitMQ: after Close-Ok the client closes the socket. Closing it first
            // races the client's handling of Close-Ok (lapin then reports an I/O error).
            let _ = writer.flush().await;
            let _ = tokio::time::timeout(CLOSE_FLUSH, discard_until_eof(&mut reader)).await;
        }
        let _ = tokio::time::timeout(CLOSE_FLUSH, writer.shutdown()).await;
    }

    fn update_blocked(&mut self, raised: bool) {
        if raised && self.publishing && !self.blocked_sent {
            // RabbitMQ's reasons.
            let reason = match self.ctx.alarm.raised_for() {
                Some(Resource::Disk) => "low on disk",
                _ => "low on memory",
            };
            self.proto.blocked(reason);
            self.blocked_sent = true;
        } else if !raised && self.blocked_sent {
            self.proto.unblocked();
            self.blocked_sent = false;
        }
    }

    /// Waits until this connection's publishes reached their queues.
    pub(super) async fn settle_publishes(&mut self) {
        if self.unsettled {
            self.ctx.broker.barrier().await;
            self.unsettled = false;
        }
    }

    async fn handle_events(&mut self) {
        loop {
            let Some(event) = self.deferred.take().or_else(|| self.proto.poll_event()) else { return };
            if matches!(event, Event::Publish(_)) && self.ctx.alarm.is_raised() {
                // Memory alarm: this publish and everything after it waits.
                self.publishing = true;
                self.update_blocked(true);
                self.deferred = Some(event);
                return;
            }
            match event {
                Event::Login { mechanism, mut username, password, client_properties } => {
                    let login = if mechanism == "EXTERNAL" {
                        // Offered only when a verified certificate or the broker names the user.
                        username = self.external_user();
                        self.ctx.users.login_external(&username, self.peer.ip()).await.map(drop)
                    } else {
                        self.ctx.users.login(&username, &password, self.peer.ip(), &mechanism).await.map(drop)
                    };
                    self.ctx.broker.stats().login(true, login.is_ok());
                    match login {
                        Ok(()) => {
                            tracing::Span::current().record("user", username.as_str());
                            self.user = username;
                            self.client_properties = super::convert::table_in(&client_properties);
                            self.auth_mechanism = mechanism;
                            self.proto.accept_login();
                        }
                        Err(crate::access::auth::AuthError::TooManyPending) => {
                            // Logged once by the throttle, counted in /metrics.
                            tracing::debug!(user = %username, "login refused: too many under way from the address");
                            self.proto.refuse_login(&crate::access::auth::AuthError::TooManyPending.to_string());
                        }
                        Err(e) => {
                            warn!(user = %username, error = %e, "login refused");
                            self.proto.refuse_login(&e.to_string());
                        }
                    }
                }
                Event::Open { vhost } => {
                    if !self.ctx.broker.routing().has_vhost(&vhost) {
                        let text = format!("NOT_ALLOWED - vhost {vhost} not found");
                        self.close_connection(530, &text, 10, 40);
                    } else if let Err(limit) = self.admit(&vhost) {
                        warn!(user = %self.user, vhost = %vhost, ?limit, "connection refused at a limit");
                        let text = limit_text(limit, &vhost, &self.user);
                        self.close_connection(530, &text, 10, 40);
                    } else if !self.ctx.authz.vhost_access(&self.user, &vhost) {
                        self.admission = None;
                        warn!(user = %self.user, vhost = %vhost, "access to vhost refused");
                        let text = format!("NOT_ALLOWED - access to vhost '{vhost}' refused for user '{}'", self.user);
                        self.close_connection(530, &text, 10, 40);
                    } else {
                        tracing::Span::current().record("vhost", vhost.as_str());
                        info!("client connected");
                        self.access = self.ctx.authz.access(self.identity(), &vhost);
                        self.vhost = vhost;
                        self.register_connection();
                        self.proto.open_ok();
                    }
                }
                Event::ChannelOpened { channel } => {
                    let limit = self.ctx.broker.limits().get(LimitScope::User, &self.user, MAX_CHANNELS);
                    if let Some(Err(limit)) = self.admission.as_mut().map(|a| a.open_channel(limit)) {
                        warn!(user = %self.user, ?limit, "channel refused at a limit");
                        let text = limit_text(limit, &self.vhost, &self.user);
                        self.proto.connection_error(530, &text, 0, 0);
                        continue;
                    }
                    if let Some(info) = &self.info {
                        info.channel(channel, true);
                    }
                    let get_id = self.ctx.broker.next_id();
                    self.channels.insert(channel, Channel::new(get_id));
                    self.proto.channel_open_ok(channel);
                }
                Event::ChannelClosed { channel } => self.close_channel(channel),
                Event::ChannelFlow { channel, active } => {
                    if let Some(ch) = self.channels.get_mut(&channel) {
                        ch.flow_paused = !active;
                    }
                    if active {
                        self.flush_held(channel);
                    }
                }
                Event::ConfirmSelected { channel } => {
                    if let Some(ch) = self.channels.get_mut(&channel) {
                        ch.confirm = true;
                    }
                }
                Event::Method { channel, method } => self.on_method(channel, *method).await,
                Event::Publish(p) => self.on_publish(*p).await,
                Event::Closed(reason) => {
                    self.client_closed = matches!(reason, CloseReason::ClientClosed { .. });
                    match reason {
                        CloseReason::ClientClosed { code: 200, .. } => self.ended("client closed the connection"),
                        CloseReason::ClientClosed { code, text } => {
                            self.ended(format!("client closed the connection: {code} {text}"))
                        }
                        CloseReason::ServerClosed { code } => self.ended(format!("closed by the server ({code})")),
                        CloseReason::Error(e) => self.ended(format!("protocol error: {e}")),
                    }
                }
            }
        }
    }

    /// Sends confirms at the front of the queue whose messages are stored, coalescing
    /// consecutive acks of one channel into one `multiple` ack.
    fn release_confirms(&mut self) {
        loop {
            let Some(front) = self.confirms.front_mut() else { return };
            let ready = match front.signal.as_mut() {
                None => true,
                Some(signal) => match signal.try_recv() {
                    Ok(Ok(())) => {
                        front.signal = None;
                        true
                    }
                    Ok(Err(_)) | Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                        front.signal = None;
                        front.ack = false;
                        true
                    }
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => false,
                },
            };
            if !ready {
                return;
            }
            let Some(first) = self.confirms.pop_front() else { return };
            let (channel, mut tag, ack) = (first.channel, first.tag, first.ack);
            let mut multiple = false;
            if ack {
                self.counts.confirmed += 1;
                while let Some(next) = self.confirms.front_mut() {
                    let done = next.channel == channel
                        && next.ack
                        && match next.signal.as_mut() {
                            None => true,
                            Some(s) => matches!(s.try_recv(), Ok(Ok(()))),
                        };
                    if !done {
                        break;
                    }
                    tag = next.tag;
                    multiple = true;
                    self.confirms.pop_front();
                    self.counts.confirmed += 1;
                }
            }
            if self.channels.contains_key(&channel) {
                self.proto.confirm(channel, tag, multiple, ack);
            }
        }
    }

    fn on_consumer_event(&mut self, ev: ConsumerEvent) {
        match ev {
            ConsumerEvent::Deliver(d) => {
                let Some(&channel) = self.consumer_channels.get(&d.consumer) else {
                    // The consumer was cancelled meanwhile: give the message back.
                    self.ctx.broker.requeue(d.queue, d.offset, RequeueCause::Unsent, d.consumer);
                    return;
                };
                let Some(ch) = self.channels.get_mut(&channel) else { return };
                if !ch.held.is_empty() || !ch.may_deliver() {
                    ch.held.push_back(d);
                    return;
                }
                self.deliver(channel, d);
            }
            ConsumerEvent::Cancelled { consumer, .. } => {
                let Some(channel) = self.consumer_channels.remove(&consumer) else { return };
                if let Some(ch) = self.channels.get_mut(&channel) {
                    if let Some(c) = ch.consumers.remove(&consumer) {
                        if let Some(info) = &self.info {
                            info.consumer_removed(consumer);
                        }
                        if c.assigned {
                            self.ctx.broker.leave_stream_group(consumer);
                        }
                        // consumer_cancel_notify: the queue was deleted.
                        let cancel =
                            ferrymq_amqp::methods::basic::Cancel { consumer_tag: c.tag.as_str().into(), nowait: true };
                        self.proto
                            .reply(channel, AMQPClass::Basic(ferrymq_amqp::methods::basic::AMQPMethod::Cancel(cancel)));
                    }
                }
            }
        }
    }

    /// Writes one delivery to its consumer.
    pub(super) fn deliver(&mut self, channel: u16, d: QueueDelivery) {
        let Some(ch) = self.channels.get_mut(&channel) else { return };
        let Some((no_ack, stream, consumer_tag)) =
            ch.consumers.get(&d.consumer).map(|c| (c.no_ack, c.stream, c.tag.clone()))
        else {
            self.ctx.broker.requeue(d.queue, d.offset, RequeueCause::Unsent, d.consumer);
            return;
        };
        let tag = ch.take_tag();
        if no_ack {
            self.ctx.broker.ack(d.queue, d.offset);
        } else {
            ch.unacked.insert(
                tag,
                super::channel::Unacked { queue: d.queue, offset: d.offset, consumer: d.consumer, stream },
            );
        }
        let mut extra = delivery_headers(&d);
        if stream {
            // As RabbitMQ: every stream delivery says where it sits (a long).
            extra.push((super::streams::OFFSET_ARG.to_owned(), Value::Int(d.offset as i64)));
        }
        let props = properties_out(&d.msg, now_ms(), &extra);
        let content = Content {
            exchange: &d.msg.exchange,
            routing_key: &d.msg.routing_key,
            properties: &props,
            body: &d.msg.payload,
        };
        self.proto.deliver(channel, &consumer_tag, tag, d.redelivered, content);
        self.counts.delivered += 1;
        self.counts.redelivered += u64::from(d.redelivered);
    }

    /// Delivers what a channel held back, as far as flow and prefetch allow.
    pub(super) fn flush_held(&mut self, channel: u16) {
        loop {
            let Some(ch) = self.channels.get_mut(&channel) else { return };
            if !ch.may_deliver() {
                return;
            }
            let Some(d) = ch.held.pop_front() else { return };
            self.deliver(channel, d);
        }
    }

    /// Applies an ack/nack/reject to the deliveries it covers.
    pub(super) fn settle(&mut self, channel: u16, covered: Vec<super::channel::Unacked>, how: Settle) {
        if matches!(how, Settle::Ack) {
            self.counts.acked += covered.len() as u64;
        }
        let broker = &self.ctx.broker;
        for u in covered {
            match how {
                // Streams remove nothing: ack, nack and reject all give the credit back
                // (RabbitMQ 3.13+ treats every settlement of a stream delivery so).
                _ if u.stream => broker.settle_stream(u.queue, u.consumer, u.offset),
                Settle::Ack => broker.ack(u.queue, u.offset),
                Settle::Requeue => broker.requeue(u.queue, u.offset, RequeueCause::Failed, u.consumer),
                Settle::Discard => broker.reject(u.queue, u.offset),
            }
        }
        self.flush_held(channel);
    }

    /// Who the logged-in user is, for authorization (`client_id`: the client property of
    /// that name, as RabbitMQ's topic permissions expand it).
    fn identity(&self) -> Identity {
        let client_id = self
            .client_properties
            .iter()
            .find(|(k, _)| k == "client_id")
            .and_then(|(_, v)| v.as_str())
            .unwrap_or_default()
            .to_owned();
        Identity {
            user: Some(self.user.clone()),
            groups: self.ctx.users.get(&self.user).map(|u| u.tags).unwrap_or_default(),
            client_id,
            peer: Some(self.peer.ip()),
            cert_cn: match &self.vouch {
                Vouch::Certificate(cert) => cert.common_name.clone(),
                Vouch::Nobody | Vouch::Broker(_) => None,
            },
        }
    }

    /// The user an EXTERNAL login names: the certificate's subject or common name
    /// (`amqp.ssl_cert_login_from`), or the one the broker's own connection acts as.
    fn external_user(&self) -> String {
        match &self.vouch {
            Vouch::Nobody => String::new(),
            Vouch::Broker(user) => user.clone(),
            Vouch::Certificate(cert) => match self.ctx.cfg.ssl_cert_login_from {
                CertLoginFrom::CommonName => cert.common_name.clone().unwrap_or_default(),
                CertLoginFrom::DistinguishedName => cert.subject.clone(),
            },
        }
    }

    /// A channel ended: its consumers go, its unacked deliveries are requeued in order.
    /// Lists the connection (its vhost is open) where operations see connections.
    fn register_connection(&mut self) {
        let Some((listener, control)) = self.listener.take() else { return };
        let closer: crate::core::connections::Closer = Box::new(move |reason: &str| {
            let _ = control.try_send(Control::Close(reason.to_owned()));
        });
        let info = Arc::new(ConnectionInfo::new(
            self.id,
            Protocol::Amqp091,
            self.peer,
            listener,
            self.user.clone(),
            self.vhost.clone(),
            ClientDetails::Amqp {
                properties: std::mem::take(&mut self.client_properties),
                mechanism: std::mem::take(&mut self.auth_mechanism),
            },
            closer,
        ));
        for number in self.channels.keys() {
            info.channel(*number, true);
        }
        self.ctx.broker.register_connection(info.clone());
        self.info = Some(info);
    }

    /// Counts the connection against the `max-connections` of `vhost` and of its user.
    fn admit(&mut self, vhost: &str) -> Result<(), LimitReached> {
        self.admission = Some(self.ctx.broker.admit(vhost, Some(&self.user))?);
        Ok(())
    }

    pub(super) fn close_channel(&mut self, channel: u16) {
        let Some(ch) = self.channels.remove(&channel) else { return };
        if let Some(a) = &mut self.admission {
            a.close_channel();
        }
        if let Some(info) = &self.info {
            info.channel(channel, false);
        }
        for u in ch.unacked.values() {
            self.ctx.broker.requeue(u.queue, u.offset, RequeueCause::Returned, u.consumer);
        }
        for d in ch.held {
            self.ctx.broker.requeue(d.queue, d.offset, RequeueCause::Unsent, d.consumer);
        }
        for (id, c) in ch.consumers {
            self.consumer_channels.remove(&id);
            self.ctx.broker.detach_consumer(c.queue, id);
            if c.assigned {
                self.ctx.broker.leave_stream_group(id);
            }
            self.consumer_left(&c.queue_name);
            self.consumer_gone(&c.queue_name);
        }
        self.confirms.retain(|c| c.channel != channel);
    }

    /// A consumer of `queue_name` went (cancel or channel close): counts and exclusivity.
    pub(super) fn consumer_left(&mut self, queue_name: &str) {
        let Some(q) = self.ctx.entities.queue(&self.vhost, queue_name) else { return };
        let _ = q.consumers.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        let mut exclusive = q.exclusive_consumer.lock();
        if *exclusive == Some(self.id)
            && !self.channels.values().flat_map(|c| c.consumers.values()).any(|c| c.queue == q.id)
        {
            *exclusive = None;
        }
    }

    /// After a consumer went (channel close): an auto-delete queue left without
    /// consumers is deleted.
    pub(super) fn consumer_gone(&mut self, queue_name: &str) {
        if let Some(q) = self.orphaned_auto_delete(queue_name) {
            let ctx = self.ctx.clone();
            tokio::spawn(async move { ctx.entities.delete_queue_logged(&q).await });
        }
    }

    /// The auto-delete queue `queue_name` when its last consumer went.
    pub(super) fn orphaned_auto_delete(&self, queue_name: &str) -> Option<Arc<QueueEntity>> {
        let q = self.ctx.entities.queue(&self.vhost, queue_name)?;
        let orphaned = q.auto_delete
            && q.had_consumer.load(Ordering::Relaxed)
            && q.consumers.load(Ordering::Relaxed) == 0
            && self.ctx.entities.usage_may_delete(&q);
        orphaned.then_some(q)
    }

    async fn cleanup(&mut self) {
        let channels: Vec<u16> = self.channels.keys().copied().collect();
        for c in channels {
            self.close_channel(c);
        }
        for q in std::mem::take(&mut self.exclusive) {
            if self.ctx.entities.queue(&q.vhost, &q.name).is_some_and(|e| Arc::ptr_eq(&e, &q)) {
                self.ctx.entities.delete_queue_logged(&q).await;
            }
        }
        debug!("connection cleaned up");
    }
}

/// Headers added to a delivery: `x-delivery-count` where the queue counts deliveries
/// (quorum queues, queues with a delivery limit), as RabbitMQ's quorum queues do.
pub(super) fn delivery_headers(d: &QueueDelivery) -> Vec<(String, Value)> {
    match d.delivery_count {
        Some(n) => vec![("x-delivery-count".to_owned(), Value::Int(n as i64))],
        None => Vec::new(),
    }
}

/// RabbitMQ's Connection.Close text (530 NOT_ALLOWED) for a refusal at a limit.
fn limit_text(limit: LimitReached, vhost: &str, user: &str) -> String {
    match limit {
        LimitReached::VhostConnections(n) => {
            format!("NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}': connection limit ({n}) is reached")
        }
        LimitReached::UserConnections(n) => {
            format!("NOT_ALLOWED - connection refused for user '{user}': user connection limit ({n}) is reached")
        }
        LimitReached::UserChannels(n) => format!(
            "NOT_ALLOWED - number of channels opened for user '{user}' has reached the maximum allowed user limit of {n}"
        ),
    }
}
