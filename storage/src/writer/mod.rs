//! The writer thread: drains submissions in batches and, per batch, appends the records
//! to the log followed by one effects record (the batch's sled changes, `effects`),
//! fsyncs the log according to the policy (group commit: the only synchronous write),
//! applies one sled batch per tree without flushing it (the checkpointer does), publishes
//! the queue counters and runs the completions in submission order. It also poisons the
//! journal on I/O failure and runs retention between batches.
//!
//! Every mutation of the journal happens here, so per-queue offsets and per-segment
//! reference counts need no locking beyond publishing them to readers.
//!
//! The work is split by job: `batch` (a drained batch applied, committed with one effects
//! record and one fsync, and answered), `apply` (what each op changes in the batch's
//! pending state), `reads` (what the writer reads for that, and the name lookups and
//! diagnostics it answers), `drain` (the changes kept in memory moved to sled once per
//! checkpoint interval), `failure` (the failure policy: poisoning, running out of space,
//! the ballast, sled opened again) and `retention` (segments deleted or rolled over).

mod apply;
mod batch;
mod drain;
mod failure;
mod reads;
mod retention;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use self::batch::complete;
use self::failure::{FREE_SPACE_RECHECK, REOPEN_INTERVAL};
use self::retention::RETENTION_INTERVAL;
use crate::checkpoint::{self, Checkpointer};
use crate::db::TREES;
use crate::log::LogWriter;
use crate::overlay::Overlay;
use crate::queue_changes::QueueChanges;
use crate::refs::RefCounts;
use crate::state::{QueueState, Shared};
use crate::{Completion, FsyncPolicy, JournalError, Op, Pointer, QueueId};

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

/// The pending changes of one group commit.
#[derive(Default)]
struct Pending {
    queue: QueueChanges,
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
    /// The overlays of [`Db::trees`], in that order (effects records number them from 1;
    /// tree 0 is the consume queues', `queue`).
    ///
    /// [`Db::trees`]: crate::db::Db::trees
    fn overlays(&mut self) -> [&mut Overlay; TREES - 1] {
        let [a, b, c, d, e] = &mut self.kv;
        [
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
        self.queue.clear();
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
                    checkpoint::write_clean_end(&db, shared.log.end())?;
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

    /// Whether the commit log has writes that are not fsynced.
    fn is_dirty(&self) -> bool {
        self.log.is_dirty()
    }
}
