//! One message must never stall the broker: binding keys made of many `#` words against
//! long routing keys route in polynomial time while other clients go on being served, and
//! the keys every entry point takes are bounded (AMQP's 255-byte short string over the
//! HTTP API too; MQTT topic levels, will topics included, up to what the router takes).

use crate::common::amqp::*;
use crate::common::http::Api;
use crate::common::{connect_bytes, packet, v4, v5, Broker, Opts, Raw};
use reqwest::StatusCode;
use serde_json::json;

/// A routing key of 127 one-letter words (253 bytes: fits an AMQP short string).
fn long_key() -> String {
    vec!["a"; 127].join(".")
}

/// `n` `#` words, then `tail`.
fn hashes(n: usize, tail: &str) -> String {
    format!("{}.{tail}", vec!["#"; n].join("."))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_clients_are_served_while_publishes_route_through_many_hash_words() {
    let broker = Broker::start();
    let t = Target::ferrymq(broker);
    let b = t.broker.as_ref().expect("FerryMQ");
    // What a user who may declare an exchange and a queue can do.
    let (_setup, ch) = t.channel().await;
    declare_exchange(&ch, "hostile", ExchangeKind::Topic, ExchangeDeclareOptions::default(), FieldTable::default())
        .await;
    declare_queue(&ch, "sink", FieldTable::default()).await;
    declare_queue(&ch, "hit", FieldTable::default()).await;
    for n in [1, 3, 6, 12] {
        bind(&ch, "sink", "hostile", &hashes(n, "x"), FieldTable::default()).await;
    }
    bind(&ch, "hit", "hostile", &hashes(12, "a"), FieldTable::default()).await;
    // Two publishers (one per runtime worker of a 2-core broker), four messages each.
    let mut confirms = Vec::new();
    let mut publishers = Vec::new();
    for _ in 0..2 {
        let (conn, ch) = t.channel().await;
        confirm_select(&ch).await;
        for i in 0..4 {
            let body = format!("hostile {i}");
            let props = BasicProperties::default();
            confirms.push(publish_opts(&ch, "hostile", &long_key(), Default::default(), body.as_bytes(), props).await);
        }
        publishers.push((conn, ch));
    }
    // Meanwhile MQTT clients connect, subscribe (a change of the routing table), publish
    // and receive, and the management API answers.
    let api = Api::of(b);
    let mut sub = v4::connect(b, "bystander-sub").await;
    sub.subscribe("bystander/#", v4::QoS::AtLeastOnce).await;
    let mut publisher = v4::connect(b, "bystander-pub").await;
    for round in 0..5 {
        publisher.publish_acked(&format!("bystander/{round}"), v4::QoS::AtLeastOnce, false, "hello").await;
        let m = sub.next_publish().await;
        assert_eq!(m.topic, format!("bystander/{round}"));
        let overview = api.ok("/api/overview").await;
        assert!(overview.get("node").is_some(), "{overview}");
    }
    // The hostile publishes were routed: each confirmed, and the matching binding got
    // each message once.
    for c in confirms {
        let confirmation = bounded("publisher confirm", c).await.expect("publisher confirm");
        assert!(confirmation.is_ack(), "{confirmation:?}");
    }
    assert_eq!(queue_counts(&ch, "hit").await.expect("hit").0, 8);
    assert_eq!(queue_counts(&ch, "sink").await.expect("sink").0, 0);
    // One binding key of 12 `#` routes on the publisher's worker: nothing went off them.
    let (status, metrics) = api.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    assert!(metrics.lines().any(|l| l == "ferrymq_routes_off_worker_total 0"), "{metrics}");
}

/// The longest key AMQP carries (255 bytes, 256 words: all empty) against a binding key of
/// 128 `#` words, the most a short string holds: routed, and matched once.
#[tokio::test]
async fn the_longest_keys_amqp_carries_route() {
    let t = Target::ferrymq(Broker::start());
    let (_conn, ch) = t.channel().await;
    declare_queue(&ch, "deep", FieldTable::default()).await;
    let pattern = vec!["#"; 128].join(".");
    assert_eq!(pattern.len(), 255);
    bind(&ch, "deep", "amq.topic", &pattern, FieldTable::default()).await;
    confirm_select(&ch).await;
    let key = ".".repeat(255);
    let c = publish_confirmed(&ch, "amq.topic", &key, b"deep", BasicProperties::default()).await;
    assert!(c.is_ack(), "{c:?}");
    assert_eq!(queue_counts(&ch, "deep").await.expect("deep").0, 1);
}

#[tokio::test]
async fn the_http_api_takes_the_routing_and_binding_keys_amqp_could_carry() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let (status, body) = api.put("/api/queues/%2f/keyed", json!({})).await;
    assert!(status.is_success(), "{status}: {body}");
    // A routing key of 5,000 words: 400, as no AMQP client could send it.
    let huge = vec!["a"; 5000].join(".");
    let publish =
        |key: &str| json!({"routing_key": key, "payload": "x", "payload_encoding": "string", "properties": {}});
    let (status, body) = api.post("/api/exchanges/%2f/amq.topic/publish", publish(&huge)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["reason"].as_str().is_some_and(|r| r.contains("255")), "{body}");
    // 255 bytes is fine.
    let (status, body) = api.post("/api/exchanges/%2f/amq.topic/publish", publish(&long_key())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The same limit for binding keys, over the bindings route and in definitions.
    let (status, body) =
        api.post("/api/bindings/%2f/e/amq.topic/q/keyed", json!({"routing_key": "#.".repeat(128) + "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) =
        api.post("/api/bindings/%2f/e/amq.topic/q/keyed", json!({"routing_key": hashes(126, "x")})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let defs = json!({"bindings": [{
        "source": "amq.topic", "vhost": "/", "destination": "keyed", "destination_type": "queue",
        "routing_key": huge, "arguments": {}
    }]});
    let (status, body) = api.post("/api/definitions", defs).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// `mqtt.max_topic_levels = 0` once meant "unlimited": it is now the router's ceiling, 256,
/// so a deeper filter gets the protocol's refusal (0x8F) instead of a binding no publish
/// could reach.
#[tokio::test]
async fn mqtt_topic_levels_stop_at_what_the_router_takes() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_TOPIC_LEVELS", "0"));
    let mut c = v5::connect(&broker, "deep").await;
    let filter = |levels: usize| vec!["l"; levels].join("/");
    let codes = c.subscribe(&filter(257), v5::QoS::AtMostOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::TopicFilterInvalid]);
    let codes = c.subscribe(&filter(256), v5::QoS::AtMostOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(v5::QoS::AtMostOnce)]);
}

/// A will is published to its topic as a PUBLISH would be: one of more levels than
/// `mqtt.max_topic_levels` refuses the CONNECT (5.0: CONNACK 0x90 Topic Name invalid).
#[tokio::test]
async fn a_will_topic_of_too_many_levels_refuses_the_connect() {
    let broker = Broker::start();
    let connack = |topic: &str| {
        // CONNECT 5.0, clean start + will (QoS 0), no properties, then the will's.
        let mut body = connect_bytes(5, "will-deep", 0x06, 60, &[0]);
        let header = 1 + if body[1] & 0x80 != 0 { 2 } else { 1 };
        let mut rest = body.split_off(header);
        rest.push(0); // will properties
        rest.extend_from_slice(&(topic.len() as u16).to_be_bytes());
        rest.extend_from_slice(topic.as_bytes());
        rest.extend_from_slice(&[0, 4, b'g', b'o', b'n', b'e']);
        packet(0x10, &rest)
    };
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connack(&vec!["w"; 129].join("/"))).await;
    let got = raw.read_until_closed().await;
    assert!(got.len() >= 4 && got[0] == 0x20 && got[3] == 0x90, "CONNACK 0x90: {got:02x?}");
    // 128 levels (the default limit) connects.
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connack(&vec!["w"; 128].join("/"))).await;
    let got = raw.read_at_least(4).await;
    assert!(got[0] == 0x20 && got[3] == 0x00, "CONNACK 0x00: {got:02x?}");
}
