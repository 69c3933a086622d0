//! MQTT 5 shared subscriptions (`$share/{group}/{filter}`): each group+filter is one
//! consume queue with competing consumers (its members' connections). The group's binding
//! in the routing table targets the queue; a member that leaves has its unacked messages
//! handed to the others by the queue. A group may carry a tag filter (MQTT 5 user property
//! `tag-filter`) on its binding: messages it rejects never reach the group's queue. Its
//! members must agree on it, as the consumers of a RocketMQ group must subscribe alike.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::core::broker::Broker;
use crate::core::router::{Destination, MqttOptions};
use crate::core::store::{QueueId, StoreError};
use crate::core::tag_filter::TagFilter;

#[derive(Debug)]
struct Group {
    queue: QueueId,
    members: HashSet<Arc<str>>,
    /// The group's tag filter expression (its first member's).
    tag_filter: Option<String>,
}

/// Why a member cannot join a group.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The group's queue could not be created.
    #[error(transparent)]
    Storage(#[from] StoreError),
    /// The group's members subscribe with another tag filter.
    #[error("the group's members use the tag filter {group:?}, not {asked:?}")]
    TagFilterMismatch {
        /// Tag filter expression the group's members use (`None`: no filter).
        group: Option<String>,
        /// Tag filter expression the joining member asked for (`None`: no filter).
        asked: Option<String>,
    },
}

/// Name of the consume queue of a group.
pub(crate) fn queue_name(group: &str, filter: &str) -> String {
    format!("mqtt-share/{group}/{filter}")
}

/// True when two (validated) tag filter expressions pass the same messages
/// (`A || B` and `B||A` do).
fn same_filter(a: Option<&str>, b: Option<&str>) -> bool {
    match (a.map(TagFilter::parse), b.map(TagFilter::parse)) {
        (None, None) => true,
        (Some(Ok(a)), Some(Ok(b))) => a.equivalent(&b),
        _ => false,
    }
}

/// The routing options of group `group`'s binding.
fn binding(group: &str, tag_filter: Option<&str>) -> MqttOptions {
    MqttOptions {
        client_id: Arc::from(""),
        qos: 2,
        no_local: false,
        retain_as_published: false,
        subscription_id: None,
        tag_filter: tag_filter.and_then(|e| TagFilter::parse(e).ok()).map(Arc::new),
        share_group: Some(Arc::from(group)),
    }
}

/// Adds `member` to an existing group: with the group's tag filter, or — alone in it —
/// with a new one.
fn add_member(
    g: &mut Group,
    broker: &Broker,
    group: &str,
    filter: &str,
    member: &Arc<str>,
    tag_filter: Option<&str>,
) -> Result<QueueId, JoinError> {
    if !same_filter(g.tag_filter.as_deref(), tag_filter) {
        let alone = g.members.len() == 1 && g.members.contains(member);
        if !alone {
            return Err(JoinError::TagFilterMismatch {
                group: g.tag_filter.clone(),
                asked: tag_filter.map(str::to_owned),
            });
        }
        // Replaces the group's binding in place (same destination and key): no moment
        // without one, so no publish misses the group.
        broker.subscribe(filter, Destination::Queue(g.queue), binding(group, tag_filter));
        g.tag_filter = tag_filter.map(str::to_owned);
    }
    g.members.insert(member.clone());
    Ok(g.queue)
}

/// Every shared-subscription group.
#[derive(Debug, Default)]
pub struct SharedGroups {
    groups: Mutex<HashMap<(String, String), Group>>,
}

impl SharedGroups {
    /// Adds `member` to the group (creating it and its binding if new), with the tag filter
    /// `tag_filter` (validated); returns the group's queue. A member alone in its group may
    /// change the filter; otherwise every member must give the group's. A new group's
    /// queue id is resolved without blocking and without holding the groups' lock.
    pub async fn join(
        &self,
        broker: &Broker,
        group: &str,
        filter: &str,
        member: &Arc<str>,
        tag_filter: Option<&str>,
    ) -> Result<QueueId, JoinError> {
        if let Some(joined) = self.join_existing(broker, group, filter, member, tag_filter) {
            return joined;
        }
        let queue = broker.stores().catalog.durable_queue_id(&queue_name(group, filter)).await?;
        self.join_or_create(broker, (group, filter), member, tag_filter, queue)
    }

    /// [`SharedGroups::join`] for the start-up restore, which may block (it runs before
    /// any client connects, off the runtime's workers).
    pub fn rejoin(
        &self,
        broker: &Broker,
        group: &str,
        filter: &str,
        member: &Arc<str>,
        tag_filter: Option<&str>,
    ) -> Result<QueueId, JoinError> {
        if let Some(joined) = self.join_existing(broker, group, filter, member, tag_filter) {
            return joined;
        }
        let queue = broker.stores().catalog.queue_id_blocking(&queue_name(group, filter))?;
        self.join_or_create(broker, (group, filter), member, tag_filter, queue)
    }

    /// Adds `member` to the group if it exists (`None`: it does not).
    fn join_existing(
        &self,
        broker: &Broker,
        group: &str,
        filter: &str,
        member: &Arc<str>,
        tag_filter: Option<&str>,
    ) -> Option<Result<QueueId, JoinError>> {
        let mut groups = self.groups.lock();
        let g = groups.get_mut(&(group.to_owned(), filter.to_owned()))?;
        Some(add_member(g, broker, group, filter, member, tag_filter))
    }

    /// Adds `member` to the group, creating it on `queue` unless another member did
    /// meanwhile.
    fn join_or_create(
        &self,
        broker: &Broker,
        (group, filter): (&str, &str),
        member: &Arc<str>,
        tag_filter: Option<&str>,
        queue: QueueId,
    ) -> Result<QueueId, JoinError> {
        match self.groups.lock().entry((group.to_owned(), filter.to_owned())) {
            Entry::Occupied(mut g) => add_member(g.get_mut(), broker, group, filter, member, tag_filter),
            Entry::Vacant(slot) => {
                broker.subscribe(filter, Destination::Queue(queue), binding(group, tag_filter));
                slot.insert(Group {
                    queue,
                    members: HashSet::from([member.clone()]),
                    tag_filter: tag_filter.map(str::to_owned),
                });
                Ok(queue)
            }
        }
    }

    /// Removes `member`; when it was the last one the group's binding is removed and its
    /// queue returned for deletion.
    pub fn leave(&self, broker: &Broker, group: &str, filter: &str, member: &str) -> Option<QueueId> {
        let mut groups = self.groups.lock();
        let key = (group.to_owned(), filter.to_owned());
        let g = groups.get_mut(&key)?;
        g.members.remove(member);
        if !g.members.is_empty() {
            return None;
        }
        let g = groups.remove(&key)?;
        broker.unsubscribe(filter, &Destination::Queue(g.queue));
        Some(g.queue)
    }

    /// Queue of a group, if it exists.
    pub fn queue_of(&self, group: &str, filter: &str) -> Option<QueueId> {
        self.groups.lock().get(&(group.to_owned(), filter.to_owned())).map(|g| g.queue)
    }

    /// Every group's queue name.
    pub fn queue_names(&self) -> HashSet<String> {
        self.groups.lock().keys().map(|(g, f)| queue_name(g, f)).collect()
    }
}
