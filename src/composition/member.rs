//! What a cluster's metadata group applies to this member's memory ([`MemberState`]): the
//! entity commands to the core's registry and routing table, the access commands to the
//! users, virtual hosts and permissions the API and both front-ends read, retained messages
//! to the core's retained store; and what the cluster asks of the member (which queues are
//! replicated, its core). It lives in the
//! composition root because those registries are held by different rooms (core,
//! operations), which only the composition root sees together.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::cluster::{NodeState, QueueNames};
use crate::core::broker::Broker;
use crate::core::store::{AccessCommand, Command, QueueId};
use crate::operations::http::HttpContext;

/// This member's registries.
pub struct MemberState {
    ctx: Arc<HttpContext>,
}

impl MemberState {
    /// The registries `ctx` holds.
    pub fn new(ctx: Arc<HttpContext>) -> MemberState {
        MemberState { ctx }
    }
}

impl QueueNames for MemberState {
    fn queue_name(&self, id: QueueId) -> Option<(String, String)> {
        self.ctx.entities.queue_by_id(id).map(|q| (q.vhost.clone(), q.name.clone()))
    }
}

impl NodeState for MemberState {
    fn is_replicated_queue(&self, id: QueueId) -> bool {
        self.ctx.entities.queue_by_id(id).is_some_and(|q| q.durable)
    }

    fn is_data_group_queue(&self, id: QueueId) -> bool {
        self.ctx.entities.queue_by_id(id).is_some_and(|q| q.durable && q.stream.is_some())
    }

    fn data_group_queue(&self, vhost: &str, name: &str) -> Option<QueueId> {
        self.ctx.entities.queue(vhost, name).filter(|q| q.durable && q.stream.is_some()).map(|q| q.id)
    }

    fn broker(&self) -> Arc<Broker> {
        self.ctx.broker.clone()
    }

    fn client_taken_over<'a>(&'a self, client_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(signals) = self.ctx.mqtt.sessions.taken_over_elsewhere(client_id) {
                signals.wait_finished(std::time::Duration::from_secs(2)).await;
            }
        })
    }

    fn apply<'a>(&'a self, commands: &'a [Command]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            for command in commands {
                match command {
                    Command::Entity(c) => self.ctx.entities.apply_committed(c).await,
                    Command::Access(c) => {
                        match c {
                            AccessCommand::RemoveVhost { name } => self.ctx.entities.forget_vhost_queues(name).await,
                            AccessCommand::PutVhost(r) if r.deleted => {
                                self.ctx.entities.forget_vhost_queues(&r.name).await
                            }
                            _ => {}
                        }
                        crate::operations::http::access::apply_committed(&self.ctx, c)
                    }
                    Command::SetRetained { message } => {
                        self.ctx.broker.apply_retained(&message.routing_key, Some(message.clone()))
                    }
                    Command::ClearRetained { topic } => self.ctx.broker.apply_retained(topic, None),
                    _ => {}
                }
            }
        })
    }
}
