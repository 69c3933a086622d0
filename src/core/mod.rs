//! The core every front-end shares: one message type, one routing table, one queue
//! abstraction, one journal.
//!
//! # The narrow waist
//!
//! The front-ends reach durable state only through the core: messages through
//! [`broker::Broker::publish`] and [`broker::Broker::schedule`], everything else through
//! the typed stores of [`store`] (sessions, inbound QoS 2 ids, entity metadata,
//! de-duplication ids, queue names), whose writes the broker commits. They never build
//! journal operations or name a keyspace. The stores are traits, so a replicated
//! implementation (a Raft log carrying the same batches) can replace the local one
//! without touching the front-ends; the core's own state (consume-queue pointers, retry
//! records, stream cursors) goes through the journal API, which is narrow for the same
//! reason.
//!
//! The core's in-memory state (routing table, queue owners, retained messages, counters,
//! connections, limits) is private to it as well: outside `src/core` it is changed and
//! read through [`broker::Broker`]'s methods only (see its "One door").
//!
//! - [`message`] — the core `Message` and its commit-log header encoding.
//! - [`router`] — the routing table (MQTT topic filters = bindings of `amq.topic`) and
//!   the `x-consistent-hash` exchange's ring.
//! - [`tag_filter`] — message tags and tag filter expressions.
//! - [`stable_hash`] — the hash that rings and stored tag hashes rely on.
//! - [`delivery`] — what flows from the core to connections.
//! - [`queue`] — a consume queue's state (ready, unacked, credit, limits, paging).
//! - [`stream`] — append-only streams (per-consumer cursors, retention).
//! - [`shards`] — the queue-owner tasks.
//! - [`appended`] — pointers a journal submission appended, on their way to the queue owners.
//! - [`retained`] — retained messages in memory.
//! - [`scheduler`] — fires the journal's timers: delayed delivery and due retries.
//! - [`alarm`] — the memory and disk alarms (publishers wait while one is raised).
//! - [`timer_wheel`] — a shared wheel of coarse deadlines that wake connections.
//! - [`broker`] — the shared core, its publish path, and the methods through which
//!   everything outside the core acts on it.
//! - [`restore`] — what start-up reads back, all before anything is applied, and why it
//!   refuses to start (the record's kind and key).
//! - [`blocking`] — the runtime the broker runs on, and blocking work kept off its workers.
//! - [`store`] — typed stores of the front-ends' durable state, and their local implementation.
//! - [`dedup`] — publisher de-duplication within a time window.
//! - [`data_dir`] — the data directory's journal: opened (with the `[storage]` settings),
//!   started on and closed for the composition root.
//! - [`dead_letter`] — republishing dead letters with `x-death`.
//! - [`entities`] — entity management: declared queues, exchanges and bindings, their
//!   arguments and RabbitMQ's checks, shared by every entry point.
//! - [`retry`] — the formats of retry timers and of the records of entries waiting for a
//!   delayed retry.
//! - [`stats`] — counters.
//! - [`connections`] — the client connections of both protocols, as operations see them.
//! - [`limits`] — per-virtual-host and per-user limits (connections, channels, queues).
//! - [`value`] — typed header values (AMQP field tables).
//! - [`duration`] — durations written as a number and a unit (`30s`, `7D`).

pub(crate) mod alarm;
pub(crate) mod appended;
pub mod blocking;
pub mod broker;
pub(crate) mod connections;
pub(crate) mod data_dir;
pub(crate) mod dead_letter;
pub(crate) mod dedup;
pub(crate) mod delivery;
pub(crate) mod duration;
pub(crate) mod entities;
pub(crate) mod limits;
pub mod message;
pub(crate) mod queue;
pub(crate) mod restore;
pub(crate) mod retained;
pub(crate) mod retry;
pub mod router;
pub(crate) mod scheduler;
pub(crate) mod shards;
pub(crate) mod stable_hash;
pub(crate) mod stats;
pub mod store;
pub(crate) mod stream;
pub(crate) mod tag_filter;
pub(crate) mod timer_wheel;
pub(crate) mod value;

/// Storage's vocabulary that the front-ends speak through the core: a queue's id, the
/// journal's counters and their histograms. Nothing outside `src/core` (but the composition
/// root, which opens the journal) names `ferrymq_storage` (`.ci/run`'s layout check).
pub use ferrymq_storage::{HistogramSnapshot, JournalError, JournalStats, QueueId};
