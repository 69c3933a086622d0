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

pub(crate) mod assignment;
mod config;
mod cursor;
pub(crate) mod group;
mod reader;
pub(crate) mod retention;
mod seek;

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) use config::{parse_age, StreamConfig, StreamOffset};
pub(crate) use cursor::StreamConsumer;
use ferrymq_storage::{Journal, Op, Pointer, QueueId};
pub(crate) use group::{Group, GroupCursor};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::delivery::QueueDelivery;
use super::message::SharedMessage;
use super::queue::{flags, read_message, ConsumerEvent, ConsumerId, MessageCounts};
use super::store::{command_ops, Command};
use super::tag_filter::TagFilter;
use reader::TailEntry;
use retention::Extent;

/// Most recent entries kept in memory while someone consumes.
const TAIL_ENTRIES: usize = 1024;
/// Most body bytes kept in the in-memory tail.
const TAIL_BYTES: u64 = 4 * 1024 * 1024;
/// Pointers read per index page when counting bytes.
const COUNT_PAGE: usize = 4096;

/// A stream's extent and its consumer groups, as operations see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStatus {
    /// Oldest live offset.
    pub first: u64,
    /// Next offset to be written (the end).
    pub next: u64,
    /// Consumers attached (group members and plain readers).
    pub consumers: usize,
    /// The consumer groups, by name.
    pub groups: Vec<GroupStatus>,
}

/// One consumer group of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    /// Group name (`x-consumer-group`).
    pub name: String,
    /// Every offset below this is acknowledged.
    pub committed: u64,
    /// Offsets acknowledged above a gap.
    pub acked_above: usize,
    /// Offsets out with members, not yet acknowledged.
    pub in_flight: usize,
    /// Members attached now.
    pub members: usize,
    /// One member reads at a time (a super stream partition or a single-active group).
    pub exclusive: bool,
}

impl GroupStatus {
    /// Messages of `stream` the group has not acknowledged yet.
    pub fn lag(&self, stream: &StreamStatus) -> u64 {
        let done = (self.committed.max(stream.first) + self.acked_above as u64).min(stream.next);
        stream.next - done
    }
}

/// State of one stream.
#[derive(Debug)]
pub(crate) struct Stream {
    id: QueueId,
    config: Arc<StreamConfig>,
    /// Oldest live offset (== `next` when empty).
    first: u64,
    /// Next offset the journal assigns.
    next: u64,
    /// Body bytes of the live entries, except those in `uncounted`.
    bytes: u64,
    /// Entries held at load whose bytes are not in `bytes` yet: counted a page at a time
    /// by [`Stream::count_bytes`] (at once when a byte limit needs them), so that a huge
    /// stream starts in constant time.
    uncounted: Option<Range<u64>>,
    /// Recent entries with their messages, contiguous or not, in offset order.
    tail: VecDeque<TailEntry>,
    tail_bytes: u64,
    consumers: Vec<StreamConsumer>,
    /// Consumer groups by name (kept while the stream lives, members or not).
    groups: HashMap<String, Group>,
    /// Message counters since the gauge was last published.
    counted: MessageCounts,
}

impl Stream {
    /// Loads a stream's extent from storage without reading its entries: they are
    /// normally contiguous (only retention removes them, oldest first), so the journal's
    /// next offset and live count give the first offset, checked against the lowest live
    /// offset with one lookup. Body bytes are
    /// counted (one scan of the pointers, no body reads) only for a stream with a byte
    /// limit; a huge stream without one starts in constant time.
    pub(crate) fn load(id: QueueId, config: Arc<StreamConfig>, journal: &Journal) -> Stream {
        let next = journal.queue_next_offset(id);
        let len = journal.queue_len(id).unwrap_or(0).min(next);
        let first = next - len;
        let mut s = Stream {
            id,
            config,
            first,
            next,
            bytes: 0,
            uncounted: (first < next).then_some(first..next),
            tail: VecDeque::new(),
            tail_bytes: 0,
            consumers: Vec::new(),
            groups: HashMap::new(),
            counted: MessageCounts::default(),
        };
        // `len` live offsets below `next` whose lowest is `next - len` leave no gap. After a
        // crash, recovery may have dropped pointers at the tail (past the valid log) while
        // `next` stays: then the lowest is lower, and the scan finds the real extent.
        let contiguous = len == 0 || seek::entry_at_or_after(journal, id, 0).is_some_and(|(lowest, _)| lowest == first);
        if !contiguous || s.config.max_bytes.is_some() {
            s.scan(journal);
        }
        s.publish_gauge();
        s
    }

    /// Counts the live entries' body bytes and finds the first offset (one scan of the
    /// pointers, no body reads).
    fn scan(&mut self, journal: &Journal) {
        let (mut first, mut bytes, mut from) = (None, 0u64, 0u64);
        loop {
            match journal.queue_entries(self.id, from, 4096) {
                Ok(page) if !page.is_empty() => {
                    first.get_or_insert(page[0].0);
                    bytes += page.iter().map(|(_, p)| p.body_len as u64).sum::<u64>();
                    from = page[page.len() - 1].0 + 1;
                }
                Ok(_) => break,
                Err(e) => {
                    warn!(stream = %self.config.name, error = %e, "cannot scan stream");
                    break;
                }
            }
        }
        self.first = first.unwrap_or(self.next);
        self.bytes = bytes;
        self.uncounted = None;
    }

    /// Counts the bytes of up to `budget` entries held at load that are not counted yet.
    /// Returns true when it counted some (the gauge changes).
    pub(crate) fn count_bytes(&mut self, journal: &Journal, budget: usize) -> bool {
        let Some(range) = self.uncounted.clone() else { return false };
        let mut from = range.start.max(self.first);
        let mut read = 0;
        while from < range.end && read < budget {
            let page = match journal.queue_entries(self.id, from, COUNT_PAGE.min(budget - read)) {
                Ok(page) => page,
                Err(e) => {
                    warn!(stream = %self.config.name, error = %e, "cannot count stream bytes");
                    return false;
                }
            };
            let Some(&(last, _)) = page.last() else {
                from = range.end;
                break;
            };
            read += page.len();
            self.bytes += page.iter().filter(|(o, _)| *o < range.end).map(|(_, p)| p.body_len as u64).sum::<u64>();
            from = last + 1;
        }
        self.uncounted = (from < range.end).then_some(from..range.end);
        true
    }

    /// True while bytes of entries held at load are not counted yet.
    pub(crate) fn counting_bytes(&self) -> bool {
        self.uncounted.is_some()
    }

    /// The stream's id.
    pub(crate) fn id(&self) -> QueueId {
        self.id
    }

    /// Replaces the retention settings (keeps the contents).
    pub(crate) fn set_config(&mut self, config: Arc<StreamConfig>, journal: &Journal) {
        self.config = config;
        if self.config.max_bytes.is_some() && self.uncounted.is_some() {
            self.scan(journal);
        }
        self.publish_gauge();
    }

    /// Entries kept: from the oldest untrimmed offset up to the next one to append.
    pub(crate) fn len(&self) -> u64 {
        self.next - self.first
    }

    /// Oldest live offset (the next offset when empty).
    #[cfg(test)]
    pub(crate) fn first_offset(&self) -> u64 {
        self.first
    }

    /// Consumers attached and not cancelled.
    pub(crate) fn consumer_count(&self) -> usize {
        self.consumers.iter().filter(|c| !c.cancelled).count()
    }

    /// Writes the live counters to the gauge.
    pub(crate) fn publish_gauge(&mut self) {
        let g = &self.config.gauge;
        g.add_counts(std::mem::take(&mut self.counted));
        g.len.store(self.len(), Ordering::Relaxed);
        g.bytes.store(self.bytes, Ordering::Relaxed);
        g.ready.store(self.len(), Ordering::Relaxed);
        g.consumers.store(self.consumers.len() as u64, Ordering::Relaxed);
        self.config.extent.set(self.first, self.next, self.uncounted.is_none());
    }

    /// A freshly appended entry (journal completion order = offset order).
    pub(crate) fn appended(&mut self, offset: u64, ptr: Pointer, msg: &SharedMessage) {
        if offset < self.next {
            // Already counted when the stream was loaded (the append raced the load).
            return;
        }
        if self.first == self.next {
            self.first = offset;
        }
        self.next = offset + 1;
        self.counted.publish += 1;
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
    pub(crate) fn resolve(&self, start: StreamOffset, journal: &Journal) -> u64 {
        match start {
            StreamOffset::First => self.first,
            StreamOffset::Last => self.next.saturating_sub(1).max(self.first),
            StreamOffset::Next => self.next,
            StreamOffset::Offset(o) => o.clamp(self.first, self.next),
            StreamOffset::Timestamp(ms) => seek::offset_for_timestamp(journal, self.id, self.first, self.next, ms),
        }
    }

    /// Attaches a consumer reading from `start` with `credit`; call [`Stream::pump`] after.
    /// A member of `group` reads through the group's cursor: where the group stopped when
    /// it has a stored one, else from `start` (which then becomes the group's).
    pub(crate) fn attach(
        &mut self,
        id: ConsumerId,
        tx: mpsc::UnboundedSender<ConsumerEvent>,
        credit: u32,
        start: StreamOffset,
        group: Option<String>,
        journal: &Journal,
    ) {
        let next = self.resolve(start, journal);
        if let Some(name) = &group {
            if !self.groups.contains_key(name) {
                let g = match group::load_cursor(journal, self.id, name) {
                    Ok(Some(cursor)) => Group::resume(cursor, false),
                    Ok(None) => Group::resume(GroupCursor::at(next), true),
                    Err(e) => {
                        warn!(stream = %self.config.name, group = %name, error = %e, "cannot read group cursor");
                        Group::resume(GroupCursor::at(next), true)
                    }
                };
                self.groups.insert(name.clone(), g);
            }
        }
        debug!(stream = %self.config.name, consumer = id, offset = next, ?start, ?group, "stream consumer attached");
        self.detach(id);
        self.consumers.push(StreamConsumer::new(id, tx, credit, next, group));
    }

    /// Gives consumer `id` a tag filter (`x-tag-filter`): entries whose tag does not match
    /// are skipped for it — for a group member, skipped for the group.
    pub(crate) fn set_filter(&mut self, id: ConsumerId, filter: Option<TagFilter>) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == id) {
            c.filter = filter;
        }
    }

    /// Makes `group` read by one member at a time (a partition of a super stream, or a
    /// single-active group): nobody reads until [`Stream::activate`] names the member.
    pub(crate) fn make_exclusive(&mut self, group: &str) {
        if let Some(g) = self.groups.get_mut(group) {
            g.exclusive = true;
        }
    }

    /// Names the member of an exclusive `group` that reads it from now on (`None`:
    /// nobody); it starts once the previous one's entries are settled or returned.
    pub(crate) fn activate(&mut self, group: &str, consumer: Option<ConsumerId>) {
        if let Some(g) = self.groups.get_mut(group).filter(|g| g.exclusive) {
            g.active = consumer;
        }
    }

    /// Removes a consumer (cancel, channel closed): its cursor goes with it; what a group
    /// member held unacked goes to the rest of its group.
    pub(crate) fn detach(&mut self, id: ConsumerId) {
        let Some(i) = self.consumers.iter().position(|c| c.id == id) else { return };
        let c = self.consumers.swap_remove(i);
        let last = c.group.as_ref().is_some_and(|n| !self.consumers.iter().any(|x| x.group.as_ref() == Some(n)));
        if let Some(g) = c.group.as_ref().and_then(|n| self.groups.get_mut(n)) {
            g.returned_by(c.unacked);
            if last {
                // Its next members say afresh how they share the stream.
                g.exclusive = false;
                g.active = None;
            }
        }
        if self.consumers.is_empty() {
            self.tail.clear();
            self.tail_bytes = 0;
        }
    }

    /// A consumer settled a delivery (ack, nack or reject): it gets the credit back; a
    /// group member's settlement counts for its group.
    pub(crate) fn settle(&mut self, consumer: ConsumerId, offset: u64) {
        let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) else { return };
        if c.settle(offset) {
            self.counted.ack += 1;
            if let Some(g) = c.group.as_ref().and_then(|n| self.groups.get_mut(n)) {
                g.ack(offset);
            }
        }
        if c.is_done() {
            self.detach(consumer);
        }
    }

    /// A delivery came back unsettled (its channel closed): a group member's goes to the
    /// rest of its group.
    pub(crate) fn returned(&mut self, consumer: ConsumerId, offset: u64) {
        let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) else { return };
        if c.unacked.remove(&offset) {
            if let Some(g) = c.group.as_ref().and_then(|n| self.groups.get_mut(n)) {
                g.returned_by([offset]);
            }
        }
        if c.is_done() {
            self.detach(consumer);
        }
    }

    /// basic.cancel: the consumer gets nothing more, but what it holds unacked stays
    /// ackable (as for queues); a group member's unacked entries go back to the group only
    /// if they are returned (channel closed), not at the cancel.
    pub(crate) fn cancel(&mut self, id: ConsumerId) {
        match self.consumers.iter_mut().find(|c| c.id == id) {
            Some(c) if !c.unacked.is_empty() => {
                c.cancelled = true;
                c.credit = 0;
            }
            Some(_) => self.detach(id),
            None => {}
        }
    }

    /// Adds credit to a consumer.
    pub(crate) fn credit(&mut self, consumer: ConsumerId, n: u32) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer && !c.cancelled) {
            c.credit = c.credit.saturating_add(n);
        }
    }

    /// The committed cursor of a group, as the owner sees it now.
    #[cfg(test)]
    pub(crate) fn group_cursor(&self, group: &str) -> Option<&GroupCursor> {
        self.groups.get(group).map(|g| &g.cursor)
    }

    /// The stream's extent and its groups.
    pub(crate) fn status(&self) -> StreamStatus {
        let mut groups: Vec<GroupStatus> = self
            .groups
            .iter()
            .map(|(name, g)| GroupStatus {
                name: name.clone(),
                committed: g.cursor.committed,
                acked_above: g.cursor.acked.len(),
                in_flight: g.in_flight.len(),
                members: self.consumers.iter().filter(|c| c.group.as_deref() == Some(name.as_str())).count(),
                exclusive: g.exclusive,
            })
            .collect();
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        StreamStatus { first: self.first, next: self.next, consumers: self.consumers.len(), groups }
    }

    /// Moves a group's committed offset to where `to` resolves (an offset, a timestamp,
    /// first, last, next); its members continue from there. Returns the new offset.
    pub(crate) fn reset_group(&mut self, group: &str, to: StreamOffset, journal: &Journal) -> u64 {
        let offset = self.resolve(to, journal);
        match self.groups.get_mut(group) {
            Some(g) => g.reset(GroupCursor::at(offset)),
            None => {
                self.groups.insert(group.to_owned(), Group::resume(GroupCursor::at(offset), true));
            }
        }
        // Members forget what they hold: their late acks must not count for the new range.
        for c in self.consumers.iter_mut().filter(|c| c.group.as_deref() == Some(group)) {
            let held = std::mem::take(&mut c.unacked).len() as u32;
            if !c.cancelled {
                c.credit = c.credit.saturating_add(held);
            }
        }
        // Cancelled members waiting only for those can go.
        let done: Vec<ConsumerId> = self.consumers.iter().filter(|c| c.is_done()).map(|c| c.id).collect();
        for id in done {
            self.detach(id);
        }
        offset
    }

    /// Journal ops storing the cursors of groups that moved since the last call (one
    /// [`Command::SetGroupCursor`] each, in the shard's submission).
    pub(crate) fn take_cursor_writes(&mut self, ops: &mut Vec<Op>) {
        for (name, g) in self.groups.iter_mut().filter(|(_, g)| g.dirty) {
            g.dirty = false;
            let command = Command::SetGroupCursor { stream: self.id, group: name.clone(), cursor: g.cursor.clone() };
            command_ops(&command, ops);
        }
    }

    /// Sends every consumer what its cursor (or its group's) and credit allow.
    pub(crate) fn pump(&mut self, journal: &Journal) {
        let mut gone = Vec::new();
        for i in 0..self.consumers.len() {
            if self.consumers[i].group.is_none() && !self.pump_one(i, journal) {
                gone.push(self.consumers[i].id);
            }
        }
        // Only groups with a member that can take something (groups without members keep
        // their cursor and cost nothing here).
        // One name copied per such group, not per member.
        let has_credit = |name: &str| self.consumers.iter().any(|c| c.credit > 0 && c.group.as_deref() == Some(name));
        let names: Vec<String> = self.groups.keys().filter(|n| has_credit(n)).cloned().collect();
        for name in names {
            self.pump_group(&name, journal, &mut gone);
        }
        for id in gone {
            self.detach(id);
        }
    }

    fn delivery(
        &self,
        offset: u64,
        ptr: &Pointer,
        msg: SharedMessage,
        consumer: ConsumerId,
        redelivered: bool,
    ) -> QueueDelivery {
        QueueDelivery {
            queue: self.id,
            offset,
            msg,
            qos: (ptr.flags & flags::QOS_MASK).max(1),
            redelivered,
            released: false,
            consumer,
            delivery_count: None,
        }
    }

    /// Delivers to consumer `i` from its own cursor; false when its connection is gone.
    fn pump_one(&mut self, i: usize, journal: &Journal) -> bool {
        let (id, first, next) = (self.id, self.first, self.next);
        self.consumers[i].reader.skip_trimmed(first);
        while self.consumers[i].credit > 0 {
            let c = &mut self.consumers[i];
            let Some((offset, ptr, msg)) = c.reader.advance(&self.tail, journal, id, next) else { break };
            if !c.admits(&ptr) {
                continue;
            }
            let Some(msg) = msg.or_else(|| read_message(journal, &ptr)) else { continue };
            if !self.consumers[i].accepts(&msg) {
                continue;
            }
            let d = self.delivery(offset, &ptr, msg, self.consumers[i].id, false);
            let c = &mut self.consumers[i];
            if c.tx.send(ConsumerEvent::Deliver(d)).is_err() {
                return false;
            }
            c.credit -= 1;
            c.unacked.insert(offset);
            self.counted.deliver += 1;
        }
        true
    }

    /// The next member of `name` with credit, round robin from consumer index `rr`
    /// (only `only`, when one member at a time reads).
    fn next_member(&self, name: &str, rr: usize, only: Option<ConsumerId>, gone: &[ConsumerId]) -> Option<usize> {
        let n = self.consumers.len();
        (0..n).map(|k| (rr + k) % n).find(|&i| {
            let c = &self.consumers[i];
            c.credit > 0 && c.group.as_deref() == Some(name) && !gone.contains(&c.id) && only.is_none_or(|o| o == c.id)
        })
    }

    /// Hands a group's next entries to its members with credit, round robin, each entry
    /// to one member: entries a departed member returned first, then new ones. A group
    /// read one member at a time hands them to its active member only.
    fn pump_group(&mut self, name: &str, journal: &Journal, gone: &mut Vec<ConsumerId>) {
        let (id, first, next) = (self.id, self.first, self.next);
        let Some(g) = self.groups.get_mut(name) else { return };
        g.skip_trimmed(first);
        // Decided once: within this turn only the gate's member adds to what is in flight.
        let Some(only) = g.reader_gate() else { return };
        loop {
            let rr = self.groups.get(name).map_or(0, |g| g.rr);
            let Some(member) = self.next_member(name, rr, only, gone) else { return };
            let Some(g) = self.groups.get_mut(name) else { return };
            // The entry: a returned one (redelivered), else the next one never handed out.
            let (offset, ptr, msg, redelivered) = if let Some(o) = g.returned.pop_first() {
                match seek::entry_at_or_after(journal, id, o).filter(|(at, _)| *at == o) {
                    Some((o, ptr)) => (o, ptr, None, true),
                    None => continue,
                }
            } else {
                match g.reader.advance(&self.tail, journal, id, next) {
                    Some((o, ptr, msg)) => (o, ptr, msg, false),
                    None => return,
                }
            };
            if g.cursor.acked.contains(&offset) || offset < g.cursor.committed {
                continue;
            }
            if !self.consumers[member].admits(&ptr) {
                g.ack(offset);
                continue;
            }
            let Some(msg) = msg.or_else(|| read_message(journal, &ptr)) else {
                g.ack(offset);
                continue;
            };
            if !self.consumers[member].accepts(&msg) {
                g.ack(offset);
                continue;
            }
            let d = self.delivery(offset, &ptr, msg, self.consumers[member].id, redelivered);
            let c = &mut self.consumers[member];
            let Some(g) = self.groups.get_mut(name) else { return };
            if c.tx.send(ConsumerEvent::Deliver(d)).is_err() {
                g.returned.insert(offset);
                gone.push(c.id);
                continue;
            }
            g.rr = member + 1;
            c.credit -= 1;
            c.unacked.insert(offset);
            self.counted.deliver += 1;
            self.counted.redeliver += redelivered as u64;
            g.in_flight.insert(offset, c.id);
        }
    }

    /// Trims what retention no longer allows (at most one bounded pass); the removal op
    /// goes to `ops`.
    pub(crate) fn enforce_retention(&mut self, journal: &Journal, now_ms: u64, ops: &mut Vec<Op>) -> bool {
        if !self.config.has_retention() {
            return false;
        }
        let extent = Extent { first: self.first, next: self.next, bytes: self.bytes };
        let Some(trim) = retention::plan(journal, self.id, extent, &self.config, now_ms) else { return false };
        debug!(stream = %self.config.name, from = trim.from, to = trim.to, bytes = trim.bytes, "stream trimmed");
        ops.push(Op::RemoveRange { queue: self.id, from: trim.from, to: trim.to });
        self.first = trim.to;
        // Entries not counted yet leave without having been added.
        let uncounted = match self.uncounted.clone() {
            Some(r) if r.start < trim.to => {
                let gone = r.start..trim.to.min(r.end);
                self.uncounted = (trim.to < r.end).then_some(trim.to..r.end);
                retention::body_bytes(journal, self.id, gone)
            }
            _ => 0,
        };
        self.bytes = self.bytes.saturating_sub(trim.bytes.saturating_sub(uncounted));
        while self.tail.front().is_some_and(|e| e.offset < trim.to) {
            if let Some(e) = self.tail.pop_front() {
                self.tail_bytes -= e.ptr.body_len as u64;
            }
        }
        for c in &mut self.consumers {
            c.reader.skip_trimmed(trim.to);
        }
        for g in self.groups.values_mut() {
            g.skip_trimmed(trim.to);
        }
        true
    }

    /// Removes every entry (the stream is deleted); consumers are told they were
    /// cancelled. Returns how many entries it held.
    pub(crate) fn delete(&mut self, ops: &mut Vec<Op>) -> u64 {
        let count = self.len();
        for c in self.consumers.drain(..) {
            let _ = c.tx.send(ConsumerEvent::Cancelled { queue: self.id, consumer: c.id });
        }
        self.tail.clear();
        self.tail_bytes = 0;
        self.first = self.next;
        self.bytes = 0;
        self.uncounted = None;
        ops.push(Op::DeleteQueue { queue: self.id });
        command_ops(&Command::ForgetGroupCursors { stream: self.id }, ops);
        self.groups.clear();
        self.publish_gauge();
        count
    }
}

#[cfg(test)]
mod tests;
