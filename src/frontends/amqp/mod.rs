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
//! - the user store lives in [`crate::access::auth`], shared with MQTT; queues, exchanges and
//!   bindings are declared and deleted through [`crate::core::entities`], shared with the
//!   management API.

pub(crate) mod channel;
pub(crate) mod connection;
pub(crate) mod convert;
pub(crate) mod methods;
pub(crate) mod streams;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::warn;

use crate::access::auth::Users;
use crate::access::authz::Authorizer;
use crate::composition::config::Config;
use crate::core::alarm::ResourceAlarm;
use crate::core::broker::Broker;
use crate::core::entities::Entities;
use connection::Control;

/// Everything the AMQP front-end shares between connections.
#[derive(Debug)]
pub struct AmqpContext {
    /// The core every connection publishes to and consumes from.
    pub broker: Arc<Broker>,
    /// `[amqp]` settings.
    pub cfg: crate::composition::config::AmqpSection,
    /// Users that may log in, checked at connection.start-ok.
    pub users: Users,
    /// What a logged-in user may open, declare, publish to and consume from.
    pub authz: Arc<Authorizer>,
    /// The declared queues, exchanges and bindings (the core's, shared with the management API).
    pub entities: Arc<Entities>,
    /// The memory and disk alarms: publishing connections get connection.blocked while one
    /// is raised.
    pub alarm: Arc<ResourceAlarm>,
    connections: Mutex<HashMap<u64, mpsc::Sender<Control>>>,
}

impl AmqpContext {
    /// Builds the context on the entities start-up restored ([`Entities::start`]) and
    /// starts its housekeeping. The de-duplication caches are the caller's, once
    /// everything is restored ([`Broker::restore_dedup_caches`]).
    pub fn start(
        broker: Arc<Broker>,
        config: &Config,
        users: Users,
        authz: Arc<Authorizer>,
        alarm: Arc<ResourceAlarm>,
        entities: Arc<Entities>,
    ) -> Arc<AmqpContext> {
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
            entities,
            alarm,
            connections: Mutex::new(HashMap::new()),
        });
        tokio::spawn(ctx.clone().housekeeping());
        ctx
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

    /// Periodic work: de-duplication ids age out (unused queues expire in the core:
    /// [`Entities::run_expiry`]).
    async fn housekeeping(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            self.broker.expire_dedup_ids().await;
        }
    }
}
