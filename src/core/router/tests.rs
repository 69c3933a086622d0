//! Tests of the table as a whole, and the helpers the other files' tests share.

use super::*;

pub(super) fn q(n: u64) -> Destination {
    Destination::Queue(QueueId(n))
}

pub(super) fn opts(qos: u8) -> MqttOptions {
    MqttOptions {
        client_id: "c".into(),
        qos,
        no_local: false,
        retain_as_published: false,
        subscription_id: None,
        tag_filter: None,
        share_group: None,
    }
}

pub(super) fn msg(key: &str, headers: &[(String, Value)]) -> Message {
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

pub(super) fn tagged(key: &str, tag: &str) -> Message {
    msg(key, &[("x-tag".into(), Value::Str(tag.into()))])
}

pub(super) fn queues(r: &Routes) -> Vec<u64> {
    let mut v: Vec<u64> = r.queues.iter().map(|q| q.queue.0).collect();
    v.sort();
    v
}

pub(super) fn mqtt_hits(r: &Router, topic: &str) -> Vec<u64> {
    queues(&r.resolve(&msg(&super::super::message::mqtt_to_key(topic), &[]), "nobody"))
}

pub(super) fn amqp_hits(r: &Router, exchange: &str, key: &str, headers: &[(String, Value)]) -> Vec<u64> {
    queues(&r.route("/", exchange, &msg(key, headers), "").unwrap().0)
}

pub(super) fn declare(r: &Router, name: &str, kind: ExchangeKind, auto_delete: bool, args: Vec<(String, Value)>) {
    let def = ExchangeDef { name: name.into(), kind, durable: false, auto_delete, internal: false, arguments: args };
    assert!(r.declare_exchange("/", def).unwrap().is_none());
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
fn keys_of_more_than_256_words_are_refused() {
    let r = Router::new();
    declare(&r, "t", ExchangeKind::Topic, false, vec![]);
    let words = |n: usize| vec!["#"; n].join(".");
    r.bind("/", "t", Binding::queue(QueueId(1), &words(MAX_KEY_WORDS), vec![])).unwrap();
    let e = r.bind("/", "t", Binding::queue(QueueId(2), &words(MAX_KEY_WORDS + 1), vec![]));
    assert_eq!(e, Err(RouteError::BindingKeyTooLong(257)));
    // A direct exchange compares keys whole: any length binds.
    r.bind("/", "amq.direct", Binding::queue(QueueId(3), &words(1000), vec![])).unwrap();
    let key = |n: usize| vec!["a"; n].join(".");
    assert_eq!(amqp_hits(&r, "t", &key(MAX_KEY_WORDS), &[]), vec![1]);
    let e = r.route("/", "t", &msg(&key(MAX_KEY_WORDS + 1), &[]), "").map(|_| ());
    assert_eq!(e, Err(RouteError::RoutingKeyTooLong(257)));
    assert_eq!(key_words(""), 0);
    assert_eq!(key_words("."), 2);
}

/// Bindings of many wildcards, distinct, against a long key: the route passes the steps it
/// may take on a runtime worker, ends off the workers and is counted; it finds the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_route_is_counted_and_routed_all_the_same() {
    let r = Router::new();
    declare(&r, "t", ExchangeKind::Topic, false, vec![]);
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    for n in 0..600 {
        let words: Vec<&str> = (0..20)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ["#", "*", "a", "a"][(seed % 4) as usize]
            })
            .chain(["x"])
            .collect();
        r.bind("/", "t", Binding::queue(QueueId(n), &words.join("."), vec![])).unwrap();
    }
    r.bind("/", "t", Binding::queue(QueueId(1000), "#.a.#.x", vec![])).unwrap();
    assert_eq!(r.long_routes(), 0);
    let key = format!("{}.x", vec!["a"; 126].join("."));
    let hits = amqp_hits(&r, "t", &key, &[]);
    assert!(hits.contains(&1000), "{hits:?}");
    assert_eq!(r.long_routes(), 1);
}

#[test]
fn many_targets_matched_twice_each_get_one_route_at_the_higher_qos() {
    // Past the size where a route being built is indexed: every queue is matched by two
    // subscriptions and must appear once, with the higher of the two QoS.
    let r = Router::new();
    for n in 0..100 {
        assert!(r.subscribe("fleet/#", q(n), opts(0)));
        assert!(r.subscribe("fleet/all", q(n), opts(1)));
    }
    let routes = r.resolve(&msg("fleet.all", &[]), "");
    assert_eq!(routes.queues.len(), 100);
    assert!(routes.queues.iter().all(|route| route.qos == 1));
    let mut ids: Vec<u64> = routes.queues.iter().map(|route| route.queue.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    // Unsubscribed one at a time, each is gone from the routes.
    for n in 0..100 {
        assert!(r.unsubscribe("fleet/all", &q(n)));
        assert!(r.unsubscribe("fleet/#", &q(n)));
        assert!(!r.unsubscribe("fleet/#", &q(n)));
    }
    assert!(r.resolve(&msg("fleet.all", &[]), "").is_empty());
}
