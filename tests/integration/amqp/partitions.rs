//! FerryMQ-only: partitioned streams. A super stream is an `x-consistent-hash` exchange over
//! N streams (ordered by the `x-stream-partition-order` binding argument); a consumer group
//! whose members pass `x-super-stream` reads each partition with one member at a time, the
//! partitions spread evenly over the members (RocketMQ's average allocation) and spread
//! again when a member joins or leaves; a partition changes hands only once its previous
//! member settled what it held, so every key stays in order. `x-single-active-consumer` is
//! the one-partition case.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::amqp::*;
use crate::common::{v4, Broker};
use futures_util::StreamExt;
use tokio::sync::mpsc;

const PARTITIONS: usize = 4;

/// One delivery as a test sees it: which member, which partition, the message's key and
/// sequence number.
#[derive(Debug)]
struct Got {
    member: usize,
    partition: usize,
    key: String,
    seq: usize,
    redelivered: bool,
    delivery: Delivery,
}

/// A member of a partitioned group: a connection with one channel that consumes every
/// partition; its deliveries go to `out`.
struct Member {
    conn: Connection,
    _ch: Channel,
}

async fn join(
    t: &Target,
    index: usize,
    prefetch: u16,
    partitions: &[String],
    args: &[(&str, AMQPValue)],
    out: &mpsc::UnboundedSender<Got>,
) -> Member {
    let conn = t.connect().await;
    let ch = stream_channel(&conn, prefetch).await;
    for (p, stream) in partitions.iter().enumerate() {
        let mut c = consume(&ch, stream, BasicConsumeOptions::default(), table(args)).await;
        let out = out.clone();
        tokio::spawn(async move {
            while let Some(Ok(d)) = c.next().await {
                let body = text(&d);
                let (key, seq) = body.split_once(':').expect("key:seq");
                let got = Got {
                    member: index,
                    partition: p,
                    key: key.into(),
                    seq: seq.parse().unwrap(),
                    redelivered: d.redelivered,
                    delivery: d,
                };
                if out.send(got).is_err() {
                    return;
                }
            }
        });
    }
    Member { conn, _ch: ch }
}

fn group_args(offset: &str) -> Vec<(&'static str, AMQPValue)> {
    vec![
        ("x-consumer-group", string("billing")),
        ("x-super-stream", string("orders")),
        ("x-stream-offset", string(offset)),
    ]
}

/// The super stream `orders`: a consistent-hash exchange over `orders-0..n` (declared in
/// reverse order, so only the binding argument orders them).
async fn super_stream(ch: &Channel, n: usize) -> Vec<String> {
    let kind = ExchangeKind::Custom("x-consistent-hash".into());
    declare_exchange(
        ch,
        "orders",
        kind,
        ExchangeDeclareOptions { durable: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    let names: Vec<String> = (0..n).map(|i| format!("orders-{i}")).collect();
    for (i, s) in names.iter().enumerate().rev() {
        declare_stream(ch, s, &[]).await;
        bind(ch, s, "orders", "1", table(&[("x-stream-partition-order", int(i as i32))])).await;
    }
    names
}

/// Publishes `key:seq` for seq in `seqs`, key = `k{seq % keys}`, with confirms.
async fn publish_keys(ch: &Channel, seqs: std::ops::Range<usize>, keys: usize) {
    for seq in seqs {
        let key = format!("k{}", seq % keys);
        assert!(publish_confirmed(ch, "orders", &key, format!("{key}:{seq}").as_bytes(), persistent()).await.is_ack());
    }
}

/// Takes `n` deliveries, acking each.
async fn take_acked(rx: &mut mpsc::UnboundedReceiver<Got>, n: usize) -> Vec<Got> {
    let mut out = Vec::new();
    while out.len() < n {
        let got = bounded(&format!("delivery {} of {n}", out.len() + 1), rx.recv()).await.expect("consumers running");
        bounded("ack", got.delivery.ack(BasicAckOptions::default())).await.unwrap();
        out.push(got);
    }
    out
}

/// member -> the partitions it received from.
fn owners(got: &[Got]) -> BTreeMap<usize, BTreeSet<usize>> {
    let mut m: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for g in got {
        m.entry(g.member).or_default().insert(g.partition);
    }
    m
}

fn set(ps: &[usize]) -> BTreeSet<usize> {
    ps.iter().copied().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_spread_evenly_and_spread_again_when_members_join_and_leave() {
    if skip_on_rabbitmq("x-super-stream over AMQP 0-9-1 is a FerryMQ extension") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let (_conn, ch) = t.channel().await;
    let partitions = super_stream(&ch, PARTITIONS).await;
    confirm_select(&ch).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut all = Vec::new();

    // One member: every partition.
    publish_keys(&ch, 0..200, 40).await;
    let a = join(&t, 0, 10, &partitions, &group_args("first"), &tx).await;
    let got = take_acked(&mut rx, 200).await;
    assert_eq!(owners(&got), BTreeMap::from([(0, set(&[0, 1, 2, 3]))]));
    all.extend(got);

    // Two: halves, in joining order (RocketMQ's average allocation).
    let b = join(&t, 1, 10, &partitions, &group_args("first"), &tx).await;
    publish_keys(&ch, 200..400, 40).await;
    let got = take_acked(&mut rx, 200).await;
    assert_eq!(owners(&got), BTreeMap::from([(0, set(&[0, 1])), (1, set(&[2, 3]))]));
    all.extend(got);

    // Three over four partitions: 2, 1, 1.
    let c = join(&t, 2, 10, &partitions, &group_args("first"), &tx).await;
    publish_keys(&ch, 400..600, 40).await;
    let got = take_acked(&mut rx, 200).await;
    assert_eq!(owners(&got), BTreeMap::from([(0, set(&[0, 1])), (1, set(&[2])), (2, set(&[3]))]));
    all.extend(got);

    // The first leaves: the other two share all four again.
    bounded("close", a.conn.close(200, "bye".into())).await.unwrap();
    publish_keys(&ch, 600..800, 40).await;
    let got = take_acked(&mut rx, 200).await;
    assert_eq!(owners(&got), BTreeMap::from([(1, set(&[0, 1])), (2, set(&[2, 3]))]));
    all.extend(got);

    // Nothing lost, nothing twice, every key in order and always in one partition.
    assert_eq!(all.iter().map(|g| g.seq).collect::<BTreeSet<_>>(), (0..800).collect(), "every message once");
    assert_eq!(all.len(), 800);
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut partition_of: BTreeMap<&str, usize> = BTreeMap::new();
    for g in &all {
        by_key.entry(&g.key).or_default().push(g.seq);
        assert_eq!(*partition_of.entry(&g.key).or_insert(g.partition), g.partition, "{} in one partition", g.key);
    }
    for (key, seqs) in by_key {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{key} out of order: {seqs:?}");
    }
    assert!(partition_of.values().collect::<BTreeSet<_>>().len() == PARTITIONS, "keys reach every partition");
    drop((b, c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_changes_hands_only_after_its_member_settled_and_resumes_after_restart() {
    if skip_on_rabbitmq("x-super-stream over AMQP 0-9-1 is a FerryMQ extension; restarts the broker") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let (conn, ch) = t.channel().await;
    let partitions = super_stream(&ch, 2).await;
    confirm_select(&ch).await;
    let (tx, mut rx) = mpsc::unbounded_channel();

    // Learn which keys land on the second partition (the one a second member gets).
    publish_keys(&ch, 0..20, 20).await;
    let a = join(&t, 0, 3, &partitions, &group_args("first"), &tx).await;
    let got = take_acked(&mut rx, 20).await;
    let key = got.iter().find(|g| g.partition == 1).map(|g| g.key.clone()).expect("a key on partition 1");

    // A holds three messages of that key unacked when B joins: B waits for them.
    for seq in 100..112 {
        assert!(publish_confirmed(&ch, "orders", &key, format!("{key}:{seq}").as_bytes(), persistent()).await.is_ack());
    }
    let held: Vec<Got> = {
        let mut v = Vec::new();
        while v.len() < 3 {
            v.push(bounded("held delivery", rx.recv()).await.unwrap());
        }
        v
    };
    assert_eq!(held.iter().map(|g| (g.member, g.seq)).collect::<Vec<_>>(), vec![(0, 100), (0, 101), (0, 102)]);
    let b = join(&t, 1, 2, &partitions, &group_args("first"), &tx).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv()).await.is_err(),
        "nobody reads while A holds the partition's messages"
    );
    for g in &held {
        bounded("ack", g.delivery.ack(BasicAckOptions::default())).await.unwrap();
    }
    let rest = take_acked(&mut rx, 9).await;
    assert_eq!(
        rest.iter().map(|g| (g.member, g.seq, g.redelivered)).collect::<Vec<_>>(),
        (103..112).map(|s| (1, s, false)).collect::<Vec<_>>()
    );

    // B holds two unacked (its prefetch) and goes away: A takes them over first
    // (redelivered), then the rest, in order.
    for seq in 112..116 {
        assert!(publish_confirmed(&ch, "orders", &key, format!("{key}:{seq}").as_bytes(), persistent()).await.is_ack());
    }
    for seq in [112, 113] {
        let g = bounded("delivery", rx.recv()).await.unwrap();
        assert_eq!((g.member, g.seq), (1, seq));
    }
    bounded("close", b.conn.close(200, "bye".into())).await.unwrap();
    let rest: Vec<(usize, usize, bool)> =
        take_acked(&mut rx, 4).await.iter().map(|g| (g.member, g.seq, g.redelivered)).collect();
    assert_eq!(rest, vec![(0, 112, true), (0, 113, true), (0, 114, false), (0, 115, false)]);
    drop(a);
    bounded("close", conn.close(200, "bye".into())).await.unwrap();

    // Restart: the group resumes each partition after what it acknowledged.
    let t = Target::ferrymq(t.broker.expect("FerryMQ").restart());
    let (_conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _a = join(&t, 0, 10, &partitions, &group_args("first"), &tx).await;
    publish_keys(&ch, 200..210, 20).await;
    let got = take_acked(&mut rx, 10).await;
    assert_eq!(
        got.iter().map(|g| g.seq).collect::<BTreeSet<_>>(),
        (200..210).collect(),
        "nothing acknowledged comes again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_active_group_reads_in_order_and_the_next_member_takes_over_from_the_first_unacked() {
    if skip_on_rabbitmq("x-single-active-consumer on stream consumers is a FerryMQ extension over AMQP 0-9-1") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let (_conn, ch) = t.channel().await;
    declare_stream(&ch, "ledger", &[]).await;
    confirm_select(&ch).await;
    for i in 0..10 {
        assert!(publish_confirmed(&ch, "", "ledger", format!("l:{i}").as_bytes(), persistent()).await.is_ack());
    }
    let args = table(&[
        ("x-consumer-group", string("g")),
        ("x-single-active-consumer", AMQPValue::Boolean(true)),
        ("x-stream-offset", string("first")),
    ]);
    let a_conn = t.connect().await;
    let (_a_ch, mut a) = stream_consumer(&a_conn, 4, "ledger", args.clone()).await;
    let b_conn = t.connect().await;
    let (_b_ch, mut b) = stream_consumer(&b_conn, 4, "ledger", args).await;
    let held = take(&mut a, 4).await;
    assert_eq!(held.iter().map(offset_of).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    expect_no_delivery(&mut b, Duration::from_millis(200)).await;
    for d in &held[..2] {
        bounded("ack", d.ack(BasicAckOptions::default())).await.unwrap();
    }
    // Acks give A credit; it stays the only reader.
    let more = take(&mut a, 2).await;
    assert_eq!(more.iter().map(offset_of).collect::<Vec<_>>(), vec![4, 5]);
    expect_no_delivery(&mut b, Duration::from_millis(200)).await;
    bounded("close", a_conn.close(200, "bye".into())).await.unwrap();
    let took: Vec<(i64, bool)> = take(&mut b, 4).await.iter().map(|d| (offset_of(d), d.redelivered)).collect();
    assert_eq!(took, vec![(2, true), (3, true), (4, true), (5, true)], "B starts at the first unacked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_partitioned_consumers_are_refused() {
    if skip_on_rabbitmq("x-super-stream over AMQP 0-9-1 is a FerryMQ extension") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let conn = t.connect().await;
    let ch = open_channel(&conn).await;
    super_stream(&ch, 2).await;
    declare_stream(&ch, "loose", &[]).await;
    let cases: Vec<(&str, FieldTable, u16, &str)> = vec![
        ("orders-0", table(&[("x-super-stream", string("orders"))]), 406, "x-consumer-group"),
        (
            "orders-0",
            table(&[("x-consumer-group", string("g")), ("x-super-stream", string("nope"))]),
            404,
            "no exchange 'nope'",
        ),
        (
            "loose",
            table(&[("x-consumer-group", string("g")), ("x-super-stream", string("orders"))]),
            406,
            "not a partition of super stream 'orders'",
        ),
        (
            "loose",
            table(&[("x-consumer-group", string("g")), ("x-single-active-consumer", int(1))]),
            406,
            "x-single-active-consumer",
        ),
    ];
    // Refused exclusive consumes leave no lock behind.
    let exclusive = BasicConsumeOptions { exclusive: true, ..Default::default() };
    for (stream, args, code, text) in cases {
        let ch = stream_channel(&conn, 5).await;
        let err = expect_code(
            bounded("basic.consume", ch.basic_consume(stream.into(), "".into(), exclusive, args)).await,
            code,
        );
        assert!(err.contains(text), "{err}");
    }
    let other = t.connect().await;
    for stream in ["orders-0", "loose"] {
        let ch = stream_channel(&other, 5).await;
        consume(&ch, stream, BasicConsumeOptions::default(), table(&[("x-consumer-group", string("g"))])).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_devices_feed_a_super_stream_through_amq_topic() {
    if skip_on_rabbitmq("x-super-stream over AMQP 0-9-1 is a FerryMQ extension") {
        return;
    }
    let t = Target::ferrymq(Broker::start());
    let (_conn, ch) = t.channel().await;
    let partitions = super_stream(&ch, PARTITIONS).await;
    // MQTT orders/{id} arrive on amq.topic as orders.{id}; the super stream hashes that key.
    bounded(
        "exchange.bind",
        ch.exchange_bind(
            "orders".into(),
            "amq.topic".into(),
            "orders.#".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _a = join(&t, 0, 20, &partitions, &group_args("first"), &tx).await;
    let _b = join(&t, 1, 20, &partitions, &group_args("first"), &tx).await;
    let mut device = v4::connect(t.broker.as_ref().expect("FerryMQ"), "device-1").await;
    for seq in 0..80 {
        let key = format!("k{}", seq % 16);
        device.publish_acked(&format!("orders/{key}"), v4::QoS::AtLeastOnce, false, format!("{key}:{seq}")).await;
    }
    let got = take_acked(&mut rx, 80).await;
    assert_eq!(owners(&got), BTreeMap::from([(0, set(&[0, 1])), (1, set(&[2, 3]))]));
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for g in &got {
        by_key.entry(&g.key).or_default().push(g.seq);
    }
    assert_eq!(by_key.len(), 16);
    for (key, seqs) in by_key {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{key} out of order: {seqs:?}");
    }
}
