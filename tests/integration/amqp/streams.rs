//! Streams (`x-queue-type: stream`) over AMQP 0-9-1, as RabbitMQ 3.9+ serves them:
//! declaration rules, `x-stream-offset` (first, last, next, absolute, timestamp), the
//! `x-stream-offset` header, consuming that removes nothing, per-consumer cursors,
//! prefetch and no-ack rules, retention (`x-max-age`, `x-max-length-bytes`), restarts,
//! and MQTT publishers feeding a stream through `amq.topic`.

use crate::common;

use std::time::Duration;

use crate::common::amqp::*;
use crate::common::{v4, Broker};

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions { durable: true, ..Default::default() }
}

/// A connection, a channel in confirm mode and a fresh stream declared with `extra`.
async fn confirmed_stream(t: &Target, extra: &[(&str, AMQPValue)]) -> (Connection, Channel, String) {
    let conn = t.connect().await;
    let name = unique("s");
    let ch = open_channel(&conn).await;
    declare_stream(&ch, &name, extra).await;
    confirm_select(&ch).await;
    (conn, ch, name)
}

/// Takes `n` deliveries, acking each; returns (offset, body).
async fn take_acked(c: &mut Consumer, n: usize) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let d = next_delivery(c).await;
        out.push((offset_of(&d), text(&d)));
        bounded("ack", d.ack(BasicAckOptions::default())).await.expect("ack");
    }
    out
}

async fn publish_all(ch: &Channel, queue: &str, bodies: &[String]) {
    for b in bodies {
        assert!(publish_confirmed(ch, "", queue, b.as_bytes(), persistent()).await.is_ack());
    }
}

fn bodies(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

fn numbered(prefix: &str, range: std::ops::Range<usize>) -> Vec<(i64, String)> {
    range.map(|i| (i as i64, format!("{prefix}{i}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaration_rules_follow_rabbitmq() {
    let t = Target::start();
    let conn = t.connect().await;
    let name = unique("s");
    let cases: [(QueueDeclareOptions, FieldTable, &str); 6] = [
        (QueueDeclareOptions::default(), stream_args(&[]), "non-durable"),
        (QueueDeclareOptions { durable: true, exclusive: true, ..Default::default() }, stream_args(&[]), "exclusive"),
        (
            QueueDeclareOptions { durable: true, auto_delete: true, ..Default::default() },
            stream_args(&[]),
            "auto-delete",
        ),
        (durable(), stream_args(&[("x-max-length", int(10))]), "x-max-length"),
        (durable(), stream_args(&[("x-max-age", string("7X"))]), "x-max-age"),
        (durable(), stream_args(&[("x-max-age", string("0D"))]), "x-max-age"),
    ];
    for (opts, args, what) in cases {
        let ch = open_channel(&conn).await;
        let text = expect_code(bounded("queue.declare", ch.queue_declare(name.as_str().into(), opts, args)).await, 406);
        assert!(text.contains(what), "{what}: {text}");
    }
    let ch = open_channel(&conn).await;
    declare_stream(&ch, &name, &[("x-max-age", string("7D")), ("x-max-length-bytes", AMQPValue::LongLongInt(1 << 30))])
        .await;
    // Equivalent redeclaration is fine; a different retention is not.
    declare_stream(&ch, &name, &[("x-max-age", string("7D")), ("x-max-length-bytes", AMQPValue::LongLongInt(1 << 30))])
        .await;
    let r = bounded(
        "queue.declare",
        ch.queue_declare(name.as_str().into(), durable(), stream_args(&[("x-max-age", string("1D"))])),
    )
    .await;
    expect_code(r, 406);
    // basic.get is not supported on a stream (RabbitMQ closes the connection with 540).
    let ch = open_channel(&conn).await;
    let r = bounded("basic.get", ch.basic_get(name.as_str().into(), BasicGetOptions::default())).await;
    let text = expect_code(r, 540);
    assert!(text.contains("basic.get not supported by stream queues"), "{text}");
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    delete_queue(&ch, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_need_a_prefetch_and_manual_acks() {
    let t = Target::start();
    let conn = t.connect().await;
    let name = unique("s");
    declare_stream(&open_channel(&conn).await, &name, &[]).await;
    let ch = open_channel(&conn).await;
    let r = bounded(
        "basic.consume",
        ch.basic_consume(name.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default()),
    )
    .await;
    let text = expect_code(r, 406);
    assert!(text.contains("consumer prefetch count is not set"), "{text}");
    let ch = stream_channel(&conn, 10).await;
    let r = bounded(
        "basic.consume",
        ch.basic_consume(
            name.as_str().into(),
            "".into(),
            BasicConsumeOptions { no_ack: true, ..Default::default() },
            FieldTable::default(),
        ),
    )
    .await;
    // FerryMQ: 406 on the channel (the contract); RabbitMQ closes the connection with 540.
    let text = expect_code(r, if t.is_rabbitmq() { 540 } else { 406 });
    assert!(text.contains("automatic acknowledgement not supported"), "{text}");
    let conn = t.connect().await;
    let ch = stream_channel(&conn, 10).await;
    let r = bounded(
        "basic.consume",
        ch.basic_consume(
            name.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            offset_arg(string("whenever")),
        ),
    )
    .await;
    expect_code(r, 406);
    let conn = t.connect().await;
    delete_queue(&open_channel(&conn).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_start_at_zero_are_contiguous_and_consuming_removes_nothing() {
    let t = Target::start();
    let (conn, ch, name) = confirmed_stream(&t, &[]).await;
    publish_all(&ch, &name, &bodies("m", 0..6)).await;
    for _ in 0..2 {
        let (cch, mut c) = stream_consumer(&conn, 100, &name, offset_arg(string("first"))).await;
        assert_eq!(take_acked(&mut c, 6).await, numbered("m", 0..6), "every consumer reads everything again");
        expect_no_delivery(&mut c, Duration::from_millis(200)).await;
        bounded("channel.close", cch.close(200, "OK".into())).await.unwrap();
    }
    let (messages, _) = queue_counts(&ch, &name).await.unwrap();
    assert_eq!(messages, 6, "acks removed nothing");
    delete_queue(&ch, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_start_offset_form() {
    let t = Target::start();
    let (conn, ch, name) = confirmed_stream(&t, &[]).await;
    publish_all(&ch, &name, &bodies("a", 0..5)).await;

    // `next` (also the default): only what is published after attaching.
    let (_next_ch, mut next) = stream_consumer(&conn, 100, &name, offset_arg(string("next"))).await;
    let (_default_ch, mut default) = stream_consumer(&conn, 100, &name, FieldTable::default()).await;
    // `last`: the last message, then what follows.
    let (_last_ch, mut last) = stream_consumer(&conn, 100, &name, offset_arg(string("last"))).await;
    assert_eq!(take_acked(&mut last, 1).await, vec![(4, "a4".to_string())]);
    // An absolute offset (long, and a short int too).
    let (_abs_ch, mut abs) = stream_consumer(&conn, 100, &name, offset_arg(AMQPValue::LongLongInt(3))).await;
    assert_eq!(take_acked(&mut abs, 2).await, vec![(3, "a3".to_string()), (4, "a4".to_string())]);
    let (_abs2_ch, mut abs2) = stream_consumer(&conn, 100, &name, offset_arg(AMQPValue::LongInt(1))).await;
    assert_eq!(take_acked(&mut abs2, 1).await, vec![(1, "a1".to_string())]);

    // A timestamp (seconds): wait for the next whole second so that the two batches have
    // distinct stored timestamps, then replay from that second.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let boundary_s = now_ms / 1000 + 1;
    tokio::time::sleep(Duration::from_millis(boundary_s * 1000 + 20 - now_ms)).await;
    publish_all(&ch, &name, &bodies("b", 5..8)).await;
    let (_ts_ch, mut ts) = stream_consumer(&conn, 100, &name, offset_arg(AMQPValue::Timestamp(boundary_s))).await;
    assert_eq!(take_acked(&mut ts, 3).await, numbered("b", 5..8), "replay from a point in time");
    expect_no_delivery(&mut ts, Duration::from_millis(200)).await;
    let (_old_ch, mut old) = stream_consumer(&conn, 100, &name, offset_arg(AMQPValue::Timestamp(1))).await;
    assert_eq!(
        take_acked(&mut old, 1).await,
        vec![(0, "a0".to_string())],
        "a timestamp before the stream: from the first"
    );

    assert_eq!(take_acked(&mut next, 3).await, numbered("b", 5..8));
    assert_eq!(take_acked(&mut default, 3).await, numbered("b", 5..8));
    assert_eq!(take_acked(&mut last, 3).await, numbered("b", 5..8));
    delete_queue(&ch, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_bounds_each_cursor_and_nack_gives_credit_without_redelivery() {
    let t = Target::start();
    let (conn, ch, name) = confirmed_stream(&t, &[]).await;
    publish_all(&ch, &name, &bodies("m", 0..5)).await;
    let (_a_ch, mut a) = stream_consumer(&conn, 2, &name, offset_arg(string("first"))).await;
    let (_b_ch, mut b) = stream_consumer(&conn, 2, &name, offset_arg(string("first"))).await;
    for c in [&mut a, &mut b] {
        let d0 = next_delivery(c).await;
        let d1 = next_delivery(c).await;
        assert_eq!((offset_of(&d0), offset_of(&d1)), (0, 1));
        expect_no_delivery(c, Duration::from_millis(300)).await;
        // A nack (even with requeue) settles like an ack: credit back, no redelivery.
        bounded("nack", d0.nack(BasicNackOptions { requeue: true, ..Default::default() })).await.unwrap();
        let d2 = next_delivery(c).await;
        assert_eq!((offset_of(&d2), d2.redelivered), (2, false));
        bounded("reject", d1.reject(BasicRejectOptions { requeue: true })).await.unwrap();
        bounded("ack", d2.ack(BasicAckOptions::default())).await.unwrap();
        let rest: Vec<i64> = take(c, 2).await.iter().map(offset_of).collect();
        assert_eq!(rest, vec![3, 4]);
    }
    delete_queue(&ch, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_bytes_trims_the_oldest_entries() {
    if skip_on_rabbitmq("RabbitMQ trims whole segments (x-stream-max-segment-size-bytes), not entries") {
        return;
    }
    let t = Target::start();
    let (conn, ch, name) = confirmed_stream(&t, &[("x-max-length-bytes", int(1000))]).await;
    let body = |i: usize| format!("{i:0100}");
    for i in 0..25 {
        assert!(publish_confirmed(&ch, "", &name, body(i).as_bytes(), persistent()).await.is_ack());
    }
    eventually("stream trimmed to 1000 bytes", WAIT, || async {
        (queue_counts(&ch, &name).await.unwrap().0 <= 10).then_some(())
    })
    .await;
    let (_c_ch, mut c) = stream_consumer(&conn, 100, &name, offset_arg(string("first"))).await;
    let got = take_acked(&mut c, 10).await;
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        (15..25).collect::<Vec<i64>>(),
        "the newest 1000 bytes stay"
    );
    assert_eq!(got[0].1, body(15));
    expect_no_delivery(&mut c, Duration::from_millis(200)).await;
    delete_queue(&ch, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_trims_in_the_background_and_offsets_keep_counting() {
    if skip_on_rabbitmq("RabbitMQ trims whole segments only") {
        return;
    }
    let t = Target::start();
    let (conn, ch, name) = confirmed_stream(&t, &[("x-max-age", string("1s"))]).await;
    publish_all(&ch, &name, &bodies("old", 0..4)).await;
    eventually("old entries trimmed by age", WAIT, || async {
        (queue_counts(&ch, &name).await.unwrap().0 == 0).then_some(())
    })
    .await;
    publish_all(&ch, &name, &bodies("new", 4..6)).await;
    let (_c_ch, mut c) = stream_consumer(&conn, 100, &name, offset_arg(string("first"))).await;
    assert_eq!(take_acked(&mut c, 2).await, numbered("new", 4..6), "offsets are never reused");
    delete_queue(&ch, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contents_offsets_and_retention_survive_a_restart() {
    if skip_on_rabbitmq("restarts the broker") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    {
        let conn = t.connect().await;
        let ch = open_channel(&conn).await;
        declare_stream(&ch, "kept", &[]).await;
        declare_stream(&ch, "capped", &[("x-max-length-bytes", int(300))]).await;
        confirm_select(&ch).await;
        publish_all(&ch, "kept", &bodies("k", 0..5)).await;
        // Transient messages are kept too: a stream stores everything.
        assert!(publish_confirmed(&ch, "", "kept", b"k5", BasicProperties::default()).await.is_ack());
        let c_ch = stream_channel(&conn, 10).await;
        let mut c = consume(&c_ch, "kept", BasicConsumeOptions::default(), offset_arg(string("first"))).await;
        assert_eq!(take_acked(&mut c, 6).await, numbered("k", 0..6));
        bounded("close", conn.close(200, "bye".into())).await.unwrap();
    }
    let t = Target::ferrymq(t.broker.expect("FerryMQ").restart());
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    assert_eq!(queue_counts(&ch, "kept").await.unwrap().0, 6);
    confirm_select(&ch).await;
    publish_all(&ch, "kept", &bodies("k", 6..7)).await;
    let c_ch = stream_channel(&conn, 10).await;
    let mut c = consume(&c_ch, "kept", BasicConsumeOptions::default(), offset_arg(string("first"))).await;
    assert_eq!(
        take_acked(&mut c, 7).await,
        numbered("k", 0..7),
        "same contents and offsets; the next offset follows on"
    );
    // Retention still applies after the restart.
    let body = |i: usize| format!("{i:0100}");
    for i in 0..6 {
        assert!(publish_confirmed(&ch, "", "capped", body(i).as_bytes(), persistent()).await.is_ack());
    }
    eventually("capped stream trimmed", WAIT, || async {
        (queue_counts(&ch, "capped").await.unwrap().0 <= 3).then_some(())
    })
    .await;
    let c2_ch = stream_channel(&conn, 10).await;
    let mut c2 = consume(&c2_ch, "capped", BasicConsumeOptions::default(), offset_arg(string("first"))).await;
    assert_eq!(take_acked(&mut c2, 1).await[0].0, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_devices_feed_a_stream_bound_to_amq_topic() {
    let t = Target::start();
    let Some(addr) = t.mqtt else {
        common::skipped(&format!("against RabbitMQ: set {RABBITMQ_MQTT_ENV}=HOST:PORT to run the gateway tests"));
        return;
    };
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    let name = unique("s");
    let level = unique("dev");
    declare_stream(&ch, &name, &[]).await;
    bind(&ch, &name, "amq.topic", &format!("{level}.#"), FieldTable::default()).await;
    let mut o = v4::MqttOptions::new(unique("sensor"), addr.ip().to_string(), addr.port());
    o.set_keep_alive(Duration::from_secs(30));
    let mut device = v4::connect_with(o).await;
    device.publish_acked(&format!("{level}/t1"), v4::QoS::AtLeastOnce, false, "21.5").await;
    device.client.publish(format!("{level}/t2"), v4::QoS::AtMostOnce, false, "22.0").await.unwrap();
    eventually("both readings stored", WAIT, || async {
        (queue_counts(&ch, &name).await.unwrap().0 == 2).then_some(())
    })
    .await;
    let (_c_ch, mut c) = stream_consumer(&conn, 10, &name, offset_arg(string("first"))).await;
    let d = next_delivery(&mut c).await;
    assert_eq!(
        (offset_of(&d), text(&d), d.routing_key.as_str()),
        (0, "21.5".to_string(), format!("{level}.t1").as_str())
    );
    let d2 = next_delivery(&mut c).await;
    assert_eq!((offset_of(&d2), text(&d2)), (1, "22.0".to_string()));
    delete_queue(&ch, &name).await;
}

/// `x-tag-filter` on a stream consumer: entries whose tag (`x-tag` header) does not match
/// are skipped for that consumer — or for its whole group — and never sent; other
/// consumers and groups still get everything; a bad expression is refused with 406.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_consumers_filter_by_tag() {
    if skip_on_rabbitmq("x-tag-filter is a FerryMQ extension") {
        return;
    }
    let t = Target::start();
    let (conn, ch, name) = confirmed_stream(&t, &[]).await;
    let tagged = |tag: Option<&str>| match tag {
        Some(t) => persistent().with_headers(table(&[("x-tag", string(t))])),
        None => persistent(),
    };
    for (body, tag) in [
        ("a0", Some("TagA")),
        ("b1", Some("TagB")),
        ("n2", None),
        ("c3", Some("TagC")),
        ("a4", Some("TagA")),
        ("x5", Some("taga")),
    ] {
        assert!(publish_confirmed(&ch, "", &name, body.as_bytes(), tagged(tag)).await.is_ack());
    }
    let filtered = |expr: &str, group: Option<&str>| {
        let mut entries = vec![("x-stream-offset", string("first")), ("x-tag-filter", string(expr))];
        if let Some(g) = group {
            entries.push(("x-consumer-group", string(g)));
        }
        table(&entries)
    };
    let (ch1, mut a_or_c) = stream_consumer(&conn, 10, &name, filtered("TagA || TagC", None)).await;
    assert_eq!(take_acked(&mut a_or_c, 3).await, [(0, "a0".to_string()), (3, "c3".to_string()), (4, "a4".to_string())]);
    expect_no_delivery(&mut a_or_c, Duration::from_millis(300)).await;
    let mut all = consume(&ch1, &name, BasicConsumeOptions::default(), filtered(" * ", None)).await;
    let every: Vec<(i64, String)> =
        ["a0", "b1", "n2", "c3", "a4", "x5"].iter().enumerate().map(|(i, b)| (i as i64, b.to_string())).collect();
    assert_eq!(take_acked(&mut all, 6).await, every, "`*` matches tagged and untagged messages");
    // A group with a filter skips the others for the group; another group gets everything.
    let mut member = consume(&ch1, &name, BasicConsumeOptions::default(), filtered("TagB", Some("only-b"))).await;
    assert_eq!(take_acked(&mut member, 1).await, [(1, "b1".to_string())]);
    expect_no_delivery(&mut member, Duration::from_millis(300)).await;
    // New messages are filtered as they arrive.
    assert!(publish_confirmed(&ch, "", &name, b"b6", tagged(Some("TagB"))).await.is_ack());
    assert!(publish_confirmed(&ch, "", &name, b"a7", tagged(Some("TagA"))).await.is_ack());
    assert_eq!(take_acked(&mut member, 1).await, [(6, "b6".to_string())]);
    assert_eq!(take_acked(&mut a_or_c, 1).await, [(7, "a7".to_string())]);
    // A bad expression.
    let bad = stream_channel(&conn, 10).await;
    let r = bounded(
        "basic.consume",
        bad.basic_consume(name.as_str().into(), "".into(), BasicConsumeOptions::default(), filtered("TagA ||", None)),
    )
    .await;
    expect_code(r, 406);
}
