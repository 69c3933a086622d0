//! Applying ops: what each [`Op`] of a submission changes in the batch's pending state
//! (records appended, pointers, retained entries, timers, keyspaces), all or nothing per
//! submission, with the reference counts and queue counters kept in step.

use super::failure::{log_write_failed, sled_fatal, Fail};
use super::Writer;
use crate::codec::{self, space_index};
use crate::db::Db;
use crate::segment;
use crate::state::{QueueState, Shared};
use crate::{Appended, JournalError, LogPos, Op, Pointer, QueueTarget, Receipt};

impl Writer {
    /// Applies one submission to the pending state, all or nothing unless it fails fatally.
    pub(super) fn apply_submission(&mut self, db: &Db, ops: Vec<Op>) -> Result<Receipt, Fail> {
        // Positions are contiguous, so the records this submission appends before an
        // `Enqueue` end at `next_pos + appended`.
        let mut appended = 0u64;
        for op in &ops {
            match op {
                Op::Append(a) => match segment::record_size(a.record.header.len(), a.record.body.len()) {
                    Some(size) => appended += size as u64,
                    None => {
                        return Err(Fail::Reject(JournalError::Io("record too large for the commit log".into())));
                    }
                },
                Op::Enqueue { pos, size, .. } if !self.is_live(pos.0, *size, appended) => {
                    return Err(Fail::Reject(JournalError::NotFound(pos.0)));
                }
                _ => {}
            }
        }
        if appended > 0 {
            self.check_free_space(appended)?;
        }
        let shared = self.shared.clone();
        let mut receipt = Receipt::default();
        for op in ops {
            self.apply_op(&shared, db, op, &mut receipt)?;
        }
        Ok(receipt)
    }

    /// Whether `pos..pos + size` lies inside records that exist (written, assembled, or
    /// `ahead` bytes about to be appended).
    fn is_live(&self, pos: u64, size: u32, ahead: u64) -> bool {
        if (size as u64) < segment::RECORD_OVERHEAD {
            return false;
        }
        let Some(end) = pos.checked_add(size as u64) else { return false };
        if pos >= self.log.active_base() {
            end <= self.log.next_pos() + ahead
        } else {
            self.shared.log.contains(pos, size)
        }
    }

    /// Base of the segment holding the record at `pos` (written or assembled).
    pub(super) fn segment_base(&self, pos: u64) -> Option<u64> {
        let active = self.log.active_base();
        if pos >= active {
            Some(active)
        } else {
            self.shared.log.locate(pos)
        }
    }

    /// Drops one reference to the record at `pos`.
    fn release(&mut self, pos: u64) {
        if let Some(base) = self.segment_base(pos) {
            self.refs.dec(base);
        }
    }

    fn queue_state(&mut self, queue: u64) -> &mut QueueState {
        let shared = &self.shared;
        self.pending
            .queues
            .entry(queue)
            .or_insert_with(|| shared.queues.lock().get(&queue).copied().unwrap_or_default())
    }

    /// Removes every live entry of `queue` in `from..to` (as [`Writer::queue_entry`] sees
    /// them) and returns the removed ones: the consume queue's, with this batch's changes
    /// laid over them.
    fn queue_remove_range(&mut self, queue: u64, from: u64, to: u64) -> Result<Vec<Pointer>, Fail> {
        if from >= to {
            return Ok(Vec::new());
        }
        let mut current = std::collections::BTreeMap::new();
        let mut at = from;
        loop {
            let page =
                self.shared.cq.entries(queue, at, 4096).map_err(|e| Fail::Fatal(format!("consume queue read: {e}")))?;
            let Some(&(last, _)) = page.last() else { break };
            for (off, p) in page {
                if off < to {
                    current.insert(off, Some(p));
                }
            }
            if last.saturating_add(1) >= to {
                break;
            }
            at = last + 1;
        }
        current.extend(self.pending.queue.changes_in(queue, from, to).iter().copied());
        let mut removed = Vec::new();
        for (off, p) in current {
            if let Some(p) = p {
                self.pending.queue.remove(queue, off);
                removed.push(p);
            }
        }
        Ok(removed)
    }

    /// Adds one pointer per target; returns the offsets.
    fn push_pointers(
        &mut self,
        db: &Db,
        targets: &[QueueTarget],
        pos: u64,
        size: u32,
        body_len: u32,
    ) -> Vec<(crate::QueueId, u64)> {
        let base = self.segment_base(pos);
        let mut offsets = Vec::with_capacity(targets.len());
        for t in targets {
            let q = t.queue.0;
            if !self.queue_is_live(db, q) {
                // Deleted (ids are never handed out again): a publish that raced the
                // deletion. No pointer, no offset.
                continue;
            }
            let st = self.queue_state(q);
            let offset = st.next;
            st.next = offset.saturating_add(1);
            st.len += 1;
            let p = Pointer { pos: LogPos(pos), size, body_len, tag_hash: t.tag_hash, flags: t.flags };
            self.pending.queue.insert(q, offset, p);
            if let Some(base) = base {
                self.refs.inc(base);
            }
            offsets.push((t.queue, offset));
        }
        offsets
    }

    fn apply_op(&mut self, shared: &Shared, db: &Db, op: Op, receipt: &mut Receipt) -> Result<(), Fail> {
        match op {
            Op::Append(a) => {
                let (pos, size) =
                    self.log.append(&shared.log, &a.record.header, &a.record.body).map_err(log_write_failed)?;
                let base = self.log.active_base();
                let offsets =
                    self.push_pointers(db, &a.queues, pos, size, a.record.body.len().min(u32::MAX as usize) as u32);
                if let Some(topic) = a.retained_topic {
                    if let Some(old) = self.pending.retained.get(&db.retained, topic.as_bytes()).map_err(sled_fatal)? {
                        if let Some((old_pos, _)) = codec::decode_retained(&old) {
                            self.release(old_pos);
                        }
                    }
                    self.pending.retained.insert(topic.as_bytes(), &codec::encode_retained(pos, size)[..]);
                    self.refs.inc(base);
                }
                if let Some(timer) = a.timer {
                    let key = codec::timer_key(timer.due_ms, pos);
                    self.pending.timer.insert(&key[..], codec::encode_timer_value(size, &timer.target));
                    self.refs.inc(base);
                }
                if let Some(k) = a.keys {
                    // Not a reference: the key index never keeps a segment alive.
                    for key in k.keys {
                        let hash = codec::key_hash(&key);
                        let entry = codec::key_index_key(hash, k.timestamp_ms, pos);
                        self.pending.key.insert(&entry[..], codec::encode_key_value(size, &key));
                        self.pending.key_pos.insert(&codec::key_pos_key(pos, hash, k.timestamp_ms)[..], &[][..]);
                    }
                }
                receipt.appended.push(Appended { pos: LogPos(pos), size, offsets });
            }
            Op::Enqueue { pos, size, body_len, queues } => {
                let offsets = self.push_pointers(db, &queues, pos.0, size, body_len);
                receipt.appended.push(Appended { pos, size, offsets });
            }
            Op::Remove { queue, offset, at } => {
                let present = match at {
                    Some(pos) => self.entry_present(queue.0, offset).then_some(pos),
                    None => self.queue_entry(queue.0, offset)?.map(|p| p.pos),
                };
                if let Some(pos) = present {
                    self.release(pos.0);
                    self.pending.queue.remove(queue.0, offset);
                    let st = self.queue_state(queue.0);
                    st.len = st.len.saturating_sub(1);
                }
            }
            Op::RemoveRange { queue, from, to } => {
                if from < to {
                    let removed = self.queue_remove_range(queue.0, from, to)?;
                    let n = removed.len() as u64;
                    for p in removed {
                        self.release(p.pos.0);
                    }
                    let st = self.queue_state(queue.0);
                    st.len = st.len.saturating_sub(n);
                }
            }
            Op::SetFlags { queue, offset, flags } => {
                if let Some(mut p) = self.queue_entry(queue.0, offset)? {
                    p.flags = flags;
                    self.pending.queue.insert(queue.0, offset, p);
                }
            }
            Op::DeleteQueue { queue } => {
                let q = queue.0;
                for p in self.queue_remove_range(q, 0, u64::MAX)? {
                    self.release(p.pos.0);
                }
                self.pending.deleted.push(q);
                let id = codec::encode_u64(q);
                if let Some(name) = self.pending.queue_ids.get(&db.queue_ids, &id).map_err(sled_fatal)? {
                    let mapped = self.pending.queue_names.get(&db.queue_names, &name).map_err(sled_fatal)?;
                    if mapped.as_deref() == Some(&id[..]) {
                        if let Ok(name) = std::str::from_utf8(&name) {
                            // Resolving the name again gets a new id from now on.
                            self.shared.names.write().remove(name);
                        }
                        self.pending.queue_names.remove(name);
                    }
                    self.pending.queue_ids.remove(&id[..]);
                }
                *self.queue_state(q) = QueueState::default();
                self.live.remove(&q);
            }
            Op::DeleteRetained { topic } => {
                if let Some(v) = self.pending.retained.get(&db.retained, topic.as_bytes()).map_err(sled_fatal)? {
                    if let Some((pos, _)) = codec::decode_retained(&v) {
                        self.release(pos);
                    }
                    self.pending.retained.remove(topic.as_bytes());
                }
            }
            Op::AddTimer { due_ms, pos, size, target } => self.add_timer(db, due_ms, pos.0, size, &target)?,
            Op::DeleteTimer { due_ms, pos } => {
                let key = codec::timer_key(due_ms, pos.0);
                if self.pending.timer.get(&db.timer, &key).map_err(sled_fatal)?.is_some() {
                    self.release(pos.0);
                    self.pending.timer.remove(&key[..]);
                }
            }
            Op::Put { space, key, value } => {
                self.pending.kv[space_index(space)].insert(&key[..], &value[..]);
            }
            Op::Delete { space, key } => {
                // Removing what is not there changes nothing: no sled write, nothing logged
                // (acknowledgements delete retry state that mostly never existed).
                if self.kv_get(db, space, &key).map_err(sled_fatal)?.is_some() {
                    self.pending.kv[space_index(space)].remove(&key[..]);
                }
            }
            Op::DeletePrefix { space, prefix } => {
                self.kv_remove_prefix(db, space, &prefix).map_err(sled_fatal)?;
            }
        }
        Ok(())
    }

    /// Removes every live key of a keyspace starting with `prefix` (as [`Writer::kv_get`]
    /// sees them).
    fn kv_remove_prefix(&mut self, db: &Db, space: crate::Space, prefix: &[u8]) -> sled::Result<()> {
        let i = space_index(space);
        let mut live = std::collections::BTreeMap::new();
        for kv in db.kv(space).scan_prefix(prefix) {
            live.insert(kv?.0, true);
        }
        for (k, v) in self.shared.kv_deferred.read()[i].changes_with_prefix(prefix) {
            live.insert(k, v.is_some());
        }
        for (k, v) in self.pending.kv[i].changes_with_prefix(prefix) {
            live.insert(k, v.is_some());
        }
        for (k, is_live) in live {
            if is_live {
                self.pending.kv[i].remove(k);
            }
        }
        Ok(())
    }

    /// Schedules an existing record ([`Op::AddTimer`]): a no-op when the record is not live
    /// or the same timer exists; a key taken by another timer moves this one 1 ms later.
    fn add_timer(&mut self, db: &Db, mut due_ms: u64, pos: u64, size: u32, target: &[u8]) -> Result<(), Fail> {
        if !self.is_live(pos, size, 0) {
            return Ok(());
        }
        let value = codec::encode_timer_value(size, target);
        // Bounded: collisions need the same record scheduled this many times in a row.
        for _ in 0..1024 {
            let key = codec::timer_key(due_ms, pos);
            match self.pending.timer.get(&db.timer, &key).map_err(sled_fatal)? {
                Some(existing) if existing[..] == value[..] => return Ok(()),
                Some(_) => due_ms = due_ms.saturating_add(1),
                None => {
                    self.pending.timer.insert(&key[..], value);
                    if let Some(base) = self.segment_base(pos) {
                        self.refs.inc(base);
                    }
                    return Ok(());
                }
            }
        }
        tracing::warn!(pos, due_ms, "too many timers for one record at one time; timer not added");
        Ok(())
    }
}
