//! Settings of a journal: where it lives, how durable a write is, what retention deletes.

use std::path::PathBuf;
use std::time::Duration;

/// When an appended record counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Completions run after the commit-log segment is fsynced (one `fdatasync` per group
    /// commit; sled's changes are in the log too): survives power loss.
    Always,
    /// fsync every interval; completions run after the write reaches the OS.
    /// Survives a process crash; a power loss can lose up to one interval.
    Interval(Duration),
    /// Never fsync the commit log explicitly (the OS decides). Survives a
    /// process crash once written; a power loss can lose recent writes.
    Never,
}

/// Retention limits for the commit log. A segment is deleted only when no pointer,
/// retained entry or timer refers into it **and** one of the limits is exceeded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Retention {
    /// Delete unreferenced closed segments older than this (by last modification).
    pub max_age: Option<Duration>,
    /// Delete the oldest unreferenced closed segments while the log is larger than this.
    pub max_bytes: Option<u64>,
    /// Delete the oldest unreferenced closed segments, whatever their age, while the data
    /// directory's file system is fuller than this fraction (RocketMQ's
    /// `diskMaxUsedSpaceRatio`).
    pub max_disk_used_ratio: Option<f64>,
    /// Delete the oldest unreferenced closed segments, whatever their age, while the data
    /// directory's file system has less free space than this many bytes (the broker passes
    /// its disk alarm's limit: publishers wait for that space).
    pub min_disk_free_bytes: Option<u64>,
}

/// A segment is at most this fraction (1/n) of the data directory's file system...
pub(crate) const SEGMENT_SHARE_OF_FS: u64 = 8;

/// ...unless that is less than this: the cap never goes below 1 MiB.
pub(crate) const MIN_SEGMENT_CAP: u64 = 1 << 20;

/// The segment size a journal uses: `configured`, capped at [`SEGMENT_SHARE_OF_FS`] of a
/// file system of `fs_total` bytes, never capped below [`MIN_SEGMENT_CAP`] (a configured
/// size below that stays). Unknown or zero size: `configured`.
pub(crate) fn capped_segment_size(configured: u64, fs_total: Option<u64>) -> u64 {
    match fs_total {
        Some(total) if total > 0 => configured.min((total / SEGMENT_SHARE_OF_FS).max(MIN_SEGMENT_CAP)),
        _ => configured,
    }
}

/// Settings of a [`Journal`](crate::Journal).
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Directory holding `log/` and `db/`; created if missing.
    pub dir: PathBuf,
    /// Target size of a commit-log segment in bytes. [`Journal::open`] caps it at an eighth
    /// of the data directory's file system (never below 1 MiB; see
    /// [`Journal::segment_size`]), so that a small volume holds several segments and
    /// retention has closed ones to delete.
    ///
    /// [`Journal::open`]: crate::Journal::open
    /// [`Journal::segment_size`]: crate::Journal::segment_size
    pub segment_size: u64,
    /// What a completion waits for: fsync, the OS, or nothing (see [`FsyncPolicy`]).
    pub fsync: FsyncPolicy,
    /// Limits past which closed, unreferenced segments are deleted.
    pub retention: Retention,
    /// sled page-cache budget in bytes.
    pub cache_bytes: u64,
    /// Space kept in reserve in a ballast file (0 = none): given up when the file system
    /// has less free space than this at open, or than half of it while running; made again once there
    /// is room for twice its size.
    pub ballast_bytes: u64,
    /// Submissions that append are refused ([`JournalError::NoSpace`](crate::JournalError))
    /// while the file system has less free space than this (0 = never), before the commit
    /// log takes the space sled needs for its own writes.
    pub min_free_bytes: u64,
    /// Capacity of the submission channel (submissions, not ops).
    pub channel_capacity: usize,
    /// At most this many submissions are drained into one group commit.
    pub max_batch: usize,
    /// How often sled is flushed and a checkpoint recorded (sled is never flushed on the
    /// publish path): a crash replays at most two intervals of the commit log at open.
    pub checkpoint_interval: Duration,
    /// A checkpoint is also taken as soon as the commit log grew by this many bytes since
    /// the last one (0 = by time only), which bounds the replay after a crash in bytes
    /// when publishers write faster than an interval's worth.
    pub checkpoint_bytes: u64,
    /// Whether a synced group commit is padded to the next 4 KiB page boundary, so that the
    /// next sync does not write the last, partly filled page again: fewer bytes written,
    /// at the cost of up to a page of log space per sync (with small group commits the log
    /// of a backlog grows by about half again).
    pub page_aligned_syncs: bool,
}

impl JournalConfig {
    /// Defaults for a data directory: 128 MiB segments, `Always`, no retention limits, no
    /// ballast.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        JournalConfig {
            dir: dir.into(),
            segment_size: 128 * 1024 * 1024,
            fsync: FsyncPolicy::Always,
            retention: Retention::default(),
            cache_bytes: 64 * 1024 * 1024,
            ballast_bytes: 0,
            min_free_bytes: 0,
            channel_capacity: 4096,
            max_batch: 1024,
            checkpoint_interval: Duration::from_millis(100),
            checkpoint_bytes: 64 * 1024 * 1024,
            page_aligned_syncs: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_capped_at_an_eighth_of_the_file_system_never_below_a_mebibyte() {
        const MIB: u64 = 1 << 20;
        // The volume: 48 MiB, with 128 MiB segments configured.
        assert_eq!(capped_segment_size(128 * MIB, Some(48 * MIB)), 6 * MIB);
        assert_eq!(capped_segment_size(128 * MIB, Some(1024 * MIB)), 128 * MIB, "an eighth is more: as configured");
        assert_eq!(capped_segment_size(128 * MIB, Some(4 * MIB)), MIB, "the floor");
        assert_eq!(capped_segment_size(4096, Some(4 * MIB)), 4096, "a smaller size stays");
        assert_eq!(capped_segment_size(128 * MIB, None), 128 * MIB, "size unknown: as configured");
        assert_eq!(capped_segment_size(128 * MIB, Some(0)), 128 * MIB);
    }
}
