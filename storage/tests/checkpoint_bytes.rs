//! Checkpoints by size: with an interval too long to matter, a commit log that grew by
//! `checkpoint_bytes` is drained and checkpointed anyway, and a crash after it loses
//! nothing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferrymq_storage::{FsyncPolicy, Journal};

/// Opens a journal whose checkpoint interval is an hour.
fn open_hourly(dir: &std::path::Path, checkpoint_bytes: u64) -> Journal {
    let mut c = config(dir, FsyncPolicy::Never);
    c.checkpoint_interval = Duration::from_secs(3600);
    c.checkpoint_bytes = checkpoint_bytes;
    Journal::open(c).expect("open journal")
}

/// Writes records `from..to` (about 180 bytes of body each) to `queues`, then one more
/// record to no queue: once it is written, the writer has done what follows the batches
/// before it (their drain, if one was due).
fn write(j: &Journal, from: u64, to: u64, queues: &[ferrymq_storage::QueueId]) {
    for i in from..to {
        j.write_blocking(append_op(i, queues)).unwrap();
    }
    j.write_blocking(append_op(to, &[])).unwrap();
}

#[test]
fn growth_by_checkpoint_bytes_takes_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let j = open_hourly(dir.path(), 32 * 1024);
    let q = j.queue_id("q").unwrap();
    write(&j, 0, 2_000, &[q]);
    assert!(j.stats().drains > 0, "no drain after {} log bytes", j.stats().log_bytes);
    // The checkpointer's round runs on its own thread once woken.
    let deadline = Instant::now() + Duration::from_secs(10);
    while j.stats().checkpoints == 0 {
        assert!(Instant::now() < deadline, "no checkpoint after {} log bytes", j.stats().log_bytes);
        std::thread::sleep(Duration::from_millis(5));
    }
    j.crash();
    drop(j);
    let j = open_hourly(dir.path(), 0);
    let q = j.queue_id("q").unwrap();
    assert_eq!(j.queue_len(q).unwrap(), 2_000, "every record is still queued after the crash");
    assert!(!j.stats().index_scanned, "recovery started from the checkpoint, not a scan");
}

#[test]
fn without_checkpoint_bytes_only_the_interval_drains() {
    let dir = tempfile::tempdir().unwrap();
    let j = open_hourly(dir.path(), 0);
    let q = j.queue_id("q").unwrap();
    write(&j, 0, 2_000, &[q]);
    assert_eq!(j.stats().drains, 0, "a drain before the interval with checkpoint_bytes = 0");
}

#[test]
fn the_size_trigger_rearms_when_there_was_nothing_to_drain() {
    let dir = tempfile::tempdir().unwrap();
    let j = open_hourly(dir.path(), 32 * 1024);
    // Well past checkpoint_bytes of records no queue holds: nothing waits for a drain.
    write(&j, 0, 1_000, &[]);
    // One queued record: far less than checkpoint_bytes since the trigger last fired, so
    // no drain (a trigger left armed would drain after it).
    let q = j.queue_id("q").unwrap();
    write(&j, 1_000, 1_001, &[q]);
    assert_eq!(j.stats().drains, 0, "a drain after {} log bytes", j.stats().log_bytes);
}
