//! Journal micro benchmark: appends per second of 1 KiB bodies (each with one queue pointer)
//! under `FsyncPolicy::Always` and `FsyncPolicy::Never`, with one sequential writer and
//! with many concurrent writers (group commit). Prints figures; asserts nothing.
//!
//! `cargo bench --bench storage_append -- [seconds-per-run] [always|never] [writers]`
//! (defaults: 2 s, both policies, 1, 64 and 512 writers; `-- 0.2 never 1` is a quick check).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrymq_storage::{Append, FsyncPolicy, Journal, JournalConfig, Op, QueueId, QueueTarget, Record};

fn ops(q: QueueId, body: &Bytes) -> Vec<Op> {
    vec![Op::Append(Append {
        record: Record { header: Bytes::from_static(b"topic/bench"), body: body.clone() },
        queues: vec![QueueTarget { queue: q, tag_hash: 0, flags: 1 }],
        retained_topic: None,
        timer: None,
        keys: None,
    })]
}

fn run(policy: FsyncPolicy, writers: usize, secs: f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Journal::open(JournalConfig { fsync: policy, ..JournalConfig::new(dir.path()) }).expect("open");
    let q = j.queue_id("bench").expect("queue");
    let body = Bytes::from(vec![0x5a; 1024]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..writers)
            .map(|_| {
                let (j, body, count) = (j.clone(), body.clone(), count.clone());
                tokio::spawn(async move {
                    while Instant::now() < deadline {
                        j.write(ops(q, &body)).await.expect("write");
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let n = count.load(Ordering::Relaxed);
    let s = j.stats();
    println!(
        "{:<12} writers {:>4}: {:>9.0} appends/s  ({n} appends, {} batches, {} fsyncs, {:.1} MiB/s)",
        format!("{policy:?}"),
        writers,
        n as f64 / elapsed,
        s.batches,
        s.fsyncs,
        s.log_bytes as f64 / elapsed / (1024.0 * 1024.0),
    );
    j.close().expect("close");
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let secs: f64 = args.first().map(|a| a.parse().expect("seconds per run")).unwrap_or(2.0);
    let policies = match args.get(1).map(String::as_str) {
        Some("always") => vec![FsyncPolicy::Always],
        Some("never") => vec![FsyncPolicy::Never],
        None => vec![FsyncPolicy::Always, FsyncPolicy::Never],
        Some(p) => panic!("fsync policy is `always` or `never`, not {p:?}"),
    };
    let writers = match args.get(2) {
        Some(w) => vec![w.parse().expect("writers")],
        None => vec![1, 64, 512],
    };
    for &policy in &policies {
        for &w in &writers {
            run(policy, w, secs);
        }
    }
}
