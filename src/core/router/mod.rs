//! The routing table: virtual hosts, their exchanges and bindings — one table for both
//! protocols. MQTT subscriptions are bindings on the MQTT exchange (`amq.topic`): a filter
//! `a/+/#` is the binding key `a.*.#`, a topic `a/b/c` the routing key `a.b.c`, so AMQP
//! queues and MQTT sessions bound to the same exchange see each other's messages.
//!
//! A binding leads to a consume queue, to another exchange (exchange-to-exchange
//! bindings), or to a connected clean MQTT session (the online fast path: the message
//! goes straight to its outbound channel, no storage). The table is read-mostly:
//! publishers resolve through a per-connection [`RouteCache`], so the hot path takes no
//! lock for a key it has seen; changes take the write lock, bump the generation and say
//! what they touched (a binding key on one exchange, or anything), so a cache drops only
//! the routes a change can affect.
//!
//! A binding may carry a tag filter (`x-tag-filter`, or an MQTT 5 SUBSCRIBE's
//! `tag-filter`), compiled when it is added: it is checked at route time against the
//! message's tag, and the route cache is keyed by the tag as well as the routing key.
//! `x-consistent-hash` exchanges keep their [`Ring`] beside their bindings, built when a
//! message is first routed after those changed (so restoring or adding N bindings costs
//! one build, not N, and no build runs under the write lock).
//!
//! # A publish through the table
//!
//! ```text
//!  publish(exchange, msg) ──▶ RouteCache::route ──hit──▶ Arc<Routes>
//!                                   │ miss (or a change since may affect it)
//!                                   ▼
//!                             Router::route ── read lock ──▶ the exchange's bindings
//!                                   │  direct: by key · fanout: all · topic: the trie
//!                                   │  headers: x-match · x-consistent-hash: one, by the ring
//!                                   ▼
//!                             no-local, tag filter ──▶ Routes { sessions, queues }
//!                                   │  a binding to an exchange: route there too
//!                                   └─ nothing delivered: the alternate exchange
//! ```
//!
//! The result goes back into the cache only when it depends on nothing but (exchange,
//! routing key, tag): headers and header-hashed exchanges are routed every time.
//!
//! # Files
//!
//! - `mod.rs` — the [`Router`] table (virtual hosts, exchanges, bind/unbind, route) and
//!   what a route yields ([`Routes`]).
//! - `exchange.rs` — exchange definitions and kinds, [`Binding`], [`Destination`],
//!   [`MqttOptions`], and the edits of a binding list every kind shares. It imports no
//!   other file of the router: the others take their types from it, not from `mod.rs`,
//!   so the router's files import each other in no circle.
//! - `bindings.rs` — how one exchange stores its bindings, per kind, and headers matching.
//! - `topic_trie.rs` — the topic exchange's trie of word patterns.
//! - `cache.rs` — the per-publisher [`RouteCache`].
//! - `generations.rs` — the counters that tell a cache which of its routes a change may
//!   have affected.
//! - [`hash_ring`] — the `x-consistent-hash` exchange's ring.
//!
//! [`Ring`]: hash_ring::Ring

mod binding_list;
mod bindings;
mod cache;
mod exchange;
mod generations;
pub mod hash_ring;
#[cfg(test)]
mod tests;
mod topic_trie;

pub use cache::RouteCache;
pub use exchange::{Binding, Destination, ExchangeDef, ExchangeKind, MqttOptions, SHARE_GROUP_ARG, STANDARD_EXCHANGES};
pub use topic_trie::INLINE_STEPS;

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use ferrymq_storage::QueueId;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use self::bindings::Bindings;
use self::generations::{Change, Dependency, Generations};
use self::hash_ring::{parse_weight, HashArgError, HashOn, MAX_RING_WEIGHT};
use super::blocking::off_worker;
use super::dedup::{CacheSettings, DedupArgError, DedupCache, DedupChange};
use super::delivery::SessionLink;
use super::message::{now_ms, Message};
use super::tag_filter::TagFilterError;
use super::value::Value;

/// One exchange of the table: its definition and its bindings.
#[derive(Debug)]
struct Exchange {
    def: ExchangeDef,
    bindings: Bindings,
    /// The cache of an `x-message-deduplication` exchange.
    dedup: Option<Arc<DedupCache>>,
}

impl Exchange {
    /// An exchange with no bindings (its arguments were checked).
    fn new(vhost: &str, def: ExchangeDef) -> Exchange {
        let dedup = (def.kind == ExchangeKind::MessageDeduplication)
            .then(|| CacheSettings::from_arguments(&def.arguments).ok())
            .flatten()
            .map(|settings| Arc::new(DedupCache::new(vhost, &def.name, settings)));
        Exchange { bindings: Bindings::new(&def), def, dedup }
    }
}

/// A resolved session target: one per session, overlapping subscriptions merged.
#[derive(Debug, Clone)]
pub struct SessionRoute {
    /// The session's outbound channel the message goes straight to.
    pub link: Arc<SessionLink>,
    /// Highest granted QoS among the matching subscriptions.
    pub qos: u8,
    /// Keep the published RETAIN flag.
    pub retain_as_published: bool,
    /// Subscription identifiers of every matching subscription.
    pub subscription_ids: Vec<u32>,
}

/// One queue a resolved publish is stored for, with what the match granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRoute {
    /// The consume queue the message is stored for.
    pub queue: QueueId,
    /// Highest granted QoS among the matching bindings (2 for AMQP bindings).
    pub qos: u8,
    /// The publisher reserved room in this reject-publish queue ([`QueueConfig::admit`]).
    ///
    /// [`QueueConfig::admit`]: crate::core::queue::QueueConfig::admit
    pub reserved: bool,
}

/// Another cluster member a publish is forwarded to: subscribers or transient queues of
/// its own match (its [`Destination::Member`] bindings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRoute {
    /// The member's node name.
    pub member: Arc<str>,
    /// The virtual host the publish was routed in.
    pub vhost: Arc<str>,
    /// The publisher (an MQTT client id, for no-local there; "" otherwise).
    pub publisher: Arc<str>,
    /// The exchanges whose bindings to the member matched (where it routes the message
    /// from when it lacks the exchange it was published to).
    pub exchanges: Vec<Box<str>>,
    /// The MQTT shared-subscription groups whose members there take the message (each
    /// group takes it once, cluster-wide: through one member only).
    pub groups: Vec<Arc<str>>,
}

/// Every target of one publish.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    /// Connected clean sessions, delivered to directly (no storage).
    pub sessions: Vec<SessionRoute>,
    /// Consume queues the message is stored for.
    pub queues: Vec<QueueRoute>,
    /// Other cluster members the message is forwarded to (none on a single node).
    pub members: Vec<MemberRoute>,
    /// Changes to disk-persistent de-duplication caches the message passed through,
    /// stored with it.
    pub dedup: Vec<DedupChange>,
}

impl Routes {
    /// True when nothing matched.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty() && self.queues.is_empty() && self.members.is_empty()
    }

    /// Adds member `member` (bound on `exchange`) as the one through which shared group
    /// `group` takes the message.
    fn add_group_member(&mut self, exchange: &str, member: &Arc<str>, group: &str, index: &mut RouteIndex) {
        let b = Binding {
            dest: Destination::Member(member.clone()),
            key: String::new(),
            args: Vec::new(),
            mqtt: None,
            filter: None,
        };
        self.add(exchange, &b, index);
        if let Some(r) = self.members.iter_mut().find(|r| r.member == *member) {
            if !r.groups.iter().any(|g| &**g == group) {
                r.groups.push(Arc::from(group));
            }
        }
    }

    /// How many targets there are (a change shows that a route delivered).
    fn targets(&self) -> usize {
        self.sessions.len() + self.queues.len() + self.members.len()
    }

    /// Adds the target of `b` (a binding of `exchange`), or merges it into the same
    /// target's route (`index` finds it when there are many).
    fn add(&mut self, exchange: &str, b: &Binding, index: &mut RouteIndex) {
        match &b.dest {
            Destination::Session(link) => {
                let Some(o) = &b.mqtt else { return };
                if let Some(i) = index.session(&self.sessions, link) {
                    let r = &mut self.sessions[i];
                    r.qos = r.qos.max(o.qos);
                    r.retain_as_published |= o.retain_as_published;
                    r.subscription_ids.extend(o.subscription_id);
                } else {
                    index.pushed_session(link, self.sessions.len());
                    self.sessions.push(SessionRoute {
                        link: link.clone(),
                        qos: o.qos,
                        retain_as_published: o.retain_as_published,
                        subscription_ids: o.subscription_id.into_iter().collect(),
                    });
                }
            }
            Destination::Queue(queue) => {
                let qos = b.mqtt.as_ref().map_or(2, |o| o.qos);
                if let Some(i) = index.queue(&self.queues, *queue) {
                    let r = &mut self.queues[i];
                    r.qos = r.qos.max(qos);
                } else {
                    index.pushed_queue(*queue, self.queues.len());
                    self.queues.push(QueueRoute { queue: *queue, qos, reserved: false });
                }
            }
            Destination::Member(member) => match self.members.iter_mut().find(|r| r.member == *member) {
                Some(r) if r.exchanges.iter().any(|x| &**x == exchange) => {}
                Some(r) => r.exchanges.push(exchange.into()),
                None => self.members.push(MemberRoute {
                    member: member.clone(),
                    vhost: Arc::from(""),
                    publisher: Arc::from(""),
                    exchanges: vec![exchange.into()],
                    groups: Vec::new(),
                }),
            },
            Destination::Exchange(_) => {}
        }
    }
}

/// Targets up to this many are searched when a route is built; more are indexed.
const ROUTE_INDEX_FROM: usize = 16;

/// Where each target already is in the [`Routes`] being built, once there are many: a
/// publish matched by a million subscriptions merges each into its route in constant time
/// (a session matched through two subscriptions gets one delivery at the higher QoS).
#[derive(Default)]
struct RouteIndex {
    sessions: HashMap<usize, usize>,
    queues: HashMap<QueueId, usize>,
}

impl RouteIndex {
    fn session(&mut self, sessions: &[SessionRoute], link: &Arc<SessionLink>) -> Option<usize> {
        if sessions.len() < ROUTE_INDEX_FROM {
            return sessions.iter().position(|r| Arc::ptr_eq(&r.link, link));
        }
        if self.sessions.is_empty() {
            self.sessions = sessions.iter().enumerate().map(|(i, r)| (Arc::as_ptr(&r.link) as usize, i)).collect();
        }
        self.sessions.get(&(Arc::as_ptr(link) as usize)).copied()
    }

    fn pushed_session(&mut self, link: &Arc<SessionLink>, at: usize) {
        if !self.sessions.is_empty() {
            self.sessions.insert(Arc::as_ptr(link) as usize, at);
        }
    }

    fn queue(&mut self, queues: &[QueueRoute], queue: QueueId) -> Option<usize> {
        if queues.len() < ROUTE_INDEX_FROM {
            return queues.iter().position(|r| r.queue == queue);
        }
        if self.queues.is_empty() {
            self.queues = queues.iter().enumerate().map(|(i, r)| (r.queue, i)).collect();
        }
        self.queues.get(&queue).copied()
    }

    fn pushed_queue(&mut self, queue: QueueId, at: usize) {
        if !self.queues.is_empty() {
            self.queues.insert(queue, at);
        }
    }
}

/// Why a publish or binding could not be routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The virtual host does not exist.
    #[error("no vhost '{0}'")]
    NoVhost(String),
    /// Exchange `.0` does not exist in vhost `.1`.
    #[error("no exchange '{0}' in vhost '{1}'")]
    NoExchange(String, String),
    /// An `x-tag-filter` (or MQTT `tag-filter`) expression is invalid.
    #[error("invalid arg 'x-tag-filter': {0}")]
    TagFilter(#[from] TagFilterError),
    /// A consistent-hash exchange's arguments or a binding weight are invalid.
    #[error("{0}")]
    HashArgument(#[from] HashArgError),
    /// A message-deduplication exchange's `x-cache-*` arguments are invalid.
    #[error("{0}")]
    DedupArgument(#[from] DedupArgError),
    /// A routing key of more than [`MAX_KEY_WORDS`] words (how many it has).
    #[error("routing key of {0} words: at most {MAX_KEY_WORDS} are routed")]
    RoutingKeyTooLong(usize),
    /// A topic binding key of more than [`MAX_KEY_WORDS`] words (how many it has).
    #[error("binding key of {0} words: a topic exchange takes at most {MAX_KEY_WORDS}")]
    BindingKeyTooLong(usize),
}

/// The most words (`.`-separated) a routing key, and a topic exchange's binding key, may
/// have: as many as an AMQP short string (255 bytes) can hold, so no AMQP client meets the
/// limit, and MQTT topics and filters are held below it by `mqtt.max_topic_levels`. Longer
/// keys are refused, which bounds what one route costs (see `topic_trie.rs`) and how deep
/// the trie's walks go.
pub const MAX_KEY_WORDS: usize = 256;

/// The words of a routing or binding key, as the router splits it (the empty key has none).
pub fn key_words(key: &str) -> usize {
    if key.is_empty() {
        0
    } else {
        key.bytes().filter(|&b| b == b'.').count() + 1
    }
}

/// The exchanges of one virtual host, by name.
#[derive(Debug, Default)]
struct Vhost {
    exchanges: HashMap<String, Exchange>,
}

/// The routing table of every virtual host.
#[derive(Debug, Default)]
pub struct Router {
    vhosts: RwLock<HashMap<String, Vhost>>,
    generations: Generations,
    mqtt_subscriptions: AtomicUsize,
    /// The topic exchange of virtual host `/` that MQTT publishes and subscriptions use.
    mqtt_exchange: String,
    /// Routes whose walk of a topic exchange passed [`INLINE_STEPS`].
    long_routes: AtomicU64,
    /// Told of every binding change (a cluster member's).
    observer: OnceLock<Arc<dyn BindingObserver>>,
}

/// The virtual host MQTT clients use.
pub const MQTT_VHOST: &str = "/";
/// The exchange MQTT publishes and subscriptions use by default (`mqtt.exchange`).
pub const MQTT_EXCHANGE: &str = "amq.topic";

impl Router {
    /// The table for reading; a wait for it (a change waiting for a long route to end)
    /// happens off the runtime's workers.
    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Vhost>> {
        self.vhosts.try_read().unwrap_or_else(|| off_worker(|| self.vhosts.read()))
    }

    /// The table for a change; waits happen off the runtime's workers, as in [`Router::read`].
    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, Vhost>> {
        self.vhosts.try_write().unwrap_or_else(|| off_worker(|| self.vhosts.write()))
    }

    /// Routes whose walk of a topic exchange took more than [`INLINE_STEPS`] steps and
    /// finished off the runtime's workers (`ferrymq_routes_off_worker` in `/metrics`).
    pub fn long_routes(&self) -> u64 {
        self.long_routes.load(Ordering::Relaxed)
    }

    /// A table with the default virtual host `/` and its standard exchanges; MQTT uses
    /// `amq.topic`.
    pub fn new() -> Self {
        Router::with_mqtt_exchange(MQTT_EXCHANGE)
    }

    /// A table whose MQTT publishes and subscriptions go through the topic exchange
    /// `name` of `/` (declared durable if it is not a standard one).
    pub fn with_mqtt_exchange(name: &str) -> Self {
        let r = Router { mqtt_exchange: name.to_owned(), ..Router::default() };
        r.add_vhost(MQTT_VHOST);
        let def = ExchangeDef {
            name: name.to_owned(),
            kind: ExchangeKind::Topic,
            durable: true,
            auto_delete: false,
            internal: false,
            arguments: Vec::new(),
        };
        let _ = r.declare_exchange(MQTT_VHOST, def);
        r
    }

    /// The exchange MQTT publishes and subscriptions use.
    pub fn mqtt_exchange(&self) -> &str {
        &self.mqtt_exchange
    }

    /// Records a change that may affect any route.
    fn changed(&self) {
        self.record(Change::Any);
    }

    fn record(&self, change: Change) {
        self.generations.record(&change);
    }

    /// Records a change of the bindings with `key` on `exchange` of `vhost`.
    fn binding_changed(&self, vhost: &str, exchange: &str, key: &str) {
        let kind = self.read().get(vhost).and_then(|v| v.exchanges.get(exchange)).map(|x| x.def.routing_kind());
        match kind {
            Some(kind) => self.record(Change::Binding { exchange: exchange.to_owned(), kind, key: key.to_owned() }),
            // The exchange went with its last binding (auto-delete).
            None => self.changed(),
        }
    }

    /// Adds a virtual host with the standard exchanges (no-op if it exists).
    pub fn add_vhost(&self, name: &str) {
        let mut vhosts = self.write();
        let vhost = vhosts.entry(name.to_owned()).or_default();
        for (x, kind) in STANDARD_EXCHANGES {
            vhost.exchanges.entry(x.to_owned()).or_insert_with(|| {
                let def = ExchangeDef {
                    name: x.to_owned(),
                    kind,
                    durable: true,
                    auto_delete: false,
                    internal: false,
                    arguments: Vec::new(),
                };
                Exchange::new(name, def)
            });
        }
        drop(vhosts);
        self.changed();
    }

    /// Removes a virtual host with its exchanges and bindings; true if it existed. (Its
    /// queues are the front-end's to delete first.)
    pub fn remove_vhost(&self, name: &str) -> bool {
        let Some(removed) = self.write().remove(name) else { return false };
        self.changed();
        for (exchange, x) in &removed.exchanges {
            self.tell_unbound(name, exchange, x.def.kind, &x.bindings.all());
        }
        true
    }

    /// Every virtual host, by name.
    pub fn vhosts(&self) -> Vec<String> {
        let mut all: Vec<String> = self.read().keys().cloned().collect();
        all.sort();
        all
    }

    /// True when the virtual host exists.
    pub fn has_vhost(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    /// Current generation; changes on every modification.
    pub fn generation(&self) -> u64 {
        self.generations.table()
    }

    /// What a cached route of `routing_key` from `exchange` depends on.
    fn dependency(&self, exchange: &str, routing_key: &str) -> Dependency {
        self.generations.dependency(exchange, routing_key)
    }

    /// The value of `dep`'s counters: a cached route is valid while it is unchanged.
    fn snapshot(&self, dep: Dependency) -> u64 {
        self.generations.snapshot(dep)
    }

    /// Counter of exchange-level changes (exchanges declared or deleted, virtual hosts
    /// added): what a cache of exchange kinds follows.
    pub fn exchanges_generation(&self) -> u64 {
        self.generations.any()
    }

    /// Number of MQTT subscriptions (bindings with MQTT options).
    pub fn len(&self) -> usize {
        self.mqtt_subscriptions.load(Ordering::Relaxed)
    }

    /// True when there are no MQTT subscriptions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of exchange `name`'s definition; `None` if it or `vhost` does not exist.
    pub fn exchange(&self, vhost: &str, name: &str) -> Option<ExchangeDef> {
        self.read().get(vhost)?.exchanges.get(name).map(|x| x.def.clone())
    }

    /// True when exchange `name` of `vhost` is the source of a binding.
    pub fn has_bindings(&self, vhost: &str, name: &str) -> Result<bool, RouteError> {
        let vhosts = self.read();
        let v = vhosts.get(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let x = v.exchanges.get(name).ok_or_else(|| RouteError::NoExchange(name.to_owned(), vhost.to_owned()))?;
        Ok(!x.bindings.is_empty())
    }

    /// Every exchange of a virtual host.
    pub fn exchanges(&self, vhost: &str) -> Vec<ExchangeDef> {
        self.read().get(vhost).map(|v| v.exchanges.values().map(|x| x.def.clone()).collect()).unwrap_or_default()
    }

    /// Creates an exchange; returns the existing definition if one of that name exists
    /// (the caller compares and decides). Refuses invalid `x-consistent-hash` arguments.
    pub fn declare_exchange(&self, vhost: &str, def: ExchangeDef) -> Result<Option<ExchangeDef>, RouteError> {
        check_exchange_arguments(&def)?;
        let mut vhosts = self.write();
        let v = vhosts.get_mut(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        if let Some(x) = v.exchanges.get(&def.name) {
            return Ok(Some(x.def.clone()));
        }
        v.exchanges.insert(def.name.clone(), Exchange::new(vhost, def));
        drop(vhosts);
        self.changed();
        Ok(None)
    }

    /// What [`Router::declare_exchange`] would refuse, without declaring (a cluster member
    /// checks before its metadata group commits the exchange, which every member then makes).
    pub fn check_exchange(&self, vhost: &str, def: &ExchangeDef) -> Result<(), RouteError> {
        check_exchange_arguments(def)?;
        match self.read().contains_key(vhost) {
            true => Ok(()),
            false => Err(RouteError::NoVhost(vhost.to_owned())),
        }
    }

    /// Deletes an exchange, its bindings and the bindings that lead to it. `if_unused`:
    /// refuse (`Ok(false)`) when it has bindings.
    pub fn delete_exchange(&self, vhost: &str, name: &str, if_unused: bool) -> Result<bool, RouteError> {
        let mut vhosts = self.write();
        let v = vhosts.get_mut(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let Some(x) = v.exchanges.get(name) else {
            return Err(RouteError::NoExchange(name.to_owned(), vhost.to_owned()));
        };
        if if_unused && !x.bindings.is_empty() {
            return Ok(false);
        }
        let gone = v.exchanges.remove(name);
        let dest = Destination::Exchange(name.to_owned());
        for x in v.exchanges.values_mut() {
            x.bindings.remove(None, &|b| b.dest == dest);
        }
        drop(vhosts);
        self.changed();
        if let Some(x) = gone.filter(|_| self.observer.get().is_some()) {
            self.tell_unbound(vhost, name, x.def.kind, &x.bindings.all());
        }
        Ok(true)
    }

    /// Adds (or replaces) a binding on an exchange; true if it is new. Compiles its tag
    /// filter; refuses an invalid one, a binding key that is not a weight on an
    /// `x-consistent-hash` exchange, and one of more than [`MAX_KEY_WORDS`] words on a
    /// topic exchange.
    pub fn bind(&self, vhost: &str, exchange: &str, mut binding: Binding) -> Result<bool, RouteError> {
        binding.compile_filter()?;
        let mut vhosts = self.write();
        let v = vhosts.get_mut(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let x = v
            .exchanges
            .get_mut(exchange)
            .ok_or_else(|| RouteError::NoExchange(exchange.to_owned(), vhost.to_owned()))?;
        check_binding(x, &binding)?;
        let is_mqtt = binding.mqtt.is_some();
        let kind = x.def.kind;
        let told = self.observer.get().map(|o| (o, binding.clone()));
        let key = binding.key.clone();
        let added = x.bindings.add(binding);
        drop(vhosts);
        if added && is_mqtt {
            self.mqtt_subscriptions.fetch_add(1, Ordering::Relaxed);
        }
        self.binding_changed(vhost, exchange, &key);
        if let Some((observer, binding)) = told.filter(|_| added) {
            observer.bound(vhost, exchange, kind, &binding);
        }
        Ok(added)
    }

    /// What [`Router::bind`] would refuse, without binding (a cluster member checks before
    /// its metadata group commits the binding, which every member then makes).
    pub fn check_bind(&self, vhost: &str, exchange: &str, binding: &Binding) -> Result<(), RouteError> {
        binding.clone().compile_filter()?;
        let vhosts = self.read();
        let v = vhosts.get(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let x =
            v.exchanges.get(exchange).ok_or_else(|| RouteError::NoExchange(exchange.to_owned(), vhost.to_owned()))?;
        check_binding(x, binding)
    }

    /// Removes the binding (dest, key, args) from an exchange; true if it existed. An
    /// auto-delete exchange that loses its last binding is deleted.
    pub fn unbind(
        &self,
        vhost: &str,
        exchange: &str,
        dest: &Destination,
        key: &str,
        args: &[(String, Value)],
    ) -> Result<bool, RouteError> {
        let mut vhosts = self.write();
        let v = vhosts.get_mut(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let x = v
            .exchanges
            .get_mut(exchange)
            .ok_or_else(|| RouteError::NoExchange(exchange.to_owned(), vhost.to_owned()))?;
        let removed = x.bindings.remove_one(dest, key, args);
        let kind = x.def.kind;
        // Another member's binding going never deletes an exchange here: the exchange is
        // this member's to delete (or, durable, the cluster's).
        let by_member = matches!(dest, Destination::Member(_));
        if removed.is_some() && !by_member && x.def.auto_delete && x.bindings.is_empty() {
            v.exchanges.remove(exchange);
        }
        drop(vhosts);
        let Some(removed) = removed else {
            return Ok(false);
        };
        if removed.mqtt.is_some() {
            self.mqtt_subscriptions.fetch_sub(1, Ordering::Relaxed);
        }
        self.binding_changed(vhost, exchange, key);
        self.tell_unbound(vhost, exchange, kind, std::slice::from_ref(&removed));
        Ok(true)
    }

    /// Removes every binding leading to `dest` in a virtual host (a deleted queue);
    /// auto-delete exchanges left without bindings are deleted. Returns how many.
    pub fn unbind_all(&self, vhost: &str, dest: &Destination) -> usize {
        let mut vhosts = self.write();
        let Some(v) = vhosts.get_mut(vhost) else { return 0 };
        let mqtt = Cell::new(0usize);
        let mut n = 0;
        let mut emptied = Vec::new();
        // What was removed, for the observer (when there is one).
        let observed = self.observer.get().is_some();
        let mut told: Vec<(String, ExchangeKind, Vec<Binding>)> = Vec::new();
        for (name, x) in v.exchanges.iter_mut() {
            let gone = std::cell::RefCell::new(Vec::new());
            let removed = x.bindings.remove(None, &|b| {
                let hit = b.dest == *dest;
                if hit && b.mqtt.is_some() {
                    mqtt.set(mqtt.get() + 1);
                }
                if hit && observed {
                    gone.borrow_mut().push(b.clone());
                }
                hit
            });
            n += removed;
            if removed > 0 && x.def.auto_delete && x.bindings.is_empty() {
                emptied.push(name.clone());
            }
            let gone = gone.into_inner();
            if !gone.is_empty() {
                told.push((name.clone(), x.def.kind, gone));
            }
        }
        for name in emptied {
            v.exchanges.remove(&name);
        }
        drop(vhosts);
        self.removed(n, mqtt.get());
        for (exchange, kind, gone) in told {
            self.tell_unbound(vhost, &exchange, kind, &gone);
        }
        n
    }

    fn removed(&self, bindings: usize, mqtt: usize) {
        if mqtt > 0 {
            self.mqtt_subscriptions.fetch_sub(mqtt, Ordering::Relaxed);
        }
        if bindings > 0 {
            self.changed();
        }
    }

    /// Every binding of a virtual host to this member's destinations: (exchange, binding).
    pub fn bindings(&self, vhost: &str) -> Vec<(String, Binding)> {
        let vhosts = self.read();
        let Some(v) = vhosts.get(vhost) else { return Vec::new() };
        v.exchanges
            .iter()
            .flat_map(|(name, x)| x.bindings.all().into_iter().filter(is_own).map(move |b| (name.clone(), b)))
            .collect()
    }

    /// The bindings of one exchange to this member's destinations (empty when it does not
    /// exist).
    pub fn bindings_of(&self, vhost: &str, exchange: &str) -> Vec<Binding> {
        let vhosts = self.read();
        let all = vhosts.get(vhost).and_then(|v| v.exchanges.get(exchange)).map(|x| x.bindings.all());
        all.unwrap_or_default().into_iter().filter(is_own).collect()
    }

    /// Has `observer` told of every binding from now on, starting with those there are
    /// (each as added). Set once; later calls change nothing.
    pub fn observe_bindings(&self, observer: Arc<dyn BindingObserver>) {
        let vhosts = self.read();
        if self.observer.set(observer.clone()).is_err() {
            return;
        }
        for (vhost, v) in vhosts.iter() {
            for (name, x) in &v.exchanges {
                for b in x.bindings.all() {
                    observer.bound(vhost, name, x.def.kind, &b);
                }
            }
        }
    }

    /// Tells the observer that `removed` bindings of `exchange` (of `kind`) are gone.
    fn tell_unbound(&self, vhost: &str, exchange: &str, kind: ExchangeKind, removed: &[Binding]) {
        if let Some(o) = self.observer.get() {
            for b in removed {
                o.unbound(vhost, exchange, kind, b);
            }
        }
    }

    /// Adds an MQTT subscription (`filter` in MQTT syntax, without `$share/`) on the MQTT
    /// exchange; true if it is new.
    pub fn subscribe(&self, filter: &str, dest: Destination, opts: MqttOptions) -> bool {
        let binding =
            Binding { dest, key: mqtt_filter_to_pattern(filter), args: Vec::new(), mqtt: Some(opts), filter: None };
        self.bind(MQTT_VHOST, &self.mqtt_exchange, binding).unwrap_or(false)
    }

    /// Removes an MQTT subscription; true if it existed.
    pub fn unsubscribe(&self, filter: &str, dest: &Destination) -> bool {
        let key = mqtt_filter_to_pattern(filter);
        self.unbind(MQTT_VHOST, &self.mqtt_exchange, dest, &key, &[]).unwrap_or(false)
    }

    /// Every target of a publish of `msg` (its routing key, headers, properties and tag) to
    /// `exchange` by `publisher` (an MQTT client id, for no-local; "" otherwise). Follows
    /// exchange-to-exchange bindings and alternate exchanges. The flag says whether the
    /// result depends only on (exchange, routing key, tag) and may be cached. A routing key
    /// of more than [`MAX_KEY_WORDS`] words is refused.
    pub fn route(
        &self,
        vhost: &str,
        exchange: &str,
        msg: &Message,
        publisher: &str,
    ) -> Result<(Routes, bool), RouteError> {
        self.route_visiting(vhost, &[exchange], msg, publisher, false, &[])
            .map(|(routes, cacheable, _)| (routes, cacheable))
    }

    /// The targets on this member of a publish another member forwarded here: routed from
    /// `exchange` as [`Router::route`] does, bindings to other members passed over, when
    /// `exchange` is durable (the same on every member); otherwise (one of the other
    /// member's own, or a transient exchange of the same name) from the exchanges `via`
    /// whose bindings to this member matched there. Of the MQTT shared groups, only
    /// those in `groups` take it here (the other member chose this one for them).
    pub fn route_forwarded(
        &self,
        vhost: &str,
        exchange: &str,
        via: &[Box<str>],
        msg: &Message,
        publisher: &str,
        groups: &[Arc<str>],
    ) -> Result<Routes, RouteError> {
        // The exchange it was published to is the same here only when durable (the
        // cluster's); a transient one of that name here is another exchange.
        let same_here = self.read().get(vhost).and_then(|v| v.exchanges.get(exchange)).is_some_and(|x| x.def.durable);
        let from: Vec<&str> = match same_here {
            true => vec![exchange],
            false => via.iter().map(|x| &**x).collect(),
        };
        self.route_visiting(vhost, &from, msg, publisher, true, groups).map(|(routes, _, _)| routes)
    }

    /// [`Router::route`] from each of `exchanges` (one target reached through several
    /// counts once), also naming the exchanges the route went through; `local_only` passes
    /// bindings to other members over.
    fn route_visiting(
        &self,
        vhost: &str,
        exchanges: &[&str],
        msg: &Message,
        publisher: &str,
        local_only: bool,
        groups: &[Arc<str>],
    ) -> Result<(Routes, bool, Vec<Box<str>>), RouteError> {
        let words = key_words(&msg.routing_key);
        if words > MAX_KEY_WORDS {
            return Err(RouteError::RoutingKeyTooLong(words));
        }
        let vhosts = self.read();
        let v = vhosts.get(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let mut routes = Routes::default();
        let mut cacheable = true;
        let mut visited = HashSet::new();
        let input = RouteInput { msg, tag: msg.tag(), publisher, local_only, groups, long: Cell::new(None) };
        let mut index = RouteIndex::default();
        for exchange in exchanges {
            if !v.exchanges.contains_key(*exchange) {
                return Err(RouteError::NoExchange((*exchange).to_owned(), vhost.to_owned()));
            }
            route_into(v, exchange, &input, &mut routes, &mut index, &mut cacheable, &mut visited);
        }
        drop(vhosts);
        if !routes.members.is_empty() {
            let (vhost, publisher): (Arc<str>, Arc<str>) = (Arc::from(vhost), Arc::from(publisher));
            for m in &mut routes.members {
                (m.vhost, m.publisher) = (vhost.clone(), publisher.clone());
            }
        }
        if let Some((through, steps)) = input.long.take() {
            if self.long_routes.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    vhost,
                    exchange = %through,
                    steps,
                    routing_key_words = words,
                    "a route's walk of a topic exchange passed {INLINE_STEPS} steps (bindings of many wildcards \
                     against a long key) and finished off the runtime's workers; such routes are counted in \
                     ferrymq_routes_off_worker (logged once)"
                );
            }
        }
        Ok((routes, cacheable, visited.into_iter().map(String::into_boxed_str).collect()))
    }

    /// The cache of an `x-message-deduplication` exchange.
    pub fn dedup_cache(&self, vhost: &str, name: &str) -> Option<Arc<DedupCache>> {
        self.read().get(vhost)?.exchanges.get(name)?.dedup.clone()
    }

    /// The caches of every `x-message-deduplication` exchange (for expiry).
    pub fn dedup_caches(&self) -> Vec<Arc<DedupCache>> {
        let vhosts = self.read();
        vhosts.values().flat_map(|v| v.exchanges.values().filter_map(|x| x.dedup.clone())).collect()
    }

    /// Routes of an MQTT publish `msg` (on the MQTT exchange) by `publisher`.
    pub fn resolve(&self, msg: &Message, publisher: &str) -> Routes {
        self.route(MQTT_VHOST, &self.mqtt_exchange, msg, publisher).map(|(r, _)| r).unwrap_or_default()
    }
}

/// What one routing pass looks at.
struct RouteInput<'a> {
    msg: &'a Message,
    tag: Option<&'a str>,
    publisher: &'a str,
    /// Only this member's own targets: bindings to other members are passed over (a
    /// publish another member forwarded here).
    local_only: bool,
    /// With `local_only`: the MQTT shared groups whose queues here take the message (the
    /// member it was published through chose this one for them).
    groups: &'a [Arc<str>],
    /// A walk that passed [`INLINE_STEPS`]: its exchange and steps.
    long: Cell<Option<(String, usize)>>,
}

fn route_into(
    v: &Vhost,
    exchange: &str,
    input: &RouteInput<'_>,
    routes: &mut Routes,
    index: &mut RouteIndex,
    cacheable: &mut bool,
    visited: &mut HashSet<String>,
) {
    if !visited.insert(exchange.to_owned()) {
        return;
    }
    let Some(x) = v.exchanges.get(exchange) else { return };
    if x.bindings.uncacheable() {
        *cacheable = false;
    }
    if let Some(cache) = &x.dedup {
        // Decided per message: never cached. A duplicate goes nowhere (not to the
        // alternate exchange either).
        *cacheable = false;
        if !cache.admit(&input.msg.props.headers, now_ms(), &mut routes.dedup) {
            return;
        }
    }
    let mut matched = Vec::new();
    let walked = x.bindings.matching(input.msg, &mut matched);
    if walked.off_worker {
        input.long.set(Some((exchange.to_owned(), walked.steps)));
    }
    let before = routes.targets();
    let mut onward = Vec::new();
    // MQTT shared groups: served here (their queues), and members of them on other
    // cluster members (bindings to those): each group takes a message once, cluster-wide.
    let mut local_groups: Vec<&str> = Vec::new();
    let mut remote_groups: Vec<&Binding> = Vec::new();
    for b in matched {
        if let Some(o) = &b.mqtt {
            if o.no_local && &*o.client_id == input.publisher {
                continue;
            }
        }
        if b.filter.as_ref().is_some_and(|f| !f.matches(input.tag)) {
            continue;
        }
        match (&b.dest, b.share_group()) {
            (Destination::Exchange(next), _) => onward.push(next.clone()),
            (Destination::Member(_), _) if input.local_only => {}
            (Destination::Member(_), Some(_)) => remote_groups.push(b),
            (_, Some(g)) if input.local_only && !input.groups.iter().any(|x| &**x == g) => {}
            (_, group) => {
                local_groups.extend(group);
                routes.add(exchange, b, index);
            }
        }
    }
    if !remote_groups.is_empty() {
        pick_group_members(exchange, &remote_groups, &local_groups, input, routes, index);
    }
    let mut delivered = routes.targets() != before;
    for next in onward {
        let before = routes.targets();
        route_into(v, &next, input, routes, index, cacheable, visited);
        delivered |= routes.targets() != before;
    }
    if !delivered {
        if let Some(alt) = x.def.alternate() {
            let alt = alt.to_owned();
            route_into(v, &alt, input, routes, index, cacheable, visited);
        }
    }
}

/// True for a binding to this member's own destinations (not to another member's).
fn is_own(b: &Binding) -> bool {
    !matches!(b.dest, Destination::Member(_))
}

/// Told of every binding added to the table and removed from it, after the change (a
/// cluster member tells the others where its own subscribers and transient queues are).
/// Called with no lock of the table held, except for the bindings there are when it is
/// set; it must not change the table.
pub trait BindingObserver: Send + Sync + std::fmt::Debug {
    /// `binding` of `exchange` (of `kind`) in `vhost` was added.
    fn bound(&self, vhost: &str, exchange: &str, kind: ExchangeKind, binding: &Binding);
    /// `binding` of `exchange` (of `kind`) in `vhost` was removed.
    fn unbound(&self, vhost: &str, exchange: &str, kind: ExchangeKind, binding: &Binding);
}

/// For each MQTT shared group with members on other cluster members (`remote`, bindings
/// to those members) and none here (`local`): one of those members takes the message,
/// chosen by its routing key (so a route stays the same and can be cached, and topics
/// spread over the members).
fn pick_group_members(
    exchange: &str,
    remote: &[&Binding],
    local: &[&str],
    input: &RouteInput<'_>,
    routes: &mut Routes,
    index: &mut RouteIndex,
) {
    let mut groups: Vec<&str> = remote.iter().filter_map(|b| b.share_group()).collect();
    groups.sort_unstable();
    groups.dedup();
    for group in groups.into_iter().filter(|g| !local.contains(g)) {
        let mut members: Vec<&Arc<str>> = remote
            .iter()
            .filter(|b| b.share_group() == Some(group))
            .filter_map(|b| match &b.dest {
                Destination::Member(m) => Some(m),
                _ => None,
            })
            .collect();
        members.sort_unstable();
        members.dedup();
        let at = super::stable_hash::hash64(&[input.msg.routing_key.as_bytes(), group.as_bytes()]);
        let member = members[(at % members.len() as u64) as usize];
        routes.add_group_member(exchange, member, group, index);
    }
}

/// An MQTT filter as a topic-exchange binding key: `a/+/#` -> `a.*.#`.
pub fn mqtt_filter_to_pattern(filter: &str) -> String {
    super::message::mqtt_to_key(filter).split('.').map(|w| if w == "+" { "*" } else { w }).collect::<Vec<_>>().join(".")
}

/// Refuses the arguments of an exchange of a kind that reads them (`x-consistent-hash`, the
/// de-duplication exchange) when they are invalid.
fn check_exchange_arguments(def: &ExchangeDef) -> Result<(), RouteError> {
    if def.routing_kind() == ExchangeKind::ConsistentHash {
        HashOn::from_arguments(&def.arguments)?;
    }
    if def.kind == ExchangeKind::MessageDeduplication {
        CacheSettings::from_arguments(&def.arguments)?;
    }
    Ok(())
}

/// Refuses `binding` on exchange `x`: a topic key of more than [`MAX_KEY_WORDS`] words, a
/// key that is not a weight on an `x-consistent-hash` exchange, or a weight past the ring's.
fn check_binding(x: &Exchange, binding: &Binding) -> Result<(), RouteError> {
    if x.def.routing_kind() == ExchangeKind::Topic {
        let words = key_words(&binding.key);
        if words > MAX_KEY_WORDS {
            return Err(RouteError::BindingKeyTooLong(words));
        }
    }
    if let Bindings::ConsistentHash(h) = &x.bindings {
        let weight = parse_weight(&binding.key)?;
        let others: u64 = h
            .list
            .iter()
            .filter(|b| !b.same(&binding.dest, &binding.key, &binding.args))
            .map(|b| u64::from(parse_weight(&b.key).unwrap_or(0)))
            .sum();
        if others + u64::from(weight) > MAX_RING_WEIGHT {
            return Err(HashArgError::RingFull.into());
        }
    }
    Ok(())
}
