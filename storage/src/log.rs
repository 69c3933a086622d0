//! The commit log: the ordered set of segment files, global positions, reads, and (in
//! [`LogWriter`], owned by the writer thread) appends, rollover and fsync.
//!
//! Readers look a segment up in a shared map and `pread` it through a shared handle, so
//! they never disturb the writer. Handles of closed segments are opened lazily and the
//! least recently used ones are closed again when more than [`MAX_OPEN_FILES`] are open.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::segment::{self, Segment};
use crate::{JournalError, Record};

/// Open read handles of segments kept at most (the active segment's is not counted out).
const MAX_OPEN_FILES: usize = 256;

/// Assembled bytes written out early when a batch grows beyond this (bounds memory).
const WRITE_CHUNK: usize = 4 << 20;

/// Information about a closed segment, for retention.
#[derive(Debug, Clone)]
pub(crate) struct ClosedSegment {
    /// Global position of its first record; also its file name (`{base:020}.seg`).
    pub(crate) base: u64,
    /// Bytes of records.
    pub(crate) len: u64,
    /// Path of the segment file; retention reads its modification time.
    pub(crate) path: PathBuf,
}

/// The shared, read side of the commit log.
#[derive(Debug)]
pub(crate) struct Log {
    dir: PathBuf,
    segment_size: u64,
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    /// Next position to be written (published after each write).
    end: AtomicU64,
    open_files: AtomicUsize,
    clock: AtomicU64,
}

impl Log {
    /// The log in `dir` made of recovered segments `(base, valid len)` in base order.
    /// If there are none, an empty segment at 0 is created.
    pub(crate) fn open(
        dir: &Path,
        segment_size: u64,
        segments: &[(u64, u64)],
    ) -> Result<(Log, LogWriter), JournalError> {
        let mut map = BTreeMap::new();
        for &(base, len) in segments {
            map.insert(base, Arc::new(Segment::new(dir, base, len)));
        }
        let log = Log {
            dir: dir.to_path_buf(),
            segment_size: segment_size.max(1),
            segments: RwLock::new(map),
            end: AtomicU64::new(0),
            open_files: AtomicUsize::new(0),
            clock: AtomicU64::new(0),
        };
        let last = log.segments.read().values().next_back().cloned();
        let writer = match last {
            Some(active) => {
                let file = Arc::new(OpenOptions::new().read(true).write(true).open(&active.path).map_err(io_err)?);
                log.install_handle(&active, file.clone());
                let written = active.len();
                log.end.store(active.base + written, Ordering::Release);
                LogWriter::new(active, file, written)
            }
            None => {
                let (active, file) = log.create_segment(0).map_err(io_err)?;
                LogWriter::new(active, file, 0)
            }
        };
        Ok((log, writer))
    }

    /// Next position to be written.
    pub(crate) fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    /// Number of live segments and their total bytes.
    pub(crate) fn size(&self) -> (u64, u64) {
        let segs = self.segments.read();
        (segs.len() as u64, segs.values().map(|s| s.len()).sum())
    }

    /// The segment holding `pos` (by base; `pos` may still be past its end).
    fn segment_of(&self, pos: u64) -> Option<Arc<Segment>> {
        self.segments.read().range(..=pos).next_back().map(|(_, s)| s.clone())
    }

    /// Base of the segment whose written records contain `pos`.
    pub(crate) fn locate(&self, pos: u64) -> Option<u64> {
        self.segment_of(pos).filter(|s| pos < s.base + s.len()).map(|s| s.base)
    }

    /// Whether `pos..pos + size` lies inside the written records of a live segment.
    pub(crate) fn contains(&self, pos: u64, size: u32) -> bool {
        self.segment_of(pos).is_some_and(|s| pos.checked_add(size as u64).is_some_and(|e| e <= s.base + s.len()))
    }

    /// Reads and verifies the record at `pos`.
    pub(crate) fn read(&self, pos: u64) -> Result<Record, JournalError> {
        let seg = self.segment_of(pos).ok_or(JournalError::NotFound(pos))?;
        if pos >= seg.base + seg.len() {
            return Err(JournalError::NotFound(pos));
        }
        let file = self.handle(&seg, pos)?;
        seg.read_record(&file, pos)
    }

    /// Hands the body of every effects record at `from` or later to `f(pos, body)`, in log
    /// order (`from` is a record boundary or in a gap). `Ok(Err(pos))`: the record at `pos`
    /// does not read back whole; nothing after it was handed over.
    pub(crate) fn read_effects(
        &self,
        from: u64,
        mut f: impl FnMut(u64, &[u8]),
    ) -> Result<Result<(), u64>, JournalError> {
        let segs: Vec<Arc<Segment>> =
            self.segments.read().values().filter(|s| s.base + s.len() > from).cloned().collect();
        for seg in segs {
            let file = File::open(&seg.path).map_err(io_err)?;
            let start = from.saturating_sub(seg.base);
            let read = segment::read_effects(&file, start, seg.len(), |off, body| f(seg.base + off, body));
            if let Err(off) = read.map_err(io_err)? {
                return Ok(Err(seg.base + off));
            }
        }
        Ok(Ok(()))
    }

    /// Base of the oldest live segment (the end of the log when there is none).
    pub(crate) fn first_base(&self) -> u64 {
        self.segments.read().keys().next().copied().unwrap_or_else(|| self.end())
    }

    /// Every segment but the last (active) one, oldest first.
    pub(crate) fn closed_segments(&self) -> Vec<ClosedSegment> {
        let segs = self.segments.read();
        let n = segs.len().saturating_sub(1);
        segs.values().take(n).map(|s| ClosedSegment { base: s.base, len: s.len(), path: s.path.clone() }).collect()
    }

    /// Removes a closed segment: readers get `NotFound` from now on, and the file is
    /// deleted. Refuses the active (last) segment.
    pub(crate) fn delete_segment(&self, base: u64) -> io::Result<bool> {
        let removed = {
            let mut segs = self.segments.write();
            if segs.keys().next_back() == Some(&base) {
                return Ok(false);
            }
            segs.remove(&base)
        };
        let Some(seg) = removed else { return Ok(false) };
        self.remove_file(&seg)?;
        Ok(true)
    }

    /// Closes the handle of a segment taken out of the map and deletes its file.
    fn remove_file(&self, seg: &Segment) -> io::Result<()> {
        if seg.file.lock().take().is_some() {
            self.open_files.fetch_sub(1, Ordering::Relaxed);
        }
        match fs::remove_file(&seg.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The read handle of `seg`, opening it if needed.
    fn handle(&self, seg: &Segment, pos: u64) -> Result<Arc<File>, JournalError> {
        seg.last_use.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        if let Some(f) = seg.file.lock().as_ref() {
            return Ok(f.clone());
        }
        let file = match File::open(&seg.path) {
            Ok(f) => Arc::new(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(JournalError::NotFound(pos)),
            Err(e) => return Err(io_err(e)),
        };
        self.install_handle(seg, file.clone());
        Ok(file)
    }

    /// Stores `file` as the shared handle of `seg` and keeps the open count bounded.
    fn install_handle(&self, seg: &Segment, file: Arc<File>) {
        {
            let mut slot = seg.file.lock();
            if slot.replace(file).is_none() {
                self.open_files.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.open_files.load(Ordering::Relaxed) > MAX_OPEN_FILES {
            self.close_idle_handles();
        }
    }

    /// Closes the least recently used handles of closed segments, down to half the limit.
    fn close_idle_handles(&self) {
        let segs = self.segments.read();
        let active = segs.keys().next_back().copied();
        let mut open: Vec<&Arc<Segment>> =
            segs.values().filter(|s| Some(s.base) != active && s.file.lock().is_some()).collect();
        open.sort_by_key(|s| s.last_use.load(Ordering::Relaxed));
        let excess = self.open_files.load(Ordering::Relaxed).saturating_sub(MAX_OPEN_FILES / 2);
        for seg in open.into_iter().take(excess) {
            if seg.file.lock().take().is_some() {
                self.open_files.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Creates an empty segment file at `base`, makes its directory entry durable and
    /// adds it to the map as the new active segment.
    fn create_segment(&self, base: u64) -> io::Result<(Arc<Segment>, Arc<File>)> {
        let seg = Arc::new(Segment::new(&self.dir, base, 0));
        let file = Arc::new(OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&seg.path)?);
        if let Err(e) = sync_dir(&self.dir) {
            // Not left behind: after a crash a stray file here would cut the segment that
            // stays active at its base.
            let _ = fs::remove_file(&seg.path);
            return Err(e);
        }
        self.install_handle(&seg, file.clone());
        self.segments.write().insert(base, seg.clone());
        Ok((seg, file))
    }
}

/// The write side of the commit log, owned by the writer thread: assembles the records of
/// a batch in one buffer and writes it with one system call per segment.
#[derive(Debug)]
pub(crate) struct LogWriter {
    active: Arc<Segment>,
    file: Arc<File>,
    /// Bytes written to the active file.
    written: u64,
    /// Assembled records not yet written, starting at `written`.
    buf: Vec<u8>,
    /// Whether the active file has writes that are not fsynced.
    active_dirty: bool,
    /// Closed segments with writes that are not fsynced.
    closed_dirty: Vec<Arc<File>>,
    /// Test hook: fail writes and syncs.
    #[cfg(test)]
    pub(crate) fault: Arc<FaultSwitch>,
}

/// Where the log stood when a batch opened, to take the batch back ([`LogWriter::rollback`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogMark {
    base: u64,
    written: u64,
    closed_dirty: usize,
}

/// Test hook: how writes and syncs fail.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Fault {
    /// No failure.
    None = 0,
    /// Every write and sync fails with an I/O error.
    Io = 1,
    /// Writes fail with ENOSPC (after [`FaultSwitch::writes_left`] more succeed); syncs work.
    NoSpace = 2,
    /// The commit log works; applying changes to sled fails as if it ran out of space.
    StoreFull = 3,
}

/// Test hook: the [`Fault`] in force, shared with the test.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct FaultSwitch {
    /// The [`Fault`], as a number.
    pub(crate) mode: std::sync::atomic::AtomicU8,
    /// Writes that still succeed under [`Fault::NoSpace`].
    pub(crate) writes_left: AtomicU64,
}

impl LogWriter {
    fn new(active: Arc<Segment>, file: Arc<File>, written: u64) -> LogWriter {
        LogWriter {
            active,
            file,
            written,
            buf: Vec::new(),
            active_dirty: false,
            closed_dirty: Vec::new(),
            #[cfg(test)]
            fault: Arc::default(),
        }
    }

    /// Base of the active segment.
    pub(crate) fn active_base(&self) -> u64 {
        self.active.base
    }

    /// Next position to be assigned (including assembled, unwritten records).
    pub(crate) fn next_pos(&self) -> u64 {
        self.active.base + self.written + self.buf.len() as u64
    }

    /// Assembles a record (whose size the caller checked with [`segment::record_size`]),
    /// rolling over to a new segment first if it would not fit. Returns its position and
    /// size. The bytes reach the file at the next [`LogWriter::write_out`] at the latest.
    pub(crate) fn append(&mut self, log: &Log, header: &[u8], body: &[u8]) -> io::Result<(u64, u32)> {
        self.reserve(log, segment::RECORD_OVERHEAD + header.len() as u64 + body.len() as u64)?;
        let pos = self.next_pos();
        let size = segment::encode_record(&mut self.buf, header, body);
        Ok((pos, size))
    }

    /// Assembles an effects record (see [`segment::EFFECTS_FLAG`]) like [`LogWriter::append`].
    pub(crate) fn append_effects(&mut self, log: &Log, payload: &[u8]) -> io::Result<(u64, u32)> {
        self.reserve(log, segment::RECORD_OVERHEAD + payload.len() as u64)?;
        let pos = self.next_pos();
        Ok((pos, segment::encode_effects(&mut self.buf, payload)))
    }

    /// Whether records are assembled but not written out yet.
    pub(crate) fn has_assembled(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Before a sync: fills the active segment up to the next page boundary with a
    /// padding record ([`segment::encode_padding`]), so that the next group commit starts
    /// on a fresh page. Without it every sync writes the last, partly filled page to the
    /// device again (and the page cache counts it again): with small group commits that
    /// was about 4 KiB extra per sync, more than the records themselves. The padding costs
    /// log space instead, at most a page per sync; nothing when the segment has no room
    /// left for it (it is about to roll over) or the end is already on a boundary.
    pub(crate) fn pad_to_page(&mut self, log: &Log) {
        let used = self.written + self.buf.len() as u64;
        let mut gap = (segment::PAGE - used % segment::PAGE) % segment::PAGE;
        if gap == 0 {
            return;
        }
        if gap < segment::RECORD_OVERHEAD {
            gap += segment::PAGE;
        }
        if used + gap <= log.segment_size {
            segment::encode_padding(&mut self.buf, gap as usize);
        }
    }

    /// Rolls over first if a record of `size` would not fit the active segment, or writes
    /// out what is assembled once it is large.
    fn reserve(&mut self, log: &Log, size: u64) -> io::Result<()> {
        let used = self.written + self.buf.len() as u64;
        if used > 0 && used + size > log.segment_size {
            self.roll(log)
        } else if self.buf.len() >= WRITE_CHUNK {
            self.write_out(log)
        } else {
            Ok(())
        }
    }

    /// Writes the assembled records to the active segment (one `pwrite`) and publishes
    /// the new end to readers.
    pub(crate) fn write_out(&mut self, log: &Log) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.check_fault(false)?;
        self.file.write_all_at(&self.buf, self.written)?;
        self.written += self.buf.len() as u64;
        self.active_dirty = true;
        self.active.set_len(self.written);
        log.end.store(self.active.base + self.written, Ordering::Release);
        if self.buf.capacity() > 2 * WRITE_CHUNK {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Ok(())
    }

    /// Closes the active segment now if it holds any record, whatever its size (see
    /// [`LogWriter::roll`]), so that retention may delete it; true if it did. Between
    /// batches (nothing is assembled then).
    pub(crate) fn seal(&mut self, log: &Log) -> io::Result<bool> {
        self.write_out(log)?;
        if self.written == 0 {
            // A new segment would take this one's base (and file).
            return Ok(false);
        }
        self.roll(log)?;
        Ok(true)
    }

    /// Bytes written to the active segment.
    pub(crate) fn active_len(&self) -> u64 {
        self.written
    }

    /// Closes the active segment (writing the end marker after its last record, which
    /// tells recovery that it was closed cleanly) and starts a new one at the current end.
    fn roll(&mut self, log: &Log) -> io::Result<()> {
        self.write_out(log)?;
        self.check_fault(false)?;
        self.file.write_all_at(&segment::END_MARKER, self.written)?;
        self.active_dirty = true;
        let base = self.active.base + self.written;
        let (seg, file) = log.create_segment(base)?;
        let old = std::mem::replace(&mut self.file, file);
        if self.active_dirty {
            self.closed_dirty.push(old);
        }
        self.active = seg;
        self.written = 0;
        self.active_dirty = false;
        Ok(())
    }

    /// Whether written data is waiting for an fsync.
    pub(crate) fn is_dirty(&self) -> bool {
        self.active_dirty || !self.closed_dirty.is_empty()
    }

    /// `fdatasync`s every segment written since the last sync; returns how many.
    pub(crate) fn sync(&mut self) -> io::Result<u64> {
        self.check_fault(true)?;
        let mut n = 0;
        for f in &self.closed_dirty {
            f.sync_data()?;
            n += 1;
        }
        self.closed_dirty.clear();
        if self.active_dirty {
            self.file.sync_data()?;
            self.active_dirty = false;
            n += 1;
        }
        Ok(n)
    }

    /// Where the written log stands; a batch opens here (between batches nothing is left
    /// assembled, unless the journal is poisoned, when nothing is taken back any more).
    pub(crate) fn mark(&self) -> LogMark {
        LogMark { base: self.active.base, written: self.written, closed_dirty: self.closed_dirty.len() }
    }

    /// Takes back everything appended since `mark`: deletes the segments begun since, cuts
    /// the segment that was active back to its length at the mark (dropping an end marker)
    /// and publishes the old end. Truncation frees space, so this works on a full disk; it
    /// fails only if the file system does (then the journal poisons).
    pub(crate) fn rollback(&mut self, log: &Log, mark: LogMark) -> io::Result<()> {
        self.buf.clear();
        self.closed_dirty.truncate(mark.closed_dirty);
        if self.active.base != mark.base {
            let begun: Vec<Arc<Segment>> = {
                let mut segs = log.segments.write();
                let bases: Vec<u64> = segs.range(mark.base + 1..).map(|(b, _)| *b).collect();
                bases.iter().filter_map(|b| segs.remove(b)).collect()
            };
            for seg in &begun {
                log.remove_file(seg)?;
            }
            // Durably gone: after a crash a begun segment would claim the positions that
            // the old active segment now writes again.
            sync_dir(&log.dir)?;
            let active = log.segment_of(mark.base).filter(|s| s.base == mark.base);
            let active = active.ok_or_else(|| io::Error::other("the segment active at the mark is gone"))?;
            let file = Arc::new(OpenOptions::new().read(true).write(true).open(&active.path)?);
            log.install_handle(&active, file.clone());
            self.active = active;
            self.file = file;
        }
        self.file.set_len(mark.written)?;
        self.written = mark.written;
        self.active.set_len(mark.written);
        // Whatever was written before the mark and not synced is still to be synced.
        self.active_dirty = true;
        log.end.store(self.active.base + self.written, Ordering::Release);
        Ok(())
    }

    /// Test hook: whether sled is to fail as out of space ([`Fault::StoreFull`]).
    #[cfg(test)]
    pub(crate) fn store_fault(&self) -> bool {
        self.fault.mode.load(Ordering::SeqCst) == Fault::StoreFull as u8
    }

    #[cfg(test)]
    fn check_fault(&self, sync: bool) -> io::Result<()> {
        let fault = self.fault.mode.load(Ordering::SeqCst);
        if fault == Fault::Io as u8 {
            Err(io::Error::other("injected I/O failure"))
        } else if fault == Fault::NoSpace as u8 && !sync {
            let left = &self.fault.writes_left;
            match left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
                Ok(_) => Ok(()),
                Err(_) => Err(io::Error::from(io::ErrorKind::StorageFull)),
            }
        } else {
            Ok(())
        }
    }

    #[cfg(not(test))]
    #[inline]
    fn check_fault(&self, _sync: bool) -> io::Result<()> {
        Ok(())
    }
}

/// Whether a failed write only says that the file system is full (ENOSPC, EDQUOT): the
/// write is taken back and refused, and the journal goes on once space returns.
pub(crate) fn is_out_of_space(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
}

/// fsyncs a directory so that created or removed entries are durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Maps an I/O error to the journal's error type.
pub(crate) fn io_err(e: io::Error) -> JournalError {
    JournalError::Io(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_roll_read_delete() {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut w) = Log::open(dir.path(), 100, &[]).unwrap();
        let mut positions = Vec::new();
        for i in 0..10u8 {
            let (pos, size) = w.append(&log, &[i], &[i; 30]).unwrap();
            assert_eq!(size, 43);
            positions.push(pos);
        }
        // Not yet written: invisible to readers.
        assert!(matches!(log.read(positions[9]), Err(JournalError::NotFound(_))));
        w.write_out(&log).unwrap();
        assert!(w.sync().unwrap() >= 2);
        assert_eq!(positions[0], 0);
        assert_eq!(positions[1], 43);
        assert_eq!(positions[2], 86); // rolled: 86 + 43 > 100
        for (i, &pos) in positions.iter().enumerate() {
            let r = log.read(pos).unwrap();
            assert_eq!(&r.header[..], &[i as u8]);
            assert_eq!(log.locate(pos), Some(pos - pos % 86));
        }
        assert_eq!(log.end(), 430);
        assert_eq!(log.size(), (5, 430));
        assert!(log.contains(positions[3], 43));
        assert!(!log.contains(positions[3], 44 + 43));
        // An oversized record gets a segment of its own.
        let (big, size) = w.append(&log, b"", &[1; 300]).unwrap();
        let (after, _) = w.append(&log, b"", b"x").unwrap();
        w.write_out(&log).unwrap();
        assert_eq!(big, 430);
        assert_eq!(after, 430 + size as u64);
        assert_eq!(log.read(big).unwrap().body.len(), 300);
        // Deleting.
        let closed = log.closed_segments();
        assert_eq!(closed.len(), 6);
        assert!(log.delete_segment(0).unwrap());
        assert!(matches!(log.read(0), Err(JournalError::NotFound(0))));
        assert!(!log.delete_segment(after).unwrap(), "the active segment is never deleted");
        assert_eq!(log.read(after).unwrap().body, &b"x"[..]);
    }

    #[test]
    fn sealing_closes_the_active_segment_at_its_end_and_recovery_keeps_both() {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut w) = Log::open(dir.path(), 1 << 20, &[]).unwrap();
        assert!(!w.seal(&log).unwrap(), "an empty active segment stays");
        let (a, _) = w.append(&log, b"a", &[1; 30]).unwrap();
        let (b, _) = w.append(&log, b"b", &[2; 30]).unwrap();
        assert!(w.seal(&log).unwrap(), "assembled records are written out, then the segment closed");
        assert_eq!(log.size(), (2, 86));
        assert_eq!(w.active_base(), 86, "the new segment starts at the end: positions stay contiguous");
        assert_eq!(w.active_len(), 0);
        assert!(!w.seal(&log).unwrap(), "nothing written since: no empty segment is closed");
        assert_eq!(log.closed_segments().iter().map(|c| (c.base, c.len)).collect::<Vec<_>>(), vec![(0, 86)]);
        let (c, _) = w.append(&log, b"c", &[3; 30]).unwrap();
        w.write_out(&log).unwrap();
        assert_eq!(c, 86);
        assert!(w.is_dirty());
        w.sync().unwrap();
        for (pos, h) in [(a, b"a"), (b, b"b"), (c, b"c")] {
            assert_eq!(&log.read(pos).unwrap().header[..], h);
        }
        // The closed segment has its end marker; a crash now finds both segments whole.
        let first = dir.path().join(segment::file_name(0));
        assert_eq!(fs::metadata(&first).unwrap().len(), 86 + segment::END_MARKER.len() as u64);
        drop((log, w));
        let recovered = crate::recovery::recover_log(dir.path(), None).unwrap();
        assert_eq!(recovered, vec![(0, 86), (86, 43)]);
        let (log, _w) = Log::open(dir.path(), 1 << 20, &recovered).unwrap();
        for (pos, h) in [(a, b"a"), (b, b"b"), (c, b"c")] {
            assert_eq!(&log.read(pos).unwrap().header[..], h);
        }
        assert!(log.delete_segment(0).unwrap(), "a sealed segment can be deleted");
        assert_eq!(log.read(a), Err(JournalError::NotFound(a)));
    }

    #[test]
    fn open_handles_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut w) = Log::open(dir.path(), 16, &[]).unwrap();
        let positions: Vec<u64> = (0..300u32).map(|i| w.append(&log, b"", &i.to_be_bytes()).unwrap().0).collect();
        w.write_out(&log).unwrap();
        assert_eq!(log.size().0, 300);
        for _ in 0..2 {
            for (i, &pos) in positions.iter().enumerate() {
                assert_eq!(&log.read(pos).unwrap().body[..], &(i as u32).to_be_bytes());
                assert!(log.open_files.load(Ordering::Relaxed) <= MAX_OPEN_FILES);
            }
        }
    }
}
