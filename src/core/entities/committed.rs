//! Entity commands a cluster's metadata group committed, applied to this member's memory
//! (the routing table and the queue registry). The member that made a change applied it
//! already, so each application checks first and changes nothing twice.

use std::sync::Arc;

use tracing::warn;

use super::registry::Entities;
use super::restore::queue_from_record;
use crate::core::store::EntityCommand;

impl Entities {
    /// Applies `command` to memory unless it is there already.
    pub async fn apply_committed(&self, command: &EntityCommand) {
        let router = &self.broker.router;
        match command {
            EntityCommand::PutExchange { vhost, def } => {
                if !router.has_vhost(vhost) {
                    router.add_vhost(vhost);
                }
                if router.exchange(vhost, &def.name).is_none() {
                    if let Err(e) = router.declare_exchange(vhost, def.clone()) {
                        warn!(%vhost, exchange = %def.name, error = %e, "committed exchange not applied");
                    }
                }
            }
            EntityCommand::RemoveExchange { vhost, name } => {
                let _ = router.delete_exchange(vhost, name, false);
            }
            EntityCommand::PutQueue(record) => {
                if self.queue(&record.vhost, &record.name).is_some() {
                    return;
                }
                match queue_from_record(record.clone()) {
                    Ok(entity) => {
                        if !router.has_vhost(&entity.vhost) {
                            router.add_vhost(&entity.vhost);
                        }
                        *self.counts.lock().entry(entity.vhost.clone()).or_default() += 1;
                        self.install(Arc::new(entity));
                    }
                    Err(e) => {
                        warn!(vhost = %record.vhost, queue = %record.name, error = %e, "committed queue not applied")
                    }
                }
            }
            EntityCommand::RemoveQueue { vhost, name, .. } => {
                if let Some(entity) = self.queue(vhost, name) {
                    self.forget_queue(&entity).await;
                }
            }
            EntityCommand::PutBinding { vhost, exchange, binding } => {
                if let Err(e) = router.bind(vhost, exchange, binding.clone()) {
                    warn!(%vhost, %exchange, error = %e, "committed binding not applied");
                }
            }
            EntityCommand::RemoveBinding { vhost, exchange, binding } => {
                let _ = router.unbind(vhost, exchange, &binding.dest, &binding.key, &binding.args);
            }
        }
    }

    /// Forgets every queue of `vhost` still in memory when its deletion is applied: its
    /// durable queues went through the group before it, so what is left is this member's
    /// transient queues (nothing of them is stored).
    pub async fn forget_vhost_queues(&self, vhost: &str) {
        for q in self.all().into_iter().filter(|q| q.vhost == vhost) {
            self.forget_queue(&q).await;
        }
    }
}
