//! The body of an effects record: the sled changes of one group commit, resolved to blind
//! writes (a key set to a value, or removed), so that applying them again to a store that
//! already holds some or all of them leaves the same state. Recovery applies the effects
//! records written after the last checkpoint in log order (see `recovery::replay`).
//!
//! Encoding: `version: u8` (1), then per change `tree: u8 | key_len: varint | key |
//! kind: u8` (0 removed, 1 set) and for a set `value_len: varint | value`. `tree` is the
//! index in [`crate::db::Db::trees`]; varints are LEB128.

use crate::overlay::Overlay;

/// Version byte of the encoding.
const VERSION: u8 = 1;

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

/// Encodes the changes of `overlays` (in tree order) into `buf` (cleared first); false
/// when there is none.
pub(crate) fn encode<'a>(buf: &mut Vec<u8>, overlays: impl IntoIterator<Item = &'a Overlay>) -> bool {
    buf.clear();
    buf.push(VERSION);
    for (tree, overlay) in overlays.into_iter().enumerate() {
        for (key, value) in overlay.changes() {
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
    }
    buf.len() > 1
}

/// Hands every change of an encoded body to `f`, in order; `None` if the body is
/// malformed (then the changes before the fault were handed over).
pub(crate) fn decode(mut body: &[u8], trees: usize, mut f: impl FnMut(Change<'_>)) -> Option<()> {
    let (&version, rest) = body.split_first()?;
    if version != VERSION {
        return None;
    }
    body = rest;
    while let Some((&tree, rest)) = body.split_first() {
        body = rest;
        if tree as usize >= trees {
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
        f((tree as usize, key, value));
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
        let mut buf = Vec::new();
        assert!(encode(&mut buf, [&a, &b, &c]));
        let mut seen = Vec::new();
        decode(&buf, 3, |(t, k, v)| seen.push((t, k.to_vec(), v.map(<[u8]>::to_vec)))).unwrap();
        assert_eq!(
            seen,
            vec![(0, b"k0".to_vec(), None), (0, b"k1".to_vec(), Some(vec![7u8; 300])), (2, vec![], Some(vec![]))]
        );
        assert!(!encode(&mut buf, [&b]));
        for cut in 1..buf.len() {
            let _ = decode(&buf[..cut], 3, |_| {});
        }
        assert!(encode(&mut buf, [&a, &b, &c]));
        assert_eq!(decode(&buf, 2, |_| {}), None, "a tree this build does not have");
        let n = buf.len();
        assert_eq!(decode(&buf[..n - 1], 3, |_| {}), None, "a cut value");
        assert_eq!(decode(&[2], 3, |_| {}), None, "another version");
    }
}
