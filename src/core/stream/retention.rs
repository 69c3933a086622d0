//! Stream retention: which oldest entries to trim so that the stream keeps within its
//! `x-max-age` and `x-max-length-bytes`. Pure planning over the journal's index (pointer
//! pages, plus O(log n) record reads for the age cut); the stream applies the plan as one
//! range removal, and the journal frees commit-log segments once nothing refers into them.

use ferrymq_storage::{Journal, QueueId};

use super::config::StreamConfig;
use super::seek::{entry_at_or_after, offset_for_timestamp};
use crate::core::queue::read_message;

/// Most entries trimmed from one stream in one pass; a longer backlog goes over the next
/// passes, so a pass never stalls the shard for long.
pub(crate) const MAX_TRIM_PER_PASS: u64 = 65_536;
/// Pointers read per index page while planning.
const PAGE: usize = 1024;

/// Entries to remove: offsets `from..to`, whose bodies total `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trim {
    /// First offset removed (the stream's first).
    pub from: u64,
    /// First offset kept.
    pub to: u64,
    /// Body bytes of the removed entries.
    pub bytes: u64,
}

/// The live part of a stream as its owner knows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extent {
    /// Oldest live offset.
    pub first: u64,
    /// Next offset to be assigned.
    pub next: u64,
    /// Body bytes of the live entries.
    pub bytes: u64,
}

/// What to trim now, if anything: every entry older than `max_age` and the oldest ones
/// while the stream holds more than `max_bytes` (at most [`MAX_TRIM_PER_PASS`] entries).
pub(crate) fn plan(
    journal: &Journal,
    queue: QueueId,
    extent: Extent,
    config: &StreamConfig,
    now_ms: u64,
) -> Option<Trim> {
    if extent.first >= extent.next {
        return None;
    }
    let mut age_cut = extent.first;
    if let Some(max_age) = config.max_age_ms {
        let cutoff = now_ms.saturating_sub(max_age);
        // Cheap check first: is the oldest entry old enough to go at all?
        let oldest_expired = entry_at_or_after(journal, queue, extent.first)
            .and_then(|(_, p)| read_message(journal, &p))
            .is_some_and(|m| m.timestamp_ms < cutoff);
        if oldest_expired {
            age_cut = offset_for_timestamp(journal, queue, extent.first, extent.next, cutoff);
        }
    }
    let excess = config.max_bytes.map_or(0, |max| extent.bytes.saturating_sub(max));
    if age_cut <= extent.first && excess == 0 {
        return None;
    }
    let limit = extent.first.saturating_add(MAX_TRIM_PER_PASS);
    let (mut to, mut bytes) = (extent.first, 0u64);
    'pages: loop {
        let page = match journal.queue_entries(queue, to, PAGE) {
            Ok(p) if !p.is_empty() => p,
            _ => break,
        };
        for (offset, ptr) in page {
            if offset >= extent.next || offset >= limit || (offset >= age_cut && bytes >= excess) {
                break 'pages;
            }
            bytes += ptr.body_len as u64;
            to = offset + 1;
        }
    }
    (to > extent.first).then_some(Trim { from: extent.first, to, bytes })
}

/// Body bytes of the entries at offsets in `range` (a pointer scan, no body reads).
pub(crate) fn body_bytes(journal: &Journal, queue: QueueId, range: std::ops::Range<u64>) -> u64 {
    let (mut from, mut bytes) = (range.start, 0u64);
    while from < range.end {
        let page = match journal.queue_entries(queue, from, PAGE) {
            Ok(p) if !p.is_empty() => p,
            _ => break,
        };
        bytes += page.iter().filter(|(o, _)| *o < range.end).map(|(_, p)| p.body_len as u64).sum::<u64>();
        from = page[page.len() - 1].0 + 1;
    }
    bytes
}
