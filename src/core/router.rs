//! The routing table: MQTT topic filters (the bindings of exchange `amq.topic`) and the
//! targets they lead to.
//!
//! A subscription leads either to a connected clean session (the online fast path: the
//! router hands the message straight to its outbound channel, no storage) or to a consume
//! queue (a persistent session, a shared-subscription group). The table is read-mostly:
//! publishers resolve through a per-connection [`RouteCache`] that is valid while the
//! table's generation is unchanged, so the hot path takes no lock at all for a topic it has
//! seen; subscribe/unsubscribe take the write lock and bump the generation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ferrymq_storage::QueueId;
use parking_lot::RwLock;

use super::delivery::SessionLink;

/// Identifies who owns a subscription: a session, or a shared-subscription group.
pub type OwnerId = u64;

/// Where a subscription delivers.
#[derive(Debug, Clone)]
pub enum Target {
    /// A connected clean session (fast path).
    Session(Arc<SessionLink>),
    /// A consume queue.
    Queue(QueueId),
}

/// One subscription in the table.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Owner (one entry per owner and filter).
    pub owner: OwnerId,
    /// Client id of the owner, for no-local (empty for groups).
    pub client_id: Arc<str>,
    /// Where matching messages go.
    pub target: Target,
    /// Granted QoS.
    pub qos: u8,
    /// MQTT 5 no-local.
    pub no_local: bool,
    /// MQTT 5 retain-as-published.
    pub retain_as_published: bool,
    /// MQTT 5 subscription identifier.
    pub subscription_id: Option<u32>,
}

/// A resolved session target: one per session, overlapping subscriptions merged.
#[derive(Debug, Clone)]
pub struct SessionRoute {
    /// The session.
    pub link: Arc<SessionLink>,
    /// Highest granted QoS among the matching subscriptions.
    pub qos: u8,
    /// Keep the published RETAIN flag.
    pub retain_as_published: bool,
    /// Subscription identifiers of every matching subscription.
    pub subscription_ids: Vec<u32>,
}

/// A resolved queue target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRoute {
    /// The queue.
    pub queue: QueueId,
    /// Highest granted QoS among the matching subscriptions.
    pub qos: u8,
}

/// Every target of one topic for one publisher.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    /// Connected clean sessions.
    pub sessions: Vec<SessionRoute>,
    /// Consume queues.
    pub queues: Vec<QueueRoute>,
}

impl Routes {
    /// True when nobody is subscribed.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty() && self.queues.is_empty()
    }
}

#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    plus: Option<Box<Node>>,
    /// Subscriptions whose filter ends with `#` right below this node.
    multi: Vec<Subscription>,
    /// Subscriptions whose filter ends at this node.
    exact: Vec<Subscription>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.plus.is_none() && self.multi.is_empty() && self.exact.is_empty()
    }

    fn insert(&mut self, levels: &[&str], sub: Subscription) -> bool {
        match levels.split_first() {
            None => upsert(&mut self.exact, sub),
            Some((&"#", _)) => upsert(&mut self.multi, sub),
            Some((&"+", rest)) => self.plus.get_or_insert_with(Default::default).insert(rest, sub),
            Some((level, rest)) => self.children.entry((*level).into()).or_default().insert(rest, sub),
        }
    }

    fn remove(&mut self, levels: &[&str], owner: OwnerId) -> bool {
        match levels.split_first() {
            None => remove_owner(&mut self.exact, owner),
            Some((&"#", _)) => remove_owner(&mut self.multi, owner),
            Some((&"+", rest)) => {
                let Some(plus) = self.plus.as_mut() else { return false };
                let removed = plus.remove(rest, owner);
                if plus.is_empty() {
                    self.plus = None;
                }
                removed
            }
            Some((level, rest)) => {
                let Some(child) = self.children.get_mut(*level) else { return false };
                let removed = child.remove(rest, owner);
                if child.is_empty() {
                    self.children.remove(*level);
                }
                removed
            }
        }
    }

    /// Collects every subscription matching `levels[idx..]`; `dollar` is true when the
    /// topic starts with `$` (wildcards at the first level do not match it).
    fn collect<'a>(&'a self, levels: &[&str], idx: usize, dollar: bool, out: &mut Vec<&'a Subscription>) {
        let wild_ok = !(idx == 0 && dollar);
        if wild_ok {
            out.extend(self.multi.iter());
        }
        let Some(level) = levels.get(idx) else {
            out.extend(self.exact.iter());
            return;
        };
        if let Some(child) = self.children.get(*level) {
            child.collect(levels, idx + 1, dollar, out);
        }
        if wild_ok {
            if let Some(plus) = &self.plus {
                plus.collect(levels, idx + 1, dollar, out);
            }
        }
    }
}

fn upsert(list: &mut Vec<Subscription>, sub: Subscription) -> bool {
    if let Some(existing) = list.iter_mut().find(|s| s.owner == sub.owner) {
        *existing = sub;
        false
    } else {
        list.push(sub);
        true
    }
}

fn remove_owner(list: &mut Vec<Subscription>, owner: OwnerId) -> bool {
    let before = list.len();
    list.retain(|s| s.owner != owner);
    list.len() != before
}

/// The subscription table.
#[derive(Debug, Default)]
pub struct Router {
    root: RwLock<Node>,
    generation: AtomicU64,
    count: AtomicUsize,
}

impl Router {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces the subscription of `sub.owner` to `filter` (a valid filter without
    /// a `$share/` prefix). Returns true if it did not exist before.
    pub fn subscribe(&self, filter: &str, sub: Subscription) -> bool {
        let levels: Vec<&str> = filter.split('/').collect();
        let added = self.root.write().insert(&levels, sub);
        if added {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::Release);
        added
    }

    /// Removes the subscription of `owner` to `filter`. Returns true if it existed.
    pub fn unsubscribe(&self, filter: &str, owner: OwnerId) -> bool {
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = self.root.write().remove(&levels, owner);
        if removed {
            self.count.fetch_sub(1, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
        }
        removed
    }

    /// Number of subscriptions in the table.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// True when the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Current generation; changes on every modification.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every target of `topic` for a message published by `publisher` (a client id;
    /// no-local subscriptions of that client are skipped).
    pub fn resolve(&self, topic: &str, publisher: &str) -> Routes {
        let levels: Vec<&str> = topic.split('/').collect();
        let dollar = topic.starts_with('$');
        let root = self.root.read();
        let mut matched = Vec::new();
        root.collect(&levels, 0, dollar, &mut matched);
        let mut routes = Routes::default();
        for sub in matched {
            if sub.no_local && &*sub.client_id == publisher {
                continue;
            }
            match &sub.target {
                Target::Session(link) => {
                    if let Some(r) = routes.sessions.iter_mut().find(|r| Arc::ptr_eq(&r.link, link)) {
                        r.qos = r.qos.max(sub.qos);
                        r.retain_as_published |= sub.retain_as_published;
                        r.subscription_ids.extend(sub.subscription_id);
                    } else {
                        routes.sessions.push(SessionRoute {
                            link: link.clone(),
                            qos: sub.qos,
                            retain_as_published: sub.retain_as_published,
                            subscription_ids: sub.subscription_id.into_iter().collect(),
                        });
                    }
                }
                Target::Queue(queue) => {
                    if let Some(r) = routes.queues.iter_mut().find(|r| r.queue == *queue) {
                        r.qos = r.qos.max(sub.qos);
                    } else {
                        routes.queues.push(QueueRoute { queue: *queue, qos: sub.qos });
                    }
                }
            }
        }
        routes
    }
}

/// A publisher's cache of resolved routes, valid for one router generation.
#[derive(Debug, Default)]
pub struct RouteCache {
    generation: u64,
    map: HashMap<String, Arc<Routes>>,
}

/// Most topics one connection caches before the cache is cleared.
const ROUTE_CACHE_TOPICS: usize = 1024;

impl RouteCache {
    /// Routes of `topic` for `publisher`, from the cache when the table has not changed.
    pub fn resolve(&mut self, router: &Router, topic: &str, publisher: &str) -> Arc<Routes> {
        let generation = router.generation();
        if generation != self.generation {
            self.map.clear();
            self.generation = generation;
        } else if let Some(routes) = self.map.get(topic) {
            return routes.clone();
        }
        let routes = Arc::new(router.resolve(topic, publisher));
        if self.map.len() >= ROUTE_CACHE_TOPICS {
            self.map.clear();
        }
        self.map.insert(topic.to_owned(), routes.clone());
        routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(owner: OwnerId, qos: u8) -> Subscription {
        Subscription {
            owner,
            client_id: format!("c{owner}").into(),
            target: Target::Queue(QueueId(owner)),
            qos,
            no_local: false,
            retain_as_published: false,
            subscription_id: None,
        }
    }

    fn hits(r: &Router, topic: &str) -> Vec<u64> {
        let mut v: Vec<u64> = r.resolve(topic, "nobody").queues.iter().map(|q| q.queue.0).collect();
        v.sort();
        v
    }

    #[test]
    fn wildcards_match_per_spec() {
        let r = Router::new();
        r.subscribe("sport/tennis/player1/#", q(1, 0));
        r.subscribe("sport/+", q(2, 0));
        r.subscribe("+/+", q(3, 0));
        r.subscribe("#", q(4, 0));
        r.subscribe("/finance", q(5, 0));
        r.subscribe("+", q(6, 0));
        assert_eq!(hits(&r, "sport/tennis/player1"), vec![1, 4]);
        assert_eq!(hits(&r, "sport/tennis/player1/ranking"), vec![1, 4]);
        assert_eq!(hits(&r, "sport"), vec![4, 6]);
        assert_eq!(hits(&r, "sport/"), vec![2, 3, 4]);
        assert_eq!(hits(&r, "/finance"), vec![3, 4, 5]);
        assert_eq!(hits(&r, "$SYS/x"), Vec::<u64>::new());
        r.subscribe("$SYS/#", q(7, 0));
        assert_eq!(hits(&r, "$SYS/x"), vec![7]);
    }

    #[test]
    fn overlapping_subscriptions_merge_per_target() {
        let r = Router::new();
        let mut a = q(1, 0);
        a.subscription_id = Some(1);
        r.subscribe("a/+", a);
        let mut b = q(2, 2);
        b.target = Target::Queue(QueueId(1));
        r.subscribe("a/b", b);
        let routes = r.resolve("a/b", "x");
        assert_eq!(routes.queues, vec![QueueRoute { queue: QueueId(1), qos: 2 }]);
    }

    #[test]
    fn no_local_skips_the_publisher() {
        let r = Router::new();
        let mut s = q(1, 1);
        s.no_local = true;
        r.subscribe("t", s);
        assert!(r.resolve("t", "c1").is_empty());
        assert!(!r.resolve("t", "c2").is_empty());
    }

    #[test]
    fn unsubscribe_prunes_and_cache_follows_generation() {
        let r = Router::new();
        let mut cache = RouteCache::default();
        r.subscribe("a/+/c", q(1, 1));
        assert_eq!(cache.resolve(&r, "a/b/c", "p").queues.len(), 1);
        assert!(r.unsubscribe("a/+/c", 1));
        assert!(!r.unsubscribe("a/+/c", 1));
        assert!(cache.resolve(&r, "a/b/c", "p").is_empty());
        assert!(r.root.read().is_empty());
        assert_eq!(r.len(), 0);
    }
}
