//! Recovery at open: find the segment files, cut a torn or corrupt tail at the last valid
//! record, then bring sled up to the end of the log: replay the effects records written
//! after the last checkpoint ([`recover_state`]) — or, when sled cannot be trusted, drop
//! every index entry (pointer, retained entry, timer) that points past the valid end and
//! rebuild the per-segment reference counts and per-queue counters by a scan.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use sled::{Batch, Tree};

use crate::codec::{self, Counter};
use crate::cq::ConsumeQueues;
use crate::db::{db_err, Db, TREES};
use crate::effects;
use crate::log::{io_err, Log};
use crate::overlay::Overlay;
use crate::refs::RefCounts;
use crate::segment;
use crate::state::QueueState;
use crate::JournalError;

/// Finds the segments in `dir`, checks them and cuts the log at the first invalid record.
/// Returns `(base, valid length)` of every segment in base order.
///
/// A closed segment that ends with the end marker was closed cleanly and is trusted
/// without a scan (its successor may have been deleted by retention, so its length need
/// not reach the next base). Any other segment — always the last one — is scanned record
/// by record and cut after its last valid record; a closed one is sealed again so the next
/// open trusts it. A torn closed segment leaves a gap of positions that simply hold no
/// records.
///
/// `clean_end` is the end of the log a clean close recorded, if the last stop was one:
/// every record below it was synced, so a record below it that does not read back is
/// damage, not a torn write. Then nothing is cut and the open fails with
/// [`JournalError::Corrupt`] naming the first bad position (fail closed: acknowledged
/// messages are never cut away to make a start possible).
pub(crate) fn recover_log(dir: &Path, clean_end: Option<u64>) -> Result<Vec<(u64, u64)>, JournalError> {
    let mut bases = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        match entry.file_name().to_str().and_then(segment::parse_file_name) {
            Some(base) => bases.push(base),
            None => tracing::warn!(file = ?entry.path(), "ignoring unexpected file in the log directory"),
        }
    }
    bases.sort_unstable();
    let marker = segment::END_MARKER.len() as u64;
    let mut out = Vec::with_capacity(bases.len());
    for (i, &base) in bases.iter().enumerate() {
        let path = dir.join(segment::file_name(base));
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(io_err)?;
        let file_len = file.metadata().map_err(io_err)?.len();
        let room = bases.get(i + 1).map(|next| next - base);
        if let Some(room) = room {
            if segment::is_sealed(&file, file_len).map_err(io_err)? {
                out.push((base, (file_len - marker).min(room)));
                continue;
            }
        }
        let scanned = segment::scan(&file).map_err(io_err)?;
        let keep = room.map_or(scanned.valid_end, |r| scanned.valid_end.min(r));
        let only_marker_after = file_len == keep + marker && segment::is_sealed(&file, file_len).unwrap_or(false);
        // Below a clean stop's end every record was synced: a record there that does not
        // read back (or a last segment that ends before it) is damage.
        let damaged = keep < file_len && !only_marker_after;
        if let Some(end) = clean_end.filter(|&end| base + keep < end && (damaged || room.is_none())) {
            tracing::error!(
                segment = ?path,
                position = base + keep,
                clean_end = end,
                "commit log: a record below the end the last clean stop recorded does not read back; nothing cut"
            );
            return Err(JournalError::Corrupt(base + keep));
        }
        if keep < file_len && !only_marker_after {
            tracing::warn!(
                segment = ?path,
                valid_bytes = keep,
                file_bytes = file_len,
                records = scanned.records,
                "commit log: cutting a torn or corrupt tail"
            );
        }
        if keep < file_len || room.is_some() {
            file.set_len(keep).map_err(io_err)?;
            if room.is_some() {
                file.write_all_at(&segment::END_MARKER, keep).map_err(io_err)?;
            }
            file.sync_all().map_err(io_err)?;
        }
        out.push((base, keep));
    }
    if let Some(end) = clean_end.filter(|&end| end > 0 && out.is_empty()) {
        tracing::error!(clean_end = end, "commit log: no segment left below the end the last clean stop recorded");
        return Err(JournalError::Corrupt(0));
    }
    Ok(out)
}

/// What index recovery rebuilt.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// References per segment.
    pub(crate) refs: RefCounts,
    /// Counters per queue.
    pub(crate) queues: HashMap<u64, QueueState>,
}

/// Brings sled and the consume queues up to the end of `log` and returns the counters,
/// and whether they came from a scan of the index.
///
/// From the checkpoint: the consume queues' offsets are read back (`counters` and
/// `settled`), every effects record from there to the end is applied again (blind writes
/// and settlements: applying one that is already applied changes nothing), and the
/// counters are read from the `counters` tree, which the records write too. If there is no
/// checkpoint, sled's applied mark lies past the end of the log (it holds changes of lost
/// records), or an effects record does not read back, the index is scanned instead.
///
/// Either way the consume-queue files are cut at their queues' next offsets and synced,
/// and a checkpoint at the end of the log is written and sled flushed.
pub(crate) fn recover_state(db: &Db, log: &Log, cq: &ConsumeQueues) -> Result<(Index, bool), JournalError> {
    let end = log.end();
    restore_offsets(db, cq)?;
    let checkpoint = crate::checkpoint::position(db, crate::checkpoint::CHECKPOINT)?;
    let applied = crate::checkpoint::position(db, crate::checkpoint::APPLIED)?.unwrap_or(0);
    let replayed = match checkpoint {
        Some(from) if from <= end && applied <= end => replay(db, log, cq, from)?,
        Some(from) => {
            tracing::warn!(
                checkpoint = from,
                applied,
                log_end = end,
                "sled holds changes past the end of the commit log (lost in a power loss): scanning the index"
            );
            false
        }
        None => false,
    };
    let index = if replayed {
        trim_key_index(db, log)?;
        crate::checkpoint::read_counters(db)?
    } else {
        let index = recover_index(db, log, cq)?;
        crate::checkpoint::write_counters(db, &index)?;
        index
    };
    for (&q, st) in &index.queues {
        cq.raise_next(q, st.next);
    }
    cq.trim(|q| db.queue_ids.contains_key(codec::encode_u64(q)).unwrap_or(true)).map_err(io_err)?;
    cq.drain(&db.settled, end).map_err(db_err)?;
    cq.sync().map_err(io_err)?;
    crate::checkpoint::write(db, end)?;
    // Checkpointed: files below their queue's consume offset, and dead queues', can go.
    cq.delete_settled_files();
    Ok((index, !replayed))
}

/// Every queue's next offset as the `counters` tree holds it.
fn next_offsets(db: &Db) -> Result<HashMap<u64, u64>, JournalError> {
    let mut next = HashMap::new();
    for kv in db.counters.iter() {
        let (k, v) = kv.map_err(db_err)?;
        if let Some(Counter::Queue(q, n, _)) = codec::decode_counter(&k, &v) {
            next.insert(q, n);
        }
    }
    Ok(next)
}

/// The consume queues' offsets as of sled: next offsets from `counters`, the settled part
/// from `settled`.
fn restore_offsets(db: &Db, cq: &ConsumeQueues) -> Result<(), JournalError> {
    let next = next_offsets(db)?;
    let mut settled = HashMap::new();
    for kv in db.settled.iter() {
        let (k, v) = kv.map_err(db_err)?;
        let q = codec::decode_u64(&k)
            .ok_or_else(|| JournalError::Malformed { tree: codec::TREE_SETTLED, key: k.to_vec() })?;
        settled.insert(q, v.to_vec());
    }
    cq.restore(&next, settled).map_err(JournalError::Db)
}

/// Applies the effects records at `from` or later to sled and the consume queues; false
/// (after a warning) if one does not read back or decode.
fn replay(db: &Db, log: &Log, cq: &ConsumeQueues, from: u64) -> Result<bool, JournalError> {
    let trees = db.trees();
    let mut pending: Vec<Overlay> = (0..TREES).map(|_| Overlay::default()).collect();
    let (mut records, mut malformed) = (0u64, None);
    let read = log.read_effects(from, |pos, body| {
        if malformed.is_some() {
            return;
        }
        records += 1;
        let decoded = effects::decode(body, TREES, |(tree, key, value)| match value {
            Some(v) => pending[tree].insert(key, v),
            None => pending[tree].remove(key),
        });
        if decoded.is_none() {
            malformed = Some(pos);
        }
    })?;
    if let Some(pos) = read.err().or(malformed) {
        tracing::warn!(pos, from, "an effects record after the checkpoint does not read back: scanning the index");
        return Ok(false);
    }
    // Tree 0 is the consume queues'.
    cq.apply_changes(pending[0].take()).map_err(io_err)?;
    for (overlay, tree) in pending.iter_mut().skip(1).zip(trees) {
        overlay.apply(tree).map_err(db_err)?;
    }
    if records > 0 {
        tracing::info!(from, log_end = log.end(), records, "replayed the commit log after the checkpoint");
    }
    Ok(true)
}

/// Scans the consume queues and the `retained` and `timer` trees: drops (settles) missing
/// entries and entries that do not point inside a live segment — in particular every entry at or past the
/// valid end of the log — flushing sled if any were dropped, so that they cannot resurface
/// once new records occupy those positions; counts the rest.
pub(crate) fn recover_index(db: &Db, log: &Log, cq: &ConsumeQueues) -> Result<Index, JournalError> {
    let end = log.end();
    // Past the end, or in a gap / deleted segment: nothing readable is there.
    let live = |pos: u64, size: u32| size as u64 >= segment::RECORD_OVERHEAD && log.contains(pos, size);
    let mut index = Index::default();
    let mut count = |pos: u64| {
        if let Some(base) = log.locate(pos) {
            index.refs.inc(base);
        }
    };
    let mut dropped = 0u64;

    // Next offsets: the consume queues' and the counters' (the scan rewrites the tree after).
    for (q, next) in next_offsets(db)? {
        cq.raise_next(q, next);
    }
    let mut queues: HashMap<u64, QueueState> = HashMap::new();
    for q in cq.ids() {
        let next = cq.offsets(q).next;
        if next == 0 {
            continue;
        }
        let st = queues.entry(q).or_default();
        st.next = next;
        let mut at = 0;
        loop {
            let runs = cq.offsets(q).runs(at, 65_536);
            let Some(&(_, last)) = runs.last() else { break };
            for (a, b) in runs {
                let mut expected = a;
                for (off, p) in cq.read_block(q, a, b).map_err(io_err)? {
                    if off > expected {
                        cq.settle(q, expected, off);
                        dropped += off - expected;
                    }
                    if live(p.pos.0, p.size) {
                        st.len += 1;
                        count(p.pos.0);
                    } else {
                        cq.settle(q, off, off + 1);
                        dropped += 1;
                    }
                    expected = off + 1;
                }
                if b > expected {
                    cq.settle(q, expected, b);
                    dropped += b - expected;
                }
            }
            at = last;
        }
    }

    let mut removals = Batch::default();
    for kv in db.retained.iter() {
        let (k, v) = kv.map_err(db_err)?;
        // An entry that does not decode is not one the journal wrote: nothing is guessed.
        let decoded = codec::decode_retained(&v).filter(|_| std::str::from_utf8(&k).is_ok());
        match decoded.ok_or_else(|| JournalError::Malformed { tree: codec::TREE_RETAINED, key: k.to_vec() })? {
            (pos, size) if live(pos, size) => count(pos),
            _ => {
                removals.remove(k);
                dropped += 1;
            }
        }
    }
    apply(&db.retained, removals)?;

    let mut removals = Batch::default();
    for kv in db.timer.iter() {
        let (k, v) = kv.map_err(db_err)?;
        let malformed = || JournalError::Malformed { tree: codec::TREE_TIMER, key: k.to_vec() };
        let (_, pos) = codec::decode_timer_key(&k).ok_or_else(malformed)?;
        let (size, _) = codec::decode_timer_value(&v).ok_or_else(malformed)?;
        match live(pos, size) {
            true => count(pos),
            false => {
                removals.remove(k);
                dropped += 1;
            }
        }
    }
    apply(&db.timer, removals)?;

    let stale_keys = trim_key_index(db, log)?;
    if dropped + stale_keys > 0 {
        tracing::warn!(
            dropped,
            stale_keys,
            log_end = end,
            "dropped index entries that point outside the live commit log"
        );
        db.db.flush().map_err(db_err)?;
    }
    index.queues = queues;
    Ok(index)
}

/// Counts references per segment and entries per queue as sled and the consume queues hold
/// them now, without changing anything (diagnostics: compared with the writer's in-memory
/// counters).
pub(crate) fn recount(
    db: &Db,
    cq: &ConsumeQueues,
    locate: impl Fn(u64) -> Option<u64>,
) -> Result<(RefCounts, HashMap<u64, u64>), JournalError> {
    let mut refs = RefCounts::default();
    let mut count = |pos: u64| {
        if let Some(base) = locate(pos) {
            refs.inc(base);
        }
    };
    let mut lens: HashMap<u64, u64> = HashMap::new();
    for q in cq.ids() {
        let mut at = 0;
        loop {
            let page = cq.entries(q, at, 65_536).map_err(io_err)?;
            let Some(&(last, _)) = page.last() else { break };
            for (_, p) in page {
                *lens.entry(q).or_default() += 1;
                count(p.pos.0);
            }
            at = last + 1;
        }
    }
    for kv in db.retained.iter() {
        let (_, v) = kv.map_err(db_err)?;
        if let Some((pos, _)) = codec::decode_retained(&v) {
            count(pos);
        }
    }
    for kv in db.timer.iter() {
        let (k, _) = kv.map_err(db_err)?;
        if let Some((_, pos)) = codec::decode_timer_key(&k) {
            count(pos);
        }
    }
    Ok((refs, lens))
}

/// The key index holds no references: drops its entries past the end of the log, or before
/// the first live segment (retention deleted it and the process stopped before the index
/// followed). Returns how many.
fn trim_key_index(db: &Db, log: &Log) -> Result<u64, JournalError> {
    let end = log.end();
    Ok(drop_keys(db, end..u64::MAX)? + drop_keys(db, 0..log.first_base().min(end))?)
}

/// Removes the key-index entries of records at positions in `range` (both trees); returns
/// how many.
pub(crate) fn drop_keys(db: &Db, range: std::ops::Range<u64>) -> Result<u64, JournalError> {
    if range.is_empty() {
        return Ok(0);
    }
    let (mut by_key, mut by_pos, mut n) = (Batch::default(), Batch::default(), 0);
    let lo = codec::key_pos_key(range.start, 0, 0);
    let hi = codec::key_pos_key(range.end, 0, 0);
    for kv in db.key_pos.range(lo..hi) {
        let (k, _) = kv.map_err(db_err)?;
        if let Some((pos, hash, ts)) = codec::decode_key_index_key(&k) {
            by_key.remove(&codec::key_index_key(hash, ts, pos)[..]);
        }
        by_pos.remove(k);
        n += 1;
    }
    if n == 0 {
        return Ok(0);
    }
    apply(&db.key, by_key)?;
    apply(&db.key_pos, by_pos)?;
    Ok(n)
}

fn apply(tree: &Tree, batch: Batch) -> Result<(), JournalError> {
    tree.apply_batch(batch).map_err(db_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_seg(dir: &Path, base: u64, records: &[&[u8]], garbage: &[u8]) -> u64 {
        let mut buf = Vec::new();
        for r in records {
            segment::encode_record(&mut buf, b"", r);
        }
        let len = buf.len() as u64;
        buf.extend_from_slice(garbage);
        let mut f = fs::File::create(dir.join(segment::file_name(base))).unwrap();
        f.write_all(&buf).unwrap();
        len
    }

    #[test]
    fn cuts_tail_and_trusts_sealed_segments() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_seg(dir.path(), 0, &[b"one", b"two"], &segment::END_MARKER);
        let b = write_seg(dir.path(), a, &[b"three"], &[0xAB; 7]);
        assert_eq!(recover_log(dir.path(), None).unwrap(), vec![(0, a), (a, b)]);
        assert_eq!(fs::metadata(dir.path().join(segment::file_name(a))).unwrap().len(), b);

        // A sealed segment followed by a gap (its successor was deleted) is trusted.
        let dir = tempfile::tempdir().unwrap();
        let a = write_seg(dir.path(), 0, &[b"one", b"two"], &segment::END_MARKER);
        let c = write_seg(dir.path(), a + 1000, &[b"four"], &[]);
        assert_eq!(recover_log(dir.path(), None).unwrap(), vec![(0, a), (a + 1000, c)]);

        // An unsealed closed segment is scanned, cut and sealed; later ones are kept.
        let dir = tempfile::tempdir().unwrap();
        let a = write_seg(dir.path(), 0, &[b"one", b"two"], &[1, 2, 3]);
        let c = write_seg(dir.path(), a + 10, &[b"four"], &[]);
        assert_eq!(recover_log(dir.path(), None).unwrap(), vec![(0, a), (a + 10, c)]);
        assert_eq!(recover_log(dir.path(), None).unwrap(), vec![(0, a), (a + 10, c)]);
        let f = fs::File::open(dir.path().join(segment::file_name(0))).unwrap();
        assert!(segment::is_sealed(&f, a + segment::END_MARKER.len() as u64).unwrap());
    }
}
