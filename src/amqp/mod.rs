//! The AMQP 0-9-1 front-end: connects sockets to the core so that RabbitMQ clients work
//! unchanged.
//!
//! ```text
//! socket ─▶ connection task (owns a ferrymq_amqp::Connection) ─▶ methods ─▶ router / queues / journal
//!    ▲                                                              │
//!    └──────── deliveries (prefetch as queue credit), confirms ◀────┘
//! ```
//!
//! - [`connection`] — one task per socket: login, channels, deliveries, confirms, cleanup.
//! - [`methods`] — exchange.*, queue.*, basic.*, tx.* and publishing, with RabbitMQ's checks.
//! - [`channel`] — per-channel state (consumers, delivery tags, prefetch, modes).
//! - [`streams`] — stream consume arguments (`x-stream-offset`, consumer groups).
//! - [`convert`] — wire types <-> core values and properties (the gateway mapping).
//! - the user store lives in [`crate::auth`], shared with MQTT.
//! - [`dlq`] — `%DLQ%{queue}` queues, created on demand for the core's dead-letter task.

pub mod channel;
pub mod connection;
pub mod convert;
pub mod dlq;
pub mod methods;
pub mod streams;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::warn;

use crate::auth::Users;
use crate::authz::Authorizer;
use crate::config::Config;
use crate::core::alarm::ResourceAlarm;
use crate::core::broker::{Broker, Commit};
use crate::core::entities::Entities;
use crate::core::message::{now_ms, Message};
use crate::core::restore::RestoreError;
use crate::core::router::Routes;
use crate::core::store::EntityRecords;
use connection::Control;

/// Everything the AMQP front-end shares between connections.
#[derive(Debug)]
pub struct AmqpContext {
    /// The core every connection publishes to and consumes from.
    pub broker: Arc<Broker>,
    /// `[amqp]` settings.
    pub cfg: crate::config::AmqpSection,
    /// Users that may log in, checked at connection.start-ok.
    pub users: Users,
    /// What a logged-in user may open, declare, publish to and consume from.
    pub authz: Arc<Authorizer>,
    /// Registry of declared queues, by vhost and name.
    pub entities: Entities,
    /// The memory and disk alarms: publishing connections get connection.blocked while one
    /// is raised.
    pub alarm: Arc<ResourceAlarm>,
    connections: Mutex<HashMap<u64, mpsc::Sender<Control>>>,
}

impl AmqpContext {
    /// Builds the context with the durable entities start-up read (`entities`; the
    /// virtual hosts are in the router already). The orphaned consume queues and the
    /// de-duplication caches are the caller's, once everything is restored
    /// ([`Entities::drop_orphan_queues`], [`crate::core::dedup::restore_caches`]).
    pub async fn start(
        broker: Arc<Broker>,
        config: &Config,
        users: Users,
        authz: Arc<Authorizer>,
        alarm: Arc<ResourceAlarm>,
        entities: EntityRecords,
    ) -> Result<Arc<AmqpContext>, RestoreError> {
        if config.amqp.dedup_window_secs > 0 {
            warn!(
                "amqp.dedup_window_secs is ignored: message ids are never compared unless an exchange or queue \
                 opts in with x-message-deduplication"
            );
        }
        let ctx = Arc::new(AmqpContext {
            broker,
            cfg: config.amqp.clone(),
            users,
            authz,
            entities: Entities::default(),
            alarm,
            connections: Mutex::new(HashMap::new()),
        });
        ctx.entities.restore(&ctx.broker, entities)?;
        dlq::register(&ctx);
        tokio::spawn(ctx.clone().housekeeping());
        Ok(ctx)
    }

    /// Reserves room in the routed queues that refuse publishes when full (reject-publish)
    /// and leaves out those without room; true when one refused (the publisher gets a
    /// nack). Done just before storing, so that every reservation is used.
    pub fn admit(&self, msg: &Message, routes: &Arc<Routes>) -> (Arc<Routes>, bool) {
        let Some(configs) = self.entities.overflow_configs(routes.queues.iter().map(|r| r.queue)) else {
            return (routes.clone(), false);
        };
        let mut admitted = Routes::clone(routes);
        let mut refused = false;
        let mut configs = configs.into_iter();
        admitted.queues.retain_mut(|r| match configs.next().flatten() {
            None => true,
            Some(c) if c.admit(msg.payload.len() as u64) => {
                r.reserved = true;
                true
            }
            Some(_) => {
                refused = true;
                false
            }
        });
        (Arc::new(admitted), refused)
    }

    fn register(&self, id: u64, control: mpsc::Sender<Control>) {
        self.connections.lock().insert(id, control);
    }

    fn unregister(&self, id: u64) {
        self.connections.lock().remove(&id);
    }

    /// Tells every connection the broker is shutting down.
    pub fn shutdown(&self) {
        for c in self.connections.lock().values() {
            let _ = c.try_send(Control::Shutdown);
        }
    }

    /// Periodic work: unused queues expire (`x-expires`), de-duplication ids age out.
    async fn housekeeping(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            self.entities.expire_unused(&self.broker).await;
            let now = now_ms();
            for cache in self.broker.router.dedup_caches() {
                let write = self.broker.dedup_write(&cache.expire(now));
                if let Err(e) = self.broker.commit(write, Commit::Relaxed).await {
                    warn!(error = %e, "cannot forget expired de-duplication values");
                }
            }
        }
    }
}
