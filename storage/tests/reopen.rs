//! Everything written survives close + reopen, and queue offsets continue.

mod common;

use bytes::Bytes;
use common::*;
use ferrymq_storage::{FsyncPolicy, JournalError, LogPos, Op, QueueTarget, Space};

#[test]
fn reopen_after_close_and_drop() {
    let dir = tempfile::tempdir().unwrap();
    let (qa, qb, positions, timer_pos);
    {
        let j = open(dir.path(), FsyncPolicy::Always);
        qa = j.queue_id("a").unwrap();
        qb = j.queue_id("b").unwrap();
        assert_ne!(qa, qb);
        assert_eq!(j.queue_id("a").unwrap(), qa);
        let mut pos = Vec::new();
        for n in 0..10 {
            let r = j.write_blocking(append_op(n, &[qa])).unwrap();
            assert_eq!(r.appended.len(), 1);
            assert_eq!(r.appended[0].offsets, vec![(qa, n)]);
            pos.push(r.appended[0].pos);
        }
        // One submission with several ops: fan-out, retained, timer, KV.
        let mut a = append(10, &[qa, qb]);
        a.retained_topic = Some("t/1".into());
        let mut t = append(11, &[]);
        t.timer = timer(5_000, "target-x");
        let r = j
            .write_blocking(vec![
                Op::Append(a),
                Op::Append(t),
                Op::Put { space: Space::Session, key: Bytes::from_static(b"c1"), value: Bytes::from_static(b"s1") },
                Op::Put { space: Space::Meta, key: Bytes::from_static(b"m/x"), value: Bytes::from_static(b"1") },
                Op::Put { space: Space::Meta, key: Bytes::from_static(b"m/y"), value: Bytes::from_static(b"2") },
                Op::Put { space: Space::InboundQos2, key: Bytes::from_static(b"c1/7"), value: Bytes::new() },
            ])
            .unwrap();
        assert_eq!(r.appended.len(), 2);
        assert_eq!(r.appended[0].offsets, vec![(qa, 10), (qb, 0)]);
        pos.push(r.appended[0].pos);
        pos.push(r.appended[1].pos);
        timer_pos = r.appended[1].pos;
        positions = pos;
        // Remove, set flags, and empty queue b entirely (its offsets must not restart).
        j.write_blocking(vec![
            Op::Remove { queue: qa, offset: 0, at: None },
            Op::SetFlags { queue: qa, offset: 1, flags: 7 },
            Op::Remove { queue: qb, offset: 0, at: None },
            Op::Remove { queue: qb, offset: 99, at: None }, // no such entry: a no-op
        ])
        .unwrap();
        assert_eq!(j.queue_len(qa).unwrap(), 10);
        assert_eq!(j.queue_len(qb).unwrap(), 0);
        assert_eq!(j.queue_next_offset(qb), 1);
        j.close().unwrap();
        assert_eq!(j.write_blocking(append_op(99, &[qa])), Err(JournalError::Closed));
        j.close().unwrap(); // idempotent
    }

    let j = open(dir.path(), FsyncPolicy::Always);
    let mut names = j.queues().unwrap();
    names.sort();
    assert_eq!(names, vec![("a".to_string(), qa), ("b".to_string(), qb)]);
    let entries = j.queue_entries(qa, 0, 100).unwrap();
    assert_eq!(entries.len(), 10);
    assert_eq!(entries[0].0, 1);
    assert_eq!(entries[0].1.flags, 7);
    assert_eq!(entries[1].1.flags, 1);
    for (off, p) in &entries {
        assert_eq!(p.pos, positions[*off as usize]);
        assert_eq!(p.tag_hash, *off as u32);
        assert_record(&j, p.pos, *off);
    }
    assert_eq!(j.queue_entries(qa, 5, 2).unwrap().iter().map(|e| e.0).collect::<Vec<_>>(), vec![5, 6]);
    assert_eq!(j.queue_len(qa).unwrap(), 10);
    assert_eq!(j.queue_next_offset(qa), 11);
    assert_eq!(j.queue_next_offset(qb), 1, "high-water mark of an emptied queue survives reopen");
    assert_eq!(j.retained().unwrap(), vec![("t/1".to_string(), positions[10])]);
    let timers = j.timers_due(u64::MAX, 10).unwrap();
    assert_eq!(timers.len(), 1);
    assert_eq!((timers[0].due_ms, timers[0].pos), (5_000, timer_pos));
    assert_eq!(&timers[0].target[..], b"target-x");
    assert_eq!(timers[0].size as u64, 12 + 8 + body(11).len() as u64);
    assert!(j.timers_due(4_999, 10).unwrap().is_empty());
    assert_eq!(j.next_timer().unwrap(), Some(5_000));
    assert_record(&j, timer_pos, 11);
    assert_eq!(j.get(Space::Session, b"c1").unwrap().as_deref(), Some(&b"s1"[..]));
    assert_eq!(j.get(Space::Session, b"c2").unwrap(), None);
    assert_eq!(j.scan(Space::Meta, b"m/").unwrap().len(), 2);
    assert_eq!(j.scan(Space::InboundQos2, b"c1/").unwrap().len(), 1);

    // Offsets continue, positions continue.
    let end = j.stats().log_end;
    let r = j.write_blocking(append_op(20, &[qa, qb])).unwrap();
    assert_eq!(r.appended[0].offsets, vec![(qa, 11), (qb, 1)]);
    assert_eq!(r.appended[0].pos, LogPos(end));
    assert_record(&j, r.appended[0].pos, 20);
}

#[test]
fn ops_semantics() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path(), FsyncPolicy::Never);
    let q = j.queue_id("q").unwrap();
    let dlq = j.queue_id("dlq").unwrap();

    // Retained replacement, delete.
    let mut a = append(1, &[]);
    a.retained_topic = Some("x".into());
    let p1 = j.write_blocking(vec![Op::Append(a.clone())]).unwrap().appended[0].pos;
    a.record = append(2, &[]).record;
    let p2 = j.write_blocking(vec![Op::Append(a)]).unwrap().appended[0].pos;
    assert_ne!(p1, p2);
    assert_eq!(j.retained().unwrap(), vec![("x".to_string(), p2)]);
    j.write_blocking(vec![Op::DeleteRetained { topic: "x".into() }]).unwrap();
    assert!(j.retained().unwrap().is_empty());

    // Enqueue an existing record (dead-lettering); a dead position fails the whole submission.
    let r = j.write_blocking(append_op(3, &[q])).unwrap();
    let (pos, size) = (r.appended[0].pos, r.appended[0].size);
    let r = j
        .write_blocking(vec![Op::Enqueue {
            pos,
            size,
            body_len: 0,
            queues: vec![QueueTarget { queue: dlq, tag_hash: 9, flags: 2 }],
        }])
        .unwrap();
    assert_eq!(r.appended[0].offsets, vec![(dlq, 0)]);
    let bad = j.write_blocking(vec![
        Op::Remove { queue: q, offset: 0, at: None },
        Op::Enqueue {
            pos: LogPos(1 << 40),
            size,
            body_len: 0,
            queues: vec![QueueTarget { queue: dlq, tag_hash: 0, flags: 0 }],
        },
    ]);
    assert_eq!(bad, Err(JournalError::NotFound(1 << 40)));
    assert_eq!(j.queue_len(q).unwrap(), 1, "nothing of a refused submission is applied");
    assert_eq!(j.queue_entries(dlq, 0, 10).unwrap()[0].1.pos, pos);

    // Enqueue of a record appended earlier in the same submission.
    let mut with_timer = append(4, &[]);
    with_timer.timer = timer(10, "t");
    let next = j.stats().log_end;
    let size4 = 12 + 8 + body(4).len() as u32;
    let r = j
        .write_blocking(vec![
            Op::Append(with_timer),
            Op::Enqueue {
                pos: LogPos(next),
                size: size4,
                body_len: 0,
                queues: vec![QueueTarget { queue: q, tag_hash: 0, flags: 0 }],
            },
            Op::DeleteTimer { due_ms: 10, pos: LogPos(next) },
        ])
        .unwrap();
    assert_eq!(r.appended[0].pos, LogPos(next));
    assert_eq!(r.appended[1].offsets, vec![(q, 1)]);
    assert!(j.timers_due(u64::MAX, 10).unwrap().is_empty());

    // KV delete and delete-prefix, including keys written in the same submission.
    j.write_blocking(vec![
        Op::Put { space: Space::Session, key: Bytes::from_static(b"a/1"), value: Bytes::from_static(b"1") },
        Op::Put { space: Space::Session, key: Bytes::from_static(b"a/2"), value: Bytes::from_static(b"2") },
        Op::Put { space: Space::Session, key: Bytes::from_static(b"b/1"), value: Bytes::from_static(b"3") },
    ])
    .unwrap();
    j.write_blocking(vec![
        Op::Put { space: Space::Session, key: Bytes::from_static(b"a/3"), value: Bytes::from_static(b"4") },
        Op::DeletePrefix { space: Space::Session, prefix: Bytes::from_static(b"a/") },
        Op::Put { space: Space::Session, key: Bytes::from_static(b"a/4"), value: Bytes::from_static(b"5") },
        Op::Delete { space: Space::Session, key: Bytes::from_static(b"b/1") },
    ])
    .unwrap();
    let keys: Vec<Bytes> = j.scan(Space::Session, b"").unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![Bytes::from_static(b"a/4")]);

    // DeleteQueue drops entries and the name; queue_id then hands out a new id.
    j.write_blocking(vec![Op::DeleteQueue { queue: q }]).unwrap();
    assert_eq!(j.queue_len(q).unwrap(), 0);
    assert!(j.queue_entries(q, 0, 10).unwrap().is_empty());
    assert_eq!(j.queue_next_offset(q), 0);
    assert_eq!(j.queues().unwrap(), vec![("dlq".to_string(), dlq)]);
    let q2 = j.queue_id("q").unwrap();
    assert_ne!(q2, q);

    // Async API.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let r = j.write(append_op(5, &[q2])).await.unwrap();
        assert_eq!(r.appended[0].offsets, vec![(q2, 0)]);
        let (tx, rx) = tokio::sync::oneshot::channel();
        j.submit(append_op(6, &[q2]), Some(Box::new(move |r| drop(tx.send(r))))).await.unwrap();
        assert_eq!(rx.await.unwrap().unwrap().appended[0].offsets, vec![(q2, 1)]);
        j.submit(vec![Op::Remove { queue: q2, offset: 0, at: None }], None).await.unwrap();
        j.flush().await.unwrap();
        assert_eq!(j.queue_len(q2).unwrap(), 1);
    });
    let (tx, rx) = std::sync::mpsc::channel();
    match j.try_submit(append_op(7, &[q2]), Some(Box::new(move |r| drop(tx.send(r))))) {
        Ok(()) => {}
        Err((_, _, e)) => panic!("try_submit: {e}"),
    }
    assert_eq!(rx.recv().unwrap().unwrap().appended[0].offsets, vec![(q2, 2)]);
    j.close().unwrap();
    assert!(matches!(j.try_submit(vec![], None), Err((_, None, JournalError::Closed))));
    assert_eq!(rt.block_on(j.flush()), Err(JournalError::Closed));
    // Reads keep working after close.
    assert_record(&j, pos, 3);
}

/// Only a new journal scans its index: after a clean close the next open starts from the
/// checkpoint at the end of the log, and after a crash it replays the effects records
/// written since the checkpoint. Counters agree with a recount every time. The middle open
/// runs in a child process (this test binary, re-executed) that exits without closing, as
/// a crash would: nothing it wrote reached sled's files except through its own buffers.
#[test]
fn reopening_after_a_clean_close_or_a_crash_replays_instead_of_scanning() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path(), FsyncPolicy::Always);
    assert!(j.stats().index_scanned, "a new journal has no checkpoint");
    let q = j.queue_id("q").unwrap();
    for n in 0..50 {
        let mut a = append(n, &[q]);
        if n % 10 == 0 {
            a.timer = timer(1_000 + n, "t");
        }
        j.write_blocking(vec![Op::Append(a)]).unwrap();
    }
    j.write_blocking(vec![Op::Remove { queue: q, offset: 3, at: None }]).unwrap();
    j.close().unwrap();
    drop(j);

    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "checkpoint_child_opens_and_crashes", "--nocapture", "--test-threads=1"])
        .env(CHECKPOINT_CHILD_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(CHILD_CRASHED), "the child saw the checkpoint and wrote: {status:?}");

    let j = open(dir.path(), FsyncPolicy::Always);
    assert!(!j.stats().index_scanned, "the write of the crashed child is replayed from the log");
    assert_eq!(j.queue_len(q).unwrap(), 50);
    assert_eq!(j.queue_next_offset(q), 51);
    j.verify_counters().unwrap();
}

const CHECKPOINT_CHILD_ENV: &str = "FERRYMQ_STORAGE_CHECKPOINT_CHILD_DIR";
/// The child's exit code once it opened from the checkpoint and wrote.
const CHILD_CRASHED: i32 = 42;

/// The child's side: runs only when the parent sets `CHECKPOINT_CHILD_ENV`; opens from the
/// checkpoint of a clean close, writes, and exits without closing.
#[test]
fn checkpoint_child_opens_and_crashes() {
    let Ok(dir) = std::env::var(CHECKPOINT_CHILD_ENV) else { return };
    let j = open(std::path::Path::new(&dir), FsyncPolicy::Always);
    assert!(!j.stats().index_scanned, "the clean close left a checkpoint");
    let q = j.queue_id("q").unwrap();
    assert_eq!(j.queue_len(q).unwrap(), 49);
    assert_eq!(j.queue_next_offset(q), 50);
    j.verify_counters().unwrap();
    j.write_blocking(append_op(50, &[q])).unwrap();
    // No close, no destructors: what a crash leaves.
    std::process::exit(CHILD_CRASHED);
}

/// Opening a directory whose sled lock is still held waits briefly for it (a previous
/// handle of this process releases the lock when sled's threads exit), and fails with a
/// `Db` error if it stays held.
#[test]
fn open_waits_for_the_previous_handle_to_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path(), FsyncPolicy::Always);
    let q = j.queue_id("q").unwrap();
    j.write_blocking(append_op(1, &[q])).unwrap();
    let t = std::time::Instant::now();
    match ferrymq_storage::Journal::open(config(dir.path(), FsyncPolicy::Always)) {
        Err(JournalError::Db(e)) => assert!(e.contains("lock"), "{e}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("two handles on one directory"),
    }
    assert!(t.elapsed() >= std::time::Duration::from_secs(1), "retried for a while");
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        j.close().unwrap();
        drop(j);
    });
    let j = open(dir.path(), FsyncPolicy::Always);
    holder.join().unwrap();
    assert_eq!(j.queue_len(q).unwrap(), 1);
}

/// An open that recovers nothing, then a close with nothing written in between, write
/// nothing: a start that is refused after the journal opened (a record that cannot be
/// restored) leaves the data directory as it found it. (sled itself rewrites its snapshot
/// the first time it is opened after a write: the files are compared from the second
/// open on.)
#[test]
fn an_open_and_close_that_change_nothing_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let j = open(dir.path(), FsyncPolicy::Always);
        let q = j.queue_id("q").unwrap();
        j.write_blocking(append_op(1, &[q])).unwrap();
        j.write_blocking(vec![Op::Put {
            space: Space::Meta,
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
        }])
        .unwrap();
        j.close().unwrap();
    }
    drop(open(dir.path(), FsyncPolicy::Always));
    let settled = files(dir.path());
    for _ in 0..2 {
        let j = open(dir.path(), FsyncPolicy::Always);
        j.close().unwrap();
        drop(j);
        assert!(files(dir.path()) == settled, "a close changed the data directory");
        drop(open(dir.path(), FsyncPolicy::Always));
        assert!(files(dir.path()) == settled, "an open and drop changed the data directory");
    }
}

/// A data directory of a development layout (1 to 3, never released; a directory with data
/// but no `format` file is layout 1) is refused at open with the layout error, which says
/// what to do, and left byte for byte as it was: nothing is migrated.
#[test]
fn a_directory_of_an_unreleased_layout_is_refused_untouched() {
    for layout in [None, Some(1), Some(2), Some(3)] {
        let dir = tempfile::tempdir().unwrap();
        {
            let j = open(dir.path(), FsyncPolicy::Always);
            let q = j.queue_id("q").unwrap();
            j.write_blocking(append_op(1, &[q])).unwrap();
            j.close().unwrap();
        }
        match layout {
            Some(v) => std::fs::write(dir.path().join("format"), format!("ferrymq-journal {v}\n")).unwrap(),
            None => std::fs::remove_file(dir.path().join("format")).unwrap(),
        }
        let before = files(dir.path());
        let message = match ferrymq_storage::Journal::open(config(dir.path(), FsyncPolicy::Always)) {
            Err(JournalError::Layout(message)) => message,
            Err(e) => panic!("layout {layout:?}: {e}"),
            Ok(_) => panic!("layout {layout:?} was opened"),
        };
        let v = layout.unwrap_or(1);
        let refused = format!("is layout {v}, a development layout this build no longer reads");
        assert!(message.contains(&refused), "{message}");
        assert!(message.contains("git commit 0cd0e68") && message.contains("--data-dir"), "what to do: {message}");
        assert!(files(dir.path()) == before, "layout {layout:?}: the refused directory was changed");
    }
}
