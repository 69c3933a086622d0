//! `%DLQ%{queue}` queues: created on demand when a message passes the delivery limit of a
//! queue that has no dead-letter exchange (RocketMQ's naming); durable when the source
//! queue is. The core's dead-letter task reaches this through
//! [`DeadLetterQueues`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tracing::{info, warn};

use super::AmqpContext;
use crate::core::dead_letter::{dlq_name, DeadLetterQueues};
use crate::core::entities::queue_config;
use crate::core::store::QueueId;

impl DeadLetterQueues for AmqpContext {
    fn dead_letter_queue<'a>(
        &'a self,
        vhost: &'a str,
        source: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<QueueId>> + Send + 'a>> {
        Box::pin(async move {
            let name = dlq_name(source);
            if let Some(q) = self.entities.queue(vhost, &name) {
                return Some(q.id);
            }
            let durable = self.entities.queue(vhost, source).is_some_and(|q| q.durable);
            let config = queue_config(vhost, &name, durable, &[]).ok()?;
            // Made by the broker, not a client: counted, never refused at `max-queues`.
            let slot = self.entities.reserve(vhost, None).ok()?;
            match self
                .entities
                .create_queue(slot, &self.broker, vhost, &name, durable, None, false, Vec::new(), config, None)
                .await
            {
                Ok(q) => {
                    info!(queue = %name, vhost, durable, "created a dead-letter queue");
                    Some(q.id)
                }
                Err(e) => {
                    warn!(queue = %name, vhost, error = %e, "cannot create the dead-letter queue");
                    None
                }
            }
        })
    }
}

/// Lets the core's dead-letter task create `%DLQ%` queues through `ctx`.
pub fn register(ctx: &Arc<AmqpContext>) {
    let weak: std::sync::Weak<AmqpContext> = Arc::downgrade(ctx);
    let weak: std::sync::Weak<dyn DeadLetterQueues> = weak;
    let _ = ctx.broker.dead_letter_queues.set(weak);
}
