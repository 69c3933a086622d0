//! How a queue behaves: limits, overflow, TTL, dead-lettering, delivery limit, retries, single
//! active consumer — set at declaration (AMQP arguments) or by the front-end (MQTT
//! session limits) — and the live gauge its owner shard writes (publishers to
//! reject-publish queues reserve room in it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::backoff::RetryPolicy;

/// What happens when a full queue gets a new message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Drop a queued QoS 0 entry first, else the new message (MQTT sessions).
    DropQos0First,
    /// Drop (or dead-letter) the oldest ready message (`x-overflow: drop-head`).
    DropHead,
    /// Refuse new messages; publishers with confirms get a nack (`reject-publish`).
    RejectPublish,
    /// Like `RejectPublish`, and dead-letter the refused message (`reject-publish-dlx`).
    RejectPublishDlx,
}

/// Where dead-lettered messages go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterTarget {
    /// Exchange (`x-dead-letter-exchange`; "" is the default exchange).
    pub exchange: String,
    /// Routing key (`x-dead-letter-routing-key`); `None` keeps the message's own keys.
    pub routing_key: Option<String>,
}

/// Live counters of a queue, written by its owner shard, read by anyone.
#[derive(Debug, Default)]
pub struct QueueGauge {
    /// Live messages (ready + unacked + on disk).
    pub len: AtomicU64,
    /// Bytes of live messages (record sizes).
    pub bytes: AtomicU64,
    /// Messages ready for delivery (len - unacked).
    pub ready: AtomicU64,
    /// Consumers attached, as of the owner's last update.
    pub consumers: AtomicU64,
    /// Live messages plus publisher reservations not yet counted by the queue
    /// (reject-publish queues: publishers reserve room before storing).
    pub occupied: AtomicU64,
    /// Bytes of live messages plus reserved bytes.
    pub occupied_bytes: AtomicU64,
    /// Messages that entered the queue since start (RabbitMQ's queue `publish`).
    pub published: AtomicU64,
    /// Deliveries to consumers since start (`deliver`).
    pub delivered: AtomicU64,
    /// Messages fetched with basic.get since start (`get`).
    pub fetched: AtomicU64,
    /// Deliveries and fetches of a message delivered before (`redeliver`).
    pub redelivered: AtomicU64,
    /// Acknowledgements since start (`ack`).
    pub acked: AtomicU64,
}

impl QueueGauge {
    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Adds what the owner counted since its last update (once per turn, not per message).
    pub fn add_counts(&self, c: MessageCounts) {
        if c == MessageCounts::default() {
            return;
        }
        for (counter, n) in [
            (&self.published, c.publish),
            (&self.delivered, c.deliver),
            (&self.fetched, c.get),
            (&self.redelivered, c.redeliver),
            (&self.acked, c.ack),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The message counters since start.
    pub fn counts(&self) -> MessageCounts {
        MessageCounts {
            publish: Self::get(&self.published),
            deliver: Self::get(&self.delivered),
            get: Self::get(&self.fetched),
            redeliver: Self::get(&self.redelivered),
            ack: Self::get(&self.acked),
        }
    }
}

/// A queue's message counters (RabbitMQ's queue `message_stats`), kept by its owner in
/// plain integers between gauge updates.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MessageCounts {
    /// Messages that entered the queue.
    pub publish: u64,
    /// Deliveries to consumers.
    pub deliver: u64,
    /// basic.get answers.
    pub get: u64,
    /// Deliveries and fetches of a message delivered before.
    pub redeliver: u64,
    /// Acknowledgements.
    pub ack: u64,
}

/// How one queue behaves; shared (`Arc`) by its owner shard and the publishers that check it.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Queue name (for `x-death` and logs).
    pub name: String,
    /// Virtual host (for dead-letter routing).
    pub vhost: String,
    /// Most live messages (0 = unlimited).
    pub max_len: u64,
    /// Most bytes of records (0 = unlimited).
    pub max_bytes: u64,
    /// What a new message does to a queue at `max_len` or `max_bytes`.
    pub overflow: Overflow,
    /// Entries kept in memory before new ones are left in storage.
    pub memory_window: usize,
    /// When set, an entry is not delivered while an unacked one is this many offsets older
    /// (MQTT session queues derive packet ids from offsets modulo this span).
    pub max_offset_span: Option<u64>,
    /// Per-queue message TTL, ms (`x-message-ttl`).
    pub message_ttl: Option<u64>,
    /// Where dead-lettered messages go (`x-dead-letter-exchange`, `x-dead-letter-routing-key`).
    pub dead_letter: Option<DeadLetterTarget>,
    /// Most redeliveries (`x-delivery-limit`): a limit of L allows L + 1 deliveries.
    pub delivery_limit: Option<u32>,
    /// Delayed retries of requeued messages (`x-delayed-retry-*`, `x-retry-backoff`).
    pub retry: Option<RetryPolicy>,
    /// Only one consumer receives at a time (`x-single-active-consumer`).
    pub single_active_consumer: bool,
    /// Priority queue (`x-max-priority`, up to 15 levels): highest priority first.
    pub max_priority: Option<u8>,
    /// Deliveries carry their earlier-delivery count (`x-delivery-count`, as quorum
    /// queues and queues with a delivery limit do).
    pub count_deliveries: bool,
    /// Transient (QoS 0) messages survive a restart. MQTT session queues keep them; AMQP
    /// queues drop them when reloaded, as RabbitMQ does with non-persistent messages.
    pub keep_transient: bool,
    /// A message whose `x-deduplication-header` value is already in the queue is not
    /// enqueued (`x-message-deduplication: true`).
    pub dedup: bool,
    /// Live counters written by the owner shard; [`QueueConfig::admit`] reserves room in them.
    pub gauge: Arc<QueueGauge>,
}

impl QueueConfig {
    /// A queue with no limits beyond the memory window.
    pub fn new(name: &str, vhost: &str) -> QueueConfig {
        QueueConfig {
            name: name.to_owned(),
            vhost: vhost.to_owned(),
            max_len: 0,
            max_bytes: 0,
            overflow: Overflow::DropHead,
            memory_window: 4096,
            max_offset_span: None,
            message_ttl: None,
            dead_letter: None,
            delivery_limit: None,
            retry: None,
            single_active_consumer: false,
            max_priority: None,
            count_deliveries: false,
            keep_transient: true,
            dedup: false,
            gauge: Arc::new(QueueGauge::default()),
        }
    }

    /// For `reject-publish` queues: reserves room for a message of `size` bytes and returns
    /// true, or returns false when it would not fit (the publisher gets a nack). The queue
    /// releases the reservation when the message arrives.
    pub fn admit(&self, size: u64) -> bool {
        let g = &self.gauge;
        let len = g.occupied.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        let bytes = g.occupied_bytes.fetch_add(size, Ordering::AcqRel).wrapping_add(size);
        if (self.max_len > 0 && len > self.max_len) || (self.max_bytes > 0 && bytes > self.max_bytes) {
            g.occupied.fetch_sub(1, Ordering::AcqRel);
            g.occupied_bytes.fetch_sub(size, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// True when the queue refuses publishes once full.
    pub fn rejects_when_full(&self) -> bool {
        matches!(self.overflow, Overflow::RejectPublish | Overflow::RejectPublishDlx)
    }
}
