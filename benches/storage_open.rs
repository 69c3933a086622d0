//! Journal start-up: how long `Journal::open` takes with N timers pending, after a clean
//! close (checkpoint at the end), after a crash with two checkpoint intervals of writes to
//! replay, and when the index must be scanned (no checkpoint).
//!
//! `cargo bench --bench storage_open -- [N]` (default 1,000,000; `-- 1000` is a quick check).

use std::time::Instant;

use bytes::Bytes;
use ferrymq_storage::{Append, FsyncPolicy, Journal, JournalConfig, Op, Record, Timer};

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let n: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(|a| a.replace(['_', ','], "").parse().expect("N"))
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let mut c = JournalConfig::new(dir.path());
    c.fsync = FsyncPolicy::Never;
    let j = when_unlocked(|| Journal::open(c.clone()));
    let body = Bytes::from(vec![7u8; 256]);
    let batch = |chunk: u64, count: u64| -> Vec<Op> {
        (0..count)
            .map(|i| {
                Op::Append(Append {
                    record: Record { header: Bytes::from_static(b"h"), body: body.clone() },
                    queues: Vec::new(),
                    retained_topic: None,
                    timer: Some(Timer { due_ms: u64::MAX / 2 + chunk * 1_000 + i, target: Bytes::from_static(b"/") }),
                    keys: None,
                })
            })
            .collect()
    };
    for chunk in 0..n.div_ceil(1_000) {
        j.write_blocking(batch(chunk, 1_000u64.min(n - chunk * 1_000))).unwrap();
    }
    j.close().unwrap();
    drop(j);
    let db_dir = dir.path().join("db");
    let t = Instant::now();
    drop(when_unlocked(|| sled::Config::new().path(&db_dir).cache_capacity(c.cache_bytes).open()));
    println!("sled open alone: {:?}", t.elapsed());
    let t = Instant::now();
    let j = when_unlocked(|| Journal::open(c.clone()));
    println!("journal open after a clean close: {:?} (index scanned: {})", t.elapsed(), j.stats().index_scanned);
    // Two checkpoint intervals of writes (bounded in count too), then a crash.
    let t = Instant::now();
    let (mut chunk, mut written) = (n.div_ceil(1_000), 0u64);
    while t.elapsed() < c.checkpoint_interval * 2 && written < 10_000_000 {
        j.write_blocking(batch(chunk, 1_000)).unwrap();
        chunk += 1;
        written += 1_000;
    }
    j.crash();
    drop(j);
    let t = Instant::now();
    let j = when_unlocked(|| Journal::open(c.clone()));
    println!(
        "journal open after a crash, {written} records written in the last two checkpoint intervals: {:?} (index scanned: {})",
        t.elapsed(),
        j.stats().index_scanned
    );
    j.close().unwrap();
    drop(j);
    // Remove the checkpoint, as if there never was one: the index is scanned.
    let db = when_unlocked(|| sled::Config::new().path(&db_dir).open());
    db.remove(b"ferrymq:checkpoint:v2").unwrap();
    db.flush().unwrap();
    drop(db);
    let t = Instant::now();
    let j = when_unlocked(|| Journal::open(c.clone()));
    println!("journal open with an index scan: {:?} (index scanned: {})", t.elapsed(), j.stats().index_scanned);
}

/// Opens with `open`, retrying (bounded, 10 s) while the database's file lock is still
/// held: sled's background threads let go of a dropped database's files a moment after
/// the drop, so an open right after a close may find the lock taken.
fn when_unlocked<T, E: std::fmt::Debug>(mut open: impl FnMut() -> Result<T, E>) -> T {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match open() {
            Ok(t) => return t,
            Err(e) if format!("{e:?}").contains("could not acquire lock") && Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("open failed: {e:?}"),
        }
    }
}
