//! Reads served by the writer: the current entry of a queue or value of a key as the batch
//! being applied sees it (its own changes over the consume queues and sled), queue names
//! resolved or allocated in the writer's order, and the counters verified against a
//! recount.

use super::failure::Fail;
use super::Writer;
use crate::codec::{self, space_index};
use crate::db::Db;
use crate::recovery;
use crate::{JournalError, Pointer, QueueId};

/// Entries per block the writer reads to settle entries ([`Writer::queue_entry`]).
const READ_BLOCK: u64 = 256;
/// Queues whose last block the writer keeps.
const READ_CACHE_QUEUES: usize = 1024;

impl Writer {
    /// Recounts references and queue lengths from sled and the consume queues and compares
    /// them with the in-memory counters.
    pub(super) fn verify(&self) -> Result<(), String> {
        let db = self.shared.db().map_err(|e| e.to_string())?;
        let (refs, mut lens) =
            recovery::recount(&db, &self.shared.cq, |pos| self.segment_base(pos)).map_err(|e| e.to_string())?;
        lens.retain(|_, n| *n > 0);
        if refs != self.refs {
            return Err(format!("reference counts: in memory {:?}, in sled {:?}", self.refs, refs));
        }
        let queues = self.shared.queues.lock();
        for (q, st) in queues.iter() {
            let stored = lens.get(q).copied().unwrap_or(0);
            if st.len != stored {
                return Err(format!("queue {q}: length {} in memory, {stored} in sled", st.len));
            }
        }
        for (q, len) in &lens {
            if !queues.contains_key(q) {
                return Err(format!("queue {q}: {len} entries in sled, unknown in memory"));
            }
        }
        Ok(())
    }

    /// True when `queue` has a name mapping (it was created by `queue_id` and not deleted).
    pub(super) fn queue_is_live(&mut self, db: &Db, queue: u64) -> bool {
        if self.live.contains(&queue) {
            return true;
        }
        let key = codec::encode_u64(queue);
        let live = matches!(self.pending.queue_ids.get(&db.queue_ids, &key), Ok(Some(_)));
        if live {
            self.live.insert(queue);
        }
        live
    }

    /// The id of queue `name` as this batch sees it (a deletion earlier in the batch
    /// unmapped it), else a new one: written to sled at once, unflushed, and to this
    /// batch's effects record. Either way remembered in [`Shared::names`](crate::state::Shared::names), which only this
    /// thread changes.
    pub(super) fn resolve_name(&mut self, db: &Db, name: String) -> Result<QueueId, JournalError> {
        let mapped = self.pending.queue_names.get(&db.queue_names, name.as_bytes()).map_err(crate::db::db_err)?;
        let id = match mapped {
            Some(v) => Db::decode_queue_id(&name, &v)?,
            None => {
                let id = db.allocate_queue_id(&name)?;
                let key = codec::encode_u64(id);
                self.pending.queue_ids.insert(&key[..], name.as_bytes());
                self.pending.queue_names.insert(name.as_bytes(), &key[..]);
                self.live.insert(id);
                id
            }
        };
        self.shared.names.write().insert(name, QueueId(id));
        Ok(QueueId(id))
    }

    /// Whether the entry at `offset` of `queue` is there (pending in this group commit or
    /// live in the consume queue), without reading it.
    pub(super) fn entry_present(&self, queue: u64, offset: u64) -> bool {
        match self.pending.queue.change(queue, offset) {
            Some(change) => change.is_some(),
            None => self.shared.cq.is_live(queue, offset),
        }
    }

    /// The live entry at `offset` of `queue`: this batch's change, else the consume queue's.
    pub(super) fn queue_entry(&mut self, queue: u64, offset: u64) -> Result<Option<Pointer>, Fail> {
        if let Some(change) = self.pending.queue.change(queue, offset) {
            return Ok(change);
        }
        if !self.shared.cq.is_live(queue, offset) {
            return Ok(None);
        }
        let base = offset - offset % READ_BLOCK;
        let i = (offset - base) as usize;
        if let Some((b, block)) = self.read_cache.get(&queue) {
            if *b == base {
                return Ok(block[i]);
            }
        }
        let read = self
            .shared
            .cq
            .read_block(queue, base, base + READ_BLOCK)
            .map_err(|e| Fail::Fatal(format!("consume queue read: {e}")))?;
        let mut block = vec![None; READ_BLOCK as usize];
        for (off, p) in read {
            block[(off - base) as usize] = Some(p);
        }
        let found = block[i];
        if self.read_cache.len() >= READ_CACHE_QUEUES {
            self.read_cache.clear();
        }
        self.read_cache.insert(queue, (base, block));
        Ok(found)
    }

    /// The current value of a keyspace key: this batch's change, else the deferred one,
    /// else sled's.
    pub(super) fn kv_get(&self, db: &Db, space: crate::Space, key: &[u8]) -> sled::Result<Option<sled::IVec>> {
        let i = space_index(space);
        if let Some(change) = self.pending.kv[i].change(key) {
            return Ok(change);
        }
        if let Some(change) = self.shared.kv_deferred.read()[i].change(key) {
            return Ok(change);
        }
        db.kv(space).get(key)
    }
}
