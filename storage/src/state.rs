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
    /// Every change up to here is in sled and the consume queues (their settled offsets
    /// included): what a checkpoint may claim.
    pub(crate) applied: AtomicU64,
    /// End of the last effects record written.
    pub(crate) effects_end: AtomicU64,
    /// The consume-queue files and offsets.
    pub(crate) cq: crate::cq::ConsumeQueues,
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
}

impl Shared {
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
