//! The clean-shutdown checkpoint: the counters that index recovery would otherwise rebuild
//! by scanning every pointer, retained entry and timer (per-segment reference counts,
//! per-queue counters), written by the writer thread after its final sync and consumed at
//! the next open. With millions of queue entries or timers that scan costs seconds; the
//! checkpoint makes a clean restart independent of the backlog.
//!
//! It is trusted only if the log ends exactly where it ended at shutdown, and it is removed
//! (and sled flushed) before the writer starts, so a crash later forces the full scan — the
//! model of RocketMQ's abort file.

use std::collections::HashMap;

use crate::db::{db_err, Db};
use crate::refs::RefCounts;
use crate::state::QueueState;
use crate::JournalError;

/// Key of the checkpoint in sled's default tree.
const KEY: &[u8] = b"ferrymq:clean-shutdown:v1";

/// What a checkpoint holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// End of the log at shutdown.
    pub(crate) log_end: u64,
    /// References per segment base.
    pub(crate) refs: Vec<(u64, u64)>,
    /// Counters per queue id.
    pub(crate) queues: Vec<(u64, QueueState)>,
}

impl Checkpoint {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24 + self.refs.len() * 16 + self.queues.len() * 24);
        v.extend_from_slice(&self.log_end.to_be_bytes());
        v.extend_from_slice(&(self.refs.len() as u64).to_be_bytes());
        for (base, n) in &self.refs {
            v.extend_from_slice(&base.to_be_bytes());
            v.extend_from_slice(&n.to_be_bytes());
        }
        v.extend_from_slice(&(self.queues.len() as u64).to_be_bytes());
        for (id, st) in &self.queues {
            v.extend_from_slice(&id.to_be_bytes());
            v.extend_from_slice(&st.next.to_be_bytes());
            v.extend_from_slice(&st.len.to_be_bytes());
        }
        v
    }

    fn decode(b: &[u8]) -> Option<Checkpoint> {
        let chunks = b.chunks_exact(8);
        if !chunks.remainder().is_empty() {
            return None;
        }
        let mut words = chunks.map(|c| u64::from_be_bytes(c.try_into().unwrap_or_default()));
        let log_end = words.next()?;
        let n = words.next()?;
        let mut refs = Vec::new();
        for _ in 0..n {
            refs.push((words.next()?, words.next()?));
        }
        let n = words.next()?;
        let mut queues = Vec::new();
        for _ in 0..n {
            let id = words.next()?;
            queues.push((id, QueueState { next: words.next()?, len: words.next()? }));
        }
        words.next().is_none().then_some(Checkpoint { log_end, refs, queues })
    }
}

/// Writes the checkpoint and flushes sled (the writer's last act after a clean close).
pub(crate) fn write(
    db: &Db,
    log_end: u64,
    refs: &RefCounts,
    queues: &HashMap<u64, QueueState>,
) -> Result<(), JournalError> {
    let mut cp =
        Checkpoint { log_end, refs: refs.iter().collect(), queues: queues.iter().map(|(k, v)| (*k, *v)).collect() };
    cp.refs.sort_unstable();
    cp.queues.sort_unstable_by_key(|(k, _)| *k);
    db.db.insert(KEY, cp.encode()).map_err(db_err)?;
    db.db.flush().map_err(db_err)?;
    Ok(())
}

/// Takes the checkpoint out of sled (removed and flushed whether or not it is usable) and
/// returns it if the log still ends where it did at shutdown.
pub(crate) fn take(db: &Db, log_end: u64) -> Result<Option<Checkpoint>, JournalError> {
    let Some(v) = db.db.remove(KEY).map_err(db_err)? else { return Ok(None) };
    db.db.flush().map_err(db_err)?;
    match Checkpoint::decode(&v) {
        Some(cp) if cp.log_end == log_end => Ok(Some(cp)),
        Some(cp) => {
            tracing::warn!(
                checkpoint_end = cp.log_end,
                log_end,
                "clean-shutdown checkpoint does not match the log; scanning the index"
            );
            Ok(None)
        }
        None => {
            tracing::warn!("malformed clean-shutdown checkpoint; scanning the index");
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let cp = Checkpoint {
            log_end: 12345,
            refs: vec![(0, 3), (4096, 1)],
            queues: vec![(7, QueueState { next: 10, len: 4 }), (9, QueueState { next: 1, len: 0 })],
        };
        assert_eq!(Checkpoint::decode(&cp.encode()), Some(cp));
        assert_eq!(Checkpoint::decode(&[1, 2, 3]), None);
        assert_eq!(Checkpoint::decode(&[0; 8]), None);
        let mut trailing = Checkpoint::default().encode();
        trailing.extend_from_slice(&[0; 8]);
        assert_eq!(Checkpoint::decode(&trailing), None);
    }
}
