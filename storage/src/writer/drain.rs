//! The drain: once per checkpoint interval (or [`JournalConfig::checkpoint_bytes`] of
//! log), the changes group commits left in memory — consume-queue entries still live,
//! settled offsets, counters, keyspace changes — go to their files and sled, so that the
//! checkpoint can move on.
//!
//! [`JournalConfig::checkpoint_bytes`]: crate::JournalConfig::checkpoint_bytes

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::failure::{cq_write_failed, sled_failed, Fail};
use super::Writer;
use crate::checkpoint;
use crate::codec;
use crate::db::Db;

impl Writer {
    /// Once per checkpoint interval, or once the log grew by `checkpoint_bytes`: stores the
    /// consume queues' settled offsets and the counters in sled, so that the checkpoint can
    /// move on. Either trigger restarts both counts.
    pub(super) fn maybe_drain(&mut self) {
        if self.poisoned.is_some() || self.store_full.is_some() {
            return;
        }
        // What earlier drains and deletions made useless, once a checkpoint covers them.
        self.shared.cq.delete_doomed(self.shared.checkpointed.load(Ordering::Acquire));
        let limit = self.shared.config.checkpoint_bytes;
        let by_bytes = limit > 0 && self.log.next_pos().saturating_sub(self.drained_at) >= limit;
        if !by_bytes && self.last_drain.elapsed() < self.shared.config.checkpoint_interval {
            return;
        }
        self.last_drain = Instant::now();
        self.drained_at = self.log.next_pos();
        if !self.has_undrained() {
            return;
        }
        let drained = self.shared.db().map_err(|e| Fail::Fatal(e.to_string())).and_then(|db| self.drain(&db));
        match drained {
            Err(f) => self.fail(f),
            // The checkpointer's interval has not passed: let it record this drain now.
            Ok(()) if by_bytes => {
                if let Some(c) = &self.checkpointer {
                    c.wake();
                }
            }
            Ok(()) => {}
        }
    }

    /// Whether consume-queue entries or offsets, or counter changes, wait for a drain.
    pub(super) fn has_undrained(&self) -> bool {
        self.shared.cq.has_dirty()
            || self.shared.cq.has_pending()
            || !self.counters.is_empty()
            || self.shared.kv_deferred.read().iter().any(|o| !o.is_empty())
    }

    /// Moves the changes waiting in memory to sled (between batches: then sled holds
    /// everything written, and the checkpoint may say so).
    pub(super) fn drain(&mut self, db: &Db) -> Result<(), Fail> {
        let end = self.log.next_pos();
        if self.has_undrained() {
            self.shared.drains.fetch_add(1, Ordering::Relaxed);
            // The entries still live go to their files (unsynced: the checkpointer syncs
            // them before it claims this drain's position).
            self.shared.cq.flush_pending().map_err(cq_write_failed)?;
            db.db.insert(checkpoint::APPLIED, &codec::encode_u64(end)).map_err(|e| sled_failed("sled drain", e))?;
            self.shared.cq.drain(&db.settled, end).map_err(|e| sled_failed("sled drain", e))?;
            self.counters.apply(&db.counters).map_err(|e| sled_failed("sled drain", e))?;
            // Under the write lock: a reader sees each change in one place or the other.
            let mut kv = self.shared.kv_deferred.write();
            for (i, overlay) in kv.iter_mut().enumerate() {
                overlay.apply(&db.kv[i]).map_err(|e| sled_failed("sled drain", e))?;
            }
        }
        self.shared.applied.store(end, Ordering::Release);
        Ok(())
    }
}
