//! `ferrymq-storage`: the journal of FerryMQ.
//!
//! Message bodies go to a **commit log** of our own (append-only segment files, one
//! record per message, written sequentially); everything keyed and mutable — consume-queue
//! pointer entries, retained index, timers, sessions, metadata — lives in **sled**. A message
//! routed to N queues is written to the log once and gets N small pointer entries.
//!
//! # Data flow
//!
//! ```text
//!  async callers ──submit(ops, completion)──▶ bounded channel ──▶ journal writer thread
//!                                                                 │ drain a batch
//!                                                                 │ 1. append records to the active segment
//!                                                                 │ 2. one sled batch per tree (pointers, indexes, state)
//!                                                                 │ 3. fsync segment + flush sled (policy `Always`)
//!                                                                 └ 4. run completions in submission order
//!  any thread ──read(pos) / queue_entries(..) / get(..)──▶ segment files (pread) and sled (direct)
//! ```
//!
//! Completions run on the writer thread, in the order the batches were submitted; a caller
//! that dispatches from its completion therefore sees appends in log order.
//!
//! # On-disk layout (`dir/`)
//!
//! ```text
//! dir/log/00000000000000000000.seg   commit-log segments, named by base position (20 digits)
//! dir/log/00000000000134217728.seg   ...
//! dir/db/                            the sled database
//! ```
//!
//! A record in a segment: `len: u32 BE` (of everything after the crc) | `crc32: u32 BE` (of
//! everything after itself) | `header_len: u32 BE` | `header` | `body`. A `len` of 0 marks
//! the end of the used part of a segment. Records never span segments; a record larger
//! than the segment size gets a segment of its own. A log position ([`LogPos`]) is the byte
//! offset of a record from the start of the whole log, so `segment = the last segment whose
//! base <= pos`. Positions are contiguous: a new segment's base is the end of the last
//! record of the previous one.
//!
//! When a segment is closed (rollover), the 12-byte **end marker** `0u32 | "FerryEnd"` (a
//! zero `len`, then a magic) is written after its last record; it is not part of the
//! positions. It tells recovery that the segment was closed cleanly. Retention deletes
//! whole segment files, so the positions of a deleted segment become a gap in the log.
//!
//! sled trees (all integers big-endian so that key order is numeric order):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `queue` | queue id u64, offset u64 | [`Pointer`]: pos u64, size u32, body length u32, tag hash u32, flags u8 |
//! | `queue` | queue id u64 (8-byte key) | next offset u64: the queue's high-water mark |
//! | `queue_names` | name (UTF-8) | queue id u64 |
//! | `queue_ids` | queue id u64 | name (UTF-8): reverse of `queue_names` |
//! | `retained` | topic (UTF-8) | pos u64, size u32 |
//! | `timer` | due ms u64, pos u64 | size u32, target (opaque bytes) |
//! | `key` | key hash u64 (FNV-1a), timestamp ms u64, pos u64 | size u32, key (bytes) |
//! | `key_pos` | pos u64, key hash u64, timestamp ms u64 | empty: the `key` entries by position |
//! | `kv:<space>` | opaque key | opaque value ([`Space`]: `kv:session`, `kv:inbound_qos2`, `kv:meta`, `kv:retry`, `kv:cursor`) |
//!
//! The high-water mark sorts just before the queue's entries and is written in the same
//! sled batch as the pointers, so offsets are never reused, not even after every entry of
//! a queue was removed and the journal reopened. Queue ids come from sled's
//! `generate_id` and are never handed out twice.
//!
//! # Durability
//!
//! [`FsyncPolicy`] names what survives a power loss. With `Always`, a completion runs only
//! after the records of its batch are fsynced and sled is flushed: one fsync and one sled
//! flush cover every submission drained in that batch (group commit). If writing or
//! flushing fails, the journal **poisons** itself: the failing batch and every later
//! submission complete with [`JournalError::Poisoned`] rather than acknowledging what may
//! be lost.
//!
//! # Recovery
//!
//! [`Journal::open`] scans the last segment record by record (length bounds and crc),
//! truncates a torn or corrupt tail at the last valid record, and does the same to any
//! closed segment that lacks its end marker (sealing it afterwards). Corruption inside a
//! sealed segment is not scanned for: reading such a record returns
//! [`JournalError::Corrupt`]. Then every pointer, retained entry and timer that does not
//! point inside a live segment — in particular every one at or past the valid tail — is
//! dropped (and sled flushed, so it cannot resurface). Per-segment reference counts
//! (pointers + retained + timers) and per-queue counters are rebuilt from sled — unless
//! the journal was closed cleanly: then the writer left a checkpoint of those counters
//! (`checkpoint`), which the next open uses (if the log ends where it did) and removes.
//!
//! # Retention
//!
//! On the writer thread, after batches and when idle, at most once a second: a closed
//! segment (never the active one) is deleted only when no pointer, retained entry or timer
//! refers into it and it is older than `max_age` (file modification time) or the log is
//! larger than `max_bytes` (oldest first). Reading a record of a deleted segment returns
//! [`JournalError::NotFound`].
//!
//! # Modules
//!
//! `segment` (one segment file: framing, pread, recovery scan), `log` (ordered segments,
//! reads, appends, rollover, fsync), `codec` (sled key/value encodings), `db` (sled trees
//! and read queries), `overlay` (pending sled changes of one group commit), `refs`
//! (per-segment reference counts), `retention` (which segments to delete), `recovery`
//! (log and index recovery at open), `checkpoint` (index counters left by a clean close),
//! `state` (what handles and the writer share),
//! `writer` (the writer thread).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod checkpoint;
mod codec;
mod db;
mod log;
mod overlay;
mod recovery;
mod refs;
mod retention;
mod segment;
mod state;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::oneshot;

use crate::db::Db;
use crate::log::Log;
use crate::state::Shared;
use crate::writer::{Msg, Writer};

/// When an appended record counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Completions run after the segment is fsynced and sled is flushed: survives power loss.
    Always,
    /// fsync + flush every interval; completions run after the write reaches the OS.
    /// Survives a process crash; a power loss can lose up to one interval.
    Interval(Duration),
    /// Never fsync explicitly (the OS and sled's own 500 ms flush decide). Survives a
    /// process crash once written; a power loss can lose recent writes.
    Never,
}

/// Retention limits for the commit log. A segment is deleted only when no pointer,
/// retained entry or timer refers into it **and** one of the limits is exceeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    /// Delete unreferenced closed segments older than this (by last modification).
    pub max_age: Option<Duration>,
    /// Delete the oldest unreferenced closed segments while the log is larger than this.
    pub max_bytes: Option<u64>,
}

/// Settings of a [`Journal`].
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Directory holding `log/` and `db/`; created if missing.
    pub dir: PathBuf,
    /// Target size of a commit-log segment in bytes.
    pub segment_size: u64,
    /// Durability policy.
    pub fsync: FsyncPolicy,
    /// Retention of old segments.
    pub retention: Retention,
    /// sled page-cache budget in bytes.
    pub cache_bytes: u64,
    /// Capacity of the submission channel (submissions, not ops).
    pub channel_capacity: usize,
    /// At most this many submissions are drained into one group commit.
    pub max_batch: usize,
}

impl JournalConfig {
    /// Defaults for a data directory: 128 MiB segments, `Always`, no retention limits.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        JournalConfig {
            dir: dir.into(),
            segment_size: 128 * 1024 * 1024,
            fsync: FsyncPolicy::Always,
            retention: Retention::default(),
            cache_bytes: 64 * 1024 * 1024,
            channel_capacity: 4096,
            max_batch: 1024,
        }
    }
}

/// FNV-1a (64-bit) over `parts` as if concatenated: the stable hash of the key index, and
/// the base of the broker's stable hashes. Part of the on-disk format: never change it.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Byte position of a record in the whole commit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPos(pub u64);

/// Stable numeric id of a consume queue (see [`Journal::queue_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueId(pub u64);

/// A consume-queue entry: where the record is, plus what a consumer may need without
/// reading the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pointer {
    /// Position of the record.
    pub pos: LogPos,
    /// Size of the whole record on disk (framing included).
    pub size: u32,
    /// Length of the record's body (what byte limits of queues count).
    pub body_len: u32,
    /// Hash of the message tag (0 = untagged), for server-side filtering.
    pub tag_hash: u32,
    /// Caller-defined flags (e.g. QoS, delivery state).
    pub flags: u8,
}

/// A commit-log record: an opaque header (encoded by the caller) and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Caller-encoded metadata (routing key, properties, ...).
    pub header: Bytes,
    /// Message body.
    pub body: Bytes,
}

/// A pointer to append to one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueTarget {
    /// The queue.
    pub queue: QueueId,
    /// Tag hash stored in the entry.
    pub tag_hash: u32,
    /// Flags stored in the entry.
    pub flags: u8,
}

/// A timer to create for an appended record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    /// When it is due, milliseconds since the Unix epoch.
    pub due_ms: u64,
    /// Opaque target the caller decodes when the timer fires (e.g. where to route).
    pub target: Bytes,
}

/// Append one record to the commit log and index it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Append {
    /// The record.
    pub record: Record,
    /// One pointer entry per queue; each gets the queue's next offset.
    pub queues: Vec<QueueTarget>,
    /// Also make this record the retained message of this topic.
    pub retained_topic: Option<String>,
    /// Also schedule this record.
    pub timer: Option<Timer>,
    /// Also index this record under these message keys.
    pub keys: Option<MessageKeys>,
}

/// Message keys to index a record under (see [`Journal::lookup_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageKeys {
    /// The message's timestamp (ms since the epoch): lookups select a time range.
    pub timestamp_ms: u64,
    /// The keys (any bytes; a record may have several).
    pub keys: Vec<Bytes>,
}

/// A record found by [`Journal::lookup_key`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHit {
    /// Position of the record (read it with [`Journal::read`]).
    pub pos: LogPos,
    /// Size of the record.
    pub size: u32,
    /// The timestamp it was indexed with.
    pub timestamp_ms: u64,
}

/// Keyspaces of the generic key-value state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// MQTT sessions (client id -> session state).
    Session,
    /// MQTT inbound QoS 2 packet ids awaiting PUBREL (client id + pkid -> ()).
    InboundQos2,
    /// Broker metadata (vhosts, exchanges, queues, bindings, users, ...).
    Meta,
    /// Retry state of consume-queue entries (queue id + offset -> due time, deliveries).
    Retry,
    /// Committed positions of consumer groups (stream id + group name -> offset state).
    Cursor,
}

/// One mutation of the journal. A submission is a `Vec<Op>` applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Append a record (see [`Append`]); yields an [`Appended`] in the receipt.
    Append(Append),
    /// Add pointers to an existing record (delayed delivery, dead-lettering) without
    /// writing the body again; yields an [`Appended`] in the receipt.
    ///
    /// `pos..pos + size` must lie inside a live segment's records (a record appended
    /// earlier in the same submission counts). Otherwise the **whole submission** fails
    /// with [`JournalError::NotFound`] and nothing of it is applied. Put the op that drops
    /// the record's last other reference (e.g. [`Op::DeleteTimer`]) in the same submission,
    /// after the `Enqueue`, so that retention cannot delete the segment in between.
    Enqueue {
        /// The existing record.
        pos: LogPos,
        /// Its size.
        size: u32,
        /// Length of its body.
        body_len: u32,
        /// Pointers to add.
        queues: Vec<QueueTarget>,
    },
    /// Remove one queue entry (acknowledged or dropped).
    Remove {
        /// The queue.
        queue: QueueId,
        /// The entry's offset.
        offset: u64,
    },
    /// Remove every entry of a queue with `from <= offset < to` (purge).
    RemoveRange {
        /// The queue.
        queue: QueueId,
        /// First offset removed.
        from: u64,
        /// First offset kept.
        to: u64,
    },
    /// Replace the flags of a queue entry (e.g. QoS 2 "released").
    SetFlags {
        /// The queue.
        queue: QueueId,
        /// The entry's offset.
        offset: u64,
        /// New flags.
        flags: u8,
    },
    /// Remove every entry of a queue and its name mapping. [`Journal::queue_id`] never
    /// hands the id out again; pointers for it that arrive later in the same run (a publish
    /// that raced the deletion) are dropped, i.e. missing from that append's `offsets`.
    DeleteQueue {
        /// The queue.
        queue: QueueId,
    },
    /// Remove the retained message of a topic.
    DeleteRetained {
        /// The topic.
        topic: String,
    },
    /// Schedule an existing record (a queue entry waiting for its retry) without writing
    /// it again. A no-op when `pos..pos + size` holds no live record or the same timer
    /// exists; if another timer holds the key `(due_ms, pos)`, this one is due 1 ms later
    /// (the timer as stored is what [`Journal::timers_due`] reports).
    AddTimer {
        /// When it is due, milliseconds since the Unix epoch.
        due_ms: u64,
        /// The record.
        pos: LogPos,
        /// Its size.
        size: u32,
        /// Opaque target the caller decodes when the timer fires.
        target: Bytes,
    },
    /// Remove a timer (it fired or was cancelled).
    DeleteTimer {
        /// Due time of the timer.
        due_ms: u64,
        /// Record it points to.
        pos: LogPos,
    },
    /// Set a key in a keyspace.
    Put {
        /// Keyspace.
        space: Space,
        /// Key.
        key: Bytes,
        /// Value.
        value: Bytes,
    },
    /// Remove a key from a keyspace.
    Delete {
        /// Keyspace.
        space: Space,
        /// Key.
        key: Bytes,
    },
    /// Remove every key with this prefix from a keyspace.
    DeletePrefix {
        /// Keyspace.
        space: Space,
        /// Prefix.
        prefix: Bytes,
    },
}

/// Where an [`Op::Append`] or [`Op::Enqueue`] landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Position of the record.
    pub pos: LogPos,
    /// Size of the record on disk.
    pub size: u32,
    /// The offset each target queue gave the pointer, in the order of `queues`.
    pub offsets: Vec<(QueueId, u64)>,
}

/// Result of a submission: one [`Appended`] per `Append`/`Enqueue` op, in op order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receipt {
    /// The appends of the submission.
    pub appended: Vec<Appended>,
}

/// Called once per submission on the writer thread, in submission order, when the
/// submission is durable under the policy (or failed). Must not block.
pub type Completion = Box<dyn FnOnce(Result<Receipt, JournalError>) + Send + 'static>;

/// A due timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerEntry {
    /// When it was due (ms since the epoch).
    pub due_ms: u64,
    /// The record.
    pub pos: LogPos,
    /// The record's size.
    pub size: u32,
    /// The caller's target bytes.
    pub target: Bytes,
}

/// Counters for monitoring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Live segment files.
    pub segments: u64,
    /// Bytes in live segment files.
    pub log_bytes: u64,
    /// Next log position to be written.
    pub log_end: u64,
    /// Group commits performed since open.
    pub batches: u64,
    /// fsync calls since open.
    pub fsyncs: u64,
    /// The last open rebuilt the index counters by scanning every entry (after a crash, or
    /// the first open); false when a clean-shutdown checkpoint provided them.
    pub index_scanned: bool,
}

/// Errors of the journal.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum JournalError {
    /// A write or flush failed earlier; the journal refuses writes until reopened.
    #[error("journal is poisoned after an I/O failure: {0}")]
    Poisoned(String),
    /// An I/O error (message kept as text so the error stays `Clone`).
    #[error("journal I/O error: {0}")]
    Io(String),
    /// A record failed its checksum or framing check.
    #[error("corrupt record at log position {0}")]
    Corrupt(u64),
    /// A position does not refer to a live record (deleted segment, past the end).
    #[error("no record at log position {0}")]
    NotFound(u64),
    /// sled reported an error.
    #[error("sled error: {0}")]
    Db(String),
    /// The writer thread has stopped (journal closed).
    #[error("journal is closed")]
    Closed,
}

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
    fault: Arc<std::sync::atomic::AtomicBool>,
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

/// Takes the ops and completion back out of a message that could not be sent.
fn unsent(msg: Msg) -> (Vec<Op>, Option<Completion>) {
    match msg {
        Msg::Submit { ops, done, .. } => (ops, done),
        Msg::Flush(_) | Msg::Close | Msg::Verify(_) => (Vec::new(), None),
    }
}

impl Journal {
    /// Opens (or creates) the journal in `config.dir`, recovers it and starts the writer thread.
    pub fn open(config: JournalConfig) -> Result<Journal, JournalError> {
        let log_dir = config.dir.join("log");
        std::fs::create_dir_all(&log_dir).map_err(log::io_err)?;
        log::sync_dir(&config.dir).map_err(log::io_err)?;
        // sled first: it locks the directory against a second process.
        let db = Db::open(&config.dir.join("db"), config.cache_bytes)?;
        let segments = recovery::recover_log(&log_dir)?;
        let (log, log_writer) = Log::open(&log_dir, config.segment_size, &segments)?;
        let (index, index_scanned) = match checkpoint::take(&db, log.end())? {
            Some(cp) => (recovery::index_from_checkpoint(&db, &log, cp)?, false),
            None => (recovery::recover_index(&db, &log)?, true),
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(log::io_err)?;
        let (tx, rx) = mpsc::channel(config.channel_capacity.max(1));
        let shared = Arc::new(Shared {
            config,
            log,
            db,
            queues: Mutex::new(index.queues),
            batches: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            index_scanned,
        });
        let writer = Writer::new(shared.clone(), rx, rt, log_writer, index.refs);
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
        let (tx, rx) = oneshot::channel();
        let done: Completion = Box::new(move |r| drop(tx.send(r)));
        self.inner
            .tx
            .blocking_send(Msg::Submit { ops, done: Some(done), durable: true })
            .map_err(|_| JournalError::Closed)?;
        rx.blocking_recv().unwrap_or(Err(JournalError::Closed))
    }

    /// Returns the id of the named queue, creating the mapping if needed.
    ///
    /// Ids are never handed out twice, not even after [`Op::DeleteQueue`]. A new mapping
    /// becomes durable with the next sync (in particular the one of the first write that
    /// adds pointers to the queue under [`FsyncPolicy::Always`]).
    pub fn queue_id(&self, name: &str) -> Result<QueueId, JournalError> {
        self.shared().db.queue_id(name)
    }

    /// Every known queue name with its id.
    pub fn queues(&self) -> Result<Vec<(String, QueueId)>, JournalError> {
        self.shared().db.queues()
    }

    /// Reads a record (checks its CRC). Blocking pread; cheap when the page cache has it.
    ///
    /// [`JournalError::NotFound`] if no live segment holds `pos` (deleted by retention, past
    /// the end); [`JournalError::Corrupt`] if the bytes there fail the framing or crc check.
    pub fn read(&self, pos: LogPos) -> Result<Record, JournalError> {
        self.shared().log.read(pos.0)
    }

    /// Up to `limit` records indexed under exactly `key` (see [`MessageKeys`]) with a
    /// timestamp in `from_ms..=to_ms`, oldest first. A range scan of the key index, not a
    /// log scan; records deleted by retention are not returned.
    pub fn lookup_key(&self, key: &[u8], from_ms: u64, to_ms: u64, limit: usize) -> Result<Vec<KeyHit>, JournalError> {
        let shared = self.shared();
        shared.db.lookup_key(key, from_ms, to_ms, limit, |pos, size| {
            size as u64 >= segment::RECORD_OVERHEAD && shared.log.contains(pos, size)
        })
    }

    /// Number of entries in the key index (diagnostics; counts the whole tree).
    pub fn key_index_len(&self) -> usize {
        self.shared().db.key.len()
    }

    /// Up to `limit` entries of `queue` with offset >= `from`, in offset order.
    pub fn queue_entries(&self, queue: QueueId, from: u64, limit: usize) -> Result<Vec<(u64, Pointer)>, JournalError> {
        self.shared().db.queue_entries(queue, from, limit)
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
        self.shared().db.retained()
    }

    /// Up to `limit` timers due at or before `until_ms`, earliest first.
    pub fn timers_due(&self, until_ms: u64, limit: usize) -> Result<Vec<TimerEntry>, JournalError> {
        self.shared().db.timers_due(until_ms, limit)
    }

    /// Due time of the earliest timer.
    pub fn next_timer(&self) -> Result<Option<u64>, JournalError> {
        self.shared().db.next_timer()
    }

    /// Reads a key.
    pub fn get(&self, space: Space, key: &[u8]) -> Result<Option<Bytes>, JournalError> {
        self.shared().db.get(space, key)
    }

    /// Every key/value with this prefix, in key order.
    pub fn scan(&self, space: Space, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>, JournalError> {
        self.shared().db.scan(space, prefix)
    }

    /// Current counters.
    pub fn stats(&self) -> JournalStats {
        let shared = self.shared();
        let (segments, log_bytes) = shared.log.size();
        JournalStats {
            segments,
            log_bytes,
            log_end: shared.log.end(),
            batches: shared.batches.load(Ordering::Relaxed),
            fsyncs: shared.fsyncs.load(Ordering::Relaxed),
            index_scanned: shared.index_scanned,
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
        self.inner.shutdown()
    }

    /// Diagnostics for tests: waits for everything submitted before, then recounts the
    /// per-segment references and per-queue lengths from sled on the writer thread and
    /// compares them with the in-memory counters. Blocking; a full scan of the index.
    #[doc(hidden)]
    pub fn verify_counters(&self) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.inner.tx.blocking_send(Msg::Verify(tx)).map_err(|_| "journal is closed".to_string())?;
        rx.blocking_recv().unwrap_or_else(|_| Err("journal is closed".into()))
    }

    /// Test hook: makes every later commit-log write and fsync fail.
    #[cfg(test)]
    pub(crate) fn inject_io_failure(&self) {
        self.inner.fault.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(q: QueueId, n: u8) -> Vec<Op> {
        vec![Op::Append(Append {
            record: Record { header: Bytes::new(), body: Bytes::from(vec![n; 100]) },
            queues: vec![QueueTarget { queue: q, tag_hash: 0, flags: 0 }],
            retained_topic: None,
            timer: None,
            keys: None,
        })]
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
        assert!(results.iter().all(|r| matches!(r, Err(JournalError::Poisoned(_)))));
        assert_eq!(j.queue_len(q).unwrap(), 0);
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
}
