//! Consumers and settlement: attaching and detaching consumers, credit, and what happens
//! to a delivered entry — ack, requeue (in place or after a retry delay), reject, release —
//! and purging or deleting the queue.

use super::*;

impl Queue {
    /// Attaches a consumer; call [`Queue::pump`] afterwards.
    pub(crate) fn attach(&mut self, consumer: Consumer) {
        self.consumers.retain(|c| c.id != consumer.id);
        self.consumers.push(consumer);
    }

    /// Detaches a consumer; its unacked entries become ready again (redelivered), in
    /// order, unless they reached the delivery limit (then they are dead-lettered).
    pub(crate) fn detach(&mut self, consumer: ConsumerId, fx: &mut Effects) {
        self.consumers.retain(|c| c.id != consumer);
        let returned: Vec<u64> = self.unacked.iter().filter(|(_, u)| u.consumer == consumer).map(|(o, _)| *o).collect();
        for offset in returned {
            self.requeue(offset, RequeueCause::Returned, fx);
        }
    }

    /// Removes a consumer without returning its unacked entries (AMQP basic.cancel: they
    /// can still be acked, and go back to the queue when their channel closes).
    pub(crate) fn cancel(&mut self, consumer: ConsumerId) {
        self.consumers.retain(|c| c.id != consumer);
    }

    /// Adds credit to a consumer.
    pub(crate) fn credit(&mut self, consumer: ConsumerId, n: u32) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) {
            c.credit = c.credit.saturating_add(n);
        }
    }

    pub(super) fn give_credit_back(&mut self, consumer: ConsumerId) {
        if let Some(c) = self.consumers.iter_mut().find(|c| c.id == consumer) {
            c.credit = c.credit.saturating_add(1);
        }
    }

    /// The consumer finished with an entry: it leaves the queue; the consumer regains a
    /// credit.
    pub(crate) fn ack(&mut self, offset: u64, ops: &mut Vec<Op>) {
        if let Some(u) = self.unacked.remove(&offset) {
            self.counted.ack += 1;
            self.forget(&u.entry, ops);
            self.give_credit_back(u.consumer);
        }
    }

    /// The consumer an unacked entry was delivered to.
    pub(crate) fn holder(&self, offset: u64) -> Option<ConsumerId> {
        self.unacked.get(&offset).map(|u| u.consumer)
    }

    /// Puts an unacked entry back in line at its own position (nack/reject with requeue,
    /// or its consumer went away), marked redelivered — or dead-letters it when it has
    /// been delivered more often than the delivery limit allows. Under a retry policy that
    /// covers `cause`, it waits for its backoff first (see [`Queue::retry_due`]).
    pub(crate) fn requeue(&mut self, offset: u64, cause: RequeueCause, fx: &mut Effects) {
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
    pub(super) fn wait_for_retry(&mut self, mut entry: Entry, due_ms: u64, ops: &mut Vec<Op>) {
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
    pub(crate) fn retry_due(&mut self, offset: u64, due_ms: u64) {
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
    pub(crate) fn reject(&mut self, offset: u64, fx: &mut Effects) {
        let Some(mut u) = self.unacked.remove(&offset) else { return };
        self.give_credit_back(u.consumer);
        let msg = u.entry.msg.take();
        self.forget_dead(&u.entry, msg, DeathReason::Rejected, fx);
    }

    /// QoS 2: the client sent PUBREC for an entry; remember it durably so that a resumed
    /// session resends PUBREL, not the message.
    pub(crate) fn release(&mut self, offset: u64, ops: &mut Vec<Op>) {
        if let Some(u) = self.unacked.get_mut(&offset) {
            u.entry.ptr.flags |= flags::RELEASED;
            ops.push(Op::SetFlags { queue: self.id, offset, flags: u.entry.ptr.flags });
        }
    }

    /// Removes every ready message (unacked ones stay); returns how many were removed.
    pub(crate) fn purge(&mut self, ops: &mut Vec<Op>) -> u64 {
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
    pub(crate) fn delete(&mut self, ops: &mut Vec<Op>) -> u64 {
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
}
