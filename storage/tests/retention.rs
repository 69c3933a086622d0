//! Retention: closed segments with no references are deleted once a limit is exceeded;
//! referenced and active segments never are.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferrymq_storage::{FsyncPolicy, Journal, JournalConfig, JournalError, LogPos, Op, QueueTarget, Retention};

fn config(dir: &std::path::Path, retention: Retention) -> JournalConfig {
    let mut c = common::config(dir, FsyncPolicy::Never);
    c.segment_size = 2048;
    c.retention = retention;
    c
}

/// Waits (retention runs at most once a second) until `cond` holds.
fn wait_for(j: &Journal, what: &str, cond: impl Fn(&Journal) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond(j) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {:?}", j.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn bases(dir: &std::path::Path) -> Vec<u64> {
    segments(dir).iter().map(|p| p.file_stem().unwrap().to_str().unwrap().parse::<u64>().unwrap()).collect()
}

fn segment_of(bases: &[u64], pos: LogPos) -> u64 {
    bases.iter().copied().filter(|&b| b <= pos.0).max().unwrap()
}

/// A file system fuller than the ratio (any used space is more than 0%) deletes every
/// unreferenced closed segment, however young; a referenced one stays readable.
#[test]
fn a_disk_fuller_than_the_ratio_deletes_young_unreferenced_segments() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention { max_disk_used_ratio: Some(0.0), ..Default::default() };
    let j = Journal::open(config(dir.path(), retention)).unwrap();
    let q = j.queue_id("q").unwrap();
    let mut recs = Vec::new();
    for n in 0..100 {
        let r = j.write_blocking(append_op(n, &[q])).unwrap();
        recs.push((r.appended[0].pos, r.appended[0].offsets[0].1));
    }
    let before = j.stats();
    assert!(before.segments >= 8, "{before:?}");
    let ops = recs.iter().skip(1).map(|&(_, offset)| Op::Remove { queue: q, offset }).collect();
    j.write_blocking(ops).unwrap();
    wait_for(&j, "every unreferenced closed segment deleted", |j| j.stats().segments <= 2);
    j.verify_counters().unwrap();
    assert_record(&j, recs[0].0, 0);
}

#[test]
fn max_bytes_deletes_only_unreferenced_closed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention { max_bytes: Some(4096), ..Default::default() };
    let j = Journal::open(config(dir.path(), retention.clone())).unwrap();
    let q = j.queue_id("q").unwrap();
    let mut recs = Vec::new();
    for n in 0..100 {
        let r = j.write_blocking(append_op(n, &[q])).unwrap();
        recs.push((r.appended[0].pos, r.appended[0].size, r.appended[0].offsets[0].1));
    }
    let before = j.stats();
    assert!(before.segments >= 8, "{before:?}");
    // Everything is referenced: nothing may go, whatever the size.
    std::thread::sleep(Duration::from_millis(1200));
    j.write_blocking(vec![]).unwrap(); // a batch, so retention gets a chance
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(j.stats().segments, before.segments);

    // Keep the pointer to record 30; remove every other pointer. Add a retained entry
    // and a timer on fresh records.
    let ops = recs
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 30)
        .map(|(_, &(_, _, offset))| Op::Remove { queue: q, offset })
        .collect();
    j.write_blocking(ops).unwrap();
    let mut r50 = append(50_000, &[]);
    r50.retained_topic = Some("keep".into());
    let mut r70 = append(70_000, &[]);
    r70.timer = timer(1, "keep");
    let r = j.write_blocking(vec![Op::Append(r50), Op::Append(r70)]).unwrap();
    let (retained_pos, timer_pos) = (r.appended[0].pos, r.appended[1].pos);
    // Roll past them so that their segment is closed.
    for n in 200..230 {
        j.write_blocking(append_op(n, &[])).unwrap();
    }
    wait_for(&j, "log below max_bytes", |j| j.stats().log_bytes <= 4096 + 2048);
    j.verify_counters().unwrap();
    let live = segments(dir.path()).len() as u64;
    assert_eq!(live, j.stats().segments);
    assert!(live >= 3, "the referenced segments and the active one remain");
    assert_record(&j, recs[30].0, 30);
    assert_record(&j, retained_pos, 50_000);
    assert_record(&j, timer_pos, 70_000);
    assert_eq!(j.read(recs[0].0), Err(JournalError::NotFound(recs[0].0 .0)));
    for (n, &(pos, _, _)) in recs.iter().enumerate() {
        match j.read(pos) {
            Ok(_) => assert_record(&j, pos, n as u64),
            Err(e) => assert_eq!(e, JournalError::NotFound(pos.0)),
        }
    }
    // Enqueue of a deleted record is refused.
    let (p0, s0, _) = recs[0];
    let e = j.write_blocking(vec![Op::Enqueue {
        pos: p0,
        size: s0,
        body_len: 0,
        queues: vec![QueueTarget { queue: q, tag_hash: 0, flags: 0 }],
    }]);
    assert_eq!(e, Err(JournalError::NotFound(p0.0)));

    // Reopen with holes in the log: the kept records are still there (their segments are
    // trusted), and dropping the last references lets their segments go.
    drop(j);
    let j = Journal::open(config(dir.path(), retention)).unwrap();
    j.verify_counters().unwrap();
    assert_eq!(j.stats().segments, live);
    assert_record(&j, recs[30].0, 30);
    assert_record(&j, retained_pos, 50_000);
    assert_record(&j, timer_pos, 70_000);
    assert_eq!(j.queue_len(q).unwrap(), 1);
    j.write_blocking(vec![
        Op::Remove { queue: q, offset: recs[30].2 },
        Op::DeleteRetained { topic: "keep".into() },
        Op::DeleteTimer { due_ms: 1, pos: timer_pos },
    ])
    .unwrap();
    // The log is under the limit now; grow it past the limit again.
    for n in 300..340 {
        j.write_blocking(append_op(n, &[])).unwrap();
    }
    wait_for(&j, "formerly referenced segments deleted", |j| {
        j.read(recs[30].0).is_err() && j.read(retained_pos).is_err() && j.read(timer_pos).is_err()
    });
    assert_eq!(j.read(recs[30].0), Err(JournalError::NotFound(recs[30].0 .0)));
    assert_eq!(j.read(retained_pos), Err(JournalError::NotFound(retained_pos.0)));
    assert_eq!(j.read(timer_pos), Err(JournalError::NotFound(timer_pos.0)));
    // The active segment is never deleted.
    let r = j.write_blocking(append_op(7, &[])).unwrap();
    assert_record(&j, r.appended[0].pos, 7);
}

#[test]
fn max_age_deletes_old_unreferenced_segments() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention { max_age: Some(Duration::from_millis(200)), ..Default::default() };
    let j = Journal::open(config(dir.path(), retention)).unwrap();
    let q = j.queue_id("q").unwrap();
    let mut recs = Vec::new();
    for n in 0..100u64 {
        // Only the first record is referenced (the last one is in the active segment).
        let queues = if n == 0 { vec![q] } else { vec![] };
        let r = j.write_blocking(append_op(n, &queues)).unwrap();
        recs.push(r.appended[0].pos);
    }
    assert!(j.stats().segments >= 8);
    let all = bases(dir.path());
    wait_for(&j, "old segments deleted", |j| j.stats().segments == 2);
    let first = segment_of(&all, recs[0]);
    let active = segment_of(&all, recs[99]);
    assert_eq!(bases(dir.path()), vec![first, active]);
    for (n, &pos) in recs.iter().enumerate() {
        let seg = segment_of(&all, pos);
        if seg == first || seg == active {
            assert_record(&j, pos, n as u64);
        } else {
            assert_eq!(j.read(pos), Err(JournalError::NotFound(pos.0)));
        }
    }
}

/// Below `min_free_bytes` a submission that appends is refused before anything is
/// written (`NoSpace`), and the journal is not poisoned: other writes go on.
#[test]
fn appends_are_refused_below_the_free_space_floor_without_poisoning() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), Retention::default());
    c.min_free_bytes = u64::MAX / 2;
    let j = Journal::open(c).unwrap();
    let q = j.queue_id("q").unwrap();
    j.write_blocking(vec![]).unwrap(); // behind the effects record of the queue's name
    let before = j.stats().log_bytes;
    match j.write_blocking(append_op(1, &[q])) {
        Err(JournalError::NoSpace(floor)) => assert_eq!(floor, u64::MAX / 2),
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert_eq!(j.stats().log_bytes, before, "nothing of the refused append was written");
    // Not poisoned: a submission without appends is taken, and so is a later one.
    j.write_blocking(vec![]).unwrap();
    assert!(matches!(j.write_blocking(append_op(2, &[q])), Err(JournalError::NoSpace(_))));
    j.write_blocking(vec![]).unwrap();
}
