//! AMQP queues: naming, exclusivity, auto-delete, passive declares and counts, bindings,
//! purge and delete, and the queue arguments (expires, max-length with overflow modes,
//! max-length-bytes, priorities, single active consumer, queue types, delivery limit).

use std::time::Duration;

use crate::common::amqp::*;

fn exclusive() -> QueueDeclareOptions {
    QueueDeclareOptions { exclusive: true, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_named_queue_gets_an_amq_gen_name() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    let a = declare_queue_with(&ch, "", exclusive(), FieldTable::default()).await;
    let b = declare_queue_with(&ch, "", exclusive(), FieldTable::default()).await;
    assert!(a.name().as_str().starts_with("amq.gen-"), "{:?}", a.name());
    assert_ne!(a.name(), b.name());
    assert_eq!((a.message_count(), a.consumer_count()), (0, 0));
    // The default exchange routes to it by that name.
    confirm_select(&ch).await;
    publish_confirmed(&ch, "", a.name().as_str(), b"hi", BasicProperties::default()).await;
    assert_eq!(drain(&ch, a.name().as_str()).await, ["hi"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amq_prefix_is_reserved_for_queue_names() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    let name = unique("amq.mine");
    let r = ch.queue_declare(name.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await;
    let text = expect_code(r, 403);
    assert!(
        text.starts_with("ACCESS_REFUSED - queue name '") && text.contains("contains reserved prefix 'amq.*'"),
        "{text:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_queue_is_locked_to_its_connection_with_405() {
    let t = Target::start();
    let (_owner, ch) = t.channel().await;
    let q = unique("excl");
    declare_queue_with(&ch, &q, exclusive(), FieldTable::default()).await;
    // Same connection, another channel: usable.
    let (other, och) = t.channel().await;
    let r = och.queue_declare(q.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await;
    let text = expect_code(r, 405);
    assert!(
        text.starts_with(&format!(
            "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'"
        )),
        "{text:?}"
    );
    let och = open_channel(&other).await;
    let r = och
        .queue_declare(
            q.as_str().into(),
            QueueDeclareOptions { passive: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
    expect_code(r, 405);
    let och = open_channel(&other).await;
    let r =
        och.basic_consume(q.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default()).await;
    expect_code(r, 405);
    let och = open_channel(&other).await;
    let r = och.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await;
    expect_code(r, 405);
    // Publishing to it from elsewhere is allowed.
    let och = open_channel(&other).await;
    confirm_select(&och).await;
    assert!(publish_confirmed(&och, "", &q, b"from-other", BasicProperties::default()).await.is_ack());
    assert_eq!(drain(&ch, &q).await, ["from-other"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_queue_is_deleted_when_its_connection_closes() {
    let t = Target::start();
    let (owner, ch) = t.channel().await;
    let q = unique("excl-gone");
    declare_queue_with(&ch, &q, exclusive(), FieldTable::default()).await;
    let observer = t.connect().await;
    let r = queue_counts(&open_channel(&observer).await, &q).await;
    expect_code(r, 405);
    bounded("close", owner.close(200, "bye".into())).await.unwrap();
    eventually("exclusive queue deleted", WAIT, || async { (!queue_exists(&observer, &q).await).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_delete_queue_goes_after_its_last_consumer_cancels() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let q = unique("autodel");
    declare_queue_with(&ch, &q, QueueDeclareOptions { auto_delete: true, ..Default::default() }, FieldTable::default())
        .await;
    // No consumer yet: it stays.
    assert!(queue_exists(&conn, &q).await);
    let c1 = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let c2 = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    assert_eq!(queue_counts(&ch, &q).await.unwrap().1, 2);
    bounded("cancel", ch.basic_cancel(c1.tag(), BasicCancelOptions::default())).await.unwrap();
    assert!(queue_exists(&conn, &q).await, "one consumer left");
    bounded("cancel", ch.basic_cancel(c2.tag(), BasicCancelOptions::default())).await.unwrap();
    // Gone by Cancel-Ok, as in RabbitMQ (aio-pika's RPC unbinds it right after).
    assert!(!queue_exists(&conn, &q).await, "deleted before cancel-ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_declare_of_a_missing_queue_closes_the_channel_with_404() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let q = unique("missing");
    let text = expect_code(queue_counts(&ch, &q).await, 404);
    assert_eq!(text, format!("NOT_FOUND - no queue '{q}' in vhost '/'"));
    assert!(!ch.status().connected());
    assert!(conn.status().connected(), "only the channel is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_ok_reports_message_and_consumer_counts() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    let q = unique("counts");
    declare_queue_with(&ch, &q, exclusive(), FieldTable::default()).await;
    confirm_select(&ch).await;
    fill(&ch, &q, &["1", "2", "3"]).await;
    let again = declare_queue_with(&ch, &q, exclusive(), FieldTable::default()).await;
    assert_eq!((again.message_count(), again.consumer_count()), (3, 0));
    let ch2 = open_channel(&_c).await;
    bounded("qos", ch2.basic_qos(1, BasicQosOptions::default())).await.unwrap();
    let mut c = consume(&ch2, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let d = next_delivery(&mut c).await;
    // One unacked delivery is not counted as ready.
    eventually("counts settle", WAIT, || async { (queue_counts(&ch, &q).await.unwrap() == (2, 1)).then_some(()) })
        .await;
    d.ack(BasicAckOptions::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclaring_a_queue_with_other_properties_fails_with_406() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let q = unique("redeclare");
    declare_queue(&ch, &q, table(&[("x-max-length", int(10))])).await;
    let r =
        ch.queue_declare(q.as_str().into(), QueueDeclareOptions::default(), table(&[("x-max-length", int(11))])).await;
    let text = expect_code(r, 406);
    assert_eq!(
        text,
        format!(
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': \
             received '11' but current is '10'"
        )
    );
    let ch = open_channel(&conn).await;
    let r = ch
        .queue_declare(
            q.as_str().into(),
            QueueDeclareOptions { durable: true, ..Default::default() },
            table(&[("x-max-length", int(10))]),
        )
        .await;
    let text = expect_code(r, 406);
    assert_eq!(
        text,
        format!(
            "PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{q}' in vhost '/': \
             received 'true' but current is 'false'"
        )
    );
    let ch = open_channel(&conn).await;
    delete_queue(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_and_unbind_control_routing() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = declare_queue_with(&ch, "", exclusive(), FieldTable::default()).await.name().to_string();
    bind(&ch, &q, "amq.direct", "k1", FieldTable::default()).await;
    bind(&ch, &q, "amq.direct", "k2", FieldTable::default()).await;
    // Binding twice is idempotent (one copy per message).
    bind(&ch, &q, "amq.direct", "k1", FieldTable::default()).await;
    publish_confirmed(&ch, "amq.direct", "k1", b"a", BasicProperties::default()).await;
    publish_confirmed(&ch, "amq.direct", "k2", b"b", BasicProperties::default()).await;
    bounded("unbind", ch.queue_unbind(q.as_str().into(), "amq.direct".into(), "k1".into(), FieldTable::default()))
        .await
        .unwrap();
    publish_confirmed(&ch, "amq.direct", "k1", b"c", BasicProperties::default()).await;
    publish_confirmed(&ch, "amq.direct", "k2", b"d", BasicProperties::default()).await;
    // Unbinding something that is not bound is fine.
    bounded("unbind", ch.queue_unbind(q.as_str().into(), "amq.direct".into(), "never".into(), FieldTable::default()))
        .await
        .unwrap();
    assert_eq!(drain(&ch, &q).await, ["a", "b", "d"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_returns_the_number_of_ready_messages() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = declare_queue_with(&ch, "", exclusive(), FieldTable::default()).await.name().to_string();
    fill(&ch, &q, &["1", "2", "3", "4"]).await;
    // One delivered and unacked: not purged.
    let held = get(&ch, &q, false).await.unwrap();
    let n = bounded("purge", ch.queue_purge(q.as_str().into(), QueuePurgeOptions::default())).await.unwrap();
    assert_eq!(n, 3);
    assert_eq!(queue_counts(&ch, &q).await.unwrap().0, 0);
    // The unacked one comes back on reject with requeue.
    held.delivery.reject(BasicRejectOptions { requeue: true }).await.unwrap();
    assert_eq!(drain(&ch, &q).await, ["1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_if_unused_and_if_empty_fail_with_406_when_violated() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("del-if");
    declare_queue(&ch, &q, FieldTable::default()).await;
    fill(&ch, &q, &["x"]).await;
    let r = ch.queue_delete(q.as_str().into(), QueueDeleteOptions { if_empty: true, ..Default::default() }).await;
    let text = expect_code(r, 406);
    assert_eq!(text, format!("PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty"));
    let ch = open_channel(&conn).await;
    let c = consume(&ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let ch2 = open_channel(&conn).await;
    let r = ch2.queue_delete(q.as_str().into(), QueueDeleteOptions { if_unused: true, ..Default::default() }).await;
    let text = expect_code(r, 406);
    assert_eq!(text, format!("PRECONDITION_FAILED - queue '{q}' in vhost '/' in use"));
    drop(c);
    bounded("delete", ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())).await.unwrap();
    assert!(!queue_exists(&conn, &q).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_returns_the_message_count_and_missing_queue_delete_is_ok() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("del-count");
    declare_queue(&ch, &q, FieldTable::default()).await;
    fill(&ch, &q, &["a", "b", "c"]).await;
    let n = bounded("delete", ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())).await.unwrap();
    assert_eq!(n, 3);
    assert!(!queue_exists(&conn, &q).await);
    let n = bounded("delete", ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()))
        .await
        .expect("delete of a missing queue");
    assert_eq!(n, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_with_x_expires_is_deleted_when_unused() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let used = unique("expires-used");
    let unused = unique("expires-unused");
    declare_queue(&ch, &unused, table(&[("x-expires", int(300))])).await;
    declare_queue(&ch, &used, table(&[("x-expires", int(300))])).await;
    let _c = consume(&ch, &used, BasicConsumeOptions::default(), FieldTable::default()).await;
    // Polled less often than x-expires: a passive declare counts as use and renews the lease.
    eventually_every("unused queue expired", WAIT, Duration::from_millis(500), || async {
        (!queue_exists(&conn, &unused).await).then_some(())
    })
    .await;
    assert!(queue_exists(&conn, &used).await, "a queue with a consumer does not expire");
    delete_queue(&ch, &used).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_queue_arguments_fail_with_406() {
    let t = Target::start();
    let conn = t.connect().await;
    for (arg, value) in [
        ("x-max-length", int(-1)),
        ("x-message-ttl", int(-1)),
        ("x-expires", int(0)),
        ("x-overflow", string("no-such-mode")),
        ("x-max-priority", string("high")),
    ] {
        let ch = open_channel(&conn).await;
        let r = ch
            .queue_declare(unique("bad-arg").as_str().into(), QueueDeclareOptions::default(), table(&[(arg, value)]))
            .await;
        let text = expect_code(r, 406);
        assert!(text.starts_with("PRECONDITION_FAILED - invalid arg '") && text.contains(arg), "{arg}: {text:?}");
        assert!(conn.status().connected());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_drop_head_discards_the_oldest() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = declare_queue_with(&ch, "", exclusive(), table(&[("x-max-length", int(3))])).await.name().to_string();
    for i in 1..=5 {
        let c = publish_confirmed(&ch, "", &q, format!("m{i}").as_bytes(), BasicProperties::default()).await;
        assert!(c.is_ack(), "drop-head still acks: {c:?}");
    }
    assert_eq!(drain(&ch, &q).await, ["m3", "m4", "m5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_reject_publish_nacks_the_new_message() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = declare_queue_with(
        &ch,
        "",
        exclusive(),
        table(&[("x-max-length", int(2)), ("x-overflow", string("reject-publish"))]),
    )
    .await
    .name()
    .to_string();
    let mut results = Vec::new();
    for i in 1..=4 {
        results.push(
            publish_confirmed(&ch, "", &q, format!("m{i}").as_bytes(), BasicProperties::default()).await.is_ack(),
        );
    }
    assert_eq!(results, [true, true, false, false]);
    assert_eq!(drain(&ch, &q).await, ["m1", "m2"]);
    // Room again: accepted.
    assert!(publish_confirmed(&ch, "", &q, b"m5", BasicProperties::default()).await.is_ack());
    assert_eq!(drain(&ch, &q).await, ["m5"]);
}

/// A basic.get-ok tells the client the message left the queue: a publish right after it
/// finds the room (the queue's occupancy is updated before the answer, not at the end of
/// the owner's turn; pika's interop test saw a nack here under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_reject_publish_queue_has_room_as_soon_as_get_ok_arrives() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let args = table(&[("x-max-length", int(1)), ("x-overflow", string("reject-publish"))]);
    let q = declare_queue_with(&ch, "", exclusive(), args).await.name().to_string();
    assert!(publish_confirmed(&ch, "", &q, b"m0", BasicProperties::default()).await.is_ack());
    for i in 1..=50 {
        assert!(get(&ch, &q, true).await.is_some(), "round {i}: the message is there");
        let body = format!("m{i}");
        let ack = publish_confirmed(&ch, "", &q, body.as_bytes(), BasicProperties::default()).await.is_ack();
        assert!(ack, "round {i}: the room freed by basic.get-ok is there");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_bytes_counts_body_bytes() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q =
        declare_queue_with(&ch, "", exclusive(), table(&[("x-max-length-bytes", int(10))])).await.name().to_string();
    for body in ["aaaa", "bbbb", "cccc"] {
        assert!(publish_confirmed(&ch, "", &q, body.as_bytes(), BasicProperties::default()).await.is_ack());
    }
    // 12 bytes > 10: the oldest is dropped.
    assert_eq!(drain(&ch, &q).await, ["bbbb", "cccc"]);
    let q2 = declare_queue_with(
        &ch,
        "",
        exclusive(),
        table(&[("x-max-length-bytes", int(10)), ("x-overflow", string("reject-publish"))]),
    )
    .await
    .name()
    .to_string();
    let acks: Vec<bool> = {
        let mut v = Vec::new();
        for body in ["aaaa", "bbbb", "cccc", "d"] {
            v.push(publish_confirmed(&ch, "", &q2, body.as_bytes(), BasicProperties::default()).await.is_ack());
        }
        v
    };
    assert_eq!(acks, [true, true, false, true]);
    assert_eq!(drain(&ch, &q2).await, ["aaaa", "bbbb", "d"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_queue_delivers_higher_priority_first() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = declare_queue_with(&ch, "", exclusive(), table(&[("x-max-priority", int(5))])).await.name().to_string();
    for (body, prio) in [
        ("low", Some(1)),
        ("none", None),
        ("high", Some(5)),
        ("mid", Some(3)),
        ("above-max", Some(9)),
        ("high2", Some(5)),
    ] {
        let mut props = BasicProperties::default();
        if let Some(p) = prio {
            props = props.with_priority(p);
        }
        assert!(publish_confirmed(&ch, "", &q, body.as_bytes(), props).await.is_ack());
    }
    // Priorities above the maximum count as the maximum; no priority counts as 0; FIFO within one priority.
    assert_eq!(drain(&ch, &q).await, ["high", "above-max", "high2", "mid", "low", "none"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_active_consumer_delivers_to_one_until_it_cancels() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("sac");
    declare_queue(&ch, &q, table(&[("x-single-active-consumer", AMQPValue::Boolean(true))])).await;
    let ch1 = open_channel(&conn).await;
    let ch2 = open_channel(&conn).await;
    let mut first =
        consume(&ch1, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let mut second =
        consume(&ch2, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    fill(&ch, &q, &["1", "2", "3", "4"]).await;
    assert_eq!(texts(&take(&mut first, 4).await), ["1", "2", "3", "4"]);
    expect_no_delivery(&mut second, Duration::from_millis(300)).await;
    bounded("cancel", ch1.basic_cancel(first.tag(), BasicCancelOptions::default())).await.unwrap();
    fill(&ch, &q, &["5", "6"]).await;
    assert_eq!(texts(&take(&mut second, 2).await), ["5", "6"]);
    delete_queue(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_active_consumer_hands_unacked_messages_to_the_next() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("sac-handover");
    declare_queue(&ch, &q, table(&[("x-single-active-consumer", AMQPValue::Boolean(true))])).await;
    let ch1 = open_channel(&conn).await;
    let ch2 = open_channel(&conn).await;
    let mut first = consume(&ch1, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let mut second = consume(&ch2, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    fill(&ch, &q, &["a", "b"]).await;
    let got = take(&mut first, 2).await;
    assert_eq!(texts(&got), ["a", "b"]);
    got[0].ack(BasicAckOptions::default()).await.unwrap();
    // Closing the active consumer's channel requeues "b" to the next consumer.
    bounded("close", ch1.close(200, "bye".into())).await.unwrap();
    let d = next_delivery(&mut second).await;
    assert_eq!(text(&d), "b");
    assert!(d.redelivered);
    d.ack(BasicAckOptions::default()).await.unwrap();
    delete_queue(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_and_quorum_queue_types_are_accepted() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let classic = unique("classic");
    declare_queue(&ch, &classic, table(&[("x-queue-type", string("classic"))])).await;
    let quorum = unique("quorum");
    declare_queue_with(
        &ch,
        &quorum,
        QueueDeclareOptions { durable: true, ..Default::default() },
        table(&[("x-queue-type", string("quorum"))]),
    )
    .await;
    for q in [&classic, &quorum] {
        assert!(publish_confirmed(&ch, "", q, b"typed", persistent()).await.is_ack());
        assert_eq!(drain(&ch, q).await, ["typed"], "{q}");
    }
    // Redeclaring with another type is a 406.
    let r = ch
        .queue_declare(
            classic.as_str().into(),
            QueueDeclareOptions::default(),
            table(&[("x-queue-type", string("quorum"))]),
        )
        .await;
    let text = expect_code(r, 406);
    assert!(text.starts_with("PRECONDITION_FAILED - inequivalent arg 'x-queue-type'"), "{text:?}");
    let ch = open_channel(&conn).await;
    delete_queue(&ch, &classic).await;
    delete_queue(&ch, &quorum).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queues_must_be_durable_and_not_exclusive() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let q = unique("quorum-transient");
    let r = ch
        .queue_declare(q.as_str().into(), QueueDeclareOptions::default(), table(&[("x-queue-type", string("quorum"))]))
        .await;
    let text = expect_code(r, 406);
    assert_eq!(text, format!("PRECONDITION_FAILED - invalid property 'non-durable' for queue '{q}' in vhost '/'"));
    let ch = open_channel(&conn).await;
    let q = unique("quorum-exclusive");
    let r = ch
        .queue_declare(
            q.as_str().into(),
            QueueDeclareOptions { durable: true, exclusive: true, ..Default::default() },
            table(&[("x-queue-type", string("quorum"))]),
        )
        .await;
    let text = expect_code(r, 406);
    assert_eq!(text, format!("PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queue_delivery_limit_drops_after_the_limit() {
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("quorum-limit");
    declare_queue_with(
        &ch,
        &q,
        QueueDeclareOptions { durable: true, ..Default::default() },
        table(&[("x-queue-type", string("quorum")), ("x-delivery-limit", int(2))]),
    )
    .await;
    delivery_limit_drops_after_the_limit(&ch, &q).await;
    delete_queue(&ch, &q).await;
}

/// With x-delivery-limit = 2, a message is delivered 3 times, each carrying
/// `x-delivery-count` (0 on the first delivery, as RabbitMQ's quorum queues write it, then
/// 1 and 2), and gone from the queue on the third requeue (dropped by RabbitMQ; moved to
/// `%DLQ%{queue}` by FerryMQ, see tests/integration/amqp/retry.rs).
async fn delivery_limit_drops_after_the_limit(ch: &Channel, q: &str) {
    assert!(publish_confirmed(ch, "", q, b"poison", persistent()).await.is_ack());
    let mut counts = Vec::new();
    for _ in 0..3 {
        let m = eventually("the message, again", WAIT, || get(ch, q, false)).await;
        counts.push((
            m.delivery.redelivered,
            field(&headers(&m.delivery.properties), "x-delivery-count").and_then(as_i64),
        ));
        m.delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.unwrap();
    }
    assert_eq!(counts, [(false, Some(0)), (true, Some(1)), (true, Some(2))]);
    // Dropped: the queue is empty.
    eventually("message dropped after the limit", WAIT, || async {
        (queue_counts(ch, q).await.unwrap().0 == 0).then_some(())
    })
    .await;
    assert!(get(ch, q, true).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_queue_delivery_limit_is_a_ferrymq_extension() {
    if skip_on_rabbitmq("x-delivery-limit on classic queues (RabbitMQ 3.10 supports it on quorum queues only)") {
        return;
    }
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("classic-limit");
    declare_queue(&ch, &q, table(&[("x-delivery-limit", int(2))])).await;
    delivery_limit_drops_after_the_limit(&ch, &q).await;
}

/// kombu's `Queue(max_length=2)` test, as RabbitMQ orders it: a consumer's basic.consume
/// takes what is ready before a publish sent after consume-ok is appended, so that publish
/// does not push a message out of the full queue first (a CI race seen once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_ready_at_consume_go_to_the_consumer_before_a_later_publish_overflows() {
    let t = Target::start();
    let (_conn, ch) = t.channel().await;
    let q = unique("max2");
    declare_queue(&ch, &q, table(&[("x-max-length", int(2))])).await;
    confirm_select(&ch).await;
    for body in ["0", "1", "2"] {
        publish_confirmed(&ch, "", &q, body.as_bytes(), BasicProperties::default()).await;
    }
    let mut c = consume(&ch, &q, Default::default(), FieldTable::default()).await;
    publish(&ch, "", &q, b"fence", BasicProperties::default()).await;
    let got: Vec<String> =
        take(&mut c, 3).await.iter().map(|d| String::from_utf8_lossy(&d.data).into_owned()).collect();
    assert_eq!(got, ["1", "2", "fence"]);
}
