//! One task per MQTT socket: owns the socket and its `ferrymq_mqtt::Connection`, reads
//! and writes the socket, and dispatches protocol events to the modules that handle them
//! (`connect`, `publish`, `deliver`, `subscribe`, `close`). Everything the task owns is in
//! `Task`; those modules extend it.
//!
//! The task holds no core lock while it waits. Inbound QoS 1/2 acks are released in
//! order once the core reports the message durable; outbound deliveries are bounded by
//! the client's receive maximum, and a slow socket stops the task from pulling more.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferrymq_mqtt::{Config as ProtoConfig, Connection, Event, ProtocolLevel, ReasonCode, Will};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf};
use tokio::sync::{mpsc, watch};
use tracing::{debug, field, info, warn, Instrument};

use super::deliver::{Origin, Pending, OFFSET_PKIDS};
use super::publish::PendingAck;
use super::session::{Control, Persistent};
use super::MqttContext;
use crate::core::delivery::{Direct, QueueDelivery, SessionLink};
use crate::core::queue::ConsumerEvent;
use crate::core::router::{Destination, RouteCache};
use crate::core::stats::Stats;
use crate::core::store::{QueueId, SubOptions};
use crate::socket::{discard_until_eof, front_stored, sleep_until, trim_drained, ReadBuffer, CLOSE_FLUSH};

/// Control messages a connection task may have waiting (see where the channel is made).
const CONTROL_CAPACITY: usize = 2;
/// Stop pulling deliveries while this many bytes wait to be written.
const WRITE_HIGH_WATER: usize = 256 * 1024;
/// Largest read chunk the buffer grows to under load.
const READ_MAX: usize = 64 * 1024;
/// Deliveries taken from the channels per wake-up.
const PULL_BATCH: usize = 256;

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
    pub(super) subs: BTreeMap<String, SubOptions>,
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

/// Serves one MQTT connection until it closes.
pub async fn serve<S>(ctx: Arc<MqttContext>, stream: S, peer: SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let span = tracing::info_span!("mqtt", peer = %peer, client_id = field::Empty);
    async move {
        let conn_id = ctx.broker.next_id();
        let mut task = Task::new(ctx, conn_id, peer.ip());
        let unfinished = task.run(stream).await;
        // Boxed: a rare, large future that every idle connection would otherwise carry.
        Box::pin(task.cleanup()).await;
        // The broker closed while the client may still be writing: read and drop what it
        // sends (bounded), so that it reads the DISCONNECT instead of a reset. The session
        // is released first, so a take-over does not wait for this.
        if let Some(mut reader) = unfinished {
            let _ = tokio::time::timeout(CLOSE_FLUSH, discard_until_eof(&mut reader)).await;
        }
    }
    .instrument(span)
    .await
}

/// A connection's state: the protocol machine, its session, what is in flight both ways.
pub(super) struct Task {
    pub(super) ctx: Arc<MqttContext>,
    pub(super) conn_id: u64,
    pub(super) peer: IpAddr,
    pub(super) proto: Connection,
    pub(super) session: Option<SessionState>,
    pub(super) will: Option<Will>,
    /// Client asked to publish the will with DISCONNECT 0x04, or never sent DISCONNECT.
    pub(super) publish_will: bool,
    pub(super) route_cache: RouteCache,
    pub(super) inflight: HashMap<u16, Origin>,
    pub(super) pending_out: VecDeque<Pending>,
    pub(super) pending_acks: VecDeque<PendingAck>,
    pub(super) direct_rx: Option<mpsc::Receiver<Direct>>,
    /// Queue deliveries (own session queue, shared groups); made on first attach.
    pub(super) queued: Option<(mpsc::UnboundedSender<ConsumerEvent>, mpsc::UnboundedReceiver<ConsumerEvent>)>,
    pub(super) control_tx: mpsc::Sender<Control>,
    pub(super) control_rx: mpsc::Receiver<Control>,
    pub(super) finished_tx: watch::Sender<bool>,
    /// Queues this connection consumes from (own queue, shared groups).
    pub(super) attached: Vec<QueueId>,
    /// Shared group queue -> full filter, for subscription ids of group deliveries.
    pub(super) group_filters: HashMap<QueueId, String>,
    /// Credit granted to each attached queue.
    pub(super) window: u32,
    pub(super) level: ProtocolLevel,
    /// The client has published (flow control applies to it).
    pub(super) publishing: bool,
    /// Publishes dropped without telling the client (for the log).
    pub(super) dropped_publishes: u64,
    /// The clean session's spill queue this connection consumes, once attached.
    pub(super) spill_queue: Option<QueueId>,
    /// Since when bytes have waited to be written without the socket taking any.
    pub(super) stalled_since: Option<Instant>,
    /// How long the socket may stay unread while bytes wait (`slow_consumer_timeout_secs`).
    pub(super) slow_consumer_timeout: Duration,
    /// Disconnected as a slow consumer (logged and counted once).
    pub(super) slow: bool,
    /// The subscriber took something since the stall clock last started: bytes from the
    /// socket buffer, or an acknowledgement of an outbound QoS 1/2 delivery.
    pub(super) progress: bool,
    /// The broker is shutting down (no lingering on the socket after the DISCONNECT).
    pub(super) shutting_down: bool,
    pub(super) publishes_in: u64,
    pub(super) publishes_out: u64,
}

impl Task {
    /// A task for a new connection; nothing is sent before CONNECT.
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
        // Bounded: a connection is told at most "taken over" and "shutting down", and one
        // pending control message is enough to close it (a full channel drops the other).
        let (control_tx, control_rx) = mpsc::channel(CONTROL_CAPACITY);
        let (finished_tx, _) = watch::channel(false);
        let slow_consumer_timeout = Duration::from_secs(cfg.slow_consumer_timeout_secs.max(1));
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
            spill_queue: None,
            stalled_since: None,
            slow_consumer_timeout,
            slow: false,
            progress: false,
            shutting_down: false,
            publishes_in: 0,
            publishes_out: 0,
        }
    }

    /// Runs the connection until it closes; returns the socket's read half when the peer
    /// has not closed its side yet (the caller drains it).
    async fn run<S>(&mut self, stream: S) -> Option<ReadHalf<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (mut reader, mut writer) = tokio::io::split(stream);
        let mut rbuf = ReadBuffer::new(READ_MAX);
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
            self.watch_for_stall(!wbuf.is_empty());
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
                        self.shutting_down = true;
                        self.proto.disconnect(ReasonCode::SERVER_SHUTTING_DOWN, Some("server shutting down"));
                    }
                    None => {}
                },
                res = writer.write_buf(&mut wbuf), if !wbuf.is_empty() => match res {
                    Ok(n) => {
                        Stats::add(&self.ctx.broker.stats.bytes_sent, n as u64);
                        trim_drained(&mut wbuf);
                        self.progress |= n > 0;
                    }
                    Err(e) => { debug!(error = %e, "write failed"); eof = true; }
                },
                res = reader.read_buf(rbuf.bytes()), if !blocked => match res {
                    Ok(0) => { debug!("peer closed the connection"); eof = true; }
                    Ok(n) => {
                        Stats::add(&self.ctx.broker.stats.bytes_received, n as u64);
                        let full = rbuf.is_full();
                        self.proto.handle_input(rbuf.bytes(), Instant::now());
                        self.handle_events().await;
                        rbuf.resize(full);
                    }
                    Err(e) => { debug!(error = %e, "read failed"); eof = true; }
                },
                stored = front_stored(&mut self.pending_acks, PendingAck::signal), if ack_ready => {
                    self.on_front_stored(stored);
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
                        self.take_queued(q);
                        while self.pending_out.len() < PULL_BATCH {
                            let Some((_, rx)) = self.queued.as_mut() else { break };
                            match rx.try_recv() {
                                Ok(ConsumerEvent::Deliver(q)) => self.take_queued(q),
                                Ok(ConsumerEvent::Cancelled { .. }) => {}
                                Err(_) => break,
                            }
                        }
                    }
                }
                _ = link_changed(&self.session), if self.session.as_ref().is_some_and(|s| s.link.is_some()) => {
                    self.on_link_changed();
                }
                _ = sleep_until(self.stalled_since.map(|t| t + self.slow_consumer_timeout)), if self.stalled_since.is_some() => {
                    self.slow_consumer("its socket stayed unread");
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
        // (Not while the broker shuts down: it waits for its connections.)
        (!eof && !self.shutting_down).then_some(reader)
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
                    // A subscription applies to every publish read after it: before the
                    // first publish of a read is routed, the tasks woken with this one run
                    // (the runtime polls the last woken task first, so a SUBSCRIBE another
                    // connection read just before would otherwise be applied after it).
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
        Stats::add(&stats.route_lookups, self.route_cache.take_lookups());
        self.release_ready_acks();
    }
}

/// Resolves when the clean session's link made its spill queue or became slow.
async fn link_changed(session: &Option<SessionState>) {
    match session.as_ref().and_then(|s| s.link.as_ref()) {
        Some(link) => link.changed().await,
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
        let (tx, rx) = mpsc::unbounded_channel();
        let mut queued = Some((tx.clone(), rx));
        tx.send(ConsumerEvent::Cancelled { queue: QueueId(1), consumer: 7 }).unwrap();
        tx.send(ConsumerEvent::Deliver(delivery(5))).unwrap();
        let d = recv_queued(&mut queued).await.expect("a delivery");
        assert_eq!(d.offset, 5, "the cancellation of a deleted group queue is skipped");

        let mut none = None;
        let waited = tokio::time::timeout(Duration::from_secs(60), recv_queued(&mut none)).await;
        assert!(waited.is_err(), "nothing attached yet: no delivery, no wake-up");
        let waited = tokio::time::timeout(Duration::from_secs(60), recv_direct(&mut None)).await;
        assert!(waited.is_err(), "a persistent session has no fast path");
    }
}
