//! A stream (`x-queue-type: stream`): an append-only consume queue whose entries are not
//! removed by consuming. Each consumer has its own cursor and credit ([`StreamConsumer`]);
//! acks give credit back and delete nothing. Offsets are the consume-queue offsets the
//! journal assigns: they start at 0 and are contiguous, and only retention
//! ([`retention`]) removes entries — always the oldest, as one range removal.
//!
//! Like a [`crate::core::queue::Queue`], a stream is owned by its shard task (single
//! writer, no lock). New entries arrive with their message in memory and are kept in a
//! short tail so that consumers at the head get them without a storage read; a consumer
//! further behind pages pointers from the journal (`queue_entries`) and reads each body
//! only when it delivers it.

mod config;
mod cursor;
pub mod retention;
mod seek;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use config::{parse_age, StreamConfig, StreamOffset};
pub use cursor::StreamConsumer;
use ferrymq_storage::{Journal, Op, Pointer, QueueId};
use tracing::{debug, warn};

use super::delivery::QueueDelivery;
use super::message::SharedMessage;
use super::queue::{flags, read_message, ConsumerEvent, ConsumerId};
use retention::Extent;

/// Pointers read from storage at a time by a consumer that is behind.
const PAGE: usize = 256;
/// Most recent entries kept in memory while someone consumes.
const TAIL_ENTRIES: usize = 1024;
/// Most body bytes kept in the in-memory tail.
const TAIL_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Debug)]
struct TailEntry {
    offset: u64,
    ptr: Pointer,
    msg: SharedMessage,
}

/// State of one stream.
#[derive(Debug)]
pub struct Stream {
    id: QueueId,
    config: Arc<StreamConfig>,
    /// Oldest live offset (== `next` when empty).
    first: u64,
    /// Next offset the journal assigns.
    next: u64,
    /// Body bytes of live entries.
    bytes: u64,
    /// Recent entries with their messages, contiguous or not, in offset order.
    tail: VecDeque<TailEntry>,
    tail_bytes: u64,
    consumers: Vec<StreamConsumer>,
}

impl Stream {
    /// Loads a stream's extent from storage (one scan of its pointers, no body reads).
    pub fn load(id: QueueId, config: Arc<StreamConfig>, journal: &Journal) -> Stream {
        let next = journal.queue_next_offset(id);
        let (mut first, mut bytes, mut from) = (None, 0u64, 0u64);
        loop {
            match journal.queue_entries(id, from, 4096) {
                Ok(page) if !page.is_empty() => {
                    first.get_or_insert(page[0].0);
                    bytes += page.iter().map(|(_, p)| p.body_len as u64).sum::<u64>();
                    from = page[page.len() - 1].0 + 1;
                }
                Ok(_) => break,
                Err(e) => {
                    warn!(stream = %config.name, error = %e, "cannot scan stream");
                    break;
                }
            }
        }
        let s = Stream {
            id,
            config,
            first: first.unwrap_or(next),
            next,
            bytes,
            tail: VecDeque::new(),
            tail_bytes: 0,
            consumers: Vec::new(),
        };
        s.publish_gauge();
        s
    }

    /// The stream's id.
    pub fn id(&self) -> QueueId {
        self.id
    }

    /// Replaces the retention settings (keeps the contents).
    pub fn set_config(&mut self, config: Arc<StreamConfig>) {
        self.config = config;
        self.publish_gauge();
    }

    /// Live entries.
    pub fn len(&self) -> u64 {
        self.next - self.first
    }

    /// True when no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Oldest live offset (the next offset when empty).
    pub fn first_offset(&self) -> u64 {
        self.first
    }

    /// Attached consumers.
    pub fn consumer_count(&self) -> usize {
        self.consumers.len()
    }

    /// Writes the live counters to the gauge.
    pub fn publish_gauge(&self) {
        let g = &self.config.gauge;
        g.len.store(self.len(), Ordering::Relaxed);
        g.bytes.store(self.bytes, Ordering::Relaxed);
        g.ready.store(self.len(), Ordering::Relaxed);
        g.consumers.store(self.consumers.len() as u64, Ordering::Relaxed);
    }

    /// A freshly appended entry (journal completion order = offset order).
    pub fn appended(&mut self, offset: u64, ptr: Pointer, msg: &SharedMessage) {
        if offset < self.next {
            // Already counted when the stream was loaded (the append raced the load).
            return;
        }
        if self.first == self.next {
            self.first = offset;
        }
        self.next = offset + 1;
        self.bytes += ptr.body_len as u64;
        if self.consumers.is_empty() {
            return;
        }
        self.tail_bytes += ptr.body_len as u64;
        self.tail.push_back(TailEntry { offset, ptr, msg: msg.clone() });
        while self.tail.len() > TAIL_ENTRIES || self.tail_bytes > TAIL_BYTES {
            let Some(e) = self.tail.pop_front() else { break };
            self.tail_bytes -= e.ptr.body_len as u64;
        }
    }

    /// The offset a consumer starting at `start` reads first.
    pub fn resolve(&self, start: StreamOffset, journal: &Journal) -> u64 {
        match start {
            StreamOffset::First => self.first,
            StreamOffset::Last => self.next.saturating_sub(1).max(self.first),
            StreamOffset::Next => self.next,
            StreamOffset::Offset(o) => o.clamp(self.first, self.next),
            StreamOffset::Timestamp(ms) => seek::offset_for_timestamp(journal, self.id, self.first, self.next, ms),
        }
    }

    /// Attaches a consumer reading from `start` with `credit`; call [`Stream::pump`] after.
    pub fn attach(&mut self, id: ConsumerId, tx: tokio::sync::mpsc::UnboundedSender<ConsumerEvent>, credit: u32, start: StreamOffset, journal: &Journal) {
        let next = self.resolve(start, journal);
        debug!(stream = %self.config.name, consumer = id, offset = next, ?start, "stream consumer attached");
        self.consumers.retain(|c| c.id != id);
        self.consumers.push(StreamConsumer::new(id, tx, credit, next));
    }

    /// Removes a consumer (cancel, channel closed): its cursor goes with it.
    pub fn detach(&mut self, id: ConsumerId) {
        self.consumers.retain(|c| c.id != id);
        if self.consumers.is_empty() {
            self.tail.clear();
            self.tail_bytes = 0;
        }
    }

    /// A consumer settled a delivery (ack, nack or reject): it gets the credit back.
    pub fn settle(&mut self, consumer: ConsumerId, offset: u64) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) {
            c.settle(offset);
        }
    }

    /// Adds credit to a consumer.
    pub fn credit(&mut self, consumer: ConsumerId, n: u32) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) {
            c.credit = c.credit.saturating_add(n);
        }
    }

    /// Sends every consumer what its cursor and credit allow.
    pub fn pump(&mut self, journal: &Journal) {
        let mut gone = Vec::new();
        for i in 0..self.consumers.len() {
            if !self.pump_one(i, journal) {
                gone.push(self.consumers[i].id);
            }
        }
        for id in gone {
            self.detach(id);
        }
    }

    /// Delivers to consumer `i`; false when its connection is gone.
    fn pump_one(&mut self, i: usize, journal: &Journal) -> bool {
        let (id, first, next) = (self.id, self.first, self.next);
        let c = &mut self.consumers[i];
        c.skip_trimmed(first);
        while c.credit > 0 && c.next < next {
            while c.page.front().is_some_and(|(o, _)| *o < c.next) {
                c.page.pop_front();
            }
            let (offset, ptr, msg) = match tail_lookup(&self.tail, c.next) {
                Some(e) => {
                    if c.page.front().is_some_and(|(o, _)| *o == e.offset) {
                        c.page.pop_front();
                    }
                    (e.offset, e.ptr, Some(e.msg.clone()))
                }
                None => {
                    if c.page.is_empty() {
                        match journal.queue_entries(id, c.next, PAGE) {
                            Ok(page) if !page.is_empty() => c.page.extend(page),
                            Ok(_) => {
                                c.next = next;
                                break;
                            }
                            Err(e) => {
                                warn!(stream = id.0, error = %e, "cannot page in stream entries");
                                break;
                            }
                        }
                    }
                    let Some((offset, ptr)) = c.page.pop_front() else { break };
                    if offset >= next {
                        // Stored, but its append has not reached this owner yet.
                        c.page.push_front((offset, ptr));
                        break;
                    }
                    (offset, ptr, None)
                }
            };
            c.next = offset + 1;
            if !c.admits(&ptr) {
                continue;
            }
            let Some(msg) = msg.or_else(|| read_message(journal, &ptr)) else { continue };
            let delivery = QueueDelivery {
                queue: id,
                offset,
                msg,
                qos: (ptr.flags & flags::QOS_MASK).max(1),
                redelivered: false,
                released: false,
                consumer: c.id,
                delivery_count: None,
            };
            if c.tx.send(ConsumerEvent::Deliver(delivery)).is_err() {
                return false;
            }
            c.credit -= 1;
            c.unacked.insert(offset);
        }
        true
    }

    /// Trims what retention no longer allows (at most one bounded pass); the removal op
    /// goes to `ops`.
    pub fn enforce_retention(&mut self, journal: &Journal, now_ms: u64, ops: &mut Vec<Op>) -> bool {
        if !self.config.has_retention() {
            return false;
        }
        let extent = Extent { first: self.first, next: self.next, bytes: self.bytes };
        let Some(trim) = retention::plan(journal, self.id, extent, &self.config, now_ms) else { return false };
        debug!(stream = %self.config.name, from = trim.from, to = trim.to, bytes = trim.bytes, "stream trimmed");
        ops.push(Op::RemoveRange { queue: self.id, from: trim.from, to: trim.to });
        self.first = trim.to;
        self.bytes = self.bytes.saturating_sub(trim.bytes);
        while self.tail.front().is_some_and(|e| e.offset < trim.to) {
            if let Some(e) = self.tail.pop_front() {
                self.tail_bytes -= e.ptr.body_len as u64;
            }
        }
        for c in &mut self.consumers {
            c.skip_trimmed(trim.to);
        }
        true
    }

    /// Removes every entry (the stream is deleted); consumers are told they were
    /// cancelled. Returns how many entries it held.
    pub fn delete(&mut self, ops: &mut Vec<Op>) -> u64 {
        let count = self.len();
        for c in self.consumers.drain(..) {
            let _ = c.tx.send(ConsumerEvent::Cancelled { queue: self.id, consumer: c.id });
        }
        self.tail.clear();
        self.tail_bytes = 0;
        self.first = self.next;
        self.bytes = 0;
        ops.push(Op::DeleteQueue { queue: self.id });
        self.publish_gauge();
        count
    }
}

fn tail_lookup(tail: &VecDeque<TailEntry>, offset: u64) -> Option<&TailEntry> {
    let front = tail.front()?.offset;
    if offset < front {
        return None;
    }
    // Usually contiguous: try the direct index first.
    let guess = (offset - front) as usize;
    if tail.get(guess).is_some_and(|e| e.offset == offset) {
        return tail.get(guess);
    }
    tail.binary_search_by_key(&offset, |e| e.offset).ok().and_then(|i| tail.get(i))
}
