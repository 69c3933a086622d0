//! Start-up: the registry built, the durable exchanges, queues and bindings applied to the
//! routing table and the registry, and afterwards the consume queues of transient queues
//! deleted.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::{info, warn};

use super::arguments::{queue_config, ArgumentError};
use super::queue::QueueEntity;
use super::registry::{counted_with, Entities, QUEUE_PREFIX};
use super::stream_args::{is_stream, stream_config};
use crate::core::broker::Broker;
use crate::core::message::now_ms;
use crate::core::queue::QueueConfig;
use crate::core::restore::{RecordKey, RecordKind, RestoreError};
use crate::core::router::{Destination, RouteError};
use crate::core::store::{EntityRecords, QueueId, QueueRecord};

impl Entities {
    /// The registry with the durable entities start-up read (`records`) restored
    /// ([`Entities::restore`]), the source of the dead-letter task's `%DLQ%` queues, and
    /// its `x-expires` expiry running. The orphaned consume queues are the caller's, once
    /// everything is restored ([`Entities::drop_orphan_queues`]).
    pub fn start(broker: Arc<Broker>, records: EntityRecords) -> Result<Arc<Entities>, RestoreError> {
        let entities = Arc::new(Entities::new(broker));
        entities.restore(records)?;
        entities.serve_dead_letter_queues();
        tokio::spawn(entities.clone().run_expiry());
        Ok(entities)
    }

    /// Restores the durable exchanges, queues and bindings start-up read (`records`):
    /// exchanges and bindings into the routing table, then every queue checked (its
    /// arguments as a declaration is) before any is installed. A record that cannot be
    /// applied is the error, never left out; a binding from an exchange that is gone (left
    /// behind by a deletion) is skipped with a warning. Deletes nothing: see
    /// [`Entities::drop_orphan_queues`].
    pub fn restore(&self, records: EntityRecords) -> Result<(), RestoreError> {
        let broker = &self.broker;
        let (mut exchanges, mut queues, mut bindings) = (0, 0, 0);
        for x in records.exchanges {
            broker.router.add_vhost(&x.vhost);
            let key = RecordKey::text(format!("vhost={} name={}", x.vhost, x.def.name));
            if let Err(e) = broker.router.declare_exchange(&x.vhost, x.def) {
                return Err(RestoreError::undecodable(RecordKind::Exchange, key, e.to_string()));
            }
            exchanges += 1;
        }
        let mut entities = Vec::with_capacity(records.queues.len());
        for r in records.queues {
            let key = RecordKey::text(format!("vhost={} name={}", r.vhost, r.name));
            entities.push(
                queue_from_record(r).map_err(|e| RestoreError::undecodable(RecordKind::Queue, key, e.to_string()))?,
            );
        }
        for b in records.bindings {
            let key = || {
                let dest = match &b.binding.dest {
                    Destination::Queue(q) => format!("queue id {}", q.0),
                    Destination::Exchange(x) => format!("exchange {x}"),
                    Destination::Session(s) => format!("session {}", s.client_id),
                    Destination::Member(m) => format!("member {m}"),
                };
                RecordKey::text(format!(
                    "vhost={} exchange={} destination={dest} key={}",
                    b.vhost, b.exchange, b.binding.key
                ))
            };
            let (vhost, exchange) = (b.vhost.clone(), b.exchange.clone());
            match broker.router.bind(&vhost, &exchange, b.binding.clone()) {
                Ok(_) => bindings += 1,
                Err(RouteError::NoExchange(..)) => {
                    warn!(key = %key(), "stored binding of an exchange that is gone; skipped")
                }
                Err(e) => return Err(RestoreError::undecodable(RecordKind::Binding, key(), e.to_string())),
            }
        }
        for entity in entities {
            broker.router.add_vhost(&entity.vhost);
            *self.counts.lock().entry(entity.vhost.clone()).or_default() += 1;
            self.install(Arc::new(entity));
            queues += 1;
        }
        if exchanges + queues + bindings > 0 {
            info!(exchanges, queues, bindings, "restored AMQP entities");
        }
        Ok(())
    }

    /// Deletes the consume queues of AMQP queues that did not survive a restart (transient
    /// ones). Run once everything stored was restored.
    pub async fn drop_orphan_queues(&self) {
        let broker = &self.broker;
        let all = match broker.stores.catalog.queues().await {
            Ok(all) => all,
            Err(e) => {
                warn!(error = %e, "cannot list queues; none deleted as orphaned");
                return;
            }
        };
        let live: std::collections::HashSet<QueueId> = self.all().iter().map(|q| q.id).collect();
        for (name, id) in all {
            if name.starts_with(QUEUE_PREFIX) && !live.contains(&id) {
                broker.shards.delete(id).await;
            }
        }
    }
}

/// The queue a stored record declares, with its configuration derived again from the
/// arguments; why not when they no longer pass the checks.
pub(super) fn queue_from_record(r: QueueRecord) -> Result<QueueEntity, ArgumentError> {
    let (config, stream) = if is_stream(&r.arguments) {
        let stream = stream_config(&r.vhost, &r.name, true, false, r.auto_delete, &r.arguments)?;
        let config = QueueConfig::new(&r.name, &r.vhost);
        let stream = counted_with(stream, &config);
        (config, Some(stream))
    } else {
        (queue_config(&r.vhost, &r.name, true, &r.arguments)?, None)
    };
    Ok(QueueEntity {
        vhost: r.vhost,
        name: r.name,
        id: r.id,
        durable: true,
        exclusive_owner: None,
        auto_delete: r.auto_delete,
        arguments: r.arguments,
        config: Arc::new(config),
        stream,
        had_consumer: AtomicBool::new(false),
        exclusive_consumer: Mutex::new(None),
        consumers: AtomicU64::new(0),
        last_used_ms: AtomicU64::new(now_ms()),
    })
}
