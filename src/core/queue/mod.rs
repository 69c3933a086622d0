//! A consume queue: an ordered list of pointers into the commit log, its consumers, what
//! is ready, what is unacknowledged, and its behaviour ([`QueueConfig`]).
//!
//! One abstraction serves MQTT persistent sessions (one consumer: the session's
//! connection), MQTT shared-subscription groups and AMQP queues (competing consumers,
//! prefetch as credit, priorities, single active consumer, requeue, dead-lettering, TTL,
//! length limits, delivery limit, delayed retries). The owning shard task (see [`super::shards`]) is the
//! only writer, so the state needs no lock. Entries beyond an in-memory window stay in
//! storage and are paged in by offset as the ready list drains (the RocketMQ
//! consume-queue model), so a backlog of millions costs memory only for the window.
//!
//! An entry requeued under a retry policy ([`RetryPolicy`]) waits outside the ready list
//! until its retry timer fires ([`Queue::retry_due`]); later entries keep flowing. Its
//! retry record (see [`super::retry`]) tells a restarted broker that it still waits and
//! how often it was delivered.

mod append;
mod backoff;
mod config;
mod consumer;
mod dedup;
mod deliver;
mod ready;
mod settle;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) use backoff::{parse_steps, Backoff, RequeueCause, RetryOn, RetryPolicy, MAX_DELAY_MS};
pub(crate) use config::{DeadLetterTarget, MessageCounts, Overflow, QueueConfig, QueueGauge};
pub(crate) use consumer::{Consumer, ConsumerEvent, ConsumerId};
use std::collections::HashMap;

use bytes::Bytes;
use ferrymq_storage::{Journal, Op, Pointer, QueueId, Space};
use tracing::warn;

use dedup::DedupIndex;
use ready::Ready;

use super::dedup::message_key;
use super::delivery::QueueDelivery;
use super::message::{now_ms, Message, SharedMessage};
use super::retry;

/// Flag bits of a consume-queue entry ([`Pointer::flags`]).
pub(crate) mod flags {
    /// QoS of the entry (bits 0-1).
    pub(crate) const QOS_MASK: u8 = 0b11;
    /// QoS 2 entry whose PUBREC arrived: only PUBREL is left to send.
    pub(crate) const RELEASED: u8 = 0b100;
    /// Message priority, 0-15 (bits 3-6).
    pub(crate) const PRIORITY_SHIFT: u8 = 3;
    /// Mask of the priority bits.
    pub(crate) const PRIORITY_MASK: u8 = 0b0111_1000;
    /// The publisher reserved room for the entry (reject-publish queues).
    pub(crate) const RESERVED: u8 = 0b1000_0000;

    /// Flags for an entry of `qos` and message `priority` (clamped to 15).
    pub(crate) fn of(qos: u8, priority: Option<u8>) -> u8 {
        (qos & QOS_MASK) | (priority.unwrap_or(0).min(15) << PRIORITY_SHIFT)
    }
}

/// Pages read from storage at a time.
const PAGE: usize = 256;

/// Why a message leaves a queue for its dead-letter exchange (the `x-death` reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathReason {
    /// Rejected or nacked without requeue.
    Rejected,
    /// Its TTL (the queue's `x-message-ttl` or the message's own expiry) passed while it waited.
    Expired,
    /// Dropped from the head of a full queue.
    MaxLen,
    /// Redelivered more often than the delivery limit allows.
    DeliveryLimit,
}

impl DeathReason {
    /// The reason as RabbitMQ writes it in `x-death`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeathReason::Rejected => "rejected",
            DeathReason::Expired => "expired",
            DeathReason::MaxLen => "maxlen",
            DeathReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// A message leaving a queue that has a dead-letter target.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The message to republish with `x-death`.
    pub msg: SharedMessage,
    /// Why it leaves: the `reason` written into its `x-death` entry.
    pub reason: DeathReason,
    /// The queue's configuration (name, vhost, target).
    pub config: Arc<QueueConfig>,
    /// The journal ops that remove the message from this queue: submitted together with
    /// its republication, so that a crash in between redelivers it rather than losing it.
    pub removal: Vec<Op>,
}

#[derive(Debug, Clone)]
struct Entry {
    offset: u64,
    ptr: Pointer,
    msg: Option<SharedMessage>,
    redelivered: bool,
    /// Deliveries so far.
    deliveries: u32,
    /// Priority (0 unless the queue is a priority queue).
    priority: u8,
    /// Appended while a consumer could take it at once: a TTL of 0 does not expire it
    /// before that first delivery.
    fresh: bool,
    /// Has a retry record in storage (removed with the entry).
    retry_record: bool,
}

/// An entry waiting for its delayed retry.
#[derive(Debug)]
struct Waiting {
    /// When its retry timer is due.
    due_ms: u64,
    /// Deliveries so far.
    deliveries: u32,
    /// The entry; `None` while it is still only in storage (after a restart, until
    /// page-in reaches it).
    entry: Option<Entry>,
}

#[derive(Debug)]
struct Unacked {
    entry: Entry,
    consumer: ConsumerId,
}

/// Outcome of offering a freshly appended entry to a full queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Taken without dropping anything (the queue was not full).
    Accepted,
    /// Taken after dropping an older QoS 0 entry.
    EvictedQos0,
    /// Taken after dropping (or dead-lettering) the oldest ready message.
    DroppedHead,
    /// Dropped (queue full).
    Dropped,
    /// Not enqueued: its `x-deduplication-header` value is already in the queue.
    Duplicate,
}

/// Side effects of a queue operation that the owning shard carries out.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// Journal ops (acks, drops, flag changes).
    pub ops: Vec<Op>,
    /// Messages to dead-letter.
    pub dead: Vec<DeadLetter>,
    /// The ops must be durable before the owner goes on (an entry started waiting for a
    /// retry: its record and timer must survive a crash, or it would come back at once).
    pub durable: bool,
}

/// A message handed out by [`Queue::get`].
#[derive(Debug)]
pub struct Got {
    /// The delivery (offset, message, redelivered, delivery count).
    pub delivery: QueueDelivery,
    /// Ready messages left after this one.
    pub remaining: u64,
}

/// State of one consume queue.
#[derive(Debug)]
pub(crate) struct Queue {
    id: QueueId,
    config: Arc<QueueConfig>,
    /// One past the highest offset appended.
    next_offset: u64,
    /// One past the highest offset the load found in storage: those entries were counted
    /// then, so their completions (still on their way to the shard) must not count them
    /// again.
    counted_upto: u64,
    /// Entries with offset below this are in memory (ready or unacked) or gone.
    loaded_upto: u64,
    /// Entries below this offset may have been delivered before the queue was loaded (the
    /// stored delivery watermark), so they go out as redeliveries.
    recovered_upto: u64,
    /// One past the highest offset delivered, and the value last stored.
    delivered_upto: u64,
    stored_delivered_upto: u64,
    ready: Ready,
    unacked: BTreeMap<u64, Unacked>,
    /// Entries waiting for their delayed retry, by offset.
    waiting: BTreeMap<u64, Waiting>,
    /// Delivery counts, from retry records, of entries not paged in yet.
    recorded: HashMap<u64, u32>,
    consumers: Vec<Consumer>,
    rr: usize,
    len: u64,
    bytes: u64,
    /// Live QoS 0 entries (the first to go when an MQTT session queue is full).
    qos0: u64,
    /// Storage entries below this offset hold no QoS 0 entry (eviction scans resume here).
    qos0_scan_from: u64,
    /// Offsets at or past `loaded_upto` removed while still in storage: page-in skips them
    /// even if it reads before the removal is applied.
    dropped_ahead: BTreeSet<u64>,
    /// Some message may expire (queue TTL, or a message with an expiry was seen).
    expiring: bool,
    /// Removals decided while loading (transient messages that do not survive a restart).
    load_ops: Vec<Op>,
    /// Ready length and bytes last added into the gauge's occupancy.
    published: (u64, u64),
    /// Message counters since the gauge was last published.
    counted: MessageCounts,
    /// Publisher reservations that became entries (or were dropped) since the gauge was
    /// last published: count and bytes.
    reservations_used: (u64, u64),
    /// Header values of the live entries, when the queue de-duplicates.
    dedup: DedupIndex,
    /// The index must be built from storage before it is used (de-duplication was turned
    /// on for a queue loaded without it).
    dedup_stale: bool,
}

impl Queue {
    /// Loads the queue's state from storage (next offset, length and bytes of live entries).
    pub(crate) fn load(id: QueueId, config: Arc<QueueConfig>, journal: &Journal) -> Queue {
        let next_offset = journal.queue_next_offset(id);
        let (mut len, mut bytes, mut qos0, mut from, mut first) = (0u64, 0u64, 0u64, 0u64, None);
        let mut load_ops = Vec::new();
        let mut records = load_retry_records(id, journal);
        let (mut waiting, mut recorded) = (BTreeMap::new(), HashMap::new());
        let now = now_ms();
        let mut scanned = true;
        loop {
            match journal.queue_entries(id, from, 4096) {
                Ok(page) if !page.is_empty() => {
                    first.get_or_insert(page[0].0);
                    for (offset, p) in &page {
                        if !config.keep_transient && p.flags & flags::QOS_MASK == 0 {
                            load_ops.push(Op::Remove { queue: id, offset: *offset, at: None });
                            continue;
                        }
                        if let Some((due_ms, deliveries)) = records.remove(offset) {
                            if due_ms > now {
                                // Still waiting: its timer again, in case it was lost.
                                let target = retry::target(id, *offset);
                                load_ops.push(Op::AddTimer { due_ms, pos: p.pos, size: p.size, target });
                                waiting.insert(*offset, Waiting { due_ms, deliveries, entry: None });
                            } else {
                                recorded.insert(*offset, deliveries);
                            }
                        }
                        len += 1;
                        bytes += p.body_len as u64;
                        qos0 += (p.flags & flags::QOS_MASK == 0) as u64;
                    }
                    from = page[page.len() - 1].0 + 1;
                }
                Ok(_) => break,
                Err(e) => {
                    warn!(queue = id.0, error = %e, "cannot scan queue");
                    scanned = false;
                    break;
                }
            }
        }
        // Entries that may have been delivered before: below the stored watermark. None
        // stored: nothing was delivered, unless the directory predates watermarks (then
        // every entry may have been).
        let watermark = match journal.get(Space::Retry, &retry::watermark_key(id)) {
            Ok(Some(v)) => <[u8; 8]>::try_from(&v[..]).map(u64::from_be_bytes).unwrap_or(next_offset),
            Ok(None) if matches!(journal.get(Space::Retry, retry::WATERMARKS_COMPLETE), Ok(Some(_))) => 0,
            _ => next_offset,
        }
        .min(next_offset);
        // Records whose entry is gone (known only once every entry was read: a record is
        // never deleted because the entries after a failed read were not seen).
        for offset in records.into_keys().filter(|_| scanned) {
            load_ops.push(Op::Delete { space: Space::Retry, key: retry::record_key(id, offset) });
        }
        let ready = Ready::new(config.max_priority.is_some());
        let mut q = Queue {
            id,
            expiring: config.message_ttl.is_some(),
            config,
            next_offset,
            // The scan may see entries the counters did not show yet.
            counted_upto: next_offset.max(from),
            loaded_upto: first.unwrap_or(next_offset),
            recovered_upto: watermark,
            delivered_upto: watermark,
            stored_delivered_upto: watermark,
            ready,
            unacked: BTreeMap::new(),
            waiting,
            recorded,
            consumers: Vec::new(),
            rr: 0,
            len,
            bytes,
            qos0,
            qos0_scan_from: 0,
            dropped_ahead: BTreeSet::new(),
            load_ops,
            published: (0, 0),
            reservations_used: (0, 0),
            dedup: DedupIndex::default(),
            dedup_stale: false,
            counted: MessageCounts::default(),
        };
        if q.config.dedup {
            q.dedup = dedup_index(id, journal);
            // Entries stored since the count are indexed by their own completion.
            let counted_upto = q.counted_upto;
            q.dedup.retain(|o| o < counted_upto);
        }
        q.publish_gauge();
        q
    }

    /// Removals decided while loading; the owner submits them.
    pub(crate) fn take_load_ops(&mut self) -> Vec<Op> {
        std::mem::take(&mut self.load_ops)
    }

    /// The queue's id.
    pub(crate) fn id(&self) -> QueueId {
        self.id
    }

    /// The queue's configuration.
    #[cfg(test)]
    pub(crate) fn config(&self) -> &Arc<QueueConfig> {
        &self.config
    }

    /// Replaces the configuration (keeps the state).
    pub(crate) fn set_config(&mut self, config: Arc<QueueConfig>) {
        self.expiring |= config.message_ttl.is_some();
        self.dedup_stale |= config.dedup && !self.config.dedup;
        if !Arc::ptr_eq(&self.config.gauge, &config.gauge) {
            // A new gauge: its occupancy starts from the whole queue.
            self.published = (0, 0);
        }
        self.config = config;
        self.publish_gauge();
    }

    /// Live entries (ready, unacked and not yet loaded).
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Entries waiting for a delayed retry.
    #[cfg(test)]
    pub(crate) fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Messages ready for delivery: neither unacked nor waiting for a retry.
    pub(crate) fn ready_len(&self) -> u64 {
        self.len.saturating_sub((self.unacked.len() + self.waiting.len()) as u64)
    }

    /// Consumers attached now (the consumer count of `ShardCmd::Counts`).
    pub(crate) fn consumer_count(&self) -> usize {
        self.consumers.len()
    }

    /// True when messages may expire (the shard sweeps such queues on a timer).
    pub(crate) fn may_expire(&self) -> bool {
        self.expiring && self.ready_len() > 0
    }

    /// Writes the live counters to the gauge.
    pub(crate) fn publish_gauge(&mut self) {
        let g = &self.config.gauge;
        g.len.store(self.len, Ordering::Relaxed);
        g.bytes.store(self.bytes, Ordering::Relaxed);
        // Occupancy = ready entries (what `x-max-length` counts, as in `is_full`) +
        // outstanding reservations, moved in one atomic step each: a reservation that became
        // an entry is taken off as the entry is added.
        let ready = self.ready_len();
        let (used_len, used_bytes) = std::mem::take(&mut self.reservations_used);
        let len_delta = ready.wrapping_sub(self.published.0).wrapping_sub(used_len);
        let bytes_delta = self.bytes.wrapping_sub(self.published.1).wrapping_sub(used_bytes);
        g.occupied.fetch_add(len_delta, Ordering::AcqRel);
        g.occupied_bytes.fetch_add(bytes_delta, Ordering::AcqRel);
        self.published = (ready, self.bytes);
        g.ready.store(ready, Ordering::Relaxed);
        g.consumers.store(self.consumers.len() as u64, Ordering::Relaxed);
        g.add_counts(std::mem::take(&mut self.counted));
    }
}

/// The header values of `queue`'s live entries, read from storage (a queue that
/// de-duplicates, when it is loaded: one record read per entry).
fn dedup_index(queue: QueueId, journal: &Journal) -> DedupIndex {
    let mut index = DedupIndex::default();
    let mut from = 0;
    loop {
        match journal.queue_entries(queue, from, PAGE) {
            Ok(page) if !page.is_empty() => {
                for (offset, ptr) in &page {
                    if let Some(key) = read_message(journal, ptr).and_then(|m| message_key(&m.props.headers)) {
                        index.insert(*offset, key);
                    }
                }
                from = page[page.len() - 1].0 + 1;
            }
            Ok(_) => return index,
            Err(e) => {
                warn!(queue = queue.0, error = %e, "cannot read the de-duplication values");
                return index;
            }
        }
    }
}

/// The retry records of `queue`: offset -> (due ms, deliveries).
fn load_retry_records(queue: QueueId, journal: &Journal) -> BTreeMap<u64, (u64, u32)> {
    match journal.scan(Space::Retry, &retry::record_prefix(queue)) {
        Ok(records) => records
            .iter()
            .filter_map(|(k, v)| retry::decode_record(k, v))
            .map(|(offset, due, deliveries)| (offset, (due, deliveries)))
            .collect(),
        Err(e) => {
            warn!(queue = queue.0, error = %e, "cannot read retry records");
            BTreeMap::new()
        }
    }
}

/// Reads and decodes the message a pointer refers to.
pub(crate) fn read_message(journal: &Journal, ptr: &Pointer) -> Option<SharedMessage> {
    match journal.read(ptr.pos) {
        Ok(rec) => match Message::decode(rec.header, rec.body) {
            Ok(m) => Some(Arc::new(m)),
            Err(e) => {
                warn!(pos = ptr.pos.0, error = %e, "undecodable record");
                None
            }
        },
        Err(e) => {
            warn!(pos = ptr.pos.0, error = %e, "cannot read record");
            None
        }
    }
}

#[cfg(test)]
mod tests;
