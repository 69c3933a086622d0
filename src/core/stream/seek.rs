//! Finding positions in a stream stored in the journal: the first entry at or after an
//! offset, and the first entry stored at or after a point in time (binary search over
//! offsets, reading O(log n) records — the only place a stream reads bodies to seek).

use ferrymq_storage::{Journal, Pointer, QueueId};

use crate::core::queue::read_message;

/// The first entry of `queue` at or after offset `from`.
pub(super) fn entry_at_or_after(journal: &Journal, queue: QueueId, from: u64) -> Option<(u64, Pointer)> {
    journal.queue_entries(queue, from, 1).ok()?.into_iter().next()
}

/// The first offset in `first..end` whose message was stored at or after `at_ms` (broker
/// clock); `end` when none is. Timestamps grow with offsets (the broker stamps messages as
/// it stores them); an unreadable entry counts as older.
pub(super) fn offset_for_timestamp(journal: &Journal, queue: QueueId, first: u64, end: u64, at_ms: u64) -> u64 {
    let (mut lo, mut hi) = (first, end);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let Some((offset, ptr)) = entry_at_or_after(journal, queue, mid).filter(|(o, _)| *o < hi) else {
            hi = mid;
            continue;
        };
        match read_message(journal, &ptr) {
            Some(m) if m.timestamp_ms >= at_ms => hi = offset,
            _ => lo = offset + 1,
        }
    }
    lo
}
