//! The sled database: opening it, its trees, queue-id allocation and every read query.
//! Writes other than queue-id allocation go through the writer thread (`writer`).

use std::path::Path;

use bytes::Bytes;
use sled::Tree;

use crate::codec::{self, SPACES};
use crate::{JournalError, KeyHit, LogPos, QueueId, Space, TimerEntry};

/// How long opening retries when sled's directory lock is still held.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Maps a sled error to the journal's error type.
pub(crate) fn db_err(e: sled::Error) -> JournalError {
    JournalError::Db(e.to_string())
}

fn malformed(tree: &'static str, key: &[u8]) -> JournalError {
    JournalError::Malformed { tree, key: key.to_vec() }
}

/// A timer as the `timer` tree holds it.
fn timer_entry(kv: sled::Result<(sled::IVec, sled::IVec)>) -> Result<TimerEntry, JournalError> {
    let (k, v) = kv.map_err(db_err)?;
    let (due_ms, pos) = codec::decode_timer_key(&k).ok_or_else(|| malformed("timer", &k))?;
    let (size, target) = codec::decode_timer_value(&v).ok_or_else(|| malformed("timer", &k))?;
    Ok(TimerEntry { due_ms, pos: LogPos(pos), size, target: Bytes::copy_from_slice(target) })
}

/// The sled database and its trees.
pub(crate) struct Db {
    /// The database (its `flush` covers every tree).
    pub(crate) db: sled::Db,
    /// Queue name -> id.
    pub(crate) queue_names: Tree,
    /// Queue id -> name.
    pub(crate) queue_ids: Tree,
    /// Retained index: topic (routing key) -> (pos, size) of its record in the log.
    pub(crate) retained: Tree,
    /// Timers: (due ms, pos) -> (size, target), read earliest first.
    pub(crate) timer: Tree,
    /// Message key index: (key hash, timestamp, pos) -> (size, key).
    pub(crate) key: Tree,
    /// The key index by position: (pos, key hash, timestamp) -> ().
    pub(crate) key_pos: Tree,
    /// One tree per [`Space`], in `codec::space_index` order.
    pub(crate) kv: [Tree; 5],
    /// Queue and segment counters.
    pub(crate) counters: Tree,
    /// Settled consume-queue offsets per queue (`cq::Offsets`), written by drains only
    /// (not through effects records: recovery replays the settlements).
    pub(crate) settled: Tree,
}

/// Number of trees effects records number: tree 0 is the consume queues (files of their
/// own, `cq`), trees 1 to `TREES - 1` are [`Db::trees`].
pub(crate) const TREES: usize = 13;

impl Db {
    /// Opens (or creates) the database at `path` and its trees.
    pub(crate) fn open(path: &Path, cache_bytes: u64) -> Result<Db, JournalError> {
        let config = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .mode(sled::Mode::HighThroughput)
            // Flushed by the checkpointer (`checkpoint`), never on the publish path.
            .flush_every_ms(None);
        // sled releases its file lock when its background threads of a previous handle in
        // this process have exited, which can lag behind the drop under load: retry a lock
        // failure briefly before reporting it (another process holding it still fails).
        let deadline = std::time::Instant::now() + LOCK_RETRY;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                // (sled reports it as an `Other` I/O error with this text.)
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(db_err(e)),
            }
        };
        let tree = |name: &str| db.open_tree(name).map_err(db_err);
        Ok(Db {
            queue_names: tree(codec::TREE_QUEUE_NAMES)?,
            queue_ids: tree(codec::TREE_QUEUE_IDS)?,
            retained: tree(codec::TREE_RETAINED)?,
            timer: tree(codec::TREE_TIMER)?,
            key: tree(codec::TREE_KEY)?,
            key_pos: tree(codec::TREE_KEY_POS)?,
            kv: [
                tree(codec::kv_tree_name(SPACES[0]))?,
                tree(codec::kv_tree_name(SPACES[1]))?,
                tree(codec::kv_tree_name(SPACES[2]))?,
                tree(codec::kv_tree_name(SPACES[3]))?,
                tree(codec::kv_tree_name(SPACES[4]))?,
            ],
            counters: tree(codec::TREE_COUNTERS)?,
            settled: tree(codec::TREE_SETTLED)?,
            db,
        })
    }

    /// The sled trees written by group commits, in the order effects records number them
    /// from 1 on (a stable part of the on-disk layout: only append).
    pub(crate) fn trees(&self) -> [&Tree; TREES - 1] {
        [
            &self.queue_names,
            &self.queue_ids,
            &self.retained,
            &self.timer,
            &self.key,
            &self.key_pos,
            &self.kv[0],
            &self.kv[1],
            &self.kv[2],
            &self.kv[3],
            &self.kv[4],
            &self.counters,
        ]
    }

    /// The sled tree holding keyspace `space`'s keys.
    pub(crate) fn kv(&self, space: Space) -> &Tree {
        &self.kv[codec::space_index(space)]
    }

    /// A new id (never reused) for `name`, written to both name trees at once (unflushed).
    /// Only the writer thread allocates, after finding no mapping for `name`.
    pub(crate) fn allocate_queue_id(&self, name: &str) -> Result<u64, JournalError> {
        let id = self.db.generate_id().map_err(db_err)?;
        let id_bytes = codec::encode_u64(id);
        self.queue_ids.insert(id_bytes, name.as_bytes()).map_err(db_err)?;
        self.queue_names.insert(name.as_bytes(), &id_bytes[..]).map_err(db_err)?;
        Ok(id)
    }

    /// The queue id the `queue_names` value of `name` holds.
    pub(crate) fn decode_queue_id(name: &str, value: &[u8]) -> Result<u64, JournalError> {
        codec::decode_u64(value).ok_or_else(|| malformed("queue_names", name.as_bytes()))
    }

    /// Every queue name with its id, in name order.
    pub(crate) fn queues(&self) -> Result<Vec<(String, QueueId)>, JournalError> {
        self.queue_names
            .iter()
            .map(|kv| {
                let (k, v) = kv.map_err(db_err)?;
                let name = String::from_utf8(k.to_vec()).map_err(|_| malformed("queue_names", &k))?;
                let id = codec::decode_u64(&v).ok_or_else(|| malformed("queue_names", &k))?;
                Ok((name, QueueId(id)))
            })
            .collect()
    }

    /// Every retained topic with its record position.
    pub(crate) fn retained(&self) -> Result<Vec<(String, LogPos)>, JournalError> {
        self.retained
            .iter()
            .map(|kv| {
                let (k, v) = kv.map_err(db_err)?;
                let topic = String::from_utf8(k.to_vec()).map_err(|_| malformed("retained", &k))?;
                let (pos, _) = codec::decode_retained(&v).ok_or_else(|| malformed("retained", &k))?;
                Ok((topic, LogPos(pos)))
            })
            .collect()
    }

    /// How many of the first `limit` timers have a target `keep` accepts.
    pub(crate) fn count_timers(&self, limit: usize, keep: &dyn Fn(&[u8]) -> bool) -> Result<u64, JournalError> {
        let mut n = 0;
        for kv in self.timer.iter().take(limit) {
            let (k, v) = kv.map_err(db_err)?;
            let (_, target) = codec::decode_timer_value(&v).ok_or_else(|| malformed("timer", &k))?;
            n += keep(target) as u64;
        }
        Ok(n)
    }

    /// Up to `limit` timers due at or before `until_ms`, earliest first.
    pub(crate) fn timers_due(&self, until_ms: u64, limit: usize) -> Result<Vec<TimerEntry>, JournalError> {
        self.timer.range(..=codec::timer_key(until_ms, u64::MAX)).take(limit).map(timer_entry).collect()
    }

    /// Up to `limit` timers after the timer `after` (from the first when `None`), in order.
    pub(crate) fn timers_after(
        &self,
        after: Option<(u64, u64)>,
        limit: usize,
    ) -> Result<Vec<TimerEntry>, JournalError> {
        let range = match after {
            Some((due_ms, pos)) => {
                self.timer.range((std::ops::Bound::Excluded(codec::timer_key(due_ms, pos)), std::ops::Bound::Unbounded))
            }
            None => self.timer.iter(),
        };
        range.take(limit).map(timer_entry).collect()
    }

    /// Up to `limit` key-index entries of exactly `key` with `from_ms <= timestamp <= to_ms`,
    /// oldest first: a range scan of one hash's entries. Entries whose record is gone
    /// (retention) are skipped by `live`.
    pub(crate) fn lookup_key(
        &self,
        key: &[u8],
        from_ms: u64,
        to_ms: u64,
        limit: usize,
        live: impl Fn(u64, u32) -> bool,
    ) -> Result<Vec<KeyHit>, JournalError> {
        let hash = codec::key_hash(key);
        let lo = codec::key_index_key(hash, from_ms, 0);
        let hi = codec::key_index_key(hash, to_ms, u64::MAX);
        let mut hits = Vec::new();
        for kv in self.key.range(lo..=hi) {
            if hits.len() >= limit {
                break;
            }
            let (k, v) = kv.map_err(db_err)?;
            let (_, timestamp_ms, pos) = codec::decode_key_index_key(&k).ok_or_else(|| malformed("key", &k))?;
            let (size, stored) = codec::decode_key_value(&v).ok_or_else(|| malformed("key", &k))?;
            if stored == key && live(pos, size) {
                hits.push(KeyHit { pos: LogPos(pos), size, timestamp_ms });
            }
        }
        Ok(hits)
    }

    /// Due time of the earliest timer.
    pub(crate) fn next_timer(&self) -> Result<Option<u64>, JournalError> {
        match self.timer.first().map_err(db_err)? {
            None => Ok(None),
            Some((k, _)) => codec::decode_timer_key(&k).map(|(due, _)| Some(due)).ok_or_else(|| malformed("timer", &k)),
        }
    }

    /// Reads a key of a keyspace.
    pub(crate) fn get(&self, space: Space, key: &[u8]) -> Result<Option<Bytes>, JournalError> {
        Ok(self.kv(space).get(key).map_err(db_err)?.map(|v| Bytes::copy_from_slice(&v)))
    }

    /// Every key/value of a keyspace with this prefix, in key order.
    pub(crate) fn scan(&self, space: Space, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>, JournalError> {
        self.kv(space)
            .scan_prefix(prefix)
            .map(|kv| {
                let (k, v) = kv.map_err(db_err)?;
                Ok((Bytes::copy_from_slice(&k), Bytes::copy_from_slice(&v)))
            })
            .collect()
    }
}
