//! The pointers one journal submission appended, on their way from the journal's completion
//! to the queue owners.
//!
//! The completion runs on the journal writer thread, which every publisher's group commit
//! waits for, so it does no work per pointer there beyond a bound: it wraps the receipt and
//! the publish's [`MessageTargets`] into one [`AppendedBatch`]; a narrow batch (a few
//! pointers) is copied into [`OwnedEntry`]s for its shards, a wide one is shared whole with
//! each shard that owns one of its queues ([`Shards::send_appended`]). Each shard walks a
//! shared batch once
//! ([`AppendedBatch::entries`]) and takes its own entries. The walk matches the journal's
//! offsets to the targets' flags in one pass: storage returns the offsets in target order,
//! leaving out only targets whose queue was deleted (see [`ferrymq_storage::Appended`]), so
//! a fan-out to N queues costs O(N), never a search per queue.
//!
//! [`Shards::send_appended`]: super::shards::Shards::send_appended

use ferrymq_storage::{Appended, Pointer, QueueId};

use super::message::SharedMessage;

/// A message and the queues one Append/Enqueue op points at, kept for the op's completion:
/// in the order of the op's targets, which queue gets which pointer flags.
#[derive(Debug)]
pub struct MessageTargets {
    /// The message the Append/Enqueue op stored or referenced.
    pub msg: SharedMessage,
    /// Queue and pointer flags of every target, in the order of the op's `queues`.
    pub targets: Vec<(QueueId, u8)>,
    /// The message's tag hash (the same in every pointer).
    pub tag_hash: u32,
}

/// One new pointer of a batch, as a queue owner takes it.
#[derive(Debug, Clone, Copy)]
pub struct AppendedEntry<'a> {
    /// Queue the pointer was appended to.
    pub queue: QueueId,
    /// Offset the journal assigned.
    pub offset: u64,
    /// Where the record is in the commit log, its size, tag hash and flags.
    pub ptr: Pointer,
    /// The message itself, so that the owner delivers it without reading the log.
    pub msg: &'a SharedMessage,
}

/// One new pointer of a narrow batch, owned: what a publish to a few queues hands each
/// shard, so that the batch itself (the receipt, the targets) is dropped on the journal
/// writer that made it rather than on a shard's thread.
#[derive(Debug)]
pub struct OwnedEntry {
    /// Queue the pointer was appended to.
    pub queue: QueueId,
    /// Offset the journal assigned.
    pub offset: u64,
    /// Where the record is in the commit log, its size, tag hash and flags.
    pub ptr: Pointer,
    /// The message itself.
    pub msg: SharedMessage,
}

impl From<AppendedEntry<'_>> for OwnedEntry {
    fn from(e: AppendedEntry<'_>) -> OwnedEntry {
        OwnedEntry { queue: e.queue, offset: e.offset, ptr: e.ptr, msg: e.msg.clone() }
    }
}

/// What the journal appended for one submission: per Append/Enqueue op (in op order) where it
/// landed, with the bookkeeping of its message.
#[derive(Debug)]
pub struct AppendedBatch {
    ops: Vec<(Appended, MessageTargets)>,
}

impl AppendedBatch {
    /// The batch of a receipt's `appended` (one per Append/Enqueue op, in op order) and the
    /// targets submitted for the first of those ops, in the same order; results past the
    /// last targets are not the batch's (their submitter hands their pointers on, or nobody
    /// waits).
    pub fn new(appended: Vec<Appended>, targets: Vec<MessageTargets>) -> AppendedBatch {
        AppendedBatch { ops: appended.into_iter().zip(targets).collect() }
    }

    /// Whether the batch holds no pointer.
    pub fn is_empty(&self) -> bool {
        self.ops.iter().all(|(a, _)| a.offsets.is_empty())
    }

    /// How many pointers the batch holds.
    pub fn pointers(&self) -> usize {
        self.ops.iter().map(|(a, _)| a.offsets.len()).sum()
    }

    /// The queue of every pointer, in log order (with repeats).
    pub fn queues(&self) -> impl Iterator<Item = QueueId> + '_ {
        self.ops.iter().flat_map(|(a, _)| a.offsets.iter().map(|&(q, _)| q))
    }

    /// Every pointer of the batch in log order, with the flags its target asked for: one
    /// pass over each op's offsets and targets together.
    pub fn entries(&self) -> impl Iterator<Item = AppendedEntry<'_>> + '_ {
        self.ops.iter().flat_map(|(appended, item)| {
            let base = Pointer {
                pos: appended.pos,
                size: appended.size,
                body_len: item.msg.payload.len().min(u32::MAX as usize) as u32,
                tag_hash: item.tag_hash,
                flags: 0,
            };
            let mut targets = item.targets.iter();
            appended.offsets.iter().map(move |&(queue, offset)| {
                // The offsets are the targets in order, less those of deleted queues: skip
                // to this one.
                let flags = targets.by_ref().find(|(q, _)| *q == queue).map(|&(_, f)| f);
                debug_assert!(flags.is_some(), "storage returned queue {queue:?} out of target order");
                AppendedEntry { queue, offset, ptr: Pointer { flags: flags.unwrap_or(0), ..base }, msg: &item.msg }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use ferrymq_storage::LogPos;
    use proptest::prelude::*;

    use super::*;
    use crate::core::message::{Message, Properties};

    fn message(body: &'static [u8]) -> SharedMessage {
        Arc::new(Message {
            exchange: String::new(),
            routing_key: "fan.out".into(),
            payload: Bytes::from_static(body),
            qos: 1,
            retain: false,
            props: Properties::default(),
            timestamp_ms: 0,
        })
    }

    /// The batch of one Append to `targets` (queue, flags), where the queues in `deleted` got
    /// no pointer, as storage reports it; offsets are 1000 + the target's index.
    fn batch(targets: &[(QueueId, u8)], deleted: &[QueueId]) -> AppendedBatch {
        let offsets = targets
            .iter()
            .enumerate()
            .filter(|(_, (q, _))| !deleted.contains(q))
            .map(|(i, &(q, _))| (q, 1000 + i as u64))
            .collect();
        let appended = Appended { pos: LogPos(4096), size: 80, offsets };
        let item = MessageTargets { msg: message(b"wide"), targets: targets.to_vec(), tag_hash: 9 };
        AppendedBatch::new(vec![appended], vec![item])
    }

    /// Checks that every pointer the batch hands out carries its target's flags and offset, in
    /// target order, and that exactly the live targets got one.
    fn check(targets: &[(QueueId, u8)], deleted: &[QueueId]) {
        let b = batch(targets, deleted);
        let got: Vec<(QueueId, u64, u8)> = b.entries().map(|e| (e.queue, e.offset, e.ptr.flags)).collect();
        let want: Vec<(QueueId, u64, u8)> = targets
            .iter()
            .enumerate()
            .filter(|(_, (q, _))| !deleted.contains(q))
            .map(|(i, &(q, f))| (q, 1000 + i as u64, f))
            .collect();
        assert_eq!(got, want);
        for e in b.entries() {
            assert_eq!((e.ptr.pos, e.ptr.size, e.ptr.body_len, e.ptr.tag_hash), (LogPos(4096), 80, 4, 9));
        }
    }

    #[test]
    fn ten_thousand_queues_with_mixed_flags_get_their_own() {
        // QoS 0/1/2, priorities, reserved entries: every combination, over 10,000 queues in
        // a scattered order, every 13th queue deleted before the append.
        let targets: Vec<(QueueId, u8)> =
            (0..10_000u64).map(|i| (QueueId((i * 7_919) % 10_007), (i % 3) as u8 | ((i % 256) as u8 & 0xf8))).collect();
        let deleted: Vec<QueueId> = targets.iter().step_by(13).map(|&(q, _)| q).collect();
        check(&targets, &deleted);
        check(&targets, &[]);
    }

    #[test]
    fn several_ops_keep_their_own_flags_and_messages() {
        let (a, b) = (QueueId(1), QueueId(2));
        let ops = vec![
            Appended { pos: LogPos(0), size: 50, offsets: vec![(a, 0), (b, 0)] },
            Appended { pos: LogPos(50), size: 60, offsets: vec![(b, 1)] },
        ];
        let items = vec![
            MessageTargets { msg: message(b"one"), targets: vec![(a, 1), (b, 2)], tag_hash: 1 },
            MessageTargets { msg: message(b"second"), targets: vec![(a, 0x81), (b, 0x0a)], tag_hash: 2 },
        ];
        let batch = AppendedBatch::new(ops, items);
        let got: Vec<_> = batch
            .entries()
            .map(|e| (e.queue, e.offset, e.ptr.pos, e.ptr.flags, e.ptr.body_len, e.ptr.tag_hash))
            .collect();
        assert_eq!(
            got,
            vec![(a, 0, LogPos(0), 1, 3, 1), (b, 0, LogPos(0), 2, 3, 1), (b, 1, LogPos(50), 0x0a, 6, 2)],
            "queue a was deleted before the second op"
        );
        assert_eq!(batch.queues().collect::<Vec<_>>(), vec![a, b, b]);
        assert!(!batch.is_empty());
    }

    proptest! {
        /// Any order of queues (repeats allowed), any flags, any set of them deleted.
        #[test]
        fn pointers_carry_their_targets_flags(
            targets in proptest::collection::vec((0u64..64, any::<u8>()), 0..400),
            deleted in proptest::collection::vec(0u64..64, 0..16),
        ) {
            let targets: Vec<(QueueId, u8)> = targets.into_iter().map(|(q, f)| (QueueId(q), f)).collect();
            let deleted: Vec<QueueId> = deleted.into_iter().map(QueueId).collect();
            check(&targets, &deleted);
        }
    }
}
