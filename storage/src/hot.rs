//! Consume-queue changes not yet in sled: the entries the writer added, changed or removed
//! since the last drain, kept in memory over the `queue` tree. Durable through the effects
//! records; moved to sled in one batch per drain (`Writer::drain_hot`, once per checkpoint
//! interval). An entry acknowledged before the drain — the common case of a queue that
//! keeps up — never reaches sled at all: its insert and its removal cancel out here.

use std::collections::BTreeMap;
use std::ops::Bound;

use parking_lot::RwLock;
use sled::{IVec, Tree};

use crate::codec;
use crate::db::{db_err, Db};
use crate::{JournalError, Pointer, QueueId};

/// What the writer did to a key of the `queue` tree since the last drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Added; sled does not have the key.
    Fresh(IVec),
    /// Set over what sled may hold.
    Over(IVec),
    /// Removed; sled may still hold the key.
    Gone,
}

impl Slot {
    /// The value readers see (`None`: no entry).
    pub(crate) fn value(&self) -> Option<&IVec> {
        match self {
            Slot::Fresh(v) | Slot::Over(v) => Some(v),
            Slot::Gone => None,
        }
    }
}

/// The changes over the `queue` tree (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Hot {
    slots: RwLock<BTreeMap<IVec, Slot>>,
}

impl Hot {
    /// The slot of `key`, if the writer changed it since the last drain.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Slot> {
        self.slots.read().get(key).cloned()
    }

    /// The keys changed in `lo..=hi` with their slots, in key order.
    pub(crate) fn range(&self, lo: &[u8], hi: &[u8]) -> Vec<(IVec, Slot)> {
        let slots = self.slots.read();
        slots
            .range::<[u8], _>((Bound::Included(lo), Bound::Included(hi)))
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect()
    }

    /// Whether nothing is waiting for a drain.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.read().is_empty()
    }

    /// Merges one group commit's changes of the `queue` tree (`None`: removed); `fresh`
    /// says whether a key was new to the journal (a fresh offset) when first set.
    pub(crate) fn merge(&self, changes: impl IntoIterator<Item = (IVec, Option<IVec>, bool)>) {
        let mut slots = self.slots.write();
        for (key, value, fresh) in changes {
            let old = slots.get(&key);
            let new = match (value, old) {
                (Some(v), Some(Slot::Fresh(_))) => Some(Slot::Fresh(v)),
                (Some(v), None) if fresh => Some(Slot::Fresh(v)),
                (Some(v), _) => Some(Slot::Over(v)),
                (None, Some(Slot::Fresh(_))) => None,
                (None, None) if fresh => None,
                (None, _) => Some(Slot::Gone),
            };
            match new {
                Some(slot) => {
                    slots.insert(key, slot);
                }
                None => {
                    slots.remove(&key);
                }
            }
        }
    }

    /// Writes every change to `tree` in one batch, then forgets them (readers see the same
    /// values throughout: first in both places, then in sled only).
    pub(crate) fn drain(&self, tree: &Tree) -> sled::Result<usize> {
        let mut batch = sled::Batch::default();
        let n = {
            let slots = self.slots.read();
            for (k, slot) in slots.iter() {
                match slot {
                    Slot::Fresh(v) | Slot::Over(v) => batch.insert(k.clone(), v.clone()),
                    Slot::Gone => batch.remove(k.clone()),
                }
            }
            slots.len()
        };
        tree.apply_batch(batch)?;
        self.slots.write().clear();
        Ok(n)
    }

    /// Forgets every change (sled holds them: the log was replayed into it).
    pub(crate) fn clear(&self) {
        self.slots.write().clear();
    }

    /// Every changed key with its slot (diagnostics).
    pub(crate) fn snapshot(&self) -> Vec<(IVec, Slot)> {
        self.slots.read().iter().map(|(k, s)| (k.clone(), s.clone())).collect()
    }

    /// Up to `limit` entries of `queue` from offset `from` on: sled's, with the changes
    /// laid over them.
    pub(crate) fn queue_entries(
        &self,
        db: &Db,
        queue: QueueId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Pointer)>, JournalError> {
        let lo = codec::queue_key(queue.0, from);
        let hi = codec::queue_key(queue.0, u64::MAX);
        let slots = self.slots.read();
        let mut hot = slots.range::<[u8], _>((Bound::Included(&lo[..]), Bound::Included(&hi[..]))).peekable();
        let mut stored = db.queue.range(lo..=hi);
        let mut next_stored = stored.next().transpose().map_err(db_err)?;
        let mut out = Vec::new();
        while out.len() < limit {
            let take_hot = match (hot.peek(), &next_stored) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((hk, _)), Some((sk, _))) => hk[..] <= sk[..],
            };
            let (key, value) = if take_hot {
                let Some((hk, slot)) = hot.next() else { break };
                if next_stored.as_ref().is_some_and(|(sk, _)| sk == hk) {
                    next_stored = stored.next().transpose().map_err(db_err)?;
                }
                (hk.clone(), slot.value().cloned())
            } else {
                let Some((k, v)) = next_stored.take() else { break };
                next_stored = stored.next().transpose().map_err(db_err)?;
                (k, Some(v))
            };
            let Some(value) = value else { continue };
            let off = match codec::decode_queue_key(&key) {
                Some(codec::QueueKey::Entry(_, off)) => off,
                _ => return Err(malformed()),
            };
            out.push((off, codec::decode_pointer(&value).ok_or_else(malformed)?));
        }
        Ok(out)
    }
}

fn malformed() -> JournalError {
    JournalError::Db("malformed entry in tree `queue`".into())
}
