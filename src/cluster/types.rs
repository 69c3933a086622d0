//! The Raft groups' types: the type configurations for openraft of the metadata group and
//! of a data group (and what both have in common, [`Group`]), a member as the logs record
//! it ([`PeerNode`]), and the entry payloads ([`MetaEntry`], [`DataEntry`]).

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use super::metadata::MetaCommand;

openraft::declare_raft_types!(
    /// The metadata group's types.
    pub(super) MetaRaft:
        D = MetaEntry,
        R = (),
        NodeId = u64,
        Node = PeerNode,
        Entry = openraft::Entry<MetaRaft>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The openraft handle of the metadata group.
pub(super) type MetaRaftHandle = openraft::Raft<MetaRaft>;

openraft::declare_raft_types!(
    /// A data group's types.
    pub(super) DataRaft:
        D = DataEntry,
        R = (),
        NodeId = u64,
        Node = PeerNode,
        Entry = openraft::Entry<DataRaft>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The openraft handle of a data group.
pub(super) type DataRaftHandle = openraft::Raft<DataRaft>;

/// What every group of the cluster has in common: node ids, members, entries, snapshots and
/// runtime; and how its RPCs travel on the peer link.
pub(super) trait Group:
    openraft::RaftTypeConfig<
    NodeId = u64,
    Node = PeerNode,
    Entry = openraft::Entry<Self>,
    SnapshotData = Cursor<Vec<u8>>,
    AsyncRuntime = openraft::TokioRuntime,
>
{
    /// The peer-link request of openraft's log replication and heartbeat.
    fn append_entries(rpc: openraft::raft::AppendEntriesRequest<Self>) -> super::rpc::PeerRequest;
    /// The peer-link request of openraft's election.
    fn vote(rpc: openraft::raft::VoteRequest<u64>) -> super::rpc::PeerRequest;
    /// The peer-link request of a snapshot's chunk.
    fn install_snapshot(rpc: openraft::raft::InstallSnapshotRequest<Self>) -> super::rpc::PeerRequest;
}

impl Group for MetaRaft {
    fn append_entries(rpc: openraft::raft::AppendEntriesRequest<Self>) -> super::rpc::PeerRequest {
        super::rpc::PeerRequest::AppendEntries(rpc)
    }
    fn vote(rpc: openraft::raft::VoteRequest<u64>) -> super::rpc::PeerRequest {
        super::rpc::PeerRequest::Vote(rpc)
    }
    fn install_snapshot(rpc: openraft::raft::InstallSnapshotRequest<Self>) -> super::rpc::PeerRequest {
        super::rpc::PeerRequest::InstallSnapshot(rpc)
    }
}

impl Group for DataRaft {
    fn append_entries(rpc: openraft::raft::AppendEntriesRequest<Self>) -> super::rpc::PeerRequest {
        super::rpc::PeerRequest::Data(super::rpc::DataRpc::AppendEntries(rpc))
    }
    fn vote(rpc: openraft::raft::VoteRequest<u64>) -> super::rpc::PeerRequest {
        super::rpc::PeerRequest::Data(super::rpc::DataRpc::Vote(rpc))
    }
    fn install_snapshot(rpc: openraft::raft::InstallSnapshotRequest<Self>) -> super::rpc::PeerRequest {
        super::rpc::PeerRequest::Data(super::rpc::DataRpc::InstallSnapshot(rpc))
    }
}

/// A member of the cluster as its membership records it: its node name and the peer
/// address (`host:port`) others reach it at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerNode {
    /// `cluster.node_name`.
    pub name: String,
    /// `host:port` of its `cluster.listen`, as `cluster.peers` names it.
    pub addr: String,
}

/// The payload of one metadata entry: a batch of commands, applied together and in order
/// on every member.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct MetaEntry {
    /// The batch.
    pub commands: Vec<MetaCommand>,
}

/// The payload of one data entry: a batch of operations on the group's messages, applied
/// together and in order on every member.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct DataEntry {
    /// The batch.
    pub changes: Vec<DataChange>,
    /// The process that proposed it: its member's name and a random number of the
    /// process's own ("" for a probe).
    #[serde(default)]
    pub from: String,
    /// Its number among that process's entries (from 1, growing): an entry proposed again
    /// after its answer was lost, and committed twice, is applied once.
    #[serde(default)]
    pub seq: u64,
}

/// One operation of a data entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) enum DataChange {
    /// Nothing: the entry a test or an operator's probe commits to see the group answer.
    Probe,
    /// `message` is appended to the streams `queues` of `vhost`, on every member.
    Append {
        /// The metadata group's last entry applied on the proposing member when it proposed
        /// this: the streams were declared at or before it, so a member applies this only
        /// once its metadata is that far (and finds the same streams as every member).
        meta_index: u64,
        /// The virtual host.
        vhost: String,
        /// The streams, by name.
        queues: Vec<String>,
        /// The message.
        message: super::metadata::RetainedMessage,
    },
}
