//! The data group: the Raft group that holds the members' messages (today: streams'; durable
//! queues and persistent sessions next), run by openraft next to the metadata group, over
//! the same peer links and in the same Raft database (trees of its own, `data-0/...`).
//!
//! Owns the group's state machine and its membership. **Applying** an entry appends its
//! publishes ([`DataChange::Append`]) to this member's copies of their streams, in log order on
//! every member, so each copy has the same messages at the same offsets. What was applied
//! (the last entry and the membership) is kept in the journal, in the same submission as
//! the messages ([`Broker::apply_group_appends`]), written without an fsync: the group's
//! log is the durable copy, and openraft reads the applied state back from the journal at
//! start, so it applies again exactly what a crash took from the journal, never twice. An append waits until this member's metadata is as far as it was where
//! the publish was made (the streams it names were declared there), so every member finds
//! the same streams. The group is formed together with the
//! metadata group (by the same members, with the same membership); from then on its leader
//! makes the group's membership follow the metadata group's: a member that joins the
//! cluster is added (a learner until it holds the log, then a voter), a member forgotten is
//! removed. Its leader is elected by its own votes: it may be another member than the
//! metadata group's, and goes on being elected while a majority of the members is up.
//!
//! Its log is not compacted yet (no snapshot is taken): it holds every entry since the
//! group formed (see `docs/cluster.md`).
//!
//! [`Broker::apply_group_appends`]: crate::core::broker::Broker::apply_group_appends

// openraft's storage traits return its `StorageError` (over 200 bytes) by value.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, ChangeMembers, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use super::node::NodeState;
use super::snapshot_store::{self, StoredSnapshot};
use super::types::{DataChange, DataEntry, DataRaft, DataRaftHandle, MetaRaftHandle, PeerNode};
use crate::core::message::SharedMessage;
use crate::core::store::QueueId;

type Result_<T> = Result<T, StorageError<u64>>;

/// The data group's name: its trees are prefixed with it, `ctl cluster status` shows it.
pub(super) const DATA_GROUP: &str = "data-0";

fn any(e: impl std::fmt::Display) -> AnyError {
    AnyError::error(e.to_string())
}

/// What the state machine remembers across restarts, and what a snapshot holds.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Applied {
    log_id: Option<LogId<u64>>,
    membership: StoredMembership<u64, PeerNode>,
    /// Probes applied.
    probes: u64,
    /// The last entry number applied of each proposing member.
    #[serde(default)]
    seen: std::collections::BTreeMap<String, u64>,
}

impl Applied {
    /// True the first time entry `seq` of member `from` is applied (a probe, from no
    /// member, always): an entry committed again after a lost answer is applied once.
    fn first_time(&mut self, from: &str, seq: u64) -> bool {
        if from.is_empty() {
            return true;
        }
        match self.seen.get_mut(from) {
            Some(last) if *last >= seq => false,
            Some(last) => {
                *last = seq;
                true
            }
            None => {
                self.seen.insert(from.to_owned(), seq);
                true
            }
        }
    }
}

/// The data group's state machine on this member.
pub(super) struct DataStateMachine {
    /// Where snapshots are kept.
    tree: sled::Tree,
    /// What was applied (read from the journal on first use).
    applied: Option<Applied>,
    node: Arc<dyn NodeState>,
    /// The metadata group's Raft node, once started.
    meta: tokio::sync::watch::Receiver<Option<MetaRaftHandle>>,
}

impl DataStateMachine {
    /// The state machine of `node`'s journal, keeping its snapshots in `db`. Blocking
    /// (start-up).
    pub(super) fn open(
        db: &sled::Db,
        node: Arc<dyn NodeState>,
        meta: tokio::sync::watch::Receiver<Option<MetaRaftHandle>>,
    ) -> Result<DataStateMachine, String> {
        let tree = db.open_tree(format!("{DATA_GROUP}/state_machine")).map_err(|e| e.to_string())?;
        Ok(DataStateMachine { tree, applied: None, node, meta })
    }

    /// What was applied: kept in the journal with the messages it appended, so it is
    /// never ahead of them (a state that cannot be read or decoded stops the start).
    async fn applied(&mut self) -> Result_<&mut Applied> {
        if self.applied.is_none() {
            let read = self.node.broker().group_applied(DATA_GROUP).await;
            let bytes = read.map_err(|e| StorageIOError::read_state_machine(any(e)))?;
            let applied = match bytes {
                Some(b) => serde_json::from_slice(&b).map_err(|e| {
                    StorageIOError::read_state_machine(any(format!(
                        "the data group's applied state is undecodable: {e}"
                    )))
                })?,
                None => Applied::default(),
            };
            self.applied = Some(applied);
        }
        Ok(self.applied.as_mut().expect("read above"))
    }

    /// Waits until this member's metadata group applied entry `index` (streams declared
    /// by then are here); says so every 10 s while it waits.
    async fn wait_for_metadata(&mut self, index: u64) {
        let raft = match self.meta.wait_for(|r| r.is_some()).await {
            Ok(r) => r.clone().expect("waited for it"),
            Err(_) => return,
        };
        loop {
            let waited = raft.wait(Some(Duration::from_secs(10))).applied_index_at_least(Some(index), "data").await;
            match waited {
                Ok(_) => return,
                Err(openraft::metrics::WaitError::Timeout(..)) => {
                    tracing::warn!(index, "cluster: the data group waits for this member's metadata to reach an entry")
                }
                Err(_) => return,
            }
        }
    }

    /// This member's copies of the entries' publishes: each message with the streams it
    /// names that are declared here; and the probes counted in `probes`.
    async fn appends_of(
        &mut self,
        changes: Vec<DataChange>,
        probes: &mut u64,
    ) -> Result<Vec<(SharedMessage, Vec<QueueId>)>, String> {
        let mut appends = Vec::new();
        for change in changes {
            match change {
                DataChange::Probe => *probes += 1,
                DataChange::Append { meta_index, vhost, queues, message } => {
                    self.wait_for_metadata(meta_index).await;
                    let ids: Vec<QueueId> =
                        queues.iter().filter_map(|name| self.node.data_group_queue(&vhost, name)).collect();
                    let msg = message.message().map_err(|e| e.to_string())?;
                    appends.push((Arc::new(msg), ids));
                }
            }
        }
        Ok(appends)
    }

    /// Appends `appends` and records `applied` with them in the journal, in one submission
    /// (written, not fsynced: the group's log is the durable copy, and what a crash takes
    /// from the journal is applied again from it).
    async fn save(&mut self, appends: Vec<(SharedMessage, Vec<QueueId>)>, applied: Applied) -> Result_<()> {
        let bytes = serde_json::to_vec(&applied).map_err(|e| StorageIOError::write_state_machine(any(e)))?;
        let broker = self.node.broker();
        broker
            .apply_group_appends(appends, DATA_GROUP, bytes.into())
            .await
            .map_err(|e| StorageIOError::write_state_machine(any(e)))?;
        self.applied = Some(applied);
        Ok(())
    }
}

/// Builds a snapshot of the applied state as it was when the builder was made.
pub(super) struct SnapshotBuilder {
    tree: sled::Tree,
    applied: Applied,
}

impl RaftSnapshotBuilder<DataRaft> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result_<Snapshot<DataRaft>> {
        let data = serde_json::to_vec(&self.applied).map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
        let stored = StoredSnapshot::new(self.applied.log_id, self.applied.membership.clone(), data);
        snapshot_store::keep(&self.tree, &stored).await?;
        Ok(stored.snapshot())
    }
}

impl RaftStateMachine<DataRaft> for DataStateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result_<(Option<LogId<u64>>, StoredMembership<u64, PeerNode>)> {
        let applied = self.applied().await?;
        Ok((applied.log_id, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result_<Vec<()>>
    where
        I: IntoIterator<Item = openraft::Entry<DataRaft>> + Send,
        I::IntoIter: Send,
    {
        let mut applied = self.applied().await?.clone();
        let mut answers = Vec::new();
        let mut appends = Vec::new();
        for entry in entries {
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(data) if !applied.first_time(&data.from, data.seq) => {
                    tracing::debug!(from = %data.from, seq = data.seq, "cluster: a data entry committed again, applied once");
                }
                EntryPayload::Normal(data) => {
                    let ops = self
                        .appends_of(data.changes, &mut applied.probes)
                        .await
                        .map_err(|e| StorageIOError::apply(entry.log_id, any(e)))?;
                    appends.extend(ops);
                }
                EntryPayload::Membership(m) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), m);
                }
            }
            applied.log_id = Some(entry.log_id);
            answers.push(());
        }
        self.save(appends, applied).await?;
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { tree: self.tree.clone(), applied: self.applied.clone().unwrap_or_default() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result_<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, PeerNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result_<()> {
        let failed = |e: String| StorageIOError::write_snapshot(Some(meta.signature()), any(e));
        let data = snapshot.into_inner();
        let applied: Applied =
            serde_json::from_slice(&data).map_err(|e| failed(format!("undecodable snapshot: {e}")))?;
        let applied = Applied { log_id: meta.last_log_id, membership: meta.last_membership.clone(), ..applied };
        self.save(Vec::new(), applied).await?;
        snapshot_store::keep(&self.tree, &StoredSnapshot { meta: meta.clone(), data }).await
    }

    async fn get_current_snapshot(&mut self) -> Result_<Option<Snapshot<DataRaft>>> {
        snapshot_store::current(&self.tree).await
    }
}

/// A probe entry.
pub(super) fn probe() -> DataEntry {
    DataEntry { changes: vec![DataChange::Probe], from: String::new(), seq: 0 }
}

/// While this member runs: whenever it leads the data group, makes the group's membership
/// the metadata group's (looked at when either changes, and every second).
pub(super) async fn follow_membership(id: u64, meta: MetaRaftHandle, data: DataRaftHandle) {
    let (mut meta_metrics, mut data_metrics) = (meta.metrics(), data.metrics());
    loop {
        let leads = data_metrics.borrow().current_leader == Some(id);
        if leads {
            if let Err(e) = follow_once(&meta, &data).await {
                debug!(error = %e, "cluster: the data group's membership not changed yet");
            }
        }
        let stopped = tokio::select! {
            changed = meta_metrics.changed() => changed.is_err(),
            changed = data_metrics.changed() => changed.is_err(),
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
        };
        if stopped {
            return;
        }
    }
}

/// One step towards the metadata group's membership: learners added, learners that hold
/// the log made voters, voters and nodes no longer members removed.
async fn follow_once(meta: &MetaRaftHandle, data: &DataRaftHandle) -> Result<(), String> {
    let want = meta.metrics().borrow().membership_config.membership().clone();
    if want.nodes().next().is_none() {
        return Ok(());
    }
    let have = data.metrics().borrow().membership_config.membership().clone();
    if have.get_joint_config().len() > 1 {
        return Ok(());
    }
    let want_voters: BTreeSet<u64> = want.voter_ids().collect();
    let have_voters: BTreeSet<u64> = have.voter_ids().collect();
    let have_nodes: BTreeSet<u64> = have.nodes().map(|(id, _)| *id).collect();
    for (id, node) in want.nodes() {
        if !have_nodes.contains(id) {
            info!(member = %node.name, group = DATA_GROUP, "cluster: adding a member to the data group");
            // Not waited for (a member that dies while it is sent the log must not hold the
            // group's membership up): it is made a voter below once it holds the log.
            data.add_learner(*id, node.clone(), false).await.map_err(|e| e.to_string())?;
        }
    }
    // Learners that hold the leader's log but for a few entries become voters.
    let caught_up = |id: &u64| {
        let m = data.metrics().borrow().clone();
        let last = m.last_log_index.unwrap_or(0);
        let matched = m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map_or(0, |l| l.index);
        matched + super::IN_SYNC_LAG >= last
    };
    let add: BTreeSet<u64> =
        want_voters.difference(&have_voters).copied().filter(|id| have_nodes.contains(id) && caught_up(id)).collect();
    if !add.is_empty() {
        data.change_membership(ChangeMembers::AddVoterIds(add), false).await.map_err(|e| e.to_string())?;
    }
    let remove: BTreeSet<u64> = have_voters.difference(&want_voters).copied().collect();
    if !remove.is_empty() {
        info!(group = DATA_GROUP, count = remove.len(), "cluster: removing forgotten members from the data group");
        data.change_membership(ChangeMembers::RemoveVoters(remove), false).await.map_err(|e| e.to_string())?;
    }
    let want_nodes: BTreeSet<u64> = want.nodes().map(|(id, _)| *id).collect();
    let gone: BTreeSet<u64> = data
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .nodes()
        .map(|(id, _)| *id)
        .filter(|id| !want_nodes.contains(id))
        .collect();
    if !gone.is_empty() {
        data.change_membership(ChangeMembers::RemoveNodes(gone), false).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Applied;

    #[test]
    fn an_entry_committed_twice_is_applied_once_and_probes_always() {
        let mut applied = Applied::default();
        assert!(applied.first_time("n1", 10));
        assert!(!applied.first_time("n1", 10), "the same entry again");
        assert!(applied.first_time("n2", 3), "another member's numbers are its own");
        assert!(applied.first_time("n1", 11));
        assert!(!applied.first_time("n1", 9), "an older one, late");
        assert!(applied.first_time("", 0) && applied.first_time("", 0), "probes");
    }
}
