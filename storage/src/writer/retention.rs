//! Retention on the writer thread: at most once a second, the closed segments nothing
//! refers into that the limits select are deleted; short of disk space, the active segment
//! is rolled over so that it can go too. Also rolling over on request
//! ([`Journal::roll_segment`](crate::Journal::roll_segment)).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use super::failure::{log_write_failed, Fail};
use super::Writer;
use crate::retention::{self, Candidate};
use crate::JournalError;

/// How often retention is checked (after batches and when idle).
pub(super) const RETENTION_INTERVAL: Duration = Duration::from_secs(1);
/// Retention short of disk space rolls an unreferenced active segment over once it holds
/// this much, or what is missing if that is less (bounds how often it rolls).
const ROLL_FOR_SPACE_MIN: u64 = 1 << 20;

impl Writer {
    /// Runs retention if limits are set and the last run is at least a second ago.
    pub(super) fn maybe_retention(&mut self) {
        let config = &self.shared.config;
        if !self.ballast && config.ballast_bytes > 0 && self.last_retention.elapsed() >= RETENTION_INTERVAL {
            // Given up at open on a full disk: made again once there is room (twice its size).
            self.ballast = crate::ballast::ensure(&config.dir, config.ballast_bytes, config.ballast_bytes);
            if self.ballast {
                tracing::info!(
                    bytes = config.ballast_bytes,
                    "the data file system has room again: the ballast is back"
                );
            }
        }
        let r = &self.shared.config.retention;
        let limited = r.max_age.is_some()
            || r.max_bytes.is_some()
            || r.max_disk_used_ratio.is_some()
            || r.min_disk_free_bytes.is_some();
        if !limited || self.last_retention.elapsed() < RETENTION_INTERVAL {
            return;
        }
        self.last_retention = Instant::now();
        self.run_retention();
    }

    /// Deletes the closed, unreferenced segments the limits select. If the file system is
    /// still short of space (past the disk-use ratio, or below the free minimum) and nothing
    /// refers into the active segment, which holds what is missing (or at least
    /// [`ROLL_FOR_SPACE_MIN`]), rolls it over so that it can go too: at once if the
    /// checkpoint covers it, else at a later run. A small file system whose whole log fits
    /// in one segment thus comes back once its queues are drained.
    pub(crate) fn run_retention(&mut self) {
        let (need, freed) = self.retention_pass();
        let mut short = need > freed;
        if short && self.roll_for_space(need - freed) {
            let (need, freed) = self.retention_pass();
            short = need > freed;
        }
        // Said when the log holds something worth deleting (a log smaller than a roll is not
        // what fills the disk).
        let (_, log_bytes) = self.shared.log.size();
        let stuck = short && log_bytes >= ROLL_FOR_SPACE_MIN;
        if stuck && !self.stuck_said {
            tracing::warn!(
                need,
                log_bytes,
                "the data file system is short of space (past storage.retention_max_disk_used_ratio or below the disk free limit) and retention cannot free enough yet (the commit-log segments left are still referenced)"
            );
        }
        self.stuck_said = stuck;
        self.short_of_space = short;
    }

    /// One round of [`Writer::run_retention`]: deletes what the limits select; returns the
    /// bytes the file system should give back and the bytes deleted.
    fn retention_pass(&mut self) -> (u64, u64) {
        let shared = self.shared.clone();
        let retention = &shared.config.retention;
        // A segment holding effects records past the durable checkpoint is kept: a crash
        // would replay them.
        let checkpointed = shared.checkpointed.load(Ordering::Acquire);
        let effects_end = shared.effects_end.load(Ordering::Acquire);
        let closed: Vec<_> = shared
            .log
            .closed_segments()
            .into_iter()
            .filter(|c| retention::checkpoint_covers(c.base, c.base + c.len, checkpointed, effects_end))
            .collect();
        let dir = &shared.config.dir;
        let excess = retention.max_disk_used_ratio.map_or(0, |ratio| retention::disk_excess(dir, ratio));
        let shortfall = retention.min_disk_free_bytes.map_or(0, |min| retention::disk_shortfall(dir, min));
        let need = excess.max(shortfall);
        if closed.is_empty() {
            return (need, 0);
        }
        let (_, total) = shared.log.size();
        let candidates: Vec<Candidate> = closed
            .iter()
            .map(|c| {
                let refs = self.refs.get(c.base);
                let modified = if retention.max_age.is_some() && refs == 0 {
                    std::fs::metadata(&c.path).and_then(|m| m.modified()).ok()
                } else {
                    None
                };
                Candidate { base: c.base, len: c.len, refs, modified }
            })
            .collect();
        let chosen = retention::select(&candidates, total, retention, SystemTime::now(), need);
        let mut freed = 0;
        for base in chosen {
            match shared.log.delete_segment(base) {
                Ok(true) => {
                    self.refs.forget(base);
                    let end = closed.iter().find(|c| c.base == base).map_or(base, |c| c.base + c.len);
                    freed += end - base;
                    if let Err(e) = shared.db().and_then(|db| crate::recovery::drop_keys(&db, base..end)) {
                        tracing::warn!(segment = base, error = %e, "key index: could not drop the entries of a deleted segment");
                    }
                    tracing::info!(
                        segment = base,
                        disk_excess = excess,
                        disk_shortfall = shortfall,
                        "commit log: deleted an unreferenced segment (retention)"
                    );
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(segment = base, error = %e, "commit log: could not delete a segment"),
            }
        }
        (need, freed)
    }

    /// Rolls the active segment over for retention short of `missing` bytes, if nothing
    /// refers into it, it holds at least `missing` or [`ROLL_FOR_SPACE_MIN`] bytes, and no
    /// closed segment free of references is still waiting for the checkpoint (one rolled
    /// over before, say: it goes first). True if it rolled.
    fn roll_for_space(&mut self, missing: u64) -> bool {
        if self.poisoned.is_some() || self.store_full.is_some() {
            return false;
        }
        let base = self.log.active_base();
        let len = self.log.active_len();
        if self.refs.get(base) > 0 || len < missing.min(ROLL_FOR_SPACE_MIN) {
            return false;
        }
        let checkpointed = self.shared.checkpointed.load(Ordering::Acquire);
        let effects_end = self.shared.effects_end.load(Ordering::Acquire);
        let waiting = self.shared.log.closed_segments().iter().any(|c| {
            self.refs.get(c.base) == 0
                && !retention::checkpoint_covers(c.base, c.base + c.len, checkpointed, effects_end)
        });
        if waiting {
            return false;
        }
        match self.roll_active() {
            Ok(rolled) => {
                if rolled {
                    tracing::info!(
                        segment = base,
                        bytes = len,
                        missing,
                        "commit log: rolled the active segment over for retention (the data file system is short of space and nothing refers into it)"
                    );
                }
                rolled
            }
            Err(Fail::NoSpace(reason)) => {
                // Tried again at every run while short of space: said once a time.
                if !self.short_of_space {
                    tracing::warn!(%reason, "commit log: could not roll the active segment over for retention");
                }
                false
            }
            Err(f) => {
                self.fail(f);
                false
            }
        }
    }

    /// [`Journal::roll_segment`](crate::Journal::roll_segment), after its batch: the
    /// answer, poisoning on a failure other than a full file system.
    pub(super) fn roll_on_request(&mut self) -> Result<bool, JournalError> {
        match self.roll_active() {
            Ok(rolled) => Ok(rolled),
            Err(Fail::NoSpace(reason)) => Err(JournalError::Full(reason)),
            Err(f) => {
                let reason = f.reason().to_string();
                self.fail(f);
                Err(JournalError::Poisoned(reason))
            }
        }
    }

    /// Closes the active segment if it holds any record and starts a new one (between
    /// batches), then syncs the closed one with its end marker, so that nothing written to
    /// the new segment can reach the disk before what the closed one holds. True if it
    /// rolled.
    fn roll_active(&mut self) -> Result<bool, Fail> {
        let rolled = self.log.seal(&self.shared.log).map_err(log_write_failed)?;
        if rolled {
            self.sync()?;
        }
        Ok(rolled)
    }
}
