//! Consumers of a queue and what they are sent.

use ferrymq_storage::QueueId;
use tokio::sync::mpsc;

use crate::core::delivery::QueueDelivery;

/// Identifies a consumer (unique per broker run).
pub(crate) type ConsumerId = u64;

/// What a queue sends to a consumer's connection.
#[derive(Debug)]
pub enum ConsumerEvent {
    /// An entry handed to the consumer.
    Deliver(QueueDelivery),
    /// The queue was deleted: the consumer is gone (AMQP server-sent basic.cancel).
    Cancelled {
        /// Queue that was deleted; each consumer attached to it gets this event once.
        queue: QueueId,
        /// The consumer that was attached to it.
        consumer: ConsumerId,
    },
}

/// A consumer attached to a queue.
#[derive(Debug)]
pub struct Consumer {
    /// Id the connection chose ([`Broker::next_id`](crate::core::broker::Broker::next_id), for MQTT its
    /// connection id); acks, credit and detach name it.
    pub id: ConsumerId,
    /// Where deliveries go (bounded in effect by `credit`).
    pub tx: mpsc::UnboundedSender<ConsumerEvent>,
    /// Deliveries it may receive before acking.
    pub credit: u32,
    /// Highest QoS it takes (MQTT shared-subscription members: their granted QoS).
    pub max_qos: u8,
    /// Consumer priority (`x-priority`): higher ones are served first.
    pub priority: i32,
}
