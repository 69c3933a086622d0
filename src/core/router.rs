//! The routing table: virtual hosts, their exchanges and bindings — one table for both
//! protocols. MQTT subscriptions are bindings on the MQTT exchange (`amq.topic`): a filter
//! `a/+/#` is the binding key `a.*.#`, a topic `a/b/c` the routing key `a.b.c`, so AMQP
//! queues and MQTT sessions bound to the same exchange see each other's messages.
//!
//! A binding leads to a consume queue, to another exchange (exchange-to-exchange
//! bindings), or to a connected clean MQTT session (the online fast path: the message
//! goes straight to its outbound channel, no storage). The table is read-mostly:
//! publishers resolve through a per-connection [`RouteCache`] that stays valid while the
//! table's generation is unchanged, so the hot path takes no lock for a key it has seen;
//! changes take the write lock and bump the generation.
//!
//! A binding may carry a tag filter (`x-tag-filter`, or an MQTT 5 SUBSCRIBE's
//! `tag-filter`), compiled when it is added: it is checked at route time against the
//! message's tag, and the route cache is keyed by the tag as well as the routing key.
//! `x-consistent-hash` exchanges keep their [`Ring`] beside their bindings, built when a
//! message is first routed after those changed (so restoring or adding N bindings costs
//! one build, not N, and no build runs under the write lock).

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ferrymq_storage::QueueId;
use parking_lot::RwLock;

use super::delivery::SessionLink;
use super::hash_ring::{parse_weight, HashArgError, HashOn, Ring, MAX_RING_WEIGHT};
use super::message::Message;
use super::tag_filter::{TagFilter, TagFilterError};
use super::value::Value;

/// Where a binding delivers.
#[derive(Debug, Clone)]
pub enum Destination {
    /// A connected clean MQTT session (fast path).
    Session(Arc<SessionLink>),
    /// A consume queue.
    Queue(QueueId),
    /// Another exchange of the same virtual host.
    Exchange(String),
}

impl PartialEq for Destination {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Destination::Session(a), Destination::Session(b)) => Arc::ptr_eq(a, b),
            (Destination::Queue(a), Destination::Queue(b)) => a == b,
            (Destination::Exchange(a), Destination::Exchange(b)) => a == b,
            _ => false,
        }
    }
}

/// MQTT subscription options carried by a binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttOptions {
    /// Client id of the subscriber, for no-local.
    pub client_id: Arc<str>,
    /// Granted QoS.
    pub qos: u8,
    /// No local.
    pub no_local: bool,
    /// Retain as published.
    pub retain_as_published: bool,
    /// Subscription identifier.
    pub subscription_id: Option<u32>,
    /// Tag filter of the subscription (MQTT 5 user property `tag-filter`).
    pub tag_filter: Option<Arc<TagFilter>>,
}

/// One binding. Its identity is (destination, key, arguments).
#[derive(Debug, Clone)]
pub struct Binding {
    /// Where matching messages go.
    pub dest: Destination,
    /// Binding key as given (AMQP pattern syntax for topic exchanges).
    pub key: String,
    /// Binding arguments (headers-exchange match arguments, ...).
    pub args: Vec<(String, Value)>,
    /// MQTT options when the binding is an MQTT subscription.
    pub mqtt: Option<MqttOptions>,
    /// The tag filter, compiled by [`Router::bind`] from the `x-tag-filter` argument or the
    /// MQTT options; messages it rejects do not take this binding.
    pub filter: Option<Arc<TagFilter>>,
}

impl Binding {
    /// A plain binding to a queue.
    pub fn queue(queue: QueueId, key: &str, args: Vec<(String, Value)>) -> Binding {
        Binding { dest: Destination::Queue(queue), key: key.to_owned(), args, mqtt: None, filter: None }
    }

    /// A binding to another exchange (exchange-to-exchange).
    pub fn exchange(exchange: &str, key: &str, args: Vec<(String, Value)>) -> Binding {
        Binding {
            dest: Destination::Exchange(exchange.to_owned()),
            key: key.to_owned(),
            args,
            mqtt: None,
            filter: None,
        }
    }

    /// Compiles the tag filter: the `x-tag-filter` argument, else the MQTT options' one.
    fn compile_filter(&mut self) -> Result<(), TagFilterError> {
        self.filter = match TagFilter::from_arguments(&self.args)? {
            Some(f) => Some(Arc::new(f)),
            None => self.mqtt.as_ref().and_then(|o| o.tag_filter.clone()),
        };
        Ok(())
    }

    fn same(&self, dest: &Destination, key: &str, args: &[(String, Value)]) -> bool {
        self.dest == *dest && self.key == key && self.args == args
    }
}

/// Exchange types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Exact routing key.
    Direct,
    /// Every binding.
    Fanout,
    /// Word patterns with `*` and `#`.
    Topic,
    /// Header matching (`x-match` all/any).
    Headers,
    /// One binding per message, by consistent hashing (`x-consistent-hash`).
    ConsistentHash,
    /// `x-delayed-message` (the delayed-message plugin's type): a publish with a positive
    /// `x-delay` header is stored and routed when its time comes, by the rules of the
    /// exchange's `x-delayed-type`.
    DelayedMessage,
}

impl ExchangeKind {
    /// Parses an AMQP exchange type name.
    pub fn parse(name: &str) -> Option<ExchangeKind> {
        match name {
            "direct" => Some(ExchangeKind::Direct),
            "fanout" => Some(ExchangeKind::Fanout),
            "topic" => Some(ExchangeKind::Topic),
            "headers" => Some(ExchangeKind::Headers),
            "x-consistent-hash" => Some(ExchangeKind::ConsistentHash),
            "x-delayed-message" => Some(ExchangeKind::DelayedMessage),
            _ => None,
        }
    }

    /// The AMQP type name.
    pub fn name(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
            ExchangeKind::ConsistentHash => "x-consistent-hash",
            ExchangeKind::DelayedMessage => "x-delayed-message",
        }
    }
}

/// What an exchange is, as declared.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeDef {
    /// Name ("" is the default exchange).
    pub name: String,
    /// Type.
    pub kind: ExchangeKind,
    /// Survives restarts.
    pub durable: bool,
    /// Deleted when its last binding goes.
    pub auto_delete: bool,
    /// Cannot be published to directly.
    pub internal: bool,
    /// Declaration arguments (`alternate-exchange`, ...).
    pub arguments: Vec<(String, Value)>,
}

impl ExchangeDef {
    /// The `alternate-exchange` argument.
    pub fn alternate(&self) -> Option<&str> {
        self.argument("alternate-exchange").and_then(Value::as_str)
    }

    /// The `x-delayed-type` argument of an `x-delayed-message` exchange: the type whose
    /// routing rules its bindings follow. `None` when absent or not a plain type.
    pub fn delayed_type(&self) -> Option<ExchangeKind> {
        self.argument("x-delayed-type")
            .and_then(Value::as_str)
            .and_then(ExchangeKind::parse)
            .filter(|k| *k != ExchangeKind::DelayedMessage)
    }

    /// The kind whose rules route through this exchange's bindings: the `x-delayed-type`
    /// of a delayed-message exchange (direct when missing), else its own kind.
    pub fn routing_kind(&self) -> ExchangeKind {
        match self.kind {
            ExchangeKind::DelayedMessage => self.delayed_type().unwrap_or(ExchangeKind::Direct),
            kind => kind,
        }
    }

    fn argument(&self, name: &str) -> Option<&Value> {
        self.arguments.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

#[derive(Debug)]
struct Exchange {
    def: ExchangeDef,
    bindings: Bindings,
}

#[derive(Debug)]
enum Bindings {
    Direct(HashMap<String, Vec<Binding>>),
    Fanout(Vec<Binding>),
    Topic(Node),
    Headers(Vec<Binding>),
    ConsistentHash(HashBindings),
}

/// The bindings of a consistent-hash exchange and their ring.
#[derive(Debug)]
struct HashBindings {
    on: HashOn,
    list: Vec<Binding>,
    /// Derived from `list`; emptied when it changes, built by the next route.
    ring: std::sync::OnceLock<Ring>,
}

impl Bindings {
    /// Empty bindings for an exchange (whose arguments were validated), routing by the
    /// rules of its [`ExchangeDef::routing_kind`].
    fn new(def: &ExchangeDef) -> Bindings {
        match def.routing_kind() {
            // (A delayed-message exchange passes its routing kind; direct is its default.)
            ExchangeKind::Direct | ExchangeKind::DelayedMessage => Bindings::Direct(HashMap::new()),
            ExchangeKind::Fanout => Bindings::Fanout(Vec::new()),
            ExchangeKind::Topic => Bindings::Topic(Node::default()),
            ExchangeKind::Headers => Bindings::Headers(Vec::new()),
            ExchangeKind::ConsistentHash => Bindings::ConsistentHash(HashBindings {
                on: HashOn::from_arguments(&def.arguments).unwrap_or_default(),
                list: Vec::new(),
                ring: std::sync::OnceLock::new(),
            }),
        }
    }

    /// True when routes through these bindings depend on more than (key, tag).
    fn uncacheable(&self) -> bool {
        match self {
            Bindings::Headers(_) => true,
            Bindings::ConsistentHash(h) => !h.on.is_routing_key(),
            _ => false,
        }
    }

    /// Adds or replaces a binding; true if it is new.
    fn add(&mut self, b: Binding) -> bool {
        match self {
            Bindings::Direct(map) => upsert(map.entry(b.key.clone()).or_default(), b),
            Bindings::Fanout(list) | Bindings::Headers(list) => upsert(list, b),
            Bindings::Topic(root) => {
                let words: Vec<String> = b.key.split('.').map(str::to_owned).collect();
                root.insert(&words, b)
            }
            Bindings::ConsistentHash(h) => {
                let added = upsert(&mut h.list, b);
                h.ring = std::sync::OnceLock::new();
                added
            }
        }
    }

    /// Removes bindings matching `pred` under `key` (every key when `key` is `None`);
    /// returns how many.
    fn remove(&mut self, key: Option<&str>, pred: &dyn Fn(&Binding) -> bool) -> usize {
        match self {
            Bindings::Direct(map) => match key {
                Some(k) => {
                    let n = map.get_mut(k).map(|l| retain_count(l, pred)).unwrap_or(0);
                    if map.get(k).is_some_and(|l| l.is_empty()) {
                        map.remove(k);
                    }
                    n
                }
                None => {
                    let n = map.values_mut().map(|l| retain_count(l, pred)).sum();
                    map.retain(|_, l| !l.is_empty());
                    n
                }
            },
            Bindings::Fanout(list) | Bindings::Headers(list) => retain_count(list, pred),
            Bindings::ConsistentHash(h) => {
                let n = retain_count(&mut h.list, pred);
                if n > 0 {
                    h.ring = std::sync::OnceLock::new();
                }
                n
            }
            Bindings::Topic(root) => match key {
                Some(k) => {
                    let words: Vec<String> = k.split('.').map(str::to_owned).collect();
                    root.remove(&words, pred)
                }
                None => root.remove_all(pred),
            },
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Bindings::Direct(map) => map.is_empty(),
            Bindings::Fanout(list) | Bindings::Headers(list) => list.is_empty(),
            Bindings::ConsistentHash(h) => h.list.is_empty(),
            Bindings::Topic(root) => root.is_empty(),
        }
    }

    fn all(&self) -> Vec<Binding> {
        match self {
            Bindings::Direct(map) => map.values().flatten().cloned().collect(),
            Bindings::Fanout(list) | Bindings::Headers(list) => list.clone(),
            Bindings::ConsistentHash(h) => h.list.clone(),
            Bindings::Topic(root) => {
                let mut out = Vec::new();
                root.all(&mut out);
                out
            }
        }
    }

    fn matching<'a>(&'a self, msg: &Message, out: &mut Vec<&'a Binding>) {
        let (key, headers) = (msg.routing_key.as_str(), msg.props.headers.as_slice());
        match self {
            Bindings::Direct(map) => out.extend(map.get(key).into_iter().flatten()),
            Bindings::Fanout(list) => out.extend(list.iter()),
            Bindings::Topic(root) => {
                // The empty key has no words (`#` matches it, `*` does not).
                let words: Vec<&str> = if key.is_empty() { Vec::new() } else { key.split('.').collect() };
                root.collect(&words, 0, key.starts_with('$'), out);
            }
            Bindings::Headers(list) => out.extend(list.iter().filter(|b| headers_match(&b.args, headers))),
            Bindings::ConsistentHash(h) => {
                // A message without the hashed header or property is not routed.
                let ring = || h.ring.get_or_init(|| Ring::build(&h.list));
                if let Some(i) = h.on.hash(msg).and_then(|hash| ring().pick(hash)) {
                    out.push(&h.list[i]);
                }
            }
        }
    }
}

fn upsert(list: &mut Vec<Binding>, b: Binding) -> bool {
    if let Some(existing) = list.iter_mut().find(|e| e.same(&b.dest, &b.key, &b.args)) {
        *existing = b;
        false
    } else {
        list.push(b);
        true
    }
}

fn retain_count(list: &mut Vec<Binding>, pred: &dyn Fn(&Binding) -> bool) -> usize {
    let before = list.len();
    list.retain(|b| !pred(b));
    before - list.len()
}

/// Headers-exchange matching: `x-match` = `all` (default) / `any`, and the `-with-x`
/// variants that also compare `x-` arguments.
fn headers_match(args: &[(String, Value)], headers: &[(String, Value)]) -> bool {
    let mode = args.iter().find(|(k, _)| k == "x-match").and_then(|(_, v)| v.as_str()).unwrap_or("all");
    let (any, with_x) = match mode {
        "any" => (true, false),
        "any-with-x" => (true, true),
        "all-with-x" => (false, true),
        _ => (false, false),
    };
    let mut wanted = args.iter().filter(|(k, _)| k != "x-match" && (with_x || !k.starts_with("x-"))).peekable();
    if wanted.peek().is_none() {
        return !any;
    }
    let mut check =
        wanted.map(|(k, v)| headers.iter().any(|(hk, hv)| hk == k && (matches!(v, Value::Void) || hv == v)));
    if any {
        check.any(|m| m)
    } else {
        check.all(|m| m)
    }
}

/// A topic-exchange trie node: one level per word; `*` and `#` children.
#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    star: Option<Box<Node>>,
    hash: Option<Box<Node>>,
    /// Bindings whose pattern ends at this node.
    here: Vec<Binding>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.star.is_none() && self.hash.is_none() && self.here.is_empty()
    }

    fn child_mut(&mut self, word: &str) -> &mut Node {
        match word {
            "*" => self.star.get_or_insert_with(Default::default),
            "#" => self.hash.get_or_insert_with(Default::default),
            w => self.children.entry(w.into()).or_default(),
        }
    }

    fn insert(&mut self, words: &[String], b: Binding) -> bool {
        match words.split_first() {
            None => upsert(&mut self.here, b),
            Some((w, rest)) => self.child_mut(w).insert(rest, b),
        }
    }

    fn remove(&mut self, words: &[String], pred: &dyn Fn(&Binding) -> bool) -> usize {
        let Some((w, rest)) = words.split_first() else { return retain_count(&mut self.here, pred) };
        let (n, empty) = match w.as_str() {
            "*" => match self.star.as_mut() {
                Some(c) => (c.remove(rest, pred), c.is_empty()),
                None => (0, false),
            },
            "#" => match self.hash.as_mut() {
                Some(c) => (c.remove(rest, pred), c.is_empty()),
                None => (0, false),
            },
            other => match self.children.get_mut(other) {
                Some(c) => (c.remove(rest, pred), c.is_empty()),
                None => (0, false),
            },
        };
        if empty {
            match w.as_str() {
                "*" => self.star = None,
                "#" => self.hash = None,
                other => {
                    self.children.remove(other);
                }
            }
        }
        n
    }

    fn remove_all(&mut self, pred: &dyn Fn(&Binding) -> bool) -> usize {
        let mut n = retain_count(&mut self.here, pred);
        for c in self.children.values_mut() {
            n += c.remove_all(pred);
        }
        self.children.retain(|_, c| !c.is_empty());
        for slot in [&mut self.star, &mut self.hash] {
            if let Some(c) = slot.as_mut() {
                n += c.remove_all(pred);
                if c.is_empty() {
                    *slot = None;
                }
            }
        }
        n
    }

    fn all(&self, out: &mut Vec<Binding>) {
        out.extend(self.here.iter().cloned());
        for c in self.children.values() {
            c.all(out);
        }
        for c in [&self.star, &self.hash].into_iter().flatten() {
            c.all(out);
        }
    }

    /// Collects bindings matching `words[idx..]`. `dollar`: the key starts with `$`, which
    /// a wildcard in the first position does not match (MQTT's rule for `$SYS` topics).
    fn collect<'a>(&'a self, words: &[&str], idx: usize, dollar: bool, out: &mut Vec<&'a Binding>) {
        let wild_ok = !(idx == 0 && dollar);
        if wild_ok {
            if let Some(hash) = &self.hash {
                // `#` swallows zero or more words.
                for k in idx..=words.len() {
                    hash.collect(words, k, false, out);
                }
            }
        }
        let Some(word) = words.get(idx) else {
            out.extend(self.here.iter());
            return;
        };
        if let Some(child) = self.children.get(*word) {
            child.collect(words, idx + 1, dollar, out);
        }
        if wild_ok {
            if let Some(star) = &self.star {
                star.collect(words, idx + 1, dollar, out);
            }
        }
    }
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
    /// Highest granted QoS among the matching bindings (2 for AMQP bindings).
    pub qos: u8,
    /// The publisher reserved room in this reject-publish queue ([`QueueConfig::admit`]).
    ///
    /// [`QueueConfig::admit`]: crate::core::queue::QueueConfig::admit
    pub reserved: bool,
}

/// Every target of one publish.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    /// Connected clean sessions.
    pub sessions: Vec<SessionRoute>,
    /// Consume queues.
    pub queues: Vec<QueueRoute>,
}

impl Routes {
    /// True when nothing matched.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty() && self.queues.is_empty()
    }

    fn add(&mut self, b: &Binding) {
        match &b.dest {
            Destination::Session(link) => {
                let Some(o) = &b.mqtt else { return };
                if let Some(r) = self.sessions.iter_mut().find(|r| Arc::ptr_eq(&r.link, link)) {
                    r.qos = r.qos.max(o.qos);
                    r.retain_as_published |= o.retain_as_published;
                    r.subscription_ids.extend(o.subscription_id);
                } else {
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
                if let Some(r) = self.queues.iter_mut().find(|r| r.queue == *queue) {
                    r.qos = r.qos.max(qos);
                } else {
                    self.queues.push(QueueRoute { queue: *queue, qos, reserved: false });
                }
            }
            Destination::Exchange(_) => {}
        }
    }
}

/// Why a publish or binding could not be routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The virtual host does not exist.
    #[error("no vhost '{0}'")]
    NoVhost(String),
    /// The exchange does not exist.
    #[error("no exchange '{0}' in vhost '{1}'")]
    NoExchange(String, String),
    /// An `x-tag-filter` (or MQTT `tag-filter`) expression is invalid.
    #[error("invalid arg 'x-tag-filter': {0}")]
    TagFilter(#[from] TagFilterError),
    /// A consistent-hash exchange's arguments or a binding weight are invalid.
    #[error("{0}")]
    HashArgument(#[from] HashArgError),
}

/// Names of the exchanges every virtual host has.
pub const STANDARD_EXCHANGES: [(&str, ExchangeKind); 6] = [
    ("", ExchangeKind::Direct),
    ("amq.direct", ExchangeKind::Direct),
    ("amq.fanout", ExchangeKind::Fanout),
    ("amq.topic", ExchangeKind::Topic),
    ("amq.headers", ExchangeKind::Headers),
    ("amq.match", ExchangeKind::Headers),
];

#[derive(Debug, Default)]
struct Vhost {
    exchanges: HashMap<String, Exchange>,
}

/// The routing table of every virtual host.
#[derive(Debug, Default)]
pub struct Router {
    vhosts: RwLock<HashMap<String, Vhost>>,
    generation: AtomicU64,
    mqtt_subscriptions: AtomicUsize,
    /// The topic exchange of virtual host `/` that MQTT publishes and subscriptions use.
    mqtt_exchange: String,
}

/// The virtual host MQTT clients use.
pub const MQTT_VHOST: &str = "/";
/// The exchange MQTT publishes and subscriptions use by default (`mqtt.exchange`).
pub const MQTT_EXCHANGE: &str = "amq.topic";

impl Router {
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

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Adds a virtual host with the standard exchanges (no-op if it exists).
    pub fn add_vhost(&self, name: &str) {
        let mut vhosts = self.vhosts.write();
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
                Exchange { bindings: Bindings::new(&def), def }
            });
        }
        drop(vhosts);
        self.changed();
    }

    /// True when the virtual host exists.
    pub fn has_vhost(&self, name: &str) -> bool {
        self.vhosts.read().contains_key(name)
    }

    /// Current generation; changes on every modification.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Number of MQTT subscriptions (bindings with MQTT options).
    pub fn len(&self) -> usize {
        self.mqtt_subscriptions.load(Ordering::Relaxed)
    }

    /// True when there are no MQTT subscriptions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The definition of an exchange.
    pub fn exchange(&self, vhost: &str, name: &str) -> Option<ExchangeDef> {
        self.vhosts.read().get(vhost)?.exchanges.get(name).map(|x| x.def.clone())
    }

    /// Every exchange of a virtual host.
    pub fn exchanges(&self, vhost: &str) -> Vec<ExchangeDef> {
        self.vhosts.read().get(vhost).map(|v| v.exchanges.values().map(|x| x.def.clone()).collect()).unwrap_or_default()
    }

    /// Creates an exchange; returns the existing definition if one of that name exists
    /// (the caller compares and decides). Refuses invalid `x-consistent-hash` arguments.
    pub fn declare_exchange(&self, vhost: &str, def: ExchangeDef) -> Result<Option<ExchangeDef>, RouteError> {
        if def.routing_kind() == ExchangeKind::ConsistentHash {
            HashOn::from_arguments(&def.arguments)?;
        }
        let mut vhosts = self.vhosts.write();
        let v = vhosts.get_mut(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        if let Some(x) = v.exchanges.get(&def.name) {
            return Ok(Some(x.def.clone()));
        }
        v.exchanges.insert(def.name.clone(), Exchange { bindings: Bindings::new(&def), def });
        drop(vhosts);
        self.changed();
        Ok(None)
    }

    /// Deletes an exchange, its bindings and the bindings that lead to it. `if_unused`:
    /// refuse (`Ok(false)`) when it has bindings.
    pub fn delete_exchange(&self, vhost: &str, name: &str, if_unused: bool) -> Result<bool, RouteError> {
        let mut vhosts = self.vhosts.write();
        let v = vhosts.get_mut(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let Some(x) = v.exchanges.get(name) else {
            return Err(RouteError::NoExchange(name.to_owned(), vhost.to_owned()));
        };
        if if_unused && !x.bindings.is_empty() {
            return Ok(false);
        }
        v.exchanges.remove(name);
        let dest = Destination::Exchange(name.to_owned());
        for x in v.exchanges.values_mut() {
            x.bindings.remove(None, &|b| b.dest == dest);
        }
        drop(vhosts);
        self.changed();
        Ok(true)
    }

    /// Adds (or replaces) a binding on an exchange; true if it is new. Compiles its tag
    /// filter; refuses an invalid one, and a binding key that is not a weight on an
    /// `x-consistent-hash` exchange.
    pub fn bind(&self, vhost: &str, exchange: &str, mut binding: Binding) -> Result<bool, RouteError> {
        binding.compile_filter()?;
        let mut vhosts = self.vhosts.write();
        let v = vhosts.get_mut(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let x = v
            .exchanges
            .get_mut(exchange)
            .ok_or_else(|| RouteError::NoExchange(exchange.to_owned(), vhost.to_owned()))?;
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
        let is_mqtt = binding.mqtt.is_some();
        let added = x.bindings.add(binding);
        drop(vhosts);
        if added && is_mqtt {
            self.mqtt_subscriptions.fetch_add(1, Ordering::Relaxed);
        }
        self.changed();
        Ok(added)
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
        let mut vhosts = self.vhosts.write();
        let v = vhosts.get_mut(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        let x = v
            .exchanges
            .get_mut(exchange)
            .ok_or_else(|| RouteError::NoExchange(exchange.to_owned(), vhost.to_owned()))?;
        let mqtt = Cell::new(0usize);
        let n = x.bindings.remove(Some(key), &|b| {
            let hit = b.same(dest, key, args);
            if hit && b.mqtt.is_some() {
                mqtt.set(mqtt.get() + 1);
            }
            hit
        });
        if n > 0 && x.def.auto_delete && x.bindings.is_empty() {
            v.exchanges.remove(exchange);
        }
        drop(vhosts);
        self.removed(n, mqtt.get());
        Ok(n > 0)
    }

    /// Removes every binding leading to `dest` in a virtual host (a deleted queue);
    /// auto-delete exchanges left without bindings are deleted. Returns how many.
    pub fn unbind_all(&self, vhost: &str, dest: &Destination) -> usize {
        let mut vhosts = self.vhosts.write();
        let Some(v) = vhosts.get_mut(vhost) else { return 0 };
        let mqtt = Cell::new(0usize);
        let mut n = 0;
        let mut emptied = Vec::new();
        for (name, x) in v.exchanges.iter_mut() {
            let removed = x.bindings.remove(None, &|b| {
                let hit = b.dest == *dest;
                if hit && b.mqtt.is_some() {
                    mqtt.set(mqtt.get() + 1);
                }
                hit
            });
            n += removed;
            if removed > 0 && x.def.auto_delete && x.bindings.is_empty() {
                emptied.push(name.clone());
            }
        }
        for name in emptied {
            v.exchanges.remove(&name);
        }
        drop(vhosts);
        self.removed(n, mqtt.get());
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

    /// Every binding of a virtual host: (exchange, binding).
    pub fn bindings(&self, vhost: &str) -> Vec<(String, Binding)> {
        let vhosts = self.vhosts.read();
        let Some(v) = vhosts.get(vhost) else { return Vec::new() };
        v.exchanges.iter().flat_map(|(name, x)| x.bindings.all().into_iter().map(move |b| (name.clone(), b))).collect()
    }

    /// The bindings of one exchange (empty when it does not exist).
    pub fn bindings_of(&self, vhost: &str, exchange: &str) -> Vec<Binding> {
        let vhosts = self.vhosts.read();
        vhosts.get(vhost).and_then(|v| v.exchanges.get(exchange)).map(|x| x.bindings.all()).unwrap_or_default()
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
    /// result depends only on (exchange, routing key, tag) and may be cached.
    pub fn route(
        &self,
        vhost: &str,
        exchange: &str,
        msg: &Message,
        publisher: &str,
    ) -> Result<(Routes, bool), RouteError> {
        let vhosts = self.vhosts.read();
        let v = vhosts.get(vhost).ok_or_else(|| RouteError::NoVhost(vhost.to_owned()))?;
        if !v.exchanges.contains_key(exchange) {
            return Err(RouteError::NoExchange(exchange.to_owned(), vhost.to_owned()));
        }
        let mut routes = Routes::default();
        let mut cacheable = true;
        let mut visited = HashSet::new();
        let input = RouteInput { msg, tag: msg.tag(), publisher };
        route_into(v, exchange, &input, &mut routes, &mut cacheable, &mut visited);
        Ok((routes, cacheable))
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
}

fn route_into(
    v: &Vhost,
    exchange: &str,
    input: &RouteInput<'_>,
    routes: &mut Routes,
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
    let mut matched = Vec::new();
    x.bindings.matching(input.msg, &mut matched);
    let before = (routes.sessions.len(), routes.queues.len());
    let mut onward = Vec::new();
    for b in matched {
        if let Some(o) = &b.mqtt {
            if o.no_local && &*o.client_id == input.publisher {
                continue;
            }
        }
        if b.filter.as_ref().is_some_and(|f| !f.matches(input.tag)) {
            continue;
        }
        match &b.dest {
            Destination::Exchange(next) => onward.push(next.clone()),
            _ => routes.add(b),
        }
    }
    let mut delivered = (routes.sessions.len(), routes.queues.len()) != before;
    for next in onward {
        let before = (routes.sessions.len(), routes.queues.len());
        route_into(v, &next, input, routes, cacheable, visited);
        delivered |= (routes.sessions.len(), routes.queues.len()) != before;
    }
    if !delivered {
        if let Some(alt) = x.def.alternate() {
            let alt = alt.to_owned();
            route_into(v, &alt, input, routes, cacheable, visited);
        }
    }
}

/// An MQTT filter as a topic-exchange binding key: `a/+/#` -> `a.*.#`.
pub fn mqtt_filter_to_pattern(filter: &str) -> String {
    super::message::mqtt_to_key(filter).split('.').map(|w| if w == "+" { "*" } else { w }).collect::<Vec<_>>().join(".")
}

/// A publisher's cache of resolved routes by (exchange, routing key, tag), valid for one
/// router generation. The tag is part of the key because tag filters decide by it.
///
/// Entries are found by a hash of the three and compared as `&str`, so a hit allocates
/// nothing.
#[derive(Debug, Default)]
pub struct RouteCache {
    generation: u64,
    hasher: std::collections::hash_map::RandomState,
    map: HashMap<u64, Vec<CachedRoute>>,
    /// Entries in `map`.
    cached: usize,
    /// Kind and `internal` flag of exchanges looked up (`None`: no such exchange).
    exchanges: HashMap<String, Option<(ExchangeKind, bool)>>,
}

#[derive(Debug)]
struct CachedRoute {
    exchange: Box<str>,
    key: Box<str>,
    tag: Option<Box<str>>,
    routes: Arc<Routes>,
}

impl CachedRoute {
    fn is(&self, exchange: &str, key: &str, tag: Option<&str>) -> bool {
        &*self.exchange == exchange && &*self.key == key && self.tag.as_deref() == tag
    }
}

/// Most (exchange, key) pairs one connection caches before the cache is cleared.
const ROUTE_CACHE_KEYS: usize = 1024;

impl RouteCache {
    fn sync(&mut self, router: &Router) {
        let generation = router.generation();
        if generation != self.generation {
            self.map.clear();
            self.cached = 0;
            self.exchanges.clear();
            self.generation = generation;
        }
    }

    /// Kind and `internal` flag of an exchange, from the cache when the table has not
    /// changed (the publish path asks for every message).
    pub fn exchange(&mut self, router: &Router, vhost: &str, name: &str) -> Option<(ExchangeKind, bool)> {
        self.sync(router);
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

    /// Routes of a publish of `msg` to `exchange`, from the cache when the table has not
    /// changed.
    pub fn route(
        &mut self,
        router: &Router,
        vhost: &str,
        exchange: &str,
        msg: &Message,
        publisher: &str,
    ) -> Result<Arc<Routes>, RouteError> {
        self.sync(router);
        let (key, tag) = (msg.routing_key.as_str(), msg.tag());
        let hash = std::hash::BuildHasher::hash_one(&self.hasher, (exchange, key, tag));
        if let Some(hit) = self.map.get(&hash).and_then(|v| v.iter().find(|c| c.is(exchange, key, tag))) {
            return Ok(hit.routes.clone());
        }
        let (routes, cacheable) = router.route(vhost, exchange, msg, publisher)?;
        let routes = Arc::new(routes);
        if cacheable {
            if self.cached >= ROUTE_CACHE_KEYS {
                self.map.clear();
                self.cached = 0;
            }
            self.map.entry(hash).or_default().push(CachedRoute {
                exchange: exchange.into(),
                key: key.into(),
                tag: tag.map(Into::into),
                routes: routes.clone(),
            });
            self.cached += 1;
        }
        Ok(routes)
    }

    /// Routes of an MQTT publish `msg` on the MQTT exchange.
    pub fn resolve(&mut self, router: &Router, msg: &Message, publisher: &str) -> Arc<Routes> {
        self.route(router, MQTT_VHOST, router.mqtt_exchange(), msg, publisher).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tag_filter::TAG_FILTER_ARGUMENT;

    fn q(n: u64) -> Destination {
        Destination::Queue(QueueId(n))
    }

    fn opts(qos: u8) -> MqttOptions {
        MqttOptions {
            client_id: "c".into(),
            qos,
            no_local: false,
            retain_as_published: false,
            subscription_id: None,
            tag_filter: None,
        }
    }

    fn msg(key: &str, headers: &[(String, Value)]) -> Message {
        Message {
            exchange: String::new(),
            routing_key: key.into(),
            payload: bytes::Bytes::new(),
            qos: 0,
            retain: false,
            props: super::super::message::Properties { headers: headers.to_vec(), ..Default::default() },
            timestamp_ms: 0,
        }
    }

    fn tagged(key: &str, tag: &str) -> Message {
        msg(key, &[("x-tag".into(), Value::Str(tag.into()))])
    }

    fn queues(r: &Routes) -> Vec<u64> {
        let mut v: Vec<u64> = r.queues.iter().map(|q| q.queue.0).collect();
        v.sort();
        v
    }

    fn mqtt_hits(r: &Router, topic: &str) -> Vec<u64> {
        queues(&r.resolve(&msg(&super::super::message::mqtt_to_key(topic), &[]), "nobody"))
    }

    fn amqp_hits(r: &Router, exchange: &str, key: &str, headers: &[(String, Value)]) -> Vec<u64> {
        queues(&r.route("/", exchange, &msg(key, headers), "").unwrap().0)
    }

    fn declare(r: &Router, name: &str, kind: ExchangeKind, auto_delete: bool, args: Vec<(String, Value)>) {
        let def =
            ExchangeDef { name: name.into(), kind, durable: false, auto_delete, internal: false, arguments: args };
        assert!(r.declare_exchange("/", def).unwrap().is_none());
    }

    #[test]
    fn mqtt_wildcards_match_per_spec() {
        let r = Router::new();
        r.subscribe("sport/tennis/player1/#", q(1), opts(0));
        r.subscribe("sport/+", q(2), opts(0));
        r.subscribe("+/+", q(3), opts(0));
        r.subscribe("#", q(4), opts(0));
        r.subscribe("/finance", q(5), opts(0));
        r.subscribe("+", q(6), opts(0));
        assert_eq!(mqtt_hits(&r, "sport/tennis/player1"), vec![1, 4]);
        assert_eq!(mqtt_hits(&r, "sport/tennis/player1/ranking"), vec![1, 4]);
        assert_eq!(mqtt_hits(&r, "sport"), vec![4, 6]);
        assert_eq!(mqtt_hits(&r, "sport/"), vec![2, 3, 4]);
        assert_eq!(mqtt_hits(&r, "/finance"), vec![3, 4, 5]);
        assert_eq!(mqtt_hits(&r, "$SYS/x"), Vec::<u64>::new());
        r.subscribe("$SYS/#", q(7), opts(0));
        assert_eq!(mqtt_hits(&r, "$SYS/x"), vec![7]);
        assert_eq!(r.len(), 7);
        assert!(r.unsubscribe("$SYS/#", &q(7)));
        assert_eq!(r.len(), 6);
    }

    #[test]
    fn mqtt_and_amqp_share_amq_topic() {
        let r = Router::new();
        r.subscribe("a/+/c", q(1), opts(1));
        r.bind("/", "amq.topic", Binding::queue(QueueId(2), "a.*.c", vec![])).unwrap();
        r.bind("/", "amq.topic", Binding::queue(QueueId(3), "x.#", vec![])).unwrap();
        assert_eq!(amqp_hits(&r, "amq.topic", "a.b.c", &[]), vec![1, 2]);
        assert_eq!(mqtt_hits(&r, "x/y/z"), vec![3]);
        // `.` inside an MQTT level is `/` inside an AMQP word.
        r.subscribe("v1.0/+", q(4), opts(0));
        assert_eq!(amqp_hits(&r, "amq.topic", "v1/0.z", &[]), vec![4]);
    }

    #[test]
    fn amqp_topic_patterns() {
        let r = Router::new();
        declare(&r, "t", ExchangeKind::Topic, false, vec![]);
        for (n, key) in [(1, "a.#.b"), (2, "*.b"), (3, "#"), (4, "a.*"), (5, "a.b.#")] {
            r.bind("/", "t", Binding::queue(QueueId(n), key, vec![])).unwrap();
        }
        assert_eq!(amqp_hits(&r, "t", "a.b", &[]), vec![1, 2, 3, 4, 5]);
        assert_eq!(amqp_hits(&r, "t", "a.x.y.b", &[]), vec![1, 3]);
        assert_eq!(amqp_hits(&r, "t", "a", &[]), vec![3]);
        assert_eq!(amqp_hits(&r, "t", "a.b.c.d", &[]), vec![3, 5]);
    }

    #[test]
    fn direct_fanout_headers_and_default() {
        let r = Router::new();
        r.bind("/", "", Binding::queue(QueueId(1), "orders", vec![])).unwrap();
        r.bind("/", "amq.direct", Binding::queue(QueueId(2), "k", vec![])).unwrap();
        r.bind("/", "amq.fanout", Binding::queue(QueueId(3), "", vec![])).unwrap();
        r.bind("/", "amq.fanout", Binding::queue(QueueId(4), "ignored", vec![])).unwrap();
        assert_eq!(amqp_hits(&r, "", "orders", &[]), vec![1]);
        assert_eq!(amqp_hits(&r, "amq.direct", "k", &[]), vec![2]);
        assert_eq!(amqp_hits(&r, "amq.direct", "other", &[]), Vec::<u64>::new());
        assert_eq!(amqp_hits(&r, "amq.fanout", "whatever", &[]), vec![3, 4]);
        let s = |v: &str| Value::Str(v.into());
        let all = vec![("x-match".into(), s("all")), ("a".into(), s("1")), ("b".into(), s("2"))];
        let any = vec![("x-match".into(), s("any")), ("a".into(), s("1")), ("b".into(), s("2"))];
        r.bind("/", "amq.headers", Binding::queue(QueueId(5), "", all)).unwrap();
        r.bind("/", "amq.headers", Binding::queue(QueueId(6), "", any)).unwrap();
        let h = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), s(v))).collect::<Vec<_>>();
        assert_eq!(amqp_hits(&r, "amq.headers", "", &h(&[("a", "1"), ("b", "2")])), vec![5, 6]);
        assert_eq!(amqp_hits(&r, "amq.headers", "", &h(&[("a", "1")])), vec![6]);
        assert_eq!(amqp_hits(&r, "amq.headers", "", &h(&[("a", "9")])), Vec::<u64>::new());
        assert!(!r.route("/", "amq.headers", &msg("", &[]), "").unwrap().1, "headers routes are not cacheable");
    }

    #[test]
    fn exchange_to_exchange_and_alternate() {
        let r = Router::new();
        declare(&r, "src", ExchangeKind::Direct, false, vec![("alternate-exchange".into(), Value::Str("alt".into()))]);
        declare(&r, "alt", ExchangeKind::Fanout, false, vec![]);
        declare(&r, "dst", ExchangeKind::Topic, false, vec![]);
        r.bind("/", "src", Binding::exchange("dst", "k", vec![])).unwrap();
        r.bind("/", "dst", Binding::queue(QueueId(1), "#", vec![])).unwrap();
        r.bind("/", "alt", Binding::queue(QueueId(2), "", vec![])).unwrap();
        // A cycle does not loop.
        r.bind("/", "dst", Binding::exchange("src", "#", vec![])).unwrap();
        assert_eq!(amqp_hits(&r, "src", "k", &[]), vec![1]);
        assert_eq!(amqp_hits(&r, "src", "unroutable", &[]), vec![2]);
        assert!(matches!(r.route("/", "nope", &msg("k", &[]), ""), Err(RouteError::NoExchange(..))));
    }

    #[test]
    fn auto_delete_and_unbind_all() {
        let r = Router::new();
        declare(&r, "ad", ExchangeKind::Direct, true, vec![]);
        r.bind("/", "ad", Binding::queue(QueueId(1), "k", vec![])).unwrap();
        r.bind("/", "amq.topic", Binding::queue(QueueId(1), "a.#", vec![])).unwrap();
        assert_eq!(r.unbind_all("/", &q(1)), 2);
        assert!(r.exchange("/", "ad").is_none(), "auto-delete exchange went with its last binding");
        assert!(r.exchange("/", "amq.topic").is_some());
        assert_eq!(r.delete_exchange("/", "missing", false), Err(RouteError::NoExchange("missing".into(), "/".into())));
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

    fn hash_exchange(r: &Router, name: &str, args: Vec<(String, Value)>) {
        declare(r, name, ExchangeKind::ConsistentHash, false, args);
    }

    #[test]
    fn consistent_hash_picks_one_queue_per_key() {
        let r = Router::new();
        hash_exchange(&r, "h", vec![]);
        for n in 1..=4 {
            r.bind("/", "h", Binding::queue(QueueId(n), "10", vec![])).unwrap();
        }
        let mut seen = HashSet::new();
        for i in 0..200 {
            let key = format!("order-{i}");
            let (routes, cacheable) = r.route("/", "h", &msg(&key, &[]), "").unwrap();
            assert_eq!(routes.queues.len(), 1);
            assert!(cacheable);
            assert_eq!(
                queues(&routes),
                queues(&r.route("/", "h", &msg(&key, &[]), "").unwrap().0),
                "same key, same queue"
            );
            seen.insert(routes.queues[0].queue.0);
        }
        assert_eq!(seen.len(), 4, "every queue gets keys");
        for bad in ["0", "-1", "x", ""] {
            let e = r.bind("/", "h", Binding::queue(QueueId(9), bad, vec![]));
            assert!(matches!(e, Err(RouteError::HashArgument(_))), "{bad:?}: {e:?}");
        }
        // Unbinding every queue leaves nothing to route to.
        assert_eq!(
            r.unbind_all("/", &q(1)) + r.unbind_all("/", &q(2)) + r.unbind_all("/", &q(3)) + r.unbind_all("/", &q(4)),
            4
        );
        assert!(r.route("/", "h", &msg("k", &[]), "").unwrap().0.is_empty());
    }

    #[test]
    fn a_consistent_hash_ring_has_a_bounded_total_weight() {
        let r = Router::new();
        hash_exchange(&r, "h", vec![]);
        for n in 1..=8 {
            r.bind("/", "h", Binding::queue(QueueId(n), "1000", vec![])).unwrap();
        }
        // Re-binding an existing binding does not count it twice.
        r.bind("/", "h", Binding::queue(QueueId(1), "1000", vec![])).unwrap();
        let e = r.bind("/", "h", Binding::queue(QueueId(9), "1000", vec![]));
        assert_eq!(e, Err(RouteError::HashArgument(HashArgError::RingFull)));
        r.bind("/", "h", Binding::queue(QueueId(9), "192", vec![])).unwrap();
    }

    #[test]
    fn consistent_hash_on_a_header_routes_nothing_without_it() {
        let r = Router::new();
        let s = |v: &str| Value::Str(v.into());
        hash_exchange(&r, "h", vec![("hash-header".into(), s("order"))]);
        r.bind("/", "h", Binding::queue(QueueId(1), "1", vec![])).unwrap();
        r.bind("/", "h", Binding::queue(QueueId(2), "1", vec![])).unwrap();
        let (routes, cacheable) = r.route("/", "h", &msg("k", &[("order".into(), s("o-1"))]), "").unwrap();
        assert_eq!(routes.queues.len(), 1);
        assert!(!cacheable, "depends on a header");
        assert!(r.route("/", "h", &msg("k", &[]), "").unwrap().0.is_empty());
        let both = vec![("hash-header".into(), s("a")), ("hash-property".into(), s("message_id"))];
        let def = ExchangeDef {
            name: "bad".into(),
            kind: ExchangeKind::ConsistentHash,
            durable: false,
            auto_delete: false,
            internal: false,
            arguments: both,
        };
        assert_eq!(r.declare_exchange("/", def), Err(RouteError::HashArgument(HashArgError::BothSet)));
    }
}
