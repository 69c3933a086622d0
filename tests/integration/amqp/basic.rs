//! AMQP basic class on the publishing and acknowledging side: mandatory / immediate
//! publishes, get and get-empty, ack / nack / reject / recover, redelivery and requeue
//! order, and the round trip of every message property.

use std::time::Duration;

use crate::common::amqp::*;

async fn queue(ch: &Channel) -> String {
    declare_queue_with(ch, "", QueueDeclareOptions { exclusive: true, ..Default::default() }, FieldTable::default())
        .await
        .name()
        .to_string()
}

/// A confirm-mode channel with an exclusive queue holding `bodies`.
async fn filled(t: &Target, bodies: &[&str]) -> (Connection, Channel, String) {
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = queue(&ch).await;
    fill(&ch, &q, bodies).await;
    (conn, ch, q)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_unroutable_publish_is_returned_with_312_no_route() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let key = unique("nobody-bound");
    let props = BasicProperties::default().with_message_id("m-1".into()).with_content_type("text/plain".into());
    let c = publish_opts(
        &ch,
        "amq.direct",
        &key,
        BasicPublishOptions { mandatory: true, ..Default::default() },
        b"back",
        props,
    )
    .await;
    let c = bounded("confirm", c).await.unwrap();
    // The return precedes the ack (which still comes: the message was handled).
    assert!(c.is_ack(), "{c:?}");
    let ret = c.take_message().expect("basic.return");
    assert_eq!(ret.reply_code, 312);
    assert_eq!(ret.reply_text.as_str(), "NO_ROUTE");
    assert_eq!(ret.delivery.exchange.as_str(), "amq.direct");
    assert_eq!(ret.delivery.routing_key.as_str(), key);
    assert_eq!(ret.delivery.data, b"back");
    assert_eq!(ret.delivery.properties.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
    assert_eq!(ret.delivery.properties.content_type().as_ref().map(|s| s.as_str()), Some("text/plain"));
    // Not mandatory: silently dropped, acked without a return.
    let c = publish_confirmed(&ch, "amq.direct", &key, b"dropped", BasicProperties::default()).await;
    assert_eq!(c, Confirmation::Ack(None));
    // Mandatory and routed: no return.
    let q = queue(&ch).await;
    let c = publish_opts(
        &ch,
        "",
        &q,
        BasicPublishOptions { mandatory: true, ..Default::default() },
        b"kept",
        BasicProperties::default(),
    )
    .await;
    assert_eq!(bounded("confirm", c).await.unwrap(), Confirmation::Ack(None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_publish_closes_the_connection_with_540() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let mut ev = events(&conn);
    let q = queue(&ch).await;
    publish_opts(
        &ch,
        "",
        &q,
        BasicPublishOptions { immediate: true, ..Default::default() },
        b"now",
        BasicProperties::default(),
    )
    .await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(code, 540);
    assert_eq!(text, "NOT_IMPLEMENTED - immediate=true");
    eventually("connection closed", WAIT, || {
        let open = conn.status().connected();
        async move { (!open).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_returns_messages_with_remaining_count_then_get_empty() {
    let t = Target::start();
    let (_c, ch, q) = filled(&t, &["a", "b", "c"]).await;
    let m = get(&ch, &q, true).await.unwrap();
    assert_eq!((m.delivery.data.as_slice(), m.message_count), (&b"a"[..], 2));
    assert_eq!(m.delivery.exchange.as_str(), "");
    assert_eq!(m.delivery.routing_key.as_str(), q);
    assert!(!m.delivery.redelivered);
    let m = get(&ch, &q, true).await.unwrap();
    assert_eq!(m.message_count, 1);
    let m = get(&ch, &q, true).await.unwrap();
    assert_eq!((m.delivery.data.as_slice(), m.message_count), (&b"c"[..], 0));
    assert!(get(&ch, &q, true).await.is_none(), "get-empty");
    assert!(get(&ch, &q, false).await.is_none(), "get-empty again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_on_a_missing_queue_closes_the_channel_with_404() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    let q = unique("missing");
    let r = ch.basic_get(q.as_str().into(), BasicGetOptions::default()).await;
    let text = expect_code(r, 404);
    assert_eq!(text, format!("NOT_FOUND - no queue '{q}' in vhost '/'"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_tags_increase_per_channel() {
    let t = Target::start();
    let (conn, ch, q) = filled(&t, &["a", "b", "c"]).await;
    let tags: Vec<u64> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(get(&ch, &q, false).await.unwrap().delivery.delivery_tag);
        }
        v
    };
    assert_eq!(tags, [1, 2, 3]);
    // Another channel counts from 1.
    bounded("recover", ch.basic_recover(BasicRecoverOptions { requeue: true })).await.unwrap();
    let ch2 = open_channel(&conn).await;
    assert_eq!(get(&ch2, &q, false).await.unwrap().delivery.delivery_tag, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_multiple_acknowledges_everything_up_to_the_tag() {
    let t = Target::start();
    let (_c, ch, q) = filled(&t, &["1", "2", "3", "4"]).await;
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(get(&ch, &q, false).await.unwrap());
    }
    bounded("ack", ch.basic_ack(got[2].delivery.delivery_tag, BasicAckOptions { multiple: true })).await.unwrap();
    // 1..3 acked, 4 still unacked: recover brings back only 4.
    bounded("recover", ch.basic_recover(BasicRecoverOptions { requeue: true })).await.unwrap();
    assert_eq!(drain(&ch, &q).await, ["4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_with_tag_zero_and_multiple_acknowledges_all() {
    let t = Target::start();
    let (_c, ch, q) = filled(&t, &["1", "2", "3"]).await;
    for _ in 0..3 {
        get(&ch, &q, false).await.unwrap();
    }
    bounded("ack", ch.basic_ack(0, BasicAckOptions { multiple: true })).await.unwrap();
    bounded("recover", ch.basic_recover(BasicRecoverOptions { requeue: true })).await.unwrap();
    assert!(drain(&ch, &q).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_multiple_with_requeue_puts_messages_back_in_order() {
    let t = Target::start();
    let (_c, ch, q) = filled(&t, &["1", "2", "3", "4"]).await;
    let mut tags = Vec::new();
    for _ in 0..3 {
        tags.push(get(&ch, &q, false).await.unwrap().delivery.delivery_tag);
    }
    bounded("nack", ch.basic_nack(tags[2], BasicNackOptions { multiple: true, requeue: true })).await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = get(&ch, &q, true).await {
        out.push((String::from_utf8(m.delivery.data).unwrap(), m.delivery.redelivered));
    }
    assert_eq!(out, [("1".into(), true), ("2".into(), true), ("3".into(), true), ("4".into(), false)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_without_requeue_discards() {
    let t = Target::start();
    let (_c, ch, q) = filled(&t, &["1", "2", "3"]).await;
    let mut tags = Vec::new();
    for _ in 0..3 {
        tags.push(get(&ch, &q, false).await.unwrap().delivery.delivery_tag);
    }
    // Single nack of the first, then multiple up to the third.
    bounded("nack", ch.basic_nack(tags[0], BasicNackOptions { multiple: false, requeue: false })).await.unwrap();
    bounded("nack", ch.basic_nack(tags[2], BasicNackOptions { multiple: true, requeue: false })).await.unwrap();
    bounded("recover", ch.basic_recover(BasicRecoverOptions { requeue: true })).await.unwrap();
    assert!(drain(&ch, &q).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_with_and_without_requeue() {
    let t = Target::start();
    let (_c, ch, q) = filled(&t, &["keep", "drop"]).await;
    let keep = get(&ch, &q, false).await.unwrap();
    let drop_ = get(&ch, &q, false).await.unwrap();
    drop_.delivery.reject(BasicRejectOptions { requeue: false }).await.unwrap();
    keep.delivery.reject(BasicRejectOptions { requeue: true }).await.unwrap();
    let m = get(&ch, &q, true).await.unwrap();
    assert_eq!((m.delivery.data.as_slice(), m.delivery.redelivered, m.message_count), (&b"keep"[..], true, 0));
    assert!(get(&ch, &q, true).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_requeues_unacked_messages_as_redelivered() {
    let t = Target::start();
    let (_c, ch, q) = filled(&t, &["x", "y"]).await;
    bounded("qos", ch.basic_qos(10, BasicQosOptions::default())).await.unwrap();
    let mut c = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let first = take(&mut c, 2).await;
    assert!(first.iter().all(|d| !d.redelivered));
    bounded("recover", ch.basic_recover(BasicRecoverOptions { requeue: true })).await.unwrap();
    let again = take(&mut c, 2).await;
    assert_eq!(texts(&again), ["x", "y"]);
    assert!(again.iter().all(|d| d.redelivered), "redelivered flag");
    for d in &again {
        d.ack(BasicAckOptions::default()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivered_flag_is_set_on_every_redelivery() {
    let t = Target::start();
    let (_c, ch, q) = filled(&t, &["again"]).await;
    let mut flags = Vec::new();
    for _ in 0..4 {
        let m = get(&ch, &q, false).await.unwrap();
        flags.push(m.delivery.redelivered);
        m.delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.unwrap();
    }
    assert_eq!(flags, [false, true, true, true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_are_requeued_in_order_when_the_channel_closes() {
    let t = Target::start();
    let (conn, ch, q) = filled(&t, &["1", "2", "3", "4", "5"]).await;
    let consumer_ch = open_channel(&conn).await;
    bounded("qos", consumer_ch.basic_qos(3, BasicQosOptions::default())).await.unwrap();
    let mut c = consume(&consumer_ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let got = take(&mut c, 3).await;
    assert_eq!(texts(&got), ["1", "2", "3"]);
    got[1].ack(BasicAckOptions::default()).await.unwrap();
    // The freed slot brings "4"; "5" stays in the queue, never delivered.
    assert_eq!(text(&next_delivery(&mut c).await), "4");
    bounded("channel.close", consumer_ch.close(200, "bye".into())).await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = get(&ch, &q, true).await {
        out.push((String::from_utf8(m.delivery.data).unwrap(), m.delivery.redelivered));
    }
    assert_eq!(out, [("1".into(), true), ("3".into(), true), ("4".into(), true), ("5".into(), false)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_are_requeued_in_order_when_the_connection_closes() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("requeue-conn");
    declare_queue(&ch, &q, FieldTable::default()).await;
    fill(&ch, &q, &["1", "2", "3", "4"]).await;
    let (consumer_conn, consumer_ch) = t.channel().await;
    let mut c = consume(&consumer_ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let got = take(&mut c, 4).await;
    got[0].ack(BasicAckOptions::default()).await.unwrap();
    got[2].ack(BasicAckOptions::default()).await.unwrap();
    bounded("connection.close", consumer_conn.close(200, "bye".into())).await.unwrap();
    // Requeue happens when the server processes the close; wait for the count.
    eventually("requeued", WAIT, || async { (queue_counts(&ch, &q).await.unwrap().0 == 2).then_some(()) }).await;
    assert_eq!(drain(&ch, &q).await, ["2", "4"]);
    delete_queue(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_an_unknown_delivery_tag_closes_the_channel_with_406() {
    let t = Target::start();
    let (conn, ch, q) = filled(&t, &["only"]).await;
    let mut ev = events(&conn);
    let m = get(&ch, &q, false).await.unwrap();
    bounded("ack", ch.basic_ack(m.delivery.delivery_tag + 41, BasicAckOptions::default())).await.unwrap();
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(code, 406);
    assert_eq!(text, format!("PRECONDITION_FAILED - unknown delivery tag {}", m.delivery.delivery_tag + 41));
    // The unacked message went back to the queue with the channel.
    let ch2 = open_channel(&conn).await;
    let m = get(&ch2, &q, true).await.unwrap();
    assert!(m.delivery.redelivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_twice_closes_the_channel_with_406() {
    let t = Target::start();
    let (conn, ch, q) = filled(&t, &["once"]).await;
    let mut ev = events(&conn);
    let m = get(&ch, &q, false).await.unwrap();
    let tag = m.delivery.delivery_tag;
    bounded("ack", ch.basic_ack(tag, BasicAckOptions::default())).await.unwrap();
    bounded("ack", ch.basic_ack(tag, BasicAckOptions::default())).await.unwrap();
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!((code, text), (406, format!("PRECONDITION_FAILED - unknown delivery tag {tag}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_property_round_trips() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = queue(&ch).await;
    let mut nested = FieldTable::default();
    nested.insert("inner".into(), AMQPValue::LongString("value".into()));
    nested.insert("n".into(), AMQPValue::LongInt(-7));
    let hdrs = table(&[
        ("bool", AMQPValue::Boolean(true)),
        ("i8", AMQPValue::ShortShortInt(-8)),
        ("u8", AMQPValue::ShortShortUInt(200)),
        ("i16", AMQPValue::ShortInt(-16000)),
        ("u16", AMQPValue::ShortUInt(60000)),
        ("i32", AMQPValue::LongInt(-2_000_000_000)),
        ("u32", AMQPValue::LongUInt(4_000_000_000)),
        ("i64", AMQPValue::LongLongInt(-9_000_000_000_000)),
        ("f32", AMQPValue::Float(1.5)),
        ("f64", AMQPValue::Double(-2.25)),
        ("decimal", AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 12345 })),
        ("string", AMQPValue::LongString("héllo wörld".into())),
        ("empty", AMQPValue::LongString("".into())),
        (
            "array",
            AMQPValue::FieldArray(
                vec![AMQPValue::LongInt(1), AMQPValue::LongString("two".into()), AMQPValue::Boolean(false)].into(),
            ),
        ),
        ("timestamp", AMQPValue::Timestamp(1_700_000_000)),
        ("table", AMQPValue::FieldTable(nested)),
        ("bytes", AMQPValue::ByteArray(vec![0u8, 1, 2, 255].into())),
        ("void", AMQPValue::Void),
    ]);
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_content_encoding("gzip".into())
        .with_headers(hdrs.clone())
        .with_delivery_mode(2)
        .with_priority(7)
        .with_correlation_id("corr-42".into())
        .with_reply_to("reply-queue".into())
        .with_expiration("600000".into())
        .with_message_id("msg-1".into())
        .with_timestamp(1_700_000_123)
        .with_type("order.created".into())
        .with_user_id("guest".into())
        .with_app_id("ferrymq-tests".into());
    let body: Vec<u8> = (0..=255u8).collect();
    assert!(publish_confirmed(&ch, "", &q, &body, props.clone()).await.is_ack());
    let mut c =
        consume(&ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let d = next_delivery(&mut c).await;
    assert_eq!(d.data, body);
    let p = &d.properties;
    assert_eq!(p.content_type(), props.content_type());
    assert_eq!(p.content_encoding(), props.content_encoding());
    assert_eq!(p.delivery_mode(), &Some(2));
    assert_eq!(p.priority(), &Some(7));
    assert_eq!(p.correlation_id(), props.correlation_id());
    assert_eq!(p.reply_to(), props.reply_to());
    assert_eq!(p.expiration(), props.expiration());
    assert_eq!(p.message_id(), props.message_id());
    assert_eq!(p.timestamp(), &Some(1_700_000_123));
    assert_eq!(p.kind(), props.kind());
    assert_eq!(p.user_id(), props.user_id());
    assert_eq!(p.app_id(), props.app_id());
    let got = headers(p);
    for (k, v) in hdrs.inner() {
        assert_eq!(got.inner().get(k), Some(v), "header {k}");
    }
    assert_eq!(got.inner().len(), hdrs.inner().len(), "no headers added: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_without_properties_arrive_without_properties() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = queue(&ch).await;
    assert!(publish_confirmed(&ch, "", &q, b"", BasicProperties::default()).await.is_ack());
    let m = get(&ch, &q, true).await.unwrap();
    assert!(m.delivery.data.is_empty(), "empty body");
    assert_eq!(m.delivery.properties, BasicProperties::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_id_that_differs_from_the_login_closes_the_channel_with_406() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let mut ev = events(&conn);
    let q = queue(&ch).await;
    publish(&ch, "", &q, b"spoofed", BasicProperties::default().with_user_id("admin".into())).await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(code, 406);
    assert_eq!(text, "PRECONDITION_FAILED - user_id property set to 'admin' but authenticated user was 'guest'");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_round_trip() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = queue(&ch).await;
    // Far above frame_max (128 KiB by default): split into many body frames both ways.
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    assert!(publish_confirmed(&ch, "", &q, &body, BasicProperties::default()).await.is_ack());
    let m = get(&ch, &q, true).await.unwrap();
    assert_eq!(m.delivery.data.len(), body.len());
    assert!(m.delivery.data == body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_keep_publish_order_per_queue() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = queue(&ch).await;
    let bodies: Vec<String> = (0..200).map(|i| format!("m{i}")).collect();
    for b in &bodies {
        publish(&ch, "", &q, b.as_bytes(), BasicProperties::default()).await;
    }
    bounded("confirms", ch.wait_for_confirms()).await.unwrap();
    let mut c =
        consume(&ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    assert_eq!(texts(&take(&mut c, 200).await), bodies);
    expect_no_delivery(&mut c, Duration::from_millis(100)).await;
}
