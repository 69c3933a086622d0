//! The durable state the front-ends keep, as typed commands and typed reads: MQTT
//! sessions and their inbound QoS 2 packet ids, the AMQP entity metadata (exchanges,
//! queues, bindings), users, virtual hosts, permissions, rules, parameters and limits,
//! publisher de-duplication ids, retained-message removals, stream group cursors, and the
//! catalog of consume-queue names.
//!
//! **Writes are commands.** Every change to this state is a [`Command`]: a typed value
//! saying what changes (`PutQueue`, `SaveSession`, `Qos2Received`, ...), never how it is
//! stored. The stores' write methods only build commands; a batch of them is a
//! [`StoreWrite`], which the core hands to the one [`StateMachine`] ([`Broker::commit`],
//! or along with a publish so that both land in one journal submission). The state
//! machine applies a batch's commands in order, and batches in the order they are
//! submitted; a batch is acknowledged (the `commit` future resolves) once it is durable.
//!
//! **Reads are asynchronous.** A store's reads return futures, so a front-end never
//! blocks on them and an implementation may answer from a replicated log's applied state.
//!
//! The local implementation, [`JournalStore`], is the single-node state machine: it
//! turns each command into journal operations in the keyspace layout written down in
//! each store's module (the only place that layout exists), and reads the journal's
//! keyspaces off the runtime's workers. A replicated implementation replicates the same
//! commands and implements the same reads: this module is the seam (see
//! `docs/architecture.md`, "The door into the core"). [`Stores`] is the set the broker
//! holds.
//!
//! [`Broker::commit`]: crate::core::broker::Broker::commit

mod access;
mod command;
mod dedup;
mod entities;
mod sessions;
mod state_machine;

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use ferrymq_storage::{Journal, JournalError, Space};
use futures_util::future::BoxFuture;

use crate::core::entities::EntityError;
use crate::core::restore::{RecordKey, RecordKind, RestoreError};

pub use access::{
    AccessCommand, AccessRecords, AccessStore, LimitsRecord, ParameterRecord, PermissionRecord, TopicPermissionRecord,
    UserRecord, VhostRecord,
};
pub use command::Command;
pub use dedup::{DedupCommand, DedupRecord, DedupStore};
pub use entities::{BindingRecord, EntityCommand, EntityRecords, EntityStore, ExchangeRecord, QueueRecord};
pub use ferrymq_storage::QueueId;
pub use sessions::{InboundQos2Store, SessionCommand, SessionStore, StoredSession, SubOptions, NEVER};
pub(crate) use state_machine::command_ops;
pub use state_machine::{Commit, StateMachine};

/// Errors of the stores.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The journal refused or failed the read or write.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A stored record that cannot be decoded (named with its kind and key).
    #[error(transparent)]
    Record(#[from] RestoreError),
    /// A cluster member's change that a majority did not commit (why).
    #[error("not committed: {0}")]
    NotCommitted(String),
    /// A cluster's metadata group committed the change and every member judged it, in log
    /// order, against what was committed before it: refused (a redeclaration that differs
    /// from a declaration committed first, a binding to a queue deleted first), applied
    /// nowhere.
    #[error("{0}")]
    Refused(Box<EntityError>),
}

impl StoreError {
    /// The error as a restore error about the record of `kind` under `key`.
    pub fn restoring(self, kind: RecordKind, key: RecordKey) -> RestoreError {
        match self {
            StoreError::Journal(error) => RestoreError::Unreadable { kind, key, error },
            StoreError::Record(e) => e,
            StoreError::Refused(e) => {
                RestoreError::Unreadable { kind, key, error: ferrymq_storage::JournalError::Io(e.to_string()) }
            }
            StoreError::NotCommitted(why) => {
                RestoreError::Unreadable { kind, key, error: ferrymq_storage::JournalError::Io(why) }
            }
        }
    }
}

/// A batch of [`Command`]s, made by the stores' write methods and applied together, in
/// order, by the [`StateMachine`]. Empty batches are free.
#[derive(Debug, Default, Clone)]
#[must_use = "a store write does nothing until the core commits it"]
pub struct StoreWrite {
    commands: Vec<Command>,
}

impl StoreWrite {
    /// An empty batch: committing it writes nothing (for calls that take a `StoreWrite` anyway).
    pub fn none() -> StoreWrite {
        StoreWrite::default()
    }

    /// The batch of one command.
    pub fn one(command: impl Into<Command>) -> StoreWrite {
        StoreWrite { commands: vec![command.into()] }
    }

    /// True when the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// This batch followed by `other`, applied together.
    pub fn and(mut self, other: StoreWrite) -> StoreWrite {
        self.commands.extend(other.commands);
        self
    }

    /// The commands, in the order they are applied.
    pub fn commands(&self) -> &[Command] {
        &self.commands
    }

    pub(crate) fn into_commands(self) -> Vec<Command> {
        self.commands
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

    /// [`QueueCatalog::queue_id`] for a queue that keeps a backlog for a consumer that may
    /// be away (an MQTT persistent session, a shared subscription, a durable AMQP queue):
    /// its storage is also made ready now, off the journal's writer thread, so that its
    /// first backlog does not hold up other clients' publishes. A failure there is left
    /// for the first write to report.
    fn durable_queue_id<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<QueueId, StoreError>>;

    /// [`QueueCatalog::queue_id`] for code that may block (start-up restore, tools): never
    /// on a runtime worker.
    fn queue_id_blocking(&self, name: &str) -> Result<QueueId, StoreError>;

    /// Every consume queue name with its id.
    fn queues(&self) -> BoxFuture<'_, Result<Vec<(String, QueueId)>, StoreError>>;
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
    /// Where every store's commands are applied (through [`Broker::commit`] only).
    ///
    /// [`Broker::commit`]: crate::core::broker::Broker::commit
    pub(in crate::core) state: Arc<dyn StateMachine>,
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
            access: store.clone(),
            state: store,
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

    fn durable_queue_id<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<QueueId, StoreError>> {
        Box::pin(async move {
            let id = self.journal.resolve_queue_id(name).await?;
            let journal = self.journal.clone();
            if let Err(e) = blocking_read(move || journal.create_queue_files(id)).await {
                tracing::debug!(queue = id.0, error = %e, "creating a queue's files ahead failed");
            }
            Ok(id)
        })
    }

    fn queue_id_blocking(&self, name: &str) -> Result<QueueId, StoreError> {
        Ok(self.journal.queue_id(name)?)
    }

    fn queues(&self) -> BoxFuture<'_, Result<Vec<(String, QueueId)>, StoreError>> {
        let journal = self.journal.clone();
        Box::pin(async move { Ok(blocking_read(move || journal.queues()).await?) })
    }
}

impl JournalStore {
    /// The local store on `journal`.
    pub(crate) fn new(journal: &Journal) -> JournalStore {
        JournalStore { journal: journal.clone() }
    }

    /// Every record of `space` under `prefix`, read off the runtime's workers.
    fn scan(
        &self,
        space: Space,
        prefix: Bytes,
    ) -> impl std::future::Future<Output = Result<Vec<(Bytes, Bytes)>, JournalError>> + Send + 'static {
        let journal = self.journal.clone();
        blocking_read(move || journal.scan(space, &prefix))
    }

    /// The record of `space` under `key`, read off the runtime's workers.
    fn get(
        &self,
        space: Space,
        key: Bytes,
    ) -> impl std::future::Future<Output = Result<Option<Bytes>, JournalError>> + Send + 'static {
        let journal = self.journal.clone();
        blocking_read(move || journal.get(space, &key))
    }
}

/// Runs a blocking journal read on the blocking pool; a read that could not run is an
/// I/O error of the journal.
async fn blocking_read<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, JournalError> + Send + 'static,
) -> Result<T, JournalError> {
    crate::core::blocking::spawn(read).await.unwrap_or_else(|e| Err(JournalError::Io(e.to_string())))
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A journal in a temporary directory and the stores on it.
    pub(crate) fn open() -> (tempfile::TempDir, Journal, Stores) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let journal = Journal::open(ferrymq_storage::JournalConfig::new(dir.path())).expect("journal opens");
        let stores = Stores::local(&journal);
        (dir, journal, stores)
    }

    /// Applies a write and waits for it (tests run without a broker).
    pub(crate) fn apply(journal: &Journal, w: StoreWrite) {
        let ops = read(JournalStore::new(journal).ops(w)).expect("commands encode");
        journal.write_blocking(ops).expect("write applies");
    }

    /// Writes raw journal operations (a test's damaged records).
    pub(crate) fn apply_ops(journal: &Journal, ops: Vec<ferrymq_storage::Op>) {
        journal.write_blocking(ops).expect("write applies");
    }

    /// Runs a store's read to its end (tests run without a runtime).
    pub(crate) fn read<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_combine_in_order() {
        let a = StoreWrite::one(Command::ClearRetained { topic: "a".into() });
        let b = StoreWrite::one(Command::ClearRetained { topic: "b".into() });
        assert!(StoreWrite::none().is_empty());
        let both = a.and(StoreWrite::none()).and(b);
        let topics: Vec<_> = both
            .commands()
            .iter()
            .map(|c| match c {
                Command::ClearRetained { topic } => topic.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(topics, ["a", "b"]);
    }

    #[test]
    fn the_catalog_hands_out_stable_ids() {
        let (_dir, _journal, stores) = test_support::open();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let a = rt.block_on(stores.catalog.queue_id("a")).unwrap();
        assert_eq!(stores.catalog.queue_id_blocking("a").unwrap(), a);
        let b = rt.block_on(stores.catalog.queue_id("b")).unwrap();
        assert_ne!(a, b);
        let mut all = rt.block_on(stores.catalog.queues()).unwrap();
        all.sort();
        assert_eq!(all, vec![("a".to_owned(), a), ("b".to_owned(), b)]);
    }
}
