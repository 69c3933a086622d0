//! Checkpoints: the commit-log position up to which sled and the consume-queue files hold
//! every change durably.
//!
//! Group commits write their sled changes to the commit log first (an effects record,
//! `effects`) and apply them to sled without flushing it; the **checkpointer** thread
//! flushes sled every [`JournalConfig::checkpoint_interval`] and records the position
//! reached (key `ferrymq:checkpoint:v2` in sled's default tree). The position stored in a
//! round becomes durable with the next round's flush, so a crash replays at most two
//! intervals of the log (`recovery::recover_state`). A clean close writes a checkpoint at
//! the end of the log and flushes twice, so the next open replays nothing.
//!
//! Besides, every batch stores the end of its effects record (`ferrymq:applied:v2`) as its
//! first sled write: if sled holds a position past the end of the recovered log, sled has
//! changes whose records were lost (a power loss under `fsync = interval | never`), and
//! recovery scans the index instead of trusting it.
//!
//! [`JournalConfig::checkpoint_interval`]: crate::JournalConfig::checkpoint_interval

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;

use sled::Batch;

use crate::codec::{self, Counter};
use crate::db::{db_err, Db};
use crate::recovery::Index;
use crate::refs::RefCounts;
use crate::state::{QueueState, Shared};
use crate::JournalError;

/// Key of the checkpoint position in sled's default tree.
pub(crate) const CHECKPOINT: &[u8] = b"ferrymq:checkpoint:v2";

/// Key of the end of the last applied effects record in sled's default tree.
pub(crate) const APPLIED: &[u8] = b"ferrymq:applied:v2";

/// Key of the end of the log the last clean close left: below it every record was synced,
/// so a record there that does not read back is damage, never a torn write. It stays true
/// after later writes (the log only grows past it; retention deletes whole segments from
/// the front), so nothing removes it; the next clean close moves it on.
pub(crate) const CLEAN_END: &[u8] = b"ferrymq:clean-end:v1";

/// A position stored under `key` in sled's default tree.
pub(crate) fn position(db: &Db, key: &[u8]) -> Result<Option<u64>, JournalError> {
    Ok(db.db.get(key).map_err(db_err)?.and_then(|v| codec::decode_u64(&v)))
}

/// Stores the checkpoint position `pos` and the applied mark with it, and flushes sled:
/// sled holds every change up to `pos` (the caller applied them all).
pub(crate) fn write(db: &Db, pos: u64) -> Result<(), JournalError> {
    // Written only when they change: an open and a close that changed nothing write nothing.
    if position(db, APPLIED)? != Some(pos) || position(db, CHECKPOINT)? != Some(pos) {
        db.db.insert(APPLIED, &codec::encode_u64(pos)).map_err(db_err)?;
        db.db.insert(CHECKPOINT, &codec::encode_u64(pos)).map_err(db_err)?;
    }
    db.db.flush().map_err(db_err)?;
    Ok(())
}

/// Stores the end of the log a clean close left, and flushes sled (after [`write()`]: the log
/// is synced up to `pos`).
pub(crate) fn write_clean_end(db: &Db, pos: u64) -> Result<(), JournalError> {
    // Written only when it changes: a close that changed nothing writes nothing.
    if position(db, CLEAN_END)? != Some(pos) {
        db.db.insert(CLEAN_END, &codec::encode_u64(pos)).map_err(db_err)?;
        db.db.flush().map_err(db_err)?;
    }
    Ok(())
}

/// Replaces the `counters` tree with `index` (after a scan rebuilt it).
pub(crate) fn write_counters(db: &Db, index: &Index) -> Result<(), JournalError> {
    let mut batch = Batch::default();
    for k in db.counters.iter().keys() {
        batch.remove(k.map_err(db_err)?);
    }
    for (q, st) in &index.queues {
        if *st != QueueState::default() {
            batch.insert(&codec::queue_counters_key(*q)[..], &codec::encode_queue_counters(st.next, st.len)[..]);
        }
    }
    for (base, n) in index.refs.iter() {
        batch.insert(&codec::segment_refs_key(base)[..], &codec::encode_u64(n)[..]);
    }
    db.counters.apply_batch(batch).map_err(db_err)
}

/// The counters as the `counters` tree holds them.
pub(crate) fn read_counters(db: &Db) -> Result<Index, JournalError> {
    let (mut refs, mut queues) = (Vec::new(), HashMap::new());
    for kv in db.counters.iter() {
        let (k, v) = kv.map_err(db_err)?;
        match codec::decode_counter(&k, &v) {
            Some(Counter::Queue(q, next, len)) => {
                queues.insert(q, QueueState { next, len });
            }
            Some(Counter::Segment(base, n)) => refs.push((base, n)),
            None => return Err(JournalError::Malformed { tree: codec::TREE_COUNTERS, key: k.to_vec() }),
        }
    }
    Ok(Index { refs: RefCounts::from_pairs(refs), queues })
}

/// What the writer tells the checkpointer.
enum Signal {
    /// Run a round now.
    Now,
    /// Stop.
    Stop,
}

/// The checkpointer thread (see the module doc).
pub(crate) struct Checkpointer {
    signal: mpsc::Sender<Signal>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Starts the thread.
    pub(crate) fn start(shared: Arc<Shared>) -> std::io::Result<Checkpointer> {
        let (signal, rx) = mpsc::channel();
        let thread =
            std::thread::Builder::new().name("ferrymq-checkpoint".into()).spawn(move || checkpoints(&shared, &rx))?;
        Ok(Checkpointer { signal, thread })
    }

    /// Starts a round now instead of at the end of the interval (the log grew by
    /// [`JournalConfig::checkpoint_bytes`](crate::JournalConfig::checkpoint_bytes)).
    pub(crate) fn wake(&self) {
        let _ = self.signal.send(Signal::Now);
    }

    /// Stops the thread and waits for it (a round under way finishes first).
    pub(crate) fn stop(self) {
        let _ = self.signal.send(Signal::Stop);
        let _ = self.thread.join();
    }
}

/// The checkpointer's loop: every interval with new changes applied, sync the consume-queue
/// files written since the last round (one `syncfs` when they are many, see
/// [`ConsumeQueues::sync`](crate::cq::ConsumeQueues::sync)), flush sled, publish
/// the position stored in the round before (durable now) and store the position reached.
fn checkpoints(shared: &Shared, signals: &mpsc::Receiver<Signal>) {
    let mut stored: Option<u64> = None;
    let mut failing = false;
    // A failed fsync of a consume-queue file may have dropped its pages (Linux clears the
    // error), so a later one succeeding proves nothing: no checkpoint moves on after it.
    let mut cq_broken = false;
    loop {
        match signals.recv_timeout(shared.config.checkpoint_interval) {
            Err(RecvTimeoutError::Timeout) | Ok(Signal::Now) => {}
            Ok(Signal::Stop) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let target = shared.applied.load(Ordering::Acquire);
        if target == shared.checkpointed.load(Ordering::Acquire) {
            continue;
        }
        // Not while sled is being opened again after it ran out of space.
        let Ok(db) = shared.db() else { continue };
        if cq_broken {
            continue;
        }
        // The consume-queue entries of everything up to `target` first: the checkpoint
        // stored below claims them.
        if let Err(e) = shared.cq.sync() {
            tracing::error!(error = %e, "checkpoint: syncing the consume-queue files failed; no further checkpoint is taken (recovery replays the commit log from the last one)");
            cq_broken = true;
            shared.cq_sync_failed.store(true, Ordering::Release);
            continue;
        }
        match db.db.flush() {
            Ok(_) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "checkpoint: sled flush failed; trying again next interval");
                }
                failing = true;
                continue;
            }
        }
        if let Some(pos) = stored {
            shared.checkpointed.store(pos, Ordering::Release);
        }
        if db.db.insert(CHECKPOINT, &codec::encode_u64(target)).is_ok() {
            stored = Some(target);
        }
        shared.checkpoints.fetch_add(1, Ordering::Relaxed);
    }
}
