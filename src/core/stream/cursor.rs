//! A stream consumer: its own read position (cursor), credit (prefetch) and the offsets
//! delivered and not yet acknowledged, plus a page of pointers read ahead from storage.
//! Acks only give credit back: nothing is removed from the stream.

use std::collections::{BTreeSet, VecDeque};

use ferrymq_storage::Pointer;
use tokio::sync::mpsc;

use crate::core::queue::{ConsumerEvent, ConsumerId};

/// One consumer of a stream.
#[derive(Debug)]
pub struct StreamConsumer {
    /// Id (unique per broker run).
    pub id: ConsumerId,
    /// Where deliveries go (bounded in effect by `credit`).
    pub tx: mpsc::UnboundedSender<ConsumerEvent>,
    /// Deliveries it may still receive before acking.
    pub credit: u32,
    /// Next offset to read.
    pub next: u64,
    /// Offsets delivered and not acknowledged.
    pub unacked: BTreeSet<u64>,
    /// Pointers read from storage at or after `next`, not delivered yet.
    pub(super) page: VecDeque<(u64, Pointer)>,
}

impl StreamConsumer {
    /// A consumer reading from offset `next` with `credit` deliveries in hand.
    pub fn new(id: ConsumerId, tx: mpsc::UnboundedSender<ConsumerEvent>, credit: u32, next: u64) -> StreamConsumer {
        StreamConsumer { id, tx, credit, next, unacked: BTreeSet::new(), page: VecDeque::new() }
    }

    /// Server-side filter hook: true when the entry is for this consumer. Decided from the
    /// pointer alone (its `tag_hash`), so skipped entries cost no body read and no credit.
    /// Every entry passes until `x-tag-filter` on stream consumers lands (the tag-filter
    /// module matches `ptr.tag_hash` here, and resolves a hash collision on the body).
    pub fn admits(&self, ptr: &Pointer) -> bool {
        let _ = ptr.tag_hash;
        true
    }

    /// The client acknowledged `offset` (or nacked / rejected it: a stream treats those as
    /// acks, as RabbitMQ does): one more credit. False for an offset it does not hold.
    pub fn settle(&mut self, offset: u64) -> bool {
        if self.unacked.remove(&offset) {
            self.credit = self.credit.saturating_add(1);
            true
        } else {
            false
        }
    }

    /// Moves the cursor forward to `first` when the entries under it were trimmed.
    pub fn skip_trimmed(&mut self, first: u64) {
        if self.next < first {
            self.next = first;
        }
        while self.page.front().is_some_and(|(o, _)| *o < first) {
            self.page.pop_front();
        }
    }
}
