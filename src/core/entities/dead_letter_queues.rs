//! `%DLQ%{queue}` queues: created on demand when a message passes the delivery limit of a
//! queue that has no dead-letter exchange (RocketMQ's naming); durable when the source
//! queue is. The core's dead-letter task reaches the registry through
//! [`DeadLetterQueues`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tracing::{info, warn};

use super::arguments::queue_config;
use super::registry::Entities;
use crate::core::dead_letter::{dlq_name, DeadLetterQueues};
use crate::core::store::QueueId;

impl DeadLetterQueues for Entities {
    fn dead_letter_queue<'a>(
        &'a self,
        vhost: &'a str,
        source: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<QueueId>> + Send + 'a>> {
        Box::pin(async move {
            let name = dlq_name(source);
            if let Some(q) = self.queue(vhost, &name) {
                return Some(q.id);
            }
            let durable = self.queue(vhost, source).is_some_and(|q| q.durable);
            let config = queue_config(vhost, &name, durable, &[]).ok()?;
            // Made by the broker, not a client: counted, never refused at `max-queues`.
            let slot = self.reserve(vhost, None).ok()?;
            match self.make_queue(slot, vhost, &name, durable, None, false, Vec::new(), config, None).await {
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

impl Entities {
    /// Lets the core's dead-letter task create `%DLQ%` queues in this registry.
    pub(super) fn serve_dead_letter_queues(self: &Arc<Self>) {
        let weak: std::sync::Weak<Entities> = Arc::downgrade(self);
        let weak: std::sync::Weak<dyn DeadLetterQueues> = weak;
        let _ = self.broker.dead_letter_queues.set(weak);
    }
}
