//! Who is in the metadata group: its formation from `cluster.peers`, a new member joining a
//! group that runs already, and a member forgotten (`ctl cluster forget`). Every change of
//! membership is openraft's (`initialize`, `add_learner`, `change_membership`).
//!
//! **Formation.** A member whose Raft log is empty asks its peers whether the group exists.
//! If one of them says so, it asks the leader (through that peer) to add it: first as a
//! learner, sent every entry, then as a voter. If none does and it can reach a majority of
//! the configured members, it proposes the membership `cluster.peers` names (itself
//! included); every member of a fresh cluster proposes the same one, which openraft
//! documents as safe, and the first committed is the group. Until either happens it asks
//! again every second: a member never waits for the others to start, and never forms a
//! group of its own with members it cannot reach. The data group is formed with the
//! metadata group, by the same members with the same membership (then its leader makes its
//! membership follow the metadata group's: [`super::data_group`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;
use tracing::{info, warn};

use super::rpc::{ForwardedWriteError, MembershipChange, PeerClient, PeerRequest, PeerResponse};
use super::types::{DataEntry, DataRaft, DataRaftHandle, Group, MetaEntry, MetaRaft, MetaRaftHandle, PeerNode};
use super::Cluster;
use crate::composition::config::PeerEntry;

/// How long a peer has to answer whether the group exists.
const HELLO_TTL: Duration = Duration::from_secs(1);

/// How long a member's joining may take (it is sent the whole log first).
const JOIN_LIMIT: Duration = Duration::from_secs(60);

/// What the leader is asked to commit.
#[derive(Debug, Clone)]
pub(super) enum Change {
    /// Metadata commands.
    Write(MetaEntry),
    /// A change of membership.
    Members(MembershipChange),
}

/// Where a change was committed, or why not.
pub(super) type ClientWrite = Result<openraft::LogId<u64>, RaftError<u64, ClientWriteError<u64, PeerNode>>>;

/// A change a group's leader makes: on this member when it leads, else asked of the leader
/// over the peer link.
pub(super) trait Proposal<C: Group> {
    /// Makes the change on this member (which must lead the group); the log id of its
    /// last entry.
    fn make(&self, raft: &openraft::Raft<C>) -> impl std::future::Future<Output = ClientWrite> + Send;

    /// The request that asks a leader over the peer link.
    fn request(&self) -> PeerRequest;
}

impl Proposal<DataRaft> for DataEntry {
    async fn make(&self, raft: &DataRaftHandle) -> ClientWrite {
        raft.client_write(self.clone()).await.map(|r| r.log_id)
    }

    fn request(&self) -> PeerRequest {
        PeerRequest::DataWrite(self.clone())
    }
}

impl Proposal<MetaRaft> for Change {
    async fn make(&self, raft: &MetaRaftHandle) -> ClientWrite {
        match self {
            Change::Write(entry) => raft.client_write(entry.clone()).await.map(|r| r.log_id),
            Change::Members(MembershipChange::Join { name, addr, id }) => {
                // An older incarnation of the same name (its data directory replaced): out
                // first, so that an id that voted before never votes again without its log.
                remove_named(raft, name, Some(*id)).await?;
                let added = raft.add_learner(*id, PeerNode { name: name.clone(), addr: addr.clone() }, true).await?;
                if raft.metrics().borrow().membership_config.membership().voter_ids().any(|v| v == *id) {
                    return Ok(added.log_id);
                }
                Ok(raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([*id])), false).await?.log_id)
            }
            Change::Members(MembershipChange::Forget { name }) => {
                Ok(remove_named(raft, name, None).await?.unwrap_or_default())
            }
        }
    }

    fn request(&self) -> PeerRequest {
        match self {
            Change::Write(entry) => PeerRequest::ClientWrite(entry.clone()),
            Change::Members(change) => PeerRequest::ChangeMembers(change.clone()),
        }
    }
}

/// Removes the nodes named `name` (but `keep`) from the membership: voters, then learners;
/// the log id of the last change, if any was needed.
async fn remove_named(
    raft: &MetaRaftHandle,
    name: &str,
    keep: Option<u64>,
) -> Result<Option<openraft::LogId<u64>>, RaftError<u64, ClientWriteError<u64, PeerNode>>> {
    let named = |raft: &MetaRaftHandle| -> (BTreeSet<u64>, BTreeSet<u64>) {
        let metrics = raft.metrics();
        let membership = metrics.borrow().membership_config.membership().clone();
        let ids: BTreeSet<u64> =
            membership.nodes().filter(|(id, n)| n.name == name && Some(**id) != keep).map(|(id, _)| *id).collect();
        let voters = membership.voter_ids().filter(|v| ids.contains(v)).collect();
        (ids, voters)
    };
    let mut last = None;
    let (_, voters) = named(raft);
    if !voters.is_empty() {
        last = Some(raft.change_membership(ChangeMembers::RemoveVoters(voters), false).await?.log_id);
    }
    let (learners, _) = named(raft);
    if !learners.is_empty() {
        last = Some(raft.change_membership(ChangeMembers::RemoveNodes(learners), false).await?.log_id);
    }
    Ok(last)
}

impl Cluster {
    /// Forms the group or joins it (see the module's documentation); returns once this
    /// member's log is no longer empty.
    pub(super) async fn form(self: Arc<Self>, raft: MetaRaftHandle, data: DataRaftHandle) {
        let (mut said, mut attempts) = (false, 0u32);
        loop {
            if raft.is_initialized().await.unwrap_or(true) {
                return;
            }
            // Every configured member's id, from each member itself: all members of a new
            // cluster propose the same membership only once each knows them all.
            let mut members = BTreeMap::from([(self.id, PeerNode { name: self.name.clone(), addr: String::new() })]);
            let (mut all, mut formed_at) = (true, None);
            for p in &self.cfg.peers {
                let mut client = PeerClient::new(&self.name, &p.name, &p.addr, self.auth.clone());
                match client.call(&PeerRequest::Hello, HELLO_TTL).await {
                    Ok(PeerResponse::Hello { initialized: true, .. }) => formed_at = Some(p.clone()),
                    Ok(PeerResponse::Hello { initialized: false, id }) => {
                        members.insert(id, PeerNode { name: p.name.clone(), addr: String::new() });
                    }
                    _ => all = false,
                }
            }
            if raft.is_initialized().await.unwrap_or(true) {
                return;
            }
            if let Some(peer) = formed_at {
                info!(via = %peer.name, "cluster: the metadata group exists; asking its leader to add this member");
                match self.join_through(peer).await {
                    Ok(()) => {
                        info!("cluster: joined the metadata group");
                        return;
                    }
                    Err(e) => {
                        // While a new group elects its first leader this is expected: said at
                        // info, then at warn if it goes on.
                        attempts += 1;
                        match attempts {
                            1..10 => info!(error = %e, "cluster: not joined yet; trying again"),
                            _ => warn!(error = %e, attempts, "cluster: joining the metadata group keeps failing"),
                        }
                    }
                }
            } else if all {
                let count = members.len();
                // The data group first, with the same members: a member that stops in
                // between forms it again (a no-op) before the metadata group.
                if let Err(e) = data.initialize(members.clone()).await {
                    info!(reason = %e, "cluster: data group already formed");
                }
                match raft.initialize(members).await {
                    Ok(()) => info!(members = count, "cluster: metadata group formed from cluster.peers"),
                    Err(e) => info!(reason = %e, "cluster: metadata group already formed"),
                }
                return;
            } else if !said {
                said = true;
                info!(
                    members = self.cfg.peers.len() + 1,
                    "cluster: waiting for every member of cluster.peers to be up to form a new cluster"
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Asks the leader, through `peer` (a member of the group), to add this member; the
    /// member asked names the leader when it is not the leader itself.
    async fn join_through(&self, peer: PeerEntry) -> Result<(), String> {
        let join = PeerRequest::ChangeMembers(MembershipChange::Join {
            name: self.name.clone(),
            addr: self.cfg.listen.to_string(),
            id: self.id,
        });
        let (mut name, mut addr) = (peer.name, peer.addr);
        for _ in 0..3 {
            let mut client = PeerClient::new(&self.name, &name, &addr, self.auth.clone());
            match client.call(&join, JOIN_LIMIT).await {
                Ok(PeerResponse::ClientWrite(Ok(_))) => return Ok(()),
                Ok(PeerResponse::ClientWrite(Err(ForwardedWriteError::NotLeader(Some(leader))))) => {
                    addr = self.addr_of(&leader);
                    name = leader.name;
                }
                Ok(PeerResponse::ClientWrite(Err(e))) => return Err(format!("'{name}' refused: {e}")),
                Ok(other) => return Err(format!("unexpected answer {other:?}")),
                Err(e) => return Err(format!("'{name}' unreachable: {e}")),
            }
        }
        Err("no leader found".into())
    }

    /// Adds member `name` at `addr` (`ctl cluster join`): its id is asked of it first.
    pub async fn add_member(&self, name: &str, addr: &str) -> Result<(), String> {
        let mut client = PeerClient::new(&self.name, name, addr, self.auth.clone());
        let id = match client.call(&PeerRequest::Hello, HELLO_TTL).await {
            Ok(PeerResponse::Hello { id, .. }) => id,
            Ok(other) => return Err(format!("unexpected answer {other:?}")),
            Err(e) => return Err(format!("'{name}' at {addr} unreachable: {e}")),
        };
        let join = MembershipChange::Join { name: name.to_owned(), addr: addr.to_owned(), id };
        self.through_leader(&self.raft, Change::Members(join), JOIN_LIMIT).await.map(drop)
    }

    /// Has the leader make `change` (a join or a forget), waiting up to a minute.
    pub async fn change_members(&self, change: MembershipChange) -> Result<(), String> {
        self.through_leader(&self.raft, Change::Members(change), JOIN_LIMIT).await.map(drop)
    }
}
