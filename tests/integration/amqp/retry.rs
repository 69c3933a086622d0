//! Delayed retries (RabbitMQ 4.3's `x-delayed-retry-type` / `-min` / `-max`, FerryMQ's
//! `x-retry-backoff`), the delivery limit dead-lettering to the DLX or to `%DLQ%{queue}`,
//! and retry timers surviving a crash. FerryMQ-only: skipped against RabbitMQ 3.10.
//!
//! Timing assertions are lower bounds only ("not before due"): the broker's due time is
//! taken after the client sent its nack, so a redelivery observed earlier than the
//! backoff after the nack was sent is a bug whatever the machine's load. Upper bounds are
//! the generous test timeouts.

use std::time::{Duration, Instant, SystemTime};

use crate::common::amqp::*;
use crate::common::Broker;

/// Clock granularity the broker's millisecond due times may round away.
const SLACK: Duration = Duration::from_millis(2);
/// A delay far longer than any test waits: a message given it is "delayed".
const LONG_MS: i32 = 60_000;

fn delivery_count(d: &Delivery) -> Option<i64> {
    field(&headers(&d.properties), "x-delivery-count").and_then(as_i64)
}

async fn nack(d: &Delivery) {
    bounded("basic.nack", d.nack(BasicNackOptions { requeue: true, ..Default::default() })).await.expect("nack");
}

async fn retry_queue(ch: &Channel, prefix: &str, args: &[(&str, AMQPValue)]) -> String {
    let q = unique(prefix);
    declare_queue(ch, &q, table(args)).await;
    q
}

async fn consumer_with_prefetch(ch: &Channel, q: &str, prefetch: u16) -> Consumer {
    bounded("basic.qos", ch.basic_qos(prefetch, BasicQosOptions::default())).await.expect("basic.qos");
    consume(ch, q, BasicConsumeOptions::default(), FieldTable::default()).await
}

/// Nacks the message each time it arrives and checks that every redelivery comes at least
/// `gaps[i]` after the nack before it; returns the `x-delivery-count` values seen.
async fn nack_and_time(c: &mut Consumer, gaps_ms: &[u64]) -> Vec<Option<i64>> {
    let mut d = next_delivery(c).await;
    assert!(!d.redelivered);
    let mut counts = vec![delivery_count(&d)];
    for (i, gap) in gaps_ms.iter().enumerate() {
        let sent = Instant::now();
        nack(&d).await;
        d = next_delivery(c).await;
        let waited = sent.elapsed();
        assert!(
            waited + SLACK >= Duration::from_millis(*gap),
            "retry {} came after {waited:?}, before its {gap} ms backoff",
            i + 1
        );
        assert!(d.redelivered, "a retry is a redelivery");
        counts.push(delivery_count(&d));
    }
    bounded("ack", d.ack(BasicAckOptions::default())).await.expect("ack");
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linear_backoff_spaces_redeliveries_and_counts_them() {
    if skip_on_rabbitmq("x-delayed-retry-* (RabbitMQ 4.3 quorum queues)") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    let args = [
        ("x-delayed-retry-type", string("failed")),
        ("x-delayed-retry-min", int(300)),
        ("x-delayed-retry-max", int(900)),
    ];
    let q = retry_queue(&ch, "linear", &args).await;
    let mut c = consumer_with_prefetch(&ch, &q, 1).await;
    publish(&ch, "", &q, b"flaky", BasicProperties::default()).await;
    // min x 1, min x 2, min x 3 (= max).
    let counts = nack_and_time(&mut c, &[300, 600, 900]).await;
    assert_eq!(counts, [Some(0), Some(1), Some(2), Some(3)], "x-delivery-count: earlier deliveries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_backoff_steps_win_and_the_last_step_repeats() {
    if skip_on_rabbitmq("x-retry-backoff is a FerryMQ extension") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    // The linear form would wait a minute: the steps take precedence, and imply type `all`.
    let args = [("x-retry-backoff", string("200ms, 500ms")), ("x-delayed-retry-min", int(LONG_MS))];
    let q = retry_queue(&ch, "steps", &args).await;
    let mut c = consumer_with_prefetch(&ch, &q, 1).await;
    publish(&ch, "", &q, b"flaky", BasicProperties::default()).await;
    let counts = nack_and_time(&mut c, &[200, 500, 500]).await;
    assert_eq!(counts, [Some(0), Some(1), Some(2), Some(3)]);
}

/// Two messages: one nacked with requeue (failed), one left unacked when its channel
/// closes (returned). Returns the bodies that come back before a fence published after
/// them (requeued entries go back to their own place, before the fence); the others wait
/// a minute.
async fn back_at_once(kind: &str) -> Vec<String> {
    let t = Target::start();
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    let q =
        retry_queue(&ch, kind, &[("x-delayed-retry-type", string(kind)), ("x-delayed-retry-min", int(LONG_MS))]).await;
    for body in ["failed", "returned", "fence"] {
        publish(&ch, "", &q, body.as_bytes(), BasicProperties::default()).await;
    }
    let first = open_channel(&conn).await;
    let mut a = consumer_with_prefetch(&first, &q, 2).await;
    let got = take(&mut a, 2).await;
    assert_eq!(texts(&got), ["failed", "returned"]);
    // No longer consuming, so nothing requeued comes back to this channel.
    bounded("basic.cancel", first.basic_cancel(a.tag(), BasicCancelOptions::default())).await.expect("cancel");
    nack(&got[0]).await;
    bounded("channel.close", first.close(200, "bye".into())).await.expect("close");
    // The nack and the close reached the queue before this consume (one connection, one
    // queue owner): what is not delayed is back in line before the fence.
    let mut b = consumer_with_prefetch(&ch, &q, 10).await;
    let mut back = Vec::new();
    loop {
        let d = next_delivery(&mut b).await;
        if text(&d) == "fence" {
            break;
        }
        assert!(d.redelivered);
        assert_eq!(delivery_count(&d), Some(1));
        back.push(text(&d));
    }
    let (ready, _) = queue_counts(&ch, &q).await.unwrap();
    assert_eq!(ready, 0, "messages waiting for a retry are not counted as ready");
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_type_failed_delays_only_nacked_messages() {
    if skip_on_rabbitmq("x-delayed-retry-type") {
        return;
    }
    assert_eq!(back_at_once("failed").await, ["returned"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_type_returned_delays_only_messages_of_a_closed_channel() {
    if skip_on_rabbitmq("x-delayed-retry-type") {
        return;
    }
    assert_eq!(back_at_once("returned").await, ["failed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_type_all_delays_both() {
    if skip_on_rabbitmq("x-delayed-retry-type") {
        return;
    }
    assert!(back_at_once("all").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_messages_flow_while_one_waits() {
    if skip_on_rabbitmq("x-delayed-retry-type") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    let q = retry_queue(&ch, "flow", &[("x-delayed-retry-min", int(LONG_MS))]).await;
    for body in ["head", "b", "c"] {
        publish(&ch, "", &q, body.as_bytes(), BasicProperties::default()).await;
    }
    let mut c = consumer_with_prefetch(&ch, &q, 10).await;
    let got = take(&mut c, 3).await;
    assert_eq!(texts(&got), ["head", "b", "c"]);
    nack(&got[0]).await;
    for d in &got[1..] {
        bounded("ack", d.ack(BasicAckOptions::default())).await.unwrap();
    }
    publish(&ch, "", &q, b"d", BasicProperties::default()).await;
    let d = next_delivery(&mut c).await;
    assert_eq!((text(&d), d.redelivered), ("d".to_string(), false), "the waiting head does not block the queue");
    assert_eq!(queue_counts(&ch, &q).await.unwrap().0, 0);
}

/// Delivers the single message of `q` limit + 1 times, nacking each (with retries of
/// 50 ms in between).
async fn exhaust(ch: &Channel, q: &str, deliveries: usize) {
    let mut c = consumer_with_prefetch(ch, q, 1).await;
    for i in 0..deliveries {
        let d = next_delivery(&mut c).await;
        assert_eq!(delivery_count(&d), Some(i as i64));
        nack(&d).await;
    }
    expect_no_delivery(&mut c, Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_limit_dead_letters_to_the_dead_letter_exchange() {
    if skip_on_rabbitmq("x-retry-backoff") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    let dlx = unique("dlx");
    declare_exchange(&ch, &dlx, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    let dead = retry_queue(&ch, "dead", &[]).await;
    bind(&ch, &dead, &dlx, "", FieldTable::default()).await;
    let q = retry_queue(
        &ch,
        "limited",
        &[("x-delivery-limit", int(2)), ("x-retry-backoff", string("50ms")), ("x-dead-letter-exchange", string(&dlx))],
    )
    .await;
    publish(&ch, "", &q, b"poison", BasicProperties::default()).await;
    exhaust(&ch, &q, 3).await;
    let mut c =
        consume(&ch, &dead, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "poison");
    let death = x_death(&d).remove(0);
    assert_eq!(str_field(&death, "reason"), "delivery_limit");
    assert_eq!(str_field(&death, "queue"), q);
    assert_eq!(d.routing_key.as_str(), q, "the original routing key is kept");
    assert_eq!(queue_counts(&ch, &q).await.unwrap().0, 0);
    assert!(!queue_exists(&t.connect().await, &format!("%DLQ%{q}")).await, "a DLX set: no %DLQ% queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_limit_without_a_dlx_goes_to_the_dlq_queue() {
    if skip_on_rabbitmq("%DLQ% queues are a FerryMQ extension") {
        return;
    }
    let t = Target::start();
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    let exchange = unique("shop");
    declare_exchange(
        &ch,
        &exchange,
        ExchangeKind::Direct,
        ExchangeDeclareOptions { durable: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    let q = unique("orders");
    let args = table(&[("x-delivery-limit", int(1)), ("x-retry-backoff", string("50ms"))]);
    declare_queue_with(&ch, &q, QueueDeclareOptions { durable: true, ..Default::default() }, args).await;
    bind(&ch, &q, &exchange, "order.created", FieldTable::default()).await;
    confirm_select(&ch).await;
    assert!(publish_confirmed(&ch, &exchange, "order.created", b"poison", persistent()).await.is_ack());
    exhaust(&ch, &q, 2).await;
    let dlq = format!("%DLQ%{q}");
    eventually("the %DLQ% queue is created", WAIT, || async { queue_exists(&conn, &dlq).await.then_some(()) }).await;
    let ch = open_channel(&conn).await;
    let mut c =
        consume(&ch, &dlq, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "poison");
    assert_eq!(
        (d.exchange.as_str(), d.routing_key.as_str()),
        (exchange.as_str(), "order.created"),
        "original routing kept"
    );
    let death = x_death(&d).remove(0);
    assert_eq!(str_field(&death, "reason"), "delivery_limit");
    assert_eq!(str_field(&death, "queue"), q);
    assert_eq!(d.properties.delivery_mode(), &Some(2));
    // Durable like its source queue: a non-durable re-declare is inequivalent.
    let r = bounded(
        "queue.declare",
        ch.queue_declare(dlq.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()),
    )
    .await;
    expect_code(r, 406);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_for_its_retry_survives_a_crash() {
    if skip_on_rabbitmq("kills the broker with SIGKILL") {
        return;
    }
    const DELAY_MS: u64 = 4000;
    let t = Target::ferrymq(Broker::start());
    let q = unique("crash-retry");
    let nacked_at;
    {
        let (_conn, ch) = t.channel().await;
        let args = table(&[("x-delayed-retry-min", int(DELAY_MS as i32))]);
        declare_queue_with(&ch, &q, QueueDeclareOptions { durable: true, ..Default::default() }, args).await;
        confirm_select(&ch).await;
        assert!(publish_confirmed(&ch, "", &q, b"later", persistent()).await.is_ack());
        let mut c = consumer_with_prefetch(&ch, &q, 1).await;
        let d = next_delivery(&mut c).await;
        assert_eq!(text(&d), "later");
        nacked_at = SystemTime::now();
        nack(&d).await;
        // A passive declare is answered after the queue owner wrote what the commands
        // before it did: the retry wait is on disk when this returns.
        assert_eq!(queue_counts(&ch, &q).await.unwrap().0, 0, "waiting, not ready");
    }
    let b = t.broker.expect("FerryMQ target").crash_restart();
    let t = Target::ferrymq(b);
    let (_conn, ch) = t.channel().await;
    let mut c = consumer_with_prefetch(&ch, &q, 1).await;
    let d = next_delivery(&mut c).await;
    let waited = SystemTime::now().duration_since(nacked_at).unwrap();
    assert_eq!(text(&d), "later");
    assert!(
        waited + SLACK >= Duration::from_millis(DELAY_MS),
        "redelivered {waited:?} after the nack, before its backoff"
    );
    assert!(d.redelivered);
    assert_eq!(delivery_count(&d), Some(1), "the delivery count survives the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_retry_arguments_are_refused_with_406() {
    if skip_on_rabbitmq("x-retry-backoff is a FerryMQ extension") {
        return;
    }
    let t = Target::start();
    let conn = t.connect().await;
    let bad: [(&str, AMQPValue); 8] = [
        ("x-delayed-retry-type", string("sometimes")),
        ("x-delayed-retry-min", int(0)),
        ("x-delayed-retry-min", int(-10)),
        ("x-delayed-retry-min", string("soon")),
        ("x-retry-backoff", string("10s,1d")),
        ("x-retry-backoff", string("")),
        ("x-retry-backoff", string("5")),
        ("x-retry-backoff", int(10)),
    ];
    for (key, value) in bad {
        let ch = open_channel(&conn).await;
        let r = bounded(
            "queue.declare",
            ch.queue_declare(
                unique("bad").as_str().into(),
                QueueDeclareOptions::default(),
                table(&[(key, value.clone())]),
            ),
        )
        .await;
        let text = expect_code(r, 406);
        assert!(text.contains(key), "{key}={value:?}: {text}");
    }
    // A type without a delay; a cap below the minimum.
    for args in [
        table(&[("x-delayed-retry-type", string("all"))]),
        table(&[("x-delayed-retry-min", int(500)), ("x-delayed-retry-max", int(100))]),
    ] {
        let ch = open_channel(&conn).await;
        expect_code(
            bounded(
                "queue.declare",
                ch.queue_declare(unique("bad").as_str().into(), QueueDeclareOptions::default(), args),
            )
            .await,
            406,
        );
    }
    // Re-declares must be equivalent.
    let ch = open_channel(&conn).await;
    let q = retry_queue(&ch, "equiv", &[("x-retry-backoff", string("1s,5s"))]).await;
    declare_queue(&ch, &q, table(&[("x-retry-backoff", string("1s,5s"))])).await;
    let r = bounded(
        "queue.declare",
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions::default(),
            table(&[("x-retry-backoff", string("1s"))]),
        ),
    )
    .await;
    let text = expect_code(r, 406);
    assert!(text.contains("inequivalent arg 'x-retry-backoff'"), "{text}");
    // The connection survived every channel error.
    assert!(conn.status().connected());
}
