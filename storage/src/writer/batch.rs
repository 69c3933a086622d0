//! Batching: one drained batch applied submission by submission, committed as a group
//! (the records, one effects record, the sled batches, one fsync as the policy says) and
//! answered in submission order.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::oneshot;

use super::failure::{cq_write_failed, log_write_failed, sled_failed, Fail};
use super::{Msg, Writer};
use crate::checkpoint;
use crate::codec;
use crate::db::Db;
use crate::effects;
use crate::state::QueueState;
use crate::{Completion, FsyncPolicy, JournalError, Receipt};

/// What to answer once the batch is committed.
enum Outcome {
    Submit(Option<Completion>, Result<Receipt, JournalError>),
    Flush(oneshot::Sender<Result<(), JournalError>>),
    Verify(oneshot::Sender<Result<(), String>>),
    Roll(oneshot::Sender<Result<bool, JournalError>>),
}

impl Writer {
    /// Applies, commits and answers one batch.
    pub(super) fn process(&mut self, batch: Vec<Msg>) {
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut force_sync = false;
        let mut roll = false;
        let mut submissions = false;
        let mut submitted = 0u64;
        let mut durable_wanted = false;
        let mark = self.log.mark();
        self.refs.open_batch();
        // The handle once per batch (it is missing only while sled is out of space, when
        // nothing is applied).
        let db = self.shared.db();
        // Set when the commit log ran out of space: the batch is taken back and refused.
        let mut no_space = None;
        for msg in batch {
            match msg {
                Msg::Submit { ops, done, durable } => {
                    submissions = true;
                    submitted += 1;
                    durable_wanted |= durable;
                    let result = if self.poisoned.is_some() || self.store_full.is_some() || no_space.is_some() {
                        Err(JournalError::Closed) // replaced below
                    } else {
                        let applied = match &db {
                            Ok(db) => self.apply_submission(db, ops),
                            Err(e) => Err(Fail::Fatal(e.to_string())),
                        };
                        match applied {
                            Ok(receipt) => Ok(receipt),
                            Err(Fail::Reject(e)) => Err(e),
                            Err(Fail::NoSpace(reason)) => {
                                no_space = Some(reason);
                                Err(JournalError::Closed)
                            }
                            Err(f) => {
                                self.fail(f);
                                Err(JournalError::Closed)
                            }
                        }
                    };
                    outcomes.push(Outcome::Submit(done, result));
                }
                Msg::Flush(tx) => {
                    force_sync = true;
                    outcomes.push(Outcome::Flush(tx));
                }
                Msg::Close => force_sync = true,
                Msg::Verify(tx) => outcomes.push(Outcome::Verify(tx)),
                Msg::Roll(tx) => {
                    roll = true;
                    outcomes.push(Outcome::Roll(tx));
                }
                // Never in a batch (see `run`).
                Msg::Abandon => {}
                Msg::Resolve { name, reply } => {
                    let resolved = match &db {
                        Ok(db) => self.resolve_name(db, name),
                        Err(e) => Err(e.clone()),
                    };
                    reply(resolved);
                }
            }
        }
        if submitted > 0 {
            self.shared.batch_submissions.observe(submitted);
        }
        if self.poisoned.is_none() && self.store_full.is_none() && no_space.is_none() {
            let committed = match &db {
                Ok(db) => self.commit(db, force_sync, submissions, durable_wanted),
                Err(e) => Err(Fail::Fatal(e.to_string())),
            };
            match committed {
                Ok(()) => {}
                Err(Fail::NoSpace(reason)) => no_space = Some(reason),
                Err(Fail::StoreFull(reason)) => {
                    // Not acknowledged, so not in the log either (the effects record
                    // would apply it at the next open).
                    if let Err(e) = self.log.rollback(&self.shared.log, mark) {
                        self.poison(format!("{reason}; then taking the batch back failed: {e}"));
                    }
                    self.refs.undo_batch();
                    self.fail(Fail::StoreFull(reason));
                }
                Err(f) => self.fail(f),
            }
        }
        if let Some(reason) = &no_space {
            if self.poisoned.is_none() && self.store_full.is_none() {
                self.take_back(mark, reason);
            }
        }
        self.refs.commit_batch();
        let failed = match (&self.poisoned, &self.store_full, no_space) {
            (Some(p), _, _) => Some(JournalError::Poisoned(p.clone())),
            (None, Some(reason), _) => Some(JournalError::Full(reason.clone())),
            (None, None, Some(reason)) => Some(JournalError::Full(reason)),
            (None, None, None) => None,
        };
        // After the batch's records: they stay in the segment closed.
        let rolled = if roll && failed.is_none() { self.roll_on_request() } else { Ok(false) };
        for outcome in outcomes {
            match outcome {
                Outcome::Submit(done, result) => {
                    if let Some(done) = done {
                        complete(done, failed.clone().map_or(result, Err));
                    }
                }
                Outcome::Flush(tx) => {
                    let _ = tx.send(failed.clone().map_or(Ok(()), Err));
                }
                Outcome::Verify(tx) => {
                    let _ = tx.send(self.verify());
                }
                Outcome::Roll(tx) => {
                    let _ = tx.send(failed.clone().map_or(rolled.clone(), Err));
                }
            }
        }
    }

    /// Appends the effects record after the batch's records, writes them out, applies the
    /// sled batches (unflushed: the effects record is what makes them durable), publishes
    /// the counters and syncs the log if the policy (or `force_sync`) says so. sled may
    /// thus hold changes whose records are not fsynced yet; if a power loss takes those
    /// records, recovery sees sled's applied mark past the end of the log and scans.
    fn commit(&mut self, db: &Db, force_sync: bool, submissions: bool, durable_wanted: bool) -> Result<(), Fail> {
        self.stage_counters();
        let queue = self.pending.queue.take();
        let has_effects = effects::encode(&mut self.effects, &queue, self.pending.overlays().map(|o| &*o));
        if has_effects {
            self.log.append_effects(&self.shared.log, &self.effects).map_err(log_write_failed)?;
        }
        let applied = self.log.next_pos();
        let sync = self.sync_due(force_sync, durable_wanted);
        if sync && self.shared.config.page_aligned_syncs {
            self.log.pad_to_page(&self.shared.log);
        }
        self.log.write_out(&self.shared.log).map_err(log_write_failed)?;
        self.out_of_space = false;
        #[cfg(test)]
        if self.log.store_fault() {
            return Err(Fail::StoreFull("sled batch: injected: No space left on device".into()));
        }
        if has_effects {
            // Consume-queue entries are staged first (kept in memory until the next drain
            // writes those still live), not visible yet; then the trees read by range on
            // their own go to sled (unflushed). Running out of space leaves nothing of the
            // batch visible.
            let staged = self.shared.cq.stage(queue.into_changes(), true).map_err(cq_write_failed)?;
            let counters = self.pending.counters.take();
            let kv: Vec<_> = self.pending.kv.iter_mut().map(|o| o.take()).collect();
            let rest: Vec<_> =
                self.pending.overlays().into_iter().zip(db.trees()).filter(|(o, _)| !o.is_empty()).collect();
            if !rest.is_empty() {
                // First: sled holding any change of this batch implies it holds this mark.
                db.db
                    .insert(checkpoint::APPLIED, &codec::encode_u64(applied))
                    .map_err(|e| sled_failed("sled batch", e))?;
                for (overlay, tree) in rest {
                    overlay.apply(tree).map_err(|e| sled_failed("sled batch", e))?;
                }
            }
            // Now visible: the entries; settlements, counters and keyspace changes wait in
            // memory for the next drain.
            for q in self.shared.cq.publish(staged) {
                self.read_cache.remove(&q);
            }
            for q in std::mem::take(&mut self.pending.deleted) {
                self.shared.cq.delete_queue(q, applied);
                self.read_cache.remove(&q);
            }
            for (k, v) in counters {
                match v {
                    Some(v) => self.counters.insert(k, v),
                    None => self.counters.remove(k),
                }
            }
            if kv.iter().any(|o| !o.is_empty()) {
                let mut deferred = self.shared.kv_deferred.write();
                for (d, changes) in deferred.iter_mut().zip(kv) {
                    d.merge(changes);
                }
            }
            self.shared.effects_end.store(applied, Ordering::Release);
            if !self.has_undrained() {
                self.shared.applied.store(applied, Ordering::Release);
            }
        }
        if !self.pending.queues.is_empty() {
            let mut queues = self.shared.queues.lock();
            for (q, st) in self.pending.queues.drain() {
                if st == QueueState::default() {
                    queues.remove(&q);
                } else {
                    queues.insert(q, st);
                }
            }
        }
        if submissions {
            self.shared.batches.fetch_add(1, Ordering::Relaxed);
        }
        if sync {
            self.sync()?;
        }
        if force_sync {
            // A flush or close also makes sled durable: it covers the queue-name mappings
            // written outside the writer.
            db.db.flush().map_err(|e| sled_failed("sled flush", e))?;
        }
        Ok(())
    }

    /// Whether the batch being committed ends with a sync of the log: always for a flush
    /// or close (`force_sync`), else as the policy says for what is written or assembled.
    fn sync_due(&self, force_sync: bool, durable_wanted: bool) -> bool {
        let dirty = self.is_dirty() || self.log.has_assembled();
        force_sync
            || match self.shared.config.fsync {
                // A batch of relaxed submissions only leaves its data for the next durable
                // batch (or the OS) to sync.
                FsyncPolicy::Always => durable_wanted && dirty,
                FsyncPolicy::Interval(d) => dirty && self.last_sync.elapsed() >= d,
                FsyncPolicy::Never => false,
            }
    }

    /// Stages the counters of the queues and segments this batch touched (`counters` tree).
    fn stage_counters(&mut self) {
        let pending = &mut self.pending;
        for (q, st) in &pending.queues {
            let key = codec::queue_counters_key(*q);
            if *st == QueueState::default() {
                pending.counters.remove(&key[..]);
            } else {
                pending.counters.insert(&key[..], &codec::encode_queue_counters(st.next, st.len)[..]);
            }
        }
        for base in self.refs.touched() {
            let key = codec::segment_refs_key(base);
            match self.refs.get(base) {
                0 => pending.counters.remove(&key[..]),
                n => pending.counters.insert(&key[..], &codec::encode_u64(n)[..]),
            }
        }
    }

    /// fsyncs the written segments (sled is flushed by checkpoints).
    pub(super) fn sync(&mut self) -> Result<(), Fail> {
        self.log.write_out(&self.shared.log).map_err(log_write_failed)?;
        // Any failed fsync poisons: the kernel may have dropped the pages it could not write.
        let started = Instant::now();
        let n = self.log.sync().map_err(|e| Fail::Fatal(format!("commit log fsync: {e}")))?;
        if n > 0 {
            self.shared.fsync_micros.observe(started.elapsed().as_micros() as u64);
        }
        self.shared.fsyncs.fetch_add(n, Ordering::Relaxed);
        self.last_sync = Instant::now();
        Ok(())
    }
}

/// Runs a completion, containing a panic so that the writer thread survives it.
pub(super) fn complete(done: Completion, result: Result<Receipt, JournalError>) {
    if catch_unwind(AssertUnwindSafe(move || done(result))).is_err() {
        tracing::error!("a journal completion panicked");
    }
}
