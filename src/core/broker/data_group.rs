//! Queues whose messages a cluster's data group holds (a cluster member's streams): a
//! publish to them is not appended here but handed to the group ([`DataGroupAppender`]),
//! acknowledged once the group committed it, and appended on every member, this one
//! included, when the group applies it ([`Broker::apply_group_appends`]), in the group's
//! order, so that every member's copy has the same messages at the same offsets; the
//! group's applied state is kept with them. A single node has none of it.

use std::sync::Arc;

use bytes::Bytes;
use ferrymq_storage::{JournalError, Op, QueueId, Space};

use super::{Broker, Joint};
use crate::core::appended::MessageTargets;
use crate::core::message::SharedMessage;
use crate::core::router::QueueRoute;
use crate::core::store::StoreError;

/// Hands publishes to the data group (a cluster member's, set by
/// [`Broker::join_data_group`]).
pub trait DataGroupAppender: Send + Sync + std::fmt::Debug {
    /// True for a queue whose messages the data group holds.
    fn holds(&self, queue: QueueId) -> bool;

    /// Commits `msg` for `queues` through the data group, in the order of the calls;
    /// `done` is told once it is committed (held by a majority of the members, on disk), or
    /// why not.
    fn append(&self, msg: &SharedMessage, queues: Vec<QueueId>, done: Arc<Joint>);
}

/// How a publish's queue routes divide between this member and the data group.
pub(in crate::core) struct GroupShare<'a> {
    /// The routes that stay here.
    pub kept: Vec<QueueRoute>,
    /// The queues the group holds.
    pub held: Vec<QueueId>,
    /// The group.
    pub group: &'a Arc<dyn DataGroupAppender>,
}

/// The key of group `group`'s last applied entry in the journal's `Space::Meta`.
fn applied_key(group: &str) -> Bytes {
    let mut key = vec![b'c', 0];
    key.extend_from_slice(group.as_bytes());
    Bytes::from(key)
}

impl Broker {
    /// This member's data group takes the publishes to the queues it holds. Set once.
    pub fn join_data_group(&self, appender: Arc<dyn DataGroupAppender>) {
        let _ = self.data_group.set(appender);
    }

    /// A publish's share for the data group: `None` on a single node, or when no route is
    /// to a queue the group holds.
    pub(in crate::core) fn group_share(&self, routes: &[QueueRoute]) -> Option<GroupShare<'_>> {
        let group = self.data_group.get()?;
        if !routes.iter().any(|r| group.holds(r.queue)) {
            return None;
        }
        let (held, kept): (Vec<QueueRoute>, Vec<QueueRoute>) = routes.iter().partition(|r| group.holds(r.queue));
        Some(GroupShare { kept, held: held.into_iter().map(|r| r.queue).collect(), group })
    }

    /// Appends what the data group committed, in its order: each message for its queues
    /// (this member's ids), and the group's applied state `applied` (its last applied entry,
    /// in the group's encoding) under `group`, in one submission, written but not fsynced
    /// (the group's log is the durable copy); consumers of the queues are handed the new
    /// entries. The journal's applied state never runs ahead of what it holds: after a crash
    /// the group applies again what the journal lost ([`Broker::group_applied`]).
    pub async fn apply_group_appends(
        &self,
        appends: Vec<(SharedMessage, Vec<QueueId>)>,
        group: &str,
        applied: Bytes,
    ) -> Result<(), JournalError> {
        let mut ops = Vec::with_capacity(appends.len() + 1);
        let mut targets = Vec::with_capacity(appends.len());
        for (msg, queues) in appends {
            if queues.is_empty() {
                continue;
            }
            let routes: Vec<QueueRoute> =
                queues.iter().map(|&queue| QueueRoute { queue, qos: 2, reserved: false }).collect();
            let (queues, message_targets) = MessageTargets::for_queues(&msg, &routes);
            ops.push(Op::Append(ferrymq_storage::Append {
                record: ferrymq_storage::Record { header: msg.encode_header(), body: msg.payload.clone() },
                queues,
                retained_topic: None,
                timer: None,
                keys: msg.index_keys(),
            }));
            targets.push(message_targets);
        }
        ops.push(Op::Put { space: Space::Meta, key: applied_key(group), value: applied });
        self.submit(ops, targets, false).await.await.unwrap_or(Err(JournalError::Closed))
    }

    /// Data group `group`'s applied state as this member's journal holds it (the last
    /// [`Broker::apply_group_appends`] it kept), if any.
    pub async fn group_applied(&self, group: &str) -> Result<Option<Bytes>, StoreError> {
        let journal = self.journal.clone();
        let key = applied_key(group);
        let read = crate::core::blocking::spawn(move || journal.get(Space::Meta, &key))
            .await
            .map_err(|e| JournalError::Io(format!("reading the data group's applied state failed: {e}")))??;
        Ok(read)
    }
}
