//! A Raft group's log and vote, in the cluster's sled database (`{data_dir}/cluster/raft`),
//! in trees of the group's own (the metadata group's `log` and `meta`, a data group's
//! prefixed with its name): entries keyed by index, the vote, the committed and the last
//! purged log ids. Every append and every vote is flushed to disk (sled's fsync) before
//! openraft hears of it: a vote or an acknowledged entry is never lost with a crash,
//! whatever openraft's FAQ allows for speed. The calls into sled run on the blocking pool,
//! never on a runtime worker.

// openraft's storage traits return its `StorageError` (over 200 bytes) by value.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::path::Path;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, LogId, LogState, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::types::{Group, MetaRaft};

type Result_<T> = Result<T, StorageError<u64>>;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"last_purged";
const NODE_ID: &[u8] = b"node_id";

/// The log store of group `C` (cheap to clone: sled handles are shared).
#[derive(Debug)]
pub(super) struct LogStore<C = MetaRaft> {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    group: PhantomData<fn() -> C>,
}

impl<C> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore { db: self.db.clone(), log: self.log.clone(), meta: self.meta.clone(), group: PhantomData }
    }
}

fn any(e: impl std::fmt::Display) -> AnyError {
    AnyError::error(e.to_string())
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, AnyError> {
    serde_json::to_vec(v).map_err(any)
}

fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, AnyError> {
    serde_json::from_slice(b).map_err(any)
}

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result_<T> + Send + 'static) -> Result_<T> {
    crate::core::blocking::spawn(f).await.map_err(|e| StorageIOError::write_logs(any(e)))?
}

impl LogStore<MetaRaft> {
    /// Opens (or makes) the metadata group's log store in `dir`. Blocking: at start-up,
    /// before the runtime serves clients.
    pub(super) fn open(dir: &Path) -> Result<LogStore<MetaRaft>, sled::Error> {
        let db = sled::Config::new().path(dir).mode(sled::Mode::LowSpace).open()?;
        let log = db.open_tree("log")?;
        let meta = db.open_tree("meta")?;
        Ok(LogStore { db, log, meta, group: PhantomData })
    }

    /// This data directory's Raft node id: random, made on the first start and kept. A
    /// member started again on an empty data directory is a new node to the group (its old
    /// id is removed when it joins): a member that lost its log never votes under the id
    /// that voted before. Blocking (start-up).
    pub(super) fn node_id(&self) -> Result<u64, String> {
        if let Some(v) = self.meta.get(NODE_ID).map_err(|e| e.to_string())? {
            let bytes: [u8; 8] = v.as_ref().try_into().map_err(|_| "node id undecodable".to_owned())?;
            return Ok(u64::from_be_bytes(bytes));
        }
        let mut bytes = [0u8; 8];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .map_err(|_| "no randomness for a node id".to_owned())?;
        let id = u64::from_be_bytes(bytes).max(1);
        self.meta.insert(NODE_ID, &id.to_be_bytes()).map_err(|e| e.to_string())?;
        self.db.flush().map_err(|e| e.to_string())?;
        Ok(id)
    }

    /// The log store of data group `name`, in this store's database. Blocking (start-up).
    pub(super) fn of_group<C>(&self, name: &str) -> Result<LogStore<C>, sled::Error> {
        let log = self.db.open_tree(format!("{name}/log"))?;
        let meta = self.db.open_tree(format!("{name}/meta"))?;
        Ok(LogStore { db: self.db.clone(), log, meta, group: PhantomData })
    }
}

impl<C: Group> LogStore<C> {
    /// The database (the state machine keeps its applied state in a tree of its own).
    pub(super) fn db(&self) -> &sled::Db {
        &self.db
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result_<Option<T>> {
        match self.meta.get(key).map_err(|e| StorageIOError::read(any(e)))? {
            Some(v) => Ok(Some(decode(&v).map_err(StorageIOError::read)?)),
            None => Ok(None),
        }
    }

    fn last_entry(&self) -> Result_<Option<openraft::Entry<C>>> {
        match self.log.last().map_err(|e| StorageIOError::read_logs(any(e)))? {
            Some((_, v)) => Ok(Some(decode(&v).map_err(StorageIOError::read_logs)?)),
            None => Ok(None),
        }
    }
}

/// Removes the entries whose keys are in `range`, in one batch.
fn remove_entries(log: &sled::Tree, range: impl RangeBounds<[u8; 8]>) -> Result_<()> {
    let keys: Vec<_> =
        log.range(range).keys().collect::<Result<_, _>>().map_err(|e| StorageIOError::write_logs(any(e)))?;
    let mut batch = sled::Batch::default();
    for k in keys {
        batch.remove(k);
    }
    log.apply_batch(batch).map_err(|e| StorageIOError::write_logs(any(e)).into())
}

impl<C: Group> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result_<Vec<openraft::Entry<C>>> {
        let start = match range.start_bound() {
            Bound::Included(s) => *s,
            Bound::Excluded(s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(e) => Some(e.saturating_add(1)),
            Bound::Excluded(e) => Some(*e),
            Bound::Unbounded => None,
        };
        let log = self.log.clone();
        blocking(move || {
            let iter = match end {
                Some(end) if end <= start => return Ok(Vec::new()),
                Some(end) => log.range(start.to_be_bytes()..end.to_be_bytes()),
                None => log.range(start.to_be_bytes()..),
            };
            iter.map(|kv| {
                let (_, v) = kv.map_err(|e| StorageIOError::read_logs(any(e)))?;
                Ok(decode(&v).map_err(StorageIOError::read_logs)?)
            })
            .collect()
        })
        .await
    }
}

impl<C: Group> RaftLogStorage<C> for LogStore<C> {
    type LogReader = LogStore<C>;

    async fn get_log_state(&mut self) -> Result_<LogState<C>> {
        let this = self.clone();
        blocking(move || {
            let last_purged_log_id: Option<LogId<u64>> = this.read_meta(PURGED)?;
            let last_log_id = this.last_entry()?.map(|e| e.log_id).or(last_purged_log_id);
            Ok(LogState { last_purged_log_id, last_log_id })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> LogStore<C> {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result_<()> {
        let this = self.clone();
        let bytes = encode(vote).map_err(StorageIOError::write_vote)?;
        blocking(move || {
            this.meta.insert(VOTE, bytes).map_err(|e| StorageIOError::write_vote(any(e)))?;
            this.db.flush().map_err(|e| StorageIOError::write_vote(any(e)))?;
            Ok(())
        })
        .await
    }

    async fn read_vote(&mut self) -> Result_<Option<Vote<u64>>> {
        let this = self.clone();
        blocking(move || this.read_meta(VOTE)).await
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result_<()> {
        let this = self.clone();
        let bytes = encode(&committed).map_err(StorageIOError::write)?;
        // Not flushed: a lost committed id is found again from a majority.
        blocking(move || this.meta.insert(COMMITTED, bytes).map(drop).map_err(|e| StorageIOError::write(any(e)).into()))
            .await
    }

    async fn read_committed(&mut self) -> Result_<Option<LogId<u64>>> {
        let this = self.clone();
        blocking(move || Ok(this.read_meta::<Option<LogId<u64>>>(COMMITTED)?.flatten())).await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<C>) -> Result_<()>
    where
        I: IntoIterator<Item = openraft::Entry<C>> + Send,
        I::IntoIter: Send,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = encode(&entry).map_err(StorageIOError::write_logs)?;
            batch.insert(&entry.log_id.index.to_be_bytes(), bytes);
        }
        let this = self.clone();
        let flushed = blocking(move || {
            this.log.apply_batch(batch).map_err(|e| StorageIOError::write_logs(any(e)))?;
            this.db.flush().map_err(|e| StorageIOError::write_logs(any(e)))?;
            Ok(())
        })
        .await;
        match flushed {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result_<()> {
        let this = self.clone();
        blocking(move || {
            remove_entries(&this.log, log_id.index.to_be_bytes()..)?;
            this.db.flush().map_err(|e| StorageIOError::write_logs(any(e)))?;
            Ok(())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result_<()> {
        let this = self.clone();
        let bytes = encode(&log_id).map_err(StorageIOError::write)?;
        blocking(move || {
            // The purge point first: a crash in between leaves entries below it, never a gap.
            this.meta.insert(PURGED, bytes).map_err(|e| StorageIOError::write(any(e)))?;
            this.db.flush().map_err(|e| StorageIOError::write(any(e)))?;
            remove_entries(&this.log, ..log_id.index.saturating_add(1).to_be_bytes())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    //! openraft's own storage conformance suite (`openraft::testing::Suite`: appends,
    //! truncation, purging, votes, committed ids, membership read back from the log, ...)
    //! run against [`LogStore`], with a state machine of the test's own (the suite's
    //! state-machine cases check that one; the members' state machines need a broker).

    use std::io::Cursor;

    use openraft::storage::{RaftStateMachine, Snapshot};
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StoredMembership};

    use super::*;
    use crate::cluster::types::{DataRaft, PeerNode};

    /// The latest snapshot, shared by a machine and its builders.
    type Kept = std::sync::Arc<parking_lot::Mutex<Option<(SnapshotMeta<u64, PeerNode>, Vec<u8>)>>>;

    /// Applied state and snapshot in memory.
    #[derive(Default, Clone)]
    struct MemoryMachine {
        applied: Option<LogId<u64>>,
        membership: StoredMembership<u64, PeerNode>,
        snapshot: Kept,
    }

    impl RaftSnapshotBuilder<DataRaft> for MemoryMachine {
        async fn build_snapshot(&mut self) -> Result_<Snapshot<DataRaft>> {
            let meta = SnapshotMeta {
                last_log_id: self.applied,
                last_membership: self.membership.clone(),
                snapshot_id: format!("{:?}", self.applied),
            };
            *self.snapshot.lock() = Some((meta.clone(), Vec::new()));
            Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(Vec::new())) })
        }
    }

    impl RaftStateMachine<DataRaft> for MemoryMachine {
        type SnapshotBuilder = MemoryMachine;

        async fn applied_state(&mut self) -> Result_<(Option<LogId<u64>>, StoredMembership<u64, PeerNode>)> {
            Ok((self.applied, self.membership.clone()))
        }

        async fn apply<I>(&mut self, entries: I) -> Result_<Vec<()>>
        where
            I: IntoIterator<Item = openraft::Entry<DataRaft>> + Send,
            I::IntoIter: Send,
        {
            let mut answers = Vec::new();
            for entry in entries {
                if let EntryPayload::Membership(m) = entry.payload {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                }
                self.applied = Some(entry.log_id);
                answers.push(());
            }
            Ok(answers)
        }

        async fn get_snapshot_builder(&mut self) -> MemoryMachine {
            self.clone()
        }

        async fn begin_receiving_snapshot(&mut self) -> Result_<Box<Cursor<Vec<u8>>>> {
            Ok(Box::new(Cursor::new(Vec::new())))
        }

        async fn install_snapshot(
            &mut self,
            meta: &SnapshotMeta<u64, PeerNode>,
            snapshot: Box<Cursor<Vec<u8>>>,
        ) -> Result_<()> {
            self.applied = meta.last_log_id;
            self.membership = meta.last_membership.clone();
            *self.snapshot.lock() = Some((meta.clone(), snapshot.into_inner()));
            Ok(())
        }

        async fn get_current_snapshot(&mut self) -> Result_<Option<Snapshot<DataRaft>>> {
            let kept = self.snapshot.lock().clone();
            Ok(kept.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
        }
    }

    /// A fresh data group's log store in a directory of its own (kept with it).
    struct Fresh;

    impl StoreBuilder<DataRaft, LogStore<DataRaft>, MemoryMachine, tempfile::TempDir> for Fresh {
        async fn build(&self) -> Result_<(tempfile::TempDir, LogStore<DataRaft>, MemoryMachine)> {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let db = LogStore::open(dir.path()).expect("open the Raft database");
            let store = db.of_group("data-0").expect("the data group's trees");
            Ok((dir, store, MemoryMachine::default()))
        }
    }

    #[test]
    fn the_log_store_passes_openraft_s_storage_suite() {
        Suite::test_all(Fresh).expect("openraft's storage suite");
    }
}
