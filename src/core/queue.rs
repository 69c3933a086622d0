//! A consume queue: an ordered list of pointers into the commit log, its consumers, what
//! is ready, what is unacknowledged, and the limits.
//!
//! One abstraction serves MQTT persistent sessions (one consumer: the session's
//! connection) and shared-subscription groups (competing consumers); AMQP queues plug in
//! the same way. The owning shard task (see [`super::shards`]) is the only writer, so the
//! state needs no lock. Entries beyond an in-memory window stay in storage and are paged
//! in by offset as the ready list drains (the RocketMQ consume-queue model), so a backlog
//! of millions costs memory only for the window.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ferrymq_storage::{Journal, Op, Pointer, QueueId};
use tokio::sync::mpsc;
use tracing::warn;

use super::delivery::QueueDelivery;
use super::message::{now_ms, Message, SharedMessage};

/// Flag bits of a consume-queue entry ([`Pointer::flags`]).
pub mod flags {
    /// QoS of the entry (bits 0-1).
    pub const QOS_MASK: u8 = 0b11;
    /// QoS 2 entry whose PUBREC arrived: only PUBREL is left to send.
    pub const RELEASED: u8 = 0b100;
}

/// Pages read from storage at a time.
const PAGE: usize = 256;

/// Limits of a queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Most live entries (0 = unlimited).
    pub max_len: u64,
    /// Most bytes of records (0 = unlimited).
    pub max_bytes: u64,
    /// Entries kept in memory before new ones are left in storage.
    pub memory_window: usize,
    /// When set, an entry is not delivered while an unacked one is this many offsets older
    /// (MQTT session queues derive packet ids from offsets modulo this span).
    pub max_offset_span: Option<u64>,
}

/// Identifies a consumer of a queue.
pub type ConsumerId = u64;

/// A consumer attached to a queue.
#[derive(Debug)]
pub struct Consumer {
    /// Id (unique per broker run).
    pub id: ConsumerId,
    /// Where deliveries go (bounded in effect by `credit`).
    pub tx: mpsc::UnboundedSender<QueueDelivery>,
    /// Deliveries it may receive before acking.
    pub credit: u32,
    /// Highest QoS it takes (shared-subscription members: their granted QoS).
    pub max_qos: u8,
}

#[derive(Debug, Clone)]
struct Entry {
    offset: u64,
    ptr: Pointer,
    msg: Option<SharedMessage>,
    redelivered: bool,
}

#[derive(Debug)]
struct Unacked {
    entry: Entry,
    consumer: ConsumerId,
}

/// Outcome of offering a freshly appended entry to a full queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Taken.
    Accepted,
    /// Taken after dropping an older QoS 0 entry.
    EvictedQos0,
    /// Dropped (queue full).
    Dropped,
}

/// State of one consume queue.
#[derive(Debug)]
pub struct Queue {
    id: QueueId,
    limits: QueueLimits,
    /// One past the highest offset appended.
    next_offset: u64,
    /// Entries with offset below this are in memory (ready or unacked) or gone.
    loaded_upto: u64,
    /// Entries below this offset existed when the queue was loaded: they may have been
    /// delivered before a restart, so they go out as redeliveries.
    recovered_upto: u64,
    ready: VecDeque<Entry>,
    unacked: BTreeMap<u64, Unacked>,
    consumers: Vec<Consumer>,
    rr: usize,
    len: u64,
    bytes: u64,
    /// Live QoS 0 entries (the first to go when the queue is full).
    qos0: u64,
    /// Storage entries below this offset hold no QoS 0 entry (eviction scans resume here).
    qos0_scan_from: u64,
    /// Offsets at or past `loaded_upto` removed while still in storage: page-in skips them
    /// even if it reads before the removal is applied.
    dropped_ahead: BTreeSet<u64>,
}

impl Queue {
    /// Loads the queue's state from storage (next offset, length and bytes of live entries).
    pub fn load(id: QueueId, limits: QueueLimits, journal: &Journal) -> Queue {
        let next_offset = journal.queue_next_offset(id);
        let (mut len, mut bytes, mut qos0, mut from, mut first) = (0u64, 0u64, 0u64, 0u64, None);
        loop {
            match journal.queue_entries(id, from, 4096) {
                Ok(page) if !page.is_empty() => {
                    first.get_or_insert(page[0].0);
                    for (_, p) in &page {
                        len += 1;
                        bytes += p.size as u64;
                        qos0 += (p.flags & flags::QOS_MASK == 0) as u64;
                    }
                    from = page[page.len() - 1].0 + 1;
                }
                Ok(_) => break,
                Err(e) => {
                    warn!(queue = id.0, error = %e, "cannot scan queue");
                    break;
                }
            }
        }
        Queue {
            id,
            limits,
            next_offset,
            loaded_upto: first.unwrap_or(next_offset),
            recovered_upto: next_offset,
            ready: VecDeque::new(),
            unacked: BTreeMap::new(),
            consumers: Vec::new(),
            rr: 0,
            len,
            bytes,
            qos0,
            qos0_scan_from: 0,
            dropped_ahead: BTreeSet::new(),
        }
    }

    /// The queue's id.
    pub fn id(&self) -> QueueId {
        self.id
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

    /// Attached consumers.
    pub fn consumer_count(&self) -> usize {
        self.consumers.len()
    }

    /// A freshly appended entry (from the journal's completion, in offset order). The
    /// message is kept in memory when the window allows. Applies the length/byte limits;
    /// drops are turned into `Remove` ops in `ops`.
    pub fn appended(
        &mut self,
        offset: u64,
        ptr: Pointer,
        msg: &SharedMessage,
        journal: &Journal,
        ops: &mut Vec<Op>,
    ) -> Admission {
        self.next_offset = self.next_offset.max(offset + 1);
        let qos = ptr.flags & flags::QOS_MASK;
        if offset < self.loaded_upto {
            // Already paged in from storage (the page read raced the completion).
            self.count_in(&ptr);
            return Admission::Accepted;
        }
        let mut admission = Admission::Accepted;
        if self.is_full(ptr.size as u64) {
            if qos > 0 && self.evict_qos0(journal, ops) {
                admission = Admission::EvictedQos0;
            } else {
                ops.push(Op::Remove { queue: self.id, offset });
                self.skip_in_storage(offset);
                return Admission::Dropped;
            }
        }
        self.count_in(&ptr);
        // Keep the message in memory only for a queue someone consumes from: an offline
        // session's backlog stays on disk until its client is back.
        if offset == self.loaded_upto && self.ready.len() < self.limits.memory_window && !self.consumers.is_empty() {
            self.ready.push_back(Entry { offset, ptr, msg: Some(msg.clone()), redelivered: false });
            self.loaded_upto = offset + 1;
        }
        admission
    }

    fn count_in(&mut self, ptr: &Pointer) {
        self.len += 1;
        self.bytes += ptr.size as u64;
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
        if let Some(i) = self.ready.iter().position(|e| e.ptr.flags & flags::QOS_MASK == 0) {
            if let Some(e) = self.ready.remove(i) {
                self.forget(&e, ops);
                return true;
            }
        }
        let mut from = self.qos0_scan_from.max(self.loaded_upto);
        while from < self.next_offset {
            let page = match journal.queue_entries(self.id, from, PAGE) {
                Ok(page) if !page.is_empty() => page,
                _ => return false,
            };
            from = page[page.len() - 1].0 + 1;
            let victim = page
                .into_iter()
                .find(|(o, p)| p.flags & flags::QOS_MASK == 0 && !self.dropped_ahead.contains(o));
            if let Some((offset, ptr)) = victim {
                self.qos0_scan_from = offset + 1;
                self.forget(&Entry { offset, ptr, msg: None, redelivered: false }, ops);
                self.skip_in_storage(offset);
                return true;
            }
            self.qos0_scan_from = from;
        }
        false
    }

    fn is_full(&self, incoming: u64) -> bool {
        (self.limits.max_len > 0 && self.len >= self.limits.max_len)
            || (self.limits.max_bytes > 0 && self.bytes + incoming > self.limits.max_bytes)
    }

    fn forget(&mut self, e: &Entry, ops: &mut Vec<Op>) {
        self.len = self.len.saturating_sub(1);
        if e.ptr.flags & flags::QOS_MASK == 0 {
            self.qos0 = self.qos0.saturating_sub(1);
        }
        self.bytes = self.bytes.saturating_sub(e.ptr.size as u64);
        ops.push(Op::Remove { queue: self.id, offset: e.offset });
    }

    /// Attaches a consumer and returns nothing; call [`Queue::pump`] afterwards.
    pub fn attach(&mut self, consumer: Consumer) {
        self.consumers.retain(|c| c.id != consumer.id);
        self.consumers.push(consumer);
    }

    /// Detaches a consumer; its unacked entries become ready again (redelivered), in order.
    pub fn detach(&mut self, consumer: ConsumerId) {
        self.consumers.retain(|c| c.id != consumer);
        let returned: Vec<u64> = self.unacked.iter().filter(|(_, u)| u.consumer == consumer).map(|(o, _)| *o).collect();
        if returned.is_empty() {
            return;
        }
        let mut back: Vec<Entry> = returned
            .into_iter()
            .filter_map(|o| self.unacked.remove(&o))
            .map(|u| Entry { redelivered: true, ..u.entry })
            .collect();
        back.extend(self.ready.drain(..));
        back.sort_by_key(|e| e.offset);
        self.ready = back.into();
    }

    /// Adds credit to a consumer.
    pub fn credit(&mut self, consumer: ConsumerId, n: u32) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) {
            c.credit = c.credit.saturating_add(n);
        }
    }

    /// The consumer finished with an entry: it leaves the queue; the consumer regains a
    /// credit.
    pub fn ack(&mut self, offset: u64, ops: &mut Vec<Op>) {
        if let Some(u) = self.unacked.remove(&offset) {
            self.forget(&u.entry, ops);
            if let Some(c) = self.consumers.iter_mut().find(|c| c.id == u.consumer) {
                c.credit = c.credit.saturating_add(1);
            }
        }
    }

    /// QoS 2: the client sent PUBREC for an entry; remember it durably so that a resumed
    /// session resends PUBREL, not the message.
    pub fn release(&mut self, offset: u64, ops: &mut Vec<Op>) {
        if let Some(u) = self.unacked.get_mut(&offset) {
            u.entry.ptr.flags |= flags::RELEASED;
            ops.push(Op::SetFlags { queue: self.id, offset, flags: u.entry.ptr.flags });
        }
    }

    /// Removes every entry (session discarded); returns nothing, `ops` gets a queue delete.
    pub fn purge_all(&mut self, ops: &mut Vec<Op>) {
        self.ready.clear();
        self.unacked.clear();
        self.len = 0;
        self.bytes = 0;
        self.qos0 = 0;
        self.dropped_ahead.clear();
        self.loaded_upto = self.next_offset;
        ops.push(Op::DeleteQueue { queue: self.id });
    }

    /// Hands ready entries to consumers with credit, paging entries in from storage as
    /// needed. Expired or unreadable entries are dropped.
    pub fn pump(&mut self, journal: &Journal, ops: &mut Vec<Op>) {
        let now = now_ms();
        loop {
            if !self.consumers.iter().any(|c| c.credit > 0) {
                return;
            }
            while self.ready.is_empty() {
                if !self.page_in(journal) {
                    return;
                }
            }
            let Some(front) = self.ready.front() else { return };
            if let (Some(span), Some((&oldest, _))) = (self.limits.max_offset_span, self.unacked.first_key_value()) {
                if front.offset >= oldest + span {
                    return;
                }
            }
            let Some(mut entry) = self.ready.pop_front() else { return };
            let msg = match entry.msg.take() {
                Some(m) => m,
                None => match read_message(journal, &entry.ptr) {
                    Some(m) => m,
                    None => {
                        self.forget(&entry, ops);
                        continue;
                    }
                },
            };
            if msg.is_expired(now) {
                self.forget(&entry, ops);
                continue;
            }
            let n = self.consumers.len();
            let Some(idx) = (0..n).map(|i| (self.rr + i) % n).find(|&i| self.consumers[i].credit > 0) else {
                entry.msg = Some(msg);
                self.ready.push_front(entry);
                return;
            };
            self.rr = (idx + 1) % n;
            let consumer = &mut self.consumers[idx];
            let delivery = QueueDelivery {
                queue: self.id,
                offset: entry.offset,
                msg: msg.clone(),
                qos: (entry.ptr.flags & flags::QOS_MASK).min(consumer.max_qos),
                redelivered: entry.redelivered,
                released: entry.ptr.flags & flags::RELEASED != 0,
            };
            if consumer.tx.send(delivery).is_err() {
                // Consumer went away without detaching yet: keep the entry, drop the consumer.
                let gone = consumer.id;
                entry.msg = Some(msg);
                self.ready.push_front(entry);
                self.detach(gone);
                continue;
            }
            consumer.credit -= 1;
            entry.msg = Some(msg);
            self.unacked.insert(entry.offset, Unacked { entry, consumer: consumer.id });
        }
    }

    /// Loads the next page of entries from storage; false when there is none.
    fn page_in(&mut self, journal: &Journal) -> bool {
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
                    self.ready.push_back(Entry { offset, ptr, msg: None, redelivered });
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

/// Reads and decodes the message a pointer refers to.
pub fn read_message(journal: &Journal, ptr: &Pointer) -> Option<SharedMessage> {
    match journal.read(ptr.pos) {
        Ok(rec) => match Message::decode(rec.header, rec.body) {
            Ok(m) => Some(std::sync::Arc::new(m)),
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
    use std::sync::Arc;

    use bytes::Bytes;
    use ferrymq_storage::{Append, JournalConfig, QueueTarget, Record};

    use super::*;
    use crate::core::message::Properties;

    struct Fixture {
        _dir: tempfile::TempDir,
        journal: Journal,
        queue: Queue,
        ops: Vec<Op>,
    }

    fn fixture(max_len: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = JournalConfig::new(dir.path());
        cfg.fsync = ferrymq_storage::FsyncPolicy::Never;
        let journal = Journal::open(cfg).unwrap();
        let id = journal.queue_id("q").unwrap();
        let limits = QueueLimits { max_len, max_bytes: 0, memory_window: 8, max_offset_span: Some(100) };
        let queue = Queue::load(id, limits, &journal);
        Fixture { _dir: dir, journal, queue, ops: Vec::new() }
    }

    impl Fixture {
        /// Stores a message with `qos` in the queue, as the publish path does.
        fn publish(&mut self, n: u32, qos: u8) -> Admission {
            let msg = Arc::new(Message {
                exchange: "amq.topic".into(),
                routing_key: "t".into(),
                payload: Bytes::from(n.to_be_bytes().to_vec()),
                qos,
                retain: false,
                props: Properties::default(),
                timestamp_ms: 0,
            });
            let target = QueueTarget { queue: self.queue.id(), tag_hash: 0, flags: qos };
            let receipt = self
                .journal
                .write_blocking(vec![Op::Append(Append {
                    record: Record { header: msg.encode_header(), body: msg.payload.clone() },
                    queues: vec![target],
                    retained_topic: None,
                    timer: None,
                })])
                .unwrap();
            let a = &receipt.appended[0];
            let ptr = Pointer { pos: a.pos, size: a.size, tag_hash: 0, flags: qos };
            let admission = self.queue.appended(a.offsets[0].1, ptr, &msg, &self.journal, &mut self.ops);
            self.flush();
            admission
        }

        fn flush(&mut self) {
            if !self.ops.is_empty() {
                self.journal.write_blocking(std::mem::take(&mut self.ops)).unwrap();
            }
        }

        fn consumer(&mut self, id: ConsumerId, credit: u32) -> mpsc::UnboundedReceiver<QueueDelivery> {
            let (tx, rx) = mpsc::unbounded_channel();
            self.queue.attach(Consumer { id, tx, credit, max_qos: 2 });
            self.queue.pump(&self.journal, &mut self.ops);
            self.flush();
            rx
        }

        fn pump(&mut self) {
            self.queue.pump(&self.journal, &mut self.ops);
            self.flush();
        }
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<QueueDelivery>) -> Vec<(u32, bool)> {
        let mut out = Vec::new();
        while let Ok(d) = rx.try_recv() {
            out.push((u32::from_be_bytes(d.msg.payload[..4].try_into().unwrap()), d.redelivered));
        }
        out
    }

    #[test]
    fn offline_backlog_stays_on_disk_and_pages_in_order_under_credit() {
        let mut f = fixture(0);
        for n in 0..50 {
            f.publish(n, 1);
        }
        assert!(f.queue.ready.is_empty(), "no consumer: nothing kept in memory");
        assert_eq!(f.queue.len(), 50);
        let mut rx = f.consumer(1, 10);
        let got: Vec<u32> = drain(&mut rx).into_iter().map(|(n, _)| n).collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>(), "credit limits deliveries");
        for o in 0..10 {
            f.queue.ack(o, &mut f.ops);
        }
        f.pump();
        let got: Vec<u32> = drain(&mut rx).into_iter().map(|(n, _)| n).collect();
        assert_eq!(got, (10..20).collect::<Vec<_>>());
        assert_eq!(f.queue.len(), 40);
        assert_eq!(f.journal.queue_len(f.queue.id()).unwrap(), 40, "acks remove entries from storage");
    }

    #[test]
    fn detach_returns_unacked_in_order_as_redeliveries() {
        let mut f = fixture(0);
        let mut rx = f.consumer(1, 3);
        for n in 0..5 {
            f.publish(n, 1);
            f.pump();
        }
        assert_eq!(drain(&mut rx), vec![(0, false), (1, false), (2, false)]);
        f.queue.ack(1, &mut f.ops);
        f.queue.detach(1);
        let mut rx2 = f.consumer(2, 10);
        assert_eq!(drain(&mut rx2), vec![(0, true), (2, true), (3, false), (4, false)]);
    }

    #[test]
    fn full_queue_evicts_qos0_from_storage_first_then_drops_new() {
        let mut f = fixture(4);
        assert_eq!(f.publish(0, 0), Admission::Accepted);
        assert_eq!(f.publish(1, 1), Admission::Accepted);
        assert_eq!(f.publish(2, 0), Admission::Accepted);
        assert_eq!(f.publish(3, 1), Admission::Accepted);
        assert_eq!(f.publish(4, 0), Admission::Dropped, "a QoS 0 message is dropped when full");
        assert_eq!(f.publish(5, 1), Admission::EvictedQos0);
        assert_eq!(f.publish(6, 1), Admission::EvictedQos0);
        assert_eq!(f.publish(7, 1), Admission::Dropped, "no QoS 0 left to evict");
        let mut rx = f.consumer(1, 10);
        let got: Vec<u32> = drain(&mut rx).into_iter().map(|(n, _)| n).collect();
        assert_eq!(got, vec![1, 3, 5, 6]);
        assert_eq!(f.queue.len(), 4);
    }

    #[test]
    fn offset_span_limit_holds_back_deliveries() {
        let mut f = fixture(0);
        f.queue.limits.max_offset_span = Some(3);
        let mut rx = f.consumer(1, 10);
        for n in 0..6 {
            f.publish(n, 1);
            f.pump();
        }
        assert_eq!(drain(&mut rx).len(), 3, "offsets 0..3 only while 0 is unacked");
        f.queue.ack(0, &mut f.ops);
        f.pump();
        assert_eq!(drain(&mut rx), vec![(3, false)]);
    }
}
