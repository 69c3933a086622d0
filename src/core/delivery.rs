//! What flows from the core to a connection: direct (fast-path) messages and queue
//! deliveries, and the handle through which the router reaches a connected session.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ferrymq_storage::QueueId;
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};

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
#[derive(Debug)]
pub struct SessionLink {
    /// Unique id of this connection's session incarnation.
    pub id: u64,
    /// MQTT Client Identifier of the session (as sent in CONNECT, or assigned by the broker).
    pub client_id: Arc<str>,
    tx: mpsc::Sender<Direct>,
    dropped: AtomicU64,
    /// Set while QoS 1/2 deliveries go to the spill queue (read without the lock).
    spilling: AtomicBool,
    spill: Mutex<Spill>,
    limits: SpillLimits,
    /// Wakes the connection when the spill queue was created (it attaches to it) or the
    /// backlog passed its limits (it disconnects).
    changed: Notify,
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
struct Spill {
    /// The spill queue, made at the first spill.
    queue: Option<QueueId>,
    /// Spilled deliveries the connection has not taken yet, and their payload bytes.
    messages: u64,
    bytes: u64,
    /// The backlog passed its limits: the subscriber is slow.
    slow: bool,
}

/// What became of a delivery handed to a [`SessionLink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// In the session's buffer.
    Sent,
    /// Goes to this queue (the session's spill queue), with the publish.
    Spill(QueueId),
    /// Dropped for this subscriber (QoS 0 on a full buffer, or a slow subscriber).
    Dropped,
    /// The session is gone.
    Gone,
}

impl SessionLink {
    /// A link whose direct messages go to `tx`.
    pub fn new(id: u64, client_id: Arc<str>, tx: mpsc::Sender<Direct>, limits: SpillLimits) -> Self {
        SessionLink {
            id,
            client_id,
            tx,
            dropped: AtomicU64::new(0),
            spilling: AtomicBool::new(false),
            spill: Mutex::new(Spill::default()),
            limits,
            changed: Notify::new(),
        }
    }

    /// Hands over a delivery without waiting. `spill_queue` makes the session's spill
    /// queue the first time one is needed (`None`: it cannot be made; the delivery is
    /// dropped).
    pub fn deliver(&self, msg: Direct, spill_queue: impl FnOnce() -> Option<QueueId>) -> Handoff {
        let qos = msg.msg.qos.min(msg.qos);
        if qos > 0 && self.spilling.load(Ordering::Acquire) {
            return self.spill(msg.msg.payload.len() as u64, spill_queue);
        }
        match self.tx.try_send(msg) {
            Ok(()) => Handoff::Sent,
            Err(mpsc::error::TrySendError::Closed(_)) => Handoff::Gone,
            Err(mpsc::error::TrySendError::Full(msg)) if qos > 0 => {
                self.spill(msg.msg.payload.len() as u64, spill_queue)
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Handoff::Dropped
            }
        }
    }

    fn spill(&self, bytes: u64, spill_queue: impl FnOnce() -> Option<QueueId>) -> Handoff {
        if self.tx.is_closed() {
            return Handoff::Gone;
        }
        let mut s = self.spill.lock();
        if s.slow {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Handoff::Dropped;
        }
        if s.messages + 1 > self.limits.messages || s.bytes + bytes > self.limits.bytes {
            s.slow = true;
            drop(s);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            self.changed.notify_one();
            return Handoff::Dropped;
        }
        let queue = match s.queue {
            Some(q) => q,
            None => match spill_queue() {
                Some(q) => {
                    s.queue = Some(q);
                    self.changed.notify_one();
                    q
                }
                None => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    return Handoff::Dropped;
                }
            },
        };
        s.messages += 1;
        s.bytes += bytes;
        self.spilling.store(true, Ordering::Release);
        Handoff::Spill(queue)
    }

    /// The connection took a spilled delivery of `bytes` from the spill queue; once it has
    /// taken them all, deliveries go to the buffer again.
    pub fn took_spilled(&self, bytes: u64) {
        let mut s = self.spill.lock();
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
        self.spill.lock().queue
    }

    /// True once the backlog passed its limits.
    pub fn is_slow(&self) -> bool {
        self.spill.lock().slow
    }

    /// Resolves when the spill queue was made or the subscriber became slow (check
    /// [`SessionLink::spill_queue`] and [`SessionLink::is_slow`]).
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Deliveries dropped for this session (QoS 0 on a full buffer, or a slow consumer).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
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

    fn link(buffer: usize, messages: u64, bytes: u64) -> (SessionLink, mpsc::Receiver<Direct>) {
        let (tx, rx) = mpsc::channel(buffer);
        (SessionLink::new(1, "c".into(), tx, SpillLimits { messages, bytes }), rx)
    }

    #[test]
    fn a_full_buffer_drops_qos0_and_spills_qos1_in_order() {
        let (l, mut rx) = link(1, 10, 1000);
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
        assert_eq!(&rx.try_recv().unwrap().msg.payload[..], b"a");
        assert_eq!(l.deliver(direct(1, b"d"), queue), Handoff::Spill(QueueId(9)));
        assert_eq!(l.deliver(direct(0, b"e"), queue), Handoff::Sent, "QoS 0 goes to the buffer when it has room");
        l.took_spilled(1);
        assert_eq!(l.deliver(direct(1, b"f"), queue), Handoff::Spill(QueueId(9)), "one still waits");
        l.took_spilled(1);
        l.took_spilled(1);
        let _ = rx.try_recv();
        assert_eq!(l.deliver(direct(1, b"g"), queue), Handoff::Sent, "backlog taken: the buffer again");
        assert_eq!(made.get(), 1);
    }

    #[test]
    fn a_backlog_past_its_limits_makes_the_subscriber_slow() {
        let (l, _rx) = link(1, 2, 1000);
        let queue = || Some(QueueId(3));
        assert_eq!(l.deliver(direct(1, b"a"), queue), Handoff::Sent);
        assert_eq!(l.deliver(direct(1, b"b"), queue), Handoff::Spill(QueueId(3)));
        assert_eq!(l.deliver(direct(1, b"c"), queue), Handoff::Spill(QueueId(3)));
        assert!(!l.is_slow());
        assert_eq!(l.deliver(direct(1, b"d"), queue), Handoff::Dropped, "past max messages");
        assert!(l.is_slow());
        l.took_spilled(1);
        assert_eq!(l.deliver(direct(1, b"e"), queue), Handoff::Dropped, "slow stays slow");

        let (l, _rx) = link(1, 100, 5);
        assert_eq!(l.deliver(direct(2, b"a"), queue), Handoff::Sent);
        assert_eq!(l.deliver(direct(2, b"12345"), queue), Handoff::Spill(QueueId(3)));
        assert_eq!(l.deliver(direct(2, b"6"), queue), Handoff::Dropped, "past max bytes");
        assert!(l.is_slow());
    }

    #[test]
    fn a_closed_session_or_no_spill_queue_takes_nothing() {
        let (l, rx) = link(1, 10, 10);
        assert_eq!(l.deliver(direct(1, b"a"), || None), Handoff::Sent);
        assert_eq!(l.deliver(direct(1, b"b"), || None), Handoff::Dropped, "no spill queue could be made");
        drop(rx);
        assert_eq!(l.deliver(direct(1, b"c"), || None), Handoff::Gone);
    }
}
