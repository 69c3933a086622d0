//! Publishes to the queues the data group holds (streams), made into its entries: the
//! core's [`DataGroupAppender`] on a cluster member. Each publish becomes a
//! [`DataChange::Append`] naming its streams; one task gathers what arrived into an entry (at
//! most [`MAX_OPS`] publishes or [`MAX_BYTES`] of bodies) and has the group's leader commit
//! it, one entry at a time, so that the publishes of one member are committed in the
//! order they were made. Each publisher is told once its entry is committed (a majority of
//! the members holds it, fsynced), or why not (no majority within
//! `cluster.command_timeout_ms`: AMQP `basic.nack`, MQTT no PUBACK).

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::warn;

use super::metadata::RetainedMessage;
use super::node::NodeState;
use super::types::{DataChange, DataEntry};
use super::Cluster;
use crate::core::broker::{DataGroupAppender, Joint};
use crate::core::message::SharedMessage;
use crate::core::store::QueueId;
use crate::core::JournalError;

/// Publishes gathered into one entry at most.
const MAX_OPS: usize = 512;

/// Body bytes gathered into one entry at most (a publish bigger than this is an entry of
/// its own).
const MAX_BYTES: usize = 4 << 20;

/// Publishes waiting for their entry at most; past it a publish is refused.
const MAX_WAITING: usize = 100_000;

/// One publish waiting for its entry.
struct Waiting {
    op: DataChange,
    bytes: usize,
    done: Arc<Joint>,
}

/// The core's way into the data group on this member.
pub(super) struct Appender {
    node: Arc<dyn NodeState>,
    cluster: Arc<Cluster>,
    tx: mpsc::Sender<Waiting>,
}

impl std::fmt::Debug for Appender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Appender").finish_non_exhaustive()
    }
}

impl Appender {
    /// The appender of `cluster`'s member `node`, with its task started.
    pub(super) fn start(cluster: Arc<Cluster>, node: Arc<dyn NodeState>) -> Arc<Appender> {
        let (tx, rx) = mpsc::channel(MAX_WAITING);
        tokio::spawn(commit_entries(cluster.clone(), rx));
        Arc::new(Appender { node, cluster, tx })
    }
}

impl DataGroupAppender for Appender {
    fn holds(&self, queue: QueueId) -> bool {
        self.node.is_data_group_queue(queue)
    }

    fn append(&self, msg: &SharedMessage, queues: Vec<QueueId>, done: Arc<Joint>) {
        let mut vhost = String::new();
        let mut names = Vec::with_capacity(queues.len());
        for q in queues {
            if let Some((v, name)) = self.node.queue_name(q) {
                vhost = v;
                names.push(name);
            }
        }
        if names.is_empty() {
            // Deleted meanwhile: nothing to store, as for a publish routed nowhere.
            done.done(Ok(()));
            return;
        }
        let op = DataChange::Append {
            meta_index: self.cluster.meta_applied_index(),
            vhost,
            queues: names,
            message: RetainedMessage::of(msg),
        };
        let waiting = Waiting { op, bytes: msg.payload.len(), done };
        if let Err(e) = self.tx.try_send(waiting) {
            let (w, why) = match e {
                mpsc::error::TrySendError::Full(w) => (w, "too many publishes wait for the data group"),
                mpsc::error::TrySendError::Closed(w) => (w, "the data group is stopped"),
            };
            w.done.done(Err(JournalError::Io(why.into())));
        }
    }
}

/// Gathers waiting publishes into entries and has them committed, one at a time, until
/// the member stops.
async fn commit_entries(cluster: Arc<Cluster>, mut rx: mpsc::Receiver<Waiting>) {
    let mut batch: Vec<Waiting> = Vec::new();
    // Entries are numbered from 1 under a name of this process's own (the member's name
    // and a random number), so no clock, and no restart, can make a new entry look old.
    let mut nonce = [0u8; 8];
    let from = match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce) {
        Ok(()) => format!("{}/{:016x}", cluster.name(), u64::from_be_bytes(nonce)),
        Err(_) => format!("{}/{}", cluster.name(), crate::core::message::now_ms()),
    };
    let mut seq = 0u64;
    while let Some(first) = rx.recv().await {
        let mut bytes = first.bytes;
        batch.push(first);
        while batch.len() < MAX_OPS && bytes < MAX_BYTES {
            match rx.try_recv() {
                Ok(w) => {
                    bytes += w.bytes;
                    batch.push(w);
                }
                Err(_) => break,
            }
        }
        seq += 1;
        let changes = batch.iter().map(|w| w.op.clone()).collect();
        let entry = DataEntry { changes, from: from.clone(), seq };
        let result = cluster.propose_data(entry).await;
        if let Err(e) = &result {
            warn!(publishes = batch.len(), error = %e, "cluster: the data group did not commit publishes");
        }
        for w in batch.drain(..) {
            w.done.done(result.clone().map(drop).map_err(|e| JournalError::Io(format!("not committed: {e}"))));
        }
    }
}
