//! A declared queue as the registry keeps it: identity, the declaration's flags and
//! arguments, the configuration derived from them, and the consumer bookkeeping the
//! front-ends share (exclusive consumer, consumer count, last use for `x-expires`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::arguments::arg_u64;
use crate::core::message::now_ms;
use crate::core::queue::QueueConfig;
use crate::core::store::QueueId;
use crate::core::stream::StreamConfig;
use crate::core::value::Value;

/// A declared AMQP queue: identity, queue.declare flags and arguments, consumer bookkeeping.
#[derive(Debug)]
pub struct QueueEntity {
    /// Virtual host the queue belongs to; with `name`, its key in [`Entities`](super::Entities).
    pub vhost: String,
    /// Queue name within the vhost; the default exchange routes this routing key to it.
    pub name: String,
    /// Id of the consume queue holding its messages (from its storage name).
    pub id: QueueId,
    /// Declared durable and not exclusive: its record is stored and restored at start-up.
    pub durable: bool,
    /// Owning connection of an exclusive queue.
    pub exclusive_owner: Option<u64>,
    /// Deleted when its last consumer goes.
    pub auto_delete: bool,
    /// queue.declare arguments as given: the known `x-` ones must match on redeclare; stored when durable.
    pub arguments: Vec<(String, Value)>,
    /// Behaviour derived from the arguments.
    pub config: Arc<QueueConfig>,
    /// Retention of a stream (`x-queue-type: stream`); `None` for other queues.
    pub stream: Option<Arc<StreamConfig>>,
    /// Has had a consumer (auto-delete only deletes after one went away).
    pub had_consumer: AtomicBool,
    /// Consumer holding it exclusively (basic.consume exclusive).
    pub exclusive_consumer: Mutex<Option<u64>>,
    /// Consumers now (kept by the connections, so checks do not race the queue's shard).
    pub consumers: AtomicU64,
    /// Last use (declare, consume, get), ms: for `x-expires`.
    pub last_used_ms: AtomicU64,
}

impl QueueEntity {
    /// `x-expires` in ms.
    pub fn expires_ms(&self) -> Option<u64> {
        arg_u64(&self.arguments, "x-expires")
    }

    /// True for a stream (`x-queue-type: stream`).
    pub fn is_stream(&self) -> bool {
        self.stream.is_some()
    }

    /// Marks the queue used now.
    pub fn touch(&self) {
        self.last_used_ms.store(now_ms(), Ordering::Relaxed);
    }
}
