//! The body of an effects record: the sled changes of one group commit, resolved to blind
//! writes (a key set to a value, or removed), so that applying them again to a store that
//! already holds some or all of them leaves the same state. Recovery applies the effects
//! records written after the last checkpoint in log order (see `recovery::replay`).
//!
//! Encoding (version 2, written since layout 4): `version: u8` (2), then items. An item
//! starts with a tag byte:
//! - below [`RUN_SETS`]: one change of the tree with that number (0: the consume queues',
//!   1 on: [`crate::db::Db::trees`] in order), `key_len: varint | key | kind: u8` (0
//!   removed, 1 set) and for a set `value_len: varint | value`; tree 0's changes are
//!   written only as runs (below), a single one is still read;
//! - [`RUN_REMOVALS`]: `queue: varint | first: varint | count: varint`: the consume-queue
//!   entries `first .. first + count` of `queue` settled (tree 0, keys `queue u64 | offset
//!   u64`);
//! - [`RUN_SETS`]: `queue | first | count` as above, then per entry its [`Pointer`] as
//!   `pos delta: zigzag varint` (from the previous entry's position in the record, the
//!   first from 0) `| size: varint | body length: varint | tag hash: varint | flags: u8`.
//!
//! A message costs its consume-queue entry about 7 bytes here instead of 41, and its
//! acknowledgement a share of one run instead of 19. Varints are LEB128.
//!
//! Version 1 (development layouts 2 and 3) has only the first kind of item. It is still
//! read: earlier builds upgraded a layout-3 directory by stamping it 4, so a layout-4
//! directory may hold version-1 records, and replays them if that upgrade's first open
//! stopped before its checkpoint. Nothing writes it any more.

use crate::codec;
use crate::overlay::Overlay;
use crate::queue_changes::QueueChanges;
use crate::types::{LogPos, Pointer};

/// Version byte of the encoding written.
const VERSION: u8 = 2;
/// Version byte of the encoding of layouts 2 and 3 (single changes only), still read.
const VERSION_1: u8 = 1;
/// Item tag: a run of consume-queue settlements.
const RUN_REMOVALS: u8 = 0xfe;
/// Item tag: a run of consume-queue entries added.
const RUN_SETS: u8 = 0xff;

/// One decoded change: tree index, key, new value (`None`: removed).
pub(crate) type Change<'a> = (usize, &'a [u8], Option<&'a [u8]>);

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn take_varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn take_bytes<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
    let n = usize::try_from(take_varint(b)?).ok()?;
    if n > b.len() {
        return None;
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Some(head)
}

/// Encodes the consume-queue changes (tree 0) and the changes of `overlays` (trees 1 on,
/// in order) into `buf` (cleared first); false when there is none.
pub(crate) fn encode<'a>(
    buf: &mut Vec<u8>,
    queue: &QueueChanges,
    overlays: impl IntoIterator<Item = &'a Overlay>,
) -> bool {
    buf.clear();
    buf.push(VERSION);
    encode_queue_changes(buf, queue);
    for (i, overlay) in overlays.into_iter().enumerate() {
        for (key, value) in overlay.changes() {
            put_change(buf, i + 1, key, value.as_deref());
        }
    }
    buf.len() > 1
}

fn put_change(buf: &mut Vec<u8>, tree: usize, key: &[u8], value: Option<&[u8]>) {
    buf.push(tree as u8);
    put_varint(buf, key.len() as u64);
    buf.extend_from_slice(key);
    match value {
        None => buf.push(0),
        Some(v) => {
            buf.push(1);
            put_varint(buf, v.len() as u64);
            buf.extend_from_slice(v);
        }
    }
}

/// The consume-queue changes as runs of consecutive offsets of one queue and one kind.
fn encode_queue_changes(buf: &mut Vec<u8>, changes: &QueueChanges) {
    for (queue, mut list) in changes.queues() {
        while let Some(&(first, entry)) = list.first() {
            let n = list
                .iter()
                .enumerate()
                .take_while(|&(i, &(o, e))| o == first + i as u64 && e.is_some() == entry.is_some())
                .count();
            buf.push(if entry.is_some() { RUN_SETS } else { RUN_REMOVALS });
            put_varint(buf, queue);
            put_varint(buf, first);
            put_varint(buf, n as u64);
            let mut last = 0u64;
            for p in list[..n].iter().filter_map(|&(_, e)| e) {
                put_varint(buf, zigzag(p.pos.0.wrapping_sub(last) as i64));
                last = p.pos.0;
                put_varint(buf, u64::from(p.size));
                put_varint(buf, u64::from(p.body_len));
                put_varint(buf, u64::from(p.tag_hash));
                buf.push(p.flags);
            }
            list = &list[n..];
        }
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn take_u32(b: &mut &[u8]) -> Option<u32> {
    u32::try_from(take_varint(b)?).ok()
}

/// Hands every change of an encoded body (either version) to `f`, in order; `None` if the
/// body is malformed (then the changes before the fault were handed over).
pub(crate) fn decode(mut body: &[u8], trees: usize, mut f: impl FnMut(Change<'_>)) -> Option<()> {
    let (&version, rest) = body.split_first()?;
    if version != VERSION && version != VERSION_1 {
        return None;
    }
    body = rest;
    while let Some((&tag, rest)) = body.split_first() {
        body = rest;
        if version == VERSION && (tag == RUN_SETS || tag == RUN_REMOVALS) {
            let queue = take_varint(&mut body)?;
            let first = take_varint(&mut body)?;
            let count = take_varint(&mut body)?;
            let mut pos = 0u64;
            for i in 0..count {
                let key = codec::queue_key(queue, first.checked_add(i)?);
                if tag == RUN_REMOVALS {
                    f((0, &key, None));
                    continue;
                }
                pos = pos.wrapping_add(unzigzag(take_varint(&mut body)?) as u64);
                let (size, body_len, tag_hash) = (take_u32(&mut body)?, take_u32(&mut body)?, take_u32(&mut body)?);
                let (&flags, rest) = body.split_first()?;
                body = rest;
                let value = codec::encode_pointer(&Pointer { pos: LogPos(pos), size, body_len, tag_hash, flags });
                f((0, &key, Some(&value)));
            }
            continue;
        }
        if tag as usize >= trees {
            return None;
        }
        let key = take_bytes(&mut body)?;
        let (&kind, rest) = body.split_first()?;
        body = rest;
        let value = match kind {
            0 => None,
            1 => Some(take_bytes(&mut body)?),
            _ => return None,
        };
        f((tag as usize, key, value));
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_malformed() {
        let mut a = Overlay::default();
        a.insert(&b"k1"[..], &vec![7u8; 300][..]);
        a.remove(&b"k0"[..]);
        let b = Overlay::default();
        let mut c = Overlay::default();
        c.insert(&b""[..], &b""[..]);
        let none = QueueChanges::default();
        let mut buf = Vec::new();
        assert!(encode(&mut buf, &none, [&a, &b, &c]));
        let mut seen = Vec::new();
        decode(&buf, 4, |(t, k, v)| seen.push((t, k.to_vec(), v.map(<[u8]>::to_vec)))).unwrap();
        assert_eq!(
            seen,
            vec![(1, b"k0".to_vec(), None), (1, b"k1".to_vec(), Some(vec![7u8; 300])), (3, vec![], Some(vec![]))]
        );
        assert!(!encode(&mut buf, &none, [&b]));
        for cut in 1..buf.len() {
            let _ = decode(&buf[..cut], 4, |_| {});
        }
        assert!(encode(&mut buf, &none, [&a, &b, &c]));
        assert_eq!(decode(&buf, 3, |_| {}), None, "a tree this build does not have");
        let n = buf.len();
        assert_eq!(decode(&buf[..n - 1], 4, |_| {}), None, "a cut value");
        assert_eq!(decode(&[3], 4, |_| {}), None, "another version");
    }

    fn pointer(pos: u64, tag_hash: u32) -> Pointer {
        Pointer { pos: LogPos(pos), size: 130, body_len: 64, tag_hash, flags: 1 }
    }

    fn decoded(buf: &[u8]) -> Vec<(usize, Vec<u8>, Option<Vec<u8>>)> {
        let mut seen = Vec::new();
        decode(buf, 3, |(t, k, v)| seen.push((t, k.to_vec(), v.map(<[u8]>::to_vec)))).unwrap();
        seen
    }

    #[test]
    fn queue_changes_go_as_runs_and_come_back_as_changes() {
        let mut queue = QueueChanges::default();
        // Queue 7: entries 10..14 added (positions rising, then one older record moved in),
        // 3..6 settled, 8 settled alone; queue 9: 0..2 added, one with a tag.
        let positions = [1_000_000u64, 1_000_130, 1_000_260, 40, 1_000_390];
        for (i, pos) in positions.iter().enumerate() {
            queue.insert(7, 10 + i as u64, pointer(*pos, 0));
        }
        for off in [3, 4, 5, 8] {
            queue.remove(7, off);
        }
        queue.insert(9, 0, pointer(u64::MAX - 5, 0xdead_beef));
        queue.insert(9, 1, pointer(0, 0));
        let mut other = Overlay::default();
        other.insert(&b"session"[..], &b"state"[..]);
        let mut buf = Vec::new();
        assert!(encode(&mut buf, &queue, [&other]));
        let expected: Vec<_> = queue
            .take()
            .into_changes()
            .map(|(q, o, e)| (0, codec::queue_key(q, o).to_vec(), e.map(|p| codec::encode_pointer(&p).to_vec())))
            .chain([(1, b"session".to_vec(), Some(b"state".to_vec()))])
            .collect();
        assert_eq!(decoded(&buf), expected);
        // 11 entry changes: 5 + 2 added at 7-8 bytes (the first of a run more), 4 settled in
        // two runs, instead of 41 and 19 bytes each.
        assert!(buf.len() < 100, "{} bytes", buf.len());
        for cut in 1..buf.len() {
            let _ = decode(&buf[..cut], 3, |_| {});
        }
        assert_eq!(decode(&buf[..buf.len() - 12], 3, |_| {}), None, "a cut item");
    }

    #[test]
    fn version_1_bodies_are_still_read() {
        // Layout 3 wrote every change singly: tree, key, kind, value.
        let key = codec::queue_key(7, 10);
        let value = codec::encode_pointer(&pointer(500, 0));
        let mut v1 = vec![VERSION_1];
        put_change(&mut v1, 0, &key, Some(&value));
        put_change(&mut v1, 0, &codec::queue_key(7, 3), None);
        put_change(&mut v1, 2, b"k", Some(b"v"));
        assert_eq!(
            decoded(&v1),
            vec![
                (0, key.to_vec(), Some(value.to_vec())),
                (0, codec::queue_key(7, 3).to_vec(), None),
                (2, b"k".to_vec(), Some(b"v".to_vec()))
            ]
        );
        // A run tag is no item of version 1.
        assert_eq!(decode(&[VERSION_1, RUN_SETS, 7, 0, 1], 3, |_| {}), None);
    }
}
