//! The [`Journal`] handle: open (recovery, the writer thread), submit, read, close.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::oneshot;

use crate::ballast;
use crate::cq::ConsumeQueues;
use crate::db::Db;
use crate::log::{self, Log};
use crate::state::Shared;
use crate::writer::{Msg, ResolveReply, Writer};
use crate::{checkpoint, guard, recovery, segment};
use crate::{
    Completion, JournalConfig, JournalError, JournalStats, KeyHit, LogPos, Op, Pointer, QueueId, Receipt, Record,
    Space, TimerEntry,
};

/// Handle to an open journal; cheap to clone, usable from any thread.
///
/// When the last handle is dropped the journal is closed as by [`Journal::close`]. To
/// reopen the same directory, drop every handle first (sled holds a lock on `db/`).
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

/// Owner of the writer thread; closing happens when the last handle drops it.
struct Inner {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<Result<(), JournalError>>>>,
    writer_id: std::thread::ThreadId,
    #[cfg(test)]
    fault: Arc<crate::log::FaultSwitch>,
}

impl Inner {
    /// Asks the writer thread to flush and stop, and waits for it.
    fn shutdown(&self) -> Result<(), JournalError> {
        let mut thread = self.thread.lock();
        let Some(handle) = thread.take() else { return Ok(()) };
        if std::thread::current().id() == self.writer_id {
            // Dropped from a completion: the writer stops by itself once every sender is
            // gone; it cannot wait for itself.
            return Ok(());
        }
        let mut msg = Msg::Close;
        loop {
            match self.tx.try_send(msg) {
                Ok(()) | Err(TrySendError::Closed(_)) => break,
                Err(TrySendError::Full(m)) => {
                    msg = m;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
        handle.join().unwrap_or_else(|_| Err(JournalError::Io("the journal writer thread panicked".into())))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "closing the journal on drop failed");
        }
    }
}

/// Caps `config.segment_size` for the file system of `config.dir` (see
/// [`JournalConfig::segment_size`]), saying so when it does.
fn cap_segment_size(config: &mut JournalConfig) {
    let fs_total = fs4::total_space(&config.dir).ok();
    let effective = crate::config::capped_segment_size(config.segment_size, fs_total);
    if effective < config.segment_size {
        tracing::info!(
            configured = config.segment_size,
            effective,
            file_system_bytes = fs_total.unwrap_or(0),
            "commit-log segments capped at an eighth of the data file system (storage.segment_size is larger)"
        );
        config.segment_size = effective;
    }
}

/// Takes the ops and completion back out of a message that could not be sent.
fn unsent(msg: Msg) -> (Vec<Op>, Option<Completion>) {
    match msg {
        Msg::Submit { ops, done, .. } => (ops, done),
        Msg::Flush(_) | Msg::Close | Msg::Verify(_) | Msg::Abandon | Msg::Resolve { .. } | Msg::Roll(_) => {
            (Vec::new(), None)
        }
    }
}

impl Journal {
    /// Opens (or creates) the journal in `config.dir`, recovers it and starts the writer thread.
    pub fn open(mut config: JournalConfig) -> Result<Journal, JournalError> {
        guard::check("open");
        std::fs::create_dir_all(&config.dir).map_err(log::io_err)?;
        cap_segment_size(&mut config);
        crate::format::check_or_stamp(&config.dir)?;
        let log_dir = config.dir.join("log");
        std::fs::create_dir_all(&log_dir).map_err(log::io_err)?;
        log::sync_dir(&config.dir).map_err(log::io_err)?;
        // A full file system: the reserved space makes room to open and recover.
        ballast::release_if_full(&config.dir, config.ballast_bytes);
        // sled first: it locks the directory against a second process.
        let db = Db::open(&config.dir.join("db"), config.cache_bytes)?;
        let clean_end = crate::checkpoint::position(&db, crate::checkpoint::CLEAN_END)?;
        let segments = recovery::recover_log(&log_dir, clean_end)?;
        let (log, log_writer) = Log::open(&log_dir, config.segment_size, &segments)?;
        let cq = ConsumeQueues::open(&config.dir.join("cq")).map_err(log::io_err)?;
        let (index, index_scanned) = recovery::recover_state(&db, &log, &cq)?;
        let end = log.end();
        let ballast = ballast::ensure(&config.dir, config.ballast_bytes, config.ballast_bytes);
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(log::io_err)?;
        let (tx, rx) = mpsc::channel(config.channel_capacity.max(1));
        let shared = Arc::new(Shared {
            config,
            log,
            db: parking_lot::RwLock::new(Some(Arc::new(db))),
            queues: Mutex::new(index.queues),
            batches: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            fsync_micros: crate::histogram::Histogram::new(crate::histogram::FSYNC_MICROS),
            batch_submissions: crate::histogram::Histogram::new(crate::histogram::BATCH_SUBMISSIONS),
            poisoned: Default::default(),
            applied: AtomicU64::new(end),
            effects_end: AtomicU64::new(end),
            cq,
            kv_deferred: Default::default(),
            cq_sync_failed: Default::default(),
            checkpointed: AtomicU64::new(end),
            checkpoints: AtomicU64::new(0),
            drains: AtomicU64::new(0),
            out_of_space: AtomicU64::new(0),
            index_scanned,
            names: Default::default(),
        });
        let checkpointer = checkpoint::Checkpointer::start(shared.clone()).map_err(log::io_err)?;
        let writer = Writer::new(shared.clone(), rx, rt, log_writer, index.refs, ballast, checkpointer);
        #[cfg(test)]
        let fault = writer.fault_switch();
        let handle = std::thread::Builder::new()
            .name("ferrymq-journal".into())
            .spawn(move || writer.run())
            .map_err(log::io_err)?;
        Ok(Journal {
            inner: Arc::new(Inner {
                tx,
                shared,
                writer_id: handle.thread().id(),
                thread: Mutex::new(Some(handle)),
                #[cfg(test)]
                fault,
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// The target size of a commit-log segment in bytes: [`JournalConfig::segment_size`] as
    /// capped at open for the data directory's file system.
    pub fn segment_size(&self) -> u64 {
        self.shared().config.segment_size
    }

    /// Closes the active commit-log segment now, if it holds any record, and starts a new
    /// one: retention may then delete it once nothing refers into it. Waits for everything
    /// submitted before; returns whether a segment was closed. The writer does this by
    /// itself when retention is short of disk space and only the active segment holds what
    /// nothing refers to any more (see [`Retention`](crate::Retention)).
    ///
    /// Blocking, like [`Journal::write_blocking`]: not from an async runtime thread or a
    /// completion. [`JournalError::Full`] if the file system has no room for the new
    /// segment's file (nothing changes then).
    pub fn roll_segment(&self) -> Result<bool, JournalError> {
        guard::check("roll_segment");
        let (tx, rx) = oneshot::channel();
        self.inner.tx.blocking_send(Msg::Roll(tx)).map_err(|_| JournalError::Closed)?;
        rx.blocking_recv().unwrap_or(Err(JournalError::Closed))
    }

    /// Queues a submission, waiting for channel capacity (back-pressure). `done` runs on the
    /// writer thread once the submission is durable under the policy (or failed).
    ///
    /// Fails with [`JournalError::Closed`] (without calling `done`) once the journal is
    /// closed. Every other failure reaches `done`: [`JournalError::Poisoned`] after an I/O
    /// failure; [`JournalError::NotFound`] if an [`Op::Enqueue`] names a position that holds
    /// no live record, in which case **nothing** of the submission is applied;
    /// [`JournalError::Io`] if a record is too large for the `u32` framing (likewise
    /// applied not at all). Ops on entries that do not exist (`Remove`, `SetFlags`,
    /// `DeleteRetained`, `DeleteTimer`, `Delete`) are no-ops.
    pub async fn submit(&self, ops: Vec<Op>, done: Option<Completion>) -> Result<(), JournalError> {
        self.inner.tx.send(Msg::Submit { ops, done, durable: true }).await.map_err(|_| JournalError::Closed)
    }

    /// Like [`Journal::submit`], but `done` runs once the submission is written to the OS,
    /// without waiting for an fsync even under [`FsyncPolicy::Always`] (for what needs no
    /// power-loss durability: transient messages, acknowledgements, QoS 0). Completions
    /// still run in submission order, so one queued behind a durable submission of the
    /// same batch waits for that batch's fsync.
    ///
    /// [`FsyncPolicy::Always`]: crate::FsyncPolicy::Always
    pub async fn submit_relaxed(&self, ops: Vec<Op>, done: Option<Completion>) -> Result<(), JournalError> {
        self.inner.tx.send(Msg::Submit { ops, done, durable: false }).await.map_err(|_| JournalError::Closed)
    }

    /// Like [`Journal::submit`] but fails with the ops handed back when the channel is full.
    ///
    /// The error is [`JournalError::Closed`] if the journal is closed, and
    /// [`JournalError::Io`] ("submission channel is full") if the channel is full.
    pub fn try_submit(
        &self,
        ops: Vec<Op>,
        done: Option<Completion>,
    ) -> Result<(), (Vec<Op>, Option<Completion>, JournalError)> {
        match self.inner.tx.try_send(Msg::Submit { ops, done, durable: true }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(msg)) => {
                let (ops, done) = unsent(msg);
                Err((ops, done, JournalError::Io("journal submission channel is full".into())))
            }
            Err(TrySendError::Closed(msg)) => {
                let (ops, done) = unsent(msg);
                Err((ops, done, JournalError::Closed))
            }
        }
    }

    /// Submits and waits for the receipt.
    pub async fn write(&self, ops: Vec<Op>) -> Result<Receipt, JournalError> {
        let (tx, rx) = oneshot::channel();
        self.submit(ops, Some(Box::new(move |r| drop(tx.send(r))))).await?;
        rx.await.unwrap_or(Err(JournalError::Closed))
    }

    /// Blocking variant of [`Journal::write`] for non-async callers (tests, tools).
    ///
    /// Must not be called from an async runtime thread or from a completion.
    pub fn write_blocking(&self, ops: Vec<Op>) -> Result<Receipt, JournalError> {
        guard::check("write_blocking");
        let (tx, rx) = oneshot::channel();
        let done: Completion = Box::new(move |r| drop(tx.send(r)));
        self.inner
            .tx
            .blocking_send(Msg::Submit { ops, done: Some(done), durable: true })
            .map_err(|_| JournalError::Closed)?;
        rx.blocking_recv().unwrap_or(Err(JournalError::Closed))
    }

    /// Returns the id of the named queue, creating the mapping if needed. Blocking: a
    /// name not in memory yet waits for the writer thread (see
    /// [`Journal::resolve_queue_id`], the form for async callers); not from an async
    /// runtime worker or from a completion.
    ///
    /// Ids are never handed out twice, not even after [`Op::DeleteQueue`]. A new mapping
    /// is in sled at once and goes into the commit log with the group commit the writer is
    /// working on, so it is as durable as any write submitted after this call.
    pub fn queue_id(&self, name: &str) -> Result<QueueId, JournalError> {
        guard::check("queue_id");
        if let Some(id) = self.cached_queue_id(name) {
            return Ok(id);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let reply: ResolveReply = Box::new(move |r| drop(tx.send(r)));
        let mut msg = Msg::Resolve { name: name.to_owned(), reply };
        // `try_send`, not `blocking_send`: this may run inside a runtime's `block_on` (the
        // broker's start-up, a queue owner), where tokio's blocking waits panic.
        loop {
            match self.inner.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Closed(_)) => return Err(JournalError::Closed),
                Err(TrySendError::Full(m)) => {
                    msg = m;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
        rx.recv().unwrap_or(Err(JournalError::Closed))
    }

    /// Returns the id of the named queue, creating the mapping if needed, without blocking
    /// the calling thread: from memory when the name was resolved before (a read lock and
    /// a hash lookup), else the writer thread looks it up in sled or allocates the id.
    /// Otherwise as [`Journal::queue_id`].
    pub async fn resolve_queue_id(&self, name: &str) -> Result<QueueId, JournalError> {
        if let Some(id) = self.cached_queue_id(name) {
            return Ok(id);
        }
        let (tx, rx) = oneshot::channel();
        let reply: ResolveReply = Box::new(move |r| drop(tx.send(r)));
        self.inner.tx.send(Msg::Resolve { name: name.to_owned(), reply }).await.map_err(|_| JournalError::Closed)?;
        rx.await.unwrap_or(Err(JournalError::Closed))
    }

    /// Creates the on-disk files of queue `id` ahead of its first backlog (its directory
    /// and first consume-queue file), so that the writer thread's drain only opens them: a
    /// wide fan-out to thousands of new queues would otherwise create them all while every
    /// publisher's group commit waits. Optional (the drain creates what is missing);
    /// blocking file-system calls, never on a runtime worker.
    pub fn create_queue_files(&self, id: QueueId) -> Result<(), JournalError> {
        guard::check("create_queue_files");
        self.shared().cq.create_files(id.0).map_err(|e| JournalError::Io(e.to_string()))
    }

    /// The id of the named queue if it is in memory (resolved since open and not deleted
    /// since); never blocks on I/O. `None` says nothing about sled: ask
    /// [`Journal::resolve_queue_id`].
    pub fn cached_queue_id(&self, name: &str) -> Option<QueueId> {
        self.shared().names.read().get(name).copied()
    }

    /// Every known queue name with its id.
    pub fn queues(&self) -> Result<Vec<(String, QueueId)>, JournalError> {
        guard::check("queues");
        self.shared().db()?.queues()
    }

    /// Reads a record (checks its CRC). Blocking pread; cheap when the page cache has it.
    ///
    /// [`JournalError::NotFound`] if no live segment holds `pos` (deleted by retention, past
    /// the end); [`JournalError::Corrupt`] if the bytes there fail the framing or crc check.
    pub fn read(&self, pos: LogPos) -> Result<Record, JournalError> {
        guard::check("read");
        self.shared().log.read(pos.0)
    }

    /// Up to `limit` records indexed under exactly `key` (see [`MessageKeys`]) with a
    /// timestamp in `from_ms..=to_ms`, oldest first. A range scan of the key index, not a
    /// log scan; records deleted by retention are not returned.
    ///
    /// [`MessageKeys`]: crate::MessageKeys
    pub fn lookup_key(&self, key: &[u8], from_ms: u64, to_ms: u64, limit: usize) -> Result<Vec<KeyHit>, JournalError> {
        guard::check("lookup_key");
        let shared = self.shared();
        shared.db()?.lookup_key(key, from_ms, to_ms, limit, |pos, size| {
            size as u64 >= segment::RECORD_OVERHEAD && shared.log.contains(pos, size)
        })
    }

    /// Number of entries in the key index (diagnostics; counts the whole tree).
    pub fn key_index_len(&self) -> usize {
        guard::check("key_index_len");
        self.shared().db().map_or(0, |db| db.key.len())
    }

    /// Up to `limit` entries of `queue` with offset >= `from`, in offset order.
    pub fn queue_entries(&self, queue: QueueId, from: u64, limit: usize) -> Result<Vec<(u64, Pointer)>, JournalError> {
        guard::check("queue_entries");
        let shared = self.shared();
        shared.cq.entries(queue.0, from, limit).map_err(log::io_err)
    }

    /// The next offset `queue` will assign (0 for an empty, never-used queue).
    ///
    /// Offsets are never reused while the queue exists, even after its entries are removed
    /// and across reopen; [`Op::DeleteQueue`] resets the queue, so its next offset is 0 again.
    pub fn queue_next_offset(&self, queue: QueueId) -> u64 {
        self.shared().queues.lock().get(&queue.0).map_or(0, |s| s.next)
    }

    /// Number of live entries in `queue` (kept in memory: O(1)).
    pub fn queue_len(&self, queue: QueueId) -> Result<u64, JournalError> {
        Ok(self.shared().queues.lock().get(&queue.0).map_or(0, |s| s.len))
    }

    /// Every retained message: topic and record position.
    pub fn retained(&self) -> Result<Vec<(String, LogPos)>, JournalError> {
        guard::check("retained");
        self.shared().db()?.retained()
    }

    /// Up to `limit` timers due at or before `until_ms`, earliest first.
    pub fn timers_due(&self, until_ms: u64, limit: usize) -> Result<Vec<TimerEntry>, JournalError> {
        guard::check("timers_due");
        self.shared().db()?.timers_due(until_ms, limit)
    }

    /// Up to `limit` timers after the timer `after` (`due_ms`, position), from the first
    /// when `None`, earliest first: every timer, a page at a time (start-up checks them).
    pub fn timers_after(&self, after: Option<(u64, LogPos)>, limit: usize) -> Result<Vec<TimerEntry>, JournalError> {
        self.shared().db()?.timers_after(after.map(|(due, pos)| (due, pos.0)), limit)
    }

    /// How many of the first `limit` stored timers (earliest first) have a target `keep`
    /// accepts: a scan, for a sampler off the runtime's workers, not for a hot path.
    pub fn count_timers(&self, limit: usize, keep: &dyn Fn(&[u8]) -> bool) -> Result<u64, JournalError> {
        guard::check("count_timers");
        self.shared().db()?.count_timers(limit, keep)
    }

    /// Due time of the earliest timer (`None` when there is none).
    pub fn next_timer(&self) -> Result<Option<u64>, JournalError> {
        guard::check("next_timer");
        self.shared().db()?.next_timer()
    }

    /// The value of `key` in a keyspace, if it is set.
    pub fn get(&self, space: Space, key: &[u8]) -> Result<Option<Bytes>, JournalError> {
        guard::check("get");
        self.shared().kv_get(space, key)
    }

    /// Every key/value with this prefix, in key order.
    pub fn scan(&self, space: Space, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>, JournalError> {
        guard::check("scan");
        self.shared().kv_scan(space, prefix)
    }

    /// Current counters for monitoring (see [`JournalStats`]).
    pub fn stats(&self) -> JournalStats {
        let shared = self.shared();
        let (segments, log_bytes) = shared.log.size();
        JournalStats {
            segments,
            log_bytes,
            log_end: shared.log.end(),
            batches: shared.batches.load(Ordering::Relaxed),
            fsyncs: shared.fsyncs.load(Ordering::Relaxed),
            checkpoints: shared.checkpoints.load(Ordering::Relaxed),
            drains: shared.drains.load(Ordering::Relaxed),
            out_of_space: shared.out_of_space.load(Ordering::Relaxed),
            index_scanned: shared.index_scanned,
            fsync_micros: shared.fsync_micros.snapshot(),
            batch_submissions: shared.batch_submissions.snapshot(),
            poisoned: shared.poisoned.load(Ordering::Relaxed),
        }
    }

    /// Waits until everything submitted so far is written, fsyncs and flushes regardless of
    /// policy (used at shutdown).
    pub async fn flush(&self) -> Result<(), JournalError> {
        let (tx, rx) = oneshot::channel();
        self.inner.tx.send(Msg::Flush(tx)).await.map_err(|_| JournalError::Closed)?;
        rx.await.unwrap_or(Err(JournalError::Closed))
    }

    /// Flushes, stops the writer thread and waits for it (used at shutdown and in tests).
    ///
    /// Later submissions fail with [`JournalError::Closed`]; reads keep working until the
    /// last handle is dropped. Closing twice is a no-op.
    pub fn close(&self) -> Result<(), JournalError> {
        guard::check("close");
        self.inner.shutdown()
    }

    /// Diagnostics for tests: waits for everything submitted before, then recounts the
    /// per-segment references and per-queue lengths from sled on the writer thread and
    /// compares them with the in-memory counters. Blocking; a full scan of the index.
    #[doc(hidden)]
    pub fn verify_counters(&self) -> Result<(), String> {
        guard::check("verify_counters");
        let (tx, rx) = oneshot::channel();
        self.inner.tx.blocking_send(Msg::Verify(tx)).map_err(|_| "journal is closed".to_string())?;
        rx.blocking_recv().unwrap_or_else(|_| Err("journal is closed".into()))
    }

    /// Tests: stops the writer as a crash of the process would — after the batch under way,
    /// without a last sync or checkpoint (what was written stays with the OS; sled's own
    /// buffers go to its files when the last handle is dropped) — and waits for it. Later
    /// submissions fail with [`JournalError::Closed`]. Reopen to recover.
    #[doc(hidden)]
    pub fn crash(&self) {
        guard::check("crash");
        let _ = self.inner.tx.blocking_send(Msg::Abandon);
        if let Some(handle) = self.inner.thread.lock().take() {
            let _ = handle.join();
        }
    }

    /// Test hook: makes every later commit-log write and fsync fail.
    #[cfg(test)]
    pub(crate) fn inject_io_failure(&self) {
        self.inject(crate::log::Fault::Io, 0);
    }

    /// Test hook: sets how later commit-log writes and fsyncs fail; under
    /// [`Fault::NoSpace`](crate::log::Fault) `writes_left` more writes succeed first.
    #[cfg(test)]
    pub(crate) fn inject(&self, fault: crate::log::Fault, writes_left: u64) {
        self.inner.fault.writes_left.store(writes_left, Ordering::SeqCst);
        self.inner.fault.mode.store(fault as u8, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests;
