//! Journal start-up: how long `Journal::open` takes with N timers pending, after a clean
//! close (checkpoint) and when the index must be scanned (as after a crash).
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
    let j = Journal::open(c.clone()).unwrap();
    let body = Bytes::from(vec![7u8; 256]);
    for chunk in 0..n.div_ceil(1_000) {
        let ops = (0..1_000u64.min(n - chunk * 1_000))
            .map(|i| {
                Op::Append(Append {
                    record: Record { header: Bytes::from_static(b"h"), body: body.clone() },
                    queues: Vec::new(),
                    retained_topic: None,
                    timer: Some(Timer { due_ms: u64::MAX / 2 + chunk * 1_000 + i, target: Bytes::from_static(b"/") }),
                    keys: None,
                })
            })
            .collect();
        j.write_blocking(ops).unwrap();
    }
    j.close().unwrap();
    drop(j);
    let db_dir = dir.path().join("db");
    let t = Instant::now();
    drop(sled::Config::new().path(&db_dir).cache_capacity(c.cache_bytes).open().unwrap());
    println!("sled open alone: {:?}", t.elapsed());
    let t = Instant::now();
    let j = Journal::open(c.clone()).unwrap();
    println!("journal open after a clean close: {:?} (index scanned: {})", t.elapsed(), j.stats().index_scanned);
    j.close().unwrap();
    drop(j);
    // Remove the checkpoint the close left, as a crash would have.
    let db = sled::Config::new().path(&db_dir).open().unwrap();
    db.remove(b"ferrymq:clean-shutdown:v1").unwrap();
    db.flush().unwrap();
    drop(db);
    let t = Instant::now();
    let j = Journal::open(c).unwrap();
    println!("journal open with an index scan: {:?} (index scanned: {})", t.elapsed(), j.stats().index_scanned);
}
