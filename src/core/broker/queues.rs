//! The queue owners through the door: consumers attach and detach, deliveries are settled,
//! queues are purged, counted and read, stream groups are joined and reset. Each method is
//! one command to the shard that owns the queue ([`crate::core::shards`]); none waits for
//! another queue, and those that answer are answered after every command sent before.

use tokio::sync::oneshot;

use super::Broker;
use crate::core::queue::{Consumer, ConsumerId, Got, RequeueCause};
use crate::core::shards::ShardCmd;
use crate::core::stream::assignment::{GroupKey, MemberId};
use crate::core::stream::{StreamOffset, StreamStatus};
use crate::core::tag_filter::TagFilter;
use crate::core::QueueId;

/// Where a stream consumer starts reading and how it shares the stream (the arguments of
/// AMQP's `basic.consume` on a stream).
#[derive(Debug)]
pub struct StreamSubscription {
    /// Where it starts (a group with a stored cursor resumes there instead).
    pub start: StreamOffset,
    /// The consumer group it joins (`x-consumer-group`), if any.
    pub group: Option<String>,
    /// Its tag filter (`x-tag-filter`), if any.
    pub filter: Option<TagFilter>,
    /// The group is read by one member at a time, chosen by
    /// [`Broker::join_stream_group`] (a partition of a super stream, or a single-active
    /// group).
    pub exclusive: bool,
}

impl Broker {
    /// A consumer starts consuming `queue` (AMQP basic.consume, an MQTT session's queue
    /// or shared group): its credit is its prefetch or receive window.
    pub fn attach_consumer(&self, queue: QueueId, consumer: Consumer) {
        self.shards.send(ShardCmd::Attach { queue, consumer });
    }

    /// A consumer starts reading stream `queue` as `how` says.
    pub fn attach_stream_consumer(&self, queue: QueueId, consumer: Consumer, how: StreamSubscription) {
        let StreamSubscription { start, group, filter, exclusive } = how;
        self.shards.send(ShardCmd::AttachStream { queue, consumer, start, group, filter, exclusive });
    }

    /// The consumer stops consuming `queue` (basic.cancel): what it holds unacknowledged
    /// stays unacknowledged, to be settled by its channel.
    pub fn cancel_consumer(&self, queue: QueueId, consumer: ConsumerId) {
        self.shards.send(ShardCmd::Cancel { queue, consumer });
    }

    /// The consumer is gone (its channel, connection or subscription ended): what it
    /// holds unacknowledged becomes ready again.
    pub fn detach_consumer(&self, queue: QueueId, consumer: ConsumerId) {
        self.shards.send(ShardCmd::Detach { queue, consumer });
    }

    /// The delivery at `offset` of `queue` is done with (basic.ack, MQTT PUBACK/PUBCOMP,
    /// an auto-ack delivery sent): it leaves the queue.
    pub fn ack(&self, queue: QueueId, offset: u64) {
        self.shards.send(ShardCmd::Ack { queue, offset });
    }

    /// The delivery at `offset` of `queue`, delivered to `consumer`, goes back in line
    /// (nack or reject with requeue, a channel closed, a delivery never sent); `cause`
    /// decides whether it waits for a delayed retry.
    pub fn requeue(&self, queue: QueueId, offset: u64, cause: RequeueCause, consumer: ConsumerId) {
        self.shards.send(ShardCmd::Requeue { queue, offset, cause, consumer });
    }

    /// The delivery at `offset` of `queue` is refused (nack or reject without requeue):
    /// dropped, or dead-lettered where the queue says so.
    pub fn reject(&self, queue: QueueId, offset: u64) {
        self.shards.send(ShardCmd::Reject { queue, offset });
    }

    /// MQTT PUBREC for the QoS 2 delivery at `offset` of a session's `queue`: the entry
    /// is marked released, and `done` is told once that is durable.
    pub fn release(&self, queue: QueueId, offset: u64, done: oneshot::Sender<()>) {
        self.shards.send(ShardCmd::Release { queue, offset, done: Some(done) });
    }

    /// A stream consumer settled its delivery at `offset` (ack, nack or reject alike): its
    /// credit comes back; a stream removes nothing.
    pub fn settle_stream(&self, queue: QueueId, consumer: ConsumerId, offset: u64) {
        self.shards.send(ShardCmd::StreamSettle { queue, consumer, offset });
    }

    /// `consumer` of `member` subscribed to partition `queue` of `key`'s super stream (or
    /// single-active stream), whose partitions are `partitions`: the partitions are spread
    /// again among the members. Call after the consumer is attached.
    pub fn join_stream_group(
        &self,
        key: GroupKey,
        partitions: Vec<QueueId>,
        member: MemberId,
        queue: QueueId,
        consumer: ConsumerId,
    ) {
        self.assignments.join(&self.shards, key, partitions, member, queue, consumer);
    }

    /// `consumer` left its exclusive stream group (cancelled, channel or connection
    /// closed, queue deleted): the group's partitions are spread again.
    pub fn leave_stream_group(&self, consumer: ConsumerId) {
        self.assignments.leave(&self.shards, consumer);
    }

    /// Takes one message from `queue` for `consumer` (basic.get; with `no_ack` it leaves
    /// the queue at once, else it waits for the consumer's settlement).
    pub async fn get_message(&self, queue: QueueId, consumer: ConsumerId, no_ack: bool) -> Option<Got> {
        self.shards.get(queue, consumer, no_ack).await
    }

    /// Removes every ready message of `queue` (queue.purge); answers how many.
    pub async fn purge_queue(&self, queue: QueueId) -> u64 {
        self.shards.purge(queue).await
    }

    /// Removes queue `queue` and all its entries (its consumers are told they were
    /// cancelled) and waits until that is stored, so its name is free again; answers how
    /// many messages it held. A declared queue is deleted through
    /// [`crate::core::entities`], which also removes its bindings and record; this is for
    /// the queues of MQTT sessions and shared groups, whose subscriptions go first.
    pub async fn delete_queue(&self, queue: QueueId) -> u64 {
        self.shards.delete(queue).await
    }

    /// (ready messages, consumers) of `queue`, after every command sent before.
    pub async fn queue_counts(&self, queue: QueueId) -> (u64, u64) {
        self.shards.counts(queue).await
    }

    /// Live entries of `queue` (ready, unacknowledged and not yet loaded).
    pub async fn queue_len(&self, queue: QueueId) -> u64 {
        self.shards.len(queue).await
    }

    /// Stream `queue`'s extent and consumer groups; `None` when it is not a stream.
    pub async fn stream_status(&self, queue: QueueId) -> Option<StreamStatus> {
        self.shards.stream_status(queue).await
    }

    /// Moves consumer group `group`'s committed offset on stream `queue` to where `to`
    /// resolves (an operator's reset); answers the new offset, `None` for a non-stream.
    pub async fn reset_stream_group(&self, queue: QueueId, group: &str, to: StreamOffset) -> Option<u64> {
        self.shards.reset_group(queue, group, to).await
    }

    /// Waits until every queue owner has submitted the journal work of every command sent
    /// to it before this call (shutdown flushes the journal after it, so a settlement a
    /// closing connection sent without waiting is not lost).
    pub async fn settle_queue_owners(&self) {
        self.shards.barrier().await;
    }
}
