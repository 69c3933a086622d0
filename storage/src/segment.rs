//! One commit-log segment file: its name, the record framing, positional reads of one
//! record and the recovery scan that finds the end of the valid records.
//!
//! A record is `len: u32 BE | crc32: u32 BE | header_len: u32 BE | header | body`, where
//! `len` counts everything after the crc and the crc covers everything after itself.
//! Nothing here trusts the bytes on disk: every length is bounds-checked before use.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::{JournalError, Record};

/// Bytes of framing in front of the header: `len`, `crc32`, `header_len`.
pub(crate) const RECORD_OVERHEAD: u64 = 12;

/// Set in `header_len` of an **effects record** (the sled changes of one group commit, see
/// `effects`): it has no header, its body is the encoded changes, and nothing points at it
/// (reading it as a message fails as corrupt). Message records never set it: a header is
/// shorter than 2 GiB.
pub(crate) const EFFECTS_FLAG: u32 = 1 << 31;

/// The end marker written after the last record of a closed segment: a zero `len` (the
/// end of the used part) followed by a magic, so that recovery can tell a cleanly closed
/// segment from a torn one without scanning it.
pub(crate) const END_MARKER: [u8; 12] = *b"\0\0\0\0FerryEnd";

/// Bytes read by the first `pread` of [`Segment::read_record`]; a record that fits is read
/// with a single system call.
const FIRST_READ: usize = 16 * 1024;

/// Buffer size of the recovery scan.
const SCAN_BUFFER: usize = 1 << 20;

/// File name of the segment starting at `base`: 20 zero-padded digits and `.seg`.
pub(crate) fn file_name(base: u64) -> String {
    format!("{base:020}.seg")
}

/// Parses a segment file name back into its base position.
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// On-disk size of a record with these parts, or `None` if it does not fit the `u32`
/// framing.
pub(crate) fn record_size(header_len: usize, body_len: usize) -> Option<u32> {
    let size = (header_len as u64).checked_add(body_len as u64)?.checked_add(RECORD_OVERHEAD)?;
    u32::try_from(size).ok()
}

/// Appends the framed record to `buf` and returns its on-disk size. The caller has checked
/// the size with [`record_size`].
pub(crate) fn encode_record(buf: &mut Vec<u8>, header: &[u8], body: &[u8]) -> u32 {
    encode_framed(buf, header.len() as u32, header, body)
}

/// Appends an effects record ([`EFFECTS_FLAG`]) whose body is `payload`; returns its size.
pub(crate) fn encode_effects(buf: &mut Vec<u8>, payload: &[u8]) -> u32 {
    encode_framed(buf, EFFECTS_FLAG, b"", payload)
}

/// Appends a **padding record** of exactly `size` bytes (from [`RECORD_OVERHEAD`] to a
/// page plus it): no header and a body of zeros. Nothing points at it and replay skips it,
/// as a message record nobody refers to; it only fills a segment up to a page boundary
/// (see `LogWriter::pad_to_page`).
pub(crate) fn encode_padding(buf: &mut Vec<u8>, size: usize) {
    const ZEROS: [u8; PAGE as usize] = [0; PAGE as usize];
    encode_framed(buf, 0, b"", &ZEROS[..size - RECORD_OVERHEAD as usize]);
}

/// The page size the commit log pads synced writes to (the page cache's unit: a partly
/// written page is written to the device again by every sync that covers it).
pub(crate) const PAGE: u64 = 4096;

fn encode_framed(buf: &mut Vec<u8>, header_word: u32, header: &[u8], body: &[u8]) -> u32 {
    let start = buf.len();
    let len = 4 + header.len() + body.len();
    buf.reserve(8 + len);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&header_word.to_be_bytes());
    buf.extend_from_slice(header);
    buf.extend_from_slice(body);
    let crc = crc32fast::hash(&buf[start + 8..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
    (8 + len) as u32
}

/// Splits a complete framed record (exactly `8 + len` bytes) into header and body after
/// checking the crc and the header length. `None` if anything does not add up.
fn decode_record(bytes: Bytes) -> Option<Record> {
    if bytes.len() < RECORD_OVERHEAD as usize {
        return None;
    }
    let len = be_u32(&bytes[0..4]) as usize;
    if len + 8 != bytes.len() {
        return None;
    }
    let crc = be_u32(&bytes[4..8]);
    if crc32fast::hash(&bytes[8..]) != crc {
        return None;
    }
    let header_len = be_u32(&bytes[8..12]) as usize;
    let header_end = 12usize.checked_add(header_len)?;
    if header_end > bytes.len() {
        return None;
    }
    Some(Record { header: bytes.slice(12..header_end), body: bytes.slice(header_end..) })
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

thread_local! {
    /// Scratch buffer of the first read, reused so small reads allocate exactly once.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A segment file of the commit log. `len` is the published end of the valid records
/// (bytes from the start of the file); readers never look past it.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Log position of the first byte.
    pub(crate) base: u64,
    /// Path of the file.
    pub(crate) path: PathBuf,
    /// Bytes of valid, written records.
    len: AtomicU64,
    /// Shared read handle, opened lazily (and closed again by the log to bound fds).
    pub(crate) file: Mutex<Option<Arc<File>>>,
    /// Logical time of the last read, for choosing which handles to close.
    pub(crate) last_use: AtomicU64,
}

impl Segment {
    /// A segment of `len` valid bytes whose handle is not open yet.
    pub(crate) fn new(dir: &Path, base: u64, len: u64) -> Segment {
        Segment {
            base,
            path: dir.join(file_name(base)),
            len: AtomicU64::new(len),
            file: Mutex::new(None),
            last_use: AtomicU64::new(0),
        }
    }

    /// Bytes of valid records.
    pub(crate) fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// Publishes a new end of the valid records (writer only).
    pub(crate) fn set_len(&self, len: u64) {
        self.len.store(len, Ordering::Release);
    }

    /// Reads and verifies the record at log position `pos` through `file`.
    pub(crate) fn read_record(&self, file: &File, pos: u64) -> Result<Record, JournalError> {
        let used = self.len();
        let off = match pos.checked_sub(self.base) {
            Some(off) if off < used => off,
            _ => return Err(JournalError::NotFound(pos)),
        };
        let avail = used - off;
        if avail < RECORD_OVERHEAD {
            return Err(JournalError::Corrupt(pos));
        }
        let first = avail.min(FIRST_READ as u64) as usize;
        let bytes = SCRATCH.with(|scratch| -> Result<Bytes, JournalError> {
            let mut scratch = scratch.borrow_mut();
            scratch.resize(FIRST_READ, 0);
            read_exact_at(file, &mut scratch[..first], off, pos)?;
            let len = be_u32(&scratch[0..4]) as u64;
            let total = len + 8;
            if len < 4 || total > avail {
                return Err(JournalError::Corrupt(pos));
            }
            let total = total as usize;
            if total <= first {
                return Ok(Bytes::copy_from_slice(&scratch[..total]));
            }
            let mut buf = vec![0u8; total];
            buf[..first].copy_from_slice(&scratch[..first]);
            read_exact_at(file, &mut buf[first..], off + first as u64, pos)?;
            Ok(Bytes::from(buf))
        })?;
        decode_record(bytes).ok_or(JournalError::Corrupt(pos))
    }
}

/// `read_exact_at` with the errors mapped: a short file means a corrupt record.
fn read_exact_at(file: &File, buf: &mut [u8], off: u64, pos: u64) -> Result<(), JournalError> {
    file.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            JournalError::Corrupt(pos)
        } else {
            JournalError::Io(e.to_string())
        }
    })
}

/// Whether the file of `file_len` bytes ends with [`END_MARKER`], i.e. was closed cleanly.
pub(crate) fn is_sealed(file: &File, file_len: u64) -> io::Result<bool> {
    let n = END_MARKER.len() as u64;
    if file_len < n {
        return Ok(false);
    }
    let mut tail = [0u8; END_MARKER.len()];
    file.read_exact_at(&mut tail, file_len - n)?;
    Ok(tail == END_MARKER)
}

/// Result of scanning a segment file from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scan {
    /// End of the last valid record (bytes from the start of the file).
    pub(crate) valid_end: u64,
    /// Number of valid records.
    pub(crate) records: u64,
}

/// Scans `file` record by record, checking length bounds and crc, and stops at the end
/// marker (`len == 0`), at the end of the file or at the first invalid record.
pub(crate) fn scan(file: &File) -> io::Result<Scan> {
    let file_len = file.metadata()?.len();
    let mut reader = BufReader::with_capacity(SCAN_BUFFER, file);
    reader.seek(SeekFrom::Start(0))?;
    let mut off = 0u64;
    let mut records = 0u64;
    let mut payload = Vec::new();
    loop {
        if file_len - off < RECORD_OVERHEAD {
            break;
        }
        let mut frame = [0u8; 8];
        reader.read_exact(&mut frame)?;
        let len = be_u32(&frame[0..4]) as u64;
        let crc = be_u32(&frame[4..8]);
        if len < 4 || off + 8 + len > file_len {
            break;
        }
        payload.resize(len as usize, 0);
        reader.read_exact(&mut payload)?;
        if crc32fast::hash(&payload) != crc || (be_u32(&payload[0..4]) & !EFFECTS_FLAG) as u64 > len - 4 {
            break;
        }
        off += 8 + len;
        records += 1;
    }
    Ok(Scan { valid_end: off, records })
}

/// Reads the records of `file` in `from..to` (offsets in the file; `from` is a record
/// boundary, `to` the end of the valid records) in order and hands every effects record's
/// body to `f` with its offset. Message records are skipped without reading their bodies.
/// Fails with the offset of a record that is not whole or whose crc does not match.
pub(crate) fn read_effects(
    file: &File,
    from: u64,
    to: u64,
    mut f: impl FnMut(u64, &[u8]),
) -> io::Result<Result<(), u64>> {
    let mut reader = BufReader::with_capacity(SCAN_BUFFER, file);
    reader.seek(SeekFrom::Start(from))?;
    let mut off = from;
    let mut payload = Vec::new();
    while off < to {
        if to - off < RECORD_OVERHEAD {
            return Ok(Err(off));
        }
        let mut frame = [0u8; 12];
        reader.read_exact(&mut frame)?;
        let len = be_u32(&frame[0..4]) as u64;
        let crc = be_u32(&frame[4..8]);
        let header_word = be_u32(&frame[8..12]);
        if len < 4 || off + 8 + len > to {
            return Ok(Err(off));
        }
        if header_word & EFFECTS_FLAG == 0 {
            reader.seek_relative((len - 4) as i64)?;
        } else {
            payload.resize(len as usize - 4, 0);
            reader.read_exact(&mut payload)?;
            let mut h = crc32fast::Hasher::new();
            h.update(&frame[8..12]);
            h.update(&payload);
            if h.finalize() != crc {
                return Ok(Err(off));
            }
            f(off, &payload);
        }
        off += 8 + len;
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn names_round_trip() {
        assert_eq!(file_name(134_217_728), "00000000000134217728.seg");
        assert_eq!(parse_file_name("00000000000134217728.seg"), Some(134_217_728));
        assert_eq!(parse_file_name("0000000000013421772.seg"), None);
        assert_eq!(parse_file_name("0000000000013421772x.seg"), None);
        assert_eq!(parse_file_name("00000000000134217728.log"), None);
    }

    #[test]
    fn encode_read_scan() {
        let dir = tempfile::tempdir().unwrap();
        let mut buf = Vec::new();
        let a = encode_record(&mut buf, b"h1", b"body one");
        let b = encode_record(&mut buf, b"", &vec![7u8; 40_000]);
        assert_eq!(a as usize, 12 + 2 + 8);
        let seg = Segment::new(dir.path(), 1000, buf.len() as u64);
        let mut f = File::create(&seg.path).unwrap();
        f.write_all(&buf).unwrap();
        f.write_all(&[0u8; 100]).unwrap();
        let f = File::open(&seg.path).unwrap();
        let r = seg.read_record(&f, 1000).unwrap();
        assert_eq!(&r.header[..], b"h1");
        assert_eq!(&r.body[..], b"body one");
        let r = seg.read_record(&f, 1000 + a as u64).unwrap();
        assert_eq!(r.body.len(), 40_000);
        assert!(matches!(seg.read_record(&f, 1001), Err(JournalError::Corrupt(1001))));
        assert!(matches!(seg.read_record(&f, 999), Err(JournalError::NotFound(999))));
        let end = 1000 + (a + b) as u64;
        assert!(matches!(seg.read_record(&f, end), Err(JournalError::NotFound(_))));
        let s = scan(&f).unwrap();
        assert_eq!(s, Scan { valid_end: (a + b) as u64, records: 2 });
    }

    #[test]
    fn scan_stops_at_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let mut buf = Vec::new();
        let a = encode_record(&mut buf, b"h", b"b");
        let keep = buf.len();
        encode_record(&mut buf, b"h", b"second");
        let n = buf.len();
        buf[n - 1] ^= 0xff;
        buf.extend_from_slice(&[0xff; 37]);
        let path = dir.path().join("x");
        std::fs::write(&path, &buf).unwrap();
        let s = scan(&File::open(&path).unwrap()).unwrap();
        assert_eq!(s.valid_end, keep as u64);
        assert_eq!(s.valid_end, a as u64);
        // A huge bogus length is bounded by the file length.
        std::fs::write(&path, [0xffu8; 64]).unwrap();
        assert_eq!(scan(&File::open(&path).unwrap()).unwrap().valid_end, 0);
    }
}
