//! The metadata group's state machine: each committed entry's commands made local (this
//! member's queue ids), applied to the local journal (durable before the next entry) and
//! then to this member's memory ([`NodeState::apply`]), in log order on every member.
//! The last applied log id and the membership are kept in the log store's database.
//!
//! Each entry is first judged against the committed catalogue ([`super::catalogue`]): a
//! refused one is applied nowhere, and its refusal is kept for the member that proposed it.
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
use super::metadata::local;
use super::types::{MetaRaft, PeerNode};
use super::NodeState;
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
    ) -> Result<MetaStateMachine, String> {
        let tree = db.open_tree("state_machine").map_err(|e| e.to_string())?;
        let applied = match tree.get(APPLIED).map_err(|e| e.to_string())? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("applied state undecodable: {e}"))?,
            None => Applied::default(),
        };
        let catalogue = Catalogue::load(&tree)?;
        Ok(MetaStateMachine { tree, applied, catalogue, refusals, catalog, local, node })
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

/// The metadata group takes no snapshots yet: its log is never purged.
pub(super) struct NoSnapshots;

impl RaftSnapshotBuilder<MetaRaft> for NoSnapshots {
    async fn build_snapshot(&mut self) -> Result_<Snapshot<MetaRaft>> {
        Err(StorageIOError::write_snapshot(None, any("the metadata group takes no snapshots yet")).into())
    }
}

impl RaftStateMachine<MetaRaft> for MetaStateMachine {
    type SnapshotBuilder = NoSnapshots;

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
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(meta) => {
                    if let Err(refusal) = self.catalogue.judge(&meta.commands) {
                        // Refused on every member alike: nothing of it is applied.
                        tracing::debug!(index = entry.log_id.index, %refusal, "cluster: metadata entry refused");
                        self.refusals.record(entry.log_id.index, refusal);
                        self.applied.log_id = Some(entry.log_id);
                        answers.push(());
                        continue;
                    }
                    let mut commands = Vec::with_capacity(meta.commands.len());
                    for m in meta.commands {
                        let command =
                            local(m, &*self.catalog).await.map_err(|e| StorageIOError::apply(entry.log_id, any(e)))?;
                        commands.push(command);
                    }
                    let write = commands.iter().cloned().fold(StoreWrite::none(), |w, c| w.and(StoreWrite::one(c)));
                    self.local
                        .apply(write, Commit::Durable)
                        .await
                        .map_err(|e| StorageIOError::apply(entry.log_id, any(e)))?;
                    self.node.apply(&commands).await;
                }
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

    async fn get_snapshot_builder(&mut self) -> NoSnapshots {
        NoSnapshots
    }

    async fn begin_receiving_snapshot(&mut self) -> Result_<Box<Cursor<Vec<u8>>>> {
        Err(StorageIOError::write_snapshot(None, any("the metadata group takes no snapshots yet")).into())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, PeerNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result_<()> {
        Err(StorageIOError::write_snapshot(Some(meta.signature()), any("the metadata group takes no snapshots yet"))
            .into())
    }

    async fn get_current_snapshot(&mut self) -> Result_<Option<Snapshot<MetaRaft>>> {
        Ok(None)
    }
}
