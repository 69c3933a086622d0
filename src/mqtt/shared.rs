//! MQTT 5 shared subscriptions (`$share/{group}/{filter}`): each group+filter is one
//! consume queue with competing consumers (its members' connections). The group's binding
//! in the routing table targets the queue; a member that leaves has its unacked messages
//! handed to the others by the queue.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ferrymq_storage::{JournalError, QueueId};
use parking_lot::Mutex;

use crate::core::broker::Broker;
use crate::core::router::{Destination, MqttOptions};

#[derive(Debug)]
struct Group {
    queue: QueueId,
    members: HashSet<Arc<str>>,
}

/// Name of the consume queue of a group.
pub fn queue_name(group: &str, filter: &str) -> String {
    format!("mqtt-share/{group}/{filter}")
}

/// Every shared-subscription group.
#[derive(Debug, Default)]
pub struct SharedGroups {
    groups: Mutex<HashMap<(String, String), Group>>,
}

impl SharedGroups {
    /// Adds `member` to the group (creating it and its binding if new); returns the
    /// group's queue.
    pub fn join(&self, broker: &Broker, group: &str, filter: &str, member: &Arc<str>) -> Result<QueueId, JournalError> {
        let mut groups = self.groups.lock();
        let key = (group.to_owned(), filter.to_owned());
        if let Some(g) = groups.get_mut(&key) {
            g.members.insert(member.clone());
            return Ok(g.queue);
        }
        let queue = broker.journal.queue_id(&queue_name(group, filter))?;
        let opts = MqttOptions {
            client_id: Arc::from(""),
            qos: 2,
            no_local: false,
            retain_as_published: false,
            subscription_id: None,
            tag_filter: None,
        };
        broker.router.subscribe(filter, Destination::Queue(queue), opts);
        groups.insert(key, Group { queue, members: HashSet::from([member.clone()]) });
        Ok(queue)
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
        broker.router.unsubscribe(filter, &Destination::Queue(g.queue));
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
