//! The queue registry: every declared queue by virtual host and name, counted against
//! `max-queues`, created (consume queue, configuration, default-exchange binding, durable
//! record) and deleted, `x-expires` expiry, and the admission of publishes to the queues
//! that refuse them when full (`x-overflow: reject-publish`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tracing::{info, warn};

use super::error::EntityError;
use super::queue::QueueEntity;
use crate::core::broker::{Broker, Commit};
use crate::core::message::{now_ms, Message};
use crate::core::queue::{Overflow, QueueConfig};
use crate::core::router::{Binding, Destination, Routes};
use crate::core::shards::ShardCmd;
use crate::core::store::{QueueId, QueueRecord, StoreError};
use crate::core::stream::StreamConfig;
use crate::core::value::Value;

/// Prefix of the storage names of AMQP queues (`amqp/{vhost}/{name}`).
pub(crate) const QUEUE_PREFIX: &str = "amqp/";

/// The declared queues by virtual host and name, and by consume-queue id.
#[derive(Debug, Default)]
struct Queues {
    by_name: HashMap<(String, String), Arc<QueueEntity>>,
    by_id: HashMap<QueueId, Arc<QueueEntity>>,
}

impl Queues {
    /// Adds `entity`; true when its name was taken (the entity it replaces is dropped).
    fn insert(&mut self, entity: Arc<QueueEntity>) -> bool {
        let replaced = self.by_name.insert((entity.vhost.clone(), entity.name.clone()), entity.clone());
        if let Some(old) = &replaced {
            self.by_id.remove(&old.id);
        }
        self.by_id.insert(entity.id, entity);
        replaced.is_some()
    }

    /// Removes the queue named as `entity` is; true when there was one.
    fn remove(&mut self, entity: &QueueEntity) -> bool {
        match self.by_name.remove(&(entity.vhost.clone(), entity.name.clone())) {
            Some(old) => {
                self.by_id.remove(&old.id);
                true
            }
            None => false,
        }
    }
}

/// Every declared queue, and the broker they live in: the one place queues are created
/// and deleted, whichever entry point asks (built once at start-up and shared by the AMQP
/// front-end, the management API and the dead-letter task).
#[derive(Debug)]
pub struct Entities {
    pub(super) broker: Arc<Broker>,
    queues: RwLock<Queues>,
    /// Configurations of queues that refuse publishes when full, by id (publishers check
    /// them before storing).
    rejecting: RwLock<HashMap<QueueId, Arc<QueueConfig>>>,
    any_rejecting: AtomicBool,
    /// A cluster member: durable queues are shared with members whose consumers and use
    /// this one does not see, so usage never deletes them here (x-expires, auto-delete).
    replicated: AtomicBool,
    /// Queues per virtual host, those being created included (for `max-queues`).
    pub(super) counts: Mutex<HashMap<String, u64>>,
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
    /// An empty registry of queues in `broker` (start-up fills it: [`Entities::start`]).
    pub fn new(broker: Arc<Broker>) -> Entities {
        Entities {
            broker,
            queues: RwLock::default(),
            rejecting: RwLock::default(),
            any_rejecting: AtomicBool::new(false),
            replicated: AtomicBool::new(false),
            counts: Mutex::default(),
        }
    }

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

    /// Reserves room in the routed queues that refuse publishes when full (reject-publish)
    /// and leaves out those without room; true when one refused (an AMQP publisher gets a
    /// nack). Done just before storing, so that every reservation is used.
    pub fn admit(&self, msg: &Message, routes: &Arc<Routes>) -> (Arc<Routes>, bool) {
        let Some(configs) = self.overflow_configs(routes.queues.iter().map(|r| r.queue)) else {
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
        self.queues.read().by_name.get(&(vhost.to_owned(), name.to_owned())).cloned()
    }

    /// Every declared queue, of every vhost, in no particular order.
    pub fn all(&self) -> Vec<Arc<QueueEntity>> {
        self.queues.read().by_name.values().cloned().collect()
    }

    /// Makes a queue (its consume queue, configuration, default-exchange binding and,
    /// when durable, its meta record) in the place `slot` counted for it, from a
    /// configuration already checked. The caller checked it does not exist.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn make_queue(
        &self,
        mut slot: QueueSlot<'_>,
        vhost: &str,
        name: &str,
        durable: bool,
        exclusive_owner: Option<u64>,
        auto_delete: bool,
        arguments: Vec<(String, Value)>,
        config: QueueConfig,
        stream: Option<StreamConfig>,
    ) -> Result<Arc<QueueEntity>, StoreError> {
        let broker = &self.broker;
        let catalog = &broker.stores.catalog;
        let storage = storage_name(vhost, name);
        let id = if durable { catalog.durable_queue_id(&storage).await? } else { catalog.queue_id(&storage).await? };
        if durable && self.is_replicated() {
            // Committed first: every member, this one too, makes the queue when it applies
            // the commit (counted there), or refuses it (a differing declaration first).
            let record = QueueRecord { vhost: vhost.to_owned(), name: name.to_owned(), id, auto_delete, arguments };
            broker.commit(broker.stores.entities.put_queue(&record), Commit::Durable).await?;
            return self.queue(vhost, name).ok_or_else(|| {
                StoreError::NotCommitted(format!("queue '{name}' in vhost '{vhost}' was deleted as soon as declared"))
            });
        }
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
        self.install(entity.clone());
        if durable {
            let record = QueueRecord {
                vhost: entity.vhost.clone(),
                name: entity.name.clone(),
                id,
                auto_delete,
                arguments: entity.arguments.clone(),
            };
            if let Err(e) = broker.commit(broker.stores.entities.put_queue(&record), Commit::Durable).await {
                // Not stored (a cluster without a majority, a failed disk): not declared.
                self.forget_queue(&entity).await;
                return Err(e);
            }
        }
        Ok(entity)
    }

    pub(super) fn install(&self, entity: Arc<QueueEntity>) {
        let broker = &self.broker;
        match &entity.stream {
            Some(stream) => broker.shards.send(ShardCmd::ConfigureStream { queue: entity.id, config: stream.clone() }),
            None => broker.shards.send(ShardCmd::Configure { queue: entity.id, config: entity.config.clone() }),
        }
        if matches!(entity.config.overflow, Overflow::RejectPublish | Overflow::RejectPublishDlx) {
            self.rejecting.write().insert(entity.id, entity.config.clone());
            self.any_rejecting.store(true, Ordering::Relaxed);
        }
        // Registered before its default binding is made, so that whoever is told of the
        // binding (a cluster member's binding observer) finds the queue.
        let (vhost, name, id) = (entity.vhost.clone(), entity.name.clone(), entity.id);
        if self.queues.write().insert(entity) {
            // Two declarations of one name raced: the queue is counted once.
            self.uncount(&vhost);
        }
        let _ = broker.router.bind(&vhost, "", Binding::queue(id, &name, Vec::new()));
    }

    /// Deletes a queue: its durable record first (on a cluster member: committed by a
    /// majority), then its bindings and consume queue. Returns the messages it held. A
    /// record that cannot be forgotten leaves the queue as it was, and is the error.
    pub async fn delete_queue(&self, entity: &QueueEntity) -> Result<u64, EntityError> {
        let broker = &self.broker;
        let mut held = 0;
        if entity.durable {
            held = broker.queue_counts(entity.id).await.0;
            let write = broker.stores.entities.remove_queue(&entity.vhost, &entity.name, entity.id);
            broker.commit(write, Commit::Durable).await?;
        }
        // On a cluster member the commit has applied the deletion here already.
        Ok(self.forget_queue(entity).await.max(held))
    }

    /// [`Entities::delete_queue`] where nobody waits for the answer (auto-delete, expiry, a
    /// connection's exclusive queues): a refusal is logged.
    pub async fn delete_queue_logged(&self, entity: &QueueEntity) {
        if let Err(e) = self.delete_queue(entity).await {
            warn!(queue = %entity.name, vhost = %entity.vhost, error = %e, "queue not deleted");
        }
    }

    /// Takes a queue out of the registry and the routing table and deletes its consume
    /// queue (its durable record is the caller's). Returns the message count.
    pub(super) async fn forget_queue(&self, entity: &QueueEntity) -> u64 {
        let broker = &self.broker;
        if self.queues.write().remove(entity) {
            self.uncount(&entity.vhost);
        }
        self.rejecting.write().remove(&entity.id);
        broker.router.unbind_all(&entity.vhost, &Destination::Queue(entity.id));
        broker.shards.delete(entity.id).await
    }

    /// The declared queue whose consume queue is `id`.
    pub fn queue_by_id(&self, id: QueueId) -> Option<Arc<QueueEntity>> {
        self.queues.read().by_id.get(&id).cloned()
    }

    /// Deletes queues whose `x-expires` passed without use, every 500 ms, for as long as
    /// the registry lives.
    pub async fn run_expiry(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            self.expire_unused().await;
        }
    }

    /// This broker is a cluster member: from now on durable queues, exchanges and bindings
    /// are made when the metadata group's commit is applied (on every member, this one
    /// too), never before; and usage (`x-expires`, auto-delete) never deletes a durable
    /// queue, whose consumers may be on other members.
    pub fn set_replicated(&self) {
        self.replicated.store(true, Ordering::Relaxed);
    }

    /// True when usage may delete `q`: not a durable queue of a cluster member.
    pub fn usage_may_delete(&self, q: &QueueEntity) -> bool {
        !(q.durable && self.is_replicated())
    }

    /// True on a cluster member: durable entities are made when their commit is applied.
    pub fn is_replicated(&self) -> bool {
        self.replicated.load(Ordering::Relaxed)
    }

    /// Deletes queues whose `x-expires` passed without use.
    pub async fn expire_unused(&self) {
        let now = now_ms();
        let due: Vec<Arc<QueueEntity>> = self
            .all()
            .into_iter()
            .filter(|q| self.usage_may_delete(q))
            .filter(|q| {
                q.expires_ms().is_some_and(|ms| {
                    q.consumers.load(Ordering::Relaxed) == 0
                        && q.last_used_ms.load(Ordering::Relaxed).saturating_add(ms) <= now
                })
            })
            .collect();
        for q in due {
            info!(queue = %q.name, vhost = %q.vhost, "queue expired (x-expires)");
            self.delete_queue_logged(&q).await;
        }
    }
}

/// A stream's configuration writing its counters to the entity's gauge, where the
/// operations views read every queue's.
pub(super) fn counted_with(mut stream: StreamConfig, config: &QueueConfig) -> Arc<StreamConfig> {
    stream.gauge = config.gauge.clone();
    Arc::new(stream)
}

/// The consume-queue name of AMQP queue `name` of `vhost` (what the catalog maps to its id).
pub(crate) fn storage_name(vhost: &str, name: &str) -> String {
    format!("{QUEUE_PREFIX}{vhost}/{name}")
}
