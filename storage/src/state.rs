//! State shared by the journal handles, the readers and the writer thread: the log's read
//! side, the sled trees, the published per-queue counters and the statistics.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::db::Db;
use crate::log::Log;
use crate::{JournalConfig, JournalError};

/// Per-queue counters, kept in memory.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueState {
    /// Next offset to assign (the high-water mark: never goes back, except to 0 on
    /// [`Op::DeleteQueue`](crate::Op::DeleteQueue)).
    pub(crate) next: u64,
    /// Entries currently in the queue (appended, not yet removed).
    pub(crate) len: u64,
}

/// Everything the handles and the writer thread share.
pub(crate) struct Shared {
    /// The configuration the journal was opened with.
    pub(crate) config: JournalConfig,
    /// Read side of the commit log.
    pub(crate) log: Log,
    /// The sled database and its trees (queue entries, indexes, timers, keyspaces); `None`
    /// only while the writer could not open it again after it ran out of space (see
    /// [`Shared::db`]).
    pub(crate) db: RwLock<Option<Arc<Db>>>,
    /// Counters of every queue that has (or had) entries, as of the last applied batch.
    pub(crate) queues: Mutex<HashMap<u64, QueueState>>,
    /// Group commits since open.
    pub(crate) batches: AtomicU64,
    /// Commit-log `fdatasync`s since open.
    pub(crate) fsyncs: AtomicU64,
    /// How long each commit-log sync took, microseconds.
    pub(crate) fsync_micros: crate::histogram::Histogram,
    /// Submissions per group commit.
    pub(crate) batch_submissions: crate::histogram::Histogram,
    /// The writer refuses every write after an I/O failure.
    pub(crate) poisoned: std::sync::atomic::AtomicBool,
    /// Every change up to here is in sled and the consume queues (their settled offsets
    /// included): what a checkpoint may claim.
    pub(crate) applied: AtomicU64,
    /// End of the last effects record written.
    pub(crate) effects_end: AtomicU64,
    /// The consume-queue files and offsets.
    pub(crate) cq: crate::cq::ConsumeQueues,
    /// Changes of the keyspaces ([`Space`](crate::Space), in `codec::space_index` order)
    /// not in sled yet: durable through the effects records, moved to sled at the drain,
    /// so that a group commit writes nothing to sled for them. Readers look here first.
    pub(crate) kv_deferred: RwLock<[crate::overlay::Overlay; 5]>,
    /// A consume-queue file failed to sync (the checkpointer stopped taking checkpoints;
    /// a clean close takes none either).
    pub(crate) cq_sync_failed: std::sync::atomic::AtomicBool,
    /// The durable checkpoint: sled holds every change up to here after a crash.
    pub(crate) checkpointed: AtomicU64,
    /// Checkpoint rounds (sled flushes) since open.
    pub(crate) checkpoints: AtomicU64,
    /// Drains of the consume-queue offsets and counters to sled since open.
    pub(crate) drains: AtomicU64,
    /// Batches taken back because the file system was full, since open.
    pub(crate) out_of_space: AtomicU64,
    /// The index counters came from a full scan at open (not the checkpoint and the log).
    pub(crate) index_scanned: bool,
    /// Queue names resolved since open, with their ids: only the writer thread adds and
    /// removes entries (as it allocates ids and applies deletions), so an entry is never
    /// stale; readers take the read lock only.
    pub(crate) names: RwLock<HashMap<String, crate::QueueId>>,
}

impl Shared {
    /// The value of `key` in a keyspace: the deferred change if any, else sled's.
    pub(crate) fn kv_get(&self, space: crate::Space, key: &[u8]) -> Result<Option<bytes::Bytes>, JournalError> {
        let i = crate::codec::space_index(space);
        if let Some(change) = self.kv_deferred.read()[i].change(key) {
            return Ok(change.map(|v| bytes::Bytes::copy_from_slice(&v)));
        }
        self.db()?.get(space, key)
    }

    /// Every key/value of a keyspace with this prefix, in key order: sled's with the
    /// deferred changes laid over them.
    pub(crate) fn kv_scan(
        &self,
        space: crate::Space,
        prefix: &[u8],
    ) -> Result<Vec<(bytes::Bytes, bytes::Bytes)>, JournalError> {
        let i = crate::codec::space_index(space);
        let db = self.db()?;
        // The deferred changes are read under the lock that the drain holds while it moves
        // them to sled, so the two reads agree.
        let deferred = self.kv_deferred.read();
        let changes = deferred[i].changes_with_prefix(prefix);
        let stored = db.scan(space, prefix)?;
        drop(deferred);
        if changes.is_empty() {
            return Ok(stored);
        }
        let mut merged: std::collections::BTreeMap<bytes::Bytes, Option<bytes::Bytes>> =
            stored.into_iter().map(|(k, v)| (k, Some(v))).collect();
        for (k, v) in changes {
            merged.insert(bytes::Bytes::copy_from_slice(&k), v.map(|v| bytes::Bytes::copy_from_slice(&v)));
        }
        Ok(merged.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect())
    }

    /// The sled database. Held only for the call at hand: the writer replaces it when sled
    /// ran out of space and space returned (sled keeps its first I/O error until opened
    /// again), waiting for the handles taken before.
    pub(crate) fn db(&self) -> Result<Arc<Db>, JournalError> {
        self.db
            .read()
            .clone()
            .ok_or_else(|| JournalError::Db("the store is being opened again after it ran out of space".into()))
    }
}
