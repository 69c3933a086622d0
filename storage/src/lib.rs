//! `ferrymq-storage`: the journal of FerryMQ.
//!
//! Message bodies go to a **commit log** of our own (append-only segment files, one
//! record per message, written sequentially). A message routed to N queues is written to
//! the log once and gets N fixed-size pointer entries in **consume-queue files** (one
//! append-only file series per queue, addressed by offset: RocketMQ's ConsumeQueue).
//! Everything else keyed and mutable — which consume-queue offsets are settled, retained
//! index, timers, sessions, metadata, counters — lives in **sled**.
//!
//! The commit log is the truth and the only synchronous write (RocketMQ's model): each
//! group commit appends, after its message records, one **effects record** holding the
//! batch's changes resolved to blind writes, and one `fdatasync` of the segment makes the
//! whole batch durable. Consume-queue entries wait in memory (readers see them there) and
//! are written to their files at the next drain if still live, never synced on that path;
//! settling an entry (ack) only changes the queue's settled offsets in memory, and
//! the keyspaces' changes (sessions, QoS 2 state, retry state, cursors, metadata) and the
//! counters wait in memory too (readers look there first): all of it is stored in sled
//! once per checkpoint interval (the drain). Only the trees read by range on their own
//! (retained index, timers, key index, queue names) are applied to sled per group commit. The
//! checkpointer syncs the consume-queue files and flushes sled in the background and
//! records the log position covered (the checkpoint); recovery replays the effects
//! records after it.
//!
//! # Data flow
//!
//! ```text
//!  async callers ──submit(ops, completion)──▶ bounded channel ──▶ journal writer thread
//!                                                                 │ drain a batch
//!                                                                 │ 1. append records + one effects record
//!                                                                 │ 2. queue entries, settlements, keyspaces,
//!                                                                 │    counters in memory until the drain
//!                                                                 │    (live entries pwritten then); one sled
//!                                                                 │    batch per other tree, unflushed
//!                                                                 │ 3. fdatasync the segment (policy `Always`)
//!                                                                 └ 4. run completions in submission order
//!  checkpointer thread, every interval ──▶ sync queue files, flush sled, record the position
//!  any thread ──read(pos) / queue_entries(..) / get(..)──▶ segment and queue files (pread), sled
//!  async callers ──resolve_queue_id(name)──▶ names in memory, else the writer thread (sled)
//! ```
//!
//! Every method that reads sled or a file, or waits for the writer, blocks the calling
//! thread: async code calls it off its runtime's workers. A runtime that marks its worker
//! threads ([`forbid_blocking`]) gets a panic naming the method in debug builds (the
//! `guard` module).
//!
//! Completions run on the writer thread, in the order the batches were submitted; a caller
//! that hands appended pointers on from its completion therefore sees appends in log order.
//!
//! # On-disk layout (`dir/`)
//!
//! ```text
//! dir/format                         `ferrymq-journal 4`: the layout version ([`LAYOUT`])
//! dir/log/00000000000000000000.seg   commit-log segments, named by base position (20 digits)
//! dir/log/00000000000134217728.seg   ...
//! dir/cq/00000000000000000007/00000000000000000000.cq   queue 7's entries 0..262,144
//! dir/cq/00000000000000000007/00000000000000262144.cq   ... (named by first offset)
//! dir/db/                            the sled database
//! dir/ballast                        space kept in reserve (see [`JournalConfig::ballast_bytes`])
//! ```
//!
//! [`Journal::open`] refuses a directory of another layout ([`JournalError::Layout`]) before
//! touching it, with a message saying what to do: a newer layout, and the development
//! layouts 1 to 3, never released (a directory without `format` but with data is layout 1;
//! see the `format` module).
//!
//! A consume-queue file holds 262,144 entries of 24 bytes: the [`Pointer`] (`pos u64 |
//! size u32 | body length u32 | tag hash u32 | flags u8`, big-endian), a presence byte
//! `0xCE` and two zero bytes. A hole (an offset added and settled in the same group commit
//! is never written) reads as no entry. A file is deleted once its queue's consume offset
//! passed its last entry and a durable checkpoint covers the drain that stored that
//! offset; a deleted queue's files go once a checkpoint covers the deletion.
//!
//! A record in a segment: `len: u32 BE` (of everything after the crc) | `crc32: u32 BE` (of
//! everything after itself) | `header_len: u32 BE` | `header` | `body`. An effects record
//! has bit 31 of `header_len` set, no header, and the encoded changes as its body
//! (`version u8` (2), then per change `tree u8 | key_len varint | key | 0` for a removal or
//! `... | 1 | value_len varint | value` for a set). Tree 0 is the consume queues: its keys
//! are `queue id u64 | offset u64`, its values [`Pointer`]s as in a consume-queue file; a
//! set writes the entry at its offset, a removal settles it; consecutive offsets of one
//! queue go as one run instead (`0xfe | queue varint | first varint | count varint`
//! settled, or `0xff | ...` added, each entry then as `pos delta zigzag varint | size
//! varint | body length varint | tag hash varint | flags u8`): about 7 bytes per message.
//! Trees 1 on are the sled trees of the table below, top to bottom from `queue_names`,
//! `kv:*` in the order listed, `counters` last, `settled` not at all. Version 1 (written
//! by development layouts 2 and 3) has no runs and is still read (see the `effects`
//! module). A **padding record** (`header_len` 0, a body of zeros) ends every
//! synced group commit that does not end on a 4 KiB page boundary, so that the next commit
//! starts on a fresh page (the device does not write the last, partly filled page again);
//! nothing points at it and replay skips it. A `len` of 0 marks
//! the end of the used part of a segment. Records never span segments; a record larger
//! than the segment size gets a segment of its own. A log position ([`LogPos`]) is the byte
//! offset of a record from the start of the whole log, so `segment = the last segment whose
//! base <= pos`. Positions are contiguous: a new segment's base is the end of the last
//! record of the previous one.
//!
//! When a segment is closed (rollover), the 12-byte **end marker** `0u32 | "FerryEnd"` (a
//! zero `len`, then a magic) is written after its last record; it is not part of the
//! positions. It tells recovery that the segment was closed cleanly. Retention deletes
//! whole segment files, so the positions of a deleted segment become a gap in the log.
//!
//! sled trees (all integers big-endian so that key order is numeric order):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `counters` | `q`, queue id u64 | next offset u64 (the high-water mark), length u64 |
//! | `settled` | queue id u64 | consume offset u64 (every offset below is settled), then `start u64, end u64` per range settled out of order above it |
//! | `counters` | `s`, segment base u64 | references u64 (pointers + retained + timers) |
//! | `queue_names` | name (UTF-8) | queue id u64 |
//! | `queue_ids` | queue id u64 | name (UTF-8): reverse of `queue_names` |
//! | `retained` | topic (UTF-8) | pos u64, size u32 |
//! | `timer` | due ms u64, pos u64 | size u32, target (opaque bytes) |
//! | `key` | key hash u64 (FNV-1a), timestamp ms u64, pos u64 | size u32, key (bytes) |
//! | `key_pos` | pos u64, key hash u64, timestamp ms u64 | empty: the `key` entries by position |
//! | `kv:<space>` | opaque key | opaque value ([`Space`]: `kv:session`, `kv:inbound_qos2`, `kv:meta`, `kv:retry`, `kv:cursor`) |
//! | default | `ferrymq:checkpoint:v2` | log position u64 up to which sled is durable |
//! | default | `ferrymq:applied:v2` | end u64 of the last effects record applied (written first in every batch) |
//!
//! The counters are written in the same group commit as the entries they count, so offsets
//! are never reused, not even after every entry of a queue was removed and the journal
//! reopened, and an open reads them instead of counting entries. Queue ids come from
//! sled's `generate_id` and are never handed out twice. Only the writer thread looks names
//! up in sled or allocates ids ([`Journal::queue_id`], [`Journal::resolve_queue_id`]), so
//! names and deletions apply in one order and the in-memory map of resolved names is never
//! stale; a new mapping is written to sled at once, without a flush, and goes into the
//! effects record of the batch the writer is working on.
//!
//! # Durability
//!
//! [`FsyncPolicy`] names what survives a power loss. With `Always`, a completion runs only
//! after the records of its batch — its effects record included — are fsynced: one
//! `fdatasync` covers every submission drained in that batch (group commit), and nothing
//! else is synced on that path. [`JournalStats::fsyncs`] counts them.
//!
//! When the file system is full, nothing is lost and nothing needs a restart:
//! - below [`JournalConfig::min_free_bytes`] a submission that appends is refused before
//!   anything is written ([`JournalError::NoSpace`]);
//! - a commit-log write that fails with ENOSPC or EDQUOT anyway (another process took the
//!   space) takes the whole batch back — its records, the segments it began, its
//!   reference counts, its pending sled changes — and refuses every submission in it
//!   ([`JournalError::Full`]); later batches are tried as usual, so appends succeed again
//!   once space returns;
//! - the ballast ([`JournalConfig::ballast_bytes`]) is given up as soon as the file system
//!   has less free space than half its size (looked at every 100 ms) or a write ran out of
//!   space, so that sled keeps room for its own writes;
//! - if sled runs out of space anyway (it keeps its first I/O error and fails every later
//!   write until it is opened again), every submission is refused with
//!   [`JournalError::Full`] (reads go on) until the file system has room again; then the
//!   writer opens sled again in place — readers wait for the moment it takes — and brings
//!   it up to the end of the log as recovery does. The refused batch is taken back from
//!   the commit log, so it is not applied later.
//!
//! Every other failure **poisons** the journal: the failing batch and every later
//! submission complete with [`JournalError::Poisoned`] rather than acknowledging what may
//! be lost, until it is reopened. That covers a commit-log write failing otherwise (EIO,
//! EROFS: the device or file system is failing), any failed fsync (Linux may drop the
//! dirty pages and clear the error, so a retried fsync can succeed without the data), and
//! any sled failure other than running out of space.
//!
//! # Recovery
//!
//! [`Journal::open`] scans the last segment record by record (length bounds and crc),
//! truncates a torn or corrupt tail at the last valid record, and does the same to any
//! closed segment that lacks its end marker (sealing it afterwards) — but never below the
//! end of the log the last clean close recorded (`ferrymq:clean-end:v1` in sled): every
//! record there was synced, so a bad one is damage, and the open fails with
//! [`JournalError::Corrupt`] having changed nothing. Corruption inside a sealed segment is
//! not scanned for: reading such a record returns [`JournalError::Corrupt`]. Then it reads the consume queues' settled offsets back from
//! sled, reads the effects records from the checkpoint to the end and applies them again
//! — to sled as blind writes (one sled already holds changes nothing), to the consume
//! queues by writing every entry they add (whatever a crash left in a file past the
//! checkpoint, torn or not, is overwritten) and settling every one they remove — takes the
//! counters from the `counters` tree and cuts every consume-queue file at its queue's next
//! offset: recovery time is bounded by the log written in two checkpoint intervals (or
//! [`JournalConfig::checkpoint_bytes`]), not by the backlog. A clean close records a
//! checkpoint at the end of the log, so the next open replays nothing.
//!
//! If sled's applied mark lies past the end of the recovered log (a power loss under
//! `Interval`/`Never` took records whose changes sled had flushed), or an effects record
//! does not read back, the index is scanned instead: every consume-queue entry, retained
//! entry and timer that does not point inside a live segment — in particular every one at
//! or past the valid tail — is dropped (an entry is settled), and the counters are rebuilt
//! and written back.
//!
//! # Retention
//!
//! On the writer thread, after batches and when idle, at most once a second: a closed
//! segment (never the active one) is deleted only when no pointer, retained entry or timer
//! refers into it, it holds no effects record past the durable checkpoint (a crash would
//! replay it), and it is older than `max_age` (file modification time), or the log is
//! larger than `max_bytes`, or the file system is fuller than `max_disk_used_ratio` or has
//! less free space than `min_disk_free_bytes` (oldest first, until enough is freed).
//! Reading a record of a deleted segment returns [`JournalError::NotFound`].
//!
//! Still short of space after that, retention rolls the active segment over (the end
//! marker after its last record, synced; a new segment at the same position) once nothing
//! refers into it and it holds what is missing or at least 1 MiB, and deletes it as soon as
//! the checkpoint covers it: on a small file system the whole log may sit in the active
//! segment. [`Journal::roll_segment`] rolls over on request. For the same reason
//! [`JournalConfig::segment_size`] is capped at open at an eighth of the file system (never
//! below 1 MiB).
//!
//! # Modules
//!
//! The public API lives at the crate root, re-exported from: `journal` (the [`Journal`]
//! handle: open, submit, read, close), `op` (what a submission says and gets back: [`Op`],
//! [`Append`], [`Record`], [`Receipt`], [`Completion`], ...), `types` (positions, ids and
//! what reads return: [`LogPos`], [`QueueId`], [`Pointer`], [`TimerEntry`],
//! [`JournalStats`], ...), `config` ([`JournalConfig`], [`FsyncPolicy`], [`Retention`]),
//! `error` ([`JournalError`]) and `hash` ([`fnv1a`]).
//!
//! Internal: `segment` (one segment file: framing, pread, recovery scan), `log` (ordered
//! segments, reads, appends, rollover, fsync), `cq` (consume-queue files and settled
//! offsets), `codec` (sled key/value encodings), `db`
//! (sled trees and read queries), `overlay` (pending sled changes of one group commit),
//! `queue_changes` (its pending consume-queue changes, typed),
//! `effects` (those changes as an effects record), `refs` (per-segment reference counts),
//! `retention` (which segments to delete), `recovery` (log replay and index recovery at
//! open), `checkpoint` (the checkpointer thread, checkpoint positions, the counters tree),
//! `format` (the layout version), `ballast` (reserved space), `state` (what handles and the
//! writer share), `writer` (the writer thread: batching, applying ops, the reads it serves,
//! the drain, the failure policy and retention, a submodule each), `guard` (the check that keeps blocking
//! calls off async runtime workers).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod ballast;
mod checkpoint;
mod codec;
mod config;
mod cq;
mod db;
mod effects;
mod error;
mod format;
mod guard;
mod hash;
mod histogram;
mod journal;
mod log;
mod op;
mod overlay;
mod queue_changes;
mod recovery;
mod refs;
mod retention;
mod segment;
mod state;
mod types;
mod writer;

pub use config::{FsyncPolicy, JournalConfig, Retention};
pub use error::JournalError;
pub use format::LAYOUT;
pub use guard::{allow_blocking, blocking_forbidden, forbid_blocking};
pub use hash::fnv1a;
pub use histogram::{HistogramSnapshot, BATCH_SUBMISSIONS, FSYNC_MICROS};
pub use journal::Journal;
pub use op::{Append, Appended, Completion, MessageKeys, Op, QueueTarget, Receipt, Record, Space, Timer};
pub use types::{JournalStats, KeyHit, LogPos, Pointer, QueueId, TimerEntry};
