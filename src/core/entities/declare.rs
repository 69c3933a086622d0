//! Declaring and deleting entities, whichever entry point asks (AMQP methods, the
//! management API, definitions import): queues with their arguments checked as RabbitMQ
//! checks them, exchanges (alternate and dead-letter exchanges are arguments), bindings to
//! queues and to exchanges, and their durable records through the core's
//! [`EntityStore`](crate::core::store::EntityStore). Access checks are the caller's: they
//! differ per protocol and come first.

use std::sync::Arc;

use tracing::warn;

use super::arguments::{queue_config, ArgumentError};
use super::equivalence::check_equivalent_exchange;
use super::error::{EntityError, EntityKind};
use super::queue::QueueEntity;
use super::registry::Entities;
use super::stream_args::{is_stream, stream_config};
use crate::core::broker::Commit;
use crate::core::limits::{LimitScope, MAX_QUEUES};
use crate::core::queue::QueueConfig;
use crate::core::router::{Binding, ExchangeDef};
use crate::core::store::StoreError;
use crate::core::value::Value;

impl Entities {
    /// Creates a queue that does not exist yet (queue.declare, the management API's PUT,
    /// a definitions import): counts it against the virtual host's `max-queues`, checks its
    /// arguments as RabbitMQ does and makes it a stream or a queue. An exclusive queue
    /// (`exclusive_owner`, the owning connection) is never durable.
    pub async fn create_queue(
        &self,
        vhost: &str,
        name: &str,
        durable: bool,
        exclusive_owner: Option<u64>,
        auto_delete: bool,
        arguments: Vec<(String, Value)>,
    ) -> Result<Arc<QueueEntity>, EntityError> {
        let exclusive = exclusive_owner.is_some();
        let limit = self.broker.limits.get(LimitScope::Vhost, vhost, MAX_QUEUES);
        let slot = self.reserve(vhost, limit).map_err(|limit| EntityError::QueueLimit {
            name: name.to_owned(),
            vhost: vhost.to_owned(),
            limit,
        })?;
        let stream = match is_stream(&arguments) {
            true => Some(stream_config(vhost, name, durable, exclusive, auto_delete, &arguments)?),
            false => None,
        };
        let config = match stream {
            Some(_) => QueueConfig::new(name, vhost),
            None => queue_config(vhost, name, durable, &arguments)?,
        };
        if exclusive && arguments.iter().any(|(k, v)| k == "x-queue-type" && v.as_str() == Some("quorum")) {
            return Err(ArgumentError(format!(
                "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '{name}' in vhost '{vhost}'"
            ))
            .into());
        }
        let durable = durable && !exclusive;
        Ok(self.make_queue(slot, vhost, name, durable, exclusive_owner, auto_delete, arguments, config, stream).await?)
    }

    /// Declares exchange `def` in `vhost`: true when it was created (and stored when
    /// durable), false when an equivalent one exists; an existing one that differs is
    /// [`EntityError::Inequivalent`]. Its arguments (`alternate-exchange`, the hash and
    /// de-duplication settings) are checked by the routing table.
    pub async fn declare_exchange(&self, vhost: &str, def: ExchangeDef) -> Result<bool, EntityError> {
        let router = &self.broker.router;
        if let Some(current) = router.exchange(vhost, &def.name) {
            check_equivalent_exchange(&current, &def, vhost)?;
            return Ok(false);
        }
        if def.durable && self.is_replicated() {
            // Committed first: every member, this one too, declares it when it applies the
            // commit, or refuses it there (a differing declaration committed before it).
            router.check_exchange(vhost, &def)?;
            let broker = &self.broker;
            broker.commit(broker.stores.entities.put_exchange(vhost, &def), Commit::Durable).await?;
            return Ok(true);
        }
        if let Some(current) = router.declare_exchange(vhost, def.clone())? {
            // Declared by someone else since the look-up.
            check_equivalent_exchange(&current, &def, vhost)?;
            return Ok(false);
        }
        if def.durable {
            let broker = &self.broker;
            if let Err(e) = broker.commit(broker.stores.entities.put_exchange(vhost, &def), Commit::Durable).await {
                // Not stored (a cluster without a majority, a failed disk): not declared.
                let _ = router.delete_exchange(vhost, &def.name, false);
                return Err(e.into());
            }
        }
        Ok(true)
    }

    /// Deletes exchange `name` of `vhost` with its bindings, and forgets its durable
    /// records and de-duplication values. With `if_unused`, an exchange that is the source
    /// of a binding is [`EntityError::InUse`]; one that does not exist is
    /// [`EntityError::NotFound`]. A durable exchange's records are forgotten first (on a
    /// cluster member: by a majority), so that a refusal leaves it as it was.
    pub async fn delete_exchange(&self, vhost: &str, name: &str, if_unused: bool) -> Result<(), EntityError> {
        let router = &self.broker.router;
        let in_use =
            || EntityError::InUse { what: EntityKind::Exchange, name: name.to_owned(), vhost: vhost.to_owned() };
        if router.exchange(vhost, name).is_some_and(|x| x.durable) {
            if if_unused && router.has_bindings(vhost, name)? {
                return Err(in_use());
            }
            self.forget_exchange(vhost, name).await?;
            router.delete_exchange(vhost, name, false)?;
            return Ok(());
        }
        match router.delete_exchange(vhost, name, if_unused)? {
            true => Ok(()),
            false => Err(in_use()),
        }
    }

    /// Binds `binding` (to a queue or an exchange) to exchange `source` of `vhost`; its
    /// record is stored when `durable` (both ends are).
    pub async fn bind(&self, vhost: &str, source: &str, binding: &Binding, durable: bool) -> Result<(), EntityError> {
        if durable && self.is_replicated() {
            // Committed first, then made by every member (refused there when its queue or
            // exchange was deleted first).
            self.broker.router.check_bind(vhost, source, binding)?;
            let broker = &self.broker;
            broker.commit(broker.stores.entities.put_binding(vhost, source, binding), Commit::Durable).await?;
            return Ok(());
        }
        let added = self.broker.router.bind(vhost, source, binding.clone())?;
        if durable {
            let broker = &self.broker;
            let write = broker.stores.entities.put_binding(vhost, source, binding);
            if let Err(e) = broker.commit(write, Commit::Durable).await {
                // Not stored: not bound (unless it was bound before).
                if added {
                    let _ = broker.router.unbind(vhost, source, &binding.dest, &binding.key, &binding.args);
                }
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Removes `binding` from exchange `source` of `vhost` (nothing when there is none);
    /// its record is forgotten first when `durable` (both ends are), so that a refusal
    /// leaves the binding as it was.
    pub async fn unbind(&self, vhost: &str, source: &str, binding: &Binding, durable: bool) -> Result<(), EntityError> {
        if durable {
            let broker = &self.broker;
            let write = broker.stores.entities.remove_binding(vhost, source, binding);
            broker.commit(write, Commit::Durable).await?;
        }
        self.broker.router.unbind(vhost, source, &binding.dest, &binding.key, &binding.args)?;
        Ok(())
    }

    /// Deletes every queue of `vhost` and forgets its durable exchanges (the virtual host
    /// itself is its caller's).
    pub async fn delete_vhost_entities(&self, vhost: &str) {
        for q in self.all().into_iter().filter(|q| q.vhost == vhost) {
            self.delete_queue_logged(&q).await;
        }
        for x in self.broker.router.exchanges(vhost) {
            if x.durable {
                if let Err(e) = self.forget_exchange(vhost, &x.name).await {
                    warn!(%vhost, exchange = %x.name, error = %e, "exchange records not forgotten");
                }
            }
        }
    }

    /// Forgets a durable exchange, its binding records and the values of its
    /// de-duplication cache.
    async fn forget_exchange(&self, vhost: &str, name: &str) -> Result<(), StoreError> {
        let broker = &self.broker;
        let write = broker
            .stores
            .entities
            .remove_exchange(vhost, name)
            .and(broker.stores.dedup.forget_scope(&crate::core::dedup::scope(vhost, name)));
        broker.commit(write, Commit::Durable).await
    }
}
