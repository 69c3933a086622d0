//! The MQTT ↔ AMQP gateway: MQTT topics are routing keys on `amq.topic` (`/` ↔ `.`), MQTT
//! properties map to AMQP properties, QoS ≥ 1 is persistent. Against RabbitMQ these run
//! when `FERRYMQ_TEST_RABBITMQ_MQTT=HOST:PORT` names the node's rabbitmq_mqtt listener (the
//! topic mapping is RabbitMQ's); MQTT 5 properties (RabbitMQ 3.10 speaks MQTT 3.1.1 only),
//! the retain header and opted-in de-duplication are FerryMQ-only.

use crate::common;

use std::time::Duration;

use crate::common::amqp::*;
use crate::common::{v4, v5};

/// The MQTT address, or None (after printing why) when the reference node has none.
fn mqtt_addr(t: &Target) -> Option<std::net::SocketAddr> {
    if t.mqtt.is_none() {
        common::skipped(&format!(
            "against RabbitMQ: set {RABBITMQ_MQTT_ENV}=HOST:PORT (rabbitmq_mqtt) to run the gateway tests"
        ));
    }
    t.mqtt
}

async fn mqtt4(addr: std::net::SocketAddr, id: &str) -> v4::Client {
    let mut o = v4::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    o.set_keep_alive(Duration::from_secs(30));
    v4::connect_with(o).await
}

async fn mqtt5(addr: std::net::SocketAddr, id: &str) -> v5::Client {
    let mut o = v5::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    o.set_keep_alive(Duration::from_secs(30));
    v5::connect_with(o).await
}

/// An exclusive AMQP queue bound to amq.topic with `pattern`, and a no-ack consumer on it.
async fn topic_consumer(ch: &Channel, pattern: &str) -> Consumer {
    let q = declare_queue_with(
        ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    bind(ch, &q, "amq.topic", pattern, FieldTable::default()).await;
    consume(ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await
}

/// A topic level unique to this test (no `/`, `.`, `+` or `#`).
fn level() -> String {
    unique("gw")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_publish_reaches_an_amqp_queue_bound_to_amq_topic() {
    let t = Target::start();
    let Some(addr) = mqtt_addr(&t) else { return };
    let (_c, ch) = t.channel().await;
    let a = level();
    let mut c = topic_consumer(&ch, &format!("{a}.*.c")).await;
    let mut p = mqtt4(addr, &unique("pub")).await;
    p.publish_acked(&format!("{a}/b/c"), v4::QoS::AtLeastOnce, false, "from mqtt").await;
    p.publish_acked(&format!("{a}/b/d"), v4::QoS::AtLeastOnce, false, "not matched").await;
    p.publish_acked(&format!("{a}/x/c"), v4::QoS::AtLeastOnce, false, "second").await;
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "from mqtt");
    assert_eq!(d.exchange.as_str(), "amq.topic");
    assert_eq!(d.routing_key.as_str(), format!("{a}.b.c"));
    assert_eq!(text(&next_delivery(&mut c).await), "second");
    expect_no_delivery(&mut c, Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_publish_to_amq_topic_reaches_an_mqtt_subscriber() {
    let t = Target::start();
    let Some(addr) = mqtt_addr(&t) else { return };
    let x = level();
    let mut s = mqtt4(addr, &unique("sub")).await;
    s.subscribe(&format!("{x}/+"), v4::QoS::AtLeastOnce).await;
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    assert!(publish_confirmed(&ch, "amq.topic", &format!("{x}.y"), b"from amqp", BasicProperties::default())
        .await
        .is_ack());
    assert!(publish_confirmed(&ch, "amq.topic", &format!("{x}.y.z"), b"too deep", BasicProperties::default())
        .await
        .is_ack());
    assert!(publish_confirmed(&ch, "amq.topic", &format!("{x}.w"), b"second", persistent()).await.is_ack());
    let m = s.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), (format!("{x}/y").as_str(), &b"from amqp"[..]));
    let m = s.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), (format!("{x}/w").as_str(), &b"second"[..]));
    s.expect_no_publish(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_qos1_is_persistent_and_qos0_is_not() {
    let t = Target::start();
    let Some(addr) = mqtt_addr(&t) else { return };
    let (_c, ch) = t.channel().await;
    let a = level();
    let mut c = topic_consumer(&ch, &format!("{a}.#")).await;
    let mut p = mqtt4(addr, &unique("pub")).await;
    p.publish_acked(&format!("{a}/q1"), v4::QoS::AtLeastOnce, false, "q1").await;
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "q1");
    assert_eq!(d.properties.delivery_mode(), &Some(2), "QoS 1 → persistent: {:?}", d.properties);
    p.client.publish(format!("{a}/q0"), v4::QoS::AtMostOnce, false, "q0").await.unwrap();
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "q0");
    assert_ne!(d.properties.delivery_mode(), &Some(2), "QoS 0 is not persistent: {:?}", d.properties);
    eprintln!("QoS 0 properties: {:?}", d.properties);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_properties_map_to_amqp_properties() {
    if skip_on_rabbitmq("MQTT 5 (RabbitMQ 3.10's MQTT plugin speaks 3.1.1 only)") {
        return;
    }
    let t = Target::start();
    let addr = t.mqtt.unwrap();
    let (_c, ch) = t.channel().await;
    let a = level();
    let mut c = topic_consumer(&ch, &format!("{a}.#")).await;
    let p = mqtt5(addr, &unique("pub5")).await;
    let props = v5::PublishProperties {
        user_properties: vec![("tenant".into(), "blue".into()), ("trace".into(), "t-1".into())],
        content_type: Some("application/json".into()),
        correlation_data: Some(bytes::Bytes::from_static(b"corr-7")),
        response_topic: Some("replies".into()),
        message_expiry_interval: Some(60),
        ..Default::default()
    };
    p.client.publish_with_properties(format!("{a}/p"), v5::QoS::AtLeastOnce, false, "{}", props).await.unwrap();
    let d = next_delivery(&mut c).await;
    let h = headers(&d.properties);
    assert_eq!(field(&h, "tenant").and_then(as_str).as_deref(), Some("blue"), "{h:?}");
    assert_eq!(field(&h, "trace").and_then(as_str).as_deref(), Some("t-1"));
    assert_eq!(d.properties.content_type().as_ref().map(|s| s.as_str()), Some("application/json"));
    assert_eq!(d.properties.correlation_id().as_ref().map(|s| s.as_str()), Some("corr-7"));
    assert_eq!(d.properties.reply_to().as_ref().map(|s| s.as_str()), Some("replies"));
    let exp: u64 = d.properties.expiration().as_ref().expect("expiration").as_str().parse().unwrap();
    assert!((55_000..=60_000).contains(&exp), "expiration {exp} ms from a 60 s expiry");
    assert_eq!(d.properties.delivery_mode(), &Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_properties_map_to_mqtt5_properties() {
    if skip_on_rabbitmq("MQTT 5 (RabbitMQ 3.10's MQTT plugin speaks 3.1.1 only)") {
        return;
    }
    let t = Target::start();
    let addr = t.mqtt.unwrap();
    let x = level();
    let mut s = mqtt5(addr, &unique("sub5")).await;
    s.subscribe(&format!("{x}/#"), v5::QoS::AtLeastOnce).await;
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let props = BasicProperties::default()
        .with_headers(table(&[("tenant", string("blue"))]))
        .with_content_type("text/plain".into())
        .with_correlation_id("corr-9".into())
        .with_reply_to("replies".into())
        .with_expiration("60000".into());
    assert!(publish_confirmed(&ch, "amq.topic", &format!("{x}.m"), b"hello", props).await.is_ack());
    let m = s.next_publish().await;
    assert_eq!(&m.payload[..], b"hello");
    let p = m.properties.expect("MQTT 5 properties");
    assert!(p.user_properties.contains(&("tenant".to_string(), "blue".to_string())), "{:?}", p.user_properties);
    assert_eq!(p.content_type.as_deref(), Some("text/plain"));
    assert_eq!(p.correlation_data.as_deref(), Some(&b"corr-9"[..]));
    assert_eq!(p.response_topic.as_deref(), Some("replies"));
    let expiry = p.message_expiry_interval.expect("message expiry");
    assert!((55..=60).contains(&expiry), "expiry {expiry} s from 60000 ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_retain_flag_becomes_an_x_mqtt_retain_header() {
    if skip_on_rabbitmq("x-mqtt-retain is FerryMQ's header") {
        return;
    }
    let t = Target::start();
    let addr = t.mqtt.unwrap();
    let (_c, ch) = t.channel().await;
    let a = level();
    let mut c = topic_consumer(&ch, &format!("{a}.#")).await;
    let mut p = mqtt4(addr, &unique("pub")).await;
    p.publish_acked(&format!("{a}/r"), v4::QoS::AtLeastOnce, true, "retained").await;
    p.publish_acked(&format!("{a}/n"), v4::QoS::AtLeastOnce, false, "plain").await;
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "retained");
    assert_eq!(field(&headers(&d.properties), "x-mqtt-retain"), Some(&AMQPValue::Boolean(true)), "{:?}", d.properties);
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "plain");
    let h = headers(&d.properties);
    assert!(matches!(field(&h, "x-mqtt-retain"), None | Some(AMQPValue::Boolean(false))), "{h:?}");
}

/// Exactly once from an AMQP publisher to an MQTT QoS 2 subscriber, opted in as with
/// RabbitMQ's message-deduplication plugin: the publisher repeats a message (a lost
/// confirm, a reconnect) with the same `x-deduplication-header` value through an
/// `x-message-deduplication` exchange bound to `amq.topic`; the subscriber gets it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opted_in_deduplication_delivers_a_repeated_publish_once_to_mqtt() {
    if skip_on_rabbitmq("needs the message-deduplication plugin") {
        return;
    }
    let t = Target::start();
    let addr = t.mqtt.unwrap();
    let x = level();
    let mut s = mqtt4(addr, &unique("sub-qos2")).await;
    s.subscribe(&format!("{x}/#"), v4::QoS::ExactlyOnce).await;
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let dedup = unique("once");
    declare_exchange(
        &ch,
        &dedup,
        ExchangeKind::Custom("x-message-deduplication".into()),
        ExchangeDeclareOptions { durable: true, ..Default::default() },
        table(&[("x-cache-size", int(1000)), ("x-cache-ttl", int(60_000)), ("x-cache-persistence", string("disk"))]),
    )
    .await;
    bounded(
        "exchange.bind",
        ch.exchange_bind(
            "amq.topic".into(),
            dedup.as_str().into(),
            "#".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let id = unique("order");
    let keyed = |id: &str| persistent().with_headers(table(&[("x-deduplication-header", string(id))]));
    for _ in 0..3 {
        let c = publish_confirmed(&ch, &dedup, &format!("{x}.once"), b"exactly once", keyed(&id)).await;
        assert_eq!(c, Confirmation::Ack(None), "a duplicate is still confirmed");
    }
    let other = keyed(&unique("other"));
    assert!(publish_confirmed(&ch, &dedup, &format!("{x}.once"), b"different id", other).await.is_ack());
    let m = s.next_publish().await;
    assert_eq!(&m.payload[..], b"exactly once");
    let m = s.next_publish().await;
    assert_eq!(&m.payload[..], b"different id");
    s.expect_no_publish(Duration::from_millis(300)).await;
}

/// Without the opt-in, repeated message ids are application data: every publish arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_message_ids_all_reach_an_mqtt_subscriber() {
    let t = Target::start();
    let Some(addr) = mqtt_addr(&t) else { return };
    let x = level();
    let mut s = mqtt4(addr, &unique("sub-ids")).await;
    s.subscribe(&format!("{x}/#"), v4::QoS::AtLeastOnce).await;
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let props = BasicProperties::default().with_message_id("order-42".into()).with_delivery_mode(2);
    for i in 0..3 {
        let body = format!("update {i}");
        assert!(publish_confirmed(&ch, "amq.topic", &format!("{x}.ids"), body.as_bytes(), props.clone())
            .await
            .is_ack());
    }
    for i in 0..3 {
        let m = s.next_publish().await;
        assert_eq!(String::from_utf8_lossy(&m.payload), format!("update {i}"));
    }
}

/// `mqtt.exchange` names the topic exchange MQTT goes through (RabbitMQ's `mqtt.exchange`):
/// it is created at start, MQTT publishes reach queues bound to it (not to `amq.topic`),
/// and AMQP publishes to it reach MQTT subscribers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mqtt_exchange_is_configurable() {
    if skip_on_rabbitmq("mqtt.exchange set through FerryMQ's configuration") {
        return;
    }
    let t = Target::start_with(common::Opts::default().env("FERRYMQ_MQTT__EXCHANGE", "iot"));
    let addr = t.mqtt.unwrap();
    let (_c, ch) = t.channel().await;
    let a = level();
    let q = declare_queue_with(
        &ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    bind(&ch, &q, "iot", &format!("{a}.#"), FieldTable::default()).await;
    let mut c =
        consume(&ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let mut on_amq_topic = topic_consumer(&ch, &format!("{a}.#")).await;
    let mut s = mqtt4(addr, &unique("sub")).await;
    s.subscribe(&format!("{a}/+"), v4::QoS::AtLeastOnce).await;
    let mut p = mqtt4(addr, &unique("pub")).await;
    p.publish_acked(&format!("{a}/m"), v4::QoS::AtLeastOnce, false, "from mqtt").await;
    let d = next_delivery(&mut c).await;
    assert_eq!((text(&d).as_str(), d.exchange.as_str()), ("from mqtt", "iot"));
    assert_eq!(&s.next_publish().await.payload[..], b"from mqtt");
    confirm_select(&ch).await;
    assert!(publish_confirmed(&ch, "iot", &format!("{a}.x"), b"from amqp", BasicProperties::default()).await.is_ack());
    assert!(publish_confirmed(&ch, "amq.topic", &format!("{a}.y"), b"other exchange", BasicProperties::default())
        .await
        .is_ack());
    let m = s.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), (format!("{a}/x").as_str(), &b"from amqp"[..]));
    s.expect_no_publish(Duration::from_millis(300)).await;
    assert_eq!(text(&next_delivery(&mut on_amq_topic).await), "other exchange", "amq.topic gets no MQTT traffic");
}
