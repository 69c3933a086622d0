//! The `x-consistent-hash` exchange (RabbitMQ plugin convention) and server-side tag
//! filters (`x-tag-filter` on queue.bind, the `x-tag` header), as AMQP clients see them;
//! with single-active-consumer queues for per-key ordering, and across a restart.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::common::amqp::*;
use crate::common::Broker;

const HASH: &str = "x-consistent-hash";

fn hash_kind() -> ExchangeKind {
    ExchangeKind::Custom(HASH.into())
}

fn tagged(tag: &str) -> BasicProperties {
    BasicProperties::default().with_headers(table(&[("x-tag", string(tag))]))
}

fn tag_filter(expr: &str) -> FieldTable {
    table(&[("x-tag-filter", string(expr))])
}

/// Declares a consistent-hash exchange with `args` and `n` exclusive queues bound with
/// `weights`; returns the queue names.
async fn hash_setup(ch: &Channel, x: &str, args: FieldTable, weights: &[&str]) -> Vec<String> {
    declare_exchange(ch, x, hash_kind(), ExchangeDeclareOptions::default(), args).await;
    let mut queues = Vec::new();
    for w in weights {
        let q = declare_queue_with(
            ch,
            "",
            QueueDeclareOptions { exclusive: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
        bind(ch, q.name().as_str(), x, w, FieldTable::default()).await;
        queues.push(q.name().to_string());
    }
    queues
}

/// Drains every queue: body -> the queue (index) that held it, and each queue's bodies.
async fn where_did_they_go(ch: &Channel, queues: &[String]) -> (HashMap<String, usize>, Vec<Vec<String>>) {
    let mut at = HashMap::new();
    let mut per_queue = Vec::new();
    for (i, q) in queues.iter().enumerate() {
        let bodies = drain(ch, q).await;
        for b in &bodies {
            assert!(at.insert(b.clone(), i).is_none(), "{b} reached two queues");
        }
        per_queue.push(bodies);
    }
    (at, per_queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_sends_each_key_to_one_queue_in_order_and_follows_weights() {
    if skip_on_rabbitmq("needs the consistent-hash plugin") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let x = unique("chx");
    let queues = hash_setup(&ch, &x, FieldTable::default(), &["1", "1", "2"]).await;
    // 400 keys, 3 messages each, interleaved.
    for seq in 0..3 {
        for k in 0..400 {
            publish(&ch, &x, &format!("order-{k}"), format!("order-{k}:{seq}").as_bytes(), BasicProperties::default())
                .await;
        }
    }
    bounded("confirms", ch.wait_for_confirms()).await.unwrap();
    let (at, per_queue) = where_did_they_go(&ch, &queues).await;
    assert_eq!(at.len(), 1200, "every message reached exactly one queue");
    for k in 0..400 {
        let q = at[&format!("order-{k}:0")];
        for seq in 1..3 {
            assert_eq!(at[&format!("order-{k}:{seq}")], q, "order-{k} stays on one queue");
        }
        let seqs: Vec<&String> = per_queue[q].iter().filter(|b| b.starts_with(&format!("order-{k}:"))).collect();
        assert_eq!(seqs, [&format!("order-{k}:0"), &format!("order-{k}:1"), &format!("order-{k}:2")], "per-key order");
    }
    // Weights 1:1:2 -> about 300 / 300 / 600 messages.
    let counts: Vec<usize> = per_queue.iter().map(Vec::len).collect();
    for (n, expected) in counts.iter().zip([300.0, 300.0, 600.0]) {
        let ratio = *n as f64 / expected;
        assert!((0.7..1.3).contains(&ratio), "distribution {counts:?} is not about 1:1:2");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_queue_moves_only_some_keys() {
    if skip_on_rabbitmq("needs the consistent-hash plugin") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let x = unique("chx-grow");
    let mut queues = hash_setup(&ch, &x, FieldTable::default(), &["1", "1", "1"]).await;
    let keys = 600;
    let send_all = || {
        let (ch, x) = (ch.clone(), x.clone());
        async move {
            for k in 0..keys {
                publish(&ch, &x, &format!("k{k}"), format!("k{k}").as_bytes(), BasicProperties::default()).await;
            }
            bounded("confirms", ch.wait_for_confirms()).await.unwrap();
        }
    };
    send_all().await;
    let (before, _) = where_did_they_go(&ch, &queues).await;
    let q4 = declare_queue_with(
        &ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    bind(&ch, q4.name().as_str(), &x, "1", FieldTable::default()).await;
    queues.push(q4.name().to_string());
    send_all().await;
    let (after, _) = where_did_they_go(&ch, &queues).await;
    let mut moved = 0;
    for (k, q) in &before {
        if after[k] != *q {
            assert_eq!(after[k], 3, "{k} moved between old queues");
            moved += 1;
        }
    }
    // About 1/4 of the keys move to the new queue, no more.
    assert!((60..=240).contains(&moved), "{moved} of {keys} keys moved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_weights_and_hash_arguments_are_refused_with_406() {
    if skip_on_rabbitmq("needs the consistent-hash plugin") {
        return;
    }
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let x = unique("chx-bad");
    declare_exchange(&ch, &x, hash_kind(), ExchangeDeclareOptions::default(), FieldTable::default()).await;
    let q = declare_queue_with(
        &ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    for (weight, wording) in
        [("abc", "must be an integer"), ("0", "greater than 0"), ("-5", "greater than 0"), ("", "must be an integer")]
    {
        let ch = open_channel(&conn).await;
        let r = bounded(
            "queue.bind",
            ch.queue_bind(
                q.name().as_str().into(),
                x.as_str().into(),
                weight.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await;
        let text = expect_code(r, 406);
        assert!(text.starts_with("PRECONDITION_FAILED") && text.contains(wording), "{weight:?}: {text:?}");
    }
    let cases = [
        (table(&[("hash-header", string("h")), ("hash-property", string("message_id"))]), "mutually exclusive"),
        (table(&[("hash-property", string("app_id"))]), "Unsupported property"),
    ];
    for (args, wording) in cases {
        let ch = open_channel(&conn).await;
        let r = bounded(
            "exchange.declare",
            ch.exchange_declare(
                unique("chx-args").as_str().into(),
                hash_kind(),
                ExchangeDeclareOptions::default(),
                args,
            ),
        )
        .await;
        let text = expect_code(r, 406);
        assert!(text.contains(wording), "{text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_header_and_hash_property_choose_the_queue_and_messages_without_them_are_unroutable() {
    if skip_on_rabbitmq("FerryMQ routes a message without the hashed value nowhere") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let by_header = unique("chx-header");
    let hq = hash_setup(&ch, &by_header, table(&[("hash-header", string("order-id"))]), &["1", "1", "1"]).await;
    let by_id = unique("chx-corr");
    // (Not message_id here: repeating a message_id under confirms is de-duplicated.)
    let pq = hash_setup(&ch, &by_id, table(&[("hash-property", string("correlation_id"))]), &["1", "1", "1"]).await;
    for k in 0..60 {
        for seq in 0..2 {
            // The routing key varies; only the header / message id decides.
            let body = format!("o{k}:{seq}");
            let props = BasicProperties::default().with_headers(table(&[("order-id", string(&format!("o{k}")))]));
            publish(&ch, &by_header, &format!("rk-{seq}-{k}"), body.as_bytes(), props).await;
            let props = BasicProperties::default().with_correlation_id(format!("o{k}").into());
            publish(&ch, &by_id, &format!("rk-{seq}-{k}"), body.as_bytes(), props).await;
        }
    }
    bounded("confirms", ch.wait_for_confirms()).await.unwrap();
    for queues in [&hq, &pq] {
        let (at, per_queue) = where_did_they_go(&ch, queues).await;
        assert_eq!(at.len(), 120);
        for k in 0..60 {
            assert_eq!(at[&format!("o{k}:0")], at[&format!("o{k}:1")], "o{k} on one queue");
        }
        assert!(
            per_queue.iter().all(|q| !q.is_empty()),
            "keys spread: {:?}",
            per_queue.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
    // Without the header / property: not routed (returned when mandatory).
    for x in [&by_header, &by_id] {
        let c = publish_opts(
            &ch,
            x,
            "k",
            BasicPublishOptions { mandatory: true, ..Default::default() },
            b"none",
            BasicProperties::default(),
        )
        .await;
        match bounded("confirm", c).await.unwrap() {
            Confirmation::Ack(Some(returned)) => assert_eq!(returned.reply_code, 312),
            other => panic!("expected a basic.return, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_behind_an_exchange_to_exchange_binding() {
    if skip_on_rabbitmq("needs the consistent-hash plugin") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let front = unique("front");
    let x = unique("chx-e2e");
    declare_exchange(&ch, &front, ExchangeKind::Topic, ExchangeDeclareOptions::default(), FieldTable::default()).await;
    let queues = hash_setup(&ch, &x, FieldTable::default(), &["1", "1"]).await;
    bounded(
        "exchange.bind",
        ch.exchange_bind(
            x.as_str().into(),
            front.as_str().into(),
            "orders.#".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    for k in 0..50 {
        publish(&ch, &front, &format!("orders.{k}"), format!("{k}").as_bytes(), BasicProperties::default()).await;
    }
    publish(&ch, &front, "other.1", b"not-bound", BasicProperties::default()).await;
    bounded("confirms", ch.wait_for_confirms()).await.unwrap();
    let (at, per_queue) = where_did_they_go(&ch, &queues).await;
    assert_eq!(at.len(), 50, "each message once, through the source exchange");
    assert!(per_queue.iter().all(|q| !q.is_empty()));
}

/// Per-key ordering with parallelism: a consistent-hash exchange over single-active-consumer
/// queues, two consumers each; the active ones go away with messages unacked and the next
/// ones continue from the first unacked message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_over_single_active_consumer_queues_keeps_per_key_order() {
    if skip_on_rabbitmq("needs the consistent-hash plugin") {
        return;
    }
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let x = unique("chx-sac");
    declare_exchange(&ch, &x, hash_kind(), ExchangeDeclareOptions::default(), FieldTable::default()).await;
    let sac = table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]);
    let mut queues = Vec::new();
    for i in 0..3 {
        let q = unique(&format!("part{i}"));
        declare_queue(&ch, &q, sac.clone()).await;
        bind(&ch, &q, &x, "1", FieldTable::default()).await;
        queues.push(q);
    }
    let keys = 12;
    let send = |from: u32, to: u32| {
        let (ch, x) = (ch.clone(), x.clone());
        async move {
            for seq in from..to {
                for k in 0..keys {
                    publish(
                        &ch,
                        &x,
                        &format!("key{k}"),
                        format!("key{k}:{seq}").as_bytes(),
                        BasicProperties::default(),
                    )
                    .await;
                }
            }
            bounded("confirms", ch.wait_for_confirms()).await.unwrap();
        }
    };
    send(0, 6).await;
    let mut counts = Vec::new();
    for q in &queues {
        counts.push(queue_counts(&ch, q).await.unwrap().0 as usize);
    }
    assert_eq!(counts.iter().sum::<usize>(), keys * 6);
    // Active consumers on ch1, standbys on ch2.
    let ch1 = open_channel(&conn).await;
    let ch2 = open_channel(&conn).await;
    let mut active = Vec::new();
    let mut standby = Vec::new();
    for q in &queues {
        active.push(consume(&ch1, q, BasicConsumeOptions::default(), FieldTable::default()).await);
        standby.push(consume(&ch2, q, BasicConsumeOptions::default(), FieldTable::default()).await);
    }
    // Per key, what the application processed (acked), in order.
    let mut processed: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut record = |body: &str| {
        let (k, seq) = body.split_once(':').unwrap();
        processed.entry(k.to_owned()).or_default().push(seq.parse().unwrap());
    };
    let mut keys_on = vec![0usize; queues.len()];
    for (i, c) in active.iter_mut().enumerate() {
        let got = take(c, counts[i]).await;
        keys_on[i] = got.iter().filter(|d| text(d).ends_with(":0")).count();
        // Ack the first half only; the rest stays unacked on the active consumer.
        for d in &got[..counts[i] / 2] {
            d.ack(BasicAckOptions::default()).await.unwrap();
            record(&text(d));
        }
    }
    for c in standby.iter_mut() {
        expect_no_delivery(c, Duration::from_millis(200)).await;
    }
    bounded("close", ch1.close(200, "active consumers leave".into())).await.unwrap();
    send(6, 10).await;
    for (i, c) in standby.iter_mut().enumerate() {
        let unacked = counts[i] - counts[i] / 2;
        let got = take(c, unacked).await;
        for d in &got {
            assert!(d.redelivered, "{} was delivered before", text(d));
            d.ack(BasicAckOptions::default()).await.unwrap();
            record(&text(d));
        }
    }
    // The new messages: 4 per key, on the queue that holds the key.
    for (i, c) in standby.iter_mut().enumerate() {
        for d in take(c, keys_on[i] * 4).await {
            assert!(
                !d.redelivered,
                "new message {} delivered as redelivered; processed so far {:?}",
                text(&d),
                processed
            );
            d.ack(BasicAckOptions::default()).await.unwrap();
            record(&text(&d));
        }
    }
    assert_eq!(processed.len(), keys);
    for (k, seqs) in &processed {
        assert_eq!(seqs, &(0..10).collect::<Vec<u32>>(), "{k}: processed out of order or with gaps");
    }
    for q in &queues {
        delete_queue(&ch, q).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_filter_bindings_route_only_matching_tags() {
    if skip_on_rabbitmq("x-tag-filter is a FerryMQ extension") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let x = unique("tags");
    declare_exchange(&ch, &x, ExchangeKind::Direct, ExchangeDeclareOptions::default(), FieldTable::default()).await;
    let mut queues = Vec::new();
    for args in [tag_filter("TagA ||TagB"), tag_filter(" * "), FieldTable::default(), tag_filter("TagC")] {
        let q = declare_queue_with(
            &ch,
            "",
            QueueDeclareOptions { exclusive: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
        bind(&ch, q.name().as_str(), &x, "k", args).await;
        queues.push(q.name().to_string());
    }
    // One routing key, so each publish after the first could come from the route cache.
    let sends = [
        ("untagged", None),
        ("a", Some("TagA")),
        ("b", Some("TagB")),
        ("c", Some("TagC")),
        ("lower", Some("taga")),
        ("a2", Some("TagA")),
    ];
    for (body, tag) in sends {
        let props = tag.map(tagged).unwrap_or_default();
        publish(&ch, &x, "k", body.as_bytes(), props).await;
    }
    bounded("confirms", ch.wait_for_confirms()).await.unwrap();
    assert_eq!(drain(&ch, &queues[0]).await, ["a", "b", "a2"], "TagA || TagB (exact, case-sensitive)");
    assert_eq!(
        drain(&ch, &queues[1]).await,
        ["untagged", "a", "b", "c", "lower", "a2"],
        "* matches tagged and untagged"
    );
    assert_eq!(drain(&ch, &queues[2]).await, ["untagged", "a", "b", "c", "lower", "a2"], "no filter");
    assert_eq!(drain(&ch, &queues[3]).await, ["c"]);
    // The tag header reaches the consumer unchanged.
    publish(&ch, &x, "k", b"t", tagged("TagC")).await;
    bounded("confirms", ch.wait_for_confirms()).await.unwrap();
    let m = get(&ch, &queues[3], true).await.expect("tagged message");
    assert_eq!(field(&headers(&m.delivery.properties), "x-tag").and_then(as_str).as_deref(), Some("TagC"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_tag_filters_are_refused_with_406() {
    if skip_on_rabbitmq("x-tag-filter is a FerryMQ extension") {
        return;
    }
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let q = declare_queue_with(
        &ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    for expr in ["", "   ", "A ||", "|| A", "A || || B", "* || A"] {
        let ch = open_channel(&conn).await;
        let r = bounded(
            "queue.bind",
            ch.queue_bind(
                q.name().as_str().into(),
                "amq.direct".into(),
                "k".into(),
                QueueBindOptions::default(),
                tag_filter(expr),
            ),
        )
        .await;
        let text = expect_code(r, 406);
        assert!(text.starts_with("PRECONDITION_FAILED - invalid arg 'x-tag-filter'"), "{expr:?}: {text:?}");
    }
    let ch = open_channel(&conn).await;
    let bind = ch.queue_bind(
        q.name().as_str().into(),
        "amq.direct".into(),
        "k".into(),
        QueueBindOptions::default(),
        table(&[("x-tag-filter", int(1))]),
    );
    let r = bounded("queue.bind", bind).await;
    expect_code(r, 406);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_exchange_and_tag_filter_bindings_survive_a_restart() {
    if skip_on_rabbitmq("restarts the broker") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let x = "orders-by-key";
    let queues = ["part-a", "part-b", "part-c"];
    let keys: Vec<String> = (0..60).map(|k| format!("customer-{k}")).collect();
    let before = {
        let (conn, ch) = t.channel().await;
        confirm_select(&ch).await;
        declare_exchange(
            &ch,
            x,
            hash_kind(),
            ExchangeDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
        for (q, w) in queues.iter().zip(["1", "2", "1"]) {
            declare_queue_with(&ch, q, durable, FieldTable::default()).await;
            bind(&ch, q, x, w, FieldTable::default()).await;
        }
        declare_queue_with(&ch, "urgent", durable, FieldTable::default()).await;
        bind(&ch, "urgent", "amq.topic", "alerts.#", tag_filter("urgent || critical")).await;
        for k in &keys {
            assert!(publish_confirmed(&ch, x, k, k.as_bytes(), persistent()).await.is_ack());
        }
        let (at, _) = where_did_they_go(&ch, &queues.map(String::from)).await;
        bounded("close", conn.close(200, "bye".into())).await.unwrap();
        at
    };
    let t = Target::ferrymq(t.broker.expect("FerryMQ").restart());
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    for k in &keys {
        assert!(publish_confirmed(&ch, x, k, k.as_bytes(), persistent()).await.is_ack());
    }
    let (after, _) = where_did_they_go(&ch, &queues.map(String::from)).await;
    assert_eq!(after, before, "every key reaches the same queue after the restart");
    for (body, tag) in [("u", "urgent"), ("n", "normal"), ("c", "critical")] {
        assert!(publish_confirmed(&ch, "amq.topic", "alerts.disk", body.as_bytes(), tagged(tag)).await.is_ack());
    }
    assert_eq!(drain(&ch, "urgent").await, ["u", "c"], "the tag filter survived");
}
