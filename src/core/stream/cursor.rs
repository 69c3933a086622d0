//! A stream consumer: its own read position (cursor), credit (prefetch) and the offsets
//! delivered and not yet acknowledged. Acks only give credit back: nothing is removed
//! from the stream. A member of a consumer group reads through its group's shared cursor
//! instead of its own.

use std::collections::BTreeSet;

use ferrymq_storage::Pointer;
use tokio::sync::mpsc;

use super::reader::Reader;
use crate::core::message::Message;
use crate::core::queue::{ConsumerEvent, ConsumerId};
use crate::core::tag_filter::TagFilter;

/// One consumer of a stream.
#[derive(Debug)]
pub(crate) struct StreamConsumer {
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
    /// Server-side tag filter (`x-tag-filter` consume argument): other entries are skipped.
    pub filter: Option<TagFilter>,
    /// Cancelled (basic.cancel) with deliveries still unacked: it gets nothing more, and
    /// stays only until those are settled or returned.
    pub cancelled: bool,
}

impl StreamConsumer {
    /// A consumer reading from offset `next` with `credit` deliveries in hand.
    pub(crate) fn new(
        id: ConsumerId,
        tx: mpsc::UnboundedSender<ConsumerEvent>,
        credit: u32,
        next: u64,
        group: Option<String>,
    ) -> StreamConsumer {
        StreamConsumer {
            id,
            tx,
            credit,
            unacked: BTreeSet::new(),
            group,
            reader: Reader::at(next),
            filter: None,
            cancelled: false,
        }
    }

    /// Server-side filter hook: true when the entry is for this consumer (or its group).
    /// Decided from the pointer alone (its `tag_hash`), so skipped entries cost no body
    /// read and no credit; a hash collision is resolved by [`StreamConsumer::accepts`].
    pub(crate) fn admits(&self, ptr: &Pointer) -> bool {
        self.filter.as_ref().is_none_or(|f| f.may_match_hash(ptr.tag_hash))
    }

    /// The final word once the message is read: its tag itself matches the filter.
    pub(crate) fn accepts(&self, msg: &Message) -> bool {
        self.filter.as_ref().is_none_or(|f| f.matches(msg.tag()))
    }

    /// The client acknowledged `offset` (or nacked / rejected it: a stream treats those as
    /// acks, as RabbitMQ does): one more credit (none once cancelled). False for an offset
    /// it does not hold.
    pub(crate) fn settle(&mut self, offset: u64) -> bool {
        if !self.unacked.remove(&offset) {
            return false;
        }
        if !self.cancelled {
            self.credit = self.credit.saturating_add(1);
        }
        true
    }

    /// A cancelled consumer that holds nothing more: it can go.
    pub(crate) fn is_done(&self) -> bool {
        self.cancelled && self.unacked.is_empty()
    }
}
