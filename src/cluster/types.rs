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

/// The Raft node id of the member named `name`: the stable hash of the name (node names
/// are unique and stable, so ids are too; 0 is never used).
pub(super) fn node_id(name: &str) -> u64 {
    crate::core::stable_hash::hash64(&[b"ferrymq-node:", name.as_bytes()]).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_stable_and_distinct() {
        assert_eq!(node_id("a"), node_id("a"));
        assert_ne!(node_id("rabbit@a"), node_id("rabbit@b"));
        assert_ne!(node_id(""), 0);
    }
}
