//! AMQP entities: the queue registry (name -> consume queue, durability, exclusivity,
//! arguments turned into a [`QueueConfig`]), and keeping durable exchanges, queues and
//! bindings in the core's [`EntityStore`](crate::core::store::EntityStore), restored at
//! start-up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tracing::{info, warn};

use crate::core::broker::{Broker, Commit};
use crate::core::message::now_ms;
use crate::core::queue::{DeadLetterTarget, Overflow, QueueConfig};
use crate::core::restore::{RecordKey, RecordKind, RestoreError};
use crate::core::router::{Binding, Destination, ExchangeDef, RouteError};
use crate::core::shards::ShardCmd;
use crate::core::store::{EntityRecords, QueueId, QueueRecord};
use crate::core::stream::StreamConfig;
use crate::core::value::Value;

use super::retry_args::retry_policy;
use super::streams::{is_stream, stream_config};

/// Prefix of the storage names of AMQP queues (`amqp/{vhost}/{name}`).
pub const QUEUE_PREFIX: &str = "amqp/";

/// A declared AMQP queue: identity, queue.declare flags and arguments, consumer bookkeeping.
#[derive(Debug)]
pub struct QueueEntity {
    /// Virtual host the queue belongs to; with `name`, its key in [`Entities`].
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

/// Why queue arguments are refused (406 PRECONDITION_FAILED, RabbitMQ's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArgumentError(pub String);

impl ArgumentError {
    /// RabbitMQ's `PRECONDITION_FAILED - invalid arg ...` text for argument `key` of queue
    /// `name` in `vhost`.
    pub fn invalid(vhost: &str, name: &str, key: &str, why: impl std::fmt::Display) -> ArgumentError {
        ArgumentError(format!("PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {why}"))
    }
}

/// Reads a non-negative integer argument.
pub fn arg_u64(args: &[(String, Value)], name: &str) -> Option<u64> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_i64()).and_then(|v| u64::try_from(v).ok())
}

fn arg_str<'a>(args: &'a [(String, Value)], name: &str) -> Option<&'a str> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_str())
}

fn arg_bool(args: &[(String, Value)], name: &str) -> Option<bool> {
    args.iter().find(|(k, _)| k == name).and_then(|(_, v)| match v {
        Value::Bool(b) => Some(*b),
        other => other.as_i64().map(|i| i != 0),
    })
}

/// Checks queue arguments and turns them into a configuration.
pub fn queue_config(
    vhost: &str,
    name: &str,
    durable: bool,
    args: &[(String, Value)],
) -> Result<QueueConfig, ArgumentError> {
    let mut c = QueueConfig::new(name, vhost);
    c.keep_transient = false;
    let int = |key: &str| -> Result<Option<u64>, ArgumentError> {
        match args.iter().find(|(k, _)| k == key) {
            None => Ok(None),
            Some((_, v)) => match v.as_i64() {
                Some(i) if i >= 0 => Ok(Some(i as u64)),
                _ => Err(ArgumentError::invalid(vhost, name, key, format!("{{value_negative,{}}}", v.to_text()))),
            },
        }
    };
    c.message_ttl = int("x-message-ttl")?;
    c.max_len = int("x-max-length")?.unwrap_or(0);
    c.max_bytes = int("x-max-length-bytes")?.unwrap_or(0);
    if let Some(0) = int("x-expires")? {
        return Err(ArgumentError::invalid(vhost, name, "x-expires", "{value_zero,0}"));
    }
    c.delivery_limit = int("x-delivery-limit")?.map(|v| v.min(u32::MAX as u64) as u32);
    c.retry = retry_policy(vhost, name, args)?;
    c.count_deliveries = c.delivery_limit.is_some() || c.retry.is_some();
    c.single_active_consumer = arg_bool(args, "x-single-active-consumer").unwrap_or(false);
    c.dedup = arg_bool(args, crate::core::dedup::QUEUE_ARGUMENT).unwrap_or(false);
    c.overflow = match arg_str(args, "x-overflow") {
        None | Some("drop-head") => Overflow::DropHead,
        Some("reject-publish") => Overflow::RejectPublish,
        Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
        Some(other) => {
            return Err(ArgumentError::invalid(
                vhost,
                name,
                "x-overflow",
                format!("{{unknown_overflow_type,<<\"{other}\">>}}"),
            ))
        }
    };
    if let Some(exchange) = arg_str(args, "x-dead-letter-exchange") {
        c.dead_letter = Some(DeadLetterTarget {
            exchange: exchange.to_owned(),
            routing_key: arg_str(args, "x-dead-letter-routing-key").map(str::to_owned),
        });
    }
    if c.delivery_limit.is_some() && c.dead_letter.is_none() && crate::core::dead_letter::dlq_name(name).len() > 255 {
        // Its `%DLQ%` queue could not be named by any client (a short string).
        return Err(ArgumentError::invalid(vhost, name, "x-delivery-limit", "{dead_letter_queue_name_too_long}"));
    }
    match arg_str(args, "x-queue-type") {
        None | Some("classic") => {}
        Some("quorum") => {
            c.count_deliveries = true;
            if !durable {
                return Err(ArgumentError(format!(
                    "PRECONDITION_FAILED - invalid property 'non-durable' for queue '{name}' in vhost '{vhost}'"
                )));
            }
        }
        Some(other) => {
            return Err(ArgumentError::invalid(
                vhost,
                name,
                "x-queue-type",
                format!("{{unsupported_queue_type,<<\"{other}\">>}}"),
            ))
        }
    }
    if let Some(p) = int("x-max-priority")? {
        if p > 255 {
            return Err(ArgumentError::invalid(vhost, name, "x-max-priority", format!("{{value_too_large,{p}}}")));
        }
        // Up to 15 levels are kept apart (RabbitMQ recommends at most 10).
        c.max_priority = Some(p.min(15) as u8);
    }
    Ok(c)
}

/// Every declared AMQP queue.
#[derive(Debug, Default)]
pub struct Entities {
    queues: RwLock<HashMap<(String, String), Arc<QueueEntity>>>,
    /// Configurations of queues that refuse publishes when full, by id (publishers check
    /// them before storing).
    rejecting: RwLock<HashMap<QueueId, Arc<QueueConfig>>>,
    any_rejecting: AtomicBool,
    /// Queues per virtual host, those being created included (for `max-queues`).
    counts: Mutex<HashMap<String, u64>>,
}

/// A queue counted against its virtual host's `max-queues` while it is being created
/// ([`Entities::reserve`]); uncounted when dropped unless the queue was made.
#[derive(Debug)]
pub struct QueueSlot<'a> {
    entities: &'a Entities,
    vhost: String,
    made: bool,
}

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        if !self.made {
            self.entities.uncount(&self.vhost);
        }
    }
}

impl Entities {
    /// The configurations of the queues among `ids` that refuse publishes when full, in
    /// order (`None` for the others); `None` when there is none (one lock, no allocation
    /// while no such queue exists).
    pub fn overflow_configs(&self, ids: impl Iterator<Item = QueueId>) -> Option<Vec<Option<Arc<QueueConfig>>>> {
        if !self.any_rejecting.load(Ordering::Relaxed) {
            return None;
        }
        let rejecting = self.rejecting.read();
        let configs: Vec<_> = ids.map(|id| rejecting.get(&id).cloned()).collect();
        configs.iter().any(Option::is_some).then_some(configs)
    }

    /// Counts a queue about to be created in `vhost`, unless `vhost` has `limit` queues
    /// already (then `Err(limit)`).
    pub fn reserve(&self, vhost: &str, limit: Option<u64>) -> Result<QueueSlot<'_>, u64> {
        let mut counts = self.counts.lock();
        let n = counts.entry(vhost.to_owned()).or_default();
        if let Some(max) = limit.filter(|max| *n >= *max) {
            return Err(max);
        }
        *n += 1;
        Ok(QueueSlot { entities: self, vhost: vhost.to_owned(), made: false })
    }

    /// Queues of `vhost` (those being created included).
    pub fn count(&self, vhost: &str) -> u64 {
        self.counts.lock().get(vhost).copied().unwrap_or(0)
    }

    fn uncount(&self, vhost: &str) {
        let mut counts = self.counts.lock();
        if let Some(n) = counts.get_mut(vhost) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(vhost);
            }
        }
    }

    /// The queue `name` of `vhost`.
    pub fn queue(&self, vhost: &str, name: &str) -> Option<Arc<QueueEntity>> {
        self.queues.read().get(&(vhost.to_owned(), name.to_owned())).cloned()
    }

    /// Every declared queue, of every vhost, in no particular order.
    pub fn all(&self) -> Vec<Arc<QueueEntity>> {
        self.queues.read().values().cloned().collect()
    }

    /// Creates a queue (its consume queue, configuration, default-exchange binding and,
    /// when durable, its meta record) in the place `slot` counted for it. The caller
    /// checked it does not exist.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_queue(
        &self,
        mut slot: QueueSlot<'_>,
        broker: &Broker,
        vhost: &str,
        name: &str,
        durable: bool,
        exclusive_owner: Option<u64>,
        auto_delete: bool,
        arguments: Vec<(String, Value)>,
        config: QueueConfig,
        stream: Option<StreamConfig>,
    ) -> Result<Arc<QueueEntity>, String> {
        let id = broker.stores.catalog.queue_id(&storage_name(vhost, name)).await.map_err(|e| e.to_string())?;
        let entity = Arc::new(QueueEntity {
            vhost: vhost.to_owned(),
            name: name.to_owned(),
            id,
            durable,
            exclusive_owner,
            auto_delete,
            arguments,
            stream: stream.map(|s| counted_with(s, &config)),
            config: Arc::new(config),
            had_consumer: AtomicBool::new(false),
            exclusive_consumer: Mutex::new(None),
            consumers: AtomicU64::new(0),
            last_used_ms: AtomicU64::new(now_ms()),
        });
        slot.made = true;
        self.install(broker, entity.clone());
        if durable {
            let record = QueueRecord {
                vhost: entity.vhost.clone(),
                name: entity.name.clone(),
                id,
                auto_delete,
                arguments: entity.arguments.clone(),
            };
            broker
                .commit(broker.stores.entities.put_queue(&record), Commit::Durable)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(entity)
    }

    fn install(&self, broker: &Broker, entity: Arc<QueueEntity>) {
        match &entity.stream {
            Some(stream) => broker.shards.send(ShardCmd::ConfigureStream { queue: entity.id, config: stream.clone() }),
            None => broker.shards.send(ShardCmd::Configure { queue: entity.id, config: entity.config.clone() }),
        }
        if matches!(entity.config.overflow, Overflow::RejectPublish | Overflow::RejectPublishDlx) {
            self.rejecting.write().insert(entity.id, entity.config.clone());
            self.any_rejecting.store(true, Ordering::Relaxed);
        }
        let _ = broker.router.bind(&entity.vhost, "", Binding::queue(entity.id, &entity.name, Vec::new()));
        let vhost = entity.vhost.clone();
        if self.queues.write().insert((vhost.clone(), entity.name.clone()), entity).is_some() {
            // Two declarations of one name raced: the queue is counted once.
            self.uncount(&vhost);
        }
    }

    /// Deletes a queue: bindings, consume queue, meta records. Returns the message count.
    pub async fn delete_queue(&self, broker: &Broker, entity: &QueueEntity) -> u64 {
        if self.queues.write().remove(&(entity.vhost.clone(), entity.name.clone())).is_some() {
            self.uncount(&entity.vhost);
        }
        self.rejecting.write().remove(&entity.id);
        broker.router.unbind_all(&entity.vhost, &Destination::Queue(entity.id));
        let count = broker.shards.delete(entity.id).await;
        if entity.durable {
            let write = broker.stores.entities.remove_queue(&entity.vhost, &entity.name, entity.id).await;
            if let Err(e) = broker.commit(write, Commit::Durable).await {
                warn!(error = %e, "cannot delete queue metadata");
            }
        }
        count
    }

    /// Restores the durable exchanges, queues and bindings start-up read (`records`):
    /// exchanges and bindings into the routing table, then every queue checked (its
    /// arguments as a declaration is) before any is installed. A record that cannot be
    /// applied is the error, never left out; a binding from an exchange that is gone (left
    /// behind by a deletion) is skipped with a warning. Deletes nothing: see
    /// [`Entities::drop_orphan_queues`].
    pub fn restore(&self, broker: &Broker, records: EntityRecords) -> Result<(), RestoreError> {
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
            entities.push(queue_from_record(r).map_err(|e| RestoreError::undecodable(RecordKind::Queue, key, e.0))?);
        }
        for b in records.bindings {
            let key = || {
                let dest = match &b.binding.dest {
                    Destination::Queue(q) => format!("queue id {}", q.0),
                    Destination::Exchange(x) => format!("exchange {x}"),
                    Destination::Session(s) => format!("session {}", s.client_id),
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
            self.install(broker, Arc::new(entity));
            queues += 1;
        }
        if exchanges + queues + bindings > 0 {
            info!(exchanges, queues, bindings, "restored AMQP entities");
        }
        Ok(())
    }

    /// Deletes the consume queues of AMQP queues that did not survive a restart (transient
    /// ones). Run once everything stored was restored.
    pub async fn drop_orphan_queues(&self, broker: &Broker) {
        let all = match broker.stores.catalog.queues() {
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

    /// Deletes queues whose `x-expires` passed without use.
    pub async fn expire_unused(&self, broker: &Broker) {
        let now = now_ms();
        let due: Vec<Arc<QueueEntity>> = self
            .all()
            .into_iter()
            .filter(|q| {
                q.expires_ms().is_some_and(|ms| {
                    q.consumers.load(Ordering::Relaxed) == 0
                        && q.last_used_ms.load(Ordering::Relaxed).saturating_add(ms) <= now
                })
            })
            .collect();
        for q in due {
            info!(queue = %q.name, vhost = %q.vhost, "queue expired (x-expires)");
            self.delete_queue(broker, &q).await;
        }
    }
}

/// Stores a durable exchange.
pub async fn store_exchange(broker: &Broker, vhost: &str, def: &ExchangeDef) {
    if let Err(e) = broker.commit(broker.stores.entities.put_exchange(vhost, def), Commit::Durable).await {
        warn!(error = %e, "cannot store exchange");
    }
}

/// Forgets a durable exchange, its binding records and the values of its
/// de-duplication cache.
pub async fn forget_exchange(broker: &Broker, vhost: &str, name: &str) {
    let write = broker
        .stores
        .entities
        .remove_exchange(vhost, name)
        .await
        .and(broker.stores.dedup.forget_scope(&crate::core::dedup::scope(vhost, name)));
    if let Err(e) = broker.commit(write, Commit::Durable).await {
        warn!(error = %e, "cannot delete exchange metadata");
    }
}

/// Stores (`store`) or forgets a durable binding.
pub async fn persist_binding(broker: &Broker, vhost: &str, exchange: &str, binding: &Binding, store: bool) {
    let entities = &broker.stores.entities;
    let write = if store {
        entities.put_binding(vhost, exchange, binding)
    } else {
        entities.remove_binding(vhost, exchange, binding)
    };
    if let Err(e) = broker.commit(write, Commit::Durable).await {
        warn!(error = %e, "cannot store binding");
    }
}

/// A stream's configuration writing its counters to the entity's gauge, where the
/// operations views read every queue's.
fn counted_with(mut stream: StreamConfig, config: &QueueConfig) -> Arc<StreamConfig> {
    stream.gauge = config.gauge.clone();
    Arc::new(stream)
}

fn storage_name(vhost: &str, name: &str) -> String {
    format!("{QUEUE_PREFIX}{vhost}/{name}")
}

/// The queue a stored record declares, with its configuration derived again from the
/// arguments; why not when they no longer pass the checks.
fn queue_from_record(r: QueueRecord) -> Result<QueueEntity, ArgumentError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn queue_arguments_become_a_configuration() {
        let c = queue_config(
            "/",
            "q",
            true,
            &args(&[
                ("x-message-ttl", Value::Int32(1000)),
                ("x-max-length", Value::Int(5)),
                ("x-overflow", Value::Str("reject-publish".into())),
                ("x-dead-letter-exchange", Value::Str("dlx".into())),
                ("x-dead-letter-routing-key", Value::Str("dead".into())),
                ("x-delivery-limit", Value::Int(3)),
                ("x-single-active-consumer", Value::Bool(true)),
                ("x-queue-type", Value::Str("quorum".into())),
            ]),
        )
        .unwrap();
        assert_eq!(c.message_ttl, Some(1000));
        assert_eq!(c.max_len, 5);
        assert_eq!(c.overflow, Overflow::RejectPublish);
        assert_eq!(c.dead_letter, Some(DeadLetterTarget { exchange: "dlx".into(), routing_key: Some("dead".into()) }));
        assert_eq!(c.delivery_limit, Some(3));
        assert!(c.single_active_consumer);
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(queue_config("/", "q", true, &args(&[("x-message-ttl", Value::Int(-1))])).is_err());
        assert!(queue_config("/", "q", true, &args(&[("x-overflow", Value::Str("nope".into()))])).is_err());
        assert!(queue_config("/", "q", false, &args(&[("x-queue-type", Value::Str("quorum".into()))])).is_err());
        assert!(queue_config("/", "q", true, &args(&[("x-queue-type", Value::Str("stream".into()))])).is_err());
        assert!(queue_config("/", "q", true, &args(&[("x-expires", Value::Int(0))])).is_err());
        // A delivery limit without a dead-letter exchange needs a `%DLQ%` name that fits.
        let long = "q".repeat(251);
        let limit = args(&[("x-delivery-limit", Value::Int(1))]);
        assert!(queue_config("/", &long, true, &limit).unwrap_err().0.contains("x-delivery-limit"));
        assert!(queue_config("/", &"q".repeat(250), true, &limit).is_ok());
        let with_dlx =
            args(&[("x-delivery-limit", Value::Int(1)), ("x-dead-letter-exchange", Value::Str("dlx".into()))]);
        assert!(queue_config("/", &long, true, &with_dlx).is_ok());
    }
}
