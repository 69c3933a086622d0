//! Group commit: concurrent writers under `FsyncPolicy::Always` share fsyncs.

mod common;

use std::collections::HashSet;

use common::*;
use ferrymq_storage::FsyncPolicy;

#[test]
fn concurrent_writes_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path(), FsyncPolicy::Always);
    let q = j.queue_id("q").unwrap();
    const TASKS: u64 = 100;
    const PER_TASK: u64 = 10;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let receipts = rt.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let j = j.clone();
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    for i in 0..PER_TASK {
                        let n = t * PER_TASK + i;
                        out.push((n, j.write(append_op(n, &[q])).await.unwrap()));
                    }
                    out
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    let writes = TASKS * PER_TASK;
    assert_eq!(receipts.len() as u64, writes);
    let stats = j.stats();
    eprintln!("group commit: {writes} writes, {} batches, {} fsyncs", stats.batches, stats.fsyncs);
    assert!(stats.fsyncs < writes, "fsyncs {} >= writes {writes}", stats.fsyncs);
    assert!(stats.batches < writes);
    let offsets: HashSet<u64> = receipts.iter().map(|(_, r)| r.appended[0].offsets[0].1).collect();
    assert_eq!(offsets.len() as u64, writes, "every write got its own offset");
    for (n, r) in &receipts {
        assert_record(&j, r.appended[0].pos, *n);
    }
    assert_eq!(j.queue_len(q).unwrap(), writes);
}

#[test]
fn completions_run_in_submission_order() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path(), FsyncPolicy::Interval(std::time::Duration::from_millis(5)));
    let q = j.queue_id("q").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for n in 0..500u64 {
        let tx = tx.clone();
        let mut ops = append_op(n, &[q]);
        let mut done: Option<ferrymq_storage::Completion> = Some(Box::new(move |r| {
            let r = r.unwrap();
            tx.send((n, r.appended[0].pos, r.appended[0].offsets[0].1)).unwrap();
        }));
        loop {
            match j.try_submit(ops, done) {
                Ok(()) => break,
                Err((o, d, _full)) => {
                    ops = o;
                    done = d;
                    std::thread::yield_now();
                }
            }
        }
    }
    drop(tx);
    let got: Vec<_> = rx.iter().collect();
    assert_eq!(got.len(), 500);
    for (i, (n, pos, off)) in got.iter().enumerate() {
        assert_eq!(*n, i as u64, "completion order");
        assert_eq!(*off, i as u64, "offset order");
        if i > 0 {
            assert!(*pos > got[i - 1].1, "log order");
        }
    }
}

#[test]
fn relaxed_submissions_do_not_wait_for_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path(), FsyncPolicy::Always);
    let q = j.queue_id("q").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let before = j.stats().fsyncs;
    rt.block_on(async {
        for n in 0..200u64 {
            let (tx, rx) = tokio::sync::oneshot::channel();
            j.submit_relaxed(append_op(n, &[q]), Some(Box::new(move |r| drop(tx.send(r))))).await.unwrap();
            rx.await.unwrap().unwrap();
        }
    });
    assert_eq!(j.stats().fsyncs, before, "relaxed writes alone never fsync under Always");
    // A durable write syncs what the relaxed ones left.
    j.write_blocking(append_op(1000, &[q])).unwrap();
    assert!(j.stats().fsyncs > before);
    assert_eq!(j.queue_len(q).unwrap(), 201);
}
