//! The metadata group's Raft types: its type configuration for openraft, a member as the
//! log records it ([`PeerNode`]), node ids derived from node names, and the entry payload
//! ([`MetaEntry`]).

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
