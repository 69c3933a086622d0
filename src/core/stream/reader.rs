//! Reading a stream forward from an offset: from the in-memory tail of recent entries when
//! it holds the offset, else from a page of pointers read ahead from the journal, the body
//! read only when the entry is delivered. Used by each consumer's cursor and by each
//! consumer group's shared cursor.

use std::collections::VecDeque;

use ferrymq_storage::{Journal, Pointer, QueueId};
use tracing::warn;

use crate::core::message::SharedMessage;

/// Pointers read from storage at a time by a reader that is behind.
const PAGE: usize = 256;

/// A recent entry kept in memory with its message.
#[derive(Debug)]
pub(super) struct TailEntry {
    pub(super) offset: u64,
    pub(super) ptr: Pointer,
    pub(super) msg: SharedMessage,
}

/// A read position with its read-ahead page.
#[derive(Debug, Default)]
pub(super) struct Reader {
    /// Next offset to read.
    pub(super) next: u64,
    /// Pointers read from storage at or after `next`.
    page: VecDeque<(u64, Pointer)>,
}

impl Reader {
    pub(super) fn at(next: u64) -> Reader {
        Reader { next, page: VecDeque::new() }
    }

    /// Moves to `offset` (forgets the read-ahead).
    pub(super) fn seek(&mut self, offset: u64) {
        self.next = offset;
        self.page.clear();
    }

    /// Moves forward to `first` when the entries under the position were trimmed.
    pub(super) fn skip_trimmed(&mut self, first: u64) {
        if self.next < first {
            self.next = first;
        }
        while self.page.front().is_some_and(|(o, _)| *o < first) {
            self.page.pop_front();
        }
    }

    /// The next entry below `end` (the stream's next offset), advancing past it: its
    /// offset, pointer and, when the tail had it, the message. `None` at the end.
    pub(super) fn advance(
        &mut self,
        tail: &VecDeque<TailEntry>,
        journal: &Journal,
        queue: QueueId,
        end: u64,
    ) -> Option<(u64, Pointer, Option<SharedMessage>)> {
        if self.next >= end {
            return None;
        }
        while self.page.front().is_some_and(|(o, _)| *o < self.next) {
            self.page.pop_front();
        }
        if let Some(e) = tail_lookup(tail, self.next) {
            if self.page.front().is_some_and(|(o, _)| *o == e.offset) {
                self.page.pop_front();
            }
            self.next = e.offset + 1;
            return Some((e.offset, e.ptr, Some(e.msg.clone())));
        }
        if self.page.is_empty() {
            match journal.queue_entries(queue, self.next, PAGE) {
                Ok(page) if !page.is_empty() => self.page.extend(page),
                Ok(_) => {
                    self.next = end;
                    return None;
                }
                Err(e) => {
                    warn!(stream = queue.0, error = %e, "cannot page in stream entries");
                    return None;
                }
            }
        }
        let (offset, ptr) = *self.page.front()?;
        if offset >= end {
            // Stored, but its append has not reached the owner yet.
            return None;
        }
        self.page.pop_front();
        self.next = offset + 1;
        Some((offset, ptr, None))
    }
}

fn tail_lookup(tail: &VecDeque<TailEntry>, offset: u64) -> Option<&TailEntry> {
    let front = tail.front()?.offset;
    if offset < front {
        return None;
    }
    // Usually contiguous: try the direct index first.
    let guess = (offset - front) as usize;
    if tail.get(guess).is_some_and(|e| e.offset == offset) {
        return tail.get(guess);
    }
    tail.binary_search_by_key(&offset, |e| e.offset).ok().and_then(|i| tail.get(i))
}
