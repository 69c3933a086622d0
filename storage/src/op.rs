//! What a submission says and what it gets back: the [`Op`]s applied in order, the records
//! and pointers they write, and the [`Receipt`] a [`Completion`] receives.

use bytes::Bytes;

use crate::{JournalError, LogPos, QueueId};

/// A commit-log record: an opaque header (encoded by the caller) and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Caller-encoded metadata (routing key, properties, ...).
    pub header: Bytes,
    /// The message payload, stored as given.
    pub body: Bytes,
}

/// A pointer to append to one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueTarget {
    /// The queue the pointer is appended to.
    pub queue: QueueId,
    /// Tag hash stored in the entry.
    pub tag_hash: u32,
    /// Flags stored in the entry.
    pub flags: u8,
}

/// A timer to create for an appended record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    /// When it is due, milliseconds since the Unix epoch.
    pub due_ms: u64,
    /// Opaque target the caller decodes when the timer fires (e.g. where to route).
    pub target: Bytes,
}

/// Append one record to the commit log and index it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Append {
    /// The record to write to the commit log.
    pub record: Record,
    /// One pointer entry per queue; each gets the queue's next offset.
    pub queues: Vec<QueueTarget>,
    /// Also make this record the retained message of this topic.
    pub retained_topic: Option<String>,
    /// Also schedule this record.
    pub timer: Option<Timer>,
    /// Also index this record under these message keys.
    pub keys: Option<MessageKeys>,
}

/// Message keys to index a record under (see [`Journal::lookup_key`]).
///
/// [`Journal::lookup_key`]: crate::Journal::lookup_key
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageKeys {
    /// The message's timestamp (ms since the epoch): lookups select a time range.
    pub timestamp_ms: u64,
    /// The keys (any bytes; a record may have several).
    pub keys: Vec<Bytes>,
}

/// Keyspaces of the generic key-value state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// MQTT sessions (client id -> session state).
    Session,
    /// MQTT inbound QoS 2 packet ids awaiting PUBREL (client id + pkid -> ()).
    InboundQos2,
    /// Broker metadata (vhosts, exchanges, queues, bindings, users, ...).
    Meta,
    /// Retry state of consume-queue entries (queue id + offset -> due time, deliveries).
    Retry,
    /// Committed positions of consumer groups (stream id + group name -> offset state).
    Cursor,
}

/// One mutation of the journal. A submission is a `Vec<Op>` applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Append a record (see [`Append`]); yields an [`Appended`] in the receipt.
    Append(Append),
    /// Add pointers to an existing record (delayed delivery, dead-lettering) without
    /// writing the body again; yields an [`Appended`] in the receipt.
    ///
    /// `pos..pos + size` must lie inside a live segment's records (a record appended
    /// earlier in the same submission counts). Otherwise the **whole submission** fails
    /// with [`JournalError::NotFound`] and nothing of it is applied. Put the op that drops
    /// the record's last other reference (e.g. [`Op::DeleteTimer`]) in the same submission,
    /// after the `Enqueue`, so that retention cannot delete the segment in between.
    Enqueue {
        /// Position of the existing record.
        pos: LogPos,
        /// The record's size on disk (framing included).
        size: u32,
        /// Length of the record's body (what byte limits of queues count).
        body_len: u32,
        /// One pointer per queue; each gets the queue's next offset.
        queues: Vec<QueueTarget>,
    },
    /// Remove one queue entry (acknowledged or dropped).
    Remove {
        /// Queue holding the entry; an entry that is not there is a no-op.
        queue: QueueId,
        /// The entry's offset.
        offset: u64,
        /// Where the entry's record is, when the caller holds its pointer (from the
        /// receipt or a read): the writer then releases the record without reading the
        /// entry back from the consume queue. `None`: the writer reads it. Must be the
        /// entry's own position (a wrong one releases another record's segment).
        at: Option<LogPos>,
    },
    /// Remove every entry of a queue with `from <= offset < to` (purge).
    RemoveRange {
        /// Queue to purge; offsets in the range without an entry are skipped.
        queue: QueueId,
        /// First offset removed.
        from: u64,
        /// First offset kept.
        to: u64,
    },
    /// Replace the flags of a queue entry (e.g. QoS 2 "released").
    SetFlags {
        /// Queue holding the entry; an entry that is not there is left alone.
        queue: QueueId,
        /// The entry's offset.
        offset: u64,
        /// The flags that replace the entry's.
        flags: u8,
    },
    /// Remove every entry of a queue and its name mapping. [`Journal::queue_id`] never
    /// hands the id out again; pointers for it that arrive later in the same run (a publish
    /// that raced the deletion) are dropped, i.e. missing from that append's `offsets`.
    ///
    /// [`Journal::queue_id`]: crate::Journal::queue_id
    DeleteQueue {
        /// Queue to delete; its next offset is 0 again afterwards.
        queue: QueueId,
    },
    /// Remove the retained message of a topic.
    DeleteRetained {
        /// The topic whose retained message is removed.
        topic: String,
    },
    /// Schedule an existing record (a queue entry waiting for its retry) without writing
    /// it again. A no-op when `pos..pos + size` holds no live record or the same timer
    /// exists; if another timer holds the key `(due_ms, pos)`, this one is due 1 ms later
    /// (the timer as stored is what [`Journal::timers_due`] reports).
    ///
    /// [`Journal::timers_due`]: crate::Journal::timers_due
    AddTimer {
        /// When it is due, milliseconds since the Unix epoch.
        due_ms: u64,
        /// Position of the record to schedule.
        pos: LogPos,
        /// The record's size on disk.
        size: u32,
        /// Opaque target the caller decodes when the timer fires.
        target: Bytes,
    },
    /// Remove a timer (it fired or was cancelled).
    DeleteTimer {
        /// Due time of the timer.
        due_ms: u64,
        /// Record it points to.
        pos: LogPos,
    },
    /// Set a key in a keyspace.
    Put {
        /// Keyspace written to (each [`Space`] is its own sled tree).
        space: Space,
        /// The key; a value it had is replaced.
        key: Bytes,
        /// The value stored under `key`.
        value: Bytes,
    },
    /// Remove a key from a keyspace.
    Delete {
        /// Keyspace to remove the key from; an absent key is a no-op.
        space: Space,
        /// Exact key to remove ([`Op::DeletePrefix`] removes a range).
        key: Bytes,
    },
    /// Remove every key with this prefix from a keyspace.
    DeletePrefix {
        /// Keyspace to remove the keys from.
        space: Space,
        /// Every key that starts with these bytes is removed.
        prefix: Bytes,
    },
}

/// Where an [`Op::Append`] or [`Op::Enqueue`] landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Position of the record.
    pub pos: LogPos,
    /// Size of the record on disk.
    pub size: u32,
    /// The offset each target queue gave the pointer, **in the order of the op's `queues`**
    /// (a guarantee: a caller matches them with what it keeps per target in one pass, never
    /// by searching). A target whose queue was deleted ([`Op::DeleteQueue`]) got no pointer
    /// and is left out, so this is the targets' sequence with those gaps; a queue listed twice
    /// appears twice.
    pub offsets: Vec<(QueueId, u64)>,
}

/// Result of a submission: one [`Appended`] per `Append`/`Enqueue` op, in op order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receipt {
    /// One [`Appended`] per `Append`/`Enqueue` op, in op order (empty without any).
    pub appended: Vec<Appended>,
}

/// Called once per submission on the writer thread, in submission order, when the
/// submission is durable under the policy (or failed). Must not block.
pub type Completion = Box<dyn FnOnce(Result<Receipt, JournalError>) + Send + 'static>;

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use crate::{Append, Journal, JournalConfig, Op, QueueId, QueueTarget, Record};

    /// A permutation of `0..n`, the same every run (a linear congruential walk).
    fn shuffled(n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in (1..n).rev() {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            v.swap(i, (x >> 33) as usize % (i + 1));
        }
        v
    }

    #[test]
    fn offsets_come_back_in_target_order_without_deleted_queues() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(JournalConfig::new(dir.path())).unwrap();
        // 200 queues named in order (ids ascending), targeted in a shuffled order, a queue
        // listed twice, every seventh queue deleted before the append.
        let ids: Vec<QueueId> = (0..200).map(|i| j.queue_id(&format!("q{i}")).unwrap()).collect();
        let deleted: Vec<QueueId> = ids.iter().copied().step_by(7).collect();
        j.write_blocking(deleted.iter().map(|&queue| Op::DeleteQueue { queue }).collect()).unwrap();
        let mut order: Vec<QueueId> = shuffled(ids.len()).into_iter().map(|i| ids[i]).collect();
        order.insert(100, order[10]);
        let targets: Vec<QueueTarget> = order
            .iter()
            .enumerate()
            .map(|(i, &queue)| QueueTarget { queue, tag_hash: 7, flags: (i % 256) as u8 })
            .collect();
        let record = Record { header: Bytes::new(), body: Bytes::from_static(b"fan-out") };
        let append =
            Op::Append(Append { record, queues: targets.clone(), retained_topic: None, timer: None, keys: None });
        let r = j.write_blocking(vec![append]).unwrap();
        let a = &r.appended[0];
        let expected: Vec<QueueId> = order.iter().copied().filter(|q| !deleted.contains(q)).collect();
        let got: Vec<QueueId> = a.offsets.iter().map(|&(q, _)| q).collect();
        assert_eq!(got, expected, "live targets, in target order");
        let twice = order[10];
        let offsets_of_twice: Vec<u64> = a.offsets.iter().filter(|(q, _)| *q == twice).map(|&(_, o)| o).collect();
        assert_eq!(offsets_of_twice, vec![0, 1], "a queue listed twice got two pointers, in order");

        // The same order for pointers added to an existing record.
        let enqueue =
            Op::Enqueue { pos: a.pos, size: a.size, body_len: 7, queues: targets.into_iter().rev().collect() };
        let r = j.write_blocking(vec![enqueue]).unwrap();
        let got: Vec<QueueId> = r.appended[0].offsets.iter().map(|&(q, _)| q).collect();
        let reversed: Vec<QueueId> = expected.into_iter().rev().collect();
        assert_eq!(got, reversed, "Enqueue keeps target order too");
        j.close().unwrap();
    }
}
