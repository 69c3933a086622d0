//! Durable records of exchanges and bindings, written through the core's
//! [`EntityStore`](crate::core::store::EntityStore).

use tracing::warn;

use crate::core::broker::{Broker, Commit};
use crate::core::router::{Binding, ExchangeDef};

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
