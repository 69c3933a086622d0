//! Tests of the consume-queue files: settled offsets, bounded handles, deferred entries.

use super::*;
use crate::LogPos;

fn p(pos: u64) -> Pointer {
    Pointer { pos: LogPos(pos), size: 30, body_len: 3, tag_hash: 7, flags: 1 }
}

#[test]
fn offsets_settle_in_and_out_of_order() {
    let mut o = Offsets { next: 10, ..Offsets::default() };
    o.settle(3, 4);
    o.settle(5, 7);
    assert_eq!((o.low, o.ranges()), (0, vec![(3, 4), (5, 7)]));
    assert_eq!(o.runs(0, 100), vec![(0, 3), (4, 5), (7, 10)]);
    assert_eq!(o.runs(0, 4), vec![(0, 3), (4, 5)]);
    assert_eq!(o.runs(5, 2), vec![(7, 9)]);
    o.settle(4, 5);
    assert_eq!(o.ranges(), vec![(3, 7)]);
    o.settle(0, 3);
    assert_eq!((o.low, o.ranges()), (7, vec![]));
    assert!(!o.is_live(6) && o.is_live(7) && !o.is_live(10));
    o.settle(9, 10);
    o.settle(2, 9);
    assert_eq!((o.low, o.ranges()), (10, vec![]));
    assert_eq!(o.runs(0, 5), vec![]);
    let mut o = Offsets { next: 100, ..Offsets::default() };
    o.settle(10, 20);
    o.settle(30, 40);
    o.settle(15, 35);
    assert_eq!(o.ranges(), vec![(10, 40)]);
    assert_eq!(Offsets::decode(&o.encode(), 100), Some(o.clone()));
    assert_eq!(Offsets::decode(&[1, 2], 0), None);
}

#[test]
fn open_handles_stay_bounded_across_many_queues() {
    let dir = tempfile::tempdir().unwrap();
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    let queues = MAX_OPEN as u64 + 200;
    for q in 0..queues {
        cq.write(q, 0, &[p(q)]).unwrap();
        cq.sync().unwrap();
        assert!(cq.handles.open.load(Ordering::Relaxed) <= MAX_OPEN);
    }
    for q in 0..queues {
        assert_eq!(cq.entries(q, 0, 5).unwrap(), vec![(0, p(q))], "queue {q}, opened again");
    }
    assert!(cq.handles.open.load(Ordering::Relaxed) <= MAX_OPEN);
}

#[test]
fn files_waiting_for_a_sync_hold_a_bounded_number_of_handles() {
    // A drain after a fan-out to more queues than MAX_OPEN writes a file of each before
    // the checkpointer syncs any: at most MAX_OPEN of them are held open meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    let queues = MAX_OPEN as u64 + 200;
    for q in 0..queues {
        cq.write(q, 0, &[p(q)]).unwrap();
    }
    {
        let unsynced = cq.handles.unsynced.lock();
        assert!(unsynced.files.len() <= MAX_OPEN, "{} handles held for the sync", unsynced.files.len());
        assert_eq!(unsynced.files.len() + unsynced.paths.len(), queues as usize, "every file is to be synced");
    }
    cq.delete_queue(queues - 1, 0);
    assert_eq!(cq.sync().unwrap(), Synced::FileSystem { files: queues as usize - 1 }, "one syncfs for them all");
    let unsynced = cq.handles.unsynced.lock();
    assert!(unsynced.files.is_empty() && unsynced.paths.is_empty() && unsynced.dirs.is_empty());
    drop(unsynced);
    for q in 0..queues - 1 {
        assert_eq!(cq.entries(q, 0, 5).unwrap(), vec![(0, p(q))], "queue {q}");
    }
}

#[test]
fn a_round_syncs_few_files_one_by_one_and_many_with_one_syncfs() {
    let dir = tempfile::tempdir().unwrap();
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    assert_eq!(cq.sync().unwrap(), Synced::Files { files: 0 });
    for q in 0..3 {
        cq.write(q, 0, &[p(q)]).unwrap();
    }
    assert_eq!(cq.sync().unwrap(), Synced::Files { files: 3 });
    let wide = SYNCFS_FROM as u64;
    for q in 0..wide {
        cq.write(q, 1, &[p(q)]).unwrap();
    }
    assert_eq!(cq.sync().unwrap(), Synced::FileSystem { files: SYNCFS_FROM });
    {
        let unsynced = cq.handles.unsynced.lock();
        assert!(unsynced.files.is_empty() && unsynced.paths.is_empty() && unsynced.dirs.is_empty());
    }
    assert_eq!(cq.sync().unwrap(), Synced::Files { files: 0 }, "nothing left for the next round");
    drop(cq);
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    assert_eq!(cq.read_block(2, 0, 8).unwrap(), vec![(0, p(2)), (1, p(2))], "written before and after the syncfs");
    assert_eq!(cq.read_block(wide - 1, 0, 8).unwrap(), vec![(1, p(wide - 1))]);
}

#[test]
fn the_writers_block_reads_keep_open_handles_bounded() {
    // Acknowledgements to every session of a wide fan-out make the writer read a block
    // of each queue (`read_block`): the files stay open only up to MAX_OPEN.
    let dir = tempfile::tempdir().unwrap();
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    let queues = MAX_OPEN as u64 + 200;
    for q in 0..queues {
        cq.write(q, 0, &[p(q)]).unwrap();
    }
    cq.sync().unwrap();
    cq.limit_handles();
    for q in 0..queues {
        assert_eq!(cq.read_block(q, 0, 8).unwrap(), vec![(0, p(q))]);
    }
    let open: usize = cq.queues.read().values().map(|q| q.files.lock().values().filter(|f| f.is_some()).count()).sum();
    assert!(open <= MAX_OPEN, "{open} consume-queue files open after reading {queues} queues");
}

#[test]
fn entries_are_written_read_settled_and_their_files_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    let n = FILE_ENTRIES as usize + 10;
    let entries: Vec<Pointer> = (0..n as u64).map(p).collect();
    cq.write(5, 0, &entries).unwrap();
    assert_eq!(cq.entries(5, 0, 3).unwrap(), vec![(0, p(0)), (1, p(1)), (2, p(2))]);
    assert_eq!(
        cq.entries(5, FILE_ENTRIES - 1, 2).unwrap(),
        vec![(FILE_ENTRIES - 1, p(FILE_ENTRIES - 1)), (FILE_ENTRIES, p(FILE_ENTRIES))]
    );
    cq.settle(5, 1, 2);
    assert_eq!(cq.entries(5, 0, 2).unwrap(), vec![(0, p(0)), (2, p(2))]);
    cq.sync().unwrap();
    let db = sled::Config::new().temporary(true).open().unwrap();
    let settled = db.open_tree("settled").unwrap();
    cq.settle(5, 0, FILE_ENTRIES + 3);
    cq.drain(&settled, 100).unwrap();
    let first = dir.path().join(format!("{:020}/{:020}.cq", 5, 0));
    cq.delete_doomed(99);
    assert!(first.exists(), "kept until a checkpoint covers the drain");
    cq.delete_doomed(100);
    assert!(!first.exists(), "a settled file is deleted");
    assert_eq!(cq.entries(5, 0, 100).unwrap().len(), 7);
    // Reopened: offsets from the counters and the settled tree; the files as they were.
    drop(cq);
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    let next = HashMap::from([(5, n as u64 + 2)]);
    let stored = settled.iter().map(|kv| kv.unwrap()).map(|(k, v)| (codec::decode_u64(&k).unwrap(), v.to_vec()));
    cq.restore(&next, stored.collect()).unwrap();
    cq.trim(|_| true).unwrap();
    let got = cq.entries(5, 0, 100).unwrap();
    assert_eq!(got.first(), Some(&(FILE_ENTRIES + 3, p(FILE_ENTRIES + 3))));
    assert_eq!(got.len(), 7, "offsets past the written entries are holes");
    cq.trim(|_| false).unwrap();
    assert!(cq.entries(5, 0, 100).unwrap().is_empty(), "a dead queue is gone at once");
    cq.delete_doomed(0);
    assert!(!dir.path().join(format!("{:020}", 5)).exists(), "and its files once checkpointed");
}

/// The change of one group commit: entry `off` of queue `q` set to `p`, or settled
/// (`None`).
fn change(q: u64, off: u64, p: Option<Pointer>) -> (u64, u64, Option<Pointer>) {
    (q, off, p)
}

#[test]
fn deferred_entries_are_read_from_memory_and_only_the_live_ones_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    let staged = cq.stage((0..6).map(|off| change(7, off, Some(p(off)))).collect::<Vec<_>>(), true).unwrap();
    assert!(cq.entries(7, 0, 10).unwrap().is_empty(), "not visible before publish");
    cq.publish(staged);
    let file = dir.path().join(format!("{:020}/{:020}.cq", 7, 0));
    assert!(!file.exists(), "nothing written by a group commit");
    assert_eq!(cq.entries(7, 0, 10).unwrap(), (0..6).map(|o| (o, p(o))).collect::<Vec<_>>());
    // Offsets 0-2 and 4 are settled before the drain; 3 and 5 are live, and 5's flags change.
    cq.settle(7, 0, 3);
    cq.settle(7, 4, 5);
    let mut flagged = p(5);
    flagged.flags = 9;
    cq.publish(cq.stage(vec![change(7, 5, Some(flagged))], true).unwrap());
    assert!(cq.has_pending());
    cq.flush_pending().unwrap();
    assert!(!cq.has_pending());
    let len = fs::metadata(&file).unwrap().len();
    assert_eq!(len, 6 * ENTRY_BYTES, "written up to the last live entry");
    let expect = vec![(3, p(3)), (5, flagged)];
    assert_eq!(cq.entries(7, 0, 10).unwrap(), expect);
    // From the files alone: the settled offsets are holes.
    let mut from_files = Vec::new();
    cq.get(7).unwrap().read_files(0, 6, &mut from_files, &cq.handles).unwrap();
    assert_eq!(from_files, expect);
    // A flag change of a written entry waits in memory and replaces the file's for readers.
    let mut again = flagged;
    again.flags = 3;
    cq.publish(cq.stage(vec![change(7, 5, Some(again))], true).unwrap());
    assert_eq!(cq.entries(7, 0, 10).unwrap(), vec![(3, p(3)), (5, again)]);
    assert_eq!(cq.read_block(7, 0, 8).unwrap(), vec![(3, p(3)), (5, again)]);
    cq.forget_pending();
    assert_eq!(cq.entries(7, 0, 10).unwrap(), expect, "forgotten: the file's again");
}

#[test]
fn files_made_ahead_are_empty_then_written_and_synced_like_any() {
    let dir = tempfile::tempdir().unwrap();
    let cq = ConsumeQueues::open(dir.path()).unwrap();
    cq.create_files(4).unwrap();
    let file = dir.path().join(format!("{:020}/{:020}.cq", 4, 0));
    assert_eq!(fs::metadata(&file).unwrap().len(), 0, "made ahead, empty");
    assert!(cq.entries(4, 0, 10).unwrap().is_empty(), "an empty file holds no entry");
    cq.create_files(4).unwrap();
    cq.publish(cq.stage((0..3).map(|off| change(4, off, Some(p(off)))).collect::<Vec<_>>(), true).unwrap());
    cq.flush_pending().unwrap();
    assert_eq!(fs::metadata(&file).unwrap().len(), 3 * ENTRY_BYTES, "the drain writes into it");
    cq.sync().unwrap();
    let reopened = ConsumeQueues::open(dir.path()).unwrap();
    reopened.raise_next(4, 3);
    assert_eq!(reopened.entries(4, 0, 10).unwrap(), (0..3).map(|o| (o, p(o))).collect::<Vec<_>>());
}
