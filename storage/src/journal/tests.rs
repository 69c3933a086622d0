//! Tests of the [`Journal`] handle: group commit and padding, poisoning, running out of
//! space, timers, name resolution, the blocking guard and completions.

use super::*;
use crate::{Append, FsyncPolicy, QueueTarget};

fn append(q: QueueId, n: u8) -> Vec<Op> {
    vec![Op::Append(Append {
        record: Record { header: Bytes::new(), body: Bytes::from(vec![n; 100]) },
        queues: vec![QueueTarget { queue: q, tag_hash: 0, flags: 0 }],
        retained_topic: None,
        timer: None,
        keys: None,
    })]
}

/// Submits fifty appends at once (most in one batch) and returns their results.
fn submit_fifty(j: &Journal, q: QueueId) -> Vec<Result<Receipt, JournalError>> {
    let (tx, rx) = std::sync::mpsc::channel();
    for n in 0..50 {
        let tx = tx.clone();
        let done: Completion = Box::new(move |r| tx.send(r).unwrap());
        if j.try_submit(append(q, n), Some(done)).is_err() {
            panic!("channel full");
        }
    }
    drop(tx);
    let results: Vec<_> = rx.iter().collect();
    assert_eq!(results.len(), 50);
    results
}

#[test]
fn a_synced_group_commit_ends_on_a_page_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let config = JournalConfig::new(dir.path());
    let j = Journal::open(config.clone()).unwrap();
    let q = j.queue_id("q").unwrap();
    let mut kept = Vec::new();
    for n in 0..40u8 {
        kept.push(j.write_blocking(append(q, n)).unwrap().appended[0].pos);
        let end = j.stats().log_end;
        assert_eq!(end % crate::segment::PAGE, 0, "after commit {n}: the log ends at {end}");
    }
    // 40 commits of ~130 bytes each took 40 pages: a page per synced commit at most.
    assert_eq!(j.stats().log_end, 40 * crate::segment::PAGE);
    j.write_blocking(vec![Op::Remove { queue: q, offset: 0, at: None }]).unwrap();
    j.crash();
    drop(j);
    // The padding reads as records nobody points at: the scan and the replay pass them.
    let j = Journal::open(config).unwrap();
    assert!(!j.stats().index_scanned);
    assert_eq!(j.queue_len(q).unwrap(), 39);
    for (n, pos) in kept.iter().enumerate().skip(1) {
        assert_eq!(j.read(*pos).unwrap().body, Bytes::from(vec![n as u8; 100]));
    }
    j.verify_counters().unwrap();
}

#[test]
fn without_page_aligned_syncs_no_commit_is_padded() {
    let dir = tempfile::tempdir().unwrap();
    let config = JournalConfig { page_aligned_syncs: false, ..JournalConfig::new(dir.path()) };
    let j = Journal::open(config).unwrap();
    let q = j.queue_id("q").unwrap();
    let start = j.stats().log_end;
    for n in 0..40u8 {
        j.write_blocking(append(q, n)).unwrap();
    }
    // 40 commits of ~130 bytes: padded they would take 40 pages.
    let used = j.stats().log_end - start;
    assert!(used < 2 * crate::segment::PAGE, "40 synced commits took {used} bytes");
}

#[test]
fn io_failure_poisons_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    let q = j.queue_id("q").unwrap();
    let ok = j.write_blocking(append(q, 1)).unwrap();
    j.inject_io_failure();
    let e = j.write_blocking(append(q, 2));
    assert!(matches!(e, Err(JournalError::Poisoned(_))), "{e:?}");
    // Later submissions, of any kind, are refused too.
    let e = j.write_blocking(vec![Op::Delete { space: Space::Meta, key: Bytes::from_static(b"k") }]);
    assert!(matches!(e, Err(JournalError::Poisoned(_))), "{e:?}");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    assert!(matches!(rt.block_on(j.flush()), Err(JournalError::Poisoned(_))));
    // Reads still work; what was acknowledged is intact.
    assert_eq!(j.read(ok.appended[0].pos).unwrap().body, Bytes::from(vec![1u8; 100]));
    assert_eq!(j.queue_len(q).unwrap(), 1);
    assert!(matches!(j.close(), Err(JournalError::Poisoned(_))));
    drop(j);
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    let q = j.queue_id("q").unwrap();
    assert_eq!(j.read(ok.appended[0].pos).unwrap().body, Bytes::from(vec![1u8; 100]));
    assert_eq!(j.queue_len(q).unwrap(), 1);
    let r = j.write_blocking(append(q, 3)).unwrap();
    assert_eq!(r.appended[0].offsets, vec![(q, 1)]);
}

#[test]
fn a_full_file_system_takes_the_batch_back_and_the_journal_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = JournalConfig::new(dir.path());
    config.segment_size = 1000; // eight 100-byte records per segment
    let j = Journal::open(config.clone()).unwrap();
    let q = j.queue_id("q").unwrap();
    let kept: Vec<_> = (0..3).map(|n| j.write_blocking(append(q, n)).unwrap().appended[0].clone()).collect();
    let before = j.stats();
    let files = || std::fs::read_dir(dir.path().join("log")).unwrap().count();
    let files_before = files();

    // One submission of twenty appends and a removal: the first segment roll is
    // written, the second write of records fails for lack of space.
    j.inject(crate::log::Fault::NoSpace, 2);
    let mut ops: Vec<Op> = (10..30).flat_map(|n| append(q, n)).collect();
    ops.push(Op::Remove { queue: q, offset: 0, at: None });
    let e = j.write_blocking(ops);
    assert!(matches!(e, Err(JournalError::Full(_))), "{e:?}");
    let after = j.stats();
    assert_eq!((after.log_end, after.segments), (before.log_end, before.segments), "every record taken back");
    assert_eq!(files(), files_before, "the segment begun in the batch is deleted");
    assert_eq!(after.out_of_space, 1);
    assert_eq!(j.queue_len(q).unwrap(), 3, "the removal is taken back too");
    j.verify_counters().unwrap();
    // Still full: refused again, not poisoned; so are removals (their effects record
    // is a commit-log write too).
    assert!(matches!(j.write_blocking(append(q, 40)), Err(JournalError::Full(_))));
    let remove = vec![Op::Remove { queue: q, offset: 2, at: None }];
    assert!(matches!(j.write_blocking(remove.clone()), Err(JournalError::Full(_))));
    assert_eq!(j.stats().log_end, before.log_end);

    // Space returns: appends are acknowledged again, at the positions and offsets the
    // refused batch would have had.
    j.inject(crate::log::Fault::None, 0);
    let r = j.write_blocking(append(q, 50)).unwrap().appended[0].clone();
    assert_eq!(r.pos.0, before.log_end);
    assert_eq!(r.offsets, vec![(q, 3)]);
    j.write_blocking(remove).unwrap();
    for (n, a) in kept.iter().enumerate() {
        assert_eq!(j.read(a.pos).unwrap().body, Bytes::from(vec![n as u8; 100]));
    }
    assert_eq!(j.read(r.pos).unwrap().body, Bytes::from(vec![50u8; 100]));
    assert_eq!(j.queue_len(q).unwrap(), 3);
    j.verify_counters().unwrap();
    j.close().unwrap();
    drop(j);
    let j = Journal::open(config).unwrap();
    assert_eq!(j.queue_len(q).unwrap(), 3);
    let entries: Vec<u64> = j.queue_entries(q, 0, 10).unwrap().iter().map(|(o, _)| *o).collect();
    assert_eq!(entries, vec![0, 1, 3]);
    assert_eq!(j.read(r.pos).unwrap().body, Bytes::from(vec![50u8; 100]));
    j.verify_counters().unwrap();
}

#[test]
fn sled_out_of_space_refuses_writes_until_it_is_opened_again() {
    let dir = tempfile::tempdir().unwrap();
    let config = JournalConfig::new(dir.path());
    let j = Journal::open(config.clone()).unwrap();
    let q = j.queue_id("q").unwrap();
    let kept: Vec<_> = (0..2).map(|n| j.write_blocking(append(q, n)).unwrap().appended[0].clone()).collect();
    j.inject(crate::log::Fault::StoreFull, 0);
    assert!(matches!(j.write_blocking(append(q, 2)), Err(JournalError::Full(_))));
    assert!(matches!(j.write_blocking(vec![Op::Remove { queue: q, offset: 0, at: None }]), Err(JournalError::Full(_))));
    // Reads go on meanwhile.
    assert_eq!(j.queue_entries(q, 0, 10).unwrap().len(), 2);
    assert_eq!(j.read(kept[1].pos).unwrap().body, Bytes::from(vec![1u8; 100]));

    // Space returns: sled is opened again within a bounded time and writes go on.
    j.inject(crate::log::Fault::None, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let r = loop {
        match j.write_blocking(append(q, 3)) {
            Ok(r) => break r.appended[0].clone(),
            Err(JournalError::Full(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("after space returned: {e}"),
        }
    };
    assert_eq!(r.offsets, vec![(q, 2)], "the refused append took no offset");
    let offsets: Vec<u64> = j.queue_entries(q, 0, 10).unwrap().iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, vec![0, 1, 2]);
    assert_eq!(j.queue_len(q).unwrap(), 3);
    j.verify_counters().unwrap();
    assert_eq!(j.queue_id("q").unwrap(), q);
    assert!(j.stats().out_of_space >= 1);
    j.close().unwrap();
    drop(j);
    let j = Journal::open(config).unwrap();
    assert_eq!(j.queue_len(q).unwrap(), 3);
    assert_eq!(j.read(r.pos).unwrap().body, Bytes::from(vec![3u8; 100]));
    j.verify_counters().unwrap();
}

#[test]
fn an_out_of_space_batch_fails_every_submission_in_it_and_only_those() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = JournalConfig::new(dir.path());
    config.fsync = FsyncPolicy::Never;
    let j = Journal::open(config).unwrap();
    let q = j.queue_id("q").unwrap();
    j.inject(crate::log::Fault::NoSpace, 0);
    let results = submit_fifty(&j, q);
    assert!(results.iter().all(|r| matches!(r, Err(JournalError::Full(_)))), "{results:?}");
    assert_eq!(j.queue_len(q).unwrap(), 0);
    j.inject(crate::log::Fault::None, 0);
    assert_eq!(j.write_blocking(append(q, 1)).unwrap().appended[0].offsets, vec![(q, 0)]);
    j.verify_counters().unwrap();
}

#[test]
fn add_timer_schedules_an_existing_record() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    let q = j.queue_id("q").unwrap();
    let a = j.write_blocking(append(q, 1)).unwrap().appended[0].clone();
    let timer = |due_ms, target: &'static [u8]| Op::AddTimer {
        due_ms,
        pos: a.pos,
        size: a.size,
        target: Bytes::from_static(target),
    };
    // The same timer twice is one timer; another target at the same key moves 1 ms on;
    // a position that holds no record is ignored without failing the submission.
    let nowhere = Op::AddTimer { due_ms: 5, pos: LogPos(1 << 40), size: 100, target: Bytes::new() };
    j.write_blocking(vec![timer(100, b"a"), timer(100, b"a"), timer(100, b"b"), nowhere]).unwrap();
    let due = j.timers_due(u64::MAX, 10).unwrap();
    let seen: Vec<(u64, &[u8])> = due.iter().map(|t| (t.due_ms, &t.target[..])).collect();
    assert_eq!(seen, vec![(100, &b"a"[..]), (101, &b"b"[..])]);
    j.verify_counters().unwrap();
    // Timers keep the record alive on their own; they survive a reopen.
    j.write_blocking(vec![Op::Remove { queue: q, offset: 0, at: None }]).unwrap();
    j.close().unwrap();
    drop(j);
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    assert_eq!(j.timers_due(u64::MAX, 10).unwrap(), due);
    assert_eq!(j.read(a.pos).unwrap().body, Bytes::from(vec![1u8; 100]));
    j.write_blocking(due.iter().map(|t| Op::DeleteTimer { due_ms: t.due_ms, pos: t.pos }).collect()).unwrap();
    assert!(j.timers_due(u64::MAX, 10).unwrap().is_empty());
    j.verify_counters().unwrap();
}

#[test]
fn poison_fails_the_whole_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = JournalConfig::new(dir.path());
    config.fsync = FsyncPolicy::Never;
    let j = Journal::open(config).unwrap();
    let q = j.queue_id("q").unwrap();
    j.inject_io_failure();
    let results = submit_fifty(&j, q);
    assert!(results.iter().all(|r| matches!(r, Err(JournalError::Poisoned(_)))));
    assert_eq!(j.queue_len(q).unwrap(), 0);
}

/// A runtime whose worker (and blocking-pool) threads are marked, as the broker's are.
fn marked_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(crate::forbid_blocking)
        .build()
        .unwrap()
}

#[test]
#[cfg(debug_assertions)]
fn a_blocking_call_on_a_runtime_worker_panics_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    let rt = marked_runtime();
    let (j1, j2, j3) = (j.clone(), j.clone(), j.clone());
    let on_worker = rt.block_on(rt.spawn(async move { j1.queue_id("q") }));
    let panic = on_worker.expect_err("the guard fires").into_panic();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("Journal::queue_id"), "{message}");
    assert!(message.contains("async runtime worker"), "{message}");
    let scan = rt.block_on(rt.spawn(async move { j2.scan(Space::Session, b"") }));
    assert!(scan.expect_err("every blocking read is guarded").is_panic());
    // The blocking pool, inside `allow_blocking`, may block; so may this unmarked thread.
    #[allow(clippy::disallowed_methods)] // what the broker's helper does
    let pooled = rt.block_on(rt.spawn_blocking(move || crate::allow_blocking(|| j3.queue_id("q"))));
    let q = pooled.unwrap().unwrap();
    assert_eq!(j.queue_id("q").unwrap(), q);
}

#[test]
fn names_resolve_without_blocking_a_worker_and_follow_deletions() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    let rt = marked_runtime();
    let j1 = j.clone();
    let a = rt.block_on(rt.spawn(async move { j1.resolve_queue_id("q").await })).unwrap().unwrap();
    assert_eq!(j.cached_queue_id("q"), Some(a));
    assert_eq!(j.queue_id("q").unwrap(), a);
    j.write_blocking(append(a, 1)).unwrap();
    j.write_blocking(vec![Op::DeleteQueue { queue: a }]).unwrap();
    assert_eq!(j.cached_queue_id("q"), None, "a deleted queue's name is forgotten");
    let j1 = j.clone();
    let b = rt.block_on(async move { j1.resolve_queue_id("q").await }).unwrap();
    assert_ne!(a, b, "ids are never handed out twice");
    // Many resolving one new name at once get one id.
    let ids: Vec<QueueId> = rt.block_on(async {
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let j = j.clone();
                tokio::spawn(async move { j.resolve_queue_id("new").await.unwrap() })
            })
            .collect();
        let mut ids = Vec::new();
        for t in tasks {
            ids.push(t.await.unwrap());
        }
        ids
    });
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    drop(rt);
    j.crash();
    drop(j);
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    assert_eq!(j.cached_queue_id("q"), None, "the cache starts empty");
    assert_eq!(j.queue_id("q").unwrap(), b, "the mapping was in the commit log");
    assert_eq!(j.queue_id("new").unwrap(), ids[0]);
    j.verify_counters().unwrap();
}

#[test]
fn completion_panic_does_not_kill_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    let q = j.queue_id("q").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(j.submit(append(q, 1), Some(Box::new(|_| panic!("boom"))))).unwrap();
    assert!(j.write_blocking(append(q, 2)).is_ok());
}

#[test]
fn dropping_the_last_handle_in_a_completion_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
    let q = j.queue_id("q").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let j2 = j.clone();
    let done: Completion = Box::new(move |r| {
        drop(j2);
        tx.send(r).unwrap();
    });
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(j.submit(append(q, 1), Some(done))).unwrap();
    drop(j);
    assert!(rx.recv().unwrap().is_ok());
    // The writer stopped and released the directory.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match Journal::open(JournalConfig::new(dir.path())) {
            Ok(j) => {
                assert_eq!(j.queue_len(q).unwrap(), 1);
                break;
            }
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("reopen: {e}"),
        }
    }
}
