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
//! group of its own with members it cannot reach.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::rpc::{ForwardedWriteError, PeerClient, PeerRequest, PeerResponse};
use super::types::{node_id, MetaEntry, MetaRaftHandle, PeerNode};
use super::Cluster;
use crate::composition::config::PeerEntry;

/// How long a peer has to answer whether the group exists.
const HELLO_TTL: Duration = Duration::from_secs(1);

/// How long a member's joining may take (it is sent the whole log first).
const JOIN_LIMIT: Duration = Duration::from_secs(60);

/// A change of membership, as a member asks the leader for it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Member `name`, reached at `addr`, joins (a learner first, then a voter).
    Join {
        /// Its node name.
        name: String,
        /// Its peer address.
        addr: String,
    },
    /// Member `name` is no longer one (dead, leaving, or replaced).
    Forget {
        /// Its node name.
        name: String,
    },
}

/// What the leader is asked to commit.
#[derive(Debug, Clone)]
pub(super) enum Change {
    /// Metadata commands.
    Write(MetaEntry),
    /// A change of membership.
    Members(MembershipChange),
}

type ClientWrite = Result<openraft::LogId<u64>, RaftError<u64, ClientWriteError<u64, PeerNode>>>;

impl Change {
    /// Makes the change on this member (which must lead the group); the log id of its
    /// last entry.
    pub(super) async fn make(&self, raft: &MetaRaftHandle) -> ClientWrite {
        match self {
            Change::Write(entry) => raft.client_write(entry.clone()).await.map(|r| r.log_id),
            Change::Members(MembershipChange::Join { name, addr }) => {
                let id = node_id(name);
                let added = raft.add_learner(id, PeerNode { name: name.clone(), addr: addr.clone() }, true).await?;
                if raft.metrics().borrow().membership_config.membership().voter_ids().any(|v| v == id) {
                    // A member that came back on an empty data directory: a voter already,
                    // now sent the log again.
                    return Ok(added.log_id);
                }
                Ok(raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await?.log_id)
            }
            Change::Members(MembershipChange::Forget { name }) => {
                let id = node_id(name);
                Ok(raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await?.log_id)
            }
        }
    }

    /// The request that asks a leader over the peer link.
    pub(super) fn request(&self) -> PeerRequest {
        match self {
            Change::Write(entry) => PeerRequest::ClientWrite(entry.clone()),
            Change::Members(change) => PeerRequest::ChangeMembers(change.clone()),
        }
    }
}

impl Cluster {
    /// Forms the group or joins it (see the module's documentation); returns once this
    /// member's log is no longer empty.
    pub(super) async fn form(self: Arc<Self>, raft: MetaRaftHandle) {
        let (mut said, mut attempts) = (false, 0u32);
        loop {
            if raft.is_initialized().await.unwrap_or(true) {
                return;
            }
            let (mut reachable, mut formed_at) = (1, None);
            for p in &self.cfg.peers {
                let mut client = PeerClient::new(&self.name, &p.addr, self.secret.clone());
                match client.call(&PeerRequest::Hello, HELLO_TTL).await {
                    Ok(PeerResponse::Hello { initialized: true }) => formed_at = Some(p.clone()),
                    Ok(PeerResponse::Hello { initialized: false }) => reachable += 1,
                    _ => {}
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
            } else if reachable * 2 > self.cfg.peers.len() + 1 {
                let id = node_id(&self.name);
                let mut members = BTreeMap::new();
                members.insert(id, PeerNode { name: self.name.clone(), addr: String::new() });
                for p in &self.cfg.peers {
                    members.insert(node_id(&p.name), PeerNode { name: p.name.clone(), addr: String::new() });
                }
                match raft.initialize(members).await {
                    Ok(()) => {
                        info!(members = self.cfg.peers.len() + 1, "cluster: metadata group formed from cluster.peers")
                    }
                    Err(e) => info!(reason = %e, "cluster: metadata group already formed"),
                }
                return;
            } else if !said {
                said = true;
                info!(
                    reachable,
                    members = self.cfg.peers.len() + 1,
                    "cluster: waiting for a majority of cluster.peers to form the metadata group"
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
        });
        let (mut name, mut addr) = (peer.name, peer.addr);
        for _ in 0..3 {
            let mut client = PeerClient::new(&self.name, &addr, self.secret.clone());
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

    /// Has the leader make `change` (a join or a forget), waiting up to a minute.
    pub async fn change_members(&self, change: MembershipChange) -> Result<(), String> {
        self.through_leader(Change::Members(change), JOIN_LIMIT).await
    }
}
