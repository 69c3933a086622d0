//! Message de-duplication is opt-in, on the rabbitmq-message-deduplication plugin's
//! conventions: message ids are application data (a RabbitMQ application that reuses
//! them loses nothing), an `x-message-deduplication` exchange routes a header value once
//! while it is in its cache, and an `x-message-deduplication` queue refuses a value it
//! already holds. The plugin is not in Debian's RabbitMQ, so only the first test runs
//! against the reference node.

use crate::common::amqp::*;
use crate::common::Broker;

const DEDUP: &str = "x-message-deduplication";

fn keyed(value: &str) -> BasicProperties {
    persistent().with_headers(table(&[("x-deduplication-header", string(value))]))
}

async fn dedup_exchange(ch: &Channel, name: &str, durable: bool, args: &[(&str, AMQPValue)]) {
    declare_exchange(
        ch,
        name,
        ExchangeKind::Custom(DEDUP.into()),
        ExchangeDeclareOptions { durable, ..Default::default() },
        table(args),
    )
    .await;
}

/// A queue bound to `exchange` (durable, so it survives restarts).
async fn bound_queue(ch: &Channel, exchange: &str) -> String {
    let q = unique("dq");
    declare_queue_with(ch, &q, QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default())
        .await;
    bind(ch, &q, exchange, "", FieldTable::default()).await;
    q
}

fn restarted(t: Target) -> Target {
    Target::ferrymq(t.broker.expect("FerryMQ target").restart())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_with_the_same_message_id_are_all_kept() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("orders");
    declare_queue_with(&ch, &q, QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default())
        .await;
    for i in 0..5 {
        let props = persistent().with_message_id("order-42".into());
        let c = publish_confirmed(&ch, "", &q, format!("update {i}").as_bytes(), props).await;
        assert!(c.is_ack(), "publish {i}: {c:?}");
    }
    let bodies = drain(&ch, &q).await;
    assert_eq!(bodies, (0..5).map(|i| format!("update {i}")).collect::<Vec<_>>(), "RabbitMQ keeps all five");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplication_exchange_routes_each_header_value_once() {
    if skip_on_rabbitmq("needs the message-deduplication plugin") {
        return;
    }
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let x = unique("dx");
    dedup_exchange(&ch, &x, false, &[("x-cache-size", int(100))]).await;
    let q = bound_queue(&ch, &x).await;
    for (body, props) in [
        ("a1", keyed("a")),
        ("a2", keyed("a")),
        ("b1", keyed("b")),
        ("a3", keyed("a")),
        ("plain1", persistent()),
        ("plain2", persistent()),
        ("id1", persistent().with_message_id("same".into())),
        ("id2", persistent().with_message_id("same".into())),
    ] {
        let c = publish_confirmed(&ch, &x, "any.key", body.as_bytes(), props).await;
        assert!(c.is_ack(), "{body}: a duplicate is confirmed too: {c:?}");
    }
    assert_eq!(
        drain(&ch, &q).await,
        ["a1", "b1", "plain1", "plain2", "id1", "id2"],
        "the header decides; messages without it and message ids are never compared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_is_not_routed_anywhere_so_mandatory_returns_it() {
    if skip_on_rabbitmq("needs the message-deduplication plugin") {
        return;
    }
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    let x = unique("dx");
    dedup_exchange(&ch, &x, false, &[("x-cache-size", int(10))]).await;
    let q = bound_queue(&ch, &x).await;
    confirm_select(&ch).await;
    let mandatory = BasicPublishOptions { mandatory: true, ..Default::default() };
    let first = publish_opts(&ch, &x, "", mandatory, b"first", keyed("k")).await;
    assert_eq!(bounded("confirm", first).await.unwrap(), Confirmation::Ack(None), "routed");
    let second = publish_opts(&ch, &x, "", mandatory, b"second", keyed("k")).await;
    match bounded("confirm", second).await.unwrap() {
        Confirmation::Ack(Some(returned)) => {
            assert_eq!(&returned.data[..], b"second");
            assert_eq!(returned.reply_code, 312, "NO_ROUTE");
        }
        other => panic!("the duplicate should come back as unroutable: {other:?}"),
    }
    assert_eq!(drain(&ch, &q).await, ["first"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_ttl_comes_from_the_exchange_or_the_message() {
    if skip_on_rabbitmq("needs the message-deduplication plugin") {
        return;
    }
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let x = unique("dx");
    dedup_exchange(&ch, &x, false, &[("x-cache-size", int(100)), ("x-cache-ttl", int(300))]).await;
    let q = bound_queue(&ch, &x).await;
    assert!(publish_confirmed(&ch, &x, "", b"short-1", keyed("short")).await.is_ack());
    assert!(publish_confirmed(&ch, &x, "", b"short-2", keyed("short")).await.is_ack());
    let long =
        keyed("long").with_headers(table(&[("x-deduplication-header", string("long")), ("x-cache-ttl", int(600_000))]));
    assert!(publish_confirmed(&ch, &x, "", b"long-1", long.clone()).await.is_ack());
    assert_eq!(drain(&ch, &q).await, ["short-1", "long-1"], "repeats within the TTL are dropped");

    // Once the exchange's 300 ms pass, "short" is routed again; "long" (its own TTL of
    // ten minutes) is not.
    let mut round = 0;
    eventually("the short value is routed again after its TTL", WAIT, || {
        round += 1;
        let (ch, x, q, long) = (ch.clone(), x.clone(), q.clone(), long.clone());
        async move {
            assert!(publish_confirmed(&ch, &x, "", b"long-again", long).await.is_ack());
            let body = format!("retry-{round}");
            assert!(publish_confirmed(&ch, &x, "", body.as_bytes(), keyed("short")).await.is_ack());
            (queue_counts(&ch, &q).await.map(|c| c.0).unwrap_or(0) > 0).then_some(())
        }
    })
    .await;
    let got = drain(&ch, &q).await;
    assert_eq!(got.len(), 1, "one repeat after the TTL, no long-again: {got:?}");
    assert!(got[0].starts_with("retry-"), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cache_forgets_values_to_make_room() {
    if skip_on_rabbitmq("needs the message-deduplication plugin") {
        return;
    }
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let x = unique("dx");
    dedup_exchange(&ch, &x, false, &[("x-cache-size", int(2))]).await;
    let q = bound_queue(&ch, &x).await;
    for round in 0..2 {
        for v in ["a", "b", "c"] {
            assert!(publish_confirmed(&ch, &x, "", format!("{v}{round}").as_bytes(), keyed(v)).await.is_ack());
        }
    }
    let got = drain(&ch, &q).await;
    assert_eq!(&got[..3], ["a0", "b0", "c0"]);
    assert!(got.len() > 3, "a cache of two cannot hold three values: some repeat is routed: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplication_exchange_arguments_are_checked() {
    if skip_on_rabbitmq("needs the message-deduplication plugin") {
        return;
    }
    let t = Target::start();
    for (args, what) in [
        (vec![], "x-cache-size"),
        (vec![("x-cache-size", int(0))], "x-cache-size"),
        (vec![("x-cache-size", int(5)), ("x-cache-ttl", int(-1))], "x-cache-ttl"),
        (vec![("x-cache-size", int(5)), ("x-cache-persistence", string("ram"))], "x-cache-persistence"),
    ] {
        let (_c, ch) = t.channel().await;
        let r = ch
            .exchange_declare(
                unique("bad").as_str().into(),
                ExchangeKind::Custom(DEDUP.into()),
                ExchangeDeclareOptions::default(),
                table(&args),
            )
            .await;
        let text = expect_code(r, 406);
        assert!(text.contains(what), "{what}: {text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_cache_survives_a_restart_and_a_memory_cache_does_not() {
    if skip_on_rabbitmq("restarts the broker") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let (disk, memory) = (unique("disk"), unique("memory"));
    let (qd, qm);
    {
        let (_c, ch) = t.channel().await;
        confirm_select(&ch).await;
        dedup_exchange(&ch, &disk, true, &[("x-cache-size", int(10)), ("x-cache-persistence", string("disk"))]).await;
        dedup_exchange(&ch, &memory, true, &[("x-cache-size", int(10))]).await;
        qd = bound_queue(&ch, &disk).await;
        qm = bound_queue(&ch, &memory).await;
        for x in [&disk, &memory] {
            assert!(publish_confirmed(&ch, x, "", b"before", keyed("k")).await.is_ack());
        }
    }
    let t = restarted(t);
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    for x in [&disk, &memory] {
        assert!(publish_confirmed(&ch, x, "", b"after", keyed("k")).await.is_ack());
    }
    assert_eq!(drain(&ch, &qd).await, ["before"], "disk: the value is still in the cache");
    assert_eq!(drain(&ch, &qm).await, ["before", "after"], "memory: the cache starts empty");

    // Deleting the exchange forgets its values: the same name declared again starts empty.
    delete_exchange(&ch, &disk).await;
    dedup_exchange(&ch, &disk, true, &[("x-cache-size", int(10)), ("x-cache-persistence", string("disk"))]).await;
    bind(&ch, &qd, &disk, "", FieldTable::default()).await;
    assert!(publish_confirmed(&ch, &disk, "", b"new exchange", keyed("k")).await.is_ack());
    assert_eq!(drain(&ch, &qd).await, ["new exchange"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplicating_queue_refuses_a_value_it_holds_until_it_leaves() {
    if skip_on_rabbitmq("needs the message-deduplication plugin") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let q = unique("dedupq");
    {
        let (_c, ch) = t.channel().await;
        confirm_select(&ch).await;
        let args = table(&[(DEDUP, AMQPValue::Boolean(true))]);
        declare_queue_with(&ch, &q, QueueDeclareOptions { durable: true, ..Default::default() }, args).await;
        for (body, props) in [("a1", keyed("a")), ("a2", keyed("a")), ("b1", keyed("b")), ("plain", persistent())] {
            assert!(publish_confirmed(&ch, "", &q, body.as_bytes(), props).await.is_ack(), "{body}");
        }
        assert_eq!(queue_counts(&ch, &q).await.unwrap().0, 3, "a2 is not enqueued");
        // "a" leaves (acked): the value may come in again.
        let m = get(&ch, &q, false).await.expect("a1");
        assert_eq!(std::str::from_utf8(&m.delivery.data).unwrap(), "a1");
        bounded("ack", m.delivery.ack(BasicAckOptions::default())).await.unwrap();
        assert!(publish_confirmed(&ch, "", &q, b"a3", keyed("a")).await.is_ack());
        assert!(publish_confirmed(&ch, "", &q, b"b2", keyed("b")).await.is_ack());
    }
    // The queue still knows which values it holds after a restart.
    let t = restarted(t);
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    assert!(publish_confirmed(&ch, "", &q, b"a4", keyed("a")).await.is_ack());
    assert!(publish_confirmed(&ch, "", &q, b"c1", keyed("c")).await.is_ack());
    assert_eq!(drain(&ch, &q).await, ["b1", "plain", "a3", "c1"]);
}
