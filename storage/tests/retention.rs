//! Retention: closed segments with no references are deleted once a limit is exceeded;
//! referenced and active segments never are.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;

use common::*;
use ferrymq_storage::{FsyncPolicy, Journal, JournalConfig, JournalError, LogPos, Op, QueueId, QueueTarget, Retention};

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
    // Removals that name their records' positions release them as those that do not.
    let ops = recs.iter().skip(1).map(|&(pos, offset)| Op::Remove { queue: q, offset, at: Some(pos) }).collect();
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
        .map(|(_, &(_, _, offset))| Op::Remove { queue: q, offset, at: None })
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
        Op::Remove { queue: q, offset: recs[30].2, at: None },
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

/// An append of a 64 KiB record `n` to `queues` (larger than [`append`]'s, so that the
/// active segment reaches the size retention rolls over for).
fn big_append(n: u64, queues: &[QueueId]) -> Vec<Op> {
    let mut a = append(n, queues);
    a.record.body = Bytes::from(vec![n as u8; 64 * 1024]);
    vec![Op::Append(a)]
}

/// A file system short of free space (here: any, as the minimum is unreachable), with
/// the whole log in the active segment: nothing is rolled over or deleted while a queue
/// points into it; once the queue is drained, retention rolls the active segment over and
/// deletes it (a closed segment was all it could delete before), and the journal goes on
/// in the new one.
#[test]
fn a_disk_short_of_free_space_rolls_the_drained_active_segment_over_and_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention { min_disk_free_bytes: Some(u64::MAX), ..Default::default() };
    let mut c = config(dir.path(), retention);
    c.segment_size = 8 << 20;
    let j = Journal::open(c).unwrap();
    let q = j.queue_id("q").unwrap();
    let mut recs = Vec::new();
    for n in 0..24 {
        let r = j.write_blocking(big_append(n, &[q])).unwrap();
        recs.push((r.appended[0].pos, r.appended[0].offsets[0].1));
    }
    assert_eq!(j.stats().segments, 1, "1.5 MiB in an 8 MiB segment");
    // Referenced: kept whole, whatever the shortage (bounded negative wait: retention runs
    // once a second).
    std::thread::sleep(Duration::from_millis(1200));
    j.write_blocking(vec![]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(bases(dir.path()), vec![0], "a referenced active segment is never rolled over");
    // Drained but for the first record: still referenced.
    let ops = recs.iter().skip(1).map(|&(_, offset)| Op::Remove { queue: q, offset, at: None }).collect();
    j.write_blocking(ops).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    j.write_blocking(vec![]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(bases(dir.path()), vec![0], "one entry keeps the whole segment");
    assert!(j.read(recs[0].0).unwrap().body.iter().all(|&b| b == 0), "record 0 intact");

    j.write_blocking(vec![Op::Remove { queue: q, offset: recs[0].1, at: None }]).unwrap();
    wait_for(&j, "the drained active segment rolled over and deleted", |j| j.read(recs[0].0).is_err());
    let left = bases(dir.path());
    assert_eq!(left.len(), 1, "only the new active segment: {left:?}");
    assert!(left[0] > recs[23].0 .0, "it starts past every record: {left:?}");
    for &(pos, _) in &recs {
        assert_eq!(j.read(pos), Err(JournalError::NotFound(pos.0)));
    }
    j.verify_counters().unwrap();
    let r = j.write_blocking(append_op(99, &[q])).unwrap();
    assert!(r.appended[0].pos.0 >= left[0]);
    assert_record(&j, r.appended[0].pos, 99);
    assert_eq!(j.queue_len(q).unwrap(), 1);
    assert_eq!(j.queue_next_offset(q), 25, "offsets go on");
}

/// `roll_segment` closes the active segment whatever its size (not an empty one): records
/// keep their positions and stay readable, the next record starts the new segment, and a
/// crash right after the roll reopens with everything, referenced or not, where it was.
#[test]
fn a_rolled_segment_keeps_its_records_and_survives_a_crash_right_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), Retention::default());
    c.segment_size = 1 << 20;
    let j = Journal::open(c.clone()).unwrap();
    let q = j.queue_id("q").unwrap();
    let mut recs = Vec::new();
    for n in 0..5 {
        let mut a = append(n, &[q]);
        if n == 1 {
            a.retained_topic = Some("t".into());
        }
        if n == 2 {
            a.timer = timer(5, "later");
        }
        let r = j.write_blocking(vec![Op::Append(a)]).unwrap();
        recs.push((r.appended[0].pos, r.appended[0].offsets[0].1));
    }
    j.write_blocking(vec![Op::Remove { queue: q, offset: recs[3].1, at: None }]).unwrap();
    let end = j.stats().log_end;
    assert!(j.roll_segment().unwrap(), "a segment with records is closed");
    assert!(!j.roll_segment().unwrap(), "an empty active segment is not");
    assert_eq!(bases(dir.path()), vec![0, end], "the new segment starts at the end of the log");
    assert_eq!(j.stats().log_end, end, "positions stay contiguous");
    let r = j.write_blocking(append_op(5, &[q])).unwrap();
    assert_eq!(r.appended[0].pos.0, end);
    recs.push((r.appended[0].pos, r.appended[0].offsets[0].1));
    assert!(j.roll_segment().unwrap());
    j.crash();
    drop(j);

    let j = Journal::open(c).unwrap();
    assert_eq!(bases(dir.path()).len(), 3);
    for (n, &(pos, _)) in recs.iter().enumerate() {
        assert_record(&j, pos, n as u64);
    }
    let offsets: Vec<u64> = j.queue_entries(q, 0, 100).unwrap().into_iter().map(|(o, _)| o).collect();
    assert_eq!(offsets, vec![0, 1, 2, 4, 5]);
    assert_eq!(j.retained().unwrap(), vec![("t".to_string(), recs[1].0)]);
    assert_eq!(j.timers_due(u64::MAX, 10).unwrap().len(), 1);
    j.verify_counters().unwrap();
    let r = j.write_blocking(append_op(6, &[q])).unwrap();
    assert_record(&j, r.appended[0].pos, 6);
    assert_eq!(r.appended[0].offsets[0].1, 6);
}

/// A segment rolled over while idle ends in a padding record after its last effects record
/// (synced group commits end on a page boundary); when nothing after that record waits for
/// a drain, the checkpoint stops at the record, not at the padding. Retention still
/// deletes the segment once the checkpoint covers the record.
#[test]
fn a_segment_rolled_over_after_a_padded_commit_goes_once_its_effects_are_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention { max_disk_used_ratio: Some(0.0), ..Default::default() };
    let mut c = common::config(dir.path(), FsyncPolicy::Always);
    c.retention = retention;
    assert!(c.page_aligned_syncs);
    let j = Journal::open(c).unwrap();
    // No queue, retained entry or timer: only the key index (sled at once), so nothing
    // waits for a drain after this commit.
    let mut a = append(1, &[]);
    a.keys = Some(ferrymq_storage::MessageKeys { timestamp_ms: 1, keys: vec![Bytes::from_static(b"k")] });
    let pos = j.write_blocking(vec![Op::Append(a)]).unwrap().appended[0].pos;
    assert_eq!(j.stats().log_end % 4096, 0, "the commit was padded to a page");
    assert!(j.roll_segment().unwrap());
    wait_for(&j, "the rolled segment deleted", |j| j.read(pos).is_err());
    assert_eq!(j.read(pos), Err(JournalError::NotFound(pos.0)));
    assert_eq!(j.stats().segments, 1);
}
