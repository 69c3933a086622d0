//! What flows from the core to a connection: direct (fast-path) messages and queue
//! deliveries, and the handle through which the router reaches a connected session.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ferrymq_storage::QueueId;
use parking_lot::Mutex;
#[cfg(test)]
use tokio::sync::Notify;

use super::message::SharedMessage;

/// A message routed straight to a connected clean session (no storage involved).
#[derive(Debug, Clone)]
pub struct Direct {
    /// The message, shared with every other subscriber it goes to.
    pub msg: SharedMessage,
    /// Highest granted QoS of the matching subscriptions (the connection applies
    /// min(publish QoS, this)).
    pub qos: u8,
    /// Keep the RETAIN flag as published (else it is cleared).
    pub retain_as_published: bool,
    /// Subscription identifiers of the matching subscriptions.
    pub subscription_ids: Vec<u32>,
}

/// A message handed out by a consume queue; the consumer must answer with an ack (after
/// the client acknowledged it, or right after sending it for QoS 0).
#[derive(Debug, Clone)]
pub struct QueueDelivery {
    /// Queue the entry is from (acks go back to it).
    pub queue: QueueId,
    /// The entry's offset in the queue.
    pub offset: u64,
    /// The message the entry points to.
    pub msg: SharedMessage,
    /// Delivery QoS (already min(publish, granted)).
    pub qos: u8,
    /// Delivered before (send with DUP / redelivered).
    pub redelivered: bool,
    /// QoS 2: the client already sent PUBREC on an earlier connection; resend PUBREL only.
    pub released: bool,
    /// Id of the consumer it is for.
    pub consumer: u64,
    /// Earlier deliveries of this message (AMQP `x-delivery-count`), when the queue
    /// counts them.
    pub delivery_count: Option<u32>,
}

/// The router's handle to a connected clean session.
///
/// Its in-memory buffer is bounded and a publisher never waits on it: what the buffer
/// cannot take now does not stall anyone. A QoS 0 delivery that finds it full is dropped
/// for this subscriber and counted (as Mosquitto and EMQX do). A QoS 1/2 delivery that
/// finds it full *spills*: it goes to the session's spill queue in the journal, as a
/// persistent session's would, stored with the publish (so the publisher's ack still
/// means stored); from then on every QoS 1/2 delivery spills until the connection has
/// taken the backlog, so order is kept. A backlog past the limits marks the subscriber
/// slow (its connection closes it, MQTT 5 reason 0x97) and later deliveries are dropped.
///
/// The buffer allocates nothing until a delivery arrives and gives its memory back once a
/// burst is taken, so an idle session costs only this struct.
#[derive(Debug)]
pub struct SessionLink {
    /// Unique id of this connection's session incarnation.
    pub id: u64,
    /// MQTT Client Identifier of the session (as sent in CONNECT, or assigned by the broker).
    pub client_id: Arc<str>,
    /// Most deliveries the buffer holds (`mqtt.max_online_queue`).
    capacity: usize,
    state: Mutex<LinkState>,
    dropped: AtomicU64,
    /// Set while QoS 1/2 deliveries go to the spill queue (read without the lock).
    spilling: AtomicBool,
    limits: SpillLimits,
    /// Wakes the connection: the buffer got its first delivery after being empty, or
    /// `changed` was set.
    wake: Arc<dyn Wake>,
    /// The spill queue was created (the connection attaches to it) or the backlog passed
    /// its limits (it disconnects).
    changed: AtomicBool,
}

/// How a [`SessionLink`] wakes its connection (the connection's one wait, shared with
/// whatever else wakes it).
pub trait Wake: Send + Sync + std::fmt::Debug {
    /// Wakes the connection, which then looks at every source of work it has (a wake
    /// while it is not waiting may be lost: it looks at them before it waits).
    fn wake(&self);
}

/// For tests of the link without a connection (connections ring `ConnectionSignals`).
#[cfg(test)]
impl Wake for Notify {
    fn wake(&self) {
        self.notify_one();
    }
}

/// What [`SessionLink::event`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// The buffer holds deliveries: [`SessionLink::take`] them.
    Readable,
    /// The spill queue was made or the subscriber became slow (check
    /// [`SessionLink::spill_queue`] and [`SessionLink::is_slow`]).
    Changed,
}

/// Most backlog a clean session may spill before it is disconnected.
#[derive(Debug, Clone, Copy)]
pub struct SpillLimits {
    /// Messages (`mqtt.max_queued_messages`).
    pub messages: u64,
    /// Bytes of payload (`mqtt.max_queued_bytes`).
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct LinkState {
    /// Deliveries the connection has not taken yet.
    buffer: VecDeque<Direct>,
    /// The connection is gone: nothing more is taken.
    closed: bool,
    spill: Spill,
}

#[derive(Debug, Default)]
struct Spill {
    /// The spill queue, made at the first spill.
    queue: Option<QueueId>,
    /// Spilled deliveries the connection has not taken yet, and their payload bytes.
    messages: u64,
    bytes: u64,
    /// The backlog passed its limits: the subscriber is slow.
    slow: bool,
}

/// A buffer that grew past this many deliveries is given back once drained (a smaller
/// one is kept: a subscriber that gets messages now and then does not allocate for each).
const BUFFER_KEEP: usize = 16;

/// What became of a delivery handed to a [`SessionLink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// In the session's buffer.
    Sent,
    /// Goes to this queue (the session's spill queue), with the publish.
    Spill(QueueId),
    /// Dropped for this subscriber (QoS 0 on a full buffer, or a slow subscriber).
    Dropped,
    /// Must spill, and the session has no spill queue yet: nothing was taken or counted.
    /// Make the queue (without holding anything up) and deliver again with it, or count
    /// the delivery dropped with [`SessionLink::spill_queue_failed`].
    NeedsSpillQueue,
    /// The session is gone.
    Gone,
}

impl SessionLink {
    /// A link whose buffer holds at most `capacity` deliveries, waking its connection
    /// through `wake`.
    pub fn new(id: u64, client_id: Arc<str>, capacity: usize, limits: SpillLimits, wake: Arc<dyn Wake>) -> Self {
        SessionLink {
            id,
            client_id,
            capacity: capacity.max(1),
            state: Mutex::new(LinkState::default()),
            dropped: AtomicU64::new(0),
            spilling: AtomicBool::new(false),
            limits,
            wake,
            changed: AtomicBool::new(false),
        }
    }

    /// Hands over a delivery without waiting. `spill_queue` gives the session's spill
    /// queue the first time one is needed, if it is at hand (`None`: the delivery comes back
    /// as [`Handoff::NeedsSpillQueue`]; making the queue may wait on storage, which this
    /// lock-holding call never does).
    pub fn deliver(&self, msg: Direct, spill_queue: impl FnOnce() -> Option<QueueId>) -> Handoff {
        let qos = msg.msg.qos.min(msg.qos);
        let bytes = msg.msg.payload.len() as u64;
        let mut s = self.state.lock();
        if s.closed {
            return Handoff::Gone;
        }
        if qos > 0 && s.spill.messages > 0 {
            return self.spill(&mut s.spill, bytes, spill_queue);
        }
        if s.buffer.len() < self.capacity {
            let was_empty = s.buffer.is_empty();
            s.buffer.push_back(msg);
            drop(s);
            if was_empty {
                self.wake.wake();
            }
            return Handoff::Sent;
        }
        if qos > 0 {
            return self.spill(&mut s.spill, bytes, spill_queue);
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        Handoff::Dropped
    }

    fn spill(&self, s: &mut Spill, bytes: u64, spill_queue: impl FnOnce() -> Option<QueueId>) -> Handoff {
        if s.slow {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Handoff::Dropped;
        }
        if s.messages + 1 > self.limits.messages || s.bytes + bytes > self.limits.bytes {
            s.slow = true;
            self.dropped.fetch_add(1, Ordering::Relaxed);
            self.signal_changed();
            return Handoff::Dropped;
        }
        let queue = match s.queue {
            Some(q) => q,
            None => match spill_queue() {
                Some(q) => {
                    s.queue = Some(q);
                    self.signal_changed();
                    q
                }
                None => return Handoff::NeedsSpillQueue,
            },
        };
        s.messages += 1;
        s.bytes += bytes;
        self.spilling.store(true, Ordering::Release);
        Handoff::Spill(queue)
    }

    /// Counts a delivery dropped because the spill queue it needed could not be made
    /// (after [`Handoff::NeedsSpillQueue`]).
    pub fn spill_queue_failed(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    fn signal_changed(&self) {
        self.changed.store(true, Ordering::Release);
        self.wake.wake();
    }

    /// What the connection has to do now, if anything: the spill state changed, or (if
    /// `take`) the buffer holds deliveries. Ask after each wake-up.
    pub fn event(&self, take: bool) -> Option<LinkEvent> {
        if self.changed.swap(false, Ordering::AcqRel) {
            return Some(LinkEvent::Changed);
        }
        (take && !self.state.lock().buffer.is_empty()).then_some(LinkEvent::Readable)
    }

    /// Takes up to `max` buffered deliveries, oldest first, handing each to `each`.
    pub fn take(&self, max: usize, mut each: impl FnMut(Direct)) {
        let mut s = self.state.lock();
        let n = s.buffer.len().min(max);
        s.buffer.drain(..n).for_each(&mut each);
        if s.buffer.is_empty() && s.buffer.capacity() > BUFFER_KEEP {
            s.buffer = VecDeque::new();
        }
    }

    /// The connection is gone: what is buffered is dropped and later deliveries are refused
    /// ([`Handoff::Gone`]).
    pub fn close(&self) {
        let mut s = self.state.lock();
        s.closed = true;
        s.buffer = VecDeque::new();
    }

    /// The connection took a spilled delivery of `bytes` from the spill queue; once it has
    /// taken them all, deliveries go to the buffer again.
    pub fn took_spilled(&self, bytes: u64) {
        let mut s = self.state.lock();
        let s = &mut s.spill;
        s.messages = s.messages.saturating_sub(1);
        s.bytes = s.bytes.saturating_sub(bytes);
        if s.messages == 0 {
            self.spilling.store(false, Ordering::Release);
        }
    }

    /// True while QoS 1/2 deliveries go to the spill queue (a backlog waits).
    pub fn is_spilling(&self) -> bool {
        self.spilling.load(Ordering::Acquire)
    }

    /// The spill queue, once made.
    pub fn spill_queue(&self) -> Option<QueueId> {
        self.state.lock().spill.queue
    }

    /// True once the backlog passed its limits.
    pub fn is_slow(&self) -> bool {
        self.state.lock().spill.slow
    }

    /// Deliveries waiting for the connection: in the buffer, and spilled to the journal.
    pub fn queued(&self) -> u64 {
        let s = self.state.lock();
        s.buffer.len() as u64 + s.spill.messages
    }

    /// Deliveries dropped for this session (QoS 0 on a full buffer, or a slow consumer).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The connection's end of a [`SessionLink`]: closes the link when dropped, so that
/// deliveries to a connection that is gone are refused rather than buffered.
#[derive(Debug)]
pub(crate) struct LinkReceiver(pub Arc<SessionLink>);

impl Drop for LinkReceiver {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::message::{Message, Properties};
    use bytes::Bytes;

    fn direct(qos: u8, body: &'static [u8]) -> Direct {
        let msg = Message {
            exchange: "amq.topic".into(),
            routing_key: "t".into(),
            payload: Bytes::from_static(body),
            qos,
            retain: false,
            props: Properties::default(),
            timestamp_ms: 0,
        };
        Direct { msg: Arc::new(msg), qos: 2, retain_as_published: false, subscription_ids: Vec::new() }
    }

    fn link(buffer: usize, messages: u64, bytes: u64) -> Arc<SessionLink> {
        Arc::new(SessionLink::new(1, "c".into(), buffer, SpillLimits { messages, bytes }, Arc::new(Notify::new())))
    }

    /// The oldest buffered delivery's payload.
    fn take_one(l: &SessionLink) -> Option<Bytes> {
        let mut got = None;
        l.take(1, |d| got = Some(d.msg.payload.clone()));
        got
    }

    #[test]
    fn a_full_buffer_drops_qos0_and_spills_qos1_in_order() {
        let l = link(1, 10, 1000);
        let made = std::cell::Cell::new(0);
        let queue = || {
            made.set(made.get() + 1);
            Some(QueueId(9))
        };
        assert_eq!(l.deliver(direct(1, b"a"), queue), Handoff::Sent);
        assert_eq!(l.deliver(direct(0, b"b"), queue), Handoff::Dropped, "QoS 0: dropped");
        assert_eq!(l.deliver(direct(1, b"c"), queue), Handoff::Spill(QueueId(9)), "QoS 1: spilled");
        assert_eq!(made.get(), 1, "the spill queue is made once");
        assert_eq!(l.dropped(), 1);
        // Room again, but QoS 1 keeps spilling until the backlog is taken: order is kept.
        assert_eq!(take_one(&l).as_deref(), Some(&b"a"[..]));
        assert_eq!(l.deliver(direct(1, b"d"), queue), Handoff::Spill(QueueId(9)));
        assert_eq!(l.deliver(direct(0, b"e"), queue), Handoff::Sent, "QoS 0 goes to the buffer when it has room");
        l.took_spilled(1);
        assert_eq!(l.deliver(direct(1, b"f"), queue), Handoff::Spill(QueueId(9)), "one still waits");
        l.took_spilled(1);
        l.took_spilled(1);
        assert_eq!(take_one(&l).as_deref(), Some(&b"e"[..]));
        assert_eq!(l.deliver(direct(1, b"g"), queue), Handoff::Sent, "backlog taken: the buffer again");
        assert_eq!(made.get(), 1);
    }

    #[test]
    fn a_backlog_past_its_limits_makes_the_subscriber_slow() {
        let l = link(1, 2, 1000);
        let queue = || Some(QueueId(3));
        assert_eq!(l.deliver(direct(1, b"a"), queue), Handoff::Sent);
        assert_eq!(l.deliver(direct(1, b"b"), queue), Handoff::Spill(QueueId(3)));
        assert_eq!(l.deliver(direct(1, b"c"), queue), Handoff::Spill(QueueId(3)));
        assert!(!l.is_slow());
        assert_eq!(l.deliver(direct(1, b"d"), queue), Handoff::Dropped, "past max messages");
        assert!(l.is_slow());
        l.took_spilled(1);
        assert_eq!(l.deliver(direct(1, b"e"), queue), Handoff::Dropped, "slow stays slow");

        let l = link(1, 100, 5);
        assert_eq!(l.deliver(direct(2, b"a"), queue), Handoff::Sent);
        assert_eq!(l.deliver(direct(2, b"12345"), queue), Handoff::Spill(QueueId(3)));
        assert_eq!(l.deliver(direct(2, b"6"), queue), Handoff::Dropped, "past max bytes");
        assert!(l.is_slow());
    }

    #[test]
    fn a_closed_session_or_a_missing_spill_queue_takes_nothing() {
        let l = link(1, 10, 10);
        let rx = LinkReceiver(l.clone());
        assert_eq!(l.deliver(direct(1, b"a"), || None), Handoff::Sent);
        assert_eq!(l.deliver(direct(1, b"b"), || None), Handoff::NeedsSpillQueue, "no spill queue at hand");
        assert_eq!(l.dropped(), 0, "nothing counted yet");
        l.spill_queue_failed();
        assert_eq!(l.dropped(), 1, "it could not be made");
        drop(rx);
        assert_eq!(l.deliver(direct(1, b"c"), || None), Handoff::Gone);
        assert_eq!(take_one(&l), None, "what was buffered went with the connection");
    }

    #[tokio::test(start_paused = true)]
    async fn the_connection_is_woken_for_the_first_delivery_and_takes_in_order() {
        let bell = Arc::new(Notify::new());
        let l = SessionLink::new(1, "c".into(), 8, SpillLimits { messages: 10, bytes: 1000 }, bell.clone());
        assert_eq!(l.event(true), None, "nothing buffered");
        let waiter = tokio::spawn({
            let bell = bell.clone();
            async move { bell.notified().await }
        });
        tokio::task::yield_now().await;
        for body in [&b"1"[..], b"2", b"3"] {
            assert_eq!(l.deliver(direct(0, body), || None), Handoff::Sent);
        }
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter).await.unwrap().unwrap();
        assert_eq!(l.event(true), Some(LinkEvent::Readable));
        let mut got = Vec::new();
        l.take(2, |d| got.push(d.msg.payload.clone()));
        assert_eq!(got, [&b"1"[..], b"2"], "at most max, oldest first");
        assert_eq!(l.event(false), None, "not taking: a full buffer is no event");
        assert_eq!(l.event(true), Some(LinkEvent::Readable), "one still buffered");
        assert_eq!(take_one(&l).as_deref(), Some(&b"3"[..]));
        // A spill queue made while the connection was not taking: it is told, once.
        for _ in 0..9 {
            l.deliver(direct(1, b"x"), || Some(QueueId(4)));
        }
        tokio::time::timeout(std::time::Duration::from_secs(1), bell.notified()).await.expect("woken");
        assert_eq!(l.event(false), Some(LinkEvent::Changed));
        assert_eq!(l.event(false), None);
        assert_eq!(l.spill_queue(), Some(QueueId(4)));
    }

    #[test]
    fn a_drained_large_buffer_is_given_back() {
        let l = link(1000, 10, 1000);
        for _ in 0..100 {
            l.deliver(direct(0, b"x"), || None);
        }
        l.take(usize::MAX, |_| {});
        assert_eq!(l.state.lock().buffer.capacity(), 0);
        l.deliver(direct(0, b"x"), || None);
        l.take(usize::MAX, |_| {});
        assert!(l.state.lock().buffer.capacity() > 0, "a small one is kept");
    }
}
