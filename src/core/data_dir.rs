//! The data directory's journal, opened, started on and closed by the core: the
//! composition root hands it the configuration's plain data and never names a storage
//! type (the one door into storage is the core).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrymq_storage::{FsyncPolicy, Journal, JournalConfig, JournalError, JournalStats, Retention};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::broker::Broker;
use super::queue::{DeadLetter, QueueConfig};
use super::restore::{self, RestoreError, Stored};
use super::shards::Shards;
use super::store::{QueueCatalog, StateMachine, Stores};
use crate::composition::config::{Fsync, StorageSection};

/// Why the data directory could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    /// A stored record (an index entry, a commit-log record below the end a clean stop
    /// recorded) cannot be read: the start stops, nothing changed.
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// The journal could not be opened (I/O, a lock, a layout of another version).
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// An open data directory: the journal in it.
#[derive(Clone)]
pub(crate) struct DataDir {
    journal: Journal,
    path: PathBuf,
}

impl DataDir {
    /// Opens (recovering) the journal in `path` with the `[storage]` settings; the journal
    /// refuses appends at half of `disk_free_limit` (the effective disk alarm limit) and
    /// retention frees space below it.
    pub(crate) async fn open(
        path: &Path,
        storage: &StorageSection,
        disk_free_limit: u64,
    ) -> Result<DataDir, OpenError> {
        let config = journal_config(path, storage, disk_free_limit);
        let opened = super::blocking::spawn(move || Journal::open(config))
            .await
            .unwrap_or_else(|e| Err(JournalError::Io(e.to_string())));
        match opened {
            Ok(journal) => Ok(DataDir { journal, path: path.to_path_buf() }),
            Err(JournalError::Malformed { tree, key }) => Err(RestoreError::malformed_index(tree, &key).into()),
            Err(JournalError::Corrupt(pos)) => Err(RestoreError::damaged_log(pos).into()),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads back everything start-up restores ([`restore::load`]); writes nothing.
    pub(crate) async fn load(&self) -> Result<Stored, RestoreError> {
        restore::load(&self.journal).await
    }

    /// Starts `shards` queue-owner threads (`default`: the settings of queues nobody
    /// configured; `dead`: where dead letters go) and the broker on them; MQTT goes through
    /// the topic exchange `mqtt_exchange` of `/`. Its commands are applied by `state`
    /// (a cluster member's replicated state machine), else by the journal's.
    pub(crate) async fn start_broker(
        &self,
        shards: usize,
        default: QueueConfig,
        dead: mpsc::UnboundedSender<DeadLetter>,
        mqtt_exchange: &str,
        state: Option<Arc<dyn StateMachine>>,
    ) -> Result<Broker, JournalError> {
        super::retry::mark_watermarks_complete(&self.journal).await?;
        let shards = Shards::start(shards, self.journal.clone(), default, dead);
        let mut broker = Broker::new(self.journal.clone(), shards, mqtt_exchange);
        if let Some(state) = state {
            broker.stores.state = state;
        }
        Ok(broker)
    }

    /// The journal's own state machine and catalog (what a cluster member's replicated
    /// state machine applies committed commands to).
    pub(crate) fn local_store(&self) -> (Arc<dyn StateMachine>, Arc<dyn QueueCatalog>) {
        let stores = Stores::local(&self.journal);
        (stores.state, stores.catalog)
    }

    /// Flushes and closes the journal, checkpointed as at a shutdown (the next start
    /// replays nothing); what it did over its life.
    pub(crate) async fn close(&self) -> JournalStats {
        if let Err(e) = self.journal.flush().await {
            warn!(error = %e, "final journal flush failed");
        }
        let journal = self.journal.clone();
        match super::blocking::spawn(move || journal.close()).await {
            Ok(Err(e)) => warn!(error = %e, "closing the journal failed"),
            Ok(Ok(())) => info!(dir = %self.path.display(), "the data directory was closed cleanly"),
            Err(_) => {}
        }
        self.journal.stats()
    }
}

impl std::fmt::Debug for DataDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataDir").field("path", &self.path).finish_non_exhaustive()
    }
}

/// The journal settings of the `[storage]` section for `path`.
fn journal_config(path: &Path, storage: &StorageSection, disk_free_limit: u64) -> JournalConfig {
    let mut j = JournalConfig::new(path.to_path_buf());
    j.fsync = match storage.fsync {
        Fsync::Always => FsyncPolicy::Always,
        Fsync::Interval => FsyncPolicy::Interval(storage.interval),
        Fsync::Never => FsyncPolicy::Never,
    };
    j.segment_size = storage.segment_size;
    j.checkpoint_interval = storage.checkpoint_interval;
    j.checkpoint_bytes = storage.checkpoint_bytes;
    j.page_aligned_syncs = storage.page_aligned_syncs;
    j.cache_bytes = storage.cache_bytes;
    j.ballast_bytes = storage.ballast_bytes;
    // The disk alarm blocks publishers at the limit; should they outrun it, the journal
    // refuses appends at half of it, before a write could fail. Below the limit, retention
    // deletes what nothing refers to any more, whatever its age (rolling the active
    // segment over if need be), so that a drained broker comes back.
    j.min_free_bytes = disk_free_limit / 2;
    j.retention = Retention {
        max_age: storage.retention_max_age,
        max_bytes: (storage.retention_max_bytes > 0).then_some(storage.retention_max_bytes),
        max_disk_used_ratio: (storage.retention_max_disk_used_ratio > 0.0)
            .then_some(storage.retention_max_disk_used_ratio),
        min_disk_free_bytes: (disk_free_limit > 0).then_some(disk_free_limit),
    };
    j
}
