//! Message TTL (per message and per queue) and dead-lettering (on reject / nack, expiry,
//! max-length, delivery limit) with the `x-death` header as RabbitMQ writes it.

use std::time::Duration;

use crate::common::amqp::*;

/// A dead-letter exchange (fanout) with a queue bound to it and a consumer on that queue.
struct Dlx {
    exchange: String,
    consumer: Consumer,
}

async fn dlx(ch: &Channel) -> Dlx {
    let exchange = unique("dlx");
    declare_exchange(ch, &exchange, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    let queue = declare_queue_with(
        ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    bind(ch, &queue, &exchange, "", FieldTable::default()).await;
    let consumer =
        consume(ch, &queue, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    Dlx { exchange, consumer }
}

async fn source_queue(ch: &Channel, args: &[(&str, AMQPValue)]) -> String {
    let q = unique("src");
    declare_queue_with(ch, &q, QueueDeclareOptions { exclusive: true, ..Default::default() }, table(args)).await;
    q
}

/// Checks one x-death entry: exactly the fields RabbitMQ writes, with their types.
fn check_death(t: &FieldTable, queue: &str, reason: &str, exchange: &str, keys: &[&str], count: i64) {
    assert!(matches!(field(t, "count"), Some(AMQPValue::LongLongInt(_))), "count is a long ('l'): {t:?}");
    assert_eq!(field(t, "count").and_then(as_i64), Some(count), "count in {t:?}");
    assert!(matches!(field(t, "reason"), Some(AMQPValue::LongString(_))), "reason is a long string: {t:?}");
    assert_eq!(str_field(t, "reason"), reason);
    assert_eq!(str_field(t, "queue"), queue);
    assert_eq!(str_field(t, "exchange"), exchange);
    match field(t, "routing-keys") {
        Some(AMQPValue::FieldArray(a)) => {
            let got: Vec<String> = a.as_slice().iter().map(|v| as_str(v).expect("routing key string")).collect();
            assert_eq!(got, keys, "routing-keys");
        }
        other => panic!("routing-keys is not an array: {other:?}"),
    }
    match field(t, "time") {
        Some(AMQPValue::Timestamp(ts)) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
            assert!(ts.abs_diff(now) < 120, "time {ts} is about now ({now})");
        }
        other => panic!("time is not a timestamp: {other:?}"),
    }
}

/// The x-first-death-* headers RabbitMQ adds on the first dead-lettering.
fn check_first_death(d: &Delivery, queue: &str, reason: &str, exchange: &str) {
    let h = headers(&d.properties);
    assert_eq!(field(&h, "x-first-death-queue").and_then(as_str).as_deref(), Some(queue), "{h:?}");
    assert_eq!(field(&h, "x-first-death-reason").and_then(as_str).as_deref(), Some(reason), "{h:?}");
    assert_eq!(field(&h, "x-first-death-exchange").and_then(as_str).as_deref(), Some(exchange), "{h:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_messages_are_dead_lettered_with_x_death() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let mut d = dlx(&ch).await;
    let q = source_queue(&ch, &[("x-dead-letter-exchange", string(&d.exchange))]).await;
    let props = BasicProperties::default().with_message_id("m1".into()).with_headers(table(&[("app", string("kept"))]));
    assert!(publish_confirmed(&ch, "", &q, b"bad", props).await.is_ack());
    let m = get(&ch, &q, false).await.unwrap();
    m.delivery.reject(BasicRejectOptions { requeue: false }).await.unwrap();
    let dead = next_delivery(&mut d.consumer).await;
    assert_eq!(text(&dead), "bad");
    // Republished to the DLX with the original routing key.
    assert_eq!(dead.exchange.as_str(), d.exchange);
    assert_eq!(dead.routing_key.as_str(), q);
    assert_eq!(dead.properties.message_id().as_ref().map(|s| s.as_str()), Some("m1"));
    assert_eq!(field(&headers(&dead.properties), "app").and_then(as_str).as_deref(), Some("kept"));
    let deaths = x_death(&dead);
    assert_eq!(deaths.len(), 1);
    check_death(&deaths[0], &q, "rejected", "", &[&q], 1);
    assert_eq!(deaths[0].inner().len(), 6, "count, reason, queue, time, exchange, routing-keys: {:?}", deaths[0]);
    check_first_death(&dead, &q, "rejected", "");
    eprintln!("dead-lettered headers: {:?}", dead.properties.headers());
    assert!(get(&ch, &q, true).await.is_none(), "gone from the source queue");
    delete_exchange(&ch, &d.exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacked_messages_are_dead_lettered_but_requeued_ones_are_not() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let mut d = dlx(&ch).await;
    let q = source_queue(&ch, &[("x-dead-letter-exchange", string(&d.exchange))]).await;
    fill(&ch, &q, &["n1", "n2", "n3"]).await;
    let m1 = get(&ch, &q, false).await.unwrap();
    m1.delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.unwrap();
    let mut tags = Vec::new();
    for _ in 0..3 {
        tags.push(get(&ch, &q, false).await.unwrap().delivery.delivery_tag);
    }
    bounded("nack", ch.basic_nack(*tags.last().unwrap(), BasicNackOptions { multiple: true, requeue: false }))
        .await
        .unwrap();
    let dead = take(&mut d.consumer, 3).await;
    assert_eq!(texts(&dead), ["n1", "n2", "n3"]);
    for m in &dead {
        let deaths = x_death(m);
        assert_eq!(deaths.len(), 1);
        check_death(&deaths[0], &q, "rejected", "", &[&q], 1);
    }
    expect_no_delivery(&mut d.consumer, Duration::from_millis(100)).await;
    delete_exchange(&ch, &d.exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_routing_key_replaces_the_key() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let target = declare_queue_with(
        &ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    // DLX = default exchange, key = the target queue's name.
    let q =
        source_queue(&ch, &[("x-dead-letter-exchange", string("")), ("x-dead-letter-routing-key", string(&target))])
            .await;
    bind(&ch, &q, "amq.direct", "original.key", FieldTable::default()).await;
    assert!(publish_confirmed(&ch, "amq.direct", "original.key", b"rk", BasicProperties::default()).await.is_ack());
    get(&ch, &q, false).await.unwrap().delivery.reject(BasicRejectOptions { requeue: false }).await.unwrap();
    let mut c =
        consume(&ch, &target, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let dead = next_delivery(&mut c).await;
    assert_eq!(dead.exchange.as_str(), "");
    assert_eq!(dead.routing_key.as_str(), target);
    let deaths = x_death(&dead);
    // x-death keeps the original exchange and routing keys.
    check_death(&deaths[0], &q, "rejected", "amq.direct", &["original.key"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_ttl_expires_messages_into_the_dlx() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let mut d = dlx(&ch).await;
    let q = source_queue(&ch, &[("x-message-ttl", int(100)), ("x-dead-letter-exchange", string(&d.exchange))]).await;
    let sent = std::time::Instant::now();
    fill(&ch, &q, &["e1", "e2"]).await;
    let dead = take(&mut d.consumer, 2).await;
    assert!(sent.elapsed() >= Duration::from_millis(100), "expired after the TTL, took {:?}", sent.elapsed());
    assert_eq!(texts(&dead), ["e1", "e2"]);
    for m in &dead {
        let deaths = x_death(m);
        check_death(&deaths[0], &q, "expired", "", &[&q], 1);
        assert!(field(&deaths[0], "original-expiration").is_none(), "no per-message TTL: {:?}", deaths[0]);
        check_first_death(m, &q, "expired", "");
    }
    assert_eq!(queue_counts(&ch, &q).await.unwrap().0, 0);
    delete_exchange(&ch, &d.exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_messages_without_a_dlx_are_discarded() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = source_queue(&ch, &[("x-message-ttl", int(100))]).await;
    fill(&ch, &q, &["q-ttl"]).await;
    assert!(publish_confirmed(&ch, "", &q, b"m-ttl", BasicProperties::default().with_expiration("100".into()))
        .await
        .is_ack());
    // No event tells that a message expired: poll the queue's message count.
    eventually("expired messages removed", WAIT, || async {
        (queue_counts(&ch, &q).await.unwrap().0 == 0).then_some(())
    })
    .await;
    assert!(get(&ch, &q, true).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_message_expiration_expires_into_the_dlx_with_original_expiration() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let mut d = dlx(&ch).await;
    let q = source_queue(&ch, &[("x-dead-letter-exchange", string(&d.exchange))]).await;
    let sent = std::time::Instant::now();
    assert!(publish_confirmed(&ch, "", &q, b"short", BasicProperties::default().with_expiration("150".into()))
        .await
        .is_ack());
    let dead = next_delivery(&mut d.consumer).await;
    assert!(sent.elapsed() >= Duration::from_millis(150), "took {:?}", sent.elapsed());
    assert_eq!(text(&dead), "short");
    // The expiration property is removed and recorded in x-death.
    assert_eq!(dead.properties.expiration(), &None);
    let deaths = x_death(&dead);
    check_death(&deaths[0], &q, "expired", "", &[&q], 1);
    assert_eq!(field(&deaths[0], "original-expiration").and_then(as_str).as_deref(), Some("150"));
    assert_eq!(deaths[0].inner().len(), 7, "{:?}", deaths[0]);
    delete_exchange(&ch, &d.exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lower_of_message_and_queue_ttl_applies() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let mut d = dlx(&ch).await;
    let q = source_queue(&ch, &[("x-message-ttl", int(60_000)), ("x-dead-letter-exchange", string(&d.exchange))]).await;
    assert!(publish_confirmed(&ch, "", &q, b"msg-ttl-wins", BasicProperties::default().with_expiration("50".into()))
        .await
        .is_ack());
    let dead = next_delivery_within(&mut d.consumer, Duration::from_secs(5)).await;
    assert_eq!(text(&dead), "msg-ttl-wins");
    check_death(&x_death(&dead)[0], &q, "expired", "", &[&q], 1);
    delete_exchange(&ch, &d.exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_expiration_closes_the_channel_with_406() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let mut ev = events(&conn);
    let q = source_queue(&ch, &[]).await;
    publish(&ch, "", &q, b"x", BasicProperties::default().with_expiration("soon".into())).await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(code, 406);
    assert!(text.starts_with("PRECONDITION_FAILED - invalid expiration 'soon'"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_drop_head_dead_letters_with_reason_maxlen() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let mut d = dlx(&ch).await;
    let q = source_queue(&ch, &[("x-max-length", int(2)), ("x-dead-letter-exchange", string(&d.exchange))]).await;
    fill(&ch, &q, &["1", "2", "3", "4"]).await;
    let dead = take(&mut d.consumer, 2).await;
    assert_eq!(texts(&dead), ["1", "2"]);
    for m in &dead {
        check_death(&x_death(m)[0], &q, "maxlen", "", &[&q], 1);
        check_first_death(m, &q, "maxlen", "");
    }
    assert_eq!(drain(&ch, &q).await, ["3", "4"]);
    delete_exchange(&ch, &d.exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_publish_overflow_does_not_dead_letter() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let mut d = dlx(&ch).await;
    let q = source_queue(
        &ch,
        &[
            ("x-max-length", int(1)),
            ("x-overflow", string("reject-publish")),
            ("x-dead-letter-exchange", string(&d.exchange)),
        ],
    )
    .await;
    assert!(publish_confirmed(&ch, "", &q, b"in", BasicProperties::default()).await.is_ack());
    assert!(publish_confirmed(&ch, "", &q, b"refused", BasicProperties::default()).await.is_nack());
    expect_no_delivery(&mut d.consumer, Duration::from_millis(200)).await;
    delete_exchange(&ch, &d.exchange).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_dead_lettering_counts_per_queue_and_reason() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    // a and b dead-letter into each other through the default exchange.
    let a = unique("ping");
    let b = unique("pong");
    for (q, other) in [(&a, &b), (&b, &a)] {
        declare_queue_with(
            &ch,
            q,
            QueueDeclareOptions { exclusive: true, ..Default::default() },
            table(&[("x-dead-letter-exchange", string("")), ("x-dead-letter-routing-key", string(other))]),
        )
        .await;
    }
    assert!(publish_confirmed(&ch, "", &a, b"ball", BasicProperties::default()).await.is_ack());
    let mut last = None;
    for q in [&a, &b, &a] {
        let m = eventually("dead-lettered message", WAIT, || get(&ch, q, false)).await;
        m.delivery.reject(BasicRejectOptions { requeue: false }).await.unwrap();
        last = Some(q);
    }
    assert_eq!(last, Some(&a));
    let mut c =
        consume(&ch, &b, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let m = next_delivery(&mut c).await;
    let deaths = x_death(&m);
    // One entry per (queue, reason), most recently updated first; counts accumulate.
    assert_eq!(deaths.len(), 2, "{deaths:?}");
    check_death(&deaths[0], &a, "rejected", "", &[&a], 2);
    // routing-keys are those the message had when it died in that queue (here the DLX key).
    check_death(&deaths[1], &b, "rejected", "", &[&b], 1);
    // The first death stays the first.
    check_first_death(&m, &a, "rejected", "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettering_to_a_missing_exchange_drops_the_message() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = source_queue(&ch, &[("x-dead-letter-exchange", string(&unique("no-such-dlx")))]).await;
    fill(&ch, &q, &["gone"]).await;
    get(&ch, &q, false).await.unwrap().delivery.reject(BasicRejectOptions { requeue: false }).await.unwrap();
    assert!(get(&ch, &q, true).await.is_none());
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_delivery_limit_dead_letters_with_reason_delivery_limit() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let mut d = dlx(&ch).await;
    let q = unique("quorum-dl");
    declare_queue_with(
        &ch,
        &q,
        QueueDeclareOptions { durable: true, ..Default::default() },
        table(&[
            ("x-queue-type", string("quorum")),
            ("x-delivery-limit", int(1)),
            ("x-dead-letter-exchange", string(&d.exchange)),
        ]),
    )
    .await;
    assert!(publish_confirmed(&ch, "", &q, b"poison", persistent()).await.is_ack());
    for _ in 0..2 {
        let m = eventually("the poison message", WAIT, || get(&ch, &q, false)).await;
        m.delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.unwrap();
    }
    let dead = next_delivery(&mut d.consumer).await;
    assert_eq!(text(&dead), "poison");
    eprintln!("delivery_limit headers: {:?}", dead.properties.headers());
    check_death(&x_death(&dead)[0], &q, "delivery_limit", "", &[&q], 1);
    check_first_death(&dead, &q, "delivery_limit", "");
    delete_queue(&ch, &q).await;
    delete_exchange(&ch, &d.exchange).await;
}
