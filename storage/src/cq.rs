//! Consume queues as files (RocketMQ's ConsumeQueue): per queue, append-only files of
//! fixed-size entries addressed by offset, and in memory which offsets are settled (a
//! consume offset plus the ranges settled out of order above it).
//!
//! ```text
//! dir/cq/<queue id, 20 digits>/<first offset, 20 digits>.cq   FILE_ENTRIES entries of ENTRY_BYTES
//! ```
//!
//! An entry is [`Pointer`]'s 21-byte encoding, a presence byte ([`PRESENT`]) and two zero
//! bytes: a hole in a sparse file (an offset settled before its entry was written) reads
//! as no entry. A group commit's new entries wait in memory, visible to readers, until the
//! writer's next drain ([`ConsumeQueues::flush_pending`], every checkpoint interval):
//! those still live then are written (one `pwrite` per run of offsets per queue), those
//! settled meanwhile never are, so a queue whose consumers keep up writes next to nothing
//! to its files. Nothing is fsynced on that path: the checkpointer syncs the files
//! written since its last round ([`ConsumeQueues::sync`]) before it flushes sled, and
//! recovery rewrites every entry the effects records after the checkpoint add. So nothing
//! in a file is trusted past the checkpoint; what lies past a queue's next offset after
//! recovery is cut off.
//!
//! Settling (ack, reject, purge) touches no file: it moves the queue's `low` mark or adds a
//! range ([`Offsets`]); the writer stores the changed queues' offsets in sled's `settled`
//! tree at each drain, and a file is deleted once `low` passed its last entry.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::codec;
use crate::queue_changes::EntryChange;
use crate::Pointer;

/// Bytes per entry.
pub(crate) const ENTRY_BYTES: u64 = 24;
/// Entries per file (6 MiB files).
pub(crate) const FILE_ENTRIES: u64 = 1 << 18;
/// The presence byte of a written entry.
const PRESENT: u8 = 0xCE;
/// Open file handles kept across every queue; past it they are all closed (and opened
/// again on use), so that many queues with entries do not exhaust file descriptors.
const MAX_OPEN: usize = 1024;
/// A checkpoint round with at least this many files to sync makes the whole file system
/// durable with one `syncfs` instead of an `fsync` per file (and an open per file past
/// [`MAX_OPEN`]): after a drain that wrote to thousands of queues, thousands of fsyncs
/// each force a journal commit of the file system while the writer's `fdatasync` waits
/// behind them.
const SYNCFS_FROM: usize = 64;

/// Encodes an entry.
fn encode_entry(p: &Pointer) -> [u8; ENTRY_BYTES as usize] {
    let mut e = [0u8; ENTRY_BYTES as usize];
    e[..21].copy_from_slice(&codec::encode_pointer(p));
    e[21] = PRESENT;
    e
}

/// Decodes an entry (`None`: a hole, or not an entry).
fn decode_entry(b: &[u8]) -> Option<Pointer> {
    if b.len() < ENTRY_BYTES as usize || b[21] != PRESENT {
        return None;
    }
    codec::decode_pointer(&b[..21])
}

/// Which offsets of a queue exist and which are settled: every offset below `low` is,
/// and so is every offset in a range of `ranges` (start -> end, exclusive; each starts
/// above `low` and no two touch). Offsets from `next` on were never added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Offsets {
    /// Every offset below is settled (the consume offset).
    pub(crate) low: u64,
    /// One past the highest offset added.
    pub(crate) next: u64,
    ranges: BTreeMap<u64, u64>,
}

impl Offsets {
    /// Whether `offset` holds a live (added, unsettled) entry.
    pub(crate) fn is_live(&self, offset: u64) -> bool {
        offset >= self.low
            && offset < self.next
            && self.ranges.range(..=offset).next_back().is_none_or(|(_, &end)| offset >= end)
    }

    /// Settles `from..to`.
    pub(crate) fn settle(&mut self, from: u64, to: u64) {
        let from = from.max(self.low);
        if to <= from {
            return;
        }
        let (mut start, mut end) = (from, to);
        if let Some((&s, &e)) = self.ranges.range(..=from).next_back() {
            if e >= from {
                start = s;
                end = end.max(e);
            }
        }
        let touching: Vec<u64> = self.ranges.range(start..=end).map(|(&s, _)| s).collect();
        for s in touching {
            if let Some(e) = self.ranges.remove(&s) {
                end = end.max(e);
            }
        }
        if start == self.low {
            self.low = end;
        } else {
            self.ranges.insert(start, end);
        }
    }

    /// Up to `limit` live offsets from `from` on, as runs `start..end`.
    pub(crate) fn runs(&self, from: u64, limit: usize) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut at = from.max(self.low);
        let mut left = limit as u64;
        // A range that began before `at` may still cover it.
        if let Some((_, &e)) = self.ranges.range(..=at).next_back() {
            at = at.max(e);
        }
        let mut gaps = self.ranges.range(at..);
        while left > 0 && at < self.next {
            let (stop, after) = match gaps.next() {
                Some((&s, &e)) => (s.min(self.next), e),
                None => (self.next, self.next),
            };
            if stop > at {
                let end = stop.min(at.saturating_add(left));
                runs.push((at, end));
                left -= end - at;
            }
            at = after;
        }
        runs
    }

    /// The settled ranges above `low` (diagnostics and tests).
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> Vec<(u64, u64)> {
        self.ranges.iter().map(|(&s, &e)| (s, e)).collect()
    }

    /// The `settled` tree's value: low u64, then start u64 and end u64 per range (next is
    /// kept in the `counters` tree).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + self.ranges.len() * 16);
        v.extend_from_slice(&self.low.to_be_bytes());
        for (s, e) in &self.ranges {
            v.extend_from_slice(&s.to_be_bytes());
            v.extend_from_slice(&e.to_be_bytes());
        }
        v
    }

    /// Decodes [`Offsets::encode`]'s value, with `next` from the counters.
    pub(crate) fn decode(v: &[u8], next: u64) -> Option<Offsets> {
        if v.len() < 8 || !(v.len() - 8).is_multiple_of(16) {
            return None;
        }
        let word = |i: usize| u64::from_be_bytes(v[i..i + 8].try_into().unwrap_or_default());
        let mut o = Offsets { low: word(0), next, ranges: BTreeMap::new() };
        for i in (8..v.len()).step_by(16) {
            o.ranges.insert(word(i), word(i + 8));
        }
        Some(o)
    }
}

/// One queue's files and offsets.
struct QueueFiles {
    dir: PathBuf,
    /// Files by first offset; `None`: exists, not opened yet.
    files: Mutex<BTreeMap<u64, Option<Arc<File>>>>,
    offsets: RwLock<Offsets>,
    /// Entries not written to the files yet (the writer's, until its next drain). Held
    /// across a read of the files, and across the drain's write and removal, so that a
    /// reader finds each entry in one place or the other.
    pending: RwLock<BTreeMap<u64, Pointer>>,
}

impl QueueFiles {
    fn path(&self, base: u64) -> PathBuf {
        self.dir.join(format!("{base:020}.cq"))
    }

    /// The file holding `offset`, opened (created if `create`); `None`: it does not exist.
    fn file(&self, offset: u64, create: bool, handles: &Handles) -> io::Result<Option<Arc<File>>> {
        let new_files = &handles.unsynced;
        let base = offset - offset % FILE_ENTRIES;
        let mut files = self.files.lock();
        if let Some(Some(f)) = files.get(&base) {
            return Ok(Some(f.clone()));
        }
        let known = files.contains_key(&base);
        if !known && !create {
            return Ok(None);
        }
        let path = self.path(base);
        let opened = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(&path);
        let file = match opened {
            Ok(f) => Arc::new(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !create => {
                files.remove(&base);
                return Ok(None);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The queue's directory is new.
                fs::create_dir_all(&self.dir)?;
                new_files.lock().dirs.insert(self.dir.parent().map(Path::to_path_buf).unwrap_or_default());
                Arc::new(OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?)
            }
            Err(e) => return Err(e),
        };
        if !known {
            new_files.lock().dirs.insert(self.dir.clone());
        }
        files.insert(base, Some(file.clone()));
        handles.open.fetch_add(1, Ordering::Relaxed);
        Ok(Some(file))
    }

    /// Appends the entries of `from..to` present in the files or waiting to be written to
    /// `out`, in offset order (missing files and holes are skipped).
    fn read_run(&self, from: u64, to: u64, out: &mut Vec<(u64, Pointer)>, nf: &Handles) -> io::Result<()> {
        let pending = self.pending.read();
        let start = out.len();
        self.read_files(from, to, out, nf)?;
        let waiting = pending.range(from..to).map(|(&off, &p)| (off, p));
        if out.len() == start {
            out.extend(waiting);
        } else if pending.range(from..to).next().is_some() {
            // An entry waiting to be written replaces the file's at its offset (its flags
            // changed since the file's was written).
            let mut merged: BTreeMap<u64, Pointer> = out.drain(start..).collect();
            merged.extend(waiting);
            out.extend(merged);
        }
        Ok(())
    }

    /// [`QueueFiles::read_run`] for the files alone.
    fn read_files(&self, from: u64, to: u64, out: &mut Vec<(u64, Pointer)>, nf: &Handles) -> io::Result<()> {
        let mut at = from;
        let mut buf = Vec::new();
        while at < to {
            let base = at - at % FILE_ENTRIES;
            let stop = to.min(base + FILE_ENTRIES);
            if let Some(file) = self.file(at, false, nf)? {
                buf.resize(((stop - at) * ENTRY_BYTES) as usize, 0);
                let n = read_full(&file, &mut buf, (at - base) * ENTRY_BYTES)?;
                for (i, e) in buf[..n].chunks_exact(ENTRY_BYTES as usize).enumerate() {
                    if let Some(p) = decode_entry(e) {
                        out.push((at + i as u64, p));
                    }
                }
            }
            at = stop;
        }
        Ok(())
    }
}

/// Reads into `buf` at `pos` until it is full or the file ends; returns the bytes read.
fn read_full(file: &File, buf: &mut [u8], pos: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], pos + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Files written and directories changed since the checkpointer's last round.
#[derive(Default)]
struct NewFiles {
    /// Files to sync, held open: at most [`MAX_OPEN`], so that a drain writing to more
    /// queues than that (a wide fan-out) does not hold a descriptor per queue until the
    /// next checkpoint.
    files: HashMap<(u64, u64), Arc<File>>,
    /// Files to sync past those, by path: opened again to be synced (an I/O error of a
    /// write-back nobody has seen yet is reported to an fsync through a descriptor opened
    /// after it, since Linux 4.16).
    paths: HashMap<(u64, u64), PathBuf>,
    dirs: HashSet<PathBuf>,
}

impl NewFiles {
    /// Remembers file `key` (queue, first offset) to be synced: its handle while fewer than
    /// [`MAX_OPEN`] are held, else its path.
    fn add(&mut self, key: (u64, u64), file: Arc<File>, path: impl FnOnce() -> PathBuf) {
        if self.files.contains_key(&key) || self.paths.contains_key(&key) {
            return;
        }
        if self.files.len() < MAX_OPEN {
            self.files.insert(key, file);
        } else {
            self.paths.insert(key, path());
        }
    }

    /// Forgets file `key` (it is deleted).
    fn remove(&mut self, key: (u64, u64)) {
        self.files.remove(&key);
        self.paths.remove(&key);
    }

    /// Forgets every file of `queue` (it is deleted).
    fn forget_queue(&mut self, queue: u64) {
        self.files.retain(|(id, _), _| *id != queue);
        self.paths.retain(|(id, _), _| *id != queue);
    }
}

/// What every queue's file opening shares.
#[derive(Default)]
struct Handles {
    unsynced: Mutex<NewFiles>,
    /// Handles opened since they were last all closed.
    open: AtomicUsize,
}

impl Handles {
    /// Puts back what a sync could not make durable, for the next one.
    fn keep_unsynced(&self, left: NewFiles) {
        let mut unsynced = self.unsynced.lock();
        unsynced.files.extend(left.files);
        unsynced.paths.extend(left.paths);
        unsynced.dirs.extend(left.dirs);
    }
}

/// Changes of one group commit written to the files, not yet visible
/// ([`ConsumeQueues::stage`]).
#[derive(Debug, Default)]
pub(crate) struct Staged {
    /// Queue and the end of a run of entries written.
    written: Vec<(u64, u64)>,
    /// Queue and offset settled.
    settled: Vec<(u64, u64)>,
}

/// How [`ConsumeQueues::sync`] made the files durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Synced {
    /// An fsync of each of `files` files (and of each changed directory).
    Files {
        /// Files synced.
        files: usize,
    },
    /// One `syncfs` of the file system holding `files` files written.
    FileSystem {
        /// Files written since the last round.
        files: usize,
    },
}

/// Files to delete once a checkpoint covers the change that made them useless.
#[derive(Debug)]
enum Doomed {
    /// A file whose every entry is settled.
    File(PathBuf),
    /// The directory of a deleted queue.
    Queue(PathBuf),
}

/// Every consume queue's files and offsets (see the module doc).
pub(crate) struct ConsumeQueues {
    root: PathBuf,
    /// `root`, held open from the start for `syncfs`: Linux reports a write-back error to
    /// `syncfs` through a descriptor opened before the error.
    root_handle: File,
    queues: RwLock<HashMap<u64, Arc<QueueFiles>>>,
    handles: Handles,
    /// Files to delete, by the log position a checkpoint must cover first (ascending).
    doomed: Mutex<Vec<(u64, Doomed)>>,
    /// Held by [`ConsumeQueues::entries`], and exclusively while the offsets are rebuilt
    /// ([`ConsumeQueues::rebuilding`]).
    gate: RwLock<()>,
    /// Queues whose offsets changed since the last drain (writer only).
    dirty: Mutex<HashSet<u64>>,
    /// Queues with entries waiting to be written ([`QueueFiles::pending`]).
    unwritten: Mutex<HashSet<u64>>,
}

impl ConsumeQueues {
    /// Opens `root` (created if missing) and lists the queues and files in it; their
    /// offsets are set by [`ConsumeQueues::restore`].
    pub(crate) fn open(root: &Path) -> io::Result<ConsumeQueues> {
        fs::create_dir_all(root)?;
        let mut queues = HashMap::new();
        for entry in fs::read_dir(root)? {
            let entry = entry?;
            let Some(id) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else {
                tracing::warn!(path = ?entry.path(), "ignoring unexpected file in the consume-queue directory");
                continue;
            };
            let mut files = BTreeMap::new();
            for f in fs::read_dir(entry.path())? {
                let f = f?;
                let base = f.file_name().to_str().and_then(|n| n.strip_suffix(".cq")).and_then(|n| n.parse().ok());
                match base {
                    Some(base) => {
                        files.insert(base, None);
                    }
                    None => tracing::warn!(path = ?f.path(), "ignoring unexpected file in a consume-queue directory"),
                }
            }
            let q = QueueFiles {
                dir: entry.path(),
                files: Mutex::new(files),
                offsets: RwLock::default(),
                pending: RwLock::default(),
            };
            queues.insert(id, Arc::new(q));
        }
        Ok(ConsumeQueues {
            root: root.to_path_buf(),
            root_handle: File::open(root)?,
            queues: RwLock::new(queues),
            handles: Handles::default(),
            doomed: Mutex::default(),
            gate: RwLock::default(),
            dirty: Mutex::default(),
            unwritten: Mutex::default(),
        })
    }

    fn get(&self, queue: u64) -> Option<Arc<QueueFiles>> {
        self.queues.read().get(&queue).cloned()
    }

    fn get_or_add(&self, queue: u64) -> Arc<QueueFiles> {
        if let Some(q) = self.get(queue) {
            return q;
        }
        let mut queues = self.queues.write();
        queues
            .entry(queue)
            .or_insert_with(|| {
                Arc::new(QueueFiles {
                    dir: self.root.join(format!("{queue:020}")),
                    files: Mutex::default(),
                    offsets: RwLock::default(),
                    pending: RwLock::default(),
                })
            })
            .clone()
    }

    /// Creates the directory of a new queue and its first file (both synced by the next
    /// checkpoint round), so that the first entries written to it only open the file.
    pub(crate) fn create_files(&self, queue: u64) -> io::Result<()> {
        let q = self.get_or_add(queue);
        let created = q.file(0, true, &self.handles).map(|_| ());
        self.limit_handles();
        created
    }

    /// Sets every queue's offsets (at open, and when sled was opened again): `next` from
    /// the counters, the settled part from the `settled` tree. Queues without either start
    /// empty.
    pub(crate) fn restore(&self, next: &HashMap<u64, u64>, settled: HashMap<u64, Vec<u8>>) -> Result<(), String> {
        for q in self.queues.read().values() {
            *q.offsets.write() = Offsets::default();
        }
        for (&id, &n) in next {
            *self.get_or_add(id).offsets.write() = Offsets { next: n, ..Offsets::default() };
        }
        for (id, v) in settled {
            let q = self.get_or_add(id);
            let mut o = q.offsets.write();
            let next = o.next;
            *o = Offsets::decode(&v, next).ok_or_else(|| format!("malformed entry of queue {id} in tree `settled`"))?;
        }
        self.dirty.lock().clear();
        Ok(())
    }

    /// Keeps readers out while the offsets are rebuilt from sled and the log (the writer,
    /// when sled was opened again): they would see them half way. Recovery must not call
    /// [`ConsumeQueues::entries`] while holding it.
    pub(crate) fn rebuilding(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.gate.write()
    }

    /// Queue ids with files or offsets.
    pub(crate) fn ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.queues.read().keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// A copy of a queue's offsets.
    pub(crate) fn offsets(&self, queue: u64) -> Offsets {
        self.get(queue).map(|q| q.offsets.read().clone()).unwrap_or_default()
    }

    /// Raises a queue's next offset to at least `next` (recovery: the counters after replay).
    pub(crate) fn raise_next(&self, queue: u64, next: u64) {
        let q = self.get_or_add(queue);
        let mut o = q.offsets.write();
        o.next = o.next.max(next);
    }

    /// Up to `limit` live entries of `queue` from offset `from` on, in offset order.
    pub(crate) fn entries(&self, queue: u64, from: u64, limit: usize) -> io::Result<Vec<(u64, Pointer)>> {
        let _gate = self.gate.read();
        let Some(q) = self.get(queue) else { return Ok(Vec::new()) };
        let runs = q.offsets.read().runs(from, limit);
        let mut out = Vec::new();
        for (a, b) in runs {
            q.read_run(a, b, &mut out, &self.handles)?;
        }
        self.limit_handles();
        Ok(out)
    }

    /// Closes every open handle once more than [`MAX_OPEN`] were opened (those a call is
    /// using, or the checkpointer has yet to sync, stay open until they let go).
    fn limit_handles(&self) {
        if self.handles.open.load(Ordering::Relaxed) <= MAX_OPEN {
            return;
        }
        self.handles.open.store(0, Ordering::Relaxed);
        for q in self.queues.read().values() {
            for f in q.files.lock().values_mut() {
                *f = None;
            }
        }
    }

    /// Whether `offset` of `queue` is live.
    pub(crate) fn is_live(&self, queue: u64, offset: u64) -> bool {
        self.get(queue).is_some_and(|q| q.offsets.read().is_live(offset))
    }

    /// The entries present in the files or waiting to be written in `from..to`, live or
    /// not (a block for the writer's cache; recovery's scan).
    pub(crate) fn read_block(&self, queue: u64, from: u64, to: u64) -> io::Result<Vec<(u64, Pointer)>> {
        let Some(q) = self.get(queue) else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        q.read_run(from, to, &mut out, &self.handles)?;
        self.limit_handles();
        Ok(out)
    }

    /// Writes consecutive entries from offset `first` on and raises the queue's next
    /// offset past them.
    #[cfg(test)]
    pub(crate) fn write(&self, queue: u64, first: u64, entries: &[Pointer]) -> io::Result<()> {
        self.write_entries(queue, first, entries)?;
        self.raise_next(queue, first + entries.len() as u64);
        Ok(())
    }

    /// Writes consecutive entries from offset `first` on (not visible to readers past the
    /// queue's next offset).
    fn write_entries(&self, queue: u64, first: u64, entries: &[Pointer]) -> io::Result<()> {
        let q = self.get_or_add(queue);
        let mut at = first;
        let mut rest = entries;
        let mut buf = Vec::with_capacity(entries.len() * ENTRY_BYTES as usize);
        while !rest.is_empty() {
            let base = at - at % FILE_ENTRIES;
            let n = rest.len().min((base + FILE_ENTRIES - at) as usize);
            buf.clear();
            for p in &rest[..n] {
                buf.extend_from_slice(&encode_entry(p));
            }
            let file = q.file(at, true, &self.handles)?.ok_or_else(|| io::Error::other("consume-queue file"))?;
            file.write_all_at(&buf, (at - base) * ENTRY_BYTES)?;
            self.handles.unsynced.lock().add((queue, base), file, || q.path(base));
            at += n as u64;
            rest = &rest[n..];
        }
        self.limit_handles();
        Ok(())
    }

    /// Writes the entries that `changes` (queue, offset, the entry or `None`: settled) set,
    /// by queue and offset (one write per run of consecutive offsets), without making anything visible: readers see
    /// neither the entries nor the settlements until [`ConsumeQueues::publish`]. With
    /// `defer` (the writer's group commits) the entries are kept in memory instead, for
    /// the next [`ConsumeQueues::flush_pending`].
    pub(crate) fn stage(
        &self,
        changes: impl IntoIterator<Item = (u64, u64, EntryChange)>,
        defer: bool,
    ) -> io::Result<Staged> {
        let mut staged = Staged::default();
        let mut run: Option<(u64, u64, Vec<Pointer>)> = None;
        let flush = |run: &mut Option<(u64, u64, Vec<Pointer>)>, staged: &mut Staged| -> io::Result<()> {
            if let Some((q, first, entries)) = run.take() {
                let end = first + entries.len() as u64;
                if defer {
                    let queue = self.get_or_add(q);
                    queue.pending.write().extend((first..end).zip(entries));
                    self.unwritten.lock().insert(q);
                } else {
                    self.write_entries(q, first, &entries)?;
                }
                staged.written.push((q, end));
            }
            Ok(())
        };
        for (q, off, change) in changes {
            match change {
                Some(p) => match &mut run {
                    Some((rq, first, entries)) if *rq == q && *first + entries.len() as u64 == off => entries.push(p),
                    _ => {
                        flush(&mut run, &mut staged)?;
                        run = Some((q, off, vec![p]));
                    }
                },
                None => staged.settled.push((q, off)),
            }
        }
        flush(&mut run, &mut staged)?;
        Ok(staged)
    }

    /// Makes staged changes visible (next offsets, settlements); returns the queues
    /// written to.
    pub(crate) fn publish(&self, staged: Staged) -> Vec<u64> {
        let mut written = Vec::new();
        for (q, end) in staged.written {
            self.raise_next(q, end);
            if written.last() != Some(&q) {
                written.push(q);
            }
        }
        // In key order: each queue's settlements under one lock, the queue marked once.
        let mut rest = &staged.settled[..];
        while let Some(&(q, _)) = rest.first() {
            let n = rest.iter().take_while(|(id, _)| *id == q).count();
            let queue = self.get_or_add(q);
            let mut o = queue.offsets.write();
            for &(_, off) in &rest[..n] {
                o.settle(off, off.saturating_add(1));
            }
            o.next = o.next.max(o.low);
            drop(o);
            self.dirty.lock().insert(q);
            rest = &rest[n..];
        }
        written
    }

    /// [`ConsumeQueues::stage`] then [`ConsumeQueues::publish`] (replay): `changes` are
    /// the `queue` tree's as effects records hold them (key: queue id, offset; value: an
    /// encoded [`Pointer`], `None` or a value that is none: settled), in key order; a key
    /// of another form is skipped.
    pub(crate) fn apply_changes(
        &self,
        changes: impl IntoIterator<Item = (sled::IVec, Option<sled::IVec>)>,
    ) -> io::Result<Vec<u64>> {
        let typed = changes.into_iter().filter_map(|(k, v)| {
            let (q, off) = codec::decode_queue_key(&k)?;
            Some((q, off, v.as_deref().and_then(codec::decode_pointer)))
        });
        let staged = self.stage(typed, false)?;
        Ok(self.publish(staged))
    }

    /// Whether some entries wait to be written ([`ConsumeQueues::flush_pending`]).
    pub(crate) fn has_pending(&self) -> bool {
        !self.unwritten.lock().is_empty()
    }

    /// Writes the entries waiting in memory that are still live, one `pwrite` per run of
    /// consecutive offsets, and forgets the rest (settled since: never written, they read
    /// as holes). The writer calls it at each drain, before the position the checkpoint
    /// may claim moves on; an entry that fails to be written stays waiting.
    pub(crate) fn flush_pending(&self) -> io::Result<()> {
        let ids: Vec<u64> = self.unwritten.lock().drain().collect();
        for (i, &id) in ids.iter().enumerate() {
            let Some(q) = self.get(id) else { continue };
            let mut pending = q.pending.write();
            let live: Vec<(u64, Pointer)> = {
                let o = q.offsets.read();
                pending.iter().filter(|(&off, _)| o.is_live(off)).map(|(&off, &p)| (off, p)).collect()
            };
            let mut rest = &live[..];
            while let Some(&(first, _)) = rest.first() {
                let n = rest.iter().enumerate().take_while(|&(k, &(off, _))| off == first + k as u64).count();
                let run: Vec<Pointer> = rest[..n].iter().map(|&(_, p)| p).collect();
                if let Err(e) = self.write_entries(id, first, &run) {
                    self.unwritten.lock().extend(&ids[i..]);
                    return Err(e);
                }
                rest = &rest[n..];
            }
            pending.clear();
        }
        Ok(())
    }

    /// Forgets every entry waiting to be written (sled was opened again: the replay from
    /// the checkpoint wrote them to the files).
    pub(crate) fn forget_pending(&self) {
        for id in std::mem::take(&mut *self.unwritten.lock()) {
            if let Some(q) = self.get(id) {
                q.pending.write().clear();
            }
        }
    }

    /// Settles `from..to` of `queue`.
    pub(crate) fn settle(&self, queue: u64, from: u64, to: u64) {
        let q = self.get_or_add(queue);
        let mut o = q.offsets.write();
        o.settle(from, to);
        o.next = o.next.max(o.low);
        self.dirty.lock().insert(queue);
    }

    /// Forgets a deleted queue (its offsets at once) whose deletion ends at log position
    /// `at`: its files go once a checkpoint covers `at` ([`ConsumeQueues::delete_doomed`]),
    /// so that a power loss that takes the deletion from the log takes nothing else.
    pub(crate) fn delete_queue(&self, queue: u64, at: u64) {
        let Some(q) = self.queues.write().remove(&queue) else { return };
        self.dirty.lock().insert(queue);
        self.handles.unsynced.lock().forget_queue(queue);
        self.doomed.lock().push((at, Doomed::Queue(q.dir.clone())));
    }

    /// Deletes the files doomed by drains and queue deletions at or before `checkpointed`
    /// (a durable checkpoint: recovery never goes back past it).
    pub(crate) fn delete_doomed(&self, checkpointed: u64) {
        let due: Vec<Doomed> = {
            let mut doomed = self.doomed.lock();
            if doomed.first().is_none_or(|(at, _)| *at > checkpointed) {
                return;
            }
            let keep = doomed.partition_point(|(at, _)| *at <= checkpointed);
            doomed.drain(..keep).map(|(_, d)| d).collect()
        };
        for d in due {
            let (path, removed) = match &d {
                Doomed::File(path) => (path, fs::remove_file(path)),
                Doomed::Queue(dir) => (dir, fs::remove_dir_all(dir)),
            };
            match removed {
                Ok(()) => {
                    let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
                    self.handles.unsynced.lock().dirs.insert(parent);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = ?path, error = %e, "could not delete a settled consume-queue file"),
            }
        }
    }

    /// Whether some queue's offsets changed since the last drain.
    pub(crate) fn has_dirty(&self) -> bool {
        !self.dirty.lock().is_empty()
    }

    /// Stores the changed queues' offsets in `settled` (one sled batch, unflushed) and
    /// dooms the files they settled completely, to be deleted once a checkpoint covers
    /// log position `at` (the drain's).
    pub(crate) fn drain(&self, settled: &sled::Tree, at: u64) -> sled::Result<()> {
        let dirty: Vec<u64> = self.dirty.lock().drain().collect();
        if dirty.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for id in dirty {
            let key = codec::encode_u64(id);
            match self.get(id) {
                Some(q) => {
                    let low = {
                        let o = q.offsets.read();
                        batch.insert(&key[..], o.encode());
                        o.low
                    };
                    self.doom_files_below(id, &q, low, at);
                }
                None => batch.remove(&key[..]),
            }
        }
        settled.apply_batch(batch)
    }

    /// Dooms the files of `q` whose every entry lies below `low` (they leave the queue's
    /// map at once: nothing reads below `low`).
    fn doom_files_below(&self, id: u64, q: &QueueFiles, low: u64, at: u64) {
        let done: Vec<u64> =
            q.files.lock().range(..low).map(|(&b, _)| b).filter(|&b| b + FILE_ENTRIES <= low).collect();
        for base in done {
            q.files.lock().remove(&base);
            self.handles.unsynced.lock().remove((id, base));
            self.doomed.lock().push((at, Doomed::File(q.path(base))));
        }
    }

    /// After recovery's checkpoint: deletes every file below its queue's consume offset,
    /// and whatever else is doomed.
    pub(crate) fn delete_settled_files(&self) {
        let all: Vec<(u64, Arc<QueueFiles>)> = self.queues.read().iter().map(|(&id, q)| (id, q.clone())).collect();
        for (id, q) in all {
            let low = q.offsets.read().low;
            self.doom_files_below(id, &q, low, 0);
        }
        self.delete_doomed(u64::MAX);
    }

    /// After recovery: dooms the files of queues `live` does not know and cuts every file
    /// at its queue's next offset (nothing past it is trusted).
    pub(crate) fn trim(&self, live: impl Fn(u64) -> bool) -> io::Result<()> {
        let all: Vec<(u64, Arc<QueueFiles>)> = self.queues.read().iter().map(|(&id, q)| (id, q.clone())).collect();
        for (id, q) in all {
            if !live(id) {
                self.delete_queue(id, 0);
                continue;
            }
            let next = q.offsets.read().next;
            let bases: Vec<u64> = q.files.lock().keys().copied().collect();
            for base in bases {
                if base >= next {
                    q.files.lock().remove(&base);
                    fs::remove_file(q.path(base))?;
                    self.handles.unsynced.lock().dirs.insert(q.dir.clone());
                } else if next < base + FILE_ENTRIES {
                    let want = (next - base) * ENTRY_BYTES;
                    if let Some(f) = q.file(base, false, &self.handles)? {
                        if f.metadata()?.len() > want {
                            f.set_len(want)?;
                            self.handles.unsynced.lock().add((id, base), f, || q.path(base));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes every file write and directory change since the last call durable (the
    /// checkpointer, before it flushes sled): an fsync per file and directory, or one
    /// `syncfs` from [`SYNCFS_FROM`] files on. What it could not sync is kept for the next
    /// call.
    pub(crate) fn sync(&self) -> io::Result<Synced> {
        let taken = std::mem::take(&mut *self.handles.unsynced.lock());
        let files = taken.files.len() + taken.paths.len();
        if files >= SYNCFS_FROM {
            return match rustix::fs::syncfs(&self.root_handle) {
                Ok(()) => Ok(Synced::FileSystem { files }),
                Err(e) => {
                    self.handles.keep_unsynced(taken);
                    Err(e.into())
                }
            };
        }
        let mut failed = None;
        let mut left = NewFiles::default();
        for (key, file) in taken.files {
            if let Err(e) = file.sync_data() {
                failed.get_or_insert(e);
                left.files.insert(key, file);
            }
        }
        for (key, path) in taken.paths {
            match File::open(&path).and_then(|f| f.sync_data()) {
                Ok(()) => {}
                // Deleted since (a queue deletion or a file dropped at a drain).
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    failed.get_or_insert(e);
                    left.paths.insert(key, path);
                }
            }
        }
        for dir in taken.dirs {
            let synced = File::open(&dir).and_then(|d| d.sync_all());
            match synced {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    failed.get_or_insert(e);
                    left.dirs.insert(dir);
                }
            }
        }
        if failed.is_some() {
            self.handles.keep_unsynced(left);
        }
        failed.map_or(Ok(Synced::Files { files }), Err)
    }
}

#[cfg(test)]
mod tests;
