//! The metadata group's state machine: each committed entry's commands made local (this
//! member's queue ids), applied to the local journal (durable before the next entry) and
//! then to this member's memory ([`NodeState::apply`]), in log order on every member.
//! The last applied log id and the membership are kept in the log store's database.
//!
//! Each entry is first judged against the committed catalogue ([`super::catalogue`]): a
//! refused one is applied nowhere, and its refusal is kept for the member that proposed it.
//!
//! **Snapshots** are the catalogue's commands: built from a copy taken between two
//! applications, kept (with everything in the tree made durable) as the latest, and
//! installed on a member too far behind for the log by applying the difference between
//! its catalogue and the snapshot's, removals included.
//!
//! Applying is idempotent (a command says what the state becomes), so an entry applied
//! again after a crash between the journal write and the record of the applied id, or a
//! write forwarded twice, changes nothing the second time.

// openraft's storage traits return its `StorageError` (over 200 bytes) by value.
#![allow(clippy::result_large_err)]

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::catalogue::{Catalogue, Refusals};
use super::metadata::{local, MetaCommand};
use super::node::NodeState;
use super::snapshot_store::{self, StoredSnapshot};
use super::types::{MetaRaft, PeerNode};
use crate::core::store::{Commit, QueueCatalog, StateMachine, StoreWrite};

type Result_<T> = Result<T, StorageError<u64>>;

const APPLIED: &[u8] = b"applied";

/// What the state machine remembers across restarts.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Applied {
    log_id: Option<LogId<u64>>,
    membership: StoredMembership<u64, PeerNode>,
}

/// The metadata group's state machine on this member.
pub(super) struct MetaStateMachine {
    tree: sled::Tree,
    applied: Applied,
    /// What was committed, to judge each entry by.
    catalogue: Catalogue,
    /// Where refused entries are recorded for their proposer.
    refusals: Arc<Refusals>,
    /// The entry being applied (or the last applied): what a publish to a stream this
    /// member can route already was declared at or before.
    applying: Arc<std::sync::atomic::AtomicU64>,
    catalog: Arc<dyn QueueCatalog>,
    local: Arc<dyn StateMachine>,
    node: Arc<dyn NodeState>,
}

fn any(e: impl std::fmt::Display) -> AnyError {
    AnyError::error(e.to_string())
}

impl MetaStateMachine {
    /// The state machine whose applied state is kept in `db`, applying to the local journal
    /// (`local`, `catalog`) and to this member's memory (`node`). Blocking (start-up).
    /// Refused entries are recorded in `refusals`.
    pub(super) fn open(
        db: &sled::Db,
        catalog: Arc<dyn QueueCatalog>,
        local: Arc<dyn StateMachine>,
        node: Arc<dyn NodeState>,
        refusals: Arc<Refusals>,
        applying: Arc<std::sync::atomic::AtomicU64>,
    ) -> Result<MetaStateMachine, String> {
        let tree = db.open_tree("state_machine").map_err(|e| e.to_string())?;
        let applied = match tree.get(APPLIED).map_err(|e| e.to_string())? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("applied state undecodable: {e}"))?,
            None => Applied::default(),
        };
        let catalogue = Catalogue::load(&tree)?;
        Ok(MetaStateMachine { tree, applied, catalogue, refusals, applying, catalog, local, node })
    }

    /// Records the applied log id and the catalogue's changes, in one batch.
    async fn save_applied(&mut self) -> Result_<()> {
        let bytes = serde_json::to_vec(&self.applied).map_err(|e| StorageIOError::write_state_machine(any(e)))?;
        let mut batch = sled::Batch::default();
        batch.insert(APPLIED, bytes);
        self.catalogue.write_changes(&mut batch);
        let tree = self.tree.clone();
        crate::core::blocking::spawn(move || tree.apply_batch(batch))
            .await
            .map_err(|e| StorageIOError::write_state_machine(any(e)))?
            .map_err(|e| StorageIOError::write_state_machine(any(e)).into())
    }
}

/// Builds a snapshot of the catalogue as it was when the builder was made.
pub(super) struct SnapshotBuilder {
    tree: sled::Tree,
    applied: Applied,
    commands: Vec<MetaCommand>,
}

impl RaftSnapshotBuilder<MetaRaft> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result_<Snapshot<MetaRaft>> {
        let data = serde_json::to_vec(&self.commands).map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
        let stored = StoredSnapshot::new(self.applied.log_id, self.applied.membership.clone(), data);
        snapshot_store::keep(&self.tree, &stored).await?;
        tracing::info!(
            index = ?stored.meta.last_log_id.map(|l| l.index),
            commands = self.commands.len(),
            bytes = stored.data.len(),
            "cluster: took a snapshot of the metadata"
        );
        Ok(stored.snapshot())
    }
}

impl MetaStateMachine {
    /// Applies `commands` (the replicated form) to the local journal, durably, then to
    /// this member's memory.
    async fn apply_commands(&self, commands: Vec<MetaCommand>) -> Result<(), String> {
        let mut local_commands = Vec::with_capacity(commands.len());
        for m in commands {
            local_commands.push(local(m, &*self.catalog).await.map_err(|e| e.to_string())?);
        }
        let write = local_commands.iter().cloned().fold(StoreWrite::none(), |w, c| w.and(StoreWrite::one(c)));
        self.local.apply(write, Commit::Durable).await.map_err(|e| e.to_string())?;
        self.node.apply(&local_commands).await;
        Ok(())
    }
}

impl RaftStateMachine<MetaRaft> for MetaStateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result_<(Option<LogId<u64>>, StoredMembership<u64, PeerNode>)> {
        Ok((self.applied.log_id, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result_<Vec<()>>
    where
        I: IntoIterator<Item = openraft::Entry<MetaRaft>> + Send,
        I::IntoIter: Send,
    {
        let mut answers = Vec::new();
        for entry in entries {
            self.applying.fetch_max(entry.log_id.index, std::sync::atomic::Ordering::Release);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(meta) => match self.catalogue.judge(&meta.commands) {
                    Err(refusal) => {
                        // Refused on every member alike: nothing of it is applied.
                        tracing::debug!(index = entry.log_id.index, %refusal, "cluster: metadata entry refused");
                        self.refusals.record(entry.log_id.index, refusal);
                    }
                    Ok(()) => self
                        .apply_commands(meta.commands)
                        .await
                        .map_err(|e| StorageIOError::apply(entry.log_id, any(e)))?,
                },
                EntryPayload::Membership(m) => {
                    self.applied.membership = StoredMembership::new(Some(entry.log_id), m);
                }
            }
            self.applied.log_id = Some(entry.log_id);
            answers.push(());
        }
        self.save_applied().await?;
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { tree: self.tree.clone(), applied: self.applied.clone(), commands: self.catalogue.commands() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result_<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// Makes this member's metadata the snapshot's: what it holds that the snapshot does not
    /// is removed (deleted on the way by entries this member never received), what differs
    /// is put, through the same application as entries; then the snapshot is kept.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, PeerNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result_<()> {
        let failed = |e: String| StorageIOError::write_snapshot(Some(meta.signature()), any(e));
        if let Some(last) = meta.last_log_id {
            self.applying.fetch_max(last.index, std::sync::atomic::Ordering::Release);
        }
        let data = snapshot.into_inner();
        let commands: Vec<MetaCommand> =
            serde_json::from_slice(&data).map_err(|e| failed(format!("undecodable snapshot: {e}")))?;
        let mut target = Catalogue::of_snapshot(commands);
        let changes = self.catalogue.changes_to(&mut target);
        let changed = changes.len();
        self.apply_commands(changes).await.map_err(failed)?;
        self.catalogue = target;
        self.applied = Applied { log_id: meta.last_log_id, membership: meta.last_membership.clone() };
        self.save_applied().await?;
        snapshot_store::keep(&self.tree, &StoredSnapshot { meta: meta.clone(), data }).await?;
        tracing::info!(
            index = ?meta.last_log_id.map(|l| l.index),
            changed,
            "cluster: installed a snapshot of the metadata"
        );
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result_<Option<Snapshot<MetaRaft>>> {
        snapshot_store::current(&self.tree).await
    }
}
