//! Consumer groups on a stream (`x-consumer-group`): members share one cursor, each entry
//! goes to one member, and the group's progress is a committed offset kept in the journal
//! (`kv:cursor`), advanced as acks become contiguous. Acks above a gap are remembered
//! with it, so a group that resumes (after its members left, or a restart) redelivers
//! nothing acked and skips nothing unacked. Entries a departing member held unacked go to
//! the remaining members first.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};
use ferrymq_storage::{Journal, JournalError, Op, QueueId, Space};

use super::reader::Reader;
use crate::core::queue::ConsumerId;

/// A group's durable progress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupCursor {
    /// Every offset below this is acknowledged by the group.
    pub committed: u64,
    /// Offsets at or above `committed` already acknowledged (above a gap).
    pub acked: BTreeSet<u64>,
}

impl GroupCursor {
    /// A cursor at `offset` with nothing acked above it.
    pub fn at(offset: u64) -> GroupCursor {
        GroupCursor { committed: offset, acked: BTreeSet::new() }
    }

    /// Encoding: committed u64 BE, then each acked offset u64 BE.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(8 * (1 + self.acked.len()));
        b.put_u64(self.committed);
        for o in &self.acked {
            b.put_u64(*o);
        }
        b.freeze()
    }

    /// Decodes [`GroupCursor::encode`]'s output; `None` when malformed.
    pub fn decode(b: &[u8]) -> Option<GroupCursor> {
        if b.len() < 8 || !b.len().is_multiple_of(8) {
            return None;
        }
        let mut words = b.chunks_exact(8).map(|c| u64::from_be_bytes(c.try_into().unwrap_or_default()));
        let committed = words.next()?;
        Some(GroupCursor { committed, acked: words.filter(|o| *o >= committed).collect() })
    }

    /// Records an ack of `offset`; the committed offset moves over contiguous acks.
    pub fn ack(&mut self, offset: u64) -> bool {
        if offset < self.committed || !self.acked.insert(offset) {
            return false;
        }
        while self.acked.remove(&self.committed) {
            self.committed += 1;
        }
        true
    }

    /// Moves the committed offset up to `first` (entries below it were trimmed).
    pub fn skip_trimmed(&mut self, first: u64) -> bool {
        if self.committed >= first {
            return false;
        }
        self.committed = first;
        self.acked = self.acked.split_off(&first);
        while self.acked.remove(&self.committed) {
            self.committed += 1;
        }
        true
    }
}

/// The journal key of a group's cursor: stream id (u64 BE) then the group name.
pub(crate) fn cursor_key(stream: QueueId, group: &str) -> Bytes {
    let mut k = BytesMut::with_capacity(8 + group.len());
    k.put_u64(stream.0);
    k.put_slice(group.as_bytes());
    k.freeze()
}

/// The op that stores a group's cursor (the storage operation behind a reset).
pub(crate) fn store_cursor(stream: QueueId, group: &str, cursor: &GroupCursor) -> Op {
    Op::Put { space: Space::Cursor, key: cursor_key(stream, group), value: cursor.encode() }
}

/// The op that forgets every group cursor of a stream (the stream is deleted).
pub(crate) fn forget_cursors(stream: QueueId) -> Op {
    Op::DeletePrefix { space: Space::Cursor, prefix: Bytes::copy_from_slice(&stream.0.to_be_bytes()) }
}

/// The stored cursor of a group, if it has one.
pub(crate) fn load_cursor(
    journal: &Journal,
    stream: QueueId,
    group: &str,
) -> Result<Option<GroupCursor>, JournalError> {
    Ok(journal.get(Space::Cursor, &cursor_key(stream, group))?.and_then(|b| GroupCursor::decode(&b)))
}

/// A consumer group's live state in its stream's owner.
#[derive(Debug)]
pub(crate) struct Group {
    /// What the group has acknowledged: the part of its state that is stored ([`load_cursor`]).
    pub cursor: GroupCursor,
    /// Next offset never handed to a member.
    pub(super) reader: Reader,
    /// Offsets handed out whose member left without acking: delivered again first.
    pub(super) returned: BTreeSet<u64>,
    /// Offsets out with a member.
    pub(super) in_flight: BTreeMap<u64, ConsumerId>,
    /// Round-robin position: the consumer index to try first.
    pub(super) rr: usize,
    /// The cursor changed since it was last stored.
    pub(super) dirty: bool,
    /// One member at a time reads this group's entries ([`super::assignment`]): the
    /// stream is a partition of a super stream, or the group is single-active.
    pub(super) exclusive: bool,
    /// The member allowed to read when `exclusive` (none: nobody, until one is chosen).
    pub(super) active: Option<ConsumerId>,
}

impl Group {
    /// A group resuming from `cursor` (new groups: `dirty`, so that they are stored).
    pub(crate) fn resume(cursor: GroupCursor, dirty: bool) -> Group {
        let reader = Reader::at(cursor.committed);
        Group {
            cursor,
            reader,
            returned: BTreeSet::new(),
            in_flight: BTreeMap::new(),
            rr: 0,
            dirty,
            exclusive: false,
            active: None,
        }
    }

    /// A member acked (or nacked / rejected) `offset`.
    pub(crate) fn ack(&mut self, offset: u64) {
        self.in_flight.remove(&offset);
        self.returned.remove(&offset);
        self.dirty |= self.cursor.ack(offset);
    }

    /// A member left holding `offsets` unacked: they go to the remaining members.
    pub(crate) fn returned_by(&mut self, offsets: impl IntoIterator<Item = u64>) {
        for o in offsets {
            if self.in_flight.remove(&o).is_some() && o >= self.cursor.committed && !self.cursor.acked.contains(&o) {
                self.returned.insert(o);
            }
        }
    }

    /// Moves the group to `cursor` (reset): what is in flight is forgotten, reading
    /// restarts at the new committed offset.
    pub(crate) fn reset(&mut self, cursor: GroupCursor) {
        self.reader.seek(cursor.committed);
        self.cursor = cursor;
        self.returned.clear();
        self.in_flight.clear();
        self.dirty = true;
    }

    /// The member that may read next, when one at a time does: `None` while another
    /// member still holds entries (the hand-over waits for them to be settled or
    /// returned, so the partition stays in order) or when no member is active.
    /// `Some(None)`: any member may read.
    pub(super) fn reader_gate(&self) -> Option<Option<ConsumerId>> {
        if !self.exclusive {
            return Some(None);
        }
        let active = self.active?;
        self.in_flight.values().all(|c| *c == active).then_some(Some(active))
    }

    /// Entries below `first` were trimmed.
    pub(crate) fn skip_trimmed(&mut self, first: u64) {
        self.dirty |= self.cursor.skip_trimmed(first);
        self.reader.skip_trimmed(first);
        self.returned = self.returned.split_off(&first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_above_a_gap_are_kept_until_it_closes() {
        let mut c = GroupCursor::at(5);
        assert!(c.ack(7));
        assert!(c.ack(6));
        assert_eq!((c.committed, c.acked.len()), (5, 2));
        assert!(c.ack(5));
        assert_eq!((c.committed, c.acked.len()), (8, 0));
        assert!(!c.ack(3), "below committed: already done");
        c.ack(10);
        let back = GroupCursor::decode(&c.encode()).unwrap();
        assert_eq!(back, c);
        assert!(GroupCursor::decode(b"short").is_none());
        assert!(c.skip_trimmed(10));
        assert_eq!((c.committed, c.acked.len()), (11, 0));
    }
}
