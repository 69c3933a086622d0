//! New entries of a queue: what the journal appended, admitted against the queue's length
//! and byte limits per its overflow behaviour, kept in memory or left in storage, and the
//! entries a limit or a TTL of zero drops (dead-lettered where the queue says).

use super::*;

impl Queue {
    /// A freshly appended entry (from the journal's completion, in offset order). The
    /// message is kept in memory when someone consumes and the window allows. Applies the
    /// length/byte limits per the overflow behaviour.
    pub(crate) fn appended(
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
    pub(super) fn refuse_appended(&mut self, offset: u64, already_loaded: bool, ops: &mut Vec<Op>) {
        ops.push(Op::Remove { queue: self.id, offset, at: None });
        if already_loaded {
            self.ready.remove_first(|e| e.offset == offset);
        } else {
            self.skip_in_storage(offset);
        }
    }

    /// True when the message may only be delivered at once: the queue's TTL or its own
    /// expiration is 0.
    pub(super) fn has_zero_ttl(&self, msg: &Message) -> bool {
        self.config.message_ttl == Some(0) || msg.props.expires_at_ms.is_some_and(|at| at <= msg.timestamp_ms)
    }

    /// Keeps a new entry in memory when someone consumes from the queue (an offline
    /// backlog stays on disk until a consumer is back). A priority queue keeps every
    /// entry in its ready list: the next one to go may be the newest.
    pub(super) fn keep_in_memory(&mut self, offset: u64, ptr: Pointer, msg: &SharedMessage, fresh: bool) {
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

    pub(super) fn count_in(&mut self, ptr: &Pointer) {
        self.len += 1;
        self.bytes += ptr.body_len as u64;
        self.qos0 += (ptr.flags & flags::QOS_MASK == 0) as u64;
    }

    /// Marks a storage-only entry as removed so that page-in does not deliver it.
    pub(super) fn skip_in_storage(&mut self, offset: u64) {
        if offset == self.loaded_upto {
            self.loaded_upto += 1;
        } else if offset > self.loaded_upto {
            self.dropped_ahead.insert(offset);
        }
    }

    /// Drops the oldest QoS 0 entry that was not delivered yet: from memory first, then
    /// from storage (resuming where the last scan stopped). False when there is none.
    pub(super) fn evict_qos0(&mut self, journal: &Journal, ops: &mut Vec<Op>) -> bool {
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
    pub(super) fn drop_head(&mut self, journal: &Journal, fx: &mut Effects) -> bool {
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
    pub(super) fn is_full(&self, incoming: u64) -> bool {
        (self.config.max_len > 0 && self.ready_len() >= self.config.max_len)
            || (self.config.max_bytes > 0 && self.bytes + incoming > self.config.max_bytes)
    }

    pub(super) fn forget(&mut self, e: &Entry, ops: &mut Vec<Op>) {
        self.dedup.remove(e.offset);
        self.len = self.len.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(e.ptr.body_len as u64);
        if e.ptr.flags & flags::QOS_MASK == 0 {
            self.qos0 = self.qos0.saturating_sub(1);
        }
        // The entry's pointer says where its record is: the writer need not read it back.
        ops.push(Op::Remove { queue: self.id, offset: e.offset, at: Some(e.ptr.pos) });
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
    pub(super) fn dead_letter(
        &self,
        msg: Option<SharedMessage>,
        reason: DeathReason,
        removal: Vec<Op>,
        fx: &mut Effects,
    ) {
        match msg.filter(|_| self.has_dead_letter_target(reason)) {
            Some(msg) => fx.dead.push(DeadLetter { msg, reason, config: self.config.clone(), removal }),
            None => fx.ops.extend(removal),
        }
    }

    /// True when a message dying for `reason` goes somewhere (DeliveryLimit only happens
    /// when a limit is set, and then `%DLQ%` takes it without a dead-letter exchange).
    pub(super) fn has_dead_letter_target(&self, reason: DeathReason) -> bool {
        self.config.dead_letter.is_some() || reason == DeathReason::DeliveryLimit
    }

    /// Forgets `e` and dead-letters `msg` with the removal (see [`Queue::dead_letter`]);
    /// without a target the removal goes straight to the turn's ops (no allocation).
    pub(super) fn forget_dead(&mut self, e: &Entry, msg: Option<SharedMessage>, reason: DeathReason, fx: &mut Effects) {
        match msg.filter(|_| self.has_dead_letter_target(reason)) {
            Some(msg) => {
                let mut removal = Vec::with_capacity(2);
                self.forget(e, &mut removal);
                fx.dead.push(DeadLetter { msg, reason, config: self.config.clone(), removal });
            }
            None => self.forget(e, &mut fx.ops),
        }
    }
}
