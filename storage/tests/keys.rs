//! The message key index: records appended with keys are found by key and time range
//! (a range scan of the `key` tree, not a log scan), across reopen; the index never keeps a
//! segment alive, and retention takes the entries of deleted segments with it.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use ferrymq_storage::{FsyncPolicy, Journal, LogPos, MessageKeys, Op, Retention};

fn keyed(n: u64, timestamp_ms: u64, keys: &[&str]) -> Op {
    let mut a = append(n, &[]);
    a.keys =
        Some(MessageKeys { timestamp_ms, keys: keys.iter().map(|k| Bytes::copy_from_slice(k.as_bytes())).collect() });
    Op::Append(a)
}

fn positions(j: &Journal, key: &str, from: u64, to: u64, limit: usize) -> Vec<(u64, LogPos)> {
    j.lookup_key(key.as_bytes(), from, to, limit).unwrap().into_iter().map(|h| (h.timestamp_ms, h.pos)).collect()
}

#[test]
fn records_are_found_by_key_and_time_range_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path(), FsyncPolicy::Always);
    // Timestamps out of append order; one record with two keys; a key that is a prefix
    // of another; an empty lookup.
    let r = j
        .write_blocking(vec![
            keyed(1, 3_000, &["order-1"]),
            keyed(2, 1_000, &["order-1", "customer-9"]),
            keyed(3, 2_000, &["order-10"]),
            keyed(4, 5_000, &["order-1"]),
            Op::Append(append(5, &[])),
        ])
        .unwrap();
    let pos: Vec<LogPos> = r.appended.iter().map(|a| a.pos).collect();

    // Oldest first, whatever the append order.
    assert_eq!(positions(&j, "order-1", 0, u64::MAX, 100), [(1_000, pos[1]), (3_000, pos[0]), (5_000, pos[3])]);
    assert_eq!(positions(&j, "order-1", 2_000, 4_000, 100), [(3_000, pos[0])]);
    assert_eq!(positions(&j, "order-1", 1_000, 3_000, 100), [(1_000, pos[1]), (3_000, pos[0])], "bounds included");
    assert_eq!(positions(&j, "order-1", 0, u64::MAX, 2).len(), 2, "limit");
    assert_eq!(positions(&j, "customer-9", 0, u64::MAX, 100), [(1_000, pos[1])]);
    assert_eq!(positions(&j, "order-10", 0, u64::MAX, 100), [(2_000, pos[2])]);
    assert!(positions(&j, "order-2", 0, u64::MAX, 100).is_empty());
    assert!(positions(&j, "order", 0, u64::MAX, 100).is_empty(), "exact keys, not prefixes");
    // A hit reads back as the record that was indexed.
    let hit = j.lookup_key(b"customer-9", 0, u64::MAX, 1).unwrap()[0];
    assert_eq!(hit.size, r.appended[1].size);
    assert_record(&j, hit.pos, 2);

    drop(j);
    let j = open(dir.path(), FsyncPolicy::Always);
    assert_eq!(positions(&j, "order-1", 0, u64::MAX, 100), [(1_000, pos[1]), (3_000, pos[0]), (5_000, pos[3])]);
    assert_eq!(positions(&j, "customer-9", 0, u64::MAX, 100), [(1_000, pos[1])]);
}

#[test]
fn many_keys_are_a_range_scan_away() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path(), FsyncPolicy::Never);
    // 20,000 records under 2,000 keys: each key has 10 records, 10 ms apart.
    for batch in 0..20u64 {
        let ops = (0..1_000u64)
            .map(|i| {
                let n = batch * 1_000 + i;
                keyed(n, 1_000_000 + n, &[&format!("k{}", n % 2_000)])
            })
            .collect();
        j.write_blocking(ops).unwrap();
    }
    let hits = j.lookup_key(b"k1234", 0, u64::MAX, 100).unwrap();
    let ns: Vec<u64> = hits.iter().map(|h| h.timestamp_ms - 1_000_000).collect();
    assert_eq!(ns, (0..10).map(|i| 1234 + i * 2_000).collect::<Vec<_>>());
    for (h, n) in hits.iter().zip(&ns) {
        assert_record(&j, h.pos, *n);
    }
    // A window of the time range.
    let hits = j.lookup_key(b"k1234", 1_000_000 + 5_000, 1_000_000 + 11_234, 100).unwrap();
    assert_eq!(hits.iter().map(|h| h.timestamp_ms - 1_000_000).collect::<Vec<_>>(), [5_234, 7_234, 9_234, 11_234]);
}

#[test]
fn retention_ignores_the_key_index_and_drops_its_entries() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), FsyncPolicy::Never);
    c.segment_size = 2048;
    c.retention = Retention { max_bytes: Some(4096), ..Default::default() };
    let j = Journal::open(c.clone()).unwrap();
    // Keyed records nothing else refers to: the key index alone must not keep them.
    let mut first = None;
    for n in 0..60 {
        let r = j.write_blocking(vec![keyed(n, 10 + n, &["gone"])]).unwrap();
        first.get_or_insert(r.appended[0].pos);
    }
    // Retention deletes until the log is under its limit; then nothing changes any more.
    let deadline = Instant::now() + Duration::from_secs(10);
    while j.read(first.unwrap()).is_ok() || j.stats().log_bytes > 4096 {
        assert!(Instant::now() < deadline, "retention did not bring the log under its limit: {:?}", j.stats());
        j.write_blocking(vec![]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    // Only keys of records that still exist are returned, and each reads back.
    let hits = j.lookup_key(b"gone", 0, u64::MAX, 1_000).unwrap();
    assert!(!hits.is_empty() && hits.len() < 60, "{} hits", hits.len());
    for h in &hits {
        assert_record(&j, h.pos, h.timestamp_ms - 10);
    }
    // The deleted segments' entries are gone from the index itself, not only filtered.
    assert_eq!(j.key_index_len(), hits.len());
    drop(j);
    c.retention = Retention::default();
    let j = Journal::open(c).unwrap();
    assert_eq!(j.lookup_key(b"gone", 0, u64::MAX, 1_000).unwrap(), hits);
    assert_eq!(j.key_index_len(), hits.len());
}
