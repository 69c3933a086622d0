//! The core's [`StateMachine`] on a cluster member: a batch's metadata commands (see
//! [`super::metadata`]) are committed by the metadata group, which applies them to every
//! member's journal and memory, before the batch is acknowledged; the rest of the batch is
//! applied by the local journal, as on a single node.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::metadata::{replicated, QueueNames};
use super::types::MetaEntry;
use super::Cluster;
use crate::core::store::{Commit, StateMachine, StoreError, StoreWrite};

/// The replicated state machine.
#[derive(Debug)]
pub(super) struct Replicated {
    /// This member.
    pub cluster: Arc<Cluster>,
    /// The journal's state machine.
    pub local: Arc<dyn StateMachine>,
}

impl StateMachine for Replicated {
    fn apply(&self, write: StoreWrite, wait: Commit) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut meta = Vec::new();
            let mut rest = StoreWrite::none();
            // Until the member is built nothing names queues by id: a binding to a queue
            // made before then is refused (every other command waits for the group).
            let names: &dyn QueueNames = match self.cluster.names() {
                Some(names) => names.as_ref(),
                None => &NoNames,
            };
            for command in write.into_commands() {
                match replicated(&command, names).map_err(|e| StoreError::NotCommitted(e.to_string()))? {
                    Some(m) => meta.push(m),
                    None => rest = rest.and(StoreWrite::one(command)),
                }
            }
            if !meta.is_empty() {
                self.cluster.propose(MetaEntry { commands: meta }).await?;
            }
            self.local.apply(rest, wait).await
        })
    }
}

/// Before the member is built nothing names queues.
struct NoNames;

impl QueueNames for NoNames {
    fn queue_name(&self, _id: crate::core::store::QueueId) -> Option<(String, String)> {
        None
    }
}
