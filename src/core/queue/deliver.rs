//! Delivery: `basic.get`, TTL expiry of the head, picking the consumer (priorities, single
//! active consumer, credit) and the ready entry, and paging entries in from storage as the
//! in-memory window drains.

use super::*;

impl Queue {
    /// Takes the next ready message for `consumer` (AMQP basic.get): with `no_ack` it
    /// leaves the queue at once, else it waits for an ack like a delivery.
    pub(crate) fn get(
        &mut self,
        consumer: ConsumerId,
        no_ack: bool,
        journal: &Journal,
        fx: &mut Effects,
    ) -> Option<Got> {
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
    pub(crate) fn expire(&mut self, journal: &Journal, fx: &mut Effects) {
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

    pub(super) fn is_expired(&self, msg: &Message, now: u64, fresh: bool) -> bool {
        if fresh && self.has_zero_ttl(msg) {
            return false;
        }
        msg.is_expired(now) || self.config.message_ttl.is_some_and(|ttl| msg.timestamp_ms.saturating_add(ttl) <= now)
    }

    /// Pops the next deliverable entry with its message, dropping expired and unreadable
    /// ones on the way.
    pub(super) fn next_ready(&mut self, journal: &Journal, fx: &mut Effects) -> Option<(Entry, SharedMessage)> {
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
    pub(super) fn pick_consumer(&mut self) -> Option<usize> {
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
    pub(crate) fn pump(&mut self, journal: &Journal, fx: &mut Effects) {
        self.deliver_ready(journal, fx);
        self.store_watermark(&mut fx.ops);
    }

    pub(super) fn deliver_ready(&mut self, journal: &Journal, fx: &mut Effects) {
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
    pub(crate) fn store_watermark(&mut self, ops: &mut Vec<Op>) {
        if self.delivered_upto > self.stored_delivered_upto {
            self.stored_delivered_upto = self.delivered_upto;
            let value = Bytes::copy_from_slice(&self.delivered_upto.to_be_bytes());
            ops.push(Op::Put { space: Space::Retry, key: retry::watermark_key(self.id), value });
        }
    }

    pub(super) fn pick_consumer_peek(&self) -> Option<()> {
        if self.config.single_active_consumer {
            return self.consumers.first().filter(|c| c.credit > 0).map(|_| ());
        }
        self.consumers.iter().any(|c| c.credit > 0).then_some(())
    }

    /// The priority of an entry in this queue (0 unless it is a priority queue).
    pub(super) fn priority_of(&self, ptr: &Pointer) -> u8 {
        match self.config.max_priority {
            Some(max) => ((ptr.flags & flags::PRIORITY_MASK) >> flags::PRIORITY_SHIFT).min(max),
            None => 0,
        }
    }

    /// Loads the next page of entries from storage (every page, for a priority queue);
    /// false when there is none.
    pub(super) fn page_in(&mut self, journal: &Journal) -> bool {
        if self.config.max_priority.is_some() {
            let mut any = false;
            while self.page_in_one(journal) {
                any = true;
            }
            return any;
        }
        self.page_in_one(journal)
    }

    pub(super) fn page_in_one(&mut self, journal: &Journal) -> bool {
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
