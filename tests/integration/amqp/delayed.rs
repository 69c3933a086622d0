//! Delayed delivery through an `x-delayed-message` exchange (the convention of RabbitMQ's
//! delayed-message plugin): a publish with a positive `x-delay` header (ms) is confirmed when
//! stored and routed, by the rules of the exchange's `x-delayed-type`, when its time comes;
//! pending delayed messages survive restarts. FerryMQ-only (RabbitMQ 3.10 has no such type
//! without the plugin).

use std::time::{Duration, Instant};

use crate::common::amqp::*;
use crate::common::{v4, Broker};

/// Declares a delayed-message exchange routing like `inner`.
async fn delayed_exchange(ch: &Channel, name: &str, inner: &str, durable: bool) {
    declare_exchange(
        ch,
        name,
        ExchangeKind::Custom("x-delayed-message".into()),
        ExchangeDeclareOptions { durable, ..Default::default() },
        table(&[("x-delayed-type", string(inner))]),
    )
    .await;
}

fn delay(ms: i64) -> BasicProperties {
    BasicProperties::default().with_headers(table(&[("x-delay", AMQPValue::LongLongInt(ms))]))
}

/// An exclusive server-named queue bound to `exchange` with `key`, and a no-ack consumer.
async fn bound_consumer(ch: &Channel, exchange: &str, key: &str) -> Consumer {
    let q = declare_queue_with(
        ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    bind(ch, &q, exchange, key, FieldTable::default()).await;
    consume(ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await
}

/// Asserts that a delivery `waited` after its publish was sent did not come before its
/// delay. The broker keeps due times in whole milliseconds of the wall clock and the test
/// measures on the monotonic clock, so the two may be up to ~2 ms apart over a delay
/// (truncation to the millisecond, clock slew).
fn assert_not_before(waited: Duration, delay_ms: u64) {
    assert!(
        waited + Duration::from_millis(2) >= Duration::from_millis(delay_ms),
        "delivered after {waited:?}, before its {delay_ms} ms delay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_is_confirmed_at_once_and_routed_after_its_delay() {
    if skip_on_rabbitmq("x-delayed-message is a plugin there") {
        return;
    }
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    delayed_exchange(&ch, "later", "direct", false).await;
    let mut c = bound_consumer(&ch, "later", "k").await;

    let sent = Instant::now();
    assert!(publish_confirmed(&ch, "later", "k", b"in 1.5 s", delay(1500)).await.is_ack());
    let confirmed = sent.elapsed();
    assert!(publish_confirmed(&ch, "later", "k", b"no delay", BasicProperties::default()).await.is_ack());
    assert!(publish_confirmed(&ch, "later", "k", b"zero delay", delay(0)).await.is_ack());
    assert!(publish_confirmed(&ch, "later", "k", b"negative delay", delay(-5)).await.is_ack());
    assert!(publish_confirmed(&ch, "later", "other", b"wrong key", delay(100)).await.is_ack());
    assert!(confirmed < Duration::from_millis(1500), "the confirm follows the store, not the delivery ({confirmed:?})");

    // Messages without a positive x-delay are routed at once, the delayed one later.
    assert_eq!(texts(&take(&mut c, 3).await), ["no delay", "zero delay", "negative delay"]);
    let d = next_delivery(&mut c).await;
    let waited = sent.elapsed();
    assert_eq!(text(&d), "in 1.5 s");
    assert_not_before(waited, 1500);
    // The x-delay header is delivered as published.
    assert_eq!(field(&headers(&d.properties), "x-delay").and_then(as_i64), Some(1500));
    // Routing by the exchange's x-delayed-type (direct): the other key matched nothing.
    expect_no_delivery(&mut c, Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_arrive_in_due_order_and_follow_the_delayed_type() {
    if skip_on_rabbitmq("x-delayed-message is a plugin there") {
        return;
    }
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    delayed_exchange(&ch, "later-topic", "topic", false).await;
    let mut c = bound_consumer(&ch, "later-topic", "orders.*").await;
    for (body, ms, key) in [
        ("third", 900, "orders.a"),
        ("first", 300, "orders.b"),
        ("second", 600, "orders.c"),
        ("unrouted", 100, "users.a"),
    ] {
        assert!(publish_confirmed(&ch, "later-topic", key, body.as_bytes(), delay(ms)).await.is_ack());
    }
    let got = take(&mut c, 3).await;
    assert_eq!(texts(&got), ["first", "second", "third"]);
    assert_eq!(got.iter().map(|d| d.routing_key.as_str()).collect::<Vec<_>>(), ["orders.b", "orders.c", "orders.a"]);
    expect_no_delivery(&mut c, Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_exchange_needs_a_valid_delayed_type() {
    if skip_on_rabbitmq("x-delayed-message is a plugin there") {
        return;
    }
    let t = Target::start();
    let kind = || ExchangeKind::Custom("x-delayed-message".into());
    for args in [
        FieldTable::default(),
        table(&[("x-delayed-type", string("nonsense"))]),
        table(&[("x-delayed-type", string("x-delayed-message"))]),
    ] {
        let (_c, ch) = t.channel().await;
        let r = ch.exchange_declare("bad-delayed".into(), kind(), ExchangeDeclareOptions::default(), args).await;
        let text = expect_code(r, 406);
        assert!(text.contains("x-delayed-type"), "{text}");
    }
    // Redeclaring with another x-delayed-type is inequivalent.
    let (_c, ch) = t.channel().await;
    delayed_exchange(&ch, "typed", "fanout", false).await;
    delayed_exchange(&ch, "typed", "fanout", false).await;
    let r = ch
        .exchange_declare(
            "typed".into(),
            kind(),
            ExchangeDeclareOptions::default(),
            table(&[("x-delayed-type", string("topic"))]),
        )
        .await;
    expect_code(r, 406);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_publish_in_a_transaction_is_stored_only_at_commit() {
    if skip_on_rabbitmq("x-delayed-message is a plugin there") {
        return;
    }
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    delayed_exchange(&ch, "later-tx", "fanout", false).await;
    let mut c = bound_consumer(&ch, "later-tx", "").await;
    bounded("tx.select", ch.tx_select()).await.unwrap();
    publish(&ch, "later-tx", "", b"rolled back", delay(200)).await;
    bounded("tx.rollback", ch.tx_rollback()).await.unwrap();
    publish(&ch, "later-tx", "", b"committed", delay(200)).await;
    bounded("tx.commit", ch.tx_commit()).await.unwrap();
    assert_eq!(text(&next_delivery(&mut c).await), "committed");
    expect_no_delivery(&mut c, Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_delayed_messages_survive_a_crash() {
    if skip_on_rabbitmq("kills the broker with SIGKILL") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let sent = Instant::now();
    {
        let (_c, ch) = t.channel().await;
        confirm_select(&ch).await;
        delayed_exchange(&ch, "later-durable", "direct", true).await;
        declare_queue_with(
            &ch,
            "delayed-kept",
            QueueDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
        bind(&ch, "delayed-kept", "later-durable", "k", FieldTable::default()).await;
        for (body, ms) in [("soon", 2500), ("later", 3500)] {
            assert!(publish_confirmed(&ch, "later-durable", "k", body.as_bytes(), delay(ms).with_delivery_mode(2))
                .await
                .is_ack());
        }
        // Killed right after the confirms, with both still pending.
    }
    let t = Target::ferrymq(t.broker.unwrap().crash_restart());
    let (_c, ch) = t.channel().await;
    let mut c = consume(&ch, "delayed-kept", BasicConsumeOptions::default(), FieldTable::default()).await;
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "soon");
    assert_not_before(sent.elapsed(), 2500);
    bounded("ack", d.ack(BasicAckOptions::default())).await.unwrap();
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "later");
    assert_not_before(sent.elapsed(), 3500);
    bounded("ack", d.ack(BasicAckOptions::default())).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_subscriber_gets_a_delayed_amqp_publish_through_amq_topic() {
    if skip_on_rabbitmq("x-delayed-message is a plugin there") {
        return;
    }
    let t = Target::start();
    let b = t.broker.as_ref().unwrap();
    let mut s = v4::connect(b, &unique("sub")).await;
    s.subscribe("sensors/+/cmd", v4::QoS::AtLeastOnce).await;
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    delayed_exchange(&ch, "later-mqtt", "topic", false).await;
    bounded(
        "exchange.bind",
        ch.exchange_bind(
            "amq.topic".into(),
            "later-mqtt".into(),
            "#".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let sent = Instant::now();
    assert!(publish_confirmed(&ch, "later-mqtt", "sensors.s1.cmd", b"reboot", delay(700)).await.is_ack());
    let m = s.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("sensors/s1/cmd", &b"reboot"[..]));
    assert_not_before(sent.elapsed(), 700);
}

/// Flips one bit of the first copy of `marker` in the commit-log segments of `dir`, in
/// place (the broker keeps appending to the active segment meanwhile): a record there no
/// longer matches its checksum. Flipping it again repairs it.
fn flip_in_log(dir: &std::path::Path, marker: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    for entry in std::fs::read_dir(dir.join("log")).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(marker.len()).position(|w| w == marker) {
            let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.seek(SeekFrom::Start(at as u64)).unwrap();
            file.write_all(&[bytes[at] ^ 0x20]).unwrap();
            return;
        }
    }
    panic!("{} is in no segment", String::from_utf8_lossy(marker));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_whose_record_cannot_be_read_when_due_is_kept_until_it_can() {
    if skip_on_rabbitmq("damages FerryMQ's commit log") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let dir = t.broker.as_ref().unwrap().dir.clone();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    delayed_exchange(&ch, "later-damaged", "direct", false).await;
    let mut c = bound_consumer(&ch, "later-damaged", "k").await;
    let body = b"delayed-record-that-the-disk-damaged";
    assert!(publish_confirmed(&ch, "later-damaged", "k", body, delay(1500)).await.is_ack());
    // Damaged on disk before it is due: at its time the broker cannot read it.
    flip_in_log(&dir, body);
    let broker = t.broker.as_ref().unwrap();
    assert!(broker.wait_log("a delayed message is due but its record cannot be read"), "{}", broker.log());
    expect_no_delivery(&mut c, Duration::from_millis(300)).await;
    // The disk repaired (a restored backup, a transient fault gone): the message comes,
    // whole, at the next try rather than being lost with its timer.
    flip_in_log(&dir, &{
        let mut damaged = body.to_vec();
        damaged[0] ^= 0x20;
        damaged
    });
    let d = next_delivery_within(&mut c, Duration::from_secs(15)).await;
    assert_eq!(d.data, body);
    // Counted (once per try that failed), not dropped.
    let metrics = crate::common::http::Api::of(broker).ok("/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default();
    let tries = metrics.lines().find_map(|l| l.strip_prefix("ferrymq_delayed_unreadable_total "));
    assert!(tries.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n >= 1), "{metrics}");
}
