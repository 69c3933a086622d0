//! A stream consumer: its own read position (cursor), credit (prefetch) and the offsets
//! delivered and not yet acknowledged. Acks only give credit back: nothing is removed
//! from the stream. A member of a consumer group reads through its group's shared cursor
//! instead of its own.

use std::collections::BTreeSet;

use ferrymq_storage::Pointer;
use tokio::sync::mpsc;

use super::reader::Reader;
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
    /// Offsets delivered and not acknowledged.
    pub unacked: BTreeSet<u64>,
    /// The consumer group it belongs to (`x-consumer-group`), if any.
    pub group: Option<String>,
    /// Own read position (unused by group members).
    pub(super) reader: Reader,
}

impl StreamConsumer {
    /// A consumer reading from offset `next` with `credit` deliveries in hand.
    pub fn new(id: ConsumerId, tx: mpsc::UnboundedSender<ConsumerEvent>, credit: u32, next: u64, group: Option<String>) -> StreamConsumer {
        StreamConsumer { id, tx, credit, unacked: BTreeSet::new(), group, reader: Reader::at(next) }
    }

    /// Server-side filter hook: true when the entry is for this consumer (or its group).
    /// Decided from the pointer alone (its `tag_hash`), so skipped entries cost no body
    /// read and no credit. Every entry passes until `x-tag-filter` on stream consumers
    /// lands: keep a `core::tag_filter::TagFilter` on the consumer and answer
    /// `filter.may_match_hash(ptr.tag_hash)` here (a hash collision is then resolved with
    /// `TagFilter::matches` on the message's tag before delivery).
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
}
