//! Torn and corrupted tails: after a crash, recovery cuts the log after the last valid
//! record, drops the index entries that pointed past it, never panics, and the journal
//! keeps working. After a clean stop, the same damage below the end that stop recorded is
//! refused: the open fails and nothing is cut.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use common::*;
use ferrymq_storage::{FsyncPolicy, JournalError, LogPos, Op};

const N: u64 = 400; // about 80 KiB: two segments of 64 KiB

#[derive(Debug, Clone, Copy)]
enum Damage {
    TruncateMidRecord,
    TruncateMidFrame,
    FlipByteInLastRecord,
    AppendGarbage,
    AppendZeros,
}

/// Writes N records (the last one also retained and with a timer): all but the last
/// before a clean stop, the last after it, then stops as a crash would (the write is with
/// the OS; no last sync, no checkpoint). So the last record lies past the end the clean
/// stop recorded, where a torn write can be.
fn populate(dir: &std::path::Path) -> Vec<(LogPos, u32)> {
    let mut out = populate_then(dir, N - 1, |j| j.close().unwrap());
    let j = open(dir, FsyncPolicy::Never);
    let q = j.queue_id("q").unwrap();
    out.push(write_record(&j, q, N - 1));
    j.crash();
    out
}

/// Writes `count` records, then stops with `stop`.
fn populate_then(
    dir: &std::path::Path,
    count: u64,
    stop: impl FnOnce(&ferrymq_storage::Journal),
) -> Vec<(LogPos, u32)> {
    let j = open(dir, FsyncPolicy::Never);
    let q = j.queue_id("q").unwrap();
    let out = (0..count).map(|n| write_record(&j, q, n)).collect();
    stop(&j);
    out
}

/// Writes record `n` (the last one, N - 1, also retained and with a timer; N - 2 retained).
fn write_record(j: &ferrymq_storage::Journal, q: ferrymq_storage::QueueId, n: u64) -> (LogPos, u32) {
    let mut a = append(n, &[q]);
    if n == N - 1 {
        a.retained_topic = Some("last".into());
        a.timer = timer(77, "t");
    } else if n == N - 2 {
        a.retained_topic = Some("prev".into());
    }
    let r = j.write_blocking(vec![Op::Append(a)]).unwrap();
    (r.appended[0].pos, r.appended[0].size)
}

/// Damages the last segment of a populated directory as `damage` says.
fn damage_last_segment(dir: &std::path::Path, recs: &[(LogPos, u32)], damage: Damage) {
    let segs = segments(dir);
    assert!(segs.len() >= 2, "test wants at least two segments");
    let last = segs.last().unwrap();
    let base: u64 = last.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    let file = OpenOptions::new().read(true).write(true).open(last).unwrap();
    let len = file.metadata().unwrap().len();
    let (last_pos, last_size) = recs[N as usize - 1];
    // The last message record (its batch's effects record follows it, and goes with it).
    let last_end = last_pos.0 - base + last_size as u64;
    match damage {
        Damage::TruncateMidRecord => file.set_len(last_end - 5).unwrap(),
        Damage::TruncateMidFrame => file.set_len(last_pos.0 - base + 6).unwrap(),
        Damage::FlipByteInLastRecord => {
            let mut b = [0u8; 1];
            file.read_exact_at(&mut b, last_end - 3).unwrap();
            file.write_all_at(&[b[0] ^ 0x40], last_end - 3).unwrap();
        }
        Damage::AppendGarbage => file.write_all_at(&[0xA5; 333], len).unwrap(),
        Damage::AppendZeros => file.write_all_at(&[0; 4096], len).unwrap(),
    }
}

fn damaged(damage: Damage) {
    let dir = tempfile::tempdir().unwrap();
    let recs = populate(dir.path());
    damage_last_segment(dir.path(), &recs, damage);
    let (last_pos, _) = recs[N as usize - 1];
    let broken = matches!(damage, Damage::TruncateMidRecord | Damage::TruncateMidFrame | Damage::FlipByteInLastRecord);

    let j = open(dir.path(), FsyncPolicy::Always);
    j.verify_counters().unwrap();
    let q = j.queue_id("q").unwrap();
    for (n, &(pos, _)) in recs.iter().enumerate().take(N as usize - 1) {
        assert_record(&j, pos, n as u64);
    }
    let entries = j.queue_entries(q, 0, 1000).unwrap();
    let mut retained = j.retained().unwrap();
    retained.sort();
    if broken {
        assert_eq!(j.read(last_pos), Err(JournalError::NotFound(last_pos.0)), "{damage:?}");
        assert_eq!(entries.len() as u64, N - 1);
        assert_eq!(retained, vec![("prev".to_string(), recs[N as usize - 2].0)]);
        assert!(j.timers_due(u64::MAX, 10).unwrap().is_empty());
        assert_eq!(j.stats().log_end, last_pos.0);
    } else {
        assert_record(&j, last_pos, N - 1);
        assert_eq!(entries.len() as u64, N);
        assert_eq!(retained.len(), 2);
        assert_eq!(j.timers_due(u64::MAX, 10).unwrap().len(), 1);
    }
    // The torn record's offset may be handed out again (it was never acknowledged: the
    // crash tore it before its sync); no earlier one is.
    let next = j.queue_next_offset(q);
    assert!(next == N || (broken && next == N - 1), "{damage:?}: next offset {next}");
    assert_eq!(j.queue_len(q).unwrap(), entries.len() as u64);

    // New appends work and survive another reopen.
    let r = j.write_blocking(append_op(5000, &[q])).unwrap();
    assert_eq!(r.appended[0].offsets, vec![(q, next)]);
    let new_pos = r.appended[0].pos;
    if broken {
        assert_eq!(new_pos, last_pos, "the log continues at the valid end");
    }
    assert_record(&j, new_pos, 5000);
    drop(j);

    let j = open(dir.path(), FsyncPolicy::Always);
    for (n, &(pos, _)) in recs.iter().enumerate().take(N as usize - 1) {
        assert_record(&j, pos, n as u64);
    }
    assert_record(&j, new_pos, 5000);
    assert_eq!(j.queue_len(q).unwrap(), entries.len() as u64 + 1);
    assert_eq!(j.queue_next_offset(q), next + 1);
}

/// The same damage after a clean stop: a record below the end that stop recorded does not
/// read back, so the open is refused with the first bad position and the data directory
/// is left byte for byte as it was (acknowledged messages are never cut to make a start
/// possible). Damage past that end (garbage or zeros appended) is still cut.
#[test]
fn damage_below_a_clean_stops_end_refuses_the_open_and_cuts_nothing() {
    for damage in [Damage::TruncateMidRecord, Damage::TruncateMidFrame, Damage::FlipByteInLastRecord] {
        let dir = tempfile::tempdir().unwrap();
        let recs = populate_then(dir.path(), N, |j| j.close().unwrap());
        // sled rewrites its files the first time it opens after a write: settle that first.
        drop(open(dir.path(), FsyncPolicy::Always));
        damage_last_segment(dir.path(), &recs, damage);
        let before = files(dir.path());
        let refused = ferrymq_storage::Journal::open(config(dir.path(), FsyncPolicy::Always));
        assert!(matches!(refused, Err(JournalError::Corrupt(_))), "{damage:?}: {:?}", refused.err());
        assert!(files(dir.path()) == before, "{damage:?}: the refused open changed the data directory");
    }
    for damage in [Damage::AppendGarbage, Damage::AppendZeros] {
        let dir = tempfile::tempdir().unwrap();
        let recs = populate_then(dir.path(), N, |j| j.close().unwrap());
        damage_last_segment(dir.path(), &recs, damage);
        let j = open(dir.path(), FsyncPolicy::Always);
        assert_record(&j, recs[N as usize - 1].0, N - 1);
    }
}

/// A last segment that lost its whole contents after a clean stop is refused too.
#[test]
fn a_last_segment_emptied_after_a_clean_stop_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    populate_then(dir.path(), N, |j| j.close().unwrap());
    let last = segments(dir.path()).pop().unwrap();
    std::fs::write(&last, b"").unwrap();
    let refused = ferrymq_storage::Journal::open(config(dir.path(), FsyncPolicy::Always));
    assert!(matches!(refused, Err(JournalError::Corrupt(_))), "{:?}", refused.err());
}

#[test]
fn truncated_mid_record() {
    damaged(Damage::TruncateMidRecord);
}

#[test]
fn truncated_mid_frame() {
    damaged(Damage::TruncateMidFrame);
}

#[test]
fn flipped_byte_in_last_record() {
    damaged(Damage::FlipByteInLastRecord);
}

#[test]
fn garbage_after_tail() {
    damaged(Damage::AppendGarbage);
}

#[test]
fn zeros_after_tail() {
    damaged(Damage::AppendZeros);
}

#[test]
fn corruption_in_closed_segment_reads_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let recs = populate(dir.path());
    let first = &segments(dir.path())[0];
    let file = OpenOptions::new().read(true).write(true).open(first).unwrap();
    // Flip a byte in the body of record 3, and smash the length field of record 5.
    let (p3, s3) = recs[3];
    file.write_all_at(&[0xEE], p3.0 + s3 as u64 - 1).unwrap();
    file.write_all_at(&[0xFF, 0xFF, 0xFF, 0xFF], recs[5].0 .0).unwrap();
    drop(file);
    let j = open(dir.path(), FsyncPolicy::Always);
    assert_eq!(j.read(p3), Err(JournalError::Corrupt(p3.0)));
    assert_eq!(j.read(recs[5].0), Err(JournalError::Corrupt(recs[5].0 .0)));
    // A position that is not at a record boundary.
    assert!(matches!(j.read(LogPos(p3.0 + 1)), Err(JournalError::Corrupt(_))));
    for (n, &(pos, _)) in recs.iter().enumerate() {
        if n != 3 && n != 5 {
            assert_record(&j, pos, n as u64);
        }
    }
    let q = j.queue_id("q").unwrap();
    assert_eq!(j.queue_len(q).unwrap(), N, "entries into a closed segment are kept");
    let r = j.write_blocking(append_op(1, &[q])).unwrap();
    assert_record(&j, r.appended[0].pos, 1);
}

/// A last segment replaced by garbage after a clean stop is refused, untouched.
#[test]
fn last_segment_replaced_by_garbage_after_a_clean_stop_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    populate_then(dir.path(), N, |j| j.close().unwrap());
    let last = segments(dir.path()).pop().unwrap();
    let mut x = 0x1234_5678u32;
    let junk: Vec<u8> = (0..10_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    std::fs::write(&last, &junk).unwrap();
    let refused = ferrymq_storage::Journal::open(config(dir.path(), FsyncPolicy::Always));
    assert!(matches!(refused, Err(JournalError::Corrupt(_))), "{:?}", refused.err());
    assert_eq!(std::fs::read(&last).unwrap(), junk, "nothing cut");
}
