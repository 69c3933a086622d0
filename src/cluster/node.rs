//! What the cluster needs of the member it runs on ([`NodeState`]), once that member is
//! built: the composition root implements it over the member's registries.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::metadata::QueueNames;
use crate::core::broker::Broker;
use crate::core::store::{Command, QueueId};

/// What the metadata group needs of the member it runs on, once that member is built.
pub trait NodeState: QueueNames + Send + Sync {
    /// Applies committed commands (with this member's queue ids) to this member's memory:
    /// entities to the routing table and the queue registry, users, virtual hosts and
    /// permissions to theirs. Idempotent: the member that made a change applied it already.
    fn apply<'a>(&'a self, commands: &'a [Command]) -> BoxFuture<'a, ()>;

    /// True for a queue the metadata group holds (a durable AMQP queue, on every member):
    /// publishes reach it on every member, so its bindings are never forwarded for.
    fn is_replicated_queue(&self, id: QueueId) -> bool;

    /// True for a queue whose messages the data group holds (a stream).
    fn is_data_group_queue(&self, id: QueueId) -> bool;

    /// The id of stream `name` of `vhost` on this member, if it is declared here.
    fn data_group_queue(&self, vhost: &str, name: &str) -> Option<QueueId>;

    /// This member's core.
    fn broker(&self) -> Arc<Broker>;

    /// A connection of MQTT client `client_id` on another member took the id over: the
    /// one here (if any) is closed as taken over; resolves once it is (bounded).
    fn client_taken_over<'a>(&'a self, client_id: &'a str) -> BoxFuture<'a, ()>;
}
