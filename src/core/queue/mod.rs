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

mod backoff;
mod config;
mod consumer;
mod dedup;
mod ready;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use backoff::{parse_steps, Backoff, RequeueCause, RetryOn, RetryPolicy, MAX_DELAY_MS};
pub use config::{DeadLetterTarget, MessageCounts, Overflow, QueueConfig, QueueGauge};
pub use consumer::{Consumer, ConsumerEvent, ConsumerId};
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
pub mod flags {
    /// QoS of the entry (bits 0-1).
    pub const QOS_MASK: u8 = 0b11;
    /// QoS 2 entry whose PUBREC arrived: only PUBREL is left to send.
    pub const RELEASED: u8 = 0b100;
    /// Message priority, 0-15 (bits 3-6).
    pub const PRIORITY_SHIFT: u8 = 3;
    /// Mask of the priority bits.
    pub const PRIORITY_MASK: u8 = 0b0111_1000;
    /// The publisher reserved room for the entry (reject-publish queues).
    pub const RESERVED: u8 = 0b1000_0000;

    /// Flags for an entry of `qos` and message `priority` (clamped to 15).
    pub fn of(qos: u8, priority: Option<u8>) -> u8 {
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
pub enum Admission {
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
pub struct Effects {
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
pub struct Queue {
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
    pub fn load(id: QueueId, config: Arc<QueueConfig>, journal: &Journal) -> Queue {
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
                            load_ops.push(Op::Remove { queue: id, offset: *offset });
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
    pub fn take_load_ops(&mut self) -> Vec<Op> {
        std::mem::take(&mut self.load_ops)
    }

    /// The queue's id.
    pub fn id(&self) -> QueueId {
        self.id
    }

    /// The queue's configuration.
    pub fn config(&self) -> &Arc<QueueConfig> {
        &self.config
    }

    /// Replaces the configuration (keeps the state).
    pub fn set_config(&mut self, config: Arc<QueueConfig>) {
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
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries delivered and not yet acknowledged.
    pub fn unacked_len(&self) -> usize {
        self.unacked.len()
    }

    /// Entries waiting for a delayed retry.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Messages ready for delivery: neither unacked nor waiting for a retry.
    pub fn ready_len(&self) -> u64 {
        self.len.saturating_sub((self.unacked.len() + self.waiting.len()) as u64)
    }

    /// Consumers attached now (the consumer count of `ShardCmd::Counts`).
    pub fn consumer_count(&self) -> usize {
        self.consumers.len()
    }

    /// True when messages may expire (the shard sweeps such queues on a timer).
    pub fn may_expire(&self) -> bool {
        self.expiring && self.ready_len() > 0
    }

    /// Writes the live counters to the gauge.
    pub fn publish_gauge(&mut self) {
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

    /// A freshly appended entry (from the journal's completion, in offset order). The
    /// message is kept in memory when someone consumes and the window allows. Applies the
    /// length/byte limits per the overflow behaviour.
    pub fn appended(
        &mut self,
        offset: u64,
        ptr: Pointer,
        msg: &SharedMessage,
        journal: &Journal,
        fx: &mut Effects,
    ) -> Admission {
        self.next_offset = self.next_offset.max(offset + 1);
        self.counted.publish += 1;
        if msg.props.expires_at_ms.is_some() {
            self.expiring = true;
        }
        // A page read may have loaded this entry already (it raced the completion).
        let already_loaded = offset < self.loaded_upto;
        if ptr.flags & flags::RESERVED != 0 {
            // The publisher reserved room for it: the reservation turns into the entry (or
            // goes) when the gauge is next published.
            self.reservations_used.0 += 1;
            self.reservations_used.1 += ptr.body_len as u64;
        }
        if offset < self.counted_upto {
            // Already counted when the queue was loaded (the append raced the load).
            return Admission::Accepted;
        }
        let dedup_key = if self.config.dedup { message_key(&msg.props.headers) } else { None };
        if let Some(key) = &dedup_key {
            if std::mem::take(&mut self.dedup_stale) {
                self.dedup = dedup_index(self.id, journal);
                self.dedup.remove(offset);
            }
            if self.dedup.contains(key) {
                self.refuse_appended(offset, already_loaded, &mut fx.ops);
                return Admission::Duplicate;
            }
        }
        let mut admission = Admission::Accepted;
        if self.is_full(ptr.body_len as u64) {
            let qos = ptr.flags & flags::QOS_MASK;
            let made_room = match self.config.overflow {
                Overflow::DropQos0First => {
                    admission = Admission::EvictedQos0;
                    qos > 0 && self.evict_qos0(journal, &mut fx.ops)
                }
                Overflow::DropHead => {
                    admission = Admission::DroppedHead;
                    self.drop_head(journal, fx)
                }
                Overflow::RejectPublish | Overflow::RejectPublishDlx => false,
            };
            if !made_room {
                let mut removal = Vec::new();
                self.refuse_appended(offset, already_loaded, &mut removal);
                let dead = (self.config.overflow == Overflow::RejectPublishDlx).then(|| msg.clone());
                self.dead_letter(dead, DeathReason::MaxLen, removal, fx);
                return Admission::Dropped;
            }
        }
        // A TTL of 0 means "deliver at once or expire" (RabbitMQ's rule).
        let zero_ttl = self.has_zero_ttl(msg);
        let deliverable_now = zero_ttl
            && !already_loaded
            && offset == self.loaded_upto
            && self.ready.is_empty()
            && self.pick_consumer_peek().is_some();
        if zero_ttl && !deliverable_now {
            let mut removal = Vec::new();
            self.refuse_appended(offset, already_loaded, &mut removal);
            self.dead_letter(Some(msg.clone()), DeathReason::Expired, removal, fx);
            return admission;
        }
        self.count_in(&ptr);
        if let Some(key) = dedup_key {
            self.dedup.insert(offset, key);
        }
        if already_loaded {
            return admission;
        }
        if self.config.rejects_when_full() {
            self.publish_gauge();
        }
        self.keep_in_memory(offset, ptr, msg, deliverable_now);
        admission
    }

    /// Removes an appended entry that does not stay (overflow, TTL 0), wherever it is.
    fn refuse_appended(&mut self, offset: u64, already_loaded: bool, ops: &mut Vec<Op>) {
        ops.push(Op::Remove { queue: self.id, offset });
        if already_loaded {
            self.ready.remove_first(|e| e.offset == offset);
        } else {
            self.skip_in_storage(offset);
        }
    }

    /// True when the message may only be delivered at once: the queue's TTL or its own
    /// expiration is 0.
    fn has_zero_ttl(&self, msg: &Message) -> bool {
        self.config.message_ttl == Some(0) || msg.props.expires_at_ms.is_some_and(|at| at <= msg.timestamp_ms)
    }

    /// Keeps a new entry in memory when someone consumes from the queue (an offline
    /// backlog stays on disk until a consumer is back). A priority queue keeps every
    /// entry in its ready list: the next one to go may be the newest.
    fn keep_in_memory(&mut self, offset: u64, ptr: Pointer, msg: &SharedMessage, fresh: bool) {
        let priority = self.config.max_priority.is_some();
        if offset == self.loaded_upto
            && (priority || (self.ready.len() < self.config.memory_window && !self.consumers.is_empty()))
        {
            let entry = Entry {
                offset,
                ptr,
                msg: Some(msg.clone()),
                redelivered: false,
                deliveries: 0,
                priority: self.priority_of(&ptr),
                fresh,
                retry_record: false,
            };
            self.ready.push_back(entry);
            self.loaded_upto = offset + 1;
        }
    }

    fn count_in(&mut self, ptr: &Pointer) {
        self.len += 1;
        self.bytes += ptr.body_len as u64;
        self.qos0 += (ptr.flags & flags::QOS_MASK == 0) as u64;
    }

    /// Marks a storage-only entry as removed so that page-in does not deliver it.
    fn skip_in_storage(&mut self, offset: u64) {
        if offset == self.loaded_upto {
            self.loaded_upto += 1;
        } else if offset > self.loaded_upto {
            self.dropped_ahead.insert(offset);
        }
    }

    /// Drops the oldest QoS 0 entry that was not delivered yet: from memory first, then
    /// from storage (resuming where the last scan stopped). False when there is none.
    fn evict_qos0(&mut self, journal: &Journal, ops: &mut Vec<Op>) -> bool {
        if self.qos0 == 0 {
            return false;
        }
        if let Some(e) = self.ready.remove_first(|e| e.ptr.flags & flags::QOS_MASK == 0) {
            self.forget(&e, ops);
            return true;
        }
        let mut from = self.qos0_scan_from.max(self.loaded_upto);
        while from < self.next_offset {
            let page = match journal.queue_entries(self.id, from, PAGE) {
                Ok(page) if !page.is_empty() => page,
                _ => return false,
            };
            from = page[page.len() - 1].0 + 1;
            let victim =
                page.into_iter().find(|(o, p)| p.flags & flags::QOS_MASK == 0 && !self.dropped_ahead.contains(o));
            if let Some((offset, ptr)) = victim {
                self.qos0_scan_from = offset + 1;
                let retry_record = self.recorded.remove(&offset).is_some();
                let entry = Entry {
                    offset,
                    ptr,
                    msg: None,
                    redelivered: false,
                    deliveries: 0,
                    priority: 0,
                    fresh: false,
                    retry_record,
                };
                self.forget(&entry, ops);
                self.skip_in_storage(offset);
                return true;
            }
            self.qos0_scan_from = from;
        }
        false
    }

    /// Drops (or dead-letters) the oldest ready message; false when none is ready.
    fn drop_head(&mut self, journal: &Journal, fx: &mut Effects) -> bool {
        while self.ready.is_empty() {
            if !self.page_in(journal) {
                return false;
            }
        }
        let Some(mut e) = self.ready.pop_front() else { return false };
        let msg = if self.config.dead_letter.is_some() {
            e.msg.take().or_else(|| read_message(journal, &e.ptr))
        } else {
            None
        };
        self.forget_dead(&e, msg, DeathReason::MaxLen, fx);
        true
    }

    /// Over `x-max-length` counting ready messages only, as RabbitMQ does (and Mosquitto's
    /// `max_queued_messages`, which excludes in-flight ones): delivered, unacknowledged
    /// messages do not take room from new ones.
    fn is_full(&self, incoming: u64) -> bool {
        (self.config.max_len > 0 && self.ready_len() >= self.config.max_len)
            || (self.config.max_bytes > 0 && self.bytes + incoming > self.config.max_bytes)
    }

    fn forget(&mut self, e: &Entry, ops: &mut Vec<Op>) {
        self.dedup.remove(e.offset);
        self.len = self.len.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(e.ptr.body_len as u64);
        if e.ptr.flags & flags::QOS_MASK == 0 {
            self.qos0 = self.qos0.saturating_sub(1);
        }
        ops.push(Op::Remove { queue: self.id, offset: e.offset });
        if e.retry_record {
            ops.push(Op::Delete { space: Space::Retry, key: retry::record_key(self.id, e.offset) });
        }
    }

    /// Hands a leaving message to the dead-letter task when it has somewhere to go: the
    /// dead-letter exchange, or — past the delivery limit of a queue without one — the
    /// queue's `%DLQ%` queue.
    ///
    /// `removal` holds the ops that take the entry out of this queue: they travel with the
    /// dead letter (see [`DeadLetter::removal`]), or go to `fx.ops` when the message is not
    /// dead-lettered (`msg` is `None`, or there is no target).
    fn dead_letter(&self, msg: Option<SharedMessage>, reason: DeathReason, removal: Vec<Op>, fx: &mut Effects) {
        match msg.filter(|_| self.has_dead_letter_target(reason)) {
            Some(msg) => fx.dead.push(DeadLetter { msg, reason, config: self.config.clone(), removal }),
            None => fx.ops.extend(removal),
        }
    }

    /// True when a message dying for `reason` goes somewhere (DeliveryLimit only happens
    /// when a limit is set, and then `%DLQ%` takes it without a dead-letter exchange).
    fn has_dead_letter_target(&self, reason: DeathReason) -> bool {
        self.config.dead_letter.is_some() || reason == DeathReason::DeliveryLimit
    }

    /// Forgets `e` and dead-letters `msg` with the removal (see [`Queue::dead_letter`]);
    /// without a target the removal goes straight to the turn's ops (no allocation).
    fn forget_dead(&mut self, e: &Entry, msg: Option<SharedMessage>, reason: DeathReason, fx: &mut Effects) {
        match msg.filter(|_| self.has_dead_letter_target(reason)) {
            Some(msg) => {
                let mut removal = Vec::with_capacity(2);
                self.forget(e, &mut removal);
                fx.dead.push(DeadLetter { msg, reason, config: self.config.clone(), removal });
            }
            None => self.forget(e, &mut fx.ops),
        }
    }

    /// Attaches a consumer; call [`Queue::pump`] afterwards.
    pub fn attach(&mut self, consumer: Consumer) {
        self.consumers.retain(|c| c.id != consumer.id);
        self.consumers.push(consumer);
    }

    /// Detaches a consumer; its unacked entries become ready again (redelivered), in
    /// order, unless they reached the delivery limit (then they are dead-lettered).
    pub fn detach(&mut self, consumer: ConsumerId, fx: &mut Effects) {
        self.consumers.retain(|c| c.id != consumer);
        let returned: Vec<u64> = self.unacked.iter().filter(|(_, u)| u.consumer == consumer).map(|(o, _)| *o).collect();
        for offset in returned {
            self.requeue(offset, RequeueCause::Returned, fx);
        }
    }

    /// Removes a consumer without returning its unacked entries (AMQP basic.cancel: they
    /// can still be acked, and go back to the queue when their channel closes).
    pub fn cancel(&mut self, consumer: ConsumerId) {
        self.consumers.retain(|c| c.id != consumer);
    }

    /// Adds credit to a consumer.
    pub fn credit(&mut self, consumer: ConsumerId, n: u32) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) {
            c.credit = c.credit.saturating_add(n);
        }
    }

    fn give_credit_back(&mut self, consumer: ConsumerId) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) {
            c.credit = c.credit.saturating_add(1);
        }
    }

    /// The consumer finished with an entry: it leaves the queue; the consumer regains a
    /// credit.
    pub fn ack(&mut self, offset: u64, ops: &mut Vec<Op>) {
        if let Some(u) = self.unacked.remove(&offset) {
            self.counted.ack += 1;
            self.forget(&u.entry, ops);
            self.give_credit_back(u.consumer);
        }
    }

    /// The consumer an unacked entry was delivered to.
    pub fn holder(&self, offset: u64) -> Option<ConsumerId> {
        self.unacked.get(&offset).map(|u| u.consumer)
    }

    /// Puts an unacked entry back in line at its own position (nack/reject with requeue,
    /// or its consumer went away), marked redelivered — or dead-letters it when it has
    /// been delivered more often than the delivery limit allows. Under a retry policy that
    /// covers `cause`, it waits for its backoff first (see [`Queue::retry_due`]).
    pub fn requeue(&mut self, offset: u64, cause: RequeueCause, fx: &mut Effects) {
        let Some(u) = self.unacked.remove(&offset) else { return };
        self.give_credit_back(u.consumer);
        let mut entry = u.entry;
        if cause == RequeueCause::Unsent {
            // It never reached the client: not a delivery (as when the send itself fails).
            entry.deliveries = entry.deliveries.saturating_sub(1);
            self.ready.insert_in_order(entry);
            return;
        }
        if let Some(limit) = self.config.delivery_limit {
            if entry.deliveries > limit {
                let msg = entry.msg.take();
                self.forget_dead(&entry, msg, DeathReason::DeliveryLimit, fx);
                return;
            }
        }
        entry.redelivered = true;
        let delay = self.config.retry.as_ref().filter(|p| p.applies(cause)).map(|p| p.delay_ms(entry.deliveries));
        match delay {
            Some(delay) => {
                self.wait_for_retry(entry, now_ms().saturating_add(delay), &mut fx.ops);
                fx.durable = true;
            }
            None => self.ready.insert_in_order(entry),
        }
    }

    /// Parks an entry until `due_ms`: a retry record and a retry timer in storage; the
    /// message is dropped from memory (it is read again when delivered).
    fn wait_for_retry(&mut self, mut entry: Entry, due_ms: u64, ops: &mut Vec<Op>) {
        let key = retry::record_key(self.id, entry.offset);
        ops.push(Op::Put { space: Space::Retry, key, value: retry::encode_record(due_ms, entry.deliveries) });
        let target = retry::target(self.id, entry.offset);
        ops.push(Op::AddTimer { due_ms, pos: entry.ptr.pos, size: entry.ptr.size, target });
        entry.retry_record = true;
        entry.msg = None;
        let deliveries = entry.deliveries;
        self.waiting.insert(entry.offset, Waiting { due_ms, deliveries, entry: Some(entry) });
    }

    /// The retry timer of entry `offset`, due at `due_ms`, fired: the entry is ready again
    /// (at its own position). A timer older than the entry's wait is ignored.
    pub fn retry_due(&mut self, offset: u64, due_ms: u64) {
        if self.waiting.get(&offset).is_none_or(|w| due_ms < w.due_ms) {
            return;
        }
        let Some(w) = self.waiting.remove(&offset) else { return };
        match w.entry {
            Some(entry) => self.ready.insert_in_order(entry),
            // Still only in storage: page-in makes it ready with its delivery count.
            None => {
                self.recorded.insert(offset, w.deliveries);
            }
        }
    }

    /// Rejects an unacked entry without requeue: it leaves the queue and is dead-lettered
    /// when the queue has a dead-letter target.
    pub fn reject(&mut self, offset: u64, fx: &mut Effects) {
        let Some(mut u) = self.unacked.remove(&offset) else { return };
        self.give_credit_back(u.consumer);
        let msg = u.entry.msg.take();
        self.forget_dead(&u.entry, msg, DeathReason::Rejected, fx);
    }

    /// QoS 2: the client sent PUBREC for an entry; remember it durably so that a resumed
    /// session resends PUBREL, not the message.
    pub fn release(&mut self, offset: u64, ops: &mut Vec<Op>) {
        if let Some(u) = self.unacked.get_mut(&offset) {
            u.entry.ptr.flags |= flags::RELEASED;
            ops.push(Op::SetFlags { queue: self.id, offset, flags: u.entry.ptr.flags });
        }
    }

    /// Removes every ready message (unacked ones stay); returns how many were removed.
    pub fn purge(&mut self, ops: &mut Vec<Op>) -> u64 {
        let purged = self.len.saturating_sub(self.unacked.len() as u64);
        // Storage ranges between unacked entries, which stay.
        let mut from = 0;
        for &o in self.unacked.keys() {
            ops.push(Op::RemoveRange { queue: self.id, from, to: o });
            from = o + 1;
        }
        ops.push(Op::RemoveRange { queue: self.id, from, to: u64::MAX });
        // Retry records go too (unacked entries lose their count: it is only kept for
        // what waits).
        ops.push(Op::DeletePrefix { space: Space::Retry, prefix: retry::record_prefix(self.id) });
        self.stored_delivered_upto = 0;
        self.store_watermark(ops);
        for u in self.unacked.values_mut() {
            u.entry.retry_record = false;
        }
        self.waiting.clear();
        self.recorded.clear();
        self.ready.clear();
        self.dropped_ahead.clear();
        let unacked = &self.unacked;
        self.dedup.retain(|o| unacked.contains_key(&o));
        self.loaded_upto = self.next_offset;
        self.len = self.unacked.len() as u64;
        self.bytes = self.unacked.values().map(|u| u.entry.ptr.body_len as u64).sum();
        self.qos0 = self.unacked.values().filter(|u| u.entry.ptr.flags & flags::QOS_MASK == 0).count() as u64;
        purged
    }

    /// Removes every entry (the queue is deleted); consumers are told they were
    /// cancelled. Returns how many messages were in the queue.
    pub fn delete(&mut self, ops: &mut Vec<Op>) -> u64 {
        let count = self.len;
        for c in self.consumers.drain(..) {
            let _ = c.tx.send(ConsumerEvent::Cancelled { queue: self.id, consumer: c.id });
        }
        self.ready.clear();
        self.unacked.clear();
        self.waiting.clear();
        self.recorded.clear();
        self.dedup = DedupIndex::default();
        self.len = 0;
        self.bytes = 0;
        self.qos0 = 0;
        self.dropped_ahead.clear();
        self.loaded_upto = self.next_offset;
        ops.push(Op::DeleteQueue { queue: self.id });
        ops.push(Op::DeletePrefix { space: Space::Retry, prefix: retry::record_prefix(self.id) });
        self.publish_gauge();
        count
    }

    /// Takes the next ready message for `consumer` (AMQP basic.get): with `no_ack` it
    /// leaves the queue at once, else it waits for an ack like a delivery.
    pub fn get(&mut self, consumer: ConsumerId, no_ack: bool, journal: &Journal, fx: &mut Effects) -> Option<Got> {
        let (mut entry, msg) = self.next_ready(journal, fx)?;
        entry.deliveries += 1;
        self.counted.get += 1;
        self.counted.redeliver += entry.redelivered as u64;
        let delivery = QueueDelivery {
            queue: self.id,
            offset: entry.offset,
            msg: msg.clone(),
            qos: entry.ptr.flags & flags::QOS_MASK,
            redelivered: entry.redelivered,
            released: false,
            consumer,
            delivery_count: self.config.count_deliveries.then(|| entry.deliveries - 1),
        };
        if no_ack {
            self.forget(&entry, &mut fx.ops);
        } else {
            entry.msg = Some(msg);
            self.delivered_upto = self.delivered_upto.max(entry.offset + 1);
            self.unacked.insert(entry.offset, Unacked { entry, consumer });
            self.store_watermark(&mut fx.ops);
        }
        let remaining = self.ready_len();
        Some(Got { delivery, remaining })
    }

    /// Drops (or dead-letters) expired messages at the head of the queue.
    pub fn expire(&mut self, journal: &Journal, fx: &mut Effects) {
        let now = now_ms();
        loop {
            while self.ready.is_empty() {
                if !self.page_in(journal) {
                    self.expiring = self.config.message_ttl.is_some();
                    return;
                }
            }
            let Some(front) = self.ready.front_mut() else { return };
            let fresh = front.fresh;
            let msg = match &front.msg {
                Some(m) => m.clone(),
                None => match read_message(journal, &front.ptr) {
                    Some(m) => {
                        front.msg = Some(m.clone());
                        m
                    }
                    None => {
                        if let Some(e) = self.ready.pop_front() {
                            self.forget(&e, &mut fx.ops);
                        }
                        continue;
                    }
                },
            };
            if !self.is_expired(&msg, now, fresh) {
                return;
            }
            if let Some(e) = self.ready.pop_front() {
                self.forget_dead(&e, Some(msg), DeathReason::Expired, fx);
            }
        }
    }

    fn is_expired(&self, msg: &Message, now: u64, fresh: bool) -> bool {
        if fresh && self.has_zero_ttl(msg) {
            return false;
        }
        msg.is_expired(now) || self.config.message_ttl.is_some_and(|ttl| msg.timestamp_ms.saturating_add(ttl) <= now)
    }

    /// Pops the next deliverable entry with its message, dropping expired and unreadable
    /// ones on the way.
    fn next_ready(&mut self, journal: &Journal, fx: &mut Effects) -> Option<(Entry, SharedMessage)> {
        let now = now_ms();
        loop {
            while self.ready.is_empty() {
                if !self.page_in(journal) {
                    return None;
                }
            }
            let mut entry = self.ready.pop_front()?;
            let msg = match entry.msg.take() {
                Some(m) => m,
                None => match read_message(journal, &entry.ptr) {
                    Some(m) => m,
                    None => {
                        self.forget(&entry, &mut fx.ops);
                        continue;
                    }
                },
            };
            if self.is_expired(&msg, now, entry.fresh) {
                self.forget_dead(&entry, Some(msg), DeathReason::Expired, fx);
                continue;
            }
            return Some((entry, msg));
        }
    }

    /// The consumer to serve next: the single active one, or the highest-priority ones
    /// with credit, round robin.
    fn pick_consumer(&mut self) -> Option<usize> {
        if self.config.single_active_consumer {
            return self.consumers.first().filter(|c| c.credit > 0).map(|_| 0);
        }
        let best = self.consumers.iter().filter(|c| c.credit > 0).map(|c| c.priority).max()?;
        let n = self.consumers.len();
        let idx = (0..n)
            .map(|i| (self.rr + i) % n)
            .find(|&i| self.consumers[i].credit > 0 && self.consumers[i].priority == best)?;
        self.rr = (idx + 1) % n;
        Some(idx)
    }

    /// Hands ready entries to consumers with credit, paging entries in from storage as
    /// needed. Expired or unreadable entries are dropped.
    pub fn pump(&mut self, journal: &Journal, fx: &mut Effects) {
        self.deliver_ready(journal, fx);
        self.store_watermark(&mut fx.ops);
    }

    fn deliver_ready(&mut self, journal: &Journal, fx: &mut Effects) {
        loop {
            if self.consumers.is_empty() || self.pick_consumer_peek().is_none() {
                return;
            }
            if let (Some(span), Some((&oldest, _))) = (self.config.max_offset_span, self.unacked.first_key_value()) {
                while self.ready.is_empty() {
                    if !self.page_in(journal) {
                        return;
                    }
                }
                if self.ready.front().is_some_and(|f| f.offset >= oldest + span) {
                    return;
                }
            }
            let Some((mut entry, msg)) = self.next_ready(journal, fx) else { return };
            let Some(idx) = self.pick_consumer() else {
                entry.msg = Some(msg);
                self.ready.push_front(entry);
                return;
            };
            let count_deliveries = self.config.count_deliveries;
            let consumer = &mut self.consumers[idx];
            entry.deliveries += 1;
            let delivery = QueueDelivery {
                queue: self.id,
                offset: entry.offset,
                msg: msg.clone(),
                qos: (entry.ptr.flags & flags::QOS_MASK).min(consumer.max_qos),
                redelivered: entry.redelivered,
                released: entry.ptr.flags & flags::RELEASED != 0,
                consumer: consumer.id,
                delivery_count: count_deliveries.then(|| entry.deliveries - 1),
            };
            entry.msg = Some(msg);
            entry.fresh = false;
            if consumer.tx.send(ConsumerEvent::Deliver(delivery)).is_err() {
                // Consumer went away without detaching yet: keep the entry, drop the consumer.
                let gone = consumer.id;
                entry.deliveries -= 1;
                self.ready.push_front(entry);
                self.detach(gone, fx);
                continue;
            }
            consumer.credit -= 1;
            let id = consumer.id;
            self.counted.deliver += 1;
            self.counted.redeliver += entry.redelivered as u64;
            self.delivered_upto = self.delivered_upto.max(entry.offset + 1);
            self.unacked.insert(entry.offset, Unacked { entry, consumer: id });
        }
    }

    /// Stores the delivery watermark when it moved (one small write per turn that
    /// delivered, not one per message; a power loss may lose it, and then a redelivery
    /// goes out as a first delivery).
    pub fn store_watermark(&mut self, ops: &mut Vec<Op>) {
        if self.delivered_upto > self.stored_delivered_upto {
            self.stored_delivered_upto = self.delivered_upto;
            let value = Bytes::copy_from_slice(&self.delivered_upto.to_be_bytes());
            ops.push(Op::Put { space: Space::Retry, key: retry::watermark_key(self.id), value });
        }
    }

    fn pick_consumer_peek(&self) -> Option<()> {
        if self.config.single_active_consumer {
            return self.consumers.first().filter(|c| c.credit > 0).map(|_| ());
        }
        self.consumers.iter().any(|c| c.credit > 0).then_some(())
    }

    /// The priority of an entry in this queue (0 unless it is a priority queue).
    fn priority_of(&self, ptr: &Pointer) -> u8 {
        match self.config.max_priority {
            Some(max) => ((ptr.flags & flags::PRIORITY_MASK) >> flags::PRIORITY_SHIFT).min(max),
            None => 0,
        }
    }

    /// Loads the next page of entries from storage (every page, for a priority queue);
    /// false when there is none.
    fn page_in(&mut self, journal: &Journal) -> bool {
        if self.config.max_priority.is_some() {
            let mut any = false;
            while self.page_in_one(journal) {
                any = true;
            }
            return any;
        }
        self.page_in_one(journal)
    }

    fn page_in_one(&mut self, journal: &Journal) -> bool {
        if self.loaded_upto >= self.next_offset {
            return false;
        }
        match journal.queue_entries(self.id, self.loaded_upto, PAGE) {
            Ok(page) if !page.is_empty() => {
                for (offset, ptr) in page {
                    self.loaded_upto = offset + 1;
                    if self.unacked.contains_key(&offset) || self.dropped_ahead.remove(&offset) {
                        continue;
                    }
                    let redelivered = offset < self.recovered_upto;
                    let priority = self.priority_of(&ptr);
                    let mut entry = Entry {
                        offset,
                        ptr,
                        msg: None,
                        redelivered,
                        deliveries: 0,
                        priority,
                        fresh: false,
                        retry_record: false,
                    };
                    if let Some(w) = self.waiting.get_mut(&offset) {
                        entry.deliveries = w.deliveries;
                        entry.retry_record = true;
                        w.entry = Some(entry);
                        continue;
                    }
                    if let Some(deliveries) = self.recorded.remove(&offset) {
                        entry.deliveries = deliveries;
                        entry.retry_record = true;
                    }
                    self.ready.push_back(entry);
                }
                // Offsets passed over are settled; forget their markers.
                let settled = self.loaded_upto;
                self.dropped_ahead = self.dropped_ahead.split_off(&settled);
                true
            }
            Ok(_) => {
                self.loaded_upto = self.next_offset;
                false
            }
            Err(e) => {
                warn!(queue = self.id.0, error = %e, "cannot page in queue entries");
                false
            }
        }
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
pub fn read_message(journal: &Journal, ptr: &Pointer) -> Option<SharedMessage> {
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
mod tests {
    use bytes::Bytes;
    use ferrymq_storage::{Append, JournalConfig, QueueTarget, Record};
    use tokio::sync::mpsc;

    use super::*;
    use crate::core::message::Properties;

    struct Fixture {
        _dir: tempfile::TempDir,
        journal: Journal,
        queue: Queue,
        fx: Effects,
    }

    fn fixture(configure: impl FnOnce(&mut QueueConfig)) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = JournalConfig::new(dir.path());
        cfg.fsync = ferrymq_storage::FsyncPolicy::Never;
        let journal = Journal::open(cfg).unwrap();
        let id = journal.queue_id("q").unwrap();
        let mut config = QueueConfig::new("q", "/");
        config.memory_window = 8;
        configure(&mut config);
        let queue = Queue::load(id, Arc::new(config), &journal);
        Fixture { _dir: dir, journal, queue, fx: Effects::default() }
    }

    fn message(n: u32, qos: u8, timestamp_ms: u64) -> SharedMessage {
        Arc::new(Message {
            exchange: "amq.topic".into(),
            routing_key: "t".into(),
            payload: Bytes::from(n.to_be_bytes().to_vec()),
            qos,
            retain: false,
            props: Properties::default(),
            timestamp_ms,
        })
    }

    impl Fixture {
        /// Stores a message in the queue, as the publish path does.
        fn publish_msg(&mut self, msg: SharedMessage) -> Admission {
            let (offset, ptr) = self.store(&msg);
            self.complete(offset, ptr, &msg)
        }

        /// Writes a message to the journal only: its completion is yet to reach the queue.
        fn store(&mut self, msg: &SharedMessage) -> (u64, Pointer) {
            let target = QueueTarget { queue: self.queue.id(), tag_hash: 0, flags: msg.qos };
            let receipt = self
                .journal
                .write_blocking(vec![Op::Append(Append {
                    record: Record { header: msg.encode_header(), body: msg.payload.clone() },
                    queues: vec![target],
                    retained_topic: None,
                    timer: None,
                    keys: None,
                })])
                .unwrap();
            let a = &receipt.appended[0];
            let ptr =
                Pointer { pos: a.pos, size: a.size, body_len: msg.payload.len() as u32, tag_hash: 0, flags: msg.qos };
            (a.offsets[0].1, ptr)
        }

        /// The journal's completion of a stored message reaches the queue.
        fn complete(&mut self, offset: u64, ptr: Pointer, msg: &SharedMessage) -> Admission {
            let admission = self.queue.appended(offset, ptr, msg, &self.journal, &mut self.fx);
            // As the shard does at the end of each turn.
            self.queue.publish_gauge();
            self.flush();
            admission
        }

        fn publish(&mut self, n: u32, qos: u8) -> Admission {
            self.publish_msg(message(n, qos, now_ms()))
        }

        fn flush(&mut self) {
            if !self.fx.ops.is_empty() {
                self.journal.write_blocking(std::mem::take(&mut self.fx.ops)).unwrap();
            }
        }

        fn consumer_with(
            &mut self,
            id: ConsumerId,
            credit: u32,
            priority: i32,
        ) -> mpsc::UnboundedReceiver<ConsumerEvent> {
            let (tx, rx) = mpsc::unbounded_channel();
            self.queue.attach(Consumer { id, tx, credit, max_qos: 2, priority });
            self.pump();
            rx
        }

        fn consumer(&mut self, id: ConsumerId, credit: u32) -> mpsc::UnboundedReceiver<ConsumerEvent> {
            self.consumer_with(id, credit, 0)
        }

        fn pump(&mut self) {
            self.queue.pump(&self.journal, &mut self.fx);
            self.flush();
        }

        fn dead(&mut self) -> Vec<(u32, DeathReason)> {
            self.fx.dead.drain(..).map(|d| (n_of(&d.msg), d.reason)).collect()
        }
    }

    fn n_of(m: &Message) -> u32 {
        u32::from_be_bytes(m.payload[..4].try_into().unwrap())
    }

    /// (message number, redelivered, offset) of every delivery waiting in `rx`.
    fn drain(rx: &mut mpsc::UnboundedReceiver<ConsumerEvent>) -> Vec<(u32, bool, u64)> {
        let mut out = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            if let ConsumerEvent::Deliver(d) = ev {
                out.push((n_of(&d.msg), d.redelivered, d.offset));
            }
        }
        out
    }

    fn numbers(v: &[(u32, bool, u64)]) -> Vec<u32> {
        v.iter().map(|d| d.0).collect()
    }

    #[test]
    fn offline_backlog_stays_on_disk_and_pages_in_order_under_credit() {
        let mut f = fixture(|_| {});
        for n in 0..50 {
            f.publish(n, 1);
        }
        assert!(f.queue.ready.is_empty(), "no consumer: nothing kept in memory");
        assert_eq!(f.queue.len(), 50);
        let mut rx = f.consumer(1, 10);
        assert_eq!(numbers(&drain(&mut rx)), (0..10).collect::<Vec<_>>(), "credit limits deliveries");
        for o in 0..10 {
            f.queue.ack(o, &mut f.fx.ops);
        }
        f.pump();
        assert_eq!(numbers(&drain(&mut rx)), (10..20).collect::<Vec<_>>());
        assert_eq!(f.queue.len(), 40);
        assert_eq!(f.journal.queue_len(f.queue.id()).unwrap(), 40, "acks remove entries from storage");
    }

    #[test]
    fn after_a_reload_only_entries_delivered_before_are_redeliveries() {
        let mut f = fixture(|_| {});
        for n in 0..4 {
            f.publish(n, 1);
        }
        let mut rx = f.consumer(1, 2);
        assert_eq!(drain(&mut rx), vec![(0, false, 0), (1, false, 1)], "first deliveries");
        // A restart: the two delivered entries may have reached the client, the others not.
        let config = f.queue.config().clone();
        f.queue = Queue::load(f.queue.id(), config, &f.journal);
        let mut rx = f.consumer(2, 10);
        assert_eq!(
            drain(&mut rx),
            vec![(0, true, 0), (1, true, 1), (2, false, 2), (3, false, 3)],
            "DUP / redelivered only where a delivery may have happened"
        );
    }

    #[test]
    fn detach_returns_unacked_in_order_as_redeliveries() {
        let mut f = fixture(|_| {});
        let mut rx = f.consumer(1, 3);
        for n in 0..5 {
            f.publish(n, 1);
            f.pump();
        }
        assert_eq!(
            drain(&mut rx).iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(),
            vec![(0, false), (1, false), (2, false)]
        );
        f.queue.ack(1, &mut f.fx.ops);
        f.queue.detach(1, &mut f.fx);
        let mut rx2 = f.consumer(2, 10);
        let got: Vec<(u32, bool)> = drain(&mut rx2).iter().map(|d| (d.0, d.1)).collect();
        assert_eq!(got, vec![(0, true), (2, true), (3, false), (4, false)]);
    }

    #[test]
    fn full_session_queue_evicts_qos0_from_storage_first_then_drops_new() {
        let mut f = fixture(|c| {
            c.max_len = 4;
            c.overflow = Overflow::DropQos0First;
        });
        assert_eq!(f.publish(0, 0), Admission::Accepted);
        assert_eq!(f.publish(1, 1), Admission::Accepted);
        assert_eq!(f.publish(2, 0), Admission::Accepted);
        assert_eq!(f.publish(3, 1), Admission::Accepted);
        assert_eq!(f.publish(4, 0), Admission::Dropped, "a QoS 0 message is dropped when full");
        assert_eq!(f.publish(5, 1), Admission::EvictedQos0);
        assert_eq!(f.publish(6, 1), Admission::EvictedQos0);
        assert_eq!(f.publish(7, 1), Admission::Dropped, "no QoS 0 left to evict");
        let mut rx = f.consumer(1, 10);
        assert_eq!(numbers(&drain(&mut rx)), vec![1, 3, 5, 6]);
        assert_eq!(f.queue.len(), 4);
    }

    #[test]
    fn an_append_that_raced_the_load_is_counted_once() {
        let mut f = fixture(|c| {
            c.max_len = 5;
            c.overflow = Overflow::DropQos0First;
        });
        // Stored, but its completion is still on its way when the shard loads the queue
        // (for a consumer that attaches and detaches at once).
        let first = message(0, 0, now_ms());
        let (offset, ptr) = f.store(&first);
        let config = f.queue.config().clone();
        f.queue = Queue::load(f.queue.id(), config, &f.journal);
        drop(f.consumer(1, 10));
        f.queue.detach(1, &mut f.fx);
        assert_eq!(f.complete(offset, ptr, &first), Admission::Accepted);
        assert_eq!(f.queue.len(), 1, "counted by the load only");
        for n in 1..3 {
            f.publish(n, 0);
        }
        let admitted: Vec<Admission> = (10..16).map(|n| f.publish(n, 1)).collect();
        assert_eq!(admitted[5], Admission::Dropped, "the sixth QoS 1 message finds no QoS 0 left to evict");
        assert_eq!(f.queue.len(), 5);
        let mut rx = f.consumer(2, 10);
        assert_eq!(numbers(&drain(&mut rx)), (10..15).collect::<Vec<_>>());
    }

    #[test]
    fn a_deduplicated_append_that_raced_the_load_is_no_duplicate_of_itself() {
        let mut f = fixture(|c| c.dedup = true);
        let mut msg = message(0, 1, now_ms());
        let header = (crate::core::dedup::HEADER.to_owned(), crate::core::value::Value::Str("k".into()));
        Arc::make_mut(&mut msg).props.headers.push(header);
        let (offset, ptr) = f.store(&msg);
        // Loaded (and its index read) before the completion arrives.
        let config = f.queue.config().clone();
        f.queue = Queue::load(f.queue.id(), config, &f.journal);
        assert_eq!(f.complete(offset, ptr, &msg), Admission::Accepted);
        assert_eq!(f.publish_msg(msg.clone()), Admission::Duplicate, "its value is in the queue");
        assert_eq!(f.queue.len(), 1);
    }

    #[test]
    fn full_queue_drops_head_into_the_dead_letter_exchange() {
        let mut f = fixture(|c| {
            c.max_len = 2;
            c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
        });
        for n in 0..4 {
            f.publish(n, 1);
        }
        assert_eq!(f.dead(), vec![(0, DeathReason::MaxLen), (1, DeathReason::MaxLen)]);
        let mut rx = f.consumer(1, 10);
        assert_eq!(numbers(&drain(&mut rx)), vec![2, 3]);
    }

    #[test]
    fn reject_publish_drops_new_messages() {
        let mut f = fixture(|c| {
            c.max_len = 1;
            c.overflow = Overflow::RejectPublish;
        });
        assert_eq!(f.publish(0, 1), Admission::Accepted);
        assert!(!f.queue.config().admit(10), "publishers are told the queue is full");
        assert_eq!(f.publish(1, 1), Admission::Dropped, "a publish that raced the check is dropped");
        let mut rx = f.consumer(1, 10);
        assert_eq!(numbers(&drain(&mut rx)), vec![0]);
    }

    #[test]
    fn requeue_goes_back_in_place_and_reject_dead_letters() {
        let mut f = fixture(|c| c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None }));
        let mut rx = f.consumer(1, 2);
        for n in 0..4 {
            f.publish(n, 1);
            f.pump();
        }
        assert_eq!(numbers(&drain(&mut rx)), vec![0, 1]);
        f.queue.requeue(1, RequeueCause::Failed, &mut f.fx);
        f.queue.reject(0, &mut f.fx);
        assert_eq!(f.dead(), vec![(0, DeathReason::Rejected)]);
        f.pump();
        let got = drain(&mut rx);
        assert_eq!(got.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(), vec![(1, true), (2, false)]);
    }

    #[test]
    fn delivery_limit_allows_limit_plus_one_deliveries() {
        let mut f = fixture(|c| {
            c.delivery_limit = Some(1);
            c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
        });
        let mut rx = f.consumer(1, 1);
        f.publish(7, 1);
        f.pump();
        assert_eq!(numbers(&drain(&mut rx)), vec![7]);
        f.queue.requeue(0, RequeueCause::Failed, &mut f.fx);
        f.pump();
        assert_eq!(numbers(&drain(&mut rx)), vec![7], "second delivery (limit 1 allows 2)");
        f.queue.requeue(0, RequeueCause::Failed, &mut f.fx);
        f.pump();
        assert!(drain(&mut rx).is_empty());
        assert_eq!(f.dead(), vec![(7, DeathReason::DeliveryLimit)]);
        assert_eq!(f.queue.len(), 0);
    }

    #[test]
    fn a_retry_waits_aside_and_survives_a_reload() {
        let policy = RetryPolicy { on: RetryOn::Failed, backoff: Backoff::Linear { min_ms: 60_000, max_ms: 60_000 } };
        let mut f = fixture(|c| c.retry = Some(policy));
        let mut rx = f.consumer(1, 10);
        for n in 0..3 {
            f.publish(n, 1);
            f.pump();
        }
        assert_eq!(numbers(&drain(&mut rx)), vec![0, 1, 2]);
        f.queue.requeue(0, RequeueCause::Failed, &mut f.fx);
        assert!(f.fx.durable, "a retry wait is written durably");
        f.queue.requeue(1, RequeueCause::Returned, &mut f.fx);
        f.pump();
        let got: Vec<(u32, bool)> = drain(&mut rx).iter().map(|d| (d.0, d.1)).collect();
        assert_eq!(got, vec![(1, true)], "`failed` only: a returned message comes back at once, the failed one waits");
        assert_eq!((f.queue.waiting_len(), f.queue.ready_len()), (1, 0));
        let timers = f.journal.timers_due(u64::MAX, 10).unwrap();
        assert_eq!(timers.len(), 1);
        assert_eq!(retry::decode_target(&timers[0].target), Some((f.queue.id(), 0)));

        // A restart: the waiting entry stays aside; the unacked ones come back.
        let config = f.queue.config().clone();
        f.queue = Queue::load(f.queue.id(), config, &f.journal);
        f.fx.ops.extend(f.queue.take_load_ops());
        f.flush();
        assert_eq!(f.journal.timers_due(u64::MAX, 10).unwrap(), timers, "the timer is kept (not duplicated)");
        let mut rx = f.consumer(2, 10);
        assert_eq!(numbers(&drain(&mut rx)), vec![1, 2]);
        f.queue.retry_due(0, timers[0].due_ms - 1);
        f.pump();
        assert!(drain(&mut rx).is_empty(), "a timer older than the wait is ignored");
        f.queue.retry_due(0, timers[0].due_ms);
        f.pump();
        let Ok(ConsumerEvent::Deliver(d)) = rx.try_recv() else { panic!("no redelivery") };
        assert_eq!((n_of(&d.msg), d.redelivered), (0, true));
        f.queue.ack(0, &mut f.fx.ops);
        f.flush();
        let records = f.journal.scan(Space::Retry, b"").unwrap();
        assert!(
            !records.iter().any(|(k, v)| retry::decode_record(k, v).is_some()),
            "the retry record leaves with the entry"
        );
    }

    #[test]
    fn ttl_expires_the_head_and_dead_letters() {
        let mut f = fixture(|c| {
            c.message_ttl = Some(1000);
            c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
        });
        f.publish_msg(message(1, 1, now_ms() - 5000));
        f.publish_msg(message(2, 1, now_ms()));
        assert!(f.queue.may_expire());
        f.queue.expire(&f.journal, &mut f.fx);
        assert_eq!(f.dead(), vec![(1, DeathReason::Expired)]);
        assert_eq!(f.queue.len(), 1);
    }

    #[test]
    fn ttl_zero_delivers_at_once_or_expires() {
        let mut f = fixture(|c| {
            c.message_ttl = Some(0);
            c.dead_letter = Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: None });
        });
        f.publish(1, 1);
        assert_eq!(f.dead(), vec![(1, DeathReason::Expired)], "nobody to take it: expired at once");
        assert_eq!(f.queue.len(), 0);
        let mut rx = f.consumer(1, 1);
        f.publish(2, 1);
        f.pump();
        assert_eq!(numbers(&drain(&mut rx)), vec![2], "a consumer with credit takes it at once");
        f.publish(3, 1);
        assert_eq!(f.dead(), vec![(3, DeathReason::Expired)], "no credit left: expired");
        assert!(drain(&mut rx).is_empty());
    }

    #[test]
    fn get_purge_and_delete() {
        let mut f = fixture(|_| {});
        for n in 0..5 {
            f.publish(n, 1);
        }
        let got = f.queue.get(9, false, &f.journal, &mut f.fx).unwrap();
        assert_eq!((n_of(&got.delivery.msg), got.remaining), (0, 4));
        let got = f.queue.get(9, true, &f.journal, &mut f.fx).unwrap();
        assert_eq!((n_of(&got.delivery.msg), got.remaining), (1, 3));
        assert_eq!(f.queue.purge(&mut f.fx.ops), 3, "ready messages only");
        f.flush();
        assert_eq!(f.queue.len(), 1, "the unacked get stays");
        assert_eq!(f.journal.queue_len(f.queue.id()).unwrap(), 1);
        f.queue.requeue(0, RequeueCause::Failed, &mut f.fx);
        let mut rx = f.consumer(1, 10);
        assert_eq!(drain(&mut rx).iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(), vec![(0, true)]);
        assert_eq!(f.queue.delete(&mut f.fx.ops), 1);
        assert!(matches!(rx.try_recv(), Ok(ConsumerEvent::Cancelled { consumer: 1, .. })));
    }

    #[test]
    fn single_active_consumer_and_priorities() {
        let mut f = fixture(|c| c.single_active_consumer = true);
        let mut a = f.consumer(1, 10);
        let mut b = f.consumer(2, 10);
        for n in 0..3 {
            f.publish(n, 1);
            f.pump();
        }
        assert_eq!(numbers(&drain(&mut a)), vec![0, 1, 2]);
        assert!(drain(&mut b).is_empty());
        f.queue.detach(1, &mut f.fx);
        f.pump();
        assert_eq!(numbers(&drain(&mut b)), vec![0, 1, 2], "the next consumer takes over from the first unacked");

        let mut f = fixture(|_| {});
        let mut low = f.consumer_with(1, 10, 0);
        let mut high = f.consumer_with(2, 1, 5);
        for n in 0..3 {
            f.publish(n, 1);
            f.pump();
        }
        assert_eq!(numbers(&drain(&mut high)), vec![0], "higher priority first, while it has credit");
        assert_eq!(numbers(&drain(&mut low)), vec![1, 2]);
    }

    #[test]
    fn offset_span_limit_holds_back_deliveries() {
        let mut f = fixture(|c| c.max_offset_span = Some(3));
        let mut rx = f.consumer(1, 10);
        for n in 0..6 {
            f.publish(n, 1);
            f.pump();
        }
        assert_eq!(drain(&mut rx).len(), 3, "offsets 0..3 only while 0 is unacked");
        f.queue.ack(0, &mut f.fx.ops);
        f.pump();
        assert_eq!(drain(&mut rx).iter().map(|d| d.0).collect::<Vec<_>>(), vec![3]);
    }
}
