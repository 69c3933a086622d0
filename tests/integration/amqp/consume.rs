//! AMQP consumers: prefetch (per consumer and global), no-ack, exclusive consumers, consumer
//! tags, priorities, round robin, cancel by the client and by the server.

use crate::common;

use std::time::Duration;

use crate::common::amqp::*;

/// Short negative wait: the broker has already had a round trip to deliver more.
const QUIET: Duration = Duration::from_millis(300);

async fn queue_with(t: &Target, bodies: &[&str]) -> (Connection, Channel, String) {
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = declare_queue_with(
        &ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    fill(&ch, &q, bodies).await;
    (conn, ch, q)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_count_limits_unacked_deliveries_per_consumer() {
    let t = Target::start();
    let (conn, _ch, q) = queue_with(&t, &["1", "2", "3", "4", "5"]).await;
    let ch = open_channel(&conn).await;
    bounded("qos", ch.basic_qos(2, BasicQosOptions::default())).await.unwrap();
    let mut c = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let first = take(&mut c, 2).await;
    assert_eq!(texts(&first), ["1", "2"]);
    expect_no_delivery(&mut c, QUIET).await;
    first[0].ack(BasicAckOptions::default()).await.unwrap();
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "3");
    expect_no_delivery(&mut c, QUIET).await;
    // Acking several at once frees as many slots.
    bounded("ack", ch.basic_ack(d.delivery_tag, BasicAckOptions { multiple: true })).await.unwrap();
    assert_eq!(texts(&take(&mut c, 2).await), ["4", "5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_prefetch_applies_to_each_consumer_separately() {
    let t = Target::start();
    let (conn, _ch, q) = queue_with(&t, &["1", "2", "3", "4", "5", "6"]).await;
    let ch = open_channel(&conn).await;
    bounded("qos", ch.basic_qos(1, BasicQosOptions { global: false })).await.unwrap();
    let mut a = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let mut b = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let da = next_delivery(&mut a).await;
    let db = next_delivery(&mut b).await;
    expect_no_delivery(&mut a, QUIET).await;
    expect_no_delivery(&mut b, Duration::from_millis(50)).await;
    da.ack(BasicAckOptions::default()).await.unwrap();
    next_delivery(&mut a).await;
    expect_no_delivery(&mut b, QUIET).await;
    db.ack(BasicAckOptions::default()).await.unwrap();
    next_delivery(&mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_prefetch_is_shared_by_the_channels_consumers() {
    let t = Target::start();
    let (conn, ch0, q1) = queue_with(&t, &["a1", "a2", "a3"]).await;
    let q2 = declare_queue_with(
        &ch0,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    fill(&ch0, &q2, &["b1", "b2", "b3"]).await;
    let ch = open_channel(&conn).await;
    bounded("qos", ch.basic_qos(2, BasicQosOptions { global: true })).await.unwrap();
    let mut a = consume(&ch, &q1, BasicConsumeOptions::default(), FieldTable::default()).await;
    let mut b = consume(&ch, &q2, BasicConsumeOptions::default(), FieldTable::default()).await;
    // At most 2 unacked on the whole channel.
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + QUIET * 2;
    loop {
        tokio::select! {
            Some(Ok(d)) = futures_util::StreamExt::next(&mut a) => got.push(d),
            Some(Ok(d)) = futures_util::StreamExt::next(&mut b) => got.push(d),
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    assert_eq!(got.len(), 2, "deliveries {:?}", texts(&got));
    // Ack by the highest tag (lapin drops its locally buffered deliveries on ack(0, multiple)).
    let last = got.iter().map(|d| d.delivery_tag).max().unwrap();
    bounded("ack", ch.basic_ack(last, BasicAckOptions { multiple: true })).await.unwrap();
    // Two more slots.
    let mut more = 0;
    let deadline = tokio::time::Instant::now() + QUIET * 2;
    loop {
        tokio::select! {
            Some(Ok(_)) = futures_util::StreamExt::next(&mut a) => more += 1,
            Some(Ok(_)) = futures_util::StreamExt::next(&mut b) => more += 1,
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    assert_eq!(more, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ack_consumer_gets_everything_regardless_of_prefetch() {
    let t = Target::start();
    let (conn, ch0, q) = queue_with(&t, &["1", "2", "3", "4"]).await;
    let ch = open_channel(&conn).await;
    bounded("qos", ch.basic_qos(1, BasicQosOptions::default())).await.unwrap();
    let mut c =
        consume(&ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    assert_eq!(texts(&take(&mut c, 4).await), ["1", "2", "3", "4"]);
    // Nothing to recover: the messages are gone.
    bounded("cancel", ch.basic_cancel(c.tag(), BasicCancelOptions::default())).await.unwrap();
    bounded("recover", ch.basic_recover(BasicRecoverOptions { requeue: true })).await.unwrap();
    assert_eq!(queue_counts(&ch0, &q).await.unwrap(), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_consumer_locks_out_other_consumers_with_403() {
    let t = Target::start();
    let (conn, _ch, q) = queue_with(&t, &["x"]).await;
    let ch = open_channel(&conn).await;
    let mut c =
        consume(&ch, &q, BasicConsumeOptions { exclusive: true, ..Default::default() }, FieldTable::default()).await;
    let ch2 = open_channel(&conn).await;
    let r =
        ch2.basic_consume(q.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default()).await;
    let text = expect_code(r, 403);
    assert_eq!(text, format!("ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"));
    assert_eq!(self::text(&next_delivery(&mut c).await), "x");
    // An exclusive consumer cannot join a queue that already has consumers.
    let ch3 = open_channel(&conn).await;
    let other_q = declare_queue_with(
        &ch3,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await
    .name()
    .to_string();
    let _plain = consume(&ch3, &other_q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let ch4 = open_channel(&conn).await;
    let r = ch4
        .basic_consume(
            other_q.as_str().into(),
            "".into(),
            BasicConsumeOptions { exclusive: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 403);
    assert_eq!(text, format!("ACCESS_REFUSED - queue '{other_q}' in vhost '/' in exclusive use"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_tags_are_server_generated_or_echoed() {
    let t = Target::start();
    let (conn, ch, q) = queue_with(&t, &[]).await;
    let generated = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    assert!(generated.tag().as_str().starts_with("amq.ctag-"), "{:?}", generated.tag());
    let other = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    assert_ne!(generated.tag(), other.tag());
    let mine = unique("my-tag");
    let c = bounded(
        "consume",
        ch.basic_consume(
            q.as_str().into(),
            mine.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(c.tag().as_str(), mine);
    assert_eq!(queue_counts(&ch, &q).await.unwrap().1, 3);
    // Reusing a tag on the same channel is a connection error (530 NOT_ALLOWED).
    let mut ev = events(&conn);
    let r = ch
        .basic_consume(q.as_str().into(), mine.as_str().into(), BasicConsumeOptions::default(), FieldTable::default())
        .await;
    let text = expect_code(r, 530);
    assert_eq!(text, format!("NOT_ALLOWED - attempt to reuse consumer tag '{mine}'"));
    let (code, _) = server_closed(&mut ev).await;
    assert_eq!(code, 530);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_round_robin_between_consumers() {
    let t = Target::start();
    let (conn, ch0, q) = queue_with(&t, &[]).await;
    let ch = open_channel(&conn).await;
    let mut a =
        consume(&ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    let mut b =
        consume(&ch, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    fill(&ch0, &q, &["1", "2", "3", "4"]).await;
    let got_a = texts(&take(&mut a, 2).await);
    let got_b = texts(&take(&mut b, 2).await);
    let mut all = [got_a.clone(), got_b.clone()].concat();
    all.sort();
    assert_eq!(all, ["1", "2", "3", "4"]);
    assert!(got_a == ["1", "3"] || got_a == ["2", "4"], "alternating: a={got_a:?} b={got_b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_consumers_are_served_first() {
    let t = Target::start();
    let (conn, ch0, q) = queue_with(&t, &[]).await;
    let high_ch = open_channel(&conn).await;
    let low_ch = open_channel(&conn).await;
    bounded("qos", high_ch.basic_qos(2, BasicQosOptions::default())).await.unwrap();
    bounded("qos", low_ch.basic_qos(10, BasicQosOptions::default())).await.unwrap();
    let mut low = consume(&low_ch, &q, BasicConsumeOptions::default(), table(&[("x-priority", int(1))])).await;
    let mut high = consume(&high_ch, &q, BasicConsumeOptions::default(), table(&[("x-priority", int(10))])).await;
    fill(&ch0, &q, &["1", "2", "3", "4", "5"]).await;
    // The high-priority consumer takes what its prefetch allows; the rest goes to the low one.
    let h = take(&mut high, 2).await;
    assert_eq!(texts(&h), ["1", "2"]);
    assert_eq!(texts(&take(&mut low, 3).await), ["3", "4", "5"]);
    // Once the high one has capacity again, new messages go to it.
    bounded("ack", high_ch.basic_ack(h[1].delivery_tag, BasicAckOptions { multiple: true })).await.unwrap();
    fill(&ch0, &q, &["6", "7"]).await;
    assert_eq!(texts(&take(&mut high, 2).await), ["6", "7"]);
    expect_no_delivery(&mut low, Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_deliveries_and_leaves_messages_for_others() {
    let t = Target::start();
    let (conn, ch0, q) = queue_with(&t, &["1"]).await;
    let ch = open_channel(&conn).await;
    let mut c = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let d = next_delivery(&mut c).await;
    bounded("cancel", ch.basic_cancel(c.tag(), BasicCancelOptions::default())).await.unwrap();
    // The consumer's stream ends.
    expect_cancelled(&mut c).await;
    fill(&ch0, &q, &["2"]).await;
    assert_eq!(queue_counts(&ch0, &q).await.unwrap(), (1, 0));
    // A message delivered before the cancel can still be acked.
    d.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(drain(&ch0, &q).await, ["2"]);
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_cancels_consumers_when_their_queue_is_deleted() {
    let t = Target::start();
    let (conn, ch0) = t.channel().await;
    let q = unique("cancel-notify");
    declare_queue(&ch0, &q, FieldTable::default()).await;
    let ch = open_channel(&conn).await;
    let mut c = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let other = t.connect().await;
    let och = open_channel(&other).await;
    bounded("queue.delete", och.queue_delete(q.as_str().into(), QueueDeleteOptions::default())).await.unwrap();
    // basic.cancel from the server ends the stream; the channel stays open.
    expect_cancelled(&mut c).await;
    assert!(ch.status().connected());
    bounded("qos", ch.basic_qos(5, BasicQosOptions::default())).await.expect("channel still usable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuming_from_a_missing_queue_closes_the_channel_with_404() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    let q = unique("missing");
    let r = ch.basic_consume(q.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default()).await;
    let text = expect_code(r, 404);
    assert_eq!(text, format!("NOT_FOUND - no queue '{q}' in vhost '/'"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_receives_messages_published_after_it_started() {
    let t = Target::start();
    let (conn, ch0, q) = queue_with(&t, &[]).await;
    let ch = open_channel(&conn).await;
    let mut c = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    expect_no_delivery(&mut c, Duration::from_millis(50)).await;
    publish(&ch0, "", &q, b"late", BasicProperties::default()).await;
    let d = next_delivery(&mut c).await;
    assert_eq!(text(&d), "late");
    assert_eq!(d.routing_key.as_str(), q);
    assert_eq!(d.exchange.as_str(), "");
    assert!(!d.redelivered);
    d.ack(BasicAckOptions::default()).await.unwrap();
}

/// A manual-ack consumer without a prefetch limit holds at most
/// `amqp.max_unacked_without_prefetch` deliveries: a stalled one cannot pin a whole queue
/// in the broker's memory. Acks let more through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_without_prefetch_holds_a_bounded_number_of_deliveries() {
    if skip_on_rabbitmq("a FerryMQ bound (RabbitMQ bounds it with credit flow)") {
        return;
    }
    let t = Target::start_with(common::Opts::default().env("FERRYMQ_AMQP__MAX_UNACKED_WITHOUT_PREFETCH", "5"));
    let (_c, ch) = t.channel().await;
    let q = declare_queue(&ch, "", FieldTable::default()).await;
    fill(&ch, &q, &["0", "1", "2", "3", "4", "5", "6", "7"]).await;
    let mut c = consume(&ch, &q, BasicConsumeOptions::default(), FieldTable::default()).await;
    let first = take(&mut c, 5).await;
    assert_eq!(texts(&first), ["0", "1", "2", "3", "4"]);
    expect_no_delivery(&mut c, Duration::from_millis(300)).await;
    bounded("ack", first[0].ack(BasicAckOptions::default())).await.unwrap();
    assert_eq!(text(&next_delivery(&mut c).await), "5");
    expect_no_delivery(&mut c, Duration::from_millis(300)).await;
}
