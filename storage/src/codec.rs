//! Key and value encodings of the sled trees. All integers are big-endian so that byte
//! order is numeric order. Decoders return `None` on malformed input instead of panicking.

use crate::{LogPos, Pointer, Space};

/// Tree name -> queue id.
pub(crate) const TREE_QUEUE_NAMES: &str = "queue_names";
/// Tree queue id -> name (reverse of `queue_names`, used by `DeleteQueue`).
pub(crate) const TREE_QUEUE_IDS: &str = "queue_ids";
/// Tree topic -> retained record.
pub(crate) const TREE_RETAINED: &str = "retained";
/// Tree (due, pos) -> timer.
pub(crate) const TREE_TIMER: &str = "timer";
/// Tree (key hash, timestamp, pos) -> message key index entry.
pub(crate) const TREE_KEY: &str = "key";
/// Tree (pos, key hash, timestamp) -> (): the key index by position, for retention.
pub(crate) const TREE_KEY_POS: &str = "key_pos";

/// Tree of counters: per queue (`q`, id u64) next offset u64 and length u64; per segment
/// (`s`, base u64) references u64.
pub(crate) const TREE_COUNTERS: &str = "counters";
/// Name of the tree of consume-queue offsets (queue id u64 -> `cq::Offsets` encoding).
pub(crate) const TREE_SETTLED: &str = "settled";

/// The sled tree name of a keyspace.
pub(crate) fn kv_tree_name(space: Space) -> &'static str {
    match space {
        Space::Session => "kv:session",
        Space::InboundQos2 => "kv:inbound_qos2",
        Space::Meta => "kv:meta",
        Space::Retry => "kv:retry",
        Space::Cursor => "kv:cursor",
    }
}

/// Index of a keyspace in per-space arrays.
pub(crate) fn space_index(space: Space) -> usize {
    match space {
        Space::Session => 0,
        Space::InboundQos2 => 1,
        Space::Meta => 2,
        Space::Retry => 3,
        Space::Cursor => 4,
    }
}

/// Every keyspace, in [`space_index`] order.
pub(crate) const SPACES: [Space; 5] = [Space::Session, Space::InboundQos2, Space::Meta, Space::Retry, Space::Cursor];

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A big-endian u64.
pub(crate) fn encode_u64(v: u64) -> [u8; 8] {
    v.to_be_bytes()
}

/// Decodes exactly 8 bytes as a big-endian u64.
pub(crate) fn decode_u64(b: &[u8]) -> Option<u64> {
    if b.len() != 8 {
        return None;
    }
    u64_at(b, 0)
}

/// Key of a queue entry: queue id, offset.
pub(crate) fn queue_key(queue: u64, offset: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&queue.to_be_bytes());
    k[8..].copy_from_slice(&offset.to_be_bytes());
    k
}

/// Key of a queue's counters in the `counters` tree.
pub(crate) fn queue_counters_key(queue: u64) -> [u8; 9] {
    let mut k = [b'q'; 9];
    k[1..].copy_from_slice(&queue.to_be_bytes());
    k
}

/// Key of a segment's reference count in the `counters` tree.
pub(crate) fn segment_refs_key(base: u64) -> [u8; 9] {
    let mut k = [b's'; 9];
    k[1..].copy_from_slice(&base.to_be_bytes());
    k
}

/// Value of a queue's counters: next offset, length.
pub(crate) fn encode_queue_counters(next: u64, len: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&next.to_be_bytes());
    v[8..].copy_from_slice(&len.to_be_bytes());
    v
}

/// A decoded entry of the `counters` tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    /// A queue's next offset and length.
    Queue(u64, u64, u64),
    /// A segment's references.
    Segment(u64, u64),
}

/// Decodes an entry of the `counters` tree.
pub(crate) fn decode_counter(k: &[u8], v: &[u8]) -> Option<Counter> {
    if k.len() != 9 {
        return None;
    }
    let id = u64_at(k, 1)?;
    match (k[0], v.len()) {
        (b'q', 16) => Some(Counter::Queue(id, u64_at(v, 0)?, u64_at(v, 8)?)),
        (b's', 8) => Some(Counter::Segment(id, u64_at(v, 0)?)),
        _ => None,
    }
}

/// Decodes the key of a queue entry ([`queue_key`]) into (queue, offset).
pub(crate) fn decode_queue_key(k: &[u8]) -> Option<(u64, u64)> {
    if k.len() != 16 {
        return None;
    }
    Some((u64_at(k, 0)?, u64_at(k, 8)?))
}

/// Value of a queue entry: pos u64, size u32, body length u32, tag hash u32, flags u8.
pub(crate) fn encode_pointer(p: &Pointer) -> [u8; 21] {
    let mut v = [0u8; 21];
    v[..8].copy_from_slice(&p.pos.0.to_be_bytes());
    v[8..12].copy_from_slice(&p.size.to_be_bytes());
    v[12..16].copy_from_slice(&p.body_len.to_be_bytes());
    v[16..20].copy_from_slice(&p.tag_hash.to_be_bytes());
    v[20] = p.flags;
    v
}

/// Decodes a queue entry value.
pub(crate) fn decode_pointer(v: &[u8]) -> Option<Pointer> {
    if v.len() != 21 {
        return None;
    }
    Some(Pointer {
        pos: LogPos(u64_at(v, 0)?),
        size: u32_at(v, 8)?,
        body_len: u32_at(v, 12)?,
        tag_hash: u32_at(v, 16)?,
        flags: v[20],
    })
}

/// Value of a retained entry: pos u64, size u32.
pub(crate) fn encode_retained(pos: u64, size: u32) -> [u8; 12] {
    let mut v = [0u8; 12];
    v[..8].copy_from_slice(&pos.to_be_bytes());
    v[8..].copy_from_slice(&size.to_be_bytes());
    v
}

/// Decodes a retained entry value into (pos, size).
pub(crate) fn decode_retained(v: &[u8]) -> Option<(u64, u32)> {
    if v.len() != 12 {
        return None;
    }
    Some((u64_at(v, 0)?, u32_at(v, 8)?))
}

/// Key of a timer: due ms, pos.
pub(crate) fn timer_key(due_ms: u64, pos: u64) -> [u8; 16] {
    queue_key(due_ms, pos)
}

/// Decodes a timer key into (due ms, pos).
pub(crate) fn decode_timer_key(k: &[u8]) -> Option<(u64, u64)> {
    if k.len() != 16 {
        return None;
    }
    Some((u64_at(k, 0)?, u64_at(k, 8)?))
}

/// Value of a timer: size u32, then the caller's target bytes.
pub(crate) fn encode_timer_value(size: u32, target: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + target.len());
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(target);
    v
}

/// Decodes a timer value into (size, target).
pub(crate) fn decode_timer_value(v: &[u8]) -> Option<(u32, &[u8])> {
    Some((u32_at(v, 0)?, v.get(4..)?))
}

/// Stable 64-bit hash of a message key (FNV-1a): part of the on-disk format, never change it.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    crate::fnv1a(&[key])
}

/// Key of a key-index entry: key hash, timestamp ms, pos.
pub(crate) fn key_index_key(hash: u64, timestamp_ms: u64, pos: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&hash.to_be_bytes());
    k[8..16].copy_from_slice(&timestamp_ms.to_be_bytes());
    k[16..].copy_from_slice(&pos.to_be_bytes());
    k
}

/// Decodes a key-index key into (hash, timestamp ms, pos).
pub(crate) fn decode_key_index_key(k: &[u8]) -> Option<(u64, u64, u64)> {
    if k.len() != 24 {
        return None;
    }
    Some((u64_at(k, 0)?, u64_at(k, 8)?, u64_at(k, 16)?))
}

/// Key of the by-position entry of a key-index entry: pos, key hash, timestamp ms.
pub(crate) fn key_pos_key(pos: u64, hash: u64, timestamp_ms: u64) -> [u8; 24] {
    key_index_key(pos, hash, timestamp_ms)
}

/// Value of a key-index entry: record size u32, then the key itself (collisions of the
/// hash are told apart by it).
pub(crate) fn encode_key_value(size: u32, key: &[u8]) -> Vec<u8> {
    encode_timer_value(size, key)
}

/// Decodes a key-index value into (size, key).
pub(crate) fn decode_key_value(v: &[u8]) -> Option<(u32, &[u8])> {
    decode_timer_value(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let p = Pointer { pos: LogPos(1 << 40), size: 77, body_len: 12, tag_hash: 0xdead_beef, flags: 3 };
        assert_eq!(decode_pointer(&encode_pointer(&p)), Some(p));
        assert_eq!(decode_pointer(&[1, 2, 3]), None);
        assert_eq!(decode_pointer(&encode_pointer(&p)[..17]), None, "no body length: not an entry");
        assert_eq!(decode_queue_key(&queue_key(5, 9)), Some((5, 9)));
        assert_eq!(decode_queue_key(&[0; 8]), None);
        assert!(queue_key(5, u64::MAX).as_slice() < queue_key(6, 0).as_slice());
        assert!(queue_key(1, 2).as_slice() < queue_key(1, 256).as_slice());
        assert_eq!(decode_retained(&encode_retained(9, 8)), Some((9, 8)));
        assert_eq!(decode_timer_key(&timer_key(10, 20)), Some((10, 20)));
        let v = encode_timer_value(12, b"tgt");
        assert_eq!(decode_timer_value(&v), Some((12, &b"tgt"[..])));
        assert_eq!(decode_timer_value(&[0, 1]), None);
        assert_eq!(decode_u64(&encode_u64(42)), Some(42));
        assert_eq!(decode_key_index_key(&key_index_key(1, 2, 3)), Some((1, 2, 3)));
        assert_eq!(decode_key_index_key(&key_pos_key(3, 1, 2)), Some((3, 1, 2)));
        assert_eq!(decode_key_value(&encode_key_value(7, b"order-1")), Some((7, &b"order-1"[..])));
        // FNV-1a test vectors: the hash is part of the on-disk format.
        assert_eq!(key_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(decode_u64(&[1]), None);
    }
}
