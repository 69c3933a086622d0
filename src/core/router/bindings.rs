//! The bindings of one exchange, stored by its routing kind: a map by key (direct), a list
//! (fanout, headers), the topic trie, or a consistent-hash ring; and headers matching.

use std::collections::HashMap;

use super::binding_list::BindingList;
use super::exchange::{retain_count, upsert, Binding, Destination, ExchangeDef, ExchangeKind};
use super::hash_ring::{HashOn, Ring};
use super::topic_trie::{stored_words, Node, Walked};
use crate::core::message::Message;
use crate::core::value::Value;

/// The bindings of one exchange, stored the way its routing kind looks them up.
#[derive(Debug)]
pub(super) enum Bindings {
    Direct(HashMap<String, BindingList>),
    Fanout(BindingList),
    Topic(Node),
    Headers(BindingList),
    ConsistentHash(HashBindings),
}

/// The bindings of a consistent-hash exchange and their ring.
#[derive(Debug)]
pub(super) struct HashBindings {
    on: HashOn,
    pub(super) list: Vec<Binding>,
    /// Derived from `list`; emptied when it changes, built by the next route.
    ring: std::sync::OnceLock<Ring>,
}

impl Bindings {
    /// Empty bindings for an exchange (whose arguments were validated), routing by the
    /// rules of its [`ExchangeDef::routing_kind`].
    pub(super) fn new(def: &ExchangeDef) -> Bindings {
        match def.routing_kind() {
            // (A delayed-message exchange passes its routing kind; direct is its default.)
            ExchangeKind::Direct | ExchangeKind::DelayedMessage => Bindings::Direct(HashMap::new()),
            ExchangeKind::Fanout | ExchangeKind::MessageDeduplication => Bindings::Fanout(BindingList::default()),
            ExchangeKind::Topic => Bindings::Topic(Node::default()),
            ExchangeKind::Headers => Bindings::Headers(BindingList::default()),
            ExchangeKind::ConsistentHash => Bindings::ConsistentHash(HashBindings {
                on: HashOn::from_arguments(&def.arguments).unwrap_or_default(),
                list: Vec::new(),
                ring: std::sync::OnceLock::new(),
            }),
        }
    }

    /// True when routes through these bindings depend on more than (key, tag).
    pub(super) fn uncacheable(&self) -> bool {
        match self {
            Bindings::Headers(_) => true,
            Bindings::ConsistentHash(h) => !h.on.is_routing_key(),
            _ => false,
        }
    }

    /// Adds or replaces a binding; true if it is new.
    pub(super) fn add(&mut self, b: Binding) -> bool {
        match self {
            Bindings::Direct(map) => map.entry(b.key.clone()).or_default().upsert(b),
            Bindings::Fanout(list) | Bindings::Headers(list) => list.upsert(b),
            Bindings::Topic(root) => root.insert(&stored_words(&b.key), b),
            Bindings::ConsistentHash(h) => {
                let added = upsert(&mut h.list, b);
                h.ring = std::sync::OnceLock::new();
                added
            }
        }
    }

    /// Removes bindings matching `pred` under `key` (every key when `key` is `None`);
    /// returns how many.
    pub(super) fn remove(&mut self, key: Option<&str>, pred: &dyn Fn(&Binding) -> bool) -> usize {
        match self {
            Bindings::Direct(map) => match key {
                Some(k) => {
                    let n = map.get_mut(k).map(|l| l.retain_count(pred)).unwrap_or(0);
                    if map.get(k).is_some_and(|l| l.is_empty()) {
                        map.remove(k);
                    }
                    n
                }
                None => {
                    let n = map.values_mut().map(|l| l.retain_count(pred)).sum();
                    map.retain(|_, l| !l.is_empty());
                    n
                }
            },
            Bindings::Fanout(list) | Bindings::Headers(list) => list.retain_count(pred),
            Bindings::ConsistentHash(h) => {
                let n = retain_count(&mut h.list, pred);
                if n > 0 {
                    h.ring = std::sync::OnceLock::new();
                }
                n
            }
            Bindings::Topic(root) => match key {
                Some(k) => root.remove(&stored_words(k), pred),
                None => root.remove_all(pred),
            },
        }
    }

    /// Removes the binding (dest, key, args), if there is one: found through the index of
    /// the place its key leads to, not by a scan of its neighbours.
    pub(super) fn remove_one(&mut self, dest: &Destination, key: &str, args: &[(String, Value)]) -> Option<Binding> {
        match self {
            Bindings::Direct(map) => {
                let list = map.get_mut(key)?;
                let removed = list.remove_one(dest, key, args);
                if list.is_empty() {
                    map.remove(key);
                }
                removed
            }
            Bindings::Fanout(list) | Bindings::Headers(list) => list.remove_one(dest, key, args),
            Bindings::Topic(root) => root.remove_one(&stored_words(key), dest, key, args),
            Bindings::ConsistentHash(h) => {
                let i = h.list.iter().position(|b| b.same(dest, key, args))?;
                h.ring = std::sync::OnceLock::new();
                Some(h.list.remove(i))
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match self {
            Bindings::Direct(map) => map.is_empty(),
            Bindings::Fanout(list) | Bindings::Headers(list) => list.is_empty(),
            Bindings::ConsistentHash(h) => h.list.is_empty(),
            Bindings::Topic(root) => root.is_empty(),
        }
    }

    pub(super) fn all(&self) -> Vec<Binding> {
        match self {
            Bindings::Direct(map) => map.values().flat_map(|l| l.iter()).cloned().collect(),
            Bindings::Fanout(list) | Bindings::Headers(list) => list.to_vec(),
            Bindings::ConsistentHash(h) => h.list.clone(),
            Bindings::Topic(root) => {
                let mut out = Vec::new();
                root.all(&mut out);
                out
            }
        }
    }

    /// Adds the bindings `msg` takes to `out`; says what a topic exchange's walk took.
    pub(super) fn matching<'a>(&'a self, msg: &Message, out: &mut Vec<&'a Binding>) -> Walked {
        let (key, headers) = (msg.routing_key.as_str(), msg.props.headers.as_slice());
        match self {
            Bindings::Direct(map) => out.extend(map.get(key).into_iter().flat_map(|l| l.iter())),
            Bindings::Fanout(list) => out.extend(list.iter()),
            Bindings::Topic(root) => {
                // The empty key has no words (`#` matches it, `*` does not).
                let words: Vec<&str> = if key.is_empty() { Vec::new() } else { key.split('.').collect() };
                return root.collect(&words, key.starts_with('$'), out);
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
        Walked::default()
    }
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use ferrymq_storage::QueueId;

    use crate::core::router::hash_ring::HashArgError;
    use crate::core::router::tests::{amqp_hits, declare, msg, q, queues};
    use crate::core::router::{Binding, ExchangeDef, ExchangeKind, RouteError, Router};
    use crate::core::value::Value;

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
