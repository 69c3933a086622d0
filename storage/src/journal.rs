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
        let found = crate::format::check_or_stamp(&config.dir)?;
        let log_dir = config.dir.join("log");
        std::fs::create_dir_all(&log_dir).map_err(log::io_err)?;
        log::sync_dir(&config.dir).map_err(log::io_err)?;
        // A full file system: the reserved space makes room to open and recover.
        ballast::release_if_full(&config.dir, config.ballast_bytes);
        // sled first: it locks the directory against a second process.
        let db = Db::open(&config.dir.join("db"), config.cache_bytes)?;
        let segments = recovery::recover_log(&log_dir)?;
        let (log, log_writer) = Log::open(&log_dir, config.segment_size, &segments)?;
        let cq = ConsumeQueues::open(&config.dir.join("cq")).map_err(log::io_err)?;
        // A migration that stopped after its checkpoint but before the stamp is done.
        let migrated = db.db.get(crate::format::MIGRATED_KEY).map_err(crate::db::db_err)?;
        let found = match found {
            crate::format::Found::Current => found,
            _ if migrated.is_some_and(|v| v[..] == crate::LAYOUT.to_be_bytes()) => {
                tracing::info!(dir = ?config.dir, "finishing an interrupted migration to layout {}", crate::LAYOUT);
                crate::format::stamp(&config.dir)?;
                crate::format::Found::Current
            }
            _ => found,
        };
        let (index, index_scanned) = recovery::recover_state(&db, &log, &cq, found)?;
        if found != crate::format::Found::Current {
            crate::format::stamp(&config.dir)?;
            tracing::info!(dir = ?config.dir, from = ?found, "migrated the data directory to layout {}", crate::LAYOUT);
        }
        // Layouts 1 and 2 kept the entries in sled (moved to `cq/` by the recovery; left
        // behind if a migration stopped after stamping).
        if !db.queue.is_empty() {
            db.queue.clear().map_err(crate::db::db_err)?;
            db.db.flush().map_err(crate::db::db_err)?;
        }
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
mod tests {
    use super::*;
    use crate::{Append, FsyncPolicy, QueueTarget};

    fn append(q: QueueId, n: u8) -> Vec<Op> {
        vec![Op::Append(Append {
            record: Record { header: Bytes::new(), body: Bytes::from(vec![n; 100]) },
            queues: vec![QueueTarget { queue: q, tag_hash: 0, flags: 0 }],
            retained_topic: None,
            timer: None,
            keys: None,
        })]
    }

    /// Submits fifty appends at once (most in one batch) and returns their results.
    fn submit_fifty(j: &Journal, q: QueueId) -> Vec<Result<Receipt, JournalError>> {
        let (tx, rx) = std::sync::mpsc::channel();
        for n in 0..50 {
            let tx = tx.clone();
            let done: Completion = Box::new(move |r| tx.send(r).unwrap());
            if j.try_submit(append(q, n), Some(done)).is_err() {
                panic!("channel full");
            }
        }
        drop(tx);
        let results: Vec<_> = rx.iter().collect();
        assert_eq!(results.len(), 50);
        results
    }

    #[test]
    fn a_synced_group_commit_ends_on_a_page_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let config = JournalConfig::new(dir.path());
        let j = Journal::open(config.clone()).unwrap();
        let q = j.queue_id("q").unwrap();
        let mut kept = Vec::new();
        for n in 0..40u8 {
            kept.push(j.write_blocking(append(q, n)).unwrap().appended[0].pos);
            let end = j.stats().log_end;
            assert_eq!(end % crate::segment::PAGE, 0, "after commit {n}: the log ends at {end}");
        }
        // 40 commits of ~130 bytes each took 40 pages: a page per synced commit at most.
        assert_eq!(j.stats().log_end, 40 * crate::segment::PAGE);
        j.write_blocking(vec![Op::Remove { queue: q, offset: 0 }]).unwrap();
        j.crash();
        drop(j);
        // The padding reads as records nobody points at: the scan and the replay pass them.
        let j = Journal::open(config).unwrap();
        assert!(!j.stats().index_scanned);
        assert_eq!(j.queue_len(q).unwrap(), 39);
        for (n, pos) in kept.iter().enumerate().skip(1) {
            assert_eq!(j.read(*pos).unwrap().body, Bytes::from(vec![n as u8; 100]));
        }
        j.verify_counters().unwrap();
    }

    #[test]
    fn without_page_aligned_syncs_no_commit_is_padded() {
        let dir = tempfile::tempdir().unwrap();
        let config = JournalConfig { page_aligned_syncs: false, ..JournalConfig::new(dir.path()) };
        let j = Journal::open(config).unwrap();
        let q = j.queue_id("q").unwrap();
        let start = j.stats().log_end;
        for n in 0..40u8 {
            j.write_blocking(append(q, n)).unwrap();
        }
        // 40 commits of ~130 bytes: padded they would take 40 pages.
        let used = j.stats().log_end - start;
        assert!(used < 2 * crate::segment::PAGE, "40 synced commits took {used} bytes");
    }

    #[test]
    fn io_failure_poisons_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        let q = j.queue_id("q").unwrap();
        let ok = j.write_blocking(append(q, 1)).unwrap();
        j.inject_io_failure();
        let e = j.write_blocking(append(q, 2));
        assert!(matches!(e, Err(JournalError::Poisoned(_))), "{e:?}");
        // Later submissions, of any kind, are refused too.
        let e = j.write_blocking(vec![Op::Delete { space: Space::Meta, key: Bytes::from_static(b"k") }]);
        assert!(matches!(e, Err(JournalError::Poisoned(_))), "{e:?}");
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert!(matches!(rt.block_on(j.flush()), Err(JournalError::Poisoned(_))));
        // Reads still work; what was acknowledged is intact.
        assert_eq!(j.read(ok.appended[0].pos).unwrap().body, Bytes::from(vec![1u8; 100]));
        assert_eq!(j.queue_len(q).unwrap(), 1);
        assert!(matches!(j.close(), Err(JournalError::Poisoned(_))));
        drop(j);
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        let q = j.queue_id("q").unwrap();
        assert_eq!(j.read(ok.appended[0].pos).unwrap().body, Bytes::from(vec![1u8; 100]));
        assert_eq!(j.queue_len(q).unwrap(), 1);
        let r = j.write_blocking(append(q, 3)).unwrap();
        assert_eq!(r.appended[0].offsets, vec![(q, 1)]);
    }

    #[test]
    fn a_full_file_system_takes_the_batch_back_and_the_journal_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = JournalConfig::new(dir.path());
        config.segment_size = 1000; // eight 100-byte records per segment
        let j = Journal::open(config.clone()).unwrap();
        let q = j.queue_id("q").unwrap();
        let kept: Vec<_> = (0..3).map(|n| j.write_blocking(append(q, n)).unwrap().appended[0].clone()).collect();
        let before = j.stats();
        let files = || std::fs::read_dir(dir.path().join("log")).unwrap().count();
        let files_before = files();

        // One submission of twenty appends and a removal: the first segment roll is
        // written, the second write of records fails for lack of space.
        j.inject(crate::log::Fault::NoSpace, 2);
        let mut ops: Vec<Op> = (10..30).flat_map(|n| append(q, n)).collect();
        ops.push(Op::Remove { queue: q, offset: 0 });
        let e = j.write_blocking(ops);
        assert!(matches!(e, Err(JournalError::Full(_))), "{e:?}");
        let after = j.stats();
        assert_eq!((after.log_end, after.segments), (before.log_end, before.segments), "every record taken back");
        assert_eq!(files(), files_before, "the segment begun in the batch is deleted");
        assert_eq!(after.out_of_space, 1);
        assert_eq!(j.queue_len(q).unwrap(), 3, "the removal is taken back too");
        j.verify_counters().unwrap();
        // Still full: refused again, not poisoned; so are removals (their effects record
        // is a commit-log write too).
        assert!(matches!(j.write_blocking(append(q, 40)), Err(JournalError::Full(_))));
        let remove = vec![Op::Remove { queue: q, offset: 2 }];
        assert!(matches!(j.write_blocking(remove.clone()), Err(JournalError::Full(_))));
        assert_eq!(j.stats().log_end, before.log_end);

        // Space returns: appends are acknowledged again, at the positions and offsets the
        // refused batch would have had.
        j.inject(crate::log::Fault::None, 0);
        let r = j.write_blocking(append(q, 50)).unwrap().appended[0].clone();
        assert_eq!(r.pos.0, before.log_end);
        assert_eq!(r.offsets, vec![(q, 3)]);
        j.write_blocking(remove).unwrap();
        for (n, a) in kept.iter().enumerate() {
            assert_eq!(j.read(a.pos).unwrap().body, Bytes::from(vec![n as u8; 100]));
        }
        assert_eq!(j.read(r.pos).unwrap().body, Bytes::from(vec![50u8; 100]));
        assert_eq!(j.queue_len(q).unwrap(), 3);
        j.verify_counters().unwrap();
        j.close().unwrap();
        drop(j);
        let j = Journal::open(config).unwrap();
        assert_eq!(j.queue_len(q).unwrap(), 3);
        let entries: Vec<u64> = j.queue_entries(q, 0, 10).unwrap().iter().map(|(o, _)| *o).collect();
        assert_eq!(entries, vec![0, 1, 3]);
        assert_eq!(j.read(r.pos).unwrap().body, Bytes::from(vec![50u8; 100]));
        j.verify_counters().unwrap();
    }

    #[test]
    fn sled_out_of_space_refuses_writes_until_it_is_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let config = JournalConfig::new(dir.path());
        let j = Journal::open(config.clone()).unwrap();
        let q = j.queue_id("q").unwrap();
        let kept: Vec<_> = (0..2).map(|n| j.write_blocking(append(q, n)).unwrap().appended[0].clone()).collect();
        j.inject(crate::log::Fault::StoreFull, 0);
        assert!(matches!(j.write_blocking(append(q, 2)), Err(JournalError::Full(_))));
        assert!(matches!(j.write_blocking(vec![Op::Remove { queue: q, offset: 0 }]), Err(JournalError::Full(_))));
        // Reads go on meanwhile.
        assert_eq!(j.queue_entries(q, 0, 10).unwrap().len(), 2);
        assert_eq!(j.read(kept[1].pos).unwrap().body, Bytes::from(vec![1u8; 100]));

        // Space returns: sled is opened again within a bounded time and writes go on.
        j.inject(crate::log::Fault::None, 0);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let r = loop {
            match j.write_blocking(append(q, 3)) {
                Ok(r) => break r.appended[0].clone(),
                Err(JournalError::Full(_)) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("after space returned: {e}"),
            }
        };
        assert_eq!(r.offsets, vec![(q, 2)], "the refused append took no offset");
        let offsets: Vec<u64> = j.queue_entries(q, 0, 10).unwrap().iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, vec![0, 1, 2]);
        assert_eq!(j.queue_len(q).unwrap(), 3);
        j.verify_counters().unwrap();
        assert_eq!(j.queue_id("q").unwrap(), q);
        assert!(j.stats().out_of_space >= 1);
        j.close().unwrap();
        drop(j);
        let j = Journal::open(config).unwrap();
        assert_eq!(j.queue_len(q).unwrap(), 3);
        assert_eq!(j.read(r.pos).unwrap().body, Bytes::from(vec![3u8; 100]));
        j.verify_counters().unwrap();
    }

    #[test]
    fn an_out_of_space_batch_fails_every_submission_in_it_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = JournalConfig::new(dir.path());
        config.fsync = FsyncPolicy::Never;
        let j = Journal::open(config).unwrap();
        let q = j.queue_id("q").unwrap();
        j.inject(crate::log::Fault::NoSpace, 0);
        let results = submit_fifty(&j, q);
        assert!(results.iter().all(|r| matches!(r, Err(JournalError::Full(_)))), "{results:?}");
        assert_eq!(j.queue_len(q).unwrap(), 0);
        j.inject(crate::log::Fault::None, 0);
        assert_eq!(j.write_blocking(append(q, 1)).unwrap().appended[0].offsets, vec![(q, 0)]);
        j.verify_counters().unwrap();
    }

    #[test]
    fn add_timer_schedules_an_existing_record() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        let q = j.queue_id("q").unwrap();
        let a = j.write_blocking(append(q, 1)).unwrap().appended[0].clone();
        let timer = |due_ms, target: &'static [u8]| Op::AddTimer {
            due_ms,
            pos: a.pos,
            size: a.size,
            target: Bytes::from_static(target),
        };
        // The same timer twice is one timer; another target at the same key moves 1 ms on;
        // a position that holds no record is ignored without failing the submission.
        let nowhere = Op::AddTimer { due_ms: 5, pos: LogPos(1 << 40), size: 100, target: Bytes::new() };
        j.write_blocking(vec![timer(100, b"a"), timer(100, b"a"), timer(100, b"b"), nowhere]).unwrap();
        let due = j.timers_due(u64::MAX, 10).unwrap();
        let seen: Vec<(u64, &[u8])> = due.iter().map(|t| (t.due_ms, &t.target[..])).collect();
        assert_eq!(seen, vec![(100, &b"a"[..]), (101, &b"b"[..])]);
        j.verify_counters().unwrap();
        // Timers keep the record alive on their own; they survive a reopen.
        j.write_blocking(vec![Op::Remove { queue: q, offset: 0 }]).unwrap();
        j.close().unwrap();
        drop(j);
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        assert_eq!(j.timers_due(u64::MAX, 10).unwrap(), due);
        assert_eq!(j.read(a.pos).unwrap().body, Bytes::from(vec![1u8; 100]));
        j.write_blocking(due.iter().map(|t| Op::DeleteTimer { due_ms: t.due_ms, pos: t.pos }).collect()).unwrap();
        assert!(j.timers_due(u64::MAX, 10).unwrap().is_empty());
        j.verify_counters().unwrap();
    }

    #[test]
    fn poison_fails_the_whole_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = JournalConfig::new(dir.path());
        config.fsync = FsyncPolicy::Never;
        let j = Journal::open(config).unwrap();
        let q = j.queue_id("q").unwrap();
        j.inject_io_failure();
        let results = submit_fifty(&j, q);
        assert!(results.iter().all(|r| matches!(r, Err(JournalError::Poisoned(_)))));
        assert_eq!(j.queue_len(q).unwrap(), 0);
    }

    /// A runtime whose worker (and blocking-pool) threads are marked, as the broker's are.
    fn marked_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(crate::forbid_blocking)
            .build()
            .unwrap()
    }

    #[test]
    #[cfg(debug_assertions)]
    fn a_blocking_call_on_a_runtime_worker_panics_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        let rt = marked_runtime();
        let (j1, j2, j3) = (j.clone(), j.clone(), j.clone());
        let on_worker = rt.block_on(rt.spawn(async move { j1.queue_id("q") }));
        let panic = on_worker.expect_err("the guard fires").into_panic();
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("Journal::queue_id"), "{message}");
        assert!(message.contains("async runtime worker"), "{message}");
        let scan = rt.block_on(rt.spawn(async move { j2.scan(Space::Session, b"") }));
        assert!(scan.expect_err("every blocking read is guarded").is_panic());
        // The blocking pool, inside `allow_blocking`, may block; so may this unmarked thread.
        #[allow(clippy::disallowed_methods)] // what the broker's helper does
        let pooled = rt.block_on(rt.spawn_blocking(move || crate::allow_blocking(|| j3.queue_id("q"))));
        let q = pooled.unwrap().unwrap();
        assert_eq!(j.queue_id("q").unwrap(), q);
    }

    #[test]
    fn names_resolve_without_blocking_a_worker_and_follow_deletions() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        let rt = marked_runtime();
        let j1 = j.clone();
        let a = rt.block_on(rt.spawn(async move { j1.resolve_queue_id("q").await })).unwrap().unwrap();
        assert_eq!(j.cached_queue_id("q"), Some(a));
        assert_eq!(j.queue_id("q").unwrap(), a);
        j.write_blocking(append(a, 1)).unwrap();
        j.write_blocking(vec![Op::DeleteQueue { queue: a }]).unwrap();
        assert_eq!(j.cached_queue_id("q"), None, "a deleted queue's name is forgotten");
        let j1 = j.clone();
        let b = rt.block_on(async move { j1.resolve_queue_id("q").await }).unwrap();
        assert_ne!(a, b, "ids are never handed out twice");
        // Many resolving one new name at once get one id.
        let ids: Vec<QueueId> = rt.block_on(async {
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let j = j.clone();
                    tokio::spawn(async move { j.resolve_queue_id("new").await.unwrap() })
                })
                .collect();
            let mut ids = Vec::new();
            for t in tasks {
                ids.push(t.await.unwrap());
            }
            ids
        });
        assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
        drop(rt);
        j.crash();
        drop(j);
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        assert_eq!(j.cached_queue_id("q"), None, "the cache starts empty");
        assert_eq!(j.queue_id("q").unwrap(), b, "the mapping was in the commit log");
        assert_eq!(j.queue_id("new").unwrap(), ids[0]);
        j.verify_counters().unwrap();
    }

    #[test]
    fn completion_panic_does_not_kill_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        let q = j.queue_id("q").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(j.submit(append(q, 1), Some(Box::new(|_| panic!("boom"))))).unwrap();
        assert!(j.write_blocking(append(q, 2)).is_ok());
    }

    #[test]
    fn dropping_the_last_handle_in_a_completion_does_not_deadlock() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        let q = j.queue_id("q").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let j2 = j.clone();
        let done: Completion = Box::new(move |r| {
            drop(j2);
            tx.send(r).unwrap();
        });
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(j.submit(append(q, 1), Some(done))).unwrap();
        drop(j);
        assert!(rx.recv().unwrap().is_ok());
        // The writer stopped and released the directory.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match Journal::open(JournalConfig::new(dir.path())) {
                Ok(j) => {
                    assert_eq!(j.queue_len(q).unwrap(), 1);
                    break;
                }
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("reopen: {e}"),
            }
        }
    }

    /// Turns a directory of this layout, with these live entries, into what layout 2 left
    /// (the entries in sled's `queue` tree, no `cq/`, no `settled` tree) or, for layout 1,
    /// also no `counters` tree, no checkpoint, high-water marks in the `queue` tree (and,
    /// if given, layout 1's clean-shutdown counters); `format` saying so.
    fn make_old(
        dir: &std::path::Path,
        layout: u32,
        entries: &[(QueueId, u64, Pointer)],
        clean: Option<crate::checkpoint::Checkpoint>,
    ) {
        let db = Db::open(&dir.join("db"), 1 << 20).unwrap();
        for (q, off, p) in entries {
            db.queue.insert(crate::codec::queue_key(q.0, *off), &crate::codec::encode_pointer(p)[..]).unwrap();
        }
        db.settled.clear().unwrap();
        std::fs::remove_dir_all(dir.join("cq")).unwrap();
        if layout == 1 {
            for k in db.counters.iter().keys() {
                let k = k.unwrap();
                if let Some(crate::codec::Counter::Queue(q, next, _)) =
                    crate::codec::decode_counter(&k, &db.counters.get(&k).unwrap().unwrap())
                {
                    db.queue.insert(crate::codec::queue_hwm_key(q), &crate::codec::encode_u64(next)).unwrap();
                }
                db.counters.remove(k).unwrap();
            }
            db.db.remove(crate::checkpoint::CHECKPOINT).unwrap();
            db.db.remove(crate::checkpoint::APPLIED).unwrap();
        }
        if let Some(cp) = clean {
            db.db.insert(crate::checkpoint::KEY, cp.encode()).unwrap();
        }
        db.db.flush().unwrap();
        drop(db);
        std::fs::write(dir.join("format"), format!("ferrymq-journal {layout}\n")).unwrap();
    }

    #[test]
    fn a_migration_interrupted_before_the_stamp_is_finished_not_redone() {
        let dir = tempfile::tempdir().unwrap();
        let config = JournalConfig::new(dir.path());
        let j = Journal::open(config.clone()).unwrap();
        let q = j.queue_id("q").unwrap();
        for n in 0..5 {
            j.write_blocking(append(q, n)).unwrap();
        }
        j.write_blocking(vec![Op::Remove { queue: q, offset: 4 }, Op::Remove { queue: q, offset: 0 }]).unwrap();
        let live: Vec<_> = j.queue_entries(q, 0, 10).unwrap().into_iter().map(|(o, p)| (q, o, p)).collect();
        j.crash();
        drop(j);
        // Layout 2 had drained offsets 1 and 2 to sled; 3 lived only in the effects records.
        make_old(dir.path(), 2, &live[..2], None);
        let j = Journal::open(config.clone()).unwrap();
        assert_eq!(j.queue_len(q).unwrap(), 3);
        j.close().unwrap();
        drop(j);
        // As if it had stopped after the migration's checkpoint, before the stamp and the
        // emptying of the `queue` tree.
        let db = Db::open(&dir.path().join("db"), 1 << 20).unwrap();
        for (q, off, p) in &live[..2] {
            db.queue.insert(crate::codec::queue_key(q.0, *off), &crate::codec::encode_pointer(p)[..]).unwrap();
        }
        db.db.flush().unwrap();
        drop(db);
        std::fs::write(dir.path().join("format"), "ferrymq-journal 2\n").unwrap();
        let j = Journal::open(config).unwrap();
        let offsets: Vec<u64> = j.queue_entries(q, 0, 10).unwrap().iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, vec![1, 2, 3], "offset 3 is not taken for settled by a second import");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("format")).unwrap(),
            format!("ferrymq-journal {}\n", crate::LAYOUT)
        );
        j.verify_counters().unwrap();
    }

    #[test]
    fn a_layout_3_directory_is_stamped_and_its_effects_records_replayed() {
        // Unpadded, so that the log's length shows the records' encoding.
        let unpadded = |dir: &std::path::Path| JournalConfig { page_aligned_syncs: false, ..JournalConfig::new(dir) };
        let writes = |j: &Journal, q: QueueId| {
            j.write_blocking((0..5).flat_map(|n| append(q, n)).collect()).unwrap();
            j.write_blocking(vec![Op::Remove { queue: q, offset: 1 }, Op::Remove { queue: q, offset: 2 }]).unwrap();
        };
        let dir = tempfile::tempdir().unwrap();
        let config = unpadded(dir.path());
        let j = Journal::open(JournalConfig { write_effects_v1: true, ..config.clone() }).unwrap();
        let q = j.queue_id("q").unwrap();
        writes(&j, q);
        let live = j.queue_entries(q, 0, 10).unwrap();
        let v2 = tempfile::tempdir().unwrap();
        let current = Journal::open(unpadded(v2.path())).unwrap();
        writes(&current, current.queue_id("q").unwrap());
        assert!(current.stats().log_end < j.stats().log_end, "the records above are version 1");
        // Killed: only the version-1 effects records after the checkpoint hold the entries.
        j.crash();
        drop(j);
        std::fs::write(dir.path().join("format"), "ferrymq-journal 3\n").unwrap();
        let j = Journal::open(config).unwrap();
        assert!(!j.stats().index_scanned, "recovered by replaying the version-1 records");
        assert_eq!(j.queue_entries(q, 0, 10).unwrap(), live);
        assert_eq!(live.iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![0, 3, 4]);
        let stamped = std::fs::read_to_string(dir.path().join("format")).unwrap();
        assert_eq!(stamped, format!("ferrymq-journal {}\n", crate::LAYOUT));
        j.verify_counters().unwrap();
    }

    #[test]
    fn layout_1_and_2_directories_are_migrated_in_place() {
        // (layout, layout 1's clean-close counters, closed cleanly)
        for (layout, clean, closed) in [(1, false, true), (1, true, true), (2, false, true), (2, false, false)] {
            let dir = tempfile::tempdir().unwrap();
            let config = JournalConfig::new(dir.path());
            let j = Journal::open(config.clone()).unwrap();
            let q = j.queue_id("q").unwrap();
            let kept: Vec<_> = (0..5).map(|n| j.write_blocking(append(q, n)).unwrap().appended[0].clone()).collect();
            // The last entry removed: only the high-water mark remembers offset 4.
            j.write_blocking(vec![Op::Remove { queue: q, offset: 4 }, Op::Remove { queue: q, offset: 0 }]).unwrap();
            let live: Vec<_> = j.queue_entries(q, 0, 10).unwrap().into_iter().map(|(o, p)| (q, o, p)).collect();
            assert_eq!(live.len(), 3);
            if closed {
                j.close().unwrap();
            } else {
                // The effects records after the last checkpoint are replayed over the
                // entries moved from sled.
                j.crash();
            }
            drop(j);
            let cp = clean.then(|| crate::checkpoint::Checkpoint {
                log_end: crate::Journal::open(config.clone()).map(|j| j.stats().log_end).unwrap(),
                refs: vec![(0, 3)],
                queues: vec![(q.0, crate::state::QueueState { next: 5, len: 3 })],
            });
            make_old(dir.path(), layout, &live, cp);

            let j = Journal::open(config.clone()).unwrap();
            let why = format!("layout {layout}, clean counters {clean}, closed {closed}");
            assert_eq!(j.stats().index_scanned, layout == 1 && !clean, "{why}");
            let stamped = std::fs::read_to_string(dir.path().join("format")).unwrap();
            assert_eq!(stamped, format!("ferrymq-journal {}\n", crate::LAYOUT));
            assert_eq!(j.queue_len(q).unwrap(), 3, "{why}");
            assert_eq!(j.queue_next_offset(q), 5, "{why}");
            let offsets: Vec<u64> = j.queue_entries(q, 0, 10).unwrap().iter().map(|(o, _)| *o).collect();
            assert_eq!(offsets, vec![1, 2, 3], "{why}");
            j.verify_counters().unwrap();
            for (n, a) in kept.iter().enumerate().take(4).skip(1) {
                assert_eq!(j.read(a.pos).unwrap().body, Bytes::from(vec![n as u8; 100]));
            }
            assert_eq!(j.write_blocking(append(q, 9)).unwrap().appended[0].offsets, vec![(q, 5)]);
            j.crash();
            drop(j);
            let j = Journal::open(config).unwrap();
            assert!(!j.stats().index_scanned, "a migrated directory recovers by replay");
            assert_eq!((j.queue_len(q).unwrap(), j.queue_next_offset(q)), (4, 6));
            let offsets: Vec<u64> = j.queue_entries(q, 0, 10).unwrap().iter().map(|(o, _)| *o).collect();
            assert_eq!(offsets, vec![1, 2, 3, 5], "{why}");
            j.verify_counters().unwrap();
        }
    }
}
