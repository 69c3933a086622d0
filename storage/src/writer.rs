//! The writer thread: drains submissions in batches and, per batch, appends the records
//! to the log followed by one effects record (the batch's sled changes, `effects`),
//! fsyncs the log according to the policy (group commit: the only synchronous write),
//! applies one sled batch per tree without flushing it (the checkpointer does), publishes
//! the queue counters and runs the completions in submission order. It also poisons the
//! journal on I/O failure and runs retention between batches.
//!
//! Every mutation of the journal happens here, so per-queue offsets and per-segment
//! reference counts need no locking beyond publishing them to readers.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, oneshot};

use crate::checkpoint::{self, Checkpointer};
use crate::codec::{self, space_index};
use crate::db::{Db, TREES};
use crate::effects;
use crate::log::LogWriter;
use crate::overlay::Overlay;
use crate::recovery;
use crate::refs::RefCounts;
use crate::retention::{self, Candidate};
use crate::segment;
use crate::state::{QueueState, Shared};
use crate::{Appended, Completion, FsyncPolicy, JournalError, LogPos, Op, Pointer, QueueId, QueueTarget, Receipt};

/// How often retention is checked (after batches and when idle).
const RETENTION_INTERVAL: Duration = Duration::from_secs(1);
/// Retention short of disk space rolls an unreferenced active segment over once it holds
/// this much, or what is missing if that is less (bounds how often it rolls).
const ROLL_FOR_SPACE_MIN: u64 = 1 << 20;
/// How long a look at the file system's free space serves appends.
const FREE_SPACE_RECHECK: Duration = Duration::from_millis(100);
/// How often opening sled again is tried while it is out of space.
const REOPEN_INTERVAL: Duration = Duration::from_millis(250);
/// Entries per block the writer reads to settle entries ([`Writer::queue_entry`]).
const READ_BLOCK: u64 = 256;
/// Queues whose last block the writer keeps.
const READ_CACHE_QUEUES: usize = 1024;
/// Free space wanted before sled is opened again (at least; also the journal's floor and
/// the ballast's size).
const REOPEN_MIN_FREE: u64 = 4 << 20;

/// A message to the writer thread.
pub(crate) enum Msg {
    /// Ops to apply, and what to call when they are durable (or failed).
    Submit {
        /// The ops, applied in order.
        ops: Vec<Op>,
        /// Called with the receipt once the ops are durable (or failed); `None`: nobody waits.
        done: Option<Completion>,
        /// Under `FsyncPolicy::Always`, the completion waits for the fsync.
        durable: bool,
    },
    /// Sync everything submitted before, regardless of policy, then answer.
    Flush(oneshot::Sender<Result<(), JournalError>>),
    /// Sync everything submitted before and stop.
    Close,
    /// Diagnostics: compare the in-memory counters with a recount from sled.
    Verify(oneshot::Sender<Result<(), String>>),
    /// Tests: stop at once, as a crash would — no sync, no checkpoint.
    Abandon,
    /// Close the active segment after everything submitted before (`Journal::roll_segment`).
    Roll(oneshot::Sender<Result<bool, JournalError>>),
    /// The id of a queue name (`Journal::queue_id`, `Journal::resolve_queue_id`): looked
    /// up, or allocated, here so that names and deletions are applied in one order.
    Resolve {
        /// The queue's name.
        name: String,
        /// Gets the id (or why there is none).
        reply: ResolveReply,
    },
}

/// Where the writer answers a [`Msg::Resolve`].
pub(crate) type ResolveReply = Box<dyn FnOnce(Result<QueueId, JournalError>) + Send>;

/// Why a submission could not be applied.
enum Fail {
    /// This submission only is refused (nothing of it was applied).
    Reject(JournalError),
    /// The commit log could not be written for lack of space: the whole batch is taken
    /// back and refused, and the journal goes on.
    NoSpace(String),
    /// sled ran out of space: the batch is refused, and so is everything until sled is
    /// opened again once space returns ([`Writer::reopen_store`]).
    StoreFull(String),
    /// I/O or sled failure: the journal poisons itself.
    Fatal(String),
}

impl Fail {
    /// What went wrong, for logs and errors.
    fn reason(&self) -> &str {
        match self {
            Fail::Reject(_) => "refused",
            Fail::NoSpace(r) | Fail::StoreFull(r) | Fail::Fatal(r) => r,
        }
    }
}

/// A failed commit-log write: out of space is cured by freeing space, anything else poisons.
fn log_write_failed(e: std::io::Error) -> Fail {
    if crate::log::is_out_of_space(&e) {
        Fail::NoSpace(format!("commit log write: {e}"))
    } else {
        Fail::Fatal(format!("commit log write: {e}"))
    }
}

/// A failed consume-queue write: out of space is handled as sled's (writes stop until
/// space returns, then the store is opened again and rebuilt from the log, the files
/// included); anything else poisons.
fn cq_write_failed(e: std::io::Error) -> Fail {
    if crate::log::is_out_of_space(&e) {
        Fail::StoreFull(format!("consume queue write: {e}"))
    } else {
        Fail::Fatal(format!("consume queue write: {e}"))
    }
}

fn sled_fatal(e: sled::Error) -> Fail {
    sled_failed("sled", e)
}

/// A sled failure: out of space is cured by opening sled again once space returns (it
/// keeps its first I/O error until then); anything else poisons.
fn sled_failed(what: &str, e: sled::Error) -> Fail {
    match &e {
        sled::Error::Io(io) if crate::log::is_out_of_space(io) => Fail::StoreFull(format!("{what}: {e}")),
        _ => Fail::Fatal(format!("{what}: {e}")),
    }
}

/// What to answer once the batch is committed.
enum Outcome {
    Submit(Option<Completion>, Result<Receipt, JournalError>),
    Flush(oneshot::Sender<Result<(), JournalError>>),
    Verify(oneshot::Sender<Result<(), String>>),
    Roll(oneshot::Sender<Result<bool, JournalError>>),
}

/// The pending changes of one group commit.
#[derive(Default)]
struct Pending {
    queue: Overlay,
    queue_names: Overlay,
    queue_ids: Overlay,
    retained: Overlay,
    timer: Overlay,
    key: Overlay,
    key_pos: Overlay,
    kv: [Overlay; 5],
    counters: Overlay,
    /// Counters of the queues touched by this batch.
    queues: HashMap<u64, QueueState>,
    /// Queues this batch deleted (their consume-queue files go once it is committed).
    deleted: Vec<u64>,
}

impl Pending {
    /// The overlays in [`Db::trees`] order.
    fn overlays(&mut self) -> [&mut Overlay; TREES] {
        let [a, b, c, d, e] = &mut self.kv;
        [
            &mut self.queue,
            &mut self.queue_names,
            &mut self.queue_ids,
            &mut self.retained,
            &mut self.timer,
            &mut self.key,
            &mut self.key_pos,
            a,
            b,
            c,
            d,
            e,
            &mut self.counters,
        ]
    }

    fn clear(&mut self) {
        for o in self.overlays() {
            o.clear();
        }
        self.queues.clear();
        self.deleted.clear();
    }
}

/// The writer thread's state.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Msg>,
    rt: tokio::runtime::Runtime,
    log: LogWriter,
    refs: RefCounts,
    pending: Pending,
    poisoned: Option<String>,
    /// Flushes sled and records checkpoints (stopped at close).
    checkpointer: Option<Checkpointer>,
    /// The effects record being encoded (reused).
    effects: Vec<u8>,
    last_sync: Instant,
    last_retention: Instant,
    /// Queue ids known to have a name mapping (cache of `queue_ids`).
    live: HashSet<u64>,
    /// Retention was left short of disk space (past the disk-use ratio or below the free
    /// minimum) at its last run.
    short_of_space: bool,
    /// ... with a log worth deleting, and said so (logged once a time).
    stuck_said: bool,
    /// The ballast file exists (see [`crate::ballast`]).
    ballast: bool,
    /// Free space of the file system when last looked at, and when.
    free_space: Option<(u64, Instant)>,
    /// When [`Writer::watch_free_space`] last looked.
    last_space_watch: Instant,
    /// The last batch was taken back for lack of space (and said so; logged once a time).
    out_of_space: bool,
    /// sled ran out of space (why): every submission is refused until it is opened again.
    store_full: Option<String>,
    /// When opening sled again was last tried.
    last_reopen: Instant,
    /// When the hot consume-queue changes were last drained to sled.
    last_drain: Instant,
    /// The log position of the last drain (for [`JournalConfig::checkpoint_bytes`]).
    ///
    /// [`JournalConfig::checkpoint_bytes`]: crate::JournalConfig::checkpoint_bytes
    drained_at: u64,
    /// Changes of the `counters` tree since the last drain (read only at open, so they
    /// wait for the drain too; the effects records hold them meanwhile).
    counters: Overlay,
    /// Blocks of consume-queue entries read for settling (one per queue: acknowledgements
    /// come mostly in offset order), dropped when the queue is written.
    read_cache: HashMap<u64, (u64, Vec<Option<Pointer>>)>,
}

impl Writer {
    /// A writer over recovered state.
    pub(crate) fn new(
        shared: Arc<Shared>,
        rx: mpsc::Receiver<Msg>,
        rt: tokio::runtime::Runtime,
        log: LogWriter,
        refs: RefCounts,
        ballast: bool,
        checkpointer: Checkpointer,
    ) -> Writer {
        let now = Instant::now();
        let drained_at = log.next_pos();
        Writer {
            shared,
            rx,
            rt,
            log,
            refs,
            pending: Pending::default(),
            poisoned: None,
            checkpointer: Some(checkpointer),
            effects: Vec::new(),
            last_sync: now,
            last_retention: now,
            live: HashSet::new(),
            short_of_space: false,
            stuck_said: false,
            ballast,
            free_space: None,
            last_space_watch: now,
            out_of_space: false,
            store_full: None,
            last_reopen: now,
            drained_at,
            last_drain: now,
            counters: Overlay::default(),
            read_cache: HashMap::new(),
        }
    }

    /// Test hook: make later log writes or syncs fail (a [`crate::log::Fault`]).
    #[cfg(test)]
    pub(crate) fn fault_switch(&self) -> Arc<crate::log::FaultSwitch> {
        self.log.fault.clone()
    }

    /// The thread's main loop; returns the result of the final sync.
    pub(crate) fn run(mut self) -> Result<(), JournalError> {
        let max_batch = self.shared.config.max_batch.max(1);
        let mut closed = false;
        loop {
            let first = match self.rx.try_recv() {
                Ok(msg) => Some(msg),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    let wait = self.idle_wait();
                    let rx = &mut self.rx;
                    // The timer must be created inside the runtime's context.
                    match self.rt.block_on(async move { tokio::time::timeout(wait, rx.recv()).await }) {
                        Ok(msg) => msg,
                        Err(_) => {
                            self.on_idle();
                            continue;
                        }
                    }
                }
            };
            // `None`: every handle is gone.
            let Some(first) = first else { break };
            if matches!(first, Msg::Abandon) {
                return self.abandon();
            }
            let mut closing = matches!(first, Msg::Close);
            let mut batch = vec![first];
            let mut abandon = false;
            while !closing && batch.len() < max_batch {
                match self.rx.try_recv() {
                    Ok(Msg::Abandon) => {
                        abandon = true;
                        break;
                    }
                    Ok(msg) => {
                        closing = matches!(msg, Msg::Close);
                        batch.push(msg);
                    }
                    Err(_) => break,
                }
            }
            self.process(batch);
            if abandon {
                return self.abandon();
            }
            if closing {
                closed = true;
                break;
            }
            self.watch_free_space();
            self.maybe_reopen_store();
            self.maybe_drain();
            self.maybe_retention();
        }
        let result = match (&self.poisoned, &self.store_full) {
            (Some(p), _) => Err(JournalError::Poisoned(p.clone())),
            (None, Some(reason)) => Err(JournalError::Full(reason.clone())),
            (None, None) => Ok(()),
        };
        let result = match result {
            Err(e) => Err(e),
            // The `Close` batch was just synced with `force`.
            Ok(()) if closed && !self.is_dirty() => Ok(()),
            Ok(()) => self.sync().map_err(|f| {
                let e = f.reason().to_string();
                self.poison(e.clone());
                JournalError::Poisoned(e)
            }),
        };
        if let Some(checkpointer) = self.checkpointer.take() {
            checkpointer.stop();
        }
        // A clean close: a checkpoint at the end, so that the next open replays nothing.
        let result = match result {
            Ok(()) => {
                let shared = self.shared.clone();
                shared.db().and_then(|db| {
                    self.drain(&db).map_err(|f| JournalError::Db(f.reason().to_string()))?;
                    // The checkpoint at the end claims the consume-queue files too.
                    if shared.cq_sync_failed.load(Ordering::Acquire) {
                        return Err(JournalError::Io(
                            "a consume-queue file failed to sync earlier: no checkpoint at close".into(),
                        ));
                    }
                    shared.cq.sync().map_err(crate::log::io_err)?;
                    checkpoint::write(&db, shared.log.end())?;
                    shared.cq.delete_doomed(u64::MAX);
                    Ok(())
                })
            }
            Err(e) => Err(e),
        };
        // Whatever is still queued was submitted after the close.
        self.refuse_queued();
        result
    }

    /// Closes the channel and refuses whatever is still queued in it.
    fn refuse_queued(&mut self) {
        self.rx.close();
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Msg::Submit { done: Some(done), .. } => complete(done, Err(JournalError::Closed)),
                Msg::Flush(tx) => drop(tx.send(Err(JournalError::Closed))),
                Msg::Roll(tx) => drop(tx.send(Err(JournalError::Closed))),
                Msg::Resolve { reply, .. } => reply(Err(JournalError::Closed)),
                Msg::Submit { done: None, .. } | Msg::Close | Msg::Verify(_) | Msg::Abandon => {}
            }
        }
    }

    /// Stops as a crash would (tests): the checkpointer without a last round, nothing
    /// synced, every queued submission refused.
    fn abandon(mut self) -> Result<(), JournalError> {
        if let Some(checkpointer) = self.checkpointer.take() {
            checkpointer.stop();
        }
        self.refuse_queued();
        Ok(())
    }

    /// How long to wait for a submission before doing idle work.
    fn idle_wait(&self) -> Duration {
        let mut wait = RETENTION_INTERVAL.saturating_sub(self.last_retention.elapsed());
        if self.ballast {
            wait = wait.min(FREE_SPACE_RECHECK.saturating_sub(self.last_space_watch.elapsed()));
        }
        if self.store_full.is_some() {
            wait = wait.min(REOPEN_INTERVAL.saturating_sub(self.last_reopen.elapsed()));
        }
        if self.has_undrained() {
            wait = wait.min(self.shared.config.checkpoint_interval.saturating_sub(self.last_drain.elapsed()));
        }
        if let FsyncPolicy::Interval(d) = self.shared.config.fsync {
            if self.is_dirty() && self.poisoned.is_none() {
                wait = wait.min(d.saturating_sub(self.last_sync.elapsed()));
            }
        }
        wait.max(Duration::from_millis(1))
    }

    /// Interval flush and retention when no submission arrives.
    fn on_idle(&mut self) {
        if let FsyncPolicy::Interval(d) = self.shared.config.fsync {
            if self.poisoned.is_none() && self.is_dirty() && self.last_sync.elapsed() >= d {
                if let Err(f) = self.sync() {
                    self.fail(f);
                }
            }
        }
        self.watch_free_space();
        self.maybe_reopen_store();
        self.maybe_drain();
        self.maybe_retention();
    }

    /// Once per checkpoint interval, or once the log grew by `checkpoint_bytes`: stores the
    /// consume queues' settled offsets and the counters in sled, so that the checkpoint can
    /// move on. Either trigger restarts both counts.
    fn maybe_drain(&mut self) {
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
    fn has_undrained(&self) -> bool {
        self.shared.cq.has_dirty()
            || self.shared.cq.has_pending()
            || !self.counters.is_empty()
            || self.shared.kv_deferred.read().iter().any(|o| !o.is_empty())
    }

    /// Moves the changes waiting in memory to sled (between batches: then sled holds
    /// everything written, and the checkpoint may say so).
    fn drain(&mut self, db: &Db) -> Result<(), Fail> {
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

    /// Whether the commit log has writes that are not fsynced.
    fn is_dirty(&self) -> bool {
        self.log.is_dirty()
    }

    fn poison(&mut self, reason: String) {
        if self.poisoned.is_none() {
            tracing::error!(%reason, "journal poisoned: refusing every further write");
            self.poisoned = Some(reason);
            self.shared.poisoned.store(true, Ordering::Relaxed);
        }
        self.pending.clear();
    }

    /// Handles a failure that is not this submission's alone: sled out of space stops
    /// writes until it is opened again; anything else poisons.
    fn fail(&mut self, f: Fail) {
        match f {
            Fail::StoreFull(reason) => {
                self.pending.clear();
                if self.store_full.is_none() {
                    tracing::warn!(
                        %reason,
                        "sled ran out of space: every write is refused until space returns and it is opened again"
                    );
                    self.shared.out_of_space.fetch_add(1, Ordering::Relaxed);
                    self.store_full = Some(reason);
                    self.last_reopen = Instant::now();
                }
                self.release_ballast();
            }
            Fail::Reject(e) => self.poison(e.to_string()),
            Fail::NoSpace(reason) | Fail::Fatal(reason) => self.poison(reason),
        }
    }

    /// Every [`REOPEN_INTERVAL`] while sled is out of space: opens it again once the file
    /// system has room.
    fn maybe_reopen_store(&mut self) {
        if self.store_full.is_none() || self.poisoned.is_some() || self.last_reopen.elapsed() < REOPEN_INTERVAL {
            return;
        }
        self.last_reopen = Instant::now();
        let config = &self.shared.config;
        let room = config.min_free_bytes.max(config.ballast_bytes).max(REOPEN_MIN_FREE);
        if fs4::available_space(&config.dir).is_ok_and(|free| free >= room) {
            self.reopen_store();
        }
    }

    /// Opens sled again (it keeps its first I/O error until then): drops the failed
    /// handle once the readers holding it let go (they wait on the lock meanwhile), opens
    /// the database as it is on disk and brings it up to the end of the log as recovery
    /// does after a crash (the effects records since the checkpoint). Queue offsets never
    /// go back. Writes go on afterwards.
    fn reopen_store(&mut self) {
        let shared = self.shared.clone();
        let mut slot = shared.db.write();
        if let Some(mut old) = slot.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => break drop(db),
                    Err(still) if Instant::now() < deadline => {
                        old = still;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(still) => {
                        tracing::warn!("sled: a reader keeps the failed handle; opening it again later");
                        *slot = Some(still);
                        return;
                    }
                }
            }
        }
        // Readers wait while the consume queues' offsets are rebuilt.
        let rebuilding = shared.cq.rebuilding();
        let opened = crate::db::Db::open(&shared.config.dir.join("db"), shared.config.cache_bytes).and_then(|db| {
            recovery::recover_state(&db, &shared.log, &shared.cq, crate::format::Found::Current)
                .map(|(index, _)| (db, index))
        });
        let (db, index) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                // (The consume queues' offsets may be half rebuilt until the next try;
                // every write is refused meanwhile.)
                tracing::warn!(error = %e, "sled could not be opened again yet; trying again");
                return;
            }
        };
        *slot = Some(Arc::new(db));
        drop(slot);
        self.refs = index.refs;
        {
            let mut queues = shared.queues.lock();
            let mut merged = index.queues;
            for (q, st) in queues.iter() {
                let e = merged.entry(*q).or_default();
                e.next = e.next.max(st.next);
            }
            *queues = merged;
        }
        self.live.clear();
        self.pending.clear();
        // The replay put them into sled and the consume queues.
        shared.cq.forget_pending();
        self.read_cache.clear();
        self.counters.clear();
        for overlay in shared.kv_deferred.write().iter_mut() {
            overlay.clear();
        }
        drop(rebuilding);
        let end = shared.log.end();
        shared.applied.store(end, Ordering::Release);
        shared.checkpointed.store(end, Ordering::Release);
        self.free_space = None;
        self.store_full = None;
        // A name allocated in a batch that was taken back may be missing from the new sled.
        shared.names.write().clear();
        tracing::info!("sled is open again after running out of space: writes go on");
    }

    /// Takes back a batch whose commit-log write ran out of space (before anything of it
    /// reached sled): its records, the segments it began, its reference counts and its
    /// pending changes. The ballast is given up so that sled has room for what earlier
    /// batches left it to write; the journal goes on, and appends succeed again once
    /// space returns.
    fn take_back(&mut self, mark: crate::log::LogMark, reason: &str) {
        self.pending.clear();
        self.refs.undo_batch();
        self.free_space = None;
        if let Err(e) = self.log.rollback(&self.shared.log, mark) {
            self.poison(format!("{reason}; then taking the batch back failed: {e}"));
            return;
        }
        self.shared.out_of_space.fetch_add(1, Ordering::Relaxed);
        if !self.out_of_space {
            tracing::warn!(%reason, "the data file system is full: publishes are refused until space returns");
            self.out_of_space = true;
        }
        self.release_ballast();
    }

    /// Gives the ballast up (sled and the commit log may use its space).
    fn release_ballast(&mut self) {
        if !self.ballast {
            return;
        }
        match std::fs::remove_file(crate::ballast::path(&self.shared.config.dir)) {
            Ok(()) => tracing::warn!(
                bytes = self.shared.config.ballast_bytes,
                "the data file system is almost full: released the ballast"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "the data file system is almost full and the ballast cannot be deleted")
            }
        }
        self.ballast = false;
    }

    /// Every [`FREE_SPACE_RECHECK`]: gives the ballast up once the file system has less
    /// free space than half the ballast's size (appends stopped at the floor before; this
    /// is someone else filling it), before sled (whose first failed write stops it until it
    /// is opened again) runs out. Half, so that the space it gives back does not lift the
    /// file system over the disk alarm's limit again at once.
    fn watch_free_space(&mut self) {
        if !self.ballast || self.last_space_watch.elapsed() < FREE_SPACE_RECHECK {
            return;
        }
        self.last_space_watch = Instant::now();
        let size = self.shared.config.ballast_bytes;
        if fs4::available_space(&self.shared.config.dir).is_ok_and(|free| free < size / 2) {
            self.release_ballast();
        }
    }

    /// Applies, commits and answers one batch.
    fn process(&mut self, batch: Vec<Msg>) {
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

    /// Recounts references and queue lengths from sled and the consume queues and compares
    /// them with the in-memory counters.
    fn verify(&self) -> Result<(), String> {
        let db = self.shared.db().map_err(|e| e.to_string())?;
        let (refs, mut lens) =
            recovery::recount(&db, &self.shared.cq, |pos| self.segment_base(pos)).map_err(|e| e.to_string())?;
        lens.retain(|_, n| *n > 0);
        if refs != self.refs {
            return Err(format!("reference counts: in memory {:?}, in sled {:?}", self.refs, refs));
        }
        let queues = self.shared.queues.lock();
        for (q, st) in queues.iter() {
            let stored = lens.get(q).copied().unwrap_or(0);
            if st.len != stored {
                return Err(format!("queue {q}: length {} in memory, {stored} in sled", st.len));
            }
        }
        for (q, len) in &lens {
            if !queues.contains_key(q) {
                return Err(format!("queue {q}: {len} entries in sled, unknown in memory"));
            }
        }
        Ok(())
    }

    /// Appends the effects record after the batch's records, writes them out, applies the
    /// sled batches (unflushed: the effects record is what makes them durable), publishes
    /// the counters and syncs the log if the policy (or `force_sync`) says so. sled may
    /// thus hold changes whose records are not fsynced yet; if a power loss takes those
    /// records, recovery sees sled's applied mark past the end of the log and scans.
    fn commit(&mut self, db: &Db, force_sync: bool, submissions: bool, durable_wanted: bool) -> Result<(), Fail> {
        self.stage_counters();
        #[cfg(test)]
        let v1 = self.shared.config.write_effects_v1;
        #[cfg(not(test))]
        let v1 = false;
        let has_effects = effects::encode(&mut self.effects, self.pending.overlays().map(|o| &*o), v1);
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
            let staged = self.shared.cq.stage(self.pending.queue.take(), true).map_err(cq_write_failed)?;
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
    fn sync(&mut self) -> Result<(), Fail> {
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

    /// Applies one submission to the pending state, all or nothing unless it fails fatally.
    fn apply_submission(&mut self, db: &Db, ops: Vec<Op>) -> Result<Receipt, Fail> {
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

    /// Refuses a submission appending `bytes` while the file system has less free space
    /// than `min_free_bytes` (looked at every [`FREE_SPACE_RECHECK`], and counted down by
    /// what is appended in between).
    fn check_free_space(&mut self, bytes: u64) -> Result<(), Fail> {
        let floor = self.shared.config.min_free_bytes;
        if floor == 0 {
            return Ok(());
        }
        // A stale look is replaced with a new one timed now (keeping its old time would
        // look again on every submission).
        let (free, at) = match self.free_space {
            Some((free, at)) if at.elapsed() < FREE_SPACE_RECHECK => (free, at),
            _ => (fs4::available_space(&self.shared.config.dir).unwrap_or(u64::MAX), Instant::now()),
        };
        if free < floor.saturating_add(bytes) {
            self.free_space = None;
            return Err(Fail::Reject(JournalError::NoSpace(floor)));
        }
        self.free_space = Some((free - bytes, at));
        Ok(())
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
    fn segment_base(&self, pos: u64) -> Option<u64> {
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

    /// True when `queue` has a name mapping (it was created by `queue_id` and not deleted).
    fn queue_is_live(&mut self, db: &Db, queue: u64) -> bool {
        if self.live.contains(&queue) {
            return true;
        }
        let key = codec::encode_u64(queue);
        let live = matches!(self.pending.queue_ids.get(&db.queue_ids, &key), Ok(Some(_)));
        if live {
            self.live.insert(queue);
        }
        live
    }

    /// The id of queue `name` as this batch sees it (a deletion earlier in the batch
    /// unmapped it), else a new one: written to sled at once, unflushed, and to this
    /// batch's effects record. Either way remembered in [`Shared::names`], which only this
    /// thread changes.
    fn resolve_name(&mut self, db: &Db, name: String) -> Result<QueueId, JournalError> {
        let mapped = self.pending.queue_names.get(&db.queue_names, name.as_bytes()).map_err(crate::db::db_err)?;
        let id = match mapped {
            Some(v) => Db::decode_queue_id(&name, &v)?,
            None => {
                let id = db.allocate_queue_id(&name)?;
                let key = codec::encode_u64(id);
                self.pending.queue_ids.insert(&key[..], name.as_bytes());
                self.pending.queue_names.insert(name.as_bytes(), &key[..]);
                self.live.insert(id);
                id
            }
        };
        self.shared.names.write().insert(name, QueueId(id));
        Ok(QueueId(id))
    }

    /// The live entry at `offset` of `queue`: this batch's change, else the consume queue's.
    fn queue_entry(&mut self, queue: u64, offset: u64) -> Result<Option<Pointer>, Fail> {
        if let Some(change) = self.pending.queue.change(&codec::queue_key(queue, offset)) {
            return Ok(change.as_deref().and_then(codec::decode_pointer));
        }
        if !self.shared.cq.is_live(queue, offset) {
            return Ok(None);
        }
        let base = offset - offset % READ_BLOCK;
        let i = (offset - base) as usize;
        if let Some((b, block)) = self.read_cache.get(&queue) {
            if *b == base {
                return Ok(block[i]);
            }
        }
        let read = self
            .shared
            .cq
            .read_block(queue, base, base + READ_BLOCK)
            .map_err(|e| Fail::Fatal(format!("consume queue read: {e}")))?;
        let mut block = vec![None; READ_BLOCK as usize];
        for (off, p) in read {
            block[(off - base) as usize] = Some(p);
        }
        let found = block[i];
        if self.read_cache.len() >= READ_CACHE_QUEUES {
            self.read_cache.clear();
        }
        self.read_cache.insert(queue, (base, block));
        Ok(found)
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
        let (lo, hi) = (codec::queue_key(queue, from), codec::queue_key(queue, to - 1));
        for (k, v) in self.pending.queue.changes_in(&lo, &hi) {
            if let Some(codec::QueueKey::Entry(_, off)) = codec::decode_queue_key(&k) {
                current.insert(off, v.as_deref().and_then(codec::decode_pointer));
            }
        }
        let mut removed = Vec::new();
        for (off, p) in current {
            if let Some(p) = p {
                self.pending.queue.remove(&codec::queue_key(queue, off)[..]);
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
            let key = codec::queue_key(q, offset);
            self.pending.queue.insert(&key[..], &codec::encode_pointer(&p)[..]);
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
            Op::Remove { queue, offset } => {
                if let Some(p) = self.queue_entry(queue.0, offset)? {
                    self.release(p.pos.0);
                    self.pending.queue.remove(&codec::queue_key(queue.0, offset)[..]);
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
                    let key = codec::queue_key(queue.0, offset);
                    self.pending.queue.insert(&key[..], &codec::encode_pointer(&p)[..]);
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

    /// The current value of a keyspace key: this batch's change, else the deferred one,
    /// else sled's.
    fn kv_get(&self, db: &Db, space: crate::Space, key: &[u8]) -> sled::Result<Option<sled::IVec>> {
        let i = space_index(space);
        if let Some(change) = self.pending.kv[i].change(key) {
            return Ok(change);
        }
        if let Some(change) = self.shared.kv_deferred.read()[i].change(key) {
            return Ok(change);
        }
        db.kv(space).get(key)
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

    /// Runs retention if limits are set and the last run is at least a second ago.
    fn maybe_retention(&mut self) {
        let config = &self.shared.config;
        if !self.ballast && config.ballast_bytes > 0 && self.last_retention.elapsed() >= RETENTION_INTERVAL {
            // Given up at open on a full disk: made again once there is room (twice its size).
            self.ballast = crate::ballast::ensure(&config.dir, config.ballast_bytes, config.ballast_bytes);
            if self.ballast {
                tracing::info!(
                    bytes = config.ballast_bytes,
                    "the data file system has room again: the ballast is back"
                );
            }
        }
        let r = &self.shared.config.retention;
        let limited = r.max_age.is_some()
            || r.max_bytes.is_some()
            || r.max_disk_used_ratio.is_some()
            || r.min_disk_free_bytes.is_some();
        if !limited || self.last_retention.elapsed() < RETENTION_INTERVAL {
            return;
        }
        self.last_retention = Instant::now();
        self.run_retention();
    }

    /// Deletes the closed, unreferenced segments the limits select. If the file system is
    /// still short of space (past the disk-use ratio, or below the free minimum) and nothing
    /// refers into the active segment, which holds what is missing (or at least
    /// [`ROLL_FOR_SPACE_MIN`]), rolls it over so that it can go too: at once if the
    /// checkpoint covers it, else at a later run. A small file system whose whole log fits
    /// in one segment thus comes back once its queues are drained.
    pub(crate) fn run_retention(&mut self) {
        let (need, freed) = self.retention_pass();
        let mut short = need > freed;
        if short && self.roll_for_space(need - freed) {
            let (need, freed) = self.retention_pass();
            short = need > freed;
        }
        // Said when the log holds something worth deleting (a log smaller than a roll is not
        // what fills the disk).
        let (_, log_bytes) = self.shared.log.size();
        let stuck = short && log_bytes >= ROLL_FOR_SPACE_MIN;
        if stuck && !self.stuck_said {
            tracing::warn!(
                need,
                log_bytes,
                "the data file system is short of space (past storage.retention_max_disk_used_ratio or below the disk free limit) and retention cannot free enough yet (the commit-log segments left are still referenced)"
            );
        }
        self.stuck_said = stuck;
        self.short_of_space = short;
    }

    /// One round of [`Writer::run_retention`]: deletes what the limits select; returns the
    /// bytes the file system should give back and the bytes deleted.
    fn retention_pass(&mut self) -> (u64, u64) {
        let shared = self.shared.clone();
        let retention = &shared.config.retention;
        // A segment holding effects records past the durable checkpoint is kept: a crash
        // would replay them.
        let checkpointed = shared.checkpointed.load(Ordering::Acquire);
        let effects_end = shared.effects_end.load(Ordering::Acquire);
        let closed: Vec<_> = shared
            .log
            .closed_segments()
            .into_iter()
            .filter(|c| retention::checkpoint_covers(c.base, c.base + c.len, checkpointed, effects_end))
            .collect();
        let dir = &shared.config.dir;
        let excess = retention.max_disk_used_ratio.map_or(0, |ratio| retention::disk_excess(dir, ratio));
        let shortfall = retention.min_disk_free_bytes.map_or(0, |min| retention::disk_shortfall(dir, min));
        let need = excess.max(shortfall);
        if closed.is_empty() {
            return (need, 0);
        }
        let (_, total) = shared.log.size();
        let candidates: Vec<Candidate> = closed
            .iter()
            .map(|c| {
                let refs = self.refs.get(c.base);
                let modified = if retention.max_age.is_some() && refs == 0 {
                    std::fs::metadata(&c.path).and_then(|m| m.modified()).ok()
                } else {
                    None
                };
                Candidate { base: c.base, len: c.len, refs, modified }
            })
            .collect();
        let chosen = retention::select(&candidates, total, retention, SystemTime::now(), need);
        let mut freed = 0;
        for base in chosen {
            match shared.log.delete_segment(base) {
                Ok(true) => {
                    self.refs.forget(base);
                    let end = closed.iter().find(|c| c.base == base).map_or(base, |c| c.base + c.len);
                    freed += end - base;
                    if let Err(e) = shared.db().and_then(|db| crate::recovery::drop_keys(&db, base..end)) {
                        tracing::warn!(segment = base, error = %e, "key index: could not drop the entries of a deleted segment");
                    }
                    tracing::info!(
                        segment = base,
                        disk_excess = excess,
                        disk_shortfall = shortfall,
                        "commit log: deleted an unreferenced segment (retention)"
                    );
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(segment = base, error = %e, "commit log: could not delete a segment"),
            }
        }
        (need, freed)
    }

    /// Rolls the active segment over for retention short of `missing` bytes, if nothing
    /// refers into it, it holds at least `missing` or [`ROLL_FOR_SPACE_MIN`] bytes, and no
    /// closed segment free of references is still waiting for the checkpoint (one rolled
    /// over before, say: it goes first). True if it rolled.
    fn roll_for_space(&mut self, missing: u64) -> bool {
        if self.poisoned.is_some() || self.store_full.is_some() {
            return false;
        }
        let base = self.log.active_base();
        let len = self.log.active_len();
        if self.refs.get(base) > 0 || len < missing.min(ROLL_FOR_SPACE_MIN) {
            return false;
        }
        let checkpointed = self.shared.checkpointed.load(Ordering::Acquire);
        let effects_end = self.shared.effects_end.load(Ordering::Acquire);
        let waiting = self.shared.log.closed_segments().iter().any(|c| {
            self.refs.get(c.base) == 0
                && !retention::checkpoint_covers(c.base, c.base + c.len, checkpointed, effects_end)
        });
        if waiting {
            return false;
        }
        match self.roll_active() {
            Ok(rolled) => {
                if rolled {
                    tracing::info!(
                        segment = base,
                        bytes = len,
                        missing,
                        "commit log: rolled the active segment over for retention (the data file system is short of space and nothing refers into it)"
                    );
                }
                rolled
            }
            Err(Fail::NoSpace(reason)) => {
                // Tried again at every run while short of space: said once a time.
                if !self.short_of_space {
                    tracing::warn!(%reason, "commit log: could not roll the active segment over for retention");
                }
                false
            }
            Err(f) => {
                self.fail(f);
                false
            }
        }
    }

    /// [`Journal::roll_segment`](crate::Journal::roll_segment), after its batch: the
    /// answer, poisoning on a failure other than a full file system.
    fn roll_on_request(&mut self) -> Result<bool, JournalError> {
        match self.roll_active() {
            Ok(rolled) => Ok(rolled),
            Err(Fail::NoSpace(reason)) => Err(JournalError::Full(reason)),
            Err(f) => {
                let reason = f.reason().to_string();
                self.fail(f);
                Err(JournalError::Poisoned(reason))
            }
        }
    }

    /// Closes the active segment if it holds any record and starts a new one (between
    /// batches), then syncs the closed one with its end marker, so that nothing written to
    /// the new segment can reach the disk before what the closed one holds. True if it
    /// rolled.
    fn roll_active(&mut self) -> Result<bool, Fail> {
        let rolled = self.log.seal(&self.shared.log).map_err(log_write_failed)?;
        if rolled {
            self.sync()?;
        }
        Ok(rolled)
    }
}

/// Runs a completion, containing a panic so that the writer thread survives it.
fn complete(done: Completion, result: Result<Receipt, JournalError>) {
    if catch_unwind(AssertUnwindSafe(move || done(result))).is_err() {
        tracing::error!("a journal completion panicked");
    }
}
