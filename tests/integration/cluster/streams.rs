//! Streams held by the data group: a publish to a stream through any member (AMQP with
//! confirms, MQTT QoS 1 through `amq.topic`) is acknowledged once a majority holds it, and
//! every member's copy has the same messages at the same offsets; what was acknowledged
//! survives the data group's leader being SIGKILLed, the member back has it too, and without
//! a majority a publish is refused (basic.nack), not acknowledged.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::amqp::*;
use crate::common::cluster::Cluster;
use crate::common::{eventually, v4, WAIT};

/// A channel on member `i`.
async fn channel(c: &Cluster, i: usize) -> (Connection, Channel) {
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", amqp_addr(c.member(i)))).await.expect("connect");
    let ch = open_channel(&conn).await;
    (conn, ch)
}

/// Reads stream `name` on member `i` from its first offset until `n` messages: (offset,
/// body) in order.
async fn read(c: &Cluster, i: usize, name: &str, n: usize) -> Vec<(i64, String)> {
    let (conn, _) = channel(c, i).await;
    let ch = stream_channel(&conn, 500).await;
    let mut consumer =
        consume(&ch, name, BasicConsumeOptions::default(), table(&[("x-stream-offset", string("first"))])).await;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let d = next_delivery_within(&mut consumer, WAIT).await;
        out.push((offset_of(&d), text(&d)));
        bounded("ack", d.ack(BasicAckOptions::default())).await.expect("ack");
    }
    out
}

/// The data group's leader as member `i` reports it.
async fn data_leader(c: &Cluster, i: usize) -> usize {
    eventually("a data-group leader", Duration::from_secs(30), || async {
        let s = c.status(i).await;
        s["data_groups"][0]["leader"].as_str()?.strip_prefix('n')?.parse().ok()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_has_the_same_offsets_on_every_member_and_keeps_what_was_confirmed_through_a_kill() {
    let mut c = Cluster::start(3, "command_timeout_ms = 3000");
    c.leader(&[0, 1, 2]).await;
    let (_conn, ch) = channel(&c, 0).await;
    declare_stream(&ch, "events", &[]).await;
    bind(&ch, "events", "amq.topic", "sensors.#", FieldTable::default()).await;
    for i in 1..3 {
        eventually("the stream on every member", WAIT, || async {
            let (conn, _) = channel(&c, i).await;
            queue_exists(&conn, "events").await.then_some(())
        })
        .await;
    }
    // AMQP through n1 and MQTT QoS 1 through n2, at once.
    let (_c1, ch1) = channel(&c, 1).await;
    confirm_select(&ch1).await;
    let amqp = async {
        for k in 0..60 {
            let body = format!("amqp-{k}");
            assert!(publish_confirmed(&ch1, "", "events", body.as_bytes(), persistent()).await.is_ack(), "{body}");
        }
    };
    let mut device = v4::connect(c.member(2), "sensor-1").await;
    let mqtt = async {
        for k in 0..40 {
            device.publish_acked("sensors/t", v4::QoS::AtLeastOnce, false, format!("mqtt-{k}")).await;
        }
    };
    tokio::join!(amqp, mqtt);
    let first = read(&c, 0, "events", 100).await;
    let offsets: Vec<i64> = first.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (0..100).collect::<Vec<i64>>(), "contiguous offsets from 0");
    let bodies: BTreeSet<&str> = first.iter().map(|(_, b)| b.as_str()).collect();
    assert_eq!(bodies.len(), 100, "each message once");
    let amqp_order: Vec<&str> = first.iter().map(|(_, b)| b.as_str()).filter(|b| b.starts_with("amqp-")).collect();
    let sent: Vec<String> = (0..60).map(|k| format!("amqp-{k}")).collect();
    assert_eq!(amqp_order, sent.iter().map(String::as_str).collect::<Vec<_>>(), "one publisher's order kept");
    for i in 1..3 {
        assert_eq!(read(&c, i, "events", 100).await, first, "n{i}'s copy is n0's");
    }

    // SIGKILL the data group's leader: publishes through a survivor are confirmed again once
    // the other two elect one; every confirmed one is on both survivors, at the same offset.
    let leader = data_leader(&c, 0).await;
    c.kill(leader);
    let survivor = (0..3).find(|&i| i != leader).expect("a survivor");
    let other = (0..3).find(|&i| i != leader && i != survivor).expect("another");
    let (_cs, chs) = channel(&c, survivor).await;
    confirm_select(&chs).await;
    let mut confirmed = Vec::new();
    let mut attempted = BTreeSet::new();
    let mut k = 0;
    while confirmed.len() < 30 {
        assert!(k < 300, "30 confirms within 300 publishes\n{}", c.logs());
        let body = format!("after-{k}");
        attempted.insert(body.clone());
        if publish_confirmed(&chs, "", "events", body.as_bytes(), persistent()).await.is_ack() {
            confirmed.push(body);
        }
        k += 1;
    }
    let total = 100 + attempted.len();
    eprintln!("after the kill: {} publishes attempted, {} confirmed", attempted.len(), confirmed.len());
    // A nacked publish may still have been committed: the survivors have every confirmed
    // one and nothing that was not attempted, in the same order.
    let on_survivor = eventually("the survivor's copy has every confirmed publish", WAIT, || async {
        let (conn, _) = channel(&c, survivor).await;
        let (_, count) = stream_extent(&conn, "events").await;
        (count >= 100 + confirmed.len() as u64).then_some(count)
    })
    .await;
    assert!(on_survivor as usize <= total, "{on_survivor} messages of {total} attempted");
    let copy = read(&c, survivor, "events", on_survivor as usize).await;
    assert_eq!(&copy[..100], &first[..], "what was there before the kill is unchanged");
    let later: BTreeSet<&str> = copy[100..].iter().map(|(_, b)| b.as_str()).collect();
    for b in &confirmed {
        assert!(later.contains(b.as_str()), "confirmed {b} is in the stream");
    }
    assert!(later.iter().all(|b| attempted.contains(*b)), "nothing unexpected: {later:?}");
    assert_eq!(read(&c, other, "events", copy.len()).await, copy, "both survivors hold the same");

    // The killed member comes back and is sent what it missed: the same stream.
    c.restart(leader);
    eventually("the restarted member's copy caught up", Duration::from_secs(30), || async {
        let (conn, _) = channel(&c, leader).await;
        (stream_extent(&conn, "events").await.1 >= copy.len() as u64).then_some(())
    })
    .await;
    assert_eq!(read(&c, leader, "events", copy.len()).await, copy, "the restarted member's copy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_a_publish_to_a_stream_is_nacked() {
    let mut c = Cluster::start(3, "command_timeout_ms = 2000");
    c.leader(&[0, 1, 2]).await;
    let (_conn, ch) = channel(&c, 0).await;
    declare_stream(&ch, "ledger", &[]).await;
    confirm_select(&ch).await;
    assert!(publish_confirmed(&ch, "", "ledger", b"with-all", persistent()).await.is_ack());
    c.kill(1);
    c.kill(2);
    assert!(publish_confirmed(&ch, "", "ledger", b"alone", persistent()).await.is_nack(), "no majority: nacked");
    c.restart(1);
    eventually("confirmed again once a majority is back", Duration::from_secs(30), || async {
        publish_confirmed(&ch, "", "ledger", b"back", persistent()).await.is_ack().then_some(())
    })
    .await;
}

/// A stream's message count as `queue.declare` (passive) reports it: (consumers, messages).
async fn stream_extent(conn: &Connection, name: &str) -> (u32, u64) {
    let ch = open_channel(conn).await;
    let q = bounded(
        "passive queue.declare",
        ch.queue_declare(
            name.into(),
            QueueDeclareOptions { passive: true, ..Default::default() },
            FieldTable::default(),
        ),
    )
    .await
    .expect("the stream exists");
    (q.consumer_count(), u64::from(q.message_count()))
}
