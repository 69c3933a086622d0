//! Queue owners: tasks sharded by queue id. Each shard is the single writer of the queues
//! that hash to it (ready lists, unacked sets, credit), so per-queue order needs no lock.
//! A shard drains a batch of commands per turn, pumps the queues they touched, and
//! submits the resulting journal ops (acks, drops) as one submission.

use std::collections::{HashMap, HashSet};

use ferrymq_storage::{Journal, Op, Pointer, QueueId};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::message::SharedMessage;
use super::queue::{Consumer, ConsumerId, Queue, QueueLimits};

/// Commands handled per shard turn before pumping and flushing.
const BATCH: usize = 512;

/// A pointer the journal appended to a queue, with the message still in memory.
#[derive(Debug, Clone)]
pub struct AppendedEntry {
    /// The queue.
    pub queue: QueueId,
    /// Offset the journal assigned.
    pub offset: u64,
    /// The stored pointer.
    pub ptr: Pointer,
    /// The message.
    pub msg: SharedMessage,
}

/// A command for a queue owner.
#[derive(Debug)]
pub enum ShardCmd {
    /// Entries appended by the journal, in log order.
    Appended(Vec<AppendedEntry>),
    /// Attach a consumer.
    Attach {
        /// The queue.
        queue: QueueId,
        /// The consumer.
        consumer: Consumer,
    },
    /// Detach a consumer; its unacked entries become ready again.
    Detach {
        /// The queue.
        queue: QueueId,
        /// The consumer.
        consumer: ConsumerId,
    },
    /// The consumer is done with an entry.
    Ack {
        /// The queue.
        queue: QueueId,
        /// The entry.
        offset: u64,
    },
    /// QoS 2: PUBREC arrived for an entry.
    Release {
        /// The queue.
        queue: QueueId,
        /// The entry.
        offset: u64,
    },
    /// Give a consumer more credit.
    Credit {
        /// The queue.
        queue: QueueId,
        /// The consumer.
        consumer: ConsumerId,
        /// How much.
        n: u32,
    },
    /// Remove the queue and all its entries.
    Delete {
        /// The queue.
        queue: QueueId,
        /// Answered once the deletion is stored in the journal.
        done: Option<oneshot::Sender<()>>,
    },
    /// Report the queue's live length.
    Len {
        /// The queue.
        queue: QueueId,
        /// Reply.
        reply: oneshot::Sender<u64>,
    },
}

impl ShardCmd {
    fn queue(&self) -> Option<QueueId> {
        match self {
            ShardCmd::Appended(_) => None,
            ShardCmd::Attach { queue, .. }
            | ShardCmd::Detach { queue, .. }
            | ShardCmd::Ack { queue, .. }
            | ShardCmd::Release { queue, .. }
            | ShardCmd::Credit { queue, .. }
            | ShardCmd::Delete { queue, .. }
            | ShardCmd::Len { queue, .. } => Some(*queue),
        }
    }
}

/// Handle to every shard.
#[derive(Debug, Clone)]
pub struct Shards {
    txs: Vec<mpsc::UnboundedSender<ShardCmd>>,
}

impl Shards {
    /// Starts `n` shard tasks on the current runtime.
    pub fn start(n: usize, journal: Journal, limits: QueueLimits) -> Shards {
        let txs = (0..n.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run_shard(rx, journal.clone(), limits));
                tx
            })
            .collect();
        Shards { txs }
    }

    fn shard_of(&self, queue: QueueId) -> usize {
        // Fibonacci hashing spreads sequential ids.
        (queue.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % self.txs.len()
    }

    /// Sends a command to the shard owning its queue.
    pub fn send(&self, cmd: ShardCmd) {
        let idx = match &cmd {
            ShardCmd::Appended(v) => v.first().map(|e| self.shard_of(e.queue)).unwrap_or(0),
            other => other.queue().map(|q| self.shard_of(q)).unwrap_or(0),
        };
        let _ = self.txs[idx].send(cmd);
    }

    /// Hands appended entries to their shards, one command per shard, keeping log order.
    /// Called from the journal's completion (writer thread): never blocks.
    pub fn dispatch(&self, entries: Vec<AppendedEntry>) {
        if entries.is_empty() {
            return;
        }
        if self.txs.len() == 1 || entries.iter().all(|e| self.shard_of(e.queue) == self.shard_of(entries[0].queue)) {
            let _ = self.txs[self.shard_of(entries[0].queue)].send(ShardCmd::Appended(entries));
            return;
        }
        let mut per: Vec<Vec<AppendedEntry>> = vec![Vec::new(); self.txs.len()];
        for e in entries {
            per[self.shard_of(e.queue)].push(e);
        }
        for (i, v) in per.into_iter().enumerate() {
            if !v.is_empty() {
                let _ = self.txs[i].send(ShardCmd::Appended(v));
            }
        }
    }

    /// Live length of a queue.
    pub async fn len(&self, queue: QueueId) -> u64 {
        let (reply, rx) = oneshot::channel();
        self.send(ShardCmd::Len { queue, reply });
        rx.await.unwrap_or(0)
    }

    /// Deletes a queue and waits until the deletion is stored (its name is free again).
    pub async fn delete(&self, queue: QueueId) {
        let (done, rx) = oneshot::channel();
        self.send(ShardCmd::Delete { queue, done: Some(done) });
        let _ = rx.await;
    }
}

async fn run_shard(mut rx: mpsc::UnboundedReceiver<ShardCmd>, journal: Journal, limits: QueueLimits) {
    let mut queues: HashMap<QueueId, Queue> = HashMap::new();
    // Ids are never reused: commands for a deleted queue (in flight when it was deleted)
    // are ignored instead of bringing it back.
    let mut deleted: HashSet<QueueId> = HashSet::new();
    let mut touched: HashSet<QueueId> = HashSet::new();
    let mut ops: Vec<Op> = Vec::new();
    let mut replies: Vec<oneshot::Sender<()>> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut handled = 0;
        while let Some(cmd) = next.take() {
            handle(cmd, &mut queues, &mut deleted, &mut touched, &mut ops, &mut replies, &journal, limits);
            handled += 1;
            if handled < BATCH {
                next = rx.try_recv().ok();
            }
        }
        for id in touched.drain() {
            if let Some(q) = queues.get_mut(&id) {
                q.pump(&journal, &mut ops);
            }
        }
        if !ops.is_empty() {
            let ops = std::mem::take(&mut ops);
            // A deletion is waited for, so that whoever asked can reuse the queue's name
            // at once (a new name mapping, never the deleted id).
            let result = if replies.is_empty() {
                // Acks and drops: losing one to a power cut means a redelivery, never a loss.
                journal.submit_relaxed(ops, None).await
            } else {
                journal.write(ops).await.map(|_| ())
            };
            if let Err(e) = result {
                warn!(error = %e, "queue shard cannot write to the journal");
            }
        }
        for r in replies.drain(..) {
            let _ = r.send(());
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn handle(
    cmd: ShardCmd,
    queues: &mut HashMap<QueueId, Queue>,
    deleted: &mut HashSet<QueueId>,
    touched: &mut HashSet<QueueId>,
    ops: &mut Vec<Op>,
    replies: &mut Vec<oneshot::Sender<()>>,
    journal: &Journal,
    limits: QueueLimits,
) {
    fn get<'a>(queues: &'a mut HashMap<QueueId, Queue>, id: QueueId, journal: &Journal, limits: QueueLimits) -> &'a mut Queue {
        queues.entry(id).or_insert_with(|| Queue::load(id, limits, journal))
    }
    if cmd.queue().is_some_and(|q| deleted.contains(&q)) {
        match cmd {
            ShardCmd::Len { reply, .. } => {
                let _ = reply.send(0);
            }
            ShardCmd::Delete { done, .. } => replies.extend(done),
            _ => {}
        }
        return;
    }
    match cmd {
        ShardCmd::Appended(entries) => {
            for e in entries {
                if deleted.contains(&e.queue) {
                    continue;
                }
                get(queues, e.queue, journal, limits).appended(e.offset, e.ptr, &e.msg, journal, ops);
                touched.insert(e.queue);
            }
        }
        ShardCmd::Attach { queue, consumer } => {
            get(queues, queue, journal, limits).attach(consumer);
            touched.insert(queue);
        }
        ShardCmd::Detach { queue, consumer } => {
            get(queues, queue, journal, limits).detach(consumer);
            touched.insert(queue);
        }
        ShardCmd::Ack { queue, offset } => {
            get(queues, queue, journal, limits).ack(offset, ops);
            touched.insert(queue);
        }
        ShardCmd::Release { queue, offset } => get(queues, queue, journal, limits).release(offset, ops),
        ShardCmd::Credit { queue, consumer, n } => {
            get(queues, queue, journal, limits).credit(consumer, n);
            touched.insert(queue);
        }
        ShardCmd::Delete { queue, done } => {
            let mut q = queues.remove(&queue).unwrap_or_else(|| Queue::load(queue, limits, journal));
            q.purge_all(ops);
            touched.remove(&queue);
            deleted.insert(queue);
            replies.extend(done);
        }
        ShardCmd::Len { queue, reply } => {
            let _ = reply.send(get(queues, queue, journal, limits).len());
        }
    }
}
