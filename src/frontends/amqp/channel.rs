//! Per-channel state of an AMQP connection: consumers, delivery tags and what is
//! unacknowledged, prefetch (per consumer and global), flow, confirm and transaction mode.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::core::store::QueueId;

use crate::core::delivery::QueueDelivery;
use crate::core::message::SharedMessage;
use crate::core::queue::ConsumerId;
use crate::core::router::Routes;

/// A consumer started with basic.consume.
#[derive(Debug, Clone)]
pub(crate) struct ChannelConsumer {
    /// Consumer tag as given in basic.consume (`amq.ctag-...` generated when empty); unique per connection.
    pub tag: String,
    /// Queue it consumes from.
    pub queue: QueueId,
    /// Queue name (for auto-delete bookkeeping).
    pub queue_name: String,
    /// Deliveries are not acknowledged by the client.
    pub no_ack: bool,
    /// Consumes a stream: deliveries carry `x-stream-offset`; settling only gives credit.
    pub stream: bool,
    /// Member of a partitioned or single-active group: its going is told to the core
    /// ([`crate::core::broker::Broker::leave_stream_group`]).
    pub assigned: bool,
}

/// A delivery waiting for the client's ack.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unacked {
    /// Queue the delivery came from; the settlement goes to its owner.
    pub queue: QueueId,
    /// Offset of the delivered entry in that queue, named by the ack/nack/reject command.
    pub offset: u64,
    /// Consumer it went to (the channel's get id for basic.get).
    pub consumer: ConsumerId,
    /// From a stream: any settlement is an ack that gives credit back.
    pub stream: bool,
}

/// What an ack-like method does to a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// basic.ack.
    Ack,
    /// nack/reject with requeue.
    Requeue,
    /// nack/reject without requeue (dead-letter or drop).
    Discard,
}

/// A publish held back in a transaction until commit.
#[derive(Debug)]
pub(crate) struct TxPublish {
    /// The message to publish at commit.
    pub msg: SharedMessage,
    /// Where it goes (reject-publish queues admit it at commit).
    pub routes: std::sync::Arc<Routes>,
    /// When set, a delayed publish: stored at commit and routed at this time.
    pub due_ms: Option<u64>,
}

/// One open channel.
#[derive(Debug, Default)]
pub(crate) struct Channel {
    /// Consumers by id.
    pub consumers: HashMap<ConsumerId, ChannelConsumer>,
    /// Next delivery tag to hand out.
    pub next_tag: u64,
    /// Deliveries awaiting ack, by delivery tag.
    pub unacked: BTreeMap<u64, Unacked>,
    /// Prefetch count for consumers started from now on (basic.qos, global = false).
    pub prefetch: u16,
    /// Prefetch shared by the channel's consumers (basic.qos, global = true); 0 = none.
    pub global_prefetch: u16,
    /// Deliveries received from queues but held back (flow off or global prefetch).
    pub held: VecDeque<QueueDelivery>,
    /// Channel.Flow(active = false) received: deliveries are held until it is resumed.
    pub flow_paused: bool,
    /// Confirm.Select received: the channel's publishes are confirmed with Basic.Ack/Nack.
    pub confirm: bool,
    /// Tx.Select received: publishes and settlements wait in `tx_publishes`/`tx_settles` for Tx.Commit.
    pub tx: bool,
    /// Publishes of the open transaction.
    pub tx_publishes: Vec<TxPublish>,
    /// Acks of the open transaction.
    pub tx_settles: Vec<(u64, bool, Settle)>,
    /// Consumer id used for basic.get deliveries of this channel.
    pub get_consumer: ConsumerId,
}

impl Channel {
    /// A fresh channel whose basic.get deliveries use `get_consumer`.
    pub(crate) fn new(get_consumer: ConsumerId) -> Channel {
        Channel { next_tag: 1, get_consumer, ..Default::default() }
    }

    /// True when the global prefetch allows another delivery.
    pub(crate) fn may_deliver(&self) -> bool {
        !self.flow_paused && (self.global_prefetch == 0 || self.unacked_by_consumers() < self.global_prefetch as usize)
    }

    fn unacked_by_consumers(&self) -> usize {
        self.unacked.values().filter(|u| u.consumer != self.get_consumer).count()
    }

    /// Assigns the next delivery tag.
    pub(crate) fn take_tag(&mut self) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        tag
    }

    /// The unacked deliveries an ack of `tag` (with `multiple`) covers; `None` when the
    /// tag is unknown (a channel error, 406).
    pub(crate) fn settle(&mut self, tag: u64, multiple: bool) -> Option<Vec<Unacked>> {
        if multiple {
            if tag == 0 {
                return Some(std::mem::take(&mut self.unacked).into_values().collect());
            }
            if !self.unacked.contains_key(&tag) && self.unacked.range(..=tag).next().is_none() {
                return None;
            }
            let rest = self.unacked.split_off(&(tag + 1));
            let covered = std::mem::replace(&mut self.unacked, rest);
            Some(covered.into_values().collect())
        } else {
            self.unacked.remove(&tag).map(|u| vec![u])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unacked(offset: u64) -> Unacked {
        Unacked { queue: QueueId(1), offset, consumer: 7, stream: false }
    }

    #[test]
    fn settle_single_and_multiple() {
        let mut c = Channel::new(99);
        for _ in 0..5 {
            let tag = c.take_tag();
            c.unacked.insert(tag, unacked(tag * 10));
        }
        assert_eq!(c.settle(2, false).map(|v| v.len()), Some(1));
        assert!(c.settle(2, false).is_none(), "already acked: unknown tag");
        let covered: Vec<u64> = c.settle(4, true).unwrap().iter().map(|u| u.offset).collect();
        assert_eq!(covered, vec![10, 30, 40]);
        assert_eq!(c.unacked.len(), 1);
        assert!(c.settle(3, true).is_none(), "nothing left at or below 3");
        assert_eq!(c.settle(0, true).map(|v| v.len()), Some(1), "multiple with tag 0: everything");
    }

    #[test]
    fn global_prefetch_counts_consumer_deliveries() {
        let mut c = Channel::new(99);
        c.global_prefetch = 1;
        assert!(c.may_deliver());
        c.unacked.insert(1, unacked(1));
        assert!(!c.may_deliver());
        c.flow_paused = true;
        c.global_prefetch = 0;
        assert!(!c.may_deliver());
    }
}
