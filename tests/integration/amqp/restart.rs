//! FerryMQ-only: what survives a clean restart and a crash (SIGKILL) for AMQP clients.
//! Skipped against RabbitMQ (the harness cannot restart the reference node).

use crate::common::amqp::*;
use crate::common::Broker;

fn restarted(t: Target, crash: bool) -> Target {
    let b = t.broker.expect("FerryMQ target");
    Target::ferrymq(if crash { b.crash_restart() } else { b.restart() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_topology_and_persistent_messages_survive_a_clean_restart() {
    if skip_on_rabbitmq("restarts the broker") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    {
        let (conn, ch) = t.channel().await;
        confirm_select(&ch).await;
        declare_exchange(
            &ch,
            "orders",
            ExchangeKind::Topic,
            ExchangeDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
        declare_exchange(
            &ch,
            "scratch",
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await;
        declare_queue_with(
            &ch,
            "kept",
            QueueDeclareOptions { durable: true, ..Default::default() },
            table(&[("x-max-length", int(100))]),
        )
        .await;
        declare_queue_with(&ch, "transient-queue", QueueDeclareOptions::default(), FieldTable::default()).await;
        bind(&ch, "kept", "orders", "order.*", FieldTable::default()).await;
        for (body, props) in [("p1", persistent()), ("t1", BasicProperties::default()), ("p2", persistent())] {
            assert!(publish_confirmed(&ch, "orders", "order.new", body.as_bytes(), props).await.is_ack());
        }
        assert!(publish_confirmed(&ch, "", "transient-queue", b"x", persistent()).await.is_ack());
        bounded("close", conn.close(200, "bye".into())).await.unwrap();
    }
    let t = restarted(t, false);
    let (conn, ch) = t.channel().await;
    assert!(exchange_exists(&conn, "orders").await, "durable exchange");
    assert!(!exchange_exists(&conn, "scratch").await, "transient exchange gone");
    assert!(!queue_exists(&conn, "transient-queue").await, "non-durable queue gone");
    // Only the persistent messages, in order, not marked redelivered (never delivered).
    let mut got = Vec::new();
    while let Some(m) = get(&ch, "kept", true).await {
        got.push((String::from_utf8(m.delivery.data).unwrap(), m.delivery.properties.delivery_mode().unwrap_or(1)));
    }
    assert_eq!(got, [("p1".to_string(), 2), ("p2".to_string(), 2)]);
    // The binding and the queue arguments survived too.
    confirm_select(&ch).await;
    assert!(publish_confirmed(&ch, "orders", "order.paid", b"after", BasicProperties::default()).await.is_ack());
    assert_eq!(drain(&ch, "kept").await, ["after"]);
    let r = ch
        .queue_declare(
            "kept".into(),
            QueueDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
    expect_code(r, 406); // x-max-length is still set: redeclaring without it is inequivalent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_persistent_messages_survive_a_crash() {
    if skip_on_rabbitmq("kills the broker with SIGKILL") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let bodies: Vec<String> = (0..300).map(|i| format!("m{i:03}")).collect();
    {
        let (_conn, ch) = t.channel().await;
        confirm_select(&ch).await;
        declare_queue_with(
            &ch,
            "crashy",
            QueueDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
        let mut pending = Vec::new();
        for b in &bodies {
            pending.push(
                publish_opts(&ch, "", "crashy", BasicPublishOptions::default(), b.as_bytes(), persistent()).await,
            );
        }
        for c in pending {
            assert!(bounded("confirm", c).await.unwrap().is_ack());
        }
        // Killed with the connection still open, right after the last confirm.
    }
    let t = restarted(t, true);
    let (_conn, ch) = t.channel().await;
    assert_eq!(drain(&ch, "crashy").await, bodies);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_persistent_messages_are_redelivered_after_a_crash() {
    if skip_on_rabbitmq("kills the broker with SIGKILL") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    {
        let (_conn, ch) = t.channel().await;
        confirm_select(&ch).await;
        declare_queue_with(
            &ch,
            "inflight",
            QueueDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
        for b in ["a", "b", "c"] {
            assert!(publish_confirmed(&ch, "", "inflight", b.as_bytes(), persistent()).await.is_ack());
        }
        let mut c = consume(&ch, "inflight", BasicConsumeOptions::default(), FieldTable::default()).await;
        let got = take(&mut c, 3).await;
        // "a" acked (the ack is synchronous only through a round trip: a passive declare).
        got[0].ack(BasicAckOptions::default()).await.unwrap();
        queue_counts(&ch, "inflight").await.unwrap();
    }
    let t = restarted(t, true);
    let (_conn, ch) = t.channel().await;
    // At least once: the unacked "b" and "c" are back, in order; the acked "a" may come back
    // only if the crash beat its ack to disk.
    let got = drain(&ch, "inflight").await;
    assert!(got == ["b", "c"] || got == ["a", "b", "c"], "after the crash: {got:?}");
}

/// Dead-lettering moves a message from its queue to the dead-letter queue in one journal
/// submission: a crash in the middle of mass rejections leaves every message in one of the
/// two queues (at least once), none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_messages_are_in_the_source_or_the_dead_letter_queue_after_a_crash() {
    if skip_on_rabbitmq("kills the broker with SIGKILL") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let bodies: Vec<String> = (0..400).map(|i| format!("m{i:03}")).collect();
    {
        let (_conn, ch) = t.channel().await;
        confirm_select(&ch).await;
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        declare_queue_with(&ch, "dlx-target", durable, FieldTable::default()).await;
        declare_queue_with(
            &ch,
            "dlx-source",
            durable,
            table(&[("x-dead-letter-exchange", string("")), ("x-dead-letter-routing-key", string("dlx-target"))]),
        )
        .await;
        for b in &bodies {
            publish(&ch, "", "dlx-source", b.as_bytes(), persistent()).await;
        }
        bounded("confirms", ch.wait_for_confirms()).await.unwrap();
        bounded("basic.qos", ch.basic_qos(1000, BasicQosOptions::default())).await.unwrap();
        let mut c = consume(&ch, "dlx-source", BasicConsumeOptions::default(), FieldTable::default()).await;
        for d in take(&mut c, bodies.len()).await {
            d.reject(BasicRejectOptions { requeue: false }).await.unwrap();
        }
        // Killed while the rejections are being dead-lettered.
    }
    let t = Target::ferrymq(t.broker.unwrap().crash_restart());
    let (_conn, ch) = t.channel().await;
    let mut seen = drain(&ch, "dlx-target").await;
    seen.extend(drain(&ch, "dlx-source").await);
    seen.sort();
    seen.dedup();
    assert_eq!(seen, bodies, "every message is in the source queue or the dead-letter queue");
}
