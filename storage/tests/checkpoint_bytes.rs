//! Checkpoints by size: with an interval too long to matter, a commit log that grew by
//! `checkpoint_bytes` is checkpointed anyway, and a crash after it loses nothing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferrymq_storage::{FsyncPolicy, Journal};

/// Writes `n` records (about 180 bytes of body each) to queue `q` of a journal whose
/// checkpoint interval is an hour; returns the journal.
fn fill(dir: &std::path::Path, checkpoint_bytes: u64, n: u64) -> Journal {
    let mut c = config(dir, FsyncPolicy::Never);
    c.checkpoint_interval = Duration::from_secs(3600);
    c.checkpoint_bytes = checkpoint_bytes;
    let j = Journal::open(c).expect("open journal");
    let q = j.queue_id("q").unwrap();
    for i in 0..n {
        j.write_blocking(append_op(i, &[q])).unwrap();
    }
    j
}

#[test]
fn growth_by_checkpoint_bytes_takes_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let j = fill(dir.path(), 32 * 1024, 2_000);
    let deadline = Instant::now() + Duration::from_secs(10);
    while j.stats().checkpoints == 0 {
        assert!(Instant::now() < deadline, "no checkpoint after {} log bytes", j.stats().log_bytes);
        std::thread::sleep(Duration::from_millis(5));
    }
    j.crash();
    drop(j);
    let mut c = config(dir.path(), FsyncPolicy::Never);
    c.checkpoint_interval = Duration::from_secs(3600);
    let j = Journal::open(c).expect("reopen after the crash");
    let q = j.queue_id("q").unwrap();
    assert_eq!(j.queue_len(q).unwrap(), 2_000, "every record is still queued after the crash");
    assert!(!j.stats().index_scanned, "recovery started from the checkpoint, not a scan");
}

#[test]
fn without_checkpoint_bytes_only_the_interval_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let j = fill(dir.path(), 0, 2_000);
    assert_eq!(j.stats().checkpoints, 0, "a checkpoint before the interval with checkpoint_bytes = 0");
}

#[test]
fn the_size_trigger_rearms_when_there_was_nothing_to_drain() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), FsyncPolicy::Never);
    c.checkpoint_interval = Duration::from_secs(3600);
    c.checkpoint_bytes = 32 * 1024;
    let j = Journal::open(c).expect("open journal");
    // Well past checkpoint_bytes of records no queue holds: nothing waits for a drain.
    for i in 0..1_000 {
        j.write_blocking(append_op(i, &[])).unwrap();
    }
    // One queued record: far less than checkpoint_bytes since the trigger last fired, so
    // no drain and no checkpoint (a trigger left armed would drain and checkpoint now).
    let q = j.queue_id("q").unwrap();
    j.write_blocking(append_op(1_000, &[q])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        assert_eq!(j.stats().checkpoints, 0, "a checkpoint after {} log bytes", j.stats().log_bytes);
        std::thread::sleep(Duration::from_millis(5));
    }
}
