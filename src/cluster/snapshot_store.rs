//! A group's latest snapshot as a member keeps it, in the group's state-machine tree: what
//! openraft describes it by and its bytes, made durable before openraft hears of it (the
//! log below it may be purged after).

// openraft's storage traits return its `StorageError` (over 200 bytes) by value.
#![allow(clippy::result_large_err)]

use std::io::Cursor;

use openraft::storage::Snapshot;
use openraft::{AnyError, LogId, SnapshotMeta, StorageError, StorageIOError, StoredMembership};
use serde::{Deserialize, Serialize};

use super::types::{Group, PeerNode};

type Result_<T> = Result<T, StorageError<u64>>;

const SNAPSHOT: &[u8] = b"snapshot";

fn any(e: impl std::fmt::Display) -> AnyError {
    AnyError::error(e.to_string())
}

/// A snapshot as a member keeps its latest: what openraft describes it by, and its bytes.
#[derive(Serialize, Deserialize)]
pub(super) struct StoredSnapshot {
    /// openraft's description.
    pub meta: SnapshotMeta<u64, PeerNode>,
    /// The group's own encoding of its state.
    pub data: Vec<u8>,
}

impl StoredSnapshot {
    /// A snapshot of `data` covering the log up to `last` with `membership`.
    pub(super) fn new(last: Option<LogId<u64>>, membership: StoredMembership<u64, PeerNode>, data: Vec<u8>) -> Self {
        let snapshot_id = match last {
            Some(l) => format!("{}-{}", l.leader_id.term, l.index),
            None => "empty".to_owned(),
        };
        StoredSnapshot { meta: SnapshotMeta { last_log_id: last, last_membership: membership, snapshot_id }, data }
    }

    /// As openraft takes it.
    pub(super) fn snapshot<C: Group>(self) -> Snapshot<C> {
        Snapshot { meta: self.meta, snapshot: Box::new(Cursor::new(self.data)) }
    }
}

/// Keeps `stored` as the latest snapshot in `tree`, with everything the tree holds made
/// durable first (the applied state it covers included).
pub(super) async fn keep(tree: &sled::Tree, stored: &StoredSnapshot) -> Result_<()> {
    let signature = Some(stored.meta.signature());
    let bytes = serde_json::to_vec(stored).map_err(|e| StorageIOError::write_snapshot(signature.clone(), any(e)))?;
    let tree = tree.clone();
    crate::core::blocking::spawn(move || tree.insert(SNAPSHOT, bytes).and_then(|_| tree.flush()).map(drop))
        .await
        .map_err(|e| StorageIOError::write_snapshot(signature.clone(), any(e)))?
        .map_err(|e| StorageIOError::write_snapshot(signature, any(e)).into())
}

/// The latest snapshot kept in `tree`, if any.
pub(super) async fn current<C: Group>(tree: &sled::Tree) -> Result_<Option<Snapshot<C>>> {
    let tree = tree.clone();
    let stored = crate::core::blocking::spawn(move || tree.get(SNAPSHOT))
        .await
        .map_err(|e| StorageIOError::read_snapshot(None, any(e)))?
        .map_err(|e| StorageIOError::read_snapshot(None, any(e)))?;
    match stored {
        None => Ok(None),
        Some(bytes) => {
            let stored: StoredSnapshot =
                serde_json::from_slice(&bytes).map_err(|e| StorageIOError::read_snapshot(None, any(e)))?;
            Ok(Some(stored.snapshot()))
        }
    }
}
