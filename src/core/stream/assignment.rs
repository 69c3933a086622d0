//! Partitioned consumption: which member of a consumer group reads which partition of a
//! super stream (a set of streams fed by one exchange, usually `x-consistent-hash`).
//!
//! Each partition has one active member at a time, so a partition is consumed in order;
//! the partitions are spread over the members with RocketMQ's average allocation (sorted
//! partitions, members in joining order, contiguous slices whose sizes differ by at most
//! one) and spread again whenever a member joins or leaves. A member is one AMQP channel;
//! it subscribes to every partition it may be given, one consumer per partition.
//!
//! This registry only decides; each partition's owner applies the decision
//! ([`ShardCmd::ActivateMember`]) and hands the partition to the new member once the old
//! one has settled what it held, so ordering survives the hand-over. It is touched when
//! consumers come and go, never per message.

use std::collections::HashMap;
use std::ops::Range;

use ferrymq_storage::QueueId;
use parking_lot::Mutex;

use crate::core::queue::ConsumerId;
use crate::core::shards::{ShardCmd, Shards};

/// RocketMQ's `AllocateMessageQueueAveragely`: the partition indexes given to member
/// `index` of `members` when there are `partitions` partitions (empty for members beyond
/// the partition count).
pub(crate) fn average(partitions: usize, members: usize, index: usize) -> Range<usize> {
    if members == 0 || index >= members || index >= partitions {
        return 0..0;
    }
    let (base, extra) = (partitions / members, partitions % members);
    let size = base + usize::from(index < extra);
    let start = index * base + index.min(extra);
    start..start + size
}

/// A member of a partitioned group: one channel of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemberId {
    /// The connection's id.
    pub connection: u64,
    /// The channel on that connection.
    pub channel: u16,
}

/// What a partitioned group reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The partitions of a super stream (named by the exchange that feeds them).
    SuperStream(String),
    /// One stream, read by one member at a time (a single-active group).
    Stream(QueueId),
}

/// A consumer group over one super stream (or one stream), in one virtual host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// Virtual host of the streams read; same-named groups of other vhosts are distinct.
    pub vhost: String,
    /// What it reads.
    pub scope: Scope,
    /// Name of the consumer group (`x-consumer-group`).
    pub group: String,
}

#[derive(Debug)]
struct Member {
    id: MemberId,
    /// Its consumer on each partition it subscribed to.
    consumers: Vec<(QueueId, ConsumerId)>,
}

#[derive(Debug, Default)]
struct Membership {
    /// Partitions in partition order (as known at the last join).
    partitions: Vec<QueueId>,
    /// Members in joining order.
    members: Vec<Member>,
    /// The active consumer last sent to each partition's owner.
    active: HashMap<QueueId, Option<ConsumerId>>,
}

impl Membership {
    /// The active consumer of every partition under average allocation. A partition given
    /// to a member that did not subscribe to it goes to the first member that did.
    fn plan(&self) -> Vec<(QueueId, Option<ConsumerId>)> {
        let n = self.members.len();
        let consumer_of = |m: &Member, p: QueueId| m.consumers.iter().find(|(q, _)| *q == p).map(|(_, c)| *c);
        self.partitions
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let owner = (0..n).find(|&m| average(self.partitions.len(), n, m).contains(&i));
                let chosen = owner.and_then(|m| consumer_of(&self.members[m], p));
                (p, chosen.or_else(|| self.members.iter().find_map(|m| consumer_of(m, p))))
            })
            .collect()
    }
}

/// Every partitioned group of the broker run.
#[derive(Debug, Default)]
pub(crate) struct Assignments {
    groups: Mutex<HashMap<GroupKey, Membership>>,
}

impl Assignments {
    /// A new, empty registry.
    pub(crate) fn new() -> Assignments {
        Assignments::default()
    }

    /// `consumer` of `member` subscribed to partition `queue` of `key`'s super stream,
    /// whose partitions are now `partitions`: the partitions are spread again and every
    /// owner whose active member changed is told. Call after the consumer is attached.
    pub(crate) fn join(
        &self,
        shards: &Shards,
        key: GroupKey,
        partitions: Vec<QueueId>,
        member: MemberId,
        queue: QueueId,
        consumer: ConsumerId,
    ) {
        let mut groups = self.groups.lock();
        let group = key.group.clone();
        let m = groups.entry(key).or_default();
        m.partitions = partitions;
        match m.members.iter_mut().find(|x| x.id == member) {
            Some(x) => x.consumers.push((queue, consumer)),
            None => m.members.push(Member { id: member, consumers: vec![(queue, consumer)] }),
        }
        apply(shards, &group, m);
    }

    /// `consumer` went (cancelled, channel or connection closed, queue deleted): if it was
    /// part of a partitioned group, the group's partitions are spread again. A no-op for
    /// other consumers.
    pub(crate) fn leave(&self, shards: &Shards, consumer: ConsumerId) {
        let mut groups = self.groups.lock();
        let Some((key, m)) =
            groups.iter_mut().find(|(_, m)| m.members.iter().any(|x| x.consumers.iter().any(|(_, c)| *c == consumer)))
        else {
            return;
        };
        for x in &mut m.members {
            x.consumers.retain(|(_, c)| *c != consumer);
        }
        m.members.retain(|x| !x.consumers.is_empty());
        let key = key.clone();
        apply(shards, &key.group, m);
        if m.members.is_empty() {
            groups.remove(&key);
        }
    }
}

/// Sends each partition's owner its new active member, where it changed.
fn apply(shards: &Shards, group: &str, m: &mut Membership) {
    for (queue, consumer) in m.plan() {
        if m.active.get(&queue) != Some(&consumer) {
            m.active.insert(queue, consumer);
            shards.send(ShardCmd::ActivateMember { queue, group: group.to_owned(), consumer });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_allocation_gives_contiguous_slices_differing_by_one() {
        let slices = |p, n| (0..n).map(|i| average(p, n, i)).collect::<Vec<_>>();
        assert_eq!(slices(4, 1), vec![0..4]);
        assert_eq!(slices(4, 2), vec![0..2, 2..4]);
        assert_eq!(slices(4, 3), vec![0..2, 2..3, 3..4]);
        assert_eq!(slices(8, 3), vec![0..3, 3..6, 6..8]);
        assert_eq!(slices(2, 3), vec![0..1, 1..2, 0..0], "members beyond the partitions stand by");
        assert_eq!(average(4, 0, 0), 0..0);
        for p in 0..20 {
            for n in 1..8 {
                let covered: Vec<usize> = (0..n).flat_map(|i| average(p, n, i)).collect();
                assert_eq!(covered, (0..p).collect::<Vec<_>>(), "{p} partitions, {n} members");
            }
        }
    }

    fn member(id: u16, consumers: &[(u64, u64)]) -> Member {
        Member {
            id: MemberId { connection: 1, channel: id },
            consumers: consumers.iter().map(|&(q, c)| (QueueId(q), c)).collect(),
        }
    }

    #[test]
    fn a_partition_its_owner_did_not_subscribe_to_goes_to_a_member_that_did() {
        let m = Membership {
            partitions: vec![QueueId(10), QueueId(11)],
            members: vec![member(1, &[(10, 100)]), member(2, &[(10, 200), (11, 201)])],
            active: HashMap::new(),
        };
        // Average: member 1 gets partition 0, member 2 gets partition 1.
        assert_eq!(m.plan(), vec![(QueueId(10), Some(100)), (QueueId(11), Some(201))]);
        let m = Membership { members: vec![member(1, &[(10, 100)])], ..m };
        assert_eq!(m.plan(), vec![(QueueId(10), Some(100)), (QueueId(11), None)]);
    }
}
