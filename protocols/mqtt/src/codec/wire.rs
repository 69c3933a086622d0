//! Wire primitives: a bounds-checked reader over a frozen packet body, and a two-pass
//! [`Sink`] (count, then write) so lengths are always computed by the same code that
//! writes.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::DecodeError;

/// Largest value of a variable byte integer (and of a remaining length).
pub(crate) const VARINT_MAX: usize = 268_435_455;

/// Reads fields from one packet body; every read is bounds-checked.
pub(crate) struct Reader {
    buf: Bytes,
}

const TRUNCATED: DecodeError = DecodeError::Malformed("truncated field");

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        let v = *self.buf.first().ok_or(TRUNCATED)?;
        self.buf.advance(1);
        Ok(v)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes(b.as_ref().try_into().map_err(|_| TRUNCATED)?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes(b.as_ref().try_into().map_err(|_| TRUNCATED)?))
    }

    /// Variable byte integer, at most 4 bytes.
    pub(crate) fn varint(&mut self) -> Result<u32, DecodeError> {
        let mut value: u32 = 0;
        for i in 0..4u32 {
            let b = self.u8()?;
            value |= u32::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::Malformed("variable byte integer longer than 4 bytes"))
    }

    /// Exactly `n` bytes (zero-copy slice).
    pub(crate) fn take(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if n > self.buf.len() {
            return Err(TRUNCATED);
        }
        Ok(self.buf.split_to(n))
    }

    /// Everything that is left.
    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    /// Two-byte length followed by that many bytes.
    pub(crate) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    /// UTF-8 encoded string: valid UTF-8 and no U+0000 (MQTT-1.5.4-1, MQTT-1.5.4-2).
    pub(crate) fn string(&mut self) -> Result<String, DecodeError> {
        let n = usize::from(self.u16()?);
        let s = utf8(self.buf.get(..n).ok_or(TRUNCATED)?)?.to_owned();
        self.buf.advance(n);
        Ok(s)
    }
}

/// Checks the MQTT rules for a UTF-8 encoded string.
pub(crate) fn utf8(b: &[u8]) -> Result<&str, DecodeError> {
    let s = std::str::from_utf8(b).map_err(|_| DecodeError::Malformed("invalid UTF-8 string"))?;
    if b.contains(&0) {
        return Err(DecodeError::Malformed("U+0000 in UTF-8 string"));
    }
    Ok(s)
}

/// Number of bytes of the variable byte integer encoding of `v`.
pub(crate) fn varint_len(v: usize) -> usize {
    match v {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Destination of an encoding pass; [`Counter`] measures, [`Writer`] writes.
pub(crate) trait Sink {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    /// Variable byte integer; values above [`VARINT_MAX`] mark a [`Counter`] as overflowed.
    fn put_varint(&mut self, v: usize);
    fn put_raw(&mut self, b: &[u8]);
    /// Two-byte length prefix and bytes; longer than 65,535 marks a [`Counter`] overflowed.
    fn put_binary(&mut self, b: &[u8]);
    fn put_str(&mut self, s: &str) {
        self.put_binary(s.as_bytes());
    }
}

/// Counts bytes and notices values that cannot be encoded.
#[derive(Default)]
pub(crate) struct Counter {
    pub(crate) len: usize,
    pub(crate) overflow: bool,
}

impl Sink for Counter {
    fn put_u8(&mut self, _: u8) {
        self.len = self.len.saturating_add(1);
    }
    fn put_u16(&mut self, _: u16) {
        self.len = self.len.saturating_add(2);
    }
    fn put_u32(&mut self, _: u32) {
        self.len = self.len.saturating_add(4);
    }
    fn put_varint(&mut self, v: usize) {
        if v > VARINT_MAX {
            self.overflow = true;
        }
        self.len = self.len.saturating_add(varint_len(v));
    }
    fn put_raw(&mut self, b: &[u8]) {
        self.len = self.len.saturating_add(b.len());
    }
    fn put_binary(&mut self, b: &[u8]) {
        if b.len() > usize::from(u16::MAX) {
            self.overflow = true;
        }
        self.len = self.len.saturating_add(2).saturating_add(b.len());
    }
}

/// Writes into a buffer. Only used after a [`Counter`] pass found no overflow.
pub(crate) struct Writer<'a>(pub(crate) &'a mut BytesMut);

impl Sink for Writer<'_> {
    fn put_u8(&mut self, v: u8) {
        self.0.put_u8(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.0.put_u16(v);
    }
    fn put_u32(&mut self, v: u32) {
        self.0.put_u32(v);
    }
    fn put_varint(&mut self, v: usize) {
        let mut x = v.min(VARINT_MAX);
        loop {
            let mut byte = (x % 128) as u8;
            x /= 128;
            if x > 0 {
                byte |= 0x80;
            }
            self.0.put_u8(byte);
            if x == 0 {
                break;
            }
        }
    }
    fn put_raw(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    fn put_binary(&mut self, b: &[u8]) {
        let n = u16::try_from(b.len()).unwrap_or(u16::MAX);
        self.0.put_u16(n);
        self.0.extend_from_slice(b.get(..usize::from(n)).unwrap_or(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc_varint(v: usize) -> Vec<u8> {
        let mut b = BytesMut::new();
        Writer(&mut b).put_varint(v);
        b.to_vec()
    }

    #[test]
    fn varint_round_trip() {
        for v in [0usize, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, VARINT_MAX] {
            let e = enc_varint(v);
            assert_eq!(e.len(), varint_len(v));
            let mut r = Reader::new(Bytes::from(e));
            assert_eq!(r.varint().unwrap() as usize, v);
            assert!(r.is_empty());
        }
        let mut r = Reader::new(Bytes::from_static(&[0xFF, 0xFF, 0xFF, 0xFF, 0x01]));
        assert!(matches!(r.varint(), Err(DecodeError::Malformed(_))));
        let mut r = Reader::new(Bytes::from_static(&[0xFF]));
        assert!(matches!(r.varint(), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn strings() {
        let mut r = Reader::new(Bytes::from_static(&[0, 3, b'a', 0, b'b']));
        assert_eq!(r.string(), Err(DecodeError::Malformed("U+0000 in UTF-8 string")));
        let mut r = Reader::new(Bytes::from_static(&[0, 2, 0xC3, 0x28]));
        assert_eq!(r.string(), Err(DecodeError::Malformed("invalid UTF-8 string")));
        let mut r = Reader::new(Bytes::from_static(&[0, 5, b'a']));
        assert!(r.string().is_err());
        let mut r = Reader::new(Bytes::from_static(&[0, 2, 0xC3, 0xBC]));
        assert_eq!(r.string().unwrap(), "ü");
    }

    #[test]
    fn counter_overflow() {
        let mut c = Counter::default();
        c.put_binary(&vec![0u8; 70_000]);
        assert!(c.overflow);
        let mut c = Counter::default();
        c.put_varint(VARINT_MAX + 1);
        assert!(c.overflow);
    }
}
