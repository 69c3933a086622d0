//! openraft's network for the cluster's groups: each replication stream and each vote
//! request goes over a [`PeerClient`] of its own to the target member, whose address is the
//! one `cluster.peers` gives for its name (else the one its membership entry records).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::AnyError;

use super::health::PeerHealth;
use super::link::PeerAuth;
use super::rpc::{PeerClient, PeerRequest, PeerResponse};
use super::types::{Group, PeerNode};

type Rpc<T, E = openraft::error::Infallible> = Result<T, RPCError<u64, PeerNode, RaftError<u64, E>>>;

/// Makes a client per target member.
#[derive(Debug, Clone)]
pub(super) struct Network {
    /// This member's name.
    pub me: String,
    /// Peer addresses by name, from `cluster.peers`.
    pub addrs: Arc<HashMap<String, String>>,
    /// `cluster.secret`.
    pub auth: Arc<PeerAuth>,
    /// When each member last answered.
    pub health: Arc<PeerHealth>,
}

impl Network {
    /// Where the member `node` is reached.
    pub(super) fn addr_of(&self, node: &PeerNode) -> String {
        self.addrs.get(&node.name).cloned().unwrap_or_else(|| node.addr.clone())
    }
}

/// A client of one member, for group `C`.
#[derive(Debug)]
pub(super) struct Connection<C> {
    name: String,
    /// Its Raft node id.
    target: u64,
    client: PeerClient,
    health: Arc<PeerHealth>,
    group: PhantomData<fn() -> C>,
}

impl<C: Group> RaftNetworkFactory<C> for Network {
    type Network = Connection<C>;

    async fn new_client(&mut self, target: u64, node: &PeerNode) -> Connection<C> {
        Connection {
            name: node.name.clone(),
            target,
            client: PeerClient::new(&self.me, &node.name, &self.addr_of(node), self.auth.clone()),
            health: self.health.clone(),
            group: PhantomData,
        }
    }
}

fn unreachable<E: std::error::Error>(e: impl std::fmt::Display) -> RPCError<u64, PeerNode, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error(e.to_string())))
}

impl<C> Connection<C> {
    async fn call(&mut self, request: PeerRequest, option: &RPCOption) -> Result<PeerResponse, String> {
        match self.client.call(&request, option.hard_ttl()).await {
            Ok(response) => {
                self.health.answered(&self.name);
                Ok(response)
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

impl<C: Group> RaftNetwork<C> for Connection<C> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Rpc<AppendEntriesResponse<u64>> {
        match self.call(C::append_entries(rpc), &option).await.map_err(unreachable)? {
            PeerResponse::AppendEntries(r) => {
                r.map_err(|e| RPCError::Network(NetworkError::new(&AnyError::error(e.to_string()))))
            }
            other => Err(unreachable(format!("unexpected answer {other:?}"))),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<C>,
        option: RPCOption,
    ) -> Rpc<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        match self.call(C::install_snapshot(rpc), &option).await.map_err(unreachable)? {
            // The receiver's refusal (a chunk out of order) as its own, so that the leader
            // starts the snapshot again.
            PeerResponse::InstallSnapshot(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            other => Err(unreachable(format!("unexpected answer {other:?}"))),
        }
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, option: RPCOption) -> Rpc<VoteResponse<u64>> {
        match self.call(C::vote(rpc), &option).await.map_err(unreachable)? {
            PeerResponse::Vote(r) => {
                r.map_err(|e| RPCError::Network(NetworkError::new(&AnyError::error(e.to_string()))))
            }
            other => Err(unreachable(format!("unexpected answer {other:?}"))),
        }
    }
}
