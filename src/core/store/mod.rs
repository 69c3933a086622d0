//! The durable state the front-ends keep, behind typed stores: MQTT sessions and their
//! inbound QoS 2 packet ids, the AMQP entity metadata (exchanges, queues, bindings),
//! publisher de-duplication ids, and the catalog of consume-queue names.
//!
//! The front-ends never build journal operations or name a keyspace: they read through a
//! store's methods and get writes back as a [`StoreWrite`], an opaque batch they hand to
//! the core ([`Broker::commit`](crate::core::broker::Broker::commit), or along with a
//! publish so that both land in one journal submission). The keyspace layout of this
//! state is therefore written down once, here, in the local implementation
//! ([`JournalStore`]).
//!
//! Each store is a trait so that a second implementation can replace the local one
//! without touching the front-ends: a replicated store (a Raft log carrying the same
//! batches, reads served from the state it applied) implements the same traits and
//! produces the same `StoreWrite`s. [`Stores`] is the set the broker holds.

mod access;
mod dedup;
mod entities;
mod sessions;

use std::fmt;
use std::sync::Arc;

use ferrymq_storage::{Journal, JournalError, Op};
use futures_util::future::BoxFuture;

use crate::core::restore::{RecordKey, RecordKind, RestoreError};

pub use access::{
    AccessRecords, AccessStore, LimitsRecord, ParameterRecord, PermissionRecord, TopicPermissionRecord, UserRecord,
    VhostRecord,
};
pub use dedup::DedupStore;
pub use entities::{BindingRecord, EntityRecords, EntityStore, ExchangeRecord, QueueRecord};
pub use ferrymq_storage::QueueId;
pub use sessions::{InboundQos2Store, SessionStore, StoredSession, SubOptions, NEVER};

/// Errors of the stores.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The journal refused or failed the read or write.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A stored record that cannot be decoded (named with its kind and key).
    #[error(transparent)]
    Record(#[from] RestoreError),
}

impl StoreError {
    /// The error as a restore error about the record of `kind` under `key`.
    pub fn restoring(self, kind: RecordKind, key: RecordKey) -> RestoreError {
        match self {
            StoreError::Journal(error) => RestoreError::Unreadable { kind, key, error },
            StoreError::Record(e) => e,
        }
    }
}

/// A batch of changes to durable state, made by a store's methods and applied in one
/// journal submission by the core. Empty batches are free.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[must_use = "a store write does nothing until the core commits it"]
pub struct StoreWrite {
    ops: Vec<Op>,
}

impl StoreWrite {
    /// An empty batch: committing it writes nothing (for calls that take a `StoreWrite` anyway).
    pub fn none() -> StoreWrite {
        StoreWrite::default()
    }

    /// True when the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// This batch followed by `other`, applied together.
    pub fn and(mut self, other: StoreWrite) -> StoreWrite {
        self.ops.extend(other.ops);
        self
    }

    pub(crate) fn of(ops: Vec<Op>) -> StoreWrite {
        StoreWrite { ops }
    }

    pub(crate) fn into_ops(self) -> Vec<Op> {
        self.ops
    }
}

/// Names of consume queues and their ids (queue owners, sessions and AMQP queues are
/// all addressed by id).
pub trait QueueCatalog: fmt::Debug + Send + Sync {
    /// The id of the named consume queue, created on first use; an id is never handed
    /// out again once its queue is deleted. Never blocks the calling thread: a name seen
    /// before is answered from memory, a new one by whoever allocates ids (the local
    /// journal's writer thread).
    fn queue_id<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<QueueId, StoreError>>;

    /// [`QueueCatalog::queue_id`] for code that may block (start-up restore, tools): never
    /// on a runtime worker.
    fn queue_id_blocking(&self, name: &str) -> Result<QueueId, StoreError>;

    /// Every consume queue name with its id (blocking: start-up only).
    fn queues(&self) -> Result<Vec<(String, QueueId)>, StoreError>;
}

/// The stores the broker holds, one per kind of front-end state.
#[derive(Debug, Clone)]
pub struct Stores {
    /// Consume-queue names and the ids allocated to them.
    pub catalog: Arc<dyn QueueCatalog>,
    /// Persistent MQTT sessions.
    pub sessions: Arc<dyn SessionStore>,
    /// Inbound MQTT QoS 2 packet ids awaiting PUBREL.
    pub inbound_qos2: Arc<dyn InboundQos2Store>,
    /// Durable AMQP exchanges, queues and bindings.
    pub entities: Arc<dyn EntityStore>,
    /// Publisher de-duplication ids.
    pub dedup: Arc<dyn DedupStore>,
    /// Users, virtual hosts and permissions made at runtime.
    pub access: Arc<dyn AccessStore>,
}

impl Stores {
    /// Every store on the local journal.
    pub fn local(journal: &Journal) -> Stores {
        let store = Arc::new(JournalStore { journal: journal.clone() });
        Stores {
            catalog: store.clone(),
            sessions: store.clone(),
            inbound_qos2: store.clone(),
            entities: store.clone(),
            dedup: store.clone(),
            access: store,
        }
    }
}

/// The local implementation of every store: keyed state in the journal's keyspaces
/// (`Space::Session`, `Space::InboundQos2`, `Space::Meta`), queue names in its catalog.
#[derive(Clone)]
pub struct JournalStore {
    journal: Journal,
}

impl fmt::Debug for JournalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalStore").finish_non_exhaustive()
    }
}

impl QueueCatalog for JournalStore {
    fn queue_id<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<QueueId, StoreError>> {
        Box::pin(async move { Ok(self.journal.resolve_queue_id(name).await?) })
    }

    fn queue_id_blocking(&self, name: &str) -> Result<QueueId, StoreError> {
        Ok(self.journal.queue_id(name)?)
    }

    fn queues(&self) -> Result<Vec<(String, QueueId)>, StoreError> {
        Ok(self.journal.queues()?)
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A journal in a temporary directory and the stores on it.
    pub fn open() -> (tempfile::TempDir, Journal, Stores) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let journal = Journal::open(ferrymq_storage::JournalConfig::new(dir.path())).expect("journal opens");
        let stores = Stores::local(&journal);
        (dir, journal, stores)
    }

    /// Applies a write and waits for it (tests run without a broker).
    pub fn apply(journal: &Journal, w: StoreWrite) {
        journal.write_blocking(w.into_ops()).expect("write applies");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_combine_in_order() {
        let a = StoreWrite::of(vec![Op::DeleteRetained { topic: "a".into() }]);
        let b = StoreWrite::of(vec![Op::DeleteRetained { topic: "b".into() }]);
        assert!(StoreWrite::none().is_empty());
        let both = a.clone().and(StoreWrite::none()).and(b.clone());
        assert_eq!(both.into_ops(), [a.into_ops(), b.into_ops()].concat());
    }

    #[test]
    fn the_catalog_hands_out_stable_ids() {
        let (_dir, _journal, stores) = test_support::open();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let a = rt.block_on(stores.catalog.queue_id("a")).unwrap();
        assert_eq!(stores.catalog.queue_id_blocking("a").unwrap(), a);
        let b = rt.block_on(stores.catalog.queue_id("b")).unwrap();
        assert_ne!(a, b);
        let mut all = stores.catalog.queues().unwrap();
        all.sort();
        assert_eq!(all, vec![("a".to_owned(), a), ("b".to_owned(), b)]);
    }
}
