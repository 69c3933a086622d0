//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use bytes::Bytes;
use ferrymq_storage::{Append, FsyncPolicy, Journal, JournalConfig, Op, QueueId, QueueTarget, Record, Timer};

/// A small-footprint configuration for tests.
pub fn config(dir: &Path, policy: FsyncPolicy) -> JournalConfig {
    let mut c = JournalConfig::new(dir);
    c.fsync = policy;
    c.segment_size = 64 * 1024;
    c.cache_bytes = 4 * 1024 * 1024;
    c
}

/// Opens a journal, panicking on error (tests only).
pub fn open(dir: &Path, policy: FsyncPolicy) -> Journal {
    Journal::open(config(dir, policy)).expect("open journal")
}

/// The body of test record `n`: deterministic, of varying length.
pub fn body(n: u64) -> Bytes {
    let len = 16 + (n * 37 % 300) as usize;
    Bytes::from((0..len).map(|i| (n as usize * 31 + i) as u8).collect::<Vec<u8>>())
}

/// An append of record `n` to `queues`.
pub fn append(n: u64, queues: &[QueueId]) -> Append {
    Append {
        record: Record { header: Bytes::copy_from_slice(&n.to_be_bytes()), body: body(n) },
        queues: queues.iter().map(|&queue| QueueTarget { queue, tag_hash: n as u32, flags: 1 }).collect(),
        retained_topic: None,
        timer: None,
        keys: None,
    }
}

/// `append` as a one-op submission.
pub fn append_op(n: u64, queues: &[QueueId]) -> Vec<Op> {
    vec![Op::Append(append(n, queues))]
}

/// A timer.
pub fn timer(due_ms: u64, target: &str) -> Option<Timer> {
    Some(Timer { due_ms, target: Bytes::copy_from_slice(target.as_bytes()) })
}

/// Asserts that the record at `pos` is record `n`.
pub fn assert_record(j: &Journal, pos: ferrymq_storage::LogPos, n: u64) {
    let r = j.read(pos).unwrap_or_else(|e| panic!("read record {n} at {pos:?}: {e}"));
    assert_eq!(&r.header[..], &n.to_be_bytes(), "header of record {n}");
    assert_eq!(r.body, body(n), "body of record {n}");
}

/// The segment files of a journal directory, oldest first.
pub fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Every file under `dir` with its contents.
pub fn files(dir: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut all = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                all.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    all
}
