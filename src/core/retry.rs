//! Retry timers' targets and retry records: how they are written and read back. A queue
//! entry waiting for its delayed retry has a timer in the journal's timer index and a retry
//! record in the `kv:retry` keyspace. When the timer fires (the [scheduler] fires it), the
//! entry's queue owner makes it deliverable again ([`ShardCmd::RetryDue`]). This module
//! holds the formats (and marks a new data directory, [`mark_watermarks_complete`]); it
//! uses no other part of the core but the blocking pool, so the queue owners, start-up and
//! the broker share it without depending on each other.
//!
//! # Timer targets
//!
//! A timer's target bytes say what firing it does. A delayed publish (the original kind)
//! stores its virtual host's name, which is UTF-8; a retry timer starts with the byte
//! `0xFF`, which never starts (or occurs in) UTF-8, followed by `1` (the kind), the queue
//! id and the entry's offset (u64 big-endian each). Old data directories therefore keep
//! their meaning.
//!
//! # Retry records
//!
//! Key: queue id, offset (u64 BE each); value: due ms (u64 BE), deliveries so far (u32 BE).
//! The record lives as long as the entry, so a restart knows which entries still wait
//! (due in the future: not delivered before it, and their timer is added again in case
//! it was lost) and how often every retried entry was delivered.
//!
//! # Delivery watermark
//!
//! Key: queue id (u64 BE) then `w`; value: one past the highest offset ever delivered
//! (u64 BE). Entries below it that are still there after a restart may have been
//! delivered: they go out as redeliveries (AMQP `redelivered`, MQTT DUP); entries above
//! it were never sent and go out as first deliveries.
//!
//! Key `0xFF "watermarks"` (value empty): written when the data directory is new, so every
//! queue in it has stored its watermark since it was created, and a queue without one
//! has delivered nothing. Without the key (a directory from before watermarks existed) a
//! queue without a watermark counts every entry as possibly delivered.
//!
//! [scheduler]: super::scheduler
//! [`ShardCmd::RetryDue`]: super::shards::ShardCmd::RetryDue

use bytes::Bytes;
use ferrymq_storage::{Op, QueueId};

/// First byte of every non-vhost timer target (never valid UTF-8).
const TARGET_TAG: u8 = 0xFF;
/// Kind byte of a retry timer.
const KIND_RETRY: u8 = 1;

/// The timer target of a retry of entry `offset` of `queue`.
pub(crate) fn target(queue: QueueId, offset: u64) -> Bytes {
    let mut t = Vec::with_capacity(18);
    t.extend_from_slice(&[TARGET_TAG, KIND_RETRY]);
    t.extend_from_slice(&queue.0.to_be_bytes());
    t.extend_from_slice(&offset.to_be_bytes());
    Bytes::from(t)
}

/// True when a timer target is not a delayed publish's vhost name.
pub(crate) fn is_tagged(target: &[u8]) -> bool {
    target.first() == Some(&TARGET_TAG)
}

/// Decodes a retry timer target into (queue, offset).
pub(crate) fn decode_target(target: &[u8]) -> Option<(QueueId, u64)> {
    if target.len() != 18 || target[0] != TARGET_TAG || target[1] != KIND_RETRY {
        return None;
    }
    let queue = u64::from_be_bytes(target[2..10].try_into().ok()?);
    let offset = u64::from_be_bytes(target[10..18].try_into().ok()?);
    Some((QueueId(queue), offset))
}

/// Key of the retry record of entry `offset` of `queue`.
pub(crate) fn record_key(queue: QueueId, offset: u64) -> Bytes {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&queue.0.to_be_bytes());
    k.extend_from_slice(&offset.to_be_bytes());
    Bytes::from(k)
}

/// Prefix of every retry record of `queue`.
pub(crate) fn record_prefix(queue: QueueId) -> Bytes {
    Bytes::copy_from_slice(&queue.0.to_be_bytes())
}

/// Key of a queue's delivery watermark in the retry keyspace: every entry below it may
/// have been delivered (u64 BE value). Nine bytes, so it never reads as a retry record.
pub(crate) fn watermark_key(queue: QueueId) -> Bytes {
    let mut k = Vec::with_capacity(9);
    k.extend_from_slice(&queue.0.to_be_bytes());
    k.push(b'w');
    Bytes::from(k)
}

/// Key of the marker that every queue of the directory stores its delivery watermark
/// (see the module doc); eleven bytes, so it is neither a record nor a watermark.
pub(crate) const WATERMARKS_COMPLETE: &[u8] = b"\xffwatermarks";

/// Marks a new data directory (an empty commit log) as one whose queues store their
/// delivery watermarks from the start ([`WATERMARKS_COMPLETE`]): a queue that never
/// delivered then sends its entries as first deliveries after a restart, or when its first
/// load comes after its first append. Start-up calls it once the journal is open; the
/// sled read and write run on the blocking pool.
pub(crate) async fn mark_watermarks_complete(
    journal: &ferrymq_storage::Journal,
) -> Result<(), ferrymq_storage::JournalError> {
    use ferrymq_storage::{JournalError, Space};
    let journal = journal.clone();
    super::blocking::spawn(move || {
        if journal.stats().log_end > 0 || journal.get(Space::Retry, WATERMARKS_COMPLETE)?.is_some() {
            return Ok(());
        }
        let key = Bytes::from_static(WATERMARKS_COMPLETE);
        journal.write_blocking(vec![Op::Put { space: Space::Retry, key, value: Bytes::new() }]).map(drop)
    })
    .await
    .map_err(|e| JournalError::Io(format!("marking the data directory failed: {e}")))?
}

/// Value of a retry record.
pub(crate) fn encode_record(due_ms: u64, deliveries: u32) -> Bytes {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&due_ms.to_be_bytes());
    v.extend_from_slice(&deliveries.to_be_bytes());
    Bytes::from(v)
}

/// Decodes a retry record (key and value) into (offset, due ms, deliveries).
pub(crate) fn decode_record(key: &[u8], value: &[u8]) -> Option<(u64, u64, u32)> {
    if key.len() != 16 || value.len() != 12 {
        return None;
    }
    let offset = u64::from_be_bytes(key[8..16].try_into().ok()?);
    let due = u64::from_be_bytes(value[..8].try_into().ok()?);
    let deliveries = u32::from_be_bytes(value[8..12].try_into().ok()?);
    Some((offset, due, deliveries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_records_round_trip() {
        let t = target(QueueId(7), 42);
        assert!(is_tagged(&t));
        assert!(std::str::from_utf8(&t).is_err(), "never mistaken for a vhost name");
        assert_eq!(decode_target(&t), Some((QueueId(7), 42)));
        assert_eq!(decode_target(b"/"), None);
        assert!(!is_tagged(b"/") && !is_tagged(b""));
        let k = record_key(QueueId(7), 42);
        assert!(k.starts_with(&record_prefix(QueueId(7))));
        assert_eq!(decode_record(&k, &encode_record(1234, 3)), Some((42, 1234, 3)));
        assert_eq!(decode_record(&k, b"short"), None);
    }
}
