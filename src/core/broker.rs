//! The broker core shared by every front-end: the journal and the stores on it, the
//! routing table, the queue owners, retained messages, counters. [`Broker::publish`] is the
//! one send path: fan out to connected sessions directly, write the body once with one
//! pointer per target queue, and signal durability to the publisher. [`Broker::commit`]
//! applies the front-ends' [`StoreWrite`]s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferrymq_storage::{Append, Journal, JournalError, Op, QueueId, QueueTarget, Record, Timer};
use tokio::sync::{oneshot, Notify};

use super::appended::{AppendedBatch, MessageTargets};
use super::dead_letter::DeadLetterQueuesHook;
use super::dedup::{DedupCache, DedupChange};
use super::delivery::{Direct, Handoff};
use super::message::{now_ms, Message, SharedMessage};
use super::queue::flags;
use super::retained::RetainedStore;
use super::router::{QueueRoute, Router, Routes};
use super::shards::Shards;
use super::stats::Stats;
use super::store::{command_ops, Command, JournalStore, StoreError, StoreWrite, Stores};

mod clients;
mod data_group;
mod members;
#[cfg(doctest)]
mod private_fields;
mod queues;
mod retained;
mod routing;
mod status;

pub use data_group::DataGroupAppender;
pub use members::{ForwardedRoute, Joint, MemberForwarder};
pub use queues::StreamSubscription;
pub use routing::RoutingView;

/// Resolves once a publish is durable (or failed to be stored).
pub type DurableSignal = oneshot::Receiver<Result<(), JournalError>>;

/// A signal that already says the write failed with `e`.
fn failed_signal(e: StoreError) -> DurableSignal {
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(Err(match e {
        StoreError::Journal(e) => e,
        StoreError::Record(e) => JournalError::Io(e.to_string()),
        e @ (StoreError::NotCommitted(_) | StoreError::Refused(_)) => JournalError::Io(e.to_string()),
    }));
    rx
}

/// What to do with the retained store for a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainMode {
    /// Not a retained publish.
    None,
    /// Set (or clear, for an empty payload) the retained message, durably.
    Persist,
    /// Set it in memory only (`$SYS` topics).
    MemoryOnly,
}

/// Prefix of the names of clean sessions' spill queues (`mqtt-spill/{link id}`): they
/// live as long as their connection; those left by a crash are deleted at start.
pub const SPILL_QUEUE_PREFIX: &str = "mqtt-spill/";

pub use super::store::Commit;

impl MessageTargets {
    /// The pointer targets of `msg` routed to `queues`, and what the completion needs to
    /// hand the new pointers to their queue owners; the tag hash is computed once.
    pub fn for_queues(msg: &SharedMessage, queues: &[QueueRoute]) -> (Vec<QueueTarget>, MessageTargets) {
        let tag_hash = msg.tag_hash();
        let targets: Vec<QueueTarget> = queues
            .iter()
            .map(|q| QueueTarget {
                queue: q.queue,
                tag_hash,
                flags: flags::of(msg.qos.min(q.qos), msg.props.priority) | if q.reserved { flags::RESERVED } else { 0 },
            })
            .collect();
        let kept = targets.iter().map(|q| (q.queue, q.flags)).collect();
        (targets, MessageTargets { msg: msg.clone(), targets: kept, tag_hash })
    }
}

/// The core every front-end shares: one per broker process.
///
/// # One door
///
/// Outside `src/core` the broker is reached through its methods only: its state (the
/// routing table, the queue owners, retained messages, counters, connections, limits)
/// is private to the core, so the front-ends, links and the management API act on it
/// through one door, where each change says what it does
/// ([`Broker::subscribe`], [`Broker::ack`], [`Broker::purge_queue`], [`Broker::set_limits`])
/// and reads go through read-only views ([`Broker::routing`], [`Broker::connections`]).
/// Only [`Broker::stores`] is public, behind [`Broker::commit`].
///
/// So this does not compile outside the core:
///
/// ```compile_fail,E0616
/// fn subscriptions(broker: &ferrymq::core::broker::Broker) -> usize {
///     broker.router.len()
/// }
/// ```
///
/// while this does:
///
/// ```
/// fn subscriptions(broker: &ferrymq::core::broker::Broker) -> usize {
///     broker.routing().subscriptions()
/// }
/// ```
pub struct Broker {
    /// The commit log and keyed state; only the core uses it (front-ends go through
    /// [`Broker::stores`] and [`Broker::commit`]).
    pub(in crate::core) journal: Journal,
    /// Typed stores of the front-ends' durable state, on the journal.
    pub(in crate::core) stores: Stores,
    /// Exchanges, bindings and MQTT subscriptions: where a publish goes.
    pub(in crate::core) router: Router,
    /// Queue owners: the shard tasks holding every queue and stream, driven by
    /// [`ShardCmd`](crate::core::shards::ShardCmd)s.
    pub(in crate::core) shards: Shards,
    /// Retained messages by routing key, in memory; the journal keeps the durable copy.
    pub(in crate::core) retained: RetainedStore,
    /// Counters behind the `$SYS/broker/...` topics.
    pub(in crate::core) stats: Stats,
    /// The client connections of both protocols (the management API lists and closes them).
    pub(in crate::core) connections: super::connections::Connections,
    /// Per-virtual-host and per-user limits in force.
    pub(in crate::core) limits: super::limits::Limits,
    /// When the core was built; `$SYS/broker/uptime` counts from it.
    pub(in crate::core) started: Instant,
    /// Woken when a timer earlier than the scheduler's next one is added (by a publish or
    /// by a shard storing a retry timer).
    pub(in crate::core) timers_changed: Arc<Notify>,
    /// Where `%DLQ%` queues come from (set by the queue registry at start).
    pub(in crate::core) dead_letter_queues: DeadLetterQueuesHook,
    /// Which member of each partitioned (or single-active) stream group reads what.
    pub(in crate::core) assignments: crate::core::stream::assignment::Assignments,
    /// Where publishes for other cluster members go (a cluster member's; unset on a
    /// single node).
    pub(in crate::core) members: std::sync::OnceLock<Arc<dyn MemberForwarder>>,
    /// Where publishes to the queues a cluster's data group holds go (unset on a single
    /// node).
    pub(in crate::core) data_group: std::sync::OnceLock<Arc<dyn DataGroupAppender>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").field("subscriptions", &self.router.len()).finish_non_exhaustive()
    }
}

impl Broker {
    /// The journal's counters and histograms (for `/metrics` and the overview).
    pub fn journal_stats(&self) -> ferrymq_storage::JournalStats {
        self.journal.stats()
    }

    /// Delayed messages waiting for their time (timers that are not retries), counted up
    /// to `limit`; the scan of the timer index runs on the blocking pool.
    pub async fn delayed_pending(&self, limit: usize) -> Result<u64, StoreError> {
        let journal = self.journal.clone();
        let counted =
            super::blocking::spawn(move || journal.count_timers(limit, &|target| !super::retry::is_tagged(target)))
                .await
                .map_err(|e| JournalError::Io(format!("counting delayed messages failed: {e}")))?;
        Ok(counted?)
    }

    /// Builds the core on an open journal with started shards; MQTT goes through the
    /// topic exchange `mqtt_exchange` of `/`.
    pub fn new(journal: Journal, shards: Shards, mqtt_exchange: &str) -> Broker {
        let timers_changed = shards.timers_changed();
        Broker {
            stores: Stores::local(&journal),
            journal,
            router: Router::with_mqtt_exchange(mqtt_exchange),
            shards,
            retained: RetainedStore::new(),
            stats: Stats::default(),
            connections: Default::default(),
            limits: Default::default(),
            started: Instant::now(),
            timers_changed,
            dead_letter_queues: DeadLetterQueuesHook::new(),
            assignments: crate::core::stream::assignment::Assignments::new(),
            members: std::sync::OnceLock::new(),
            data_group: std::sync::OnceLock::new(),
            next_id: AtomicU64::new(1),
        }
    }

    /// Counts a new connection to `vhost` by `user` (`None`: anonymous) against the
    /// `max-connections` limits of both; refused past either.
    pub fn admit(
        &self,
        vhost: &str,
        user: Option<&str>,
    ) -> Result<super::connections::Admission, super::connections::LimitReached> {
        use super::limits::{LimitScope, MAX_CONNECTIONS};
        let limits = super::connections::AdmissionLimits {
            vhost_connections: self.limits.get(LimitScope::Vhost, vhost, MAX_CONNECTIONS),
            user_connections: user.and_then(|u| self.limits.get(LimitScope::User, u, MAX_CONNECTIONS)),
        };
        self.connections.admit(vhost, user, limits)
    }

    /// Clears the retained message of routing key `key`, durably, without publishing
    /// anything (an operator's delete).
    pub async fn clear_retained(&self, key: &str) -> Result<(), StoreError> {
        if self.members.get().is_none() {
            // A cluster member's memory changes when the metadata group applies it.
            self.retained.set(key, None);
        }
        self.commit(StoreWrite::one(Command::ClearRetained { topic: key.to_owned() }), Commit::Durable).await
    }

    /// Up to `limit` stored messages with key `key` (their `message_id`, `x-key` or MQTT
    /// `key`) stored in `from_ms..=to_ms`, oldest first: (commit-log position, the time
    /// indexed, the message). A lookup in the key index, not a scan of the log; the index
    /// and the records are read on the blocking pool.
    pub async fn messages_by_key(
        &self,
        key: &str,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64, Message)>, JournalError> {
        let journal = self.journal.clone();
        let key = key.to_owned();
        super::blocking::spawn(move || {
            let hits = journal.lookup_key(key.as_bytes(), from_ms, to_ms, limit)?;
            let mut found = Vec::with_capacity(hits.len());
            for hit in hits {
                let record = journal.read(hit.pos)?;
                if let Ok(msg) = Message::decode(record.header, record.body) {
                    found.push((hit.pos.0, hit.timestamp_ms, msg));
                }
            }
            Ok(found)
        })
        .await
        .unwrap_or_else(|e| Err(JournalError::Io(format!("the key lookup failed: {e}"))))
    }

    /// Bytes the commit log's live segments hold on disk.
    pub fn stored_bytes(&self) -> u64 {
        self.journal.stats().log_bytes
    }

    /// A fresh id, unique for this broker run (sessions, consumers, groups).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Applies a batch of commands through the state machine, waiting as `wait` says.
    pub async fn commit(&self, write: StoreWrite, wait: Commit) -> Result<(), StoreError> {
        if write.is_empty() {
            return Ok(());
        }
        self.stores.state.apply(write, wait).await
    }

    /// The spill queue of the clean session `link_id` (made on its first spill, without
    /// blocking: by the journal's writer thread).
    async fn spill_queue(&self, link_id: u64) -> Option<QueueId> {
        match self.stores.catalog.queue_id(&format!("{SPILL_QUEUE_PREFIX}{link_id}")).await {
            Ok(q) => Some(q),
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a spill queue; deliveries to a full session are dropped");
                None
            }
        }
    }

    /// The store write of changes to disk-persistent de-duplication caches.
    pub(in crate::core) fn dedup_write(&self, changes: &[DedupChange]) -> StoreWrite {
        changes.iter().fold(StoreWrite::none(), |w, c| {
            w.and(match c {
                DedupChange::Seen { scope, id, expiry_ms } => self.stores.dedup.record(scope, id, *expiry_ms),
                DedupChange::Forgotten { scope, id } => self.stores.dedup.forget(scope, id),
            })
        })
    }

    /// Fills the caches of disk-persistent de-duplication exchanges with the values start-up
    /// read (`stored`: scope, id, expiry) and forgets stored values no such exchange owns any
    /// more (expired, evicted, or of an exchange that is gone). Run once everything stored
    /// was restored, so that an exchange that could not be read never has its values
    /// forgotten.
    pub async fn restore_dedup_caches(&self, stored: Vec<(String, String, u64)>) {
        let caches: HashMap<String, Arc<DedupCache>> = self
            .router
            .dedup_caches()
            .into_iter()
            .filter(|c| c.settings().disk)
            .map(|c| (c.scope().to_owned(), c))
            .collect();
        let mut by_scope: HashMap<String, Vec<(String, u64)>> = HashMap::new();
        for (scope, id, expiry) in stored {
            by_scope.entry(scope).or_default().push((id, expiry));
        }
        let now = now_ms();
        let mut write = StoreWrite::none();
        let mut restored = 0usize;
        for (scope, values) in by_scope {
            match caches.get(&scope) {
                Some(cache) => {
                    write = write.and(self.dedup_write(&cache.restore(values, now)));
                    restored += cache.len();
                }
                None => write = write.and(self.stores.dedup.forget_scope(&scope)),
            }
        }
        if let Err(e) = self.commit(write, Commit::Queued).await {
            tracing::warn!(error = %e, "cannot forget stale de-duplication values");
        }
        if restored > 0 {
            tracing::info!(values = restored, "restored de-duplication caches");
        }
    }

    /// Publishes `msg` to `routes`: direct to connected sessions at once, and — when there
    /// are queue targets, a retained update to persist, or a write `along` — through the
    /// journal (body once, one pointer per queue, `along` in the same submission). Returns
    /// a signal that resolves when the journal work is durable, or `None` when nothing
    /// needed storing.
    pub async fn publish(
        &self,
        msg: &SharedMessage,
        routes: &Routes,
        retain: RetainMode,
        along: StoreWrite,
    ) -> Option<DurableSignal> {
        let along = match self.along_ops(along).await {
            Ok(ops) => ops,
            Err(e) => return Some(failed_signal(e)),
        };
        self.publish_with_ops(msg, routes, retain, along).await
    }

    /// The journal operations of commands that go along with a message, for its
    /// submission. They usually read nothing first (inbound QoS 2 ids, de-duplication ids)
    /// and are encoded at once; anything else the long way.
    async fn along_ops(&self, along: StoreWrite) -> Result<Vec<Op>, StoreError> {
        match JournalStore::ops_now(&along) {
            Some(ops) => Ok(ops),
            None => JournalStore::new(&self.journal).ops(along).await,
        }
    }

    /// [`Broker::publish`] with journal operations of the core's own (a dead-lettered
    /// entry's removal) in the same submission.
    pub(in crate::core) async fn publish_with_ops(
        &self,
        msg: &SharedMessage,
        routes: &Routes,
        retain: RetainMode,
        along: Vec<Op>,
    ) -> Option<DurableSignal> {
        // Only drops are counted here (rare); per-message counters are kept per connection
        // and added in batches, so this path touches no shared cache line per message.
        // No subscriber is waited for: a full buffer drops QoS 0 and spills QoS 1/2 to the
        // session's spill queue, stored with this publish.
        let mut dropped = 0u64;
        let mut spilled: Vec<QueueRoute> = Vec::new();
        for r in &routes.sessions {
            let direct = || Direct {
                msg: msg.clone(),
                qos: r.qos,
                retain_as_published: r.retain_as_published,
                subscription_ids: r.subscription_ids.clone(),
            };
            let mut handoff = r.link.deliver(direct(), || None);
            if handoff == Handoff::NeedsSpillQueue {
                // The session's first spill (once per connection): its queue is made
                // without holding the link's lock, then the delivery is handed over again.
                handoff = match self.spill_queue(r.link.id).await {
                    Some(queue) => r.link.deliver(direct(), || Some(queue)),
                    None => {
                        r.link.spill_queue_failed();
                        Handoff::Dropped
                    }
                };
            }
            match handoff {
                Handoff::Sent | Handoff::Gone => {}
                Handoff::Dropped | Handoff::NeedsSpillQueue => dropped += 1,
                Handoff::Spill(queue) => spilled.push(QueueRoute { queue, qos: r.qos, reserved: false }),
            }
        }
        Stats::add(&self.stats.publish_dropped, dropped);
        Stats::add(&self.stats.dropped_queue_full, dropped);

        let mut ops = along;
        for command in self.dedup_write(&routes.dedup).commands() {
            command_ops(command, &mut ops);
        }
        let mut append_targets = None;
        let clear = msg.payload.is_empty();
        let retained_topic = match retain {
            RetainMode::None => None,
            // A cluster member: the retained store changes on every member alike, through
            // the metadata group, before the publish is acknowledged.
            RetainMode::Persist if self.members.get().is_some() => {
                let change = match clear {
                    true => Command::ClearRetained { topic: msg.routing_key.clone() },
                    false => Command::SetRetained { message: msg.clone() },
                };
                if let Err(e) = self.commit(StoreWrite::one(change), Commit::Durable).await {
                    return Some(failed_signal(e));
                }
                None
            }
            RetainMode::MemoryOnly => {
                self.retained.set(&msg.routing_key, (!clear).then(|| msg.clone()));
                None
            }
            RetainMode::Persist => {
                self.retained.set(&msg.routing_key, (!clear).then(|| msg.clone()));
                if clear {
                    command_ops(&Command::ClearRetained { topic: msg.routing_key.clone() }, &mut ops);
                    None
                } else {
                    Some(msg.routing_key.clone())
                }
            }
        };
        let queue_routes: std::borrow::Cow<'_, [QueueRoute]> = if spilled.is_empty() {
            std::borrow::Cow::Borrowed(&routes.queues)
        } else {
            std::borrow::Cow::Owned([&routes.queues[..], &spilled[..]].concat())
        };
        // A cluster member's streams: committed through the data group, appended here (and
        // on every member) when the group applies them.
        let share = self.group_share(&queue_routes);
        let (queue_routes, held): (std::borrow::Cow<'_, [QueueRoute]>, _) = match share {
            Some(share) => (std::borrow::Cow::Owned(share.kept), Some((share.held, share.group))),
            None => (queue_routes, None),
        };
        if !queue_routes.is_empty() || retained_topic.is_some() {
            let (queues, targets) = MessageTargets::for_queues(msg, &queue_routes);
            ops.insert(
                0,
                Op::Append(Append {
                    record: Record { header: msg.encode_header(), body: msg.payload.clone() },
                    queues,
                    retained_topic,
                    timer: None,
                    keys: msg.index_keys(),
                }),
            );
            append_targets = Some(targets);
        }
        // Only what a publisher waits to hear about needs an fsync before the signal.
        let mut local = match ops.is_empty() {
            true => None,
            false => Some(self.submit(ops, append_targets.into_iter().collect(), msg.qos > 0).await),
        };
        if let Some((held, group)) = held {
            // The group's commit, and this member's own storing when there is one (a publish
            // to a stream and to a queue of this member's at once: rare).
            let (joint, signal) = Joint::new(1 + usize::from(local.is_some()), None);
            if let Some(own) = local.take() {
                let joint = joint.clone();
                tokio::spawn(async move { joint.done(own.await.unwrap_or(Err(JournalError::Closed))) });
            }
            group.append(msg, held, joint);
            local = Some(signal);
        }
        self.forward_to_members(msg, &routes.members, local)
    }

    /// Stores `msg` to be routed in `vhost` at `due_ms` (delayed publish), with the write
    /// `along` in the same submission. The signal resolves when the delayed message is
    /// durable.
    pub async fn schedule(&self, vhost: &str, msg: &SharedMessage, due_ms: u64, along: StoreWrite) -> DurableSignal {
        let mut ops = match self.along_ops(along).await {
            Ok(ops) => ops,
            Err(e) => return failed_signal(e),
        };
        ops.insert(
            0,
            Op::Append(Append {
                record: Record { header: msg.encode_header(), body: msg.payload.clone() },
                queues: Vec::new(),
                retained_topic: None,
                timer: Some(Timer { due_ms, target: bytes::Bytes::copy_from_slice(vhost.as_bytes()) }),
                keys: msg.index_keys(),
            }),
        );
        let signal = self.submit(ops, Vec::new(), true).await;
        self.timers_changed.notify_one();
        signal
    }

    /// Resolves once everything submitted to the journal before it has been applied and
    /// handed to its queues (a cheap barrier: no fsync).
    pub async fn barrier(&self) {
        let (tx, rx) = oneshot::channel();
        let done: ferrymq_storage::Completion = Box::new(move |_| {
            let _ = tx.send(());
        });
        if self.journal.submit_relaxed(Vec::new(), Some(done)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Submits journal ops whose Append/Enqueue results (in op order) correspond to `targets`;
    /// the completion hands the new pointers to their queue owners in log order and then
    /// resolves the returned signal — after the fsync when `durable` (policy `always`),
    /// else once written.
    ///
    /// The completion runs on the journal writer thread: it passes the receipt on as one
    /// [`AppendedBatch`] to the shards that own its queues, copied into owned entries when
    /// narrow, shared whole when wide (see [`super::appended`]).
    pub(in crate::core) async fn submit(
        &self,
        ops: Vec<Op>,
        targets: Vec<MessageTargets>,
        durable: bool,
    ) -> DurableSignal {
        let (tx, rx) = oneshot::channel();
        let shards = self.shards.clone();
        let done: ferrymq_storage::Completion = Box::new(move |result| {
            let result = result.map(|receipt| shards.send_appended(AppendedBatch::new(receipt.appended, targets)));
            let _ = tx.send(result);
        });
        let submitted = if durable {
            self.journal.submit(ops, Some(done)).await
        } else {
            self.journal.submit_relaxed(ops, Some(done)).await
        };
        if let Err(e) = submitted {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Err(e));
            return rx;
        }
        rx
    }
}
