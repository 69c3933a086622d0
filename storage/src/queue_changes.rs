//! The consume-queue changes of one group commit: per queue, entries added and entries
//! settled, by offset, kept as typed pointers until the effects record
//! ([`crate::effects::encode`]) and the consume queues ([`crate::cq`]) take them. No key or
//! value is encoded per entry: a fan-out appends its entries to each queue in offset order,
//! and each such change is a push at the end of its queue's list.

use std::collections::BTreeMap;

use crate::types::Pointer;

/// What became of one consume-queue entry: set to a pointer, or settled (`None`).
pub(crate) type EntryChange = Option<Pointer>;

/// The pending consume-queue changes of one group commit (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct QueueChanges {
    /// Per queue, its changes sorted by offset (one per offset).
    queues: BTreeMap<u64, Vec<(u64, EntryChange)>>,
}

impl QueueChanges {
    /// Records `change` for entry `offset` of `queue` (a later change of the same entry
    /// replaces the earlier one).
    pub(crate) fn set(&mut self, queue: u64, offset: u64, change: EntryChange) {
        let list = self.queues.entry(queue).or_default();
        match list.last() {
            None => list.push((offset, change)),
            Some(&(last, _)) if last < offset => list.push((offset, change)),
            // Out of order: an entry of this batch settled, or an older one; bounded by
            // the entries this batch changed in the queue.
            Some(_) => match list.binary_search_by_key(&offset, |&(o, _)| o) {
                Ok(i) => list[i].1 = change,
                Err(i) => list.insert(i, (offset, change)),
            },
        }
    }

    /// Entry `offset` of `queue` set to `pointer`.
    pub(crate) fn insert(&mut self, queue: u64, offset: u64, pointer: Pointer) {
        self.set(queue, offset, Some(pointer));
    }

    /// Entry `offset` of `queue` settled.
    pub(crate) fn remove(&mut self, queue: u64, offset: u64) {
        self.set(queue, offset, None);
    }

    /// The pending change of entry `offset` of `queue`, if any (`Some(None)`: settled).
    pub(crate) fn change(&self, queue: u64, offset: u64) -> Option<EntryChange> {
        let list = self.queues.get(&queue)?;
        list.binary_search_by_key(&offset, |&(o, _)| o).ok().map(|i| list[i].1)
    }

    /// The pending changes of `queue` in `from..to`, in offset order.
    pub(crate) fn changes_in(&self, queue: u64, from: u64, to: u64) -> &[(u64, EntryChange)] {
        let Some(list) = self.queues.get(&queue) else { return &[] };
        let lo = list.partition_point(|&(o, _)| o < from);
        let hi = list.partition_point(|&(o, _)| o < to);
        &list[lo..hi.max(lo)]
    }

    /// Every queue's changes, by queue id, each in offset order.
    pub(crate) fn queues(&self) -> impl Iterator<Item = (u64, &[(u64, EntryChange)])> {
        self.queues.iter().map(|(&q, list)| (q, &list[..]))
    }

    /// Every change as (queue, offset, change), by queue then offset.
    pub(crate) fn into_changes(self) -> impl Iterator<Item = (u64, u64, EntryChange)> {
        self.queues.into_iter().flat_map(|(q, list)| list.into_iter().map(move |(o, c)| (q, o, c)))
    }

    /// Takes the changes out.
    pub(crate) fn take(&mut self) -> QueueChanges {
        std::mem::take(self)
    }

    /// Drops the changes.
    pub(crate) fn clear(&mut self) {
        self.queues.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LogPos;

    fn p(pos: u64) -> Pointer {
        Pointer { pos: LogPos(pos), size: 40, body_len: 8, tag_hash: 0, flags: 0 }
    }

    #[test]
    fn changes_stay_sorted_and_the_last_one_wins() {
        let mut c = QueueChanges::default();
        // Queue 7: 10..13 appended, 11 settled, an older entry (3) settled, 12 re-flagged.
        for off in 10..13 {
            c.insert(7, off, p(off));
        }
        c.remove(7, 11);
        c.remove(7, 3);
        let mut flagged = p(12);
        flagged.flags = 4;
        c.insert(7, 12, flagged);
        c.insert(2, 0, p(1));
        assert_eq!(c.change(7, 11), Some(None));
        assert_eq!(c.change(7, 12), Some(Some(flagged)));
        assert_eq!(c.change(7, 4), None);
        assert_eq!(c.change(8, 0), None);
        assert_eq!(c.changes_in(7, 4, 12), &[(10, Some(p(10))), (11, None)]);
        assert_eq!(c.changes_in(7, 12, 4), &[]);
        assert_eq!(c.changes_in(9, 0, 100), &[]);
        let all: Vec<_> = c.take().into_changes().collect();
        assert_eq!(
            all,
            vec![(2, 0, Some(p(1))), (7, 3, None), (7, 10, Some(p(10))), (7, 11, None), (7, 12, Some(flagged))]
        );
        assert!(c.queues().next().is_none(), "taken");
    }
}
