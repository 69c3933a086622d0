//! Queue owners: tasks sharded by queue id. Each shard is the single writer of the queues
//! that hash to it (ready lists, unacked sets, credit), so per-queue order needs no lock.
//! A shard drains a batch of commands per turn, pumps the queues they touched, submits
//! the resulting journal ops (acks, drops) as one submission, and hands messages leaving
//! for a dead-letter exchange to the dead-letter task. Queues whose messages may expire
//! are swept on a timer. Streams ([`super::stream`]) live in the same shards, next to the
//! queues: a queue id configured as a stream is served by its [`Stream`], whose retention
//! is enforced on a timer.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ferrymq_storage::{Journal, Pointer, QueueId};
use tokio::sync::{mpsc, oneshot, Notify};
use tracing::warn;

use super::appended::{AppendedBatch, OwnedEntry};
use super::message::{now_ms, SharedMessage};
use super::queue::{Consumer, ConsumerId, DeadLetter, Effects, Got, Queue, QueueConfig, RequeueCause};
use super::stream::{Stream, StreamConfig, StreamOffset};

/// Commands handled per shard turn before pumping and flushing.
const BATCH: usize = 512;
/// Batches of at most this many pointers go to their shards as owned entries (a copy per
/// pointer, the batch dropped where it was made); wider ones are shared.
const NARROW_BATCH: usize = 16;
/// How often queues with expiring messages are swept.
const EXPIRY_SWEEP: Duration = Duration::from_millis(200);
/// How often stream retention (`x-max-age`, `x-max-length-bytes`) is enforced.
const RETENTION_PASS: Duration = Duration::from_secs(1);
/// Entries of a stream loaded at start whose bytes one sweep counts (pointer reads only):
/// 10 million entries are counted in about half a minute, a page at a time.
const BYTES_COUNTED_PER_SWEEP: usize = 65_536;

/// A command for a queue owner, sent to the shard its queue id hashes to.
#[derive(Debug)]
pub enum ShardCmd {
    /// Pointers the journal appended, in log order: a batch shared by every shard that owns
    /// one of its queues, each taking its own (see [`Shards::send_appended`]).
    Appended(Arc<AppendedBatch>),
    /// The pointers of a narrow batch that belong to this shard, in log order.
    Entries(Vec<OwnedEntry>),
    /// Set (or replace) the behaviour of a queue; queues never configured use the shard's
    /// default (MQTT session limits).
    Configure {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// The new configuration; a live queue keeps its entries and takes it on.
        config: Arc<QueueConfig>,
    },
    /// Make a queue id a stream with these retention settings (or update them).
    ConfigureStream {
        /// Stream the command is for (it decides the shard).
        queue: QueueId,
        /// The new retention limits; the stream keeps its entries until its next retention pass.
        config: Arc<StreamConfig>,
    },
    /// Attach a consumer to a stream, reading from `start`.
    AttachStream {
        /// Stream the command is for (it decides the shard).
        queue: QueueId,
        /// The consumer (its credit is its prefetch).
        consumer: Consumer,
        /// Where it starts (a group with a stored cursor resumes there instead).
        start: StreamOffset,
        /// The consumer group it joins (`x-consumer-group`), if any.
        group: Option<String>,
        /// Its tag filter (`x-tag-filter`), if any.
        filter: Option<crate::core::tag_filter::TagFilter>,
        /// The group is read by one member at a time, chosen by [`ShardCmd::ActivateMember`]
        /// (a partition of a super stream, or a single-active group).
        exclusive: bool,
    },
    /// Names the member of a stream's exclusive group that reads it from now on.
    ActivateMember {
        /// Stream the command is for (it decides the shard).
        queue: QueueId,
        /// Name of the consumer group (`x-consumer-group`).
        group: String,
        /// The member's consumer (`None`: nobody).
        consumer: Option<ConsumerId>,
    },
    /// Move a stream consumer group's committed offset; answers the new offset (`None`
    /// when the queue is not a stream).
    ResetGroup {
        /// Stream the command is for (it decides the shard).
        queue: QueueId,
        /// Name of the consumer group (`x-consumer-group`).
        group: String,
        /// Where to (an offset, a timestamp, first, last, next).
        to: StreamOffset,
        /// Where the answer goes.
        reply: oneshot::Sender<Option<u64>>,
    },
    /// A stream consumer settled a delivery (ack, nack or reject): credit back, nothing
    /// removed.
    StreamSettle {
        /// Stream the command is for (it decides the shard).
        queue: QueueId,
        /// Consumer it concerns.
        consumer: ConsumerId,
        /// Offset of the entry in the queue.
        offset: u64,
    },
    /// Attach a consumer.
    Attach {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// The consumer: its id, delivery channel, credit and QoS limit.
        consumer: Consumer,
    },
    /// Remove a consumer, leaving its unacked entries unacked (AMQP basic.cancel).
    Cancel {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Consumer it concerns.
        consumer: ConsumerId,
    },
    /// Detach a consumer; its unacked entries become ready again.
    Detach {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Consumer it concerns.
        consumer: ConsumerId,
    },
    /// The consumer is done with an entry.
    Ack {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Offset of the entry in the queue.
        offset: u64,
    },
    /// Put an unacked entry back in line (nack/reject with requeue, channel closed).
    Requeue {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Offset of the entry in the queue.
        offset: u64,
        /// Why it comes back (decides whether it waits for a delayed retry).
        cause: RequeueCause,
        /// The consumer it was delivered to: a requeue for a delivery the queue has since
        /// handed to another consumer (after a take-over) is stale and ignored.
        consumer: ConsumerId,
    },
    /// The retry timer of a waiting entry fired: it is ready again.
    RetryDue {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Offset of the entry in the queue.
        offset: u64,
        /// When the timer was due.
        due_ms: u64,
    },
    /// Drop (or dead-letter) an unacked entry (nack/reject without requeue).
    Reject {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Offset of the entry in the queue.
        offset: u64,
    },
    /// QoS 2: PUBREC arrived for an entry.
    Release {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Offset of the entry in the queue.
        offset: u64,
        /// Told once the release is durable (the PUBREL may go then: a crash before it
        /// leaves the session sending the PUBLISH again, which the client recognises).
        done: Option<oneshot::Sender<()>>,
    },
    /// Give a consumer more credit.
    Credit {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Consumer it concerns.
        consumer: ConsumerId,
        /// Deliveries added to its credit (not a new total).
        n: u32,
    },
    /// Take one message (AMQP basic.get).
    Get {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Who takes it (for the ack, or the requeue when the channel closes).
        consumer: ConsumerId,
        /// basic.get `no-ack`: the message leaves the queue when taken; else it waits for an ack.
        no_ack: bool,
        /// The message, if any.
        reply: oneshot::Sender<Option<Got>>,
    },
    /// Remove every ready message; answers how many.
    Purge {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Where the answer goes.
        reply: oneshot::Sender<u64>,
    },
    /// Remove the queue and all its entries; consumers are told they were cancelled.
    Delete {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Answered with the message count once the deletion is stored.
        done: Option<oneshot::Sender<u64>>,
    },
    /// Report (ready messages, consumers). Answered at the end of the turn, after the
    /// journal work of every command before it was submitted (written, when durable).
    Counts {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Where the answer goes.
        reply: oneshot::Sender<(u64, u64)>,
    },
    /// Report a stream's extent and consumer groups (`None` for a queue that is not a stream).
    StreamStatus {
        /// Stream the command is for (it decides the shard).
        queue: QueueId,
        /// Where the answer goes.
        reply: oneshot::Sender<Option<super::stream::StreamStatus>>,
    },
    /// Answered at the end of the turn, once the journal work of every command before it
    /// was submitted; sent to every shard by [`Shards::barrier`].
    Barrier(oneshot::Sender<()>),
    /// Report the queue's live length.
    Len {
        /// Queue the command is for (it decides the shard).
        queue: QueueId,
        /// Where the answer goes.
        reply: oneshot::Sender<u64>,
    },
}

impl ShardCmd {
    fn queue(&self) -> Option<QueueId> {
        match self {
            ShardCmd::Appended(_) | ShardCmd::Entries(_) | ShardCmd::Barrier(_) => None,
            ShardCmd::Configure { queue, .. }
            | ShardCmd::ConfigureStream { queue, .. }
            | ShardCmd::AttachStream { queue, .. }
            | ShardCmd::ActivateMember { queue, .. }
            | ShardCmd::StreamSettle { queue, .. }
            | ShardCmd::ResetGroup { queue, .. }
            | ShardCmd::Attach { queue, .. }
            | ShardCmd::Detach { queue, .. }
            | ShardCmd::Cancel { queue, .. }
            | ShardCmd::Ack { queue, .. }
            | ShardCmd::Requeue { queue, .. }
            | ShardCmd::RetryDue { queue, .. }
            | ShardCmd::Reject { queue, .. }
            | ShardCmd::Release { queue, .. }
            | ShardCmd::Credit { queue, .. }
            | ShardCmd::Get { queue, .. }
            | ShardCmd::Purge { queue, .. }
            | ShardCmd::Delete { queue, .. }
            | ShardCmd::Counts { queue, .. }
            | ShardCmd::Len { queue, .. }
            | ShardCmd::StreamStatus { queue, .. } => Some(*queue),
        }
    }
}

/// Handle to every shard.
#[derive(Debug, Clone)]
pub struct Shards {
    txs: Vec<mpsc::UnboundedSender<ShardCmd>>,
    /// Woken when a shard stored a retry timer (shared with the scheduler).
    timers_changed: Arc<Notify>,
}

impl Shards {
    /// Starts `n` shards, each on a thread of its own (with a single-threaded runtime for
    /// its timers and channels): a shard reads sled and the commit log synchronously
    /// (paging queue entries in, reading message bodies), so a slow disk holds up that
    /// shard's queues but never the runtime's workers and the connections they serve.
    /// Queues without a configuration of their own get `default`; messages leaving for a
    /// dead-letter exchange go to `dead`. A shard's thread ends when every handle is gone.
    pub fn start(n: usize, journal: Journal, default: QueueConfig, dead: mpsc::UnboundedSender<DeadLetter>) -> Shards {
        let default = Arc::new(default);
        let timers_changed = Arc::new(Notify::new());
        let txs = (0..n.max(1))
            .map(|i| {
                // Unbounded, and bounded by what feeds it: commands from connections follow
                // their consumers' deliveries (acks, credit: at most the credit granted), their
                // own operations (declare, consume, get: one per client request) and the
                // journal's completions (appended entries: at the journal writer's pace, which
                // publishers await; the memory alarm stops publishers long before a lagging
                // shard's inbox could exhaust memory). The journal writer must never block on
                // a shard, which a bounded inbox would make it do.
                let (tx, rx) = mpsc::unbounded_channel();
                let shard = Shard {
                    index: i,
                    count: n.max(1),
                    journal: journal.clone(),
                    default: default.clone(),
                    dead: dead.clone(),
                    timers_changed: timers_changed.clone(),
                    queues: HashMap::new(),
                    streams: HashMap::new(),
                    configs: HashMap::new(),
                    deleted: HashSet::new(),
                    touched: HashSet::new(),
                    fx: Effects::default(),
                    replies: Vec::new(),
                    count_replies: Vec::new(),
                    barriers: Vec::new(),
                    released: Vec::new(),
                };
                std::thread::Builder::new()
                    .name(format!("ferrymq-shard-{i}"))
                    .spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt.block_on(shard.run(rx)),
                        Err(e) => tracing::error!(error = %e, "cannot start a shard's runtime"),
                    })
                    .expect("a shard thread starts");
                tx
            })
            .collect();
        Shards { txs, timers_changed }
    }

    /// What the shards wake when they store a retry timer: the scheduler waits on it.
    pub fn timers_changed(&self) -> Arc<Notify> {
        self.timers_changed.clone()
    }

    fn shard_of(&self, queue: QueueId) -> usize {
        shard_of(queue, self.txs.len())
    }

    /// Sends a command to the shard owning its queue (a batch of appended pointers to every
    /// shard owning one of them).
    pub fn send(&self, cmd: ShardCmd) {
        let idx = match cmd {
            ShardCmd::Appended(batch) => return self.send_shared_batch(batch),
            ref other => other.queue().map(|q| self.shard_of(q)).unwrap_or(0),
        };
        let _ = self.txs[idx].send(cmd);
    }

    /// Hands the pointers of a journal submission to their queue owners, keeping log order.
    /// Called from the journal's completion (writer thread), never blocks. A wide batch goes
    /// whole, shared, to every shard that owns one of its queues, which build the entries
    /// (see [`AppendedBatch::entries`]): nothing is copied or allocated per pointer. A narrow
    /// one (at most `NARROW_BATCH` pointers, most publishes) is copied into owned entries,
    /// one list per shard, so that the receipt and the targets are freed here, where they
    /// were allocated, instead of on a shard's thread.
    pub fn send_appended(&self, batch: AppendedBatch) {
        let pointers = batch.pointers();
        if pointers == 0 {
            return;
        }
        if pointers > NARROW_BATCH {
            return self.send_shared_batch(Arc::new(batch));
        }
        // A narrow batch (most publishes): each shard gets its own pointers, owned, and the
        // batch is freed here, on the thread that allocated most of it.
        let mut queues = batch.queues().map(|q| self.shard_of(q));
        let first = queues.next().unwrap_or(0);
        if queues.all(|s| s == first) {
            let _ = self.txs[first].send(ShardCmd::Entries(batch.entries().map(OwnedEntry::from).collect()));
            return;
        }
        for (i, tx) in self.txs.iter().enumerate() {
            let mine: Vec<OwnedEntry> =
                batch.entries().filter(|e| self.shard_of(e.queue) == i).map(OwnedEntry::from).collect();
            if !mine.is_empty() {
                let _ = tx.send(ShardCmd::Entries(mine));
            }
        }
    }

    fn send_shared_batch(&self, batch: Arc<AppendedBatch>) {
        let n = self.txs.len();
        if n > 64 {
            // Too many shards for the mask: each looks for its own.
            for tx in &self.txs {
                let _ = tx.send(ShardCmd::Appended(batch.clone()));
            }
            return;
        }
        // Which shards own a queue of the batch: one multiplication per pointer, and the
        // scan stops once every shard is named (after a few pointers of a wide fan-out).
        let all = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        let mut mask = 0u64;
        for q in batch.queues() {
            mask |= 1 << self.shard_of(q);
            if mask == all {
                break;
            }
        }
        for (i, tx) in self.txs.iter().enumerate() {
            if mask & (1 << i) != 0 {
                let _ = tx.send(ShardCmd::Appended(batch.clone()));
            }
        }
    }

    /// Waits until every shard has submitted the journal work of every command sent to it
    /// before this call (the server's shutdown flushes the journal after it, so a
    /// fire-and-forget settlement from a connection that just closed is not lost).
    pub async fn barrier(&self) {
        let mut waits = Vec::with_capacity(self.txs.len());
        for tx in &self.txs {
            let (reply, rx) = oneshot::channel();
            if tx.send(ShardCmd::Barrier(reply)).is_ok() {
                waits.push(rx);
            }
        }
        for rx in waits {
            let _ = rx.await;
        }
    }

    /// Live length of a queue.
    pub async fn len(&self, queue: QueueId) -> u64 {
        let (reply, rx) = oneshot::channel();
        self.send(ShardCmd::Len { queue, reply });
        rx.await.unwrap_or(0)
    }

    /// Deletes a queue and waits until the deletion is stored (its name is free again);
    /// returns how many messages it held.
    pub async fn delete(&self, queue: QueueId) -> u64 {
        let (done, rx) = oneshot::channel();
        self.send(ShardCmd::Delete { queue, done: Some(done) });
        rx.await.unwrap_or(0)
    }

    /// (ready messages, consumers) of a queue, after every command sent before.
    pub async fn counts(&self, queue: QueueId) -> (u64, u64) {
        let (reply, rx) = oneshot::channel();
        self.send(ShardCmd::Counts { queue, reply });
        rx.await.unwrap_or((0, 0))
    }

    /// Purges a queue; returns how many messages were removed.
    pub async fn purge(&self, queue: QueueId) -> u64 {
        let (reply, rx) = oneshot::channel();
        self.send(ShardCmd::Purge { queue, reply });
        rx.await.unwrap_or(0)
    }

    /// Moves a stream consumer group's committed offset to where `to` resolves (the
    /// operation behind an admin reset); returns the new offset, `None` for a non-stream.
    pub async fn reset_group(&self, queue: QueueId, group: &str, to: StreamOffset) -> Option<u64> {
        let (reply, rx) = oneshot::channel();
        self.send(ShardCmd::ResetGroup { queue, group: group.to_owned(), to, reply });
        rx.await.ok().flatten()
    }

    /// A stream's extent and consumer groups; `None` for anything else.
    pub async fn stream_status(&self, queue: QueueId) -> Option<super::stream::StreamStatus> {
        let (reply, rx) = oneshot::channel();
        self.send(ShardCmd::StreamStatus { queue, reply });
        rx.await.ok().flatten()
    }

    /// Takes one message from a queue (basic.get).
    pub async fn get(&self, queue: QueueId, consumer: ConsumerId, no_ack: bool) -> Option<Got> {
        let (reply, rx) = oneshot::channel();
        self.send(ShardCmd::Get { queue, consumer, no_ack, reply });
        rx.await.ok().flatten()
    }
}

/// A `Counts` answer held until the end of the turn: where to send it, and the counts.
type CountsReply = (oneshot::Sender<(u64, u64)>, (u64, u64));

/// The shard of `shards` that owns `queue`.
fn shard_of(queue: QueueId, shards: usize) -> usize {
    // Fibonacci hashing spreads sequential ids.
    (queue.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % shards
}

/// One queue owner.
struct Shard {
    /// Which shard this is, of how many: it takes the pointers of its own queues from the
    /// batches it shares with the others.
    index: usize,
    count: usize,
    journal: Journal,
    default: Arc<QueueConfig>,
    dead: mpsc::UnboundedSender<DeadLetter>,
    timers_changed: Arc<Notify>,
    queues: HashMap<QueueId, Queue>,
    /// Queue ids configured as streams (never in `queues`).
    streams: HashMap<QueueId, Stream>,
    configs: HashMap<QueueId, Arc<QueueConfig>>,
    /// Ids are never reused: commands for a deleted queue (in flight when it was deleted)
    /// are ignored instead of bringing it back.
    deleted: HashSet<QueueId>,
    touched: HashSet<QueueId>,
    fx: Effects,
    replies: Vec<(oneshot::Sender<u64>, u64)>,
    count_replies: Vec<CountsReply>,
    barriers: Vec<oneshot::Sender<()>>,
    /// Waiting for this turn's releases to be durable.
    released: Vec<oneshot::Sender<()>>,
}

impl Shard {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<ShardCmd>) {
        let mut sweep = tokio::time::interval(EXPIRY_SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retention = tokio::time::interval(RETENTION_PASS);
        retention.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                cmd = rx.recv() => {
                    let Some(first) = cmd else { return };
                    let mut next = Some(first);
                    let mut handled = 0;
                    while let Some(cmd) = next.take() {
                        self.handle(cmd);
                        handled += 1;
                        if handled < BATCH {
                            next = rx.try_recv().ok();
                        }
                    }
                }
                _ = sweep.tick() => {
                    for q in self.queues.values_mut().filter(|q| q.may_expire()) {
                        q.expire(&self.journal, &mut self.fx);
                        self.touched.insert(q.id());
                    }
                    for s in self.streams.values_mut().filter(|s| s.counting_bytes()) {
                        if s.count_bytes(&self.journal, BYTES_COUNTED_PER_SWEEP) {
                            self.touched.insert(s.id());
                        }
                    }
                }
                _ = retention.tick() => {
                    let now = now_ms();
                    for s in self.streams.values_mut() {
                        if s.enforce_retention(&self.journal, now, &mut self.fx.ops) {
                            self.touched.insert(s.id());
                        }
                    }
                }
            }
            self.finish_turn().await;
        }
    }

    fn queue(&mut self, id: QueueId) -> &mut Queue {
        let Shard { queues, configs, default, journal, fx, .. } = self;
        queues.entry(id).or_insert_with(|| {
            let config = configs.get(&id).cloned().unwrap_or_else(|| default.clone());
            let mut q = Queue::load(id, config, journal);
            fx.ops.extend(q.take_load_ops());
            q
        })
    }

    /// A new pointer of one of this shard's queues (or streams); `journal` is the shard's
    /// own handle, cloned once per command rather than per pointer.
    fn appended(&mut self, journal: &Journal, queue: QueueId, offset: u64, ptr: Pointer, msg: &SharedMessage) {
        if self.deleted.contains(&queue) {
            return;
        }
        if let Some(s) = self.streams.get_mut(&queue) {
            s.appended(offset, ptr, msg);
            self.touched.insert(queue);
            return;
        }
        let mut fx = std::mem::take(&mut self.fx);
        self.queue(queue).appended(offset, ptr, msg, journal, &mut fx);
        self.fx = fx;
        self.touched.insert(queue);
    }

    fn handle(&mut self, cmd: ShardCmd) {
        if cmd.queue().is_some_and(|q| self.deleted.contains(&q)) {
            match cmd {
                ShardCmd::Len { reply, .. } | ShardCmd::Purge { reply, .. } => {
                    let _ = reply.send(0);
                }
                ShardCmd::Counts { reply, .. } => {
                    let _ = reply.send((0, 0));
                }
                ShardCmd::Get { reply, .. } => {
                    let _ = reply.send(None);
                }
                ShardCmd::ResetGroup { reply, .. } => {
                    let _ = reply.send(None);
                }
                ShardCmd::Delete { done: Some(done), .. } => self.replies.push((done, 0)),
                _ => {}
            }
            return;
        }
        if let Some(id) = cmd.queue().filter(|q| self.streams.contains_key(q)) {
            self.handle_stream(id, cmd);
            return;
        }
        match cmd {
            ShardCmd::Appended(batch) => {
                let journal = self.journal.clone();
                for e in batch.entries() {
                    if shard_of(e.queue, self.count) == self.index {
                        self.appended(&journal, e.queue, e.offset, e.ptr, e.msg);
                    }
                }
            }
            ShardCmd::Entries(entries) => {
                let journal = self.journal.clone();
                for e in &entries {
                    self.appended(&journal, e.queue, e.offset, e.ptr, &e.msg);
                }
            }
            ShardCmd::Configure { queue, config } => {
                self.configs.insert(queue, config.clone());
                // Loads the queue with its configuration (or updates a loaded one).
                self.queue(queue).set_config(config);
                self.touched.insert(queue);
            }
            ShardCmd::ConfigureStream { queue, config } => {
                self.queues.remove(&queue);
                let stream = Stream::load(queue, config, &self.journal);
                self.streams.insert(queue, stream);
                self.touched.insert(queue);
            }
            // Stream commands for a queue that is not (or no longer) a stream.
            ShardCmd::AttachStream { queue, consumer, .. } => {
                let _ = consumer.tx.send(super::queue::ConsumerEvent::Cancelled { queue, consumer: consumer.id });
            }
            ShardCmd::StreamSettle { .. } | ShardCmd::ActivateMember { .. } => {}
            ShardCmd::ResetGroup { reply, .. } => {
                let _ = reply.send(None);
            }
            ShardCmd::Attach { queue, consumer } => {
                // Delivered to at once, as RabbitMQ's queue does at basic.consume: what is
                // ready goes out before a publish later in this turn is appended (which
                // could otherwise push it out of a max-length queue first).
                let journal = self.journal.clone();
                let mut fx = std::mem::take(&mut self.fx);
                let q = self.queue(queue);
                q.attach(consumer);
                q.pump(&journal, &mut fx);
                self.fx = fx;
                self.touched.insert(queue);
            }
            ShardCmd::Detach { queue, consumer } => {
                let mut fx = std::mem::take(&mut self.fx);
                self.queue(queue).detach(consumer, &mut fx);
                self.fx = fx;
                self.touched.insert(queue);
            }
            ShardCmd::Cancel { queue, consumer } => {
                self.queue(queue).cancel(consumer);
                self.touched.insert(queue);
            }
            ShardCmd::Ack { queue, offset } => {
                let mut fx = std::mem::take(&mut self.fx);
                self.queue(queue).ack(offset, &mut fx.ops);
                self.fx = fx;
                self.touched.insert(queue);
            }
            ShardCmd::Requeue { queue, offset, cause, consumer } => {
                let mut fx = std::mem::take(&mut self.fx);
                let q = self.queue(queue);
                if q.holder(offset) == Some(consumer) {
                    q.requeue(offset, cause, &mut fx);
                }
                self.fx = fx;
                self.touched.insert(queue);
            }
            ShardCmd::RetryDue { queue, offset, due_ms } => {
                // Only a loaded queue waits in memory: one loaded later finds the record
                // due and makes the entry ready itself (and a timer of a queue deleted
                // before a restart must not load it again).
                if let Some(q) = self.queues.get_mut(&queue) {
                    q.retry_due(offset, due_ms);
                    self.touched.insert(queue);
                }
            }
            ShardCmd::Reject { queue, offset } => {
                let mut fx = std::mem::take(&mut self.fx);
                self.queue(queue).reject(offset, &mut fx);
                self.fx = fx;
                self.touched.insert(queue);
            }
            ShardCmd::Release { queue, offset, done } => {
                let mut fx = std::mem::take(&mut self.fx);
                self.queue(queue).release(offset, &mut fx.ops);
                self.fx = fx;
                self.released.extend(done);
            }
            ShardCmd::Credit { queue, consumer, n } => {
                self.queue(queue).credit(consumer, n);
                self.touched.insert(queue);
            }
            ShardCmd::Get { queue, consumer, no_ack, reply } => {
                let journal = self.journal.clone();
                let mut fx = std::mem::take(&mut self.fx);
                let q = self.queue(queue);
                let got = q.get(consumer, no_ack, &journal, &mut fx);
                // Before the answer: a publisher told the message is gone (basic.get-ok)
                // must find its room in a full reject-publish queue at once.
                q.publish_gauge();
                self.fx = fx;
                let _ = reply.send(got);
                self.touched.insert(queue);
            }
            ShardCmd::Purge { queue, reply } => {
                let mut fx = std::mem::take(&mut self.fx);
                let q = self.queue(queue);
                let n = q.purge(&mut fx.ops);
                q.publish_gauge();
                self.fx = fx;
                let _ = reply.send(n);
                self.touched.insert(queue);
            }
            ShardCmd::Delete { queue, done } => {
                let mut fx = std::mem::take(&mut self.fx);
                let count = self.queue(queue).delete(&mut fx.ops);
                self.fx = fx;
                self.queues.remove(&queue);
                self.configs.remove(&queue);
                self.touched.remove(&queue);
                self.deleted.insert(queue);
                if let Some(done) = done {
                    self.replies.push((done, count));
                }
            }
            ShardCmd::Len { queue, reply } => {
                let _ = reply.send(self.queue(queue).len());
            }
            ShardCmd::StreamStatus { reply, .. } => {
                let _ = reply.send(None);
            }
            ShardCmd::Counts { queue, reply } => {
                let q = self.queue(queue);
                let counts = (q.ready_len(), q.consumer_count() as u64);
                self.count_replies.push((reply, counts));
            }
            ShardCmd::Barrier(reply) => self.barriers.push(reply),
        }
    }

    /// A command for a stream. Queue-only commands (reject, get, purge, QoS 2 release) do
    /// nothing to a stream: its entries leave only by retention. A requeue is a delivery
    /// returned by a closing channel.
    fn handle_stream(&mut self, id: QueueId, cmd: ShardCmd) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        self.touched.insert(id);
        match cmd {
            ShardCmd::ConfigureStream { config, .. } => s.set_config(config, &self.journal),
            ShardCmd::AttachStream { consumer, start, group, filter, exclusive, .. } => {
                let name = group.clone().filter(|_| exclusive);
                s.attach(consumer.id, consumer.tx, consumer.credit, start, group, &self.journal);
                s.set_filter(consumer.id, filter);
                if let Some(name) = name {
                    s.make_exclusive(&name);
                }
            }
            ShardCmd::ActivateMember { group, consumer, .. } => s.activate(&group, consumer),
            ShardCmd::ResetGroup { group, to, reply, .. } => {
                let _ = reply.send(Some(s.reset_group(&group, to, &self.journal)));
            }
            ShardCmd::StreamSettle { consumer, offset, .. } => s.settle(consumer, offset),
            ShardCmd::Credit { consumer, n, .. } => s.credit(consumer, n),
            ShardCmd::Detach { consumer, .. } => s.detach(consumer),
            ShardCmd::Cancel { consumer, .. } => s.cancel(consumer),
            ShardCmd::Requeue { consumer, offset, .. } => s.returned(consumer, offset),
            ShardCmd::Attach { consumer, .. } => {
                // Not through the stream path (no offset): refuse by cancelling.
                let _ = consumer.tx.send(super::queue::ConsumerEvent::Cancelled { queue: id, consumer: consumer.id });
            }
            ShardCmd::Len { reply, .. } => {
                let _ = reply.send(s.len());
            }
            ShardCmd::StreamStatus { reply, .. } => {
                let _ = reply.send(Some(s.status()));
            }
            ShardCmd::Counts { reply, .. } => {
                let _ = reply.send((s.len(), s.consumer_count() as u64));
            }
            ShardCmd::Get { reply, .. } => {
                let _ = reply.send(None);
            }
            ShardCmd::Purge { reply, .. } => {
                let _ = reply.send(0);
            }
            ShardCmd::Delete { done, .. } => {
                let count = s.delete(&mut self.fx.ops);
                self.streams.remove(&id);
                self.touched.remove(&id);
                self.deleted.insert(id);
                if let Some(done) = done {
                    self.replies.push((done, count));
                }
            }
            ShardCmd::Appended(_)
            | ShardCmd::Entries(_)
            | ShardCmd::Configure { .. }
            | ShardCmd::Ack { .. }
            | ShardCmd::Reject { .. }
            | ShardCmd::RetryDue { .. }
            | ShardCmd::Release { .. } => {}
            ShardCmd::Barrier(reply) => self.barriers.push(reply),
        }
    }

    async fn finish_turn(&mut self) {
        for id in std::mem::take(&mut self.touched) {
            if let Some(q) = self.queues.get_mut(&id) {
                q.pump(&self.journal, &mut self.fx);
                q.publish_gauge();
            } else if let Some(s) = self.streams.get_mut(&id) {
                s.pump(&self.journal);
                s.take_cursor_writes(&mut self.fx.ops);
                s.publish_gauge();
            }
        }
        let fx = std::mem::take(&mut self.fx);
        for d in fx.dead {
            let _ = self.dead.send(d);
        }
        let mut released = Some(std::mem::take(&mut self.released));
        if !fx.ops.is_empty() {
            // A deletion is waited for, so that whoever asked can reuse the queue's name
            // at once (a new name mapping, never the deleted id); so is a retry wait, whose
            // record and timer must be durable before the next turn.
            let waiting = released.as_ref().is_some_and(|r| !r.is_empty());
            let result = if self.replies.is_empty() && !fx.durable && waiting {
                // PUBRELs wait for their releases to be durable; the shard does not.
                let senders = released.take().unwrap_or_default();
                let done: ferrymq_storage::Completion = Box::new(move |_| {
                    for r in senders {
                        let _ = r.send(());
                    }
                });
                self.journal.submit(fx.ops, Some(done)).await
            } else if self.replies.is_empty() && !fx.durable {
                // Acks and drops: losing one to a power cut means a redelivery, never a loss.
                self.journal.submit_relaxed(fx.ops, None).await
            } else {
                self.journal.write(fx.ops).await.map(|_| ())
            };
            match result {
                // A retry timer earlier than the scheduler's next one must wake it.
                Ok(()) if fx.durable => self.timers_changed.notify_one(),
                Ok(()) => {}
                Err(e) => warn!(error = %e, "queue shard cannot write to the journal"),
            }
        }
        for (reply, count) in self.replies.drain(..) {
            let _ = reply.send(count);
        }
        for (reply, counts) in self.count_replies.drain(..) {
            let _ = reply.send(counts);
        }
        for reply in self.barriers.drain(..) {
            let _ = reply.send(());
        }
        // Written (and durable) above, or nothing to write: those left are told now.
        for r in released.into_iter().flatten() {
            let _ = r.send(());
        }
    }
}
