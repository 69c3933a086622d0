//! FerryMQ-only: consumer groups on streams (`x-consumer-group`). Members share a committed
//! offset kept by the broker; each message goes to one member; separate groups each get
//! everything; a group resumes where it stopped after its consumers reconnect or the
//! broker restarts; a departing member's unacked messages go to the remaining members.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::amqp::*;
use crate::common::Broker;

/// A consumer of `group` on its own channel with prefetch `n`.
async fn member(
    conn: &Connection,
    stream: &str,
    group: &str,
    n: u16,
    extra: &[(&str, AMQPValue)],
) -> (Channel, Consumer) {
    let mut args = vec![("x-consumer-group", string(group))];
    args.extend(extra.iter().cloned());
    stream_consumer(conn, n, stream, table(&args)).await
}

async fn publish_n(ch: &Channel, stream: &str, range: std::ops::Range<usize>) {
    for i in range {
        assert!(publish_confirmed(ch, "", stream, format!("m{i}").as_bytes(), persistent()).await.is_ack());
    }
}

/// Takes deliveries from whichever consumer has one until `n` arrived; acks each.
async fn take_from_all(cs: &mut [&mut Consumer], n: usize) -> Vec<Vec<i64>> {
    let mut got = vec![Vec::new(); cs.len()];
    let mut total = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while total < n {
        assert!(tokio::time::Instant::now() < deadline, "only {total} of {n} deliveries: {got:?}");
        for (i, c) in cs.iter_mut().enumerate() {
            if let Ok(d) = tokio::time::timeout(Duration::from_millis(50), next_delivery(c)).await {
                got[i].push(offset_of(&d));
                bounded("ack", d.ack(BasicAckOptions::default())).await.unwrap();
                total += 1;
            }
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_split_the_stream_and_groups_each_get_everything() {
    if skip_on_rabbitmq("x-consumer-group is a FerryMQ extension") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    declare_stream(&ch, "events", &[]).await;
    let (_a_ch, mut a) = member(&conn, "events", "billing", 5, &[]).await;
    let (_b_ch, mut b) = member(&conn, "events", "billing", 5, &[]).await;
    let (_c_ch, mut c) = member(&conn, "events", "audit", 50, &[]).await;
    confirm_select(&ch).await;
    publish_n(&ch, "events", 0..20).await;
    let split = take_from_all(&mut [&mut a, &mut b], 20).await;
    assert!(!split[0].is_empty() && !split[1].is_empty(), "both members got work: {split:?}");
    let all: BTreeSet<i64> = split.iter().flatten().copied().collect();
    assert_eq!(all, (0..20).collect(), "each message to one member, none twice: {split:?}");
    assert_eq!(split[0].len() + split[1].len(), 20);
    let audit = take_from_all(&mut [&mut c], 20).await;
    assert_eq!(audit[0], (0..20).collect::<Vec<_>>(), "another group gets everything, in order");
    expect_no_delivery(&mut a, Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departing_members_unacked_messages_go_to_the_others() {
    if skip_on_rabbitmq("x-consumer-group is a FerryMQ extension") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    declare_stream(&ch, "jobs", &[]).await;
    confirm_select(&ch).await;
    publish_n(&ch, "jobs", 0..4).await;
    let (a_ch, mut a) = member(&conn, "jobs", "workers", 2, &[("x-stream-offset", string("first"))]).await;
    let d0 = next_delivery(&mut a).await;
    let d1 = next_delivery(&mut a).await;
    assert_eq!((offset_of(&d0), offset_of(&d1)), (0, 1));
    bounded("ack", d1.ack(BasicAckOptions::default())).await.unwrap();
    let d2 = next_delivery(&mut a).await;
    assert_eq!(offset_of(&d2), 2);
    let (_b_ch, mut b) = member(&conn, "jobs", "workers", 10, &[]).await;
    let d3 = next_delivery(&mut b).await;
    assert_eq!(offset_of(&d3), 3);
    // The first member goes away holding 0 and 2 unacked: the other member gets them.
    bounded("channel.close", a_ch.close(200, "bye".into())).await.unwrap();
    let again: Vec<(i64, bool)> = take(&mut b, 2).await.iter().map(|d| (offset_of(d), d.redelivered)).collect();
    assert_eq!(again, vec![(0, true), (2, true)]);
    expect_no_delivery(&mut b, Duration::from_millis(200)).await;
}

/// basic.cancel keeps a member's unacked deliveries ackable, as for queues: what it acks
/// after the cancel is not handed to the others; what it leaves unacked when its channel
/// closes is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_member_can_still_ack_what_it_holds() {
    if skip_on_rabbitmq("x-consumer-group is a FerryMQ extension") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    declare_stream(&ch, "tasks", &[]).await;
    confirm_select(&ch).await;
    publish_n(&ch, "tasks", 0..3).await;
    let (a_ch, mut a) = member(&conn, "tasks", "workers", 2, &[("x-stream-offset", string("first"))]).await;
    let d0 = next_delivery(&mut a).await;
    let d1 = next_delivery(&mut a).await;
    assert_eq!((offset_of(&d0), offset_of(&d1)), (0, 1));
    bounded("basic.cancel", a_ch.basic_cancel(a.tag(), BasicCancelOptions::default())).await.unwrap();
    let (_b_ch, mut b) = member(&conn, "tasks", "workers", 10, &[]).await;
    assert_eq!(offset_of(&next_delivery(&mut b).await), 2, "the next member starts after what is in flight");
    bounded("ack", d0.ack(BasicAckOptions::default())).await.unwrap();
    expect_no_delivery(&mut b, Duration::from_millis(300)).await;
    // The cancelled member's channel closes with offset 1 unacked: it goes to the other.
    bounded("channel.close", a_ch.close(200, "bye".into())).await.unwrap();
    let d = next_delivery(&mut b).await;
    assert_eq!((offset_of(&d), d.redelivered), (1, true));
    expect_no_delivery(&mut b, Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_resumes_where_it_stopped_after_reconnect_and_restart() {
    if skip_on_rabbitmq("x-consumer-group is a FerryMQ extension; restarts the broker") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    {
        let conn = t.connect().await;
        let ch = open_channel(&conn).await;
        declare_stream(&ch, "orders", &[]).await;
        confirm_select(&ch).await;
        publish_n(&ch, "orders", 0..6).await;
        // A new group starts where its first consumer says (default: next).
        let (_m_ch, mut m) = member(&conn, "orders", "shipping", 10, &[("x-stream-offset", string("first"))]).await;
        let ds = take(&mut m, 6).await;
        assert_eq!(ds.iter().map(offset_of).collect::<Vec<_>>(), (0..6).collect::<Vec<_>>());
        // Ack 0, 1, 3, 4: 2 and 5 stay unacked (acks above the gap are remembered).
        for i in [0, 1, 3, 4] {
            bounded("ack", ds[i].ack(BasicAckOptions::default())).await.unwrap();
        }
        // A round trip on the consumer's channel orders after the acks.
        bounded("close", conn.close(200, "bye".into())).await.unwrap();
    }
    // Reconnect: the group resumes; its committed offset wins over x-stream-offset.
    let conn = t.connect().await;
    {
        let (m_ch, mut m) = member(&conn, "orders", "shipping", 10, &[("x-stream-offset", string("first"))]).await;
        let got: Vec<(i64, bool)> = take(&mut m, 2).await.iter().map(|d| (offset_of(d), d.redelivered)).collect();
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![2, 5],
            "nothing acked again, nothing unacked skipped"
        );
        expect_no_delivery(&mut m, Duration::from_millis(200)).await;
        bounded("channel.close", m_ch.close(200, "bye".into())).await.unwrap();
    }
    bounded("close", conn.close(200, "bye".into())).await.unwrap();
    // Restart: still the same (2 and 5 were not acked), then ack them and restart again.
    let t = Target::ferrymq(t.broker.expect("FerryMQ").restart());
    {
        let conn = t.connect().await;
        let (_m_ch, mut m) = member(&conn, "orders", "shipping", 10, &[]).await;
        let ds = take(&mut m, 2).await;
        assert_eq!(ds.iter().map(offset_of).collect::<Vec<_>>(), vec![2, 5]);
        for d in &ds {
            bounded("ack", d.ack(BasicAckOptions::default())).await.unwrap();
        }
        bounded("close", conn.close(200, "bye".into())).await.unwrap();
    }
    let t = Target::ferrymq(t.broker.expect("FerryMQ").restart());
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    let (_m_ch, mut m) = member(&conn, "orders", "shipping", 10, &[]).await;
    confirm_select(&ch).await;
    publish_n(&ch, "orders", 6..7).await;
    let d = next_delivery(&mut m).await;
    assert_eq!(offset_of(&d), 6, "everything before was committed");
}
