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
//! base <= pos`.
//!
//! sled trees (all integers big-endian so that key order is numeric order):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `queue` | queue id u64, offset u64 | [`Pointer`]: pos u64, size u32, tag hash u32, flags u8 |
//! | `queue_names` | name (UTF-8) | queue id u64 |
//! | `retained` | topic (UTF-8) | pos u64, size u32 |
//! | `timer` | due ms u64, pos u64 | size u32, target (opaque bytes) |
//! | `kv:<space>` | opaque key | opaque value ([`Space`]) |
//!
//! # Durability
//!
//! [`FsyncPolicy`] names what survives a power loss. With `Always`, a completion runs only
//! after the records of its batch are fsynced and sled is flushed: one fsync and one sled
//! flush cover every submission drained in that batch (group commit). If writing or
//! flushing fails, the journal **poisons** itself: every later submission completes with
//! [`JournalError::Poisoned`] rather than acknowledging what may be lost.
//!
//! # Recovery
//!
//! [`Journal::open`] scans the last segment, truncates a torn or corrupt tail at the last
//! valid record, then drops every pointer, retained entry and timer that points at or
//! past the valid tail. Per-segment reference counts (pointers + retained + timers) are
//! rebuilt from sled; retention deletes a closed segment only when its count is zero and it
//! is older than `max_age` or the log is larger than `max_bytes`.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;

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
}

/// One mutation of the journal. A submission is a `Vec<Op>` applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Append a record (see [`Append`]); yields an [`Appended`] in the receipt.
    Append(Append),
    /// Add pointers to an existing record (delayed delivery, dead-lettering) without
    /// writing the body again; yields an [`Appended`] in the receipt.
    Enqueue {
        /// The existing record.
        pos: LogPos,
        /// Its size.
        size: u32,
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
    /// Replace the flags of a queue entry (e.g. QoS 2 "released").
    SetFlags {
        /// The queue.
        queue: QueueId,
        /// The entry's offset.
        offset: u64,
        /// New flags.
        flags: u8,
    },
    /// Remove every entry of a queue and its name mapping.
    DeleteQueue {
        /// The queue.
        queue: QueueId,
    },
    /// Remove the retained message of a topic.
    DeleteRetained {
        /// The topic.
        topic: String,
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
#[derive(Clone)]
pub struct Journal {
    _private: (),
}

impl Journal {
    /// Opens (or creates) the journal in `config.dir`, recovers it and starts the writer thread.
    pub fn open(config: JournalConfig) -> Result<Journal, JournalError> {
        let _ = config;
        todo!("storage implementation")
    }

    /// Queues a submission, waiting for channel capacity (back-pressure). `done` runs on the
    /// writer thread once the submission is durable under the policy (or failed).
    pub async fn submit(&self, ops: Vec<Op>, done: Option<Completion>) -> Result<(), JournalError> {
        let _ = (ops, done);
        todo!()
    }

    /// Like [`Journal::submit`] but fails with the ops handed back when the channel is full.
    pub fn try_submit(
        &self,
        ops: Vec<Op>,
        done: Option<Completion>,
    ) -> Result<(), (Vec<Op>, Option<Completion>, JournalError)> {
        let _ = (ops, done);
        todo!()
    }

    /// Submits and waits for the receipt.
    pub async fn write(&self, ops: Vec<Op>) -> Result<Receipt, JournalError> {
        let _ = ops;
        todo!()
    }

    /// Blocking variant of [`Journal::write`] for non-async callers (tests, tools).
    pub fn write_blocking(&self, ops: Vec<Op>) -> Result<Receipt, JournalError> {
        let _ = ops;
        todo!()
    }

    /// Returns the id of the named queue, creating the mapping if needed.
    pub fn queue_id(&self, name: &str) -> Result<QueueId, JournalError> {
        let _ = name;
        todo!()
    }

    /// Every known queue name with its id.
    pub fn queues(&self) -> Result<Vec<(String, QueueId)>, JournalError> {
        todo!()
    }

    /// Reads a record (checks its CRC). Blocking pread; cheap when the page cache has it.
    pub fn read(&self, pos: LogPos) -> Result<Record, JournalError> {
        let _ = pos;
        todo!()
    }

    /// Up to `limit` entries of `queue` with offset >= `from`, in offset order.
    pub fn queue_entries(
        &self,
        queue: QueueId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Pointer)>, JournalError> {
        let _ = (queue, from, limit);
        todo!()
    }

    /// The next offset `queue` will assign (0 for an empty, never-used queue).
    pub fn queue_next_offset(&self, queue: QueueId) -> u64 {
        let _ = queue;
        todo!()
    }

    /// Number of live entries in `queue`.
    pub fn queue_len(&self, queue: QueueId) -> Result<u64, JournalError> {
        let _ = queue;
        todo!()
    }

    /// Every retained message: topic and record position.
    pub fn retained(&self) -> Result<Vec<(String, LogPos)>, JournalError> {
        todo!()
    }

    /// Up to `limit` timers due at or before `until_ms`, earliest first.
    pub fn timers_due(&self, until_ms: u64, limit: usize) -> Result<Vec<TimerEntry>, JournalError> {
        let _ = (until_ms, limit);
        todo!()
    }

    /// Due time of the earliest timer.
    pub fn next_timer(&self) -> Result<Option<u64>, JournalError> {
        todo!()
    }

    /// Reads a key.
    pub fn get(&self, space: Space, key: &[u8]) -> Result<Option<Bytes>, JournalError> {
        let _ = (space, key);
        todo!()
    }

    /// Every key/value with this prefix, in key order.
    pub fn scan(&self, space: Space, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>, JournalError> {
        let _ = (space, prefix);
        todo!()
    }

    /// Current counters.
    pub fn stats(&self) -> JournalStats {
        todo!()
    }

    /// Waits until everything submitted so far is written, fsyncs and flushes regardless of
    /// policy (used at shutdown).
    pub async fn flush(&self) -> Result<(), JournalError> {
        todo!()
    }

    /// Flushes, stops the writer thread and waits for it (used at shutdown and in tests).
    pub fn close(&self) -> Result<(), JournalError> {
        todo!()
    }
}
