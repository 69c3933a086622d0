//! The failure policy: which failures refuse one submission, which take a batch back
//! for lack of space (the journal goes on once space returns), which stop writes until
//! sled is opened again, and which poison the journal; the free-space floor and the
//! ballast.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Writer;
use crate::recovery;
use crate::JournalError;

/// How long a look at the file system's free space serves appends.
pub(super) const FREE_SPACE_RECHECK: Duration = Duration::from_millis(100);
/// How often opening sled again is tried while it is out of space.
pub(super) const REOPEN_INTERVAL: Duration = Duration::from_millis(250);
/// Free space wanted before sled is opened again (at least; also the journal's floor and
/// the ballast's size).
const REOPEN_MIN_FREE: u64 = 4 << 20;

/// Why a submission could not be applied.
pub(super) enum Fail {
    /// This submission only is refused (nothing of it was applied).
    Reject(JournalError),
    /// The commit log could not be written for lack of space: the whole batch is taken
    /// back and refused, and the journal goes on.
    NoSpace(String),
    /// sled ran out of space: the batch is refused, and so is everything until sled is
    /// opened again once space returns ([`Writer::reopen_store`]).
    StoreFull(String),
    /// I/O or sled failure: the journal poisons itself.
    Fatal(String),
}

impl Fail {
    /// What went wrong, for logs and errors.
    pub(super) fn reason(&self) -> &str {
        match self {
            Fail::Reject(_) => "refused",
            Fail::NoSpace(r) | Fail::StoreFull(r) | Fail::Fatal(r) => r,
        }
    }
}

/// A failed commit-log write: out of space is cured by freeing space, anything else poisons.
pub(super) fn log_write_failed(e: std::io::Error) -> Fail {
    if crate::log::is_out_of_space(&e) {
        Fail::NoSpace(format!("commit log write: {e}"))
    } else {
        Fail::Fatal(format!("commit log write: {e}"))
    }
}

/// A failed consume-queue write: out of space is handled as sled's (writes stop until
/// space returns, then the store is opened again and rebuilt from the log, the files
/// included); anything else poisons.
pub(super) fn cq_write_failed(e: std::io::Error) -> Fail {
    if crate::log::is_out_of_space(&e) {
        Fail::StoreFull(format!("consume queue write: {e}"))
    } else {
        Fail::Fatal(format!("consume queue write: {e}"))
    }
}

pub(super) fn sled_fatal(e: sled::Error) -> Fail {
    sled_failed("sled", e)
}

/// A sled failure: out of space is cured by opening sled again once space returns (it
/// keeps its first I/O error until then); anything else poisons.
pub(super) fn sled_failed(what: &str, e: sled::Error) -> Fail {
    match &e {
        sled::Error::Io(io) if crate::log::is_out_of_space(io) => Fail::StoreFull(format!("{what}: {e}")),
        _ => Fail::Fatal(format!("{what}: {e}")),
    }
}

impl Writer {
    pub(super) fn poison(&mut self, reason: String) {
        if self.poisoned.is_none() {
            tracing::error!(%reason, "journal poisoned: refusing every further write");
            self.poisoned = Some(reason);
            self.shared.poisoned.store(true, Ordering::Relaxed);
        }
        self.pending.clear();
    }

    /// Handles a failure that is not this submission's alone: sled out of space stops
    /// writes until it is opened again; anything else poisons.
    pub(super) fn fail(&mut self, f: Fail) {
        match f {
            Fail::StoreFull(reason) => {
                self.pending.clear();
                if self.store_full.is_none() {
                    tracing::warn!(
                        %reason,
                        "sled ran out of space: every write is refused until space returns and it is opened again"
                    );
                    self.shared.out_of_space.fetch_add(1, Ordering::Relaxed);
                    self.store_full = Some(reason);
                    self.last_reopen = Instant::now();
                }
                self.release_ballast();
            }
            Fail::Reject(e) => self.poison(e.to_string()),
            Fail::NoSpace(reason) | Fail::Fatal(reason) => self.poison(reason),
        }
    }

    /// Every [`REOPEN_INTERVAL`] while sled is out of space: opens it again once the file
    /// system has room.
    pub(super) fn maybe_reopen_store(&mut self) {
        if self.store_full.is_none() || self.poisoned.is_some() || self.last_reopen.elapsed() < REOPEN_INTERVAL {
            return;
        }
        self.last_reopen = Instant::now();
        let config = &self.shared.config;
        let room = config.min_free_bytes.max(config.ballast_bytes).max(REOPEN_MIN_FREE);
        if fs4::available_space(&config.dir).is_ok_and(|free| free >= room) {
            self.reopen_store();
        }
    }

    /// Opens sled again (it keeps its first I/O error until then): drops the failed
    /// handle once the readers holding it let go (they wait on the lock meanwhile), opens
    /// the database as it is on disk and brings it up to the end of the log as recovery
    /// does after a crash (the effects records since the checkpoint). Queue offsets never
    /// go back. Writes go on afterwards.
    fn reopen_store(&mut self) {
        let shared = self.shared.clone();
        let mut slot = shared.db.write();
        if let Some(mut old) = slot.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => break drop(db),
                    Err(still) if Instant::now() < deadline => {
                        old = still;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(still) => {
                        tracing::warn!("sled: a reader keeps the failed handle; opening it again later");
                        *slot = Some(still);
                        return;
                    }
                }
            }
        }
        // Readers wait while the consume queues' offsets are rebuilt.
        let rebuilding = shared.cq.rebuilding();
        let opened = crate::db::Db::open(&shared.config.dir.join("db"), shared.config.cache_bytes)
            .and_then(|db| recovery::recover_state(&db, &shared.log, &shared.cq).map(|(index, _)| (db, index)));
        let (db, index) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                // (The consume queues' offsets may be half rebuilt until the next try;
                // every write is refused meanwhile.)
                tracing::warn!(error = %e, "sled could not be opened again yet; trying again");
                return;
            }
        };
        *slot = Some(Arc::new(db));
        drop(slot);
        self.refs = index.refs;
        {
            let mut queues = shared.queues.lock();
            let mut merged = index.queues;
            for (q, st) in queues.iter() {
                let e = merged.entry(*q).or_default();
                e.next = e.next.max(st.next);
            }
            *queues = merged;
        }
        self.live.clear();
        self.pending.clear();
        // The replay put them into sled and the consume queues.
        shared.cq.forget_pending();
        self.read_cache.clear();
        self.counters.clear();
        for overlay in shared.kv_deferred.write().iter_mut() {
            overlay.clear();
        }
        drop(rebuilding);
        let end = shared.log.end();
        shared.applied.store(end, Ordering::Release);
        shared.checkpointed.store(end, Ordering::Release);
        self.free_space = None;
        self.store_full = None;
        // A name allocated in a batch that was taken back may be missing from the new sled.
        shared.names.write().clear();
        tracing::info!("sled is open again after running out of space: writes go on");
    }

    /// Takes back a batch whose commit-log write ran out of space (before anything of it
    /// reached sled): its records, the segments it began, its reference counts and its
    /// pending changes. The ballast is given up so that sled has room for what earlier
    /// batches left it to write; the journal goes on, and appends succeed again once
    /// space returns.
    pub(super) fn take_back(&mut self, mark: crate::log::LogMark, reason: &str) {
        self.pending.clear();
        self.refs.undo_batch();
        self.free_space = None;
        if let Err(e) = self.log.rollback(&self.shared.log, mark) {
            self.poison(format!("{reason}; then taking the batch back failed: {e}"));
            return;
        }
        self.shared.out_of_space.fetch_add(1, Ordering::Relaxed);
        if !self.out_of_space {
            tracing::warn!(%reason, "the data file system is full: publishes are refused until space returns");
            self.out_of_space = true;
        }
        self.release_ballast();
    }

    /// Gives the ballast up (sled and the commit log may use its space).
    fn release_ballast(&mut self) {
        if !self.ballast {
            return;
        }
        match std::fs::remove_file(crate::ballast::path(&self.shared.config.dir)) {
            Ok(()) => tracing::warn!(
                bytes = self.shared.config.ballast_bytes,
                "the data file system is almost full: released the ballast"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "the data file system is almost full and the ballast cannot be deleted")
            }
        }
        self.ballast = false;
    }

    /// Every [`FREE_SPACE_RECHECK`]: gives the ballast up once the file system has less
    /// free space than half the ballast's size (appends stopped at the floor before; this
    /// is someone else filling it), before sled (whose first failed write stops it until it
    /// is opened again) runs out. Half, so that the space it gives back does not lift the
    /// file system over the disk alarm's limit again at once.
    pub(super) fn watch_free_space(&mut self) {
        if !self.ballast || self.last_space_watch.elapsed() < FREE_SPACE_RECHECK {
            return;
        }
        self.last_space_watch = Instant::now();
        let size = self.shared.config.ballast_bytes;
        if fs4::available_space(&self.shared.config.dir).is_ok_and(|free| free < size / 2) {
            self.release_ballast();
        }
    }

    /// Refuses a submission appending `bytes` while the file system has less free space
    /// than `min_free_bytes` (looked at every [`FREE_SPACE_RECHECK`], and counted down by
    /// what is appended in between).
    pub(super) fn check_free_space(&mut self, bytes: u64) -> Result<(), Fail> {
        let floor = self.shared.config.min_free_bytes;
        if floor == 0 {
            return Ok(());
        }
        // A stale look is replaced with a new one timed now (keeping its old time would
        // look again on every submission).
        let (free, at) = match self.free_space {
            Some((free, at)) if at.elapsed() < FREE_SPACE_RECHECK => (free, at),
            _ => (fs4::available_space(&self.shared.config.dir).unwrap_or(u64::MAX), Instant::now()),
        };
        if free < floor.saturating_add(bytes) {
            self.free_space = None;
            return Err(Fail::Reject(JournalError::NoSpace(floor)));
        }
        self.free_space = Some((free - bytes, at));
        Ok(())
    }
}
