//! Any member serves any client: a publish through one member reaches the subscribers and
//! transient queues of every member (forwarded over the peer link to the members whose
//! own bindings match), once, and a member that is down holds no publisher up.

use std::time::Duration;

use futures_util::StreamExt;

use crate::common::amqp::*;
use crate::common::cluster::Cluster;
use crate::common::v4::{self, QoS};
use crate::common::WAIT;

/// An AMQP channel on member `i` as guest.
async fn channel(c: &Cluster, i: usize) -> (Connection, Channel) {
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", amqp_addr(c.member(i)))).await.expect("connect");
    let ch = open_channel(&conn).await;
    (conn, ch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_publish_through_one_member_reaches_subscribers_on_every_member() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let mut on1 = v4::connect(c.member(1), "sub-on-1").await;
    on1.subscribe("fleet/+/state", QoS::AtLeastOnce).await;
    let mut on2 = v4::connect(c.member(2), "sub-on-2").await;
    on2.subscribe("fleet/#", QoS::AtLeastOnce).await;
    let mut publisher = v4::connect(c.member(0), "pub-on-0").await;
    // Acknowledged once both members routed it; each subscriber gets it once.
    publisher.publish_acked("fleet/7/state", QoS::AtLeastOnce, false, "on").await;
    for sub in [&mut on1, &mut on2] {
        let p = sub.next_publish().await;
        assert_eq!((p.topic.as_str(), &p.payload[..]), ("fleet/7/state", &b"on"[..]));
        assert_eq!(p.qos, QoS::AtLeastOnce);
    }
    // QoS 0 too, and a subscriber on the publisher's own member as before.
    let mut on0 = v4::connect(c.member(0), "sub-on-0").await;
    on0.subscribe("fleet/+/state", QoS::AtMostOnce).await;
    publisher.client.publish("fleet/8/state", QoS::AtMostOnce, false, "off").await.unwrap();
    for sub in [&mut on0, &mut on1, &mut on2] {
        let p = sub.next_publish().await;
        assert_eq!((p.topic.as_str(), &p.payload[..]), ("fleet/8/state", &b"off"[..]));
    }
    // No duplicate came after either.
    on1.expect_no_publish(Duration::from_millis(300)).await;
    on2.expect_no_publish(Duration::from_millis(100)).await;
    // Unsubscribed on n2: only n1's subscriber gets the next one.
    on2.client.unsubscribe("fleet/#").await.unwrap();
    loop {
        if let v4::Packet::UnsubAck(_) = on2.next().await {
            break;
        }
    }
    // The other members learn of the unsubscription as they learn of subscriptions: a
    // publish right after may still be forwarded, and is then not delivered.
    publisher.publish_acked("fleet/9/state", QoS::AtLeastOnce, false, "again").await;
    assert_eq!(&on1.next_publish().await.payload[..], b"again");
    on2.expect_no_publish(Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_session_on_another_member_gets_what_was_published_while_it_was_away() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let mut device = v4::connect_persistent(c.member(1), "device-1").await;
    device.subscribe("cmd/device-1", QoS::AtLeastOnce).await;
    drop(device);
    let mut publisher = v4::connect(c.member(0), "backend").await;
    for n in 0..5 {
        // Acknowledged once n1 stored it in the session's queue.
        publisher.publish_acked("cmd/device-1", QoS::AtLeastOnce, false, format!("cmd-{n}")).await;
    }
    let mut device = v4::connect_persistent(c.member(1), "device-1").await;
    assert!(device.connack.session_present, "the session was kept");
    for n in 0..5 {
        assert_eq!(device.next_publish().await.payload, format!("cmd-{n}").into_bytes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_amqp_queues_on_one_member_get_publishes_through_another_and_durable_ones_once() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    // An exclusive, server-named queue on n1, bound to amq.topic.
    let (_conn1, ch1) = channel(&c, 1).await;
    let q = declare_exclusive(&ch1).await;
    bind(&ch1, &q, "amq.topic", "sensors.#", FieldTable::default()).await;
    let mut consumer =
        consume(&ch1, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    // Through n0: to amq.topic, by the default exchange with the queue's name, and from MQTT.
    let (_conn0, ch0) = channel(&c, 0).await;
    confirm_select(&ch0).await;
    for (exchange, key, body) in [("amq.topic", "sensors.a", "topic"), ("", q.as_str(), "default")] {
        assert!(publish_confirmed(&ch0, exchange, key, body.as_bytes(), persistent()).await.is_ack());
        assert_eq!(next_delivery(&mut consumer).await.data, body.as_bytes());
    }
    let mut mqtt = v4::connect(c.member(0), "mqtt-on-0").await;
    mqtt.publish_acked("sensors/b", QoS::AtLeastOnce, false, "mqtt").await;
    let d = next_delivery(&mut consumer).await;
    assert_eq!((d.routing_key.as_str(), &d.data[..]), ("sensors.b", &b"mqtt"[..]));

    // A durable queue is on every member (the metadata group made it there): a publish
    // through n0 is stored in n0's, not forwarded to the others'.
    declare_queue_with(
        &ch0,
        "orders",
        QueueDeclareOptions { durable: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    bind(&ch0, "orders", "amq.topic", "sensors.#", FieldTable::default()).await;
    mqtt.publish_acked("sensors/c", QoS::AtLeastOnce, false, "stored once").await;
    assert_eq!(next_delivery(&mut consumer).await.data, b"stored once");
    let got =
        crate::common::eventually("the message in n0's orders", WAIT, || async { get(&ch0, "orders", true).await })
            .await;
    assert_eq!(got.delivery.data, b"stored once");
    let (_conn2, ch2) = channel(&c, 2).await;
    assert!(get(&ch2, "orders", true).await.is_none(), "not forwarded to n2's copy of the durable queue");
    assert!(get(&ch1, "orders", true).await.is_none(), "nor to n1's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_is_down_holds_no_publisher_up_and_is_forwarded_to_once_back() {
    let mut c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let mut on1 = v4::connect(c.member(1), "sub-on-1").await;
    on1.subscribe("alerts/#", QoS::AtLeastOnce).await;
    let on2 = {
        let mut s = v4::connect(c.member(2), "sub-on-2").await;
        s.subscribe("alerts/#", QoS::AtLeastOnce).await;
        s
    };
    drop(on2);
    c.kill(2);
    // n2's binding is still known to n0, but n2 cannot be reached: every publish is
    // acknowledged (bounded waits), and n1's subscriber gets each once.
    let mut publisher = v4::connect(c.member(0), "pub-on-0").await;
    for n in 0..20 {
        publisher.publish_acked(&format!("alerts/{n}"), QoS::AtLeastOnce, false, "down").await;
    }
    for n in 0..20 {
        assert_eq!(on1.next_publish().await.topic, format!("alerts/{n}"));
    }
    // What was for n2 was dropped and counted.
    let status = c.status(0).await;
    assert!(status["forward_dropped"].as_u64().unwrap_or(0) >= 1, "{status}");
    let metrics = reqwest::get(format!("{}/metrics", c.api(0).base)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ferrymq_cluster_forward_dropped_total "), "{metrics}");
    // Back, n2 tells the others its bindings again: a new subscriber there is reached.
    c.restart(2);
    let mut back = v4::connect(c.member(2), "sub-on-2-again").await;
    back.subscribe("alerts/#", QoS::AtLeastOnce).await;
    publisher.publish_acked("alerts/back", QoS::AtLeastOnce, false, "up").await;
    assert_eq!(back.next_publish().await.topic, "alerts/back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_member_is_no_longer_forwarded_to() {
    let mut c = Cluster::start(3, "command_timeout_ms = 3000");
    c.leader(&[0, 1, 2]).await;
    {
        let mut on2 = v4::connect(c.member(2), "sub-on-2").await;
        on2.subscribe("alerts/#", QoS::AtLeastOnce).await;
    }
    c.kill(2);
    let (code, body) = c.api(0).delete("/api/ferrymq/cluster/members/n2").await;
    assert_eq!(code, reqwest::StatusCode::NO_CONTENT, "{body}");
    // While n0 still forwards to n2, each publish to its binding is dropped and counted;
    // once it forgot n2, none is.
    let mut publisher = v4::connect(c.member(0), "pub-on-0").await;
    let dropped = || async { c.status(0).await["forward_dropped"].as_u64().unwrap_or(0) };
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let before = dropped().await;
        publisher.publish_acked("alerts/probe", QoS::AtLeastOnce, false, "x").await;
        if dropped().await == before {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "n0 still forwards to the forgotten n2\n{}", c.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = dropped().await;
    for n in 0..20 {
        publisher.publish_acked(&format!("alerts/{n}"), QoS::AtLeastOnce, false, "x").await;
    }
    assert_eq!(dropped().await, before, "nothing forwarded to a forgotten member");
    assert!(c.member(0).log().contains("no longer forwarding to a member that was forgotten"), "{}", c.logs());
}

/// The retained messages a new subscriber to `filter` on member `i` is sent: (topic,
/// payload), sorted.
async fn retained_on(c: &Cluster, i: usize, id: &str, filter: &str, expected: usize) -> Vec<(String, Vec<u8>)> {
    let mut sub = v4::connect(c.member(i), id).await;
    sub.subscribe(filter, QoS::AtLeastOnce).await;
    let mut got = Vec::new();
    for _ in 0..expected {
        let p = sub.next_publish().await;
        assert!(p.retain, "a retained message is sent with RETAIN: {p:?}");
        got.push((p.topic.clone(), p.payload.to_vec()));
    }
    sub.expect_no_publish(Duration::from_millis(300)).await;
    got.sort();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_messages_set_through_one_member_are_on_every_member() {
    let mut c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let mut on0 = v4::connect(c.member(0), "lamp").await;
    on0.publish_acked("home/lamp", QoS::AtLeastOnce, true, "on").await;
    // Acknowledged once committed: a new subscriber on another member is sent it.
    assert_eq!(retained_on(&c, 1, "sub-1", "home/#", 1).await, [("home/lamp".to_owned(), b"on".to_vec())]);
    // A member down meanwhile is sent what it missed when it is back.
    c.kill(2);
    let mut on1 = v4::connect(c.member(1), "door").await;
    on1.publish_acked("home/door", QoS::AtLeastOnce, true, "open").await;
    c.restart(2);
    let both = vec![("home/door".to_owned(), b"open".to_vec()), ("home/lamp".to_owned(), b"on".to_vec())];
    crate::common::eventually("n2 back with both retained messages", WAIT, || async {
        let mut sub = v4::connect(c.member(2), "sub-2").await;
        sub.subscribe("home/#", QoS::AtLeastOnce).await;
        let mut got = Vec::new();
        while let Ok(Some(Ok(v4::Packet::Publish(p)))) =
            tokio::time::timeout(Duration::from_millis(300), sub.events.recv()).await
        {
            got.push((p.topic.clone(), p.payload.to_vec()));
        }
        got.sort();
        (got == both).then_some(())
    })
    .await;
    // Cleared through n2 (an empty retained publish): gone everywhere.
    let mut on2 = v4::connect(c.member(2), "lamp-off").await;
    on2.publish_acked("home/lamp", QoS::AtLeastOnce, true, "").await;
    for (i, id) in [(0, "sub-0b"), (1, "sub-1b")] {
        assert_eq!(retained_on(&c, i, id, "home/#", 1).await, [("home/door".to_owned(), b"open".to_vec())]);
    }
    // And kept on disk: n1 restarted still has it.
    c.kill(1);
    c.restart(1);
    assert_eq!(retained_on(&c, 1, "sub-1c", "home/#", 1).await, [("home/door".to_owned(), b"open".to_vec())]);
}

/// Collects the payloads `sub` receives until none comes for 500 ms.
async fn drain(sub: &mut v4::Client) -> Vec<String> {
    let mut got = Vec::new();
    while let Ok(Some(Ok(packet))) = tokio::time::timeout(Duration::from_millis(500), sub.events.recv()).await {
        if let v4::Packet::Publish(p) = packet {
            got.push(String::from_utf8_lossy(&p.payload).into_owned());
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_group_with_members_on_several_members_takes_each_message_once() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    // Group `workers` has a member on n1 and one on n2; n1 also has a plain subscriber to
    // the same filter (so a publish is forwarded to n1 whether or not n1 takes it for the
    // group).
    let mut w1 = v4::connect(c.member(1), "worker-on-1").await;
    w1.subscribe("$share/workers/jobs/#", QoS::AtLeastOnce).await;
    let mut w2 = v4::connect(c.member(2), "worker-on-2").await;
    w2.subscribe("$share/workers/jobs/#", QoS::AtLeastOnce).await;
    let mut watcher = v4::connect(c.member(1), "watcher-on-1").await;
    watcher.subscribe("jobs/#", QoS::AtLeastOnce).await;
    let mut publisher = v4::connect(c.member(0), "dispatcher").await;
    for n in 0..40 {
        publisher.publish_acked(&format!("jobs/{n}"), QoS::AtLeastOnce, false, format!("job-{n}")).await;
    }
    // Every job once in the group, spread over both members by topic; the plain
    // subscriber gets every one.
    let (mut got1, mut got2) = (drain(&mut w1).await, drain(&mut w2).await);
    assert!(!got1.is_empty() && !got2.is_empty(), "both members' workers take jobs: {got1:?} / {got2:?}");
    got1.append(&mut got2);
    got1.sort();
    let mut all: Vec<String> = (0..40).map(|n| format!("job-{n}")).collect();
    all.sort();
    assert_eq!(got1, all, "each job once in the group");
    assert_eq!(drain(&mut watcher).await.len(), 40);
    // With a member of the group on the publishing member, that member's takes them all.
    let mut w0 = v4::connect(c.member(0), "worker-on-0").await;
    w0.subscribe("$share/workers/jobs/#", QoS::AtLeastOnce).await;
    for n in 0..10 {
        publisher.publish_acked(&format!("jobs/{n}"), QoS::AtLeastOnce, false, format!("local-{n}")).await;
    }
    assert_eq!(drain(&mut w0).await.len(), 10, "the group's member on the publishing member takes them");
    assert!(drain(&mut w1).await.is_empty() && drain(&mut w2).await.is_empty(), "and no other member's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_publishes_and_transient_exchanges_reach_other_members() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    // A delayed publish through n0 reaches n1's subscriber when its time comes.
    let mut on1 = v4::connect(c.member(1), "later-on-1").await;
    on1.subscribe("later/x", QoS::AtLeastOnce).await;
    let mut publisher = v4::connect(c.member(0), "pub-on-0").await;
    publisher.publish_acked("$delayed/1/later/x", QoS::AtLeastOnce, false, "in a second").await;
    let p = on1.next_publish().await;
    assert_eq!((p.topic.as_str(), &p.payload[..]), ("later/x", &b"in a second"[..]));

    // A transient exchange of one name on n0 and n1, n1's exclusive queue bound to it.
    let transient = ExchangeDeclareOptions::default();
    let (_conn0, ch0) = channel(&c, 0).await;
    confirm_select(&ch0).await;
    declare_exchange(&ch0, "tx", ExchangeKind::Direct, transient, FieldTable::default()).await;
    let (_conn1, ch1) = channel(&c, 1).await;
    declare_exchange(&ch1, "tx", ExchangeKind::Direct, transient, FieldTable::default()).await;
    let q = declare_exclusive(&ch1).await;
    bind(&ch1, &q, "tx", "k", FieldTable::default()).await;
    let mut consumer =
        consume(&ch1, &q, BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default()).await;
    // Routed on n1 by n1's own `tx` (the binding that matched on n0 names it).
    let first = publish_confirmed(&ch0, "tx", "k", b"first", persistent()).await;
    assert!(first.is_ack(), "{first:?}");
    assert_eq!(next_delivery(&mut consumer).await.data, b"first");
    // n0 deletes its `tx` (taking n1's binding there with it) and declares it again: n1's
    // binding is made there again, and publishes reach n1's queue again.
    bounded("exchange.delete", ch0.exchange_delete("tx".into(), ExchangeDeleteOptions::default())).await.unwrap();
    declare_exchange(&ch0, "tx", ExchangeKind::Direct, transient, FieldTable::default()).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let again = loop {
        assert!(tokio::time::Instant::now() < deadline, "n1's binding not made again on n0's new tx");
        assert!(publish_confirmed(&ch0, "tx", "k", b"again", persistent()).await.is_ack());
        if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(300), consumer.next()).await {
            break d;
        }
    };
    assert_eq!(again.data, b"again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_member_holds_no_publisher_up() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let mut on2 = v4::connect(c.member(2), "sub-on-2").await;
    on2.subscribe("alerts/#", QoS::AtLeastOnce).await;
    let mut on1 = v4::connect(c.member(1), "sub-on-1").await;
    on1.subscribe("alerts/#", QoS::AtLeastOnce).await;
    c.pause(2);
    // Once n0 no longer hears from n2, it gives n2 nothing: each publish is acknowledged
    // without waiting for n2 (a bounded wait far below a forward's 5 s timeout).
    let api = c.api(0);
    crate::common::eventually("n0 listing n2 as not running", Duration::from_secs(20), || async {
        let nodes = api.ok("/api/nodes").await;
        nodes.as_array()?.iter().any(|n| n["name"] == "n2" && n["running"] == false).then_some(())
    })
    .await;
    let mut publisher = v4::connect(c.member(0), "pub-on-0").await;
    for n in 0..10 {
        let topic = format!("alerts/{n}");
        tokio::time::timeout(
            Duration::from_secs(2),
            publisher.publish_acked(&topic, QoS::AtLeastOnce, false, "while n2 is paused"),
        )
        .await
        .unwrap_or_else(|_| panic!("{topic} not acknowledged within 2 s while n2 is paused"));
        assert_eq!(on1.next_publish().await.topic, topic);
    }
    c.resume(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_id_is_connected_once_across_the_members() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    // An MQTT 5 client on n0; the same client id connects to n1: the first is taken over
    // (DISCONNECT 0x8E) before the second's CONNACK, as on one broker.
    let mut first = crate::common::v5::connect(c.member(0), "device-7").await;
    let second = crate::common::v5::connect(c.member(1), "device-7").await;
    let (code, _) = first.expect_server_disconnect().await;
    assert!(code.contains("SessionTakenOver"), "{code}");
    // And a 3.1.1 client on n1 taken over from n2 is closed.
    drop(second);
    let mut old = v4::connect(c.member(1), "device-8").await;
    let _new = v4::connect(c.member(2), "device-8").await;
    old.expect_closed().await;
}
