//! A publisher's cache of resolved routes. A route stays valid until a change of the
//! table may affect it (see `generations.rs`): churn on other topics does not evict it.

use std::collections::HashMap;
use std::sync::Arc;

use super::generations::Dependency;
use super::{ExchangeKind, RouteError, Router, Routes, MQTT_VHOST};
use crate::core::message::Message;

/// A publisher's cache of resolved routes by (exchange, routing key, tag). The tag is part
/// of the key because tag filters decide by it.
///
/// Entries are found by a hash of the three and compared as `&str`, so a hit allocates
/// nothing and takes no lock: it reads the four counters its route depends on.
#[derive(Debug, Default)]
pub struct RouteCache {
    hasher: std::collections::hash_map::RandomState,
    map: HashMap<u64, Vec<CachedRoute>>,
    /// Entries in `map`.
    cached: usize,
    /// Bytes of the routing keys and tags of the entries in `map`.
    cached_bytes: usize,
    /// Kind and `internal` flag of exchanges looked up (`None`: no such exchange), valid
    /// while [`Router::exchanges_generation`] is `exchanges_generation`.
    exchanges: HashMap<String, Option<(ExchangeKind, bool)>>,
    exchanges_generation: u64,
    /// Routes resolved in the table (misses) since [`RouteCache::take_lookups`].
    lookups: u64,
}

#[derive(Debug)]
struct CachedRoute {
    exchange: Box<str>,
    key: Box<str>,
    tag: Option<Box<str>>,
    routes: Arc<Routes>,
    /// The counters the route depends on, and their value when it was resolved.
    dependency: Dependency,
    snapshot: u64,
}

impl CachedRoute {
    fn is(&self, exchange: &str, key: &str, tag: Option<&str>) -> bool {
        &*self.exchange == exchange && &*self.key == key && self.tag.as_deref() == tag
    }

    /// What the entry's strings take.
    fn bytes(&self) -> usize {
        self.exchange.len() + self.key.len() + self.tag.as_ref().map_or(0, |t| t.len())
    }
}

/// Most (exchange, key) pairs one connection caches before the cache is cleared.
const ROUTE_CACHE_KEYS: usize = 1024;
/// Most bytes of routing keys one connection caches before the cache is cleared (an MQTT
/// topic may be 64 KiB long: 1,024 of them would be 64 MiB per connection).
const ROUTE_CACHE_KEY_BYTES: usize = 256 * 1024;

impl RouteCache {
    /// Kind and `internal` flag of an exchange, from the cache when no exchange was
    /// declared or deleted since (the publish path asks for every message).
    pub fn exchange(&mut self, router: &Router, vhost: &str, name: &str) -> Option<(ExchangeKind, bool)> {
        let generation = router.exchanges_generation();
        if generation != self.exchanges_generation {
            self.exchanges.clear();
            self.exchanges_generation = generation;
        }
        if let Some(x) = self.exchanges.get(name) {
            return *x;
        }
        let x = router.exchange(vhost, name).map(|d| (d.kind, d.internal));
        if self.exchanges.len() >= ROUTE_CACHE_KEYS {
            self.exchanges.clear();
        }
        self.exchanges.insert(name.to_owned(), x);
        x
    }

    /// Routes of a publish of `msg` to `exchange`, from the cache while no change of the
    /// table may have affected them.
    pub fn route(
        &mut self,
        router: &Router,
        vhost: &str,
        exchange: &str,
        msg: &Message,
        publisher: &str,
    ) -> Result<Arc<Routes>, RouteError> {
        let (key, tag) = (msg.routing_key.as_str(), msg.tag());
        let hash = std::hash::BuildHasher::hash_one(&self.hasher, (exchange, key, tag));
        if let Some(entries) = self.map.get_mut(&hash) {
            if let Some(i) = entries.iter().position(|c| c.is(exchange, key, tag)) {
                let hit = &entries[i];
                if router.snapshot(hit.dependency) == hit.snapshot {
                    return Ok(hit.routes.clone());
                }
                let gone = entries.swap_remove(i);
                self.cached -= 1;
                self.cached_bytes -= gone.bytes();
            }
        }
        // Counters read before routing: a change made meanwhile shows up as a new value.
        let single = router.dependency(exchange, key);
        let (single_snapshot, table_snapshot) = (router.snapshot(single), router.snapshot(Dependency::Table));
        self.lookups += 1;
        let (routes, cacheable, visited) = router.route_visiting(vhost, &[exchange], msg, publisher, false, &[])?;
        let (dependency, snapshot) =
            if visited.len() <= 1 { (single, single_snapshot) } else { (Dependency::Table, table_snapshot) };
        let routes = Arc::new(routes);
        if cacheable {
            let entry = CachedRoute {
                exchange: exchange.into(),
                key: key.into(),
                tag: tag.map(Into::into),
                routes: routes.clone(),
                dependency,
                snapshot,
            };
            if self.cached >= ROUTE_CACHE_KEYS || self.cached_bytes + entry.bytes() > ROUTE_CACHE_KEY_BYTES {
                self.map.clear();
                self.cached = 0;
                self.cached_bytes = 0;
            }
            self.cached_bytes += entry.bytes();
            self.map.entry(hash).or_default().push(entry);
            self.cached += 1;
        }
        Ok(routes)
    }

    /// Routes resolved in the table since the last call (the connection adds them to the
    /// broker's counters in batches).
    pub fn take_lookups(&mut self) -> u64 {
        std::mem::take(&mut self.lookups)
    }

    /// Routes of an MQTT publish `msg` on the MQTT exchange.
    pub fn resolve(&mut self, router: &Router, msg: &Message, publisher: &str) -> Arc<Routes> {
        self.route(router, MQTT_VHOST, router.mqtt_exchange(), msg, publisher).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ferrymq_storage::QueueId;

    use crate::core::message::Message;
    use crate::core::router::tests::{mqtt_hits, msg, opts, q, queues, tagged};
    use crate::core::router::{Binding, QueueRoute, RouteCache, RouteError, Router};
    use crate::core::tag_filter::{TagFilter, TagFilterError, TAG_FILTER_ARGUMENT};
    use crate::core::value::Value;

    #[test]
    fn churn_on_other_topics_keeps_a_cached_route() {
        let r = Router::new();
        r.subscribe("plant/+", q(1), opts(1));
        let mut cache = RouteCache::default();
        let first = cache.resolve(&r, &msg("plant.line1", &[]), "pub");
        assert_eq!(first.queues.len(), 1);
        // Devices come and go on other topics: the cached route stays.
        for i in 0..100 {
            r.subscribe(&format!("devices/{i}/cmd"), q(100 + i), opts(1));
            assert!(r.unsubscribe(&format!("devices/{i}/cmd"), &q(100 + i)));
            let again = cache.resolve(&r, &msg("plant.line1", &[]), "pub");
            assert!(Arc::ptr_eq(&first, &again), "round {i}: still the cached route");
        }
        // A subscription that matches changes it.
        r.subscribe("plant/#", q(2), opts(1));
        let changed = cache.resolve(&r, &msg("plant.line1", &[]), "pub");
        assert_eq!(changed.queues.len(), 2);
        // And an exchange-level change drops it too (conservatively).
        r.add_vhost("other");
        let after = cache.resolve(&r, &msg("plant.line1", &[]), "pub");
        assert!(!Arc::ptr_eq(&changed, &after));
        assert_eq!(after.queues.len(), 2);
    }

    #[test]
    fn no_local_overlap_and_cache() {
        let r = Router::new();
        let mut nl = opts(1);
        nl.no_local = true;
        nl.client_id = "me".into();
        r.subscribe("t/#", q(1), nl);
        r.subscribe("t/+", q(2), opts(0));
        r.subscribe("t/x", q(2), opts(2));
        let routes = r.resolve(&msg("t.x", &[]), "me");
        assert_eq!(routes.queues, vec![QueueRoute { queue: QueueId(2), qos: 2, reserved: false }]);
        let mut cache = RouteCache::default();
        assert_eq!(cache.resolve(&r, &msg("t.x", &[]), "other").queues.len(), 2);
        assert!(r.unsubscribe("t/#", &q(1)));
        assert_eq!(cache.resolve(&r, &msg("t.x", &[]), "other").queues.len(), 1, "cache follows the generation");
    }

    fn filter_arg(expr: &str) -> Vec<(String, Value)> {
        vec![(TAG_FILTER_ARGUMENT.into(), Value::Str(expr.into()))]
    }

    #[test]
    fn tag_filters_decide_per_message_and_the_cache_keys_by_tag() {
        let r = Router::new();
        r.bind("/", "amq.direct", Binding::queue(QueueId(1), "k", filter_arg("A || B"))).unwrap();
        r.bind("/", "amq.direct", Binding::queue(QueueId(2), "k", filter_arg("*"))).unwrap();
        r.bind("/", "amq.direct", Binding::queue(QueueId(3), "k", vec![])).unwrap();
        let mut cache = RouteCache::default();
        let hits = |cache: &mut RouteCache, m: &Message| queues(&cache.route(&r, "/", "amq.direct", m, "").unwrap());
        assert_eq!(hits(&mut cache, &tagged("k", "A")), vec![1, 2, 3]);
        assert_eq!(hits(&mut cache, &tagged("k", "C")), vec![2, 3], "same key, other tag: not the cached route");
        assert_eq!(hits(&mut cache, &msg("k", &[])), vec![2, 3]);
        assert_eq!(hits(&mut cache, &tagged("k", "B")), vec![1, 2, 3]);
        assert_eq!(hits(&mut cache, &tagged("k", "a")), vec![2, 3], "case-sensitive");
        for bad in ["", "A || ", " || ", "* || A"] {
            let e = r.bind("/", "amq.direct", Binding::queue(QueueId(4), "k", filter_arg(bad)));
            assert!(matches!(e, Err(RouteError::TagFilter(_))), "{bad:?}: {e:?}");
        }
        let e = r.bind(
            "/",
            "amq.direct",
            Binding::queue(QueueId(4), "k", vec![(TAG_FILTER_ARGUMENT.into(), Value::Int(1))]),
        );
        assert_eq!(e, Err(RouteError::TagFilter(TagFilterError::NotAString)));
        // MQTT subscriptions carry theirs in the options.
        let mut o = opts(1);
        o.tag_filter = Some(Arc::new(TagFilter::parse("A").unwrap()));
        r.subscribe("t/#", q(5), o);
        assert_eq!(mqtt_hits(&r, "t/x"), Vec::<u64>::new());
        assert_eq!(queues(&r.resolve(&tagged("t.x", "A"), "")), vec![5]);
    }

    #[test]
    fn long_keys_are_cached_within_a_byte_bound() {
        let r = Router::new();
        r.subscribe("big/#", q(1), opts(1));
        let mut cache = RouteCache::default();
        let word = "x".repeat(60 * 1024);
        for i in 0..40 {
            let key = format!("big.{i}.{word}");
            assert_eq!(cache.resolve(&r, &msg(&key, &[]), "pub").queues.len(), 1);
            assert!(cache.cached_bytes <= super::ROUTE_CACHE_KEY_BYTES, "round {i}: {} bytes", cache.cached_bytes);
            assert_eq!(cache.cached_bytes, cache.map.values().flatten().map(|c| c.bytes()).sum::<usize>());
        }
    }
}
