//! The core's [`StateMachine`] on a cluster member: a batch's metadata commands (see
//! [`super::metadata`]) are committed by the metadata group, which applies them to every
//! member's journal and memory, before the batch is acknowledged; the rest of the batch is
//! applied by the local journal, as on a single node.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::metadata::replicated;
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
            for command in write.into_commands() {
                let names =
                    self.cluster.names().ok_or_else(|| StoreError::NotCommitted("the cluster has not started".into()));
                let replicated = match names {
                    Ok(names) => {
                        replicated(&command, names.as_ref()).map_err(|e| StoreError::NotCommitted(e.to_string()))?
                    }
                    Err(e) => match replicated(&command, &NoNames) {
                        Ok(None) => None,
                        _ => return Err(e),
                    },
                };
                match replicated {
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

impl super::QueueNames for NoNames {
    fn queue_name(&self, _id: crate::core::store::QueueId) -> Option<(String, String)> {
        None
    }
}
