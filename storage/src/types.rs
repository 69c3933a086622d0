//! Positions, ids and what reads return: log positions, queue ids and entries, key-index
//! hits, due timers and the journal's counters.

use bytes::Bytes;

/// Byte position of a record in the whole commit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPos(pub u64);

/// Stable numeric id of a consume queue (see [`Journal::queue_id`]).
///
/// [`Journal::queue_id`]: crate::Journal::queue_id
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

/// A record found by [`Journal::lookup_key`](crate::Journal::lookup_key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHit {
    /// Position of the record (read it with [`Journal::read`](crate::Journal::read)).
    pub pos: LogPos,
    /// Size of the record on disk.
    pub size: u32,
    /// The timestamp it was indexed with.
    pub timestamp_ms: u64,
}

/// A timer as stored, reported by [`Journal::timers_due`](crate::Journal::timers_due).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerEntry {
    /// When it was due (ms since the epoch).
    pub due_ms: u64,
    /// Position of the record it schedules.
    pub pos: LogPos,
    /// That record's size on disk.
    pub size: u32,
    /// The target given when the timer was created, for the caller to decode.
    pub target: Bytes,
}

/// Counters for monitoring, from [`Journal::stats`](crate::Journal::stats).
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
    /// Commit-log `fdatasync` calls since open (one per group commit that waits for one).
    pub fsyncs: u64,
    /// Checkpoints (background sled flushes) since open.
    pub checkpoints: u64,
    /// Drains since open: the consume queues' settled offsets and the counters held in
    /// memory stored in sled (once per checkpoint interval, or sooner by
    /// `checkpoint_bytes`, while there are any).
    pub drains: u64,
    /// Batches taken back and refused because the file system was full
    /// ([`JournalError::Full`](crate::JournalError::Full)) since open.
    pub out_of_space: u64,
    /// The last open rebuilt the index counters by scanning every entry (the first open of
    /// a directory, sled ahead of a torn log, or an effects record after the checkpoint
    /// that does not read back); false when they came from the checkpoint and the commit
    /// log after it.
    pub index_scanned: bool,
    /// Commit-log sync latency, microseconds (one observation per sync of the log).
    pub fsync_micros: crate::HistogramSnapshot,
    /// Submissions per group commit.
    pub batch_submissions: crate::HistogramSnapshot,
    /// The journal refuses every write since an I/O failure (a restart is needed).
    pub poisoned: bool,
}
