//! Streams held by the data group: a publish to a stream through any member (AMQP with
//! confirms, MQTT QoS 1 through `amq.topic`) is acknowledged once a majority holds it, and
//! every member's copy has the same messages at the same offsets; what was acknowledged
//! survives the data group's leader being SIGKILLed, the member back has it too, and without
//! a majority a publish is refused (basic.nack), not acknowledged.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

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

    // The management API shows where the stream is, as RabbitMQ shows a stream's replicas.
    let leader = data_leader(&c, 0).await;
    let q = c.api(1).ok("/api/queues/%2f/events").await;
    assert_eq!(q["type"], json!("stream"), "{q}");
    assert_eq!(q["leader"], json!(format!("n{leader}")), "{q}");
    assert_eq!(q["members"], json!(["n0", "n1", "n2"]), "{q}");

    // SIGKILL the data group's leader: publishes through a survivor are confirmed again once
    // the other two elect one; every confirmed one is on both survivors, at the same offset.
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
    let killed = format!("n{leader}");
    eventually("the API shows the killed member offline and a new leader", WAIT, || async {
        let q = c.api(survivor).ok("/api/queues/%2f/events").await;
        let online: Vec<&str> = q["online"].as_array()?.iter().filter_map(|v| v.as_str()).collect();
        (online.len() == 2 && !online.contains(&killed.as_str()) && q["leader"] != json!(killed)).then_some(())
    })
    .await;

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

/// The AMQP address of each member that is up, as the nemesis leaves them.
type Addrs = std::sync::Arc<std::sync::Mutex<Vec<Option<std::net::SocketAddr>>>>;

/// What one publisher attempted and what was confirmed.
#[derive(Default)]
struct Published {
    attempted: BTreeSet<String>,
    confirmed: BTreeSet<String>,
}

/// Publishes `p{who}-{k}` to `stream` with confirms until `stop`, through member `who`
/// first and whichever member is up after a failure; each publish waits at most 5 s.
async fn publisher(
    who: usize,
    stream: &'static str,
    addrs: Addrs,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Published {
    let mut out = Published::default();
    let mut k = 0u64;
    let mut member = who;
    let limit = Duration::from_secs(5);
    while !*stop.borrow() {
        let addr = addrs.lock().unwrap()[member % 3];
        member += 1;
        let Some(addr) = addr else { continue };
        let uri = format!("amqp://guest:guest@{addr}/%2f");
        let Ok(Ok(conn)) = tokio::time::timeout(limit, connect_uri(&uri)).await else { continue };
        let Ok(Ok(ch)) = tokio::time::timeout(limit, conn.create_channel()).await else { continue };
        if !matches!(tokio::time::timeout(limit, ch.confirm_select(ConfirmSelectOptions::default())).await, Ok(Ok(_))) {
            continue;
        }
        while !*stop.borrow() {
            let body = format!("p{who}-{k}");
            k += 1;
            out.attempted.insert(body.clone());
            let sent = ch.basic_publish(
                "".into(),
                stream.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                persistent(),
            );
            let confirm = match tokio::time::timeout(limit, sent).await {
                Ok(Ok(c)) => c,
                _ => break,
            };
            match tokio::time::timeout(limit, confirm).await {
                Ok(Ok(c)) if c.is_ack() => {
                    out.confirmed.insert(body);
                }
                Ok(Ok(_)) => {}
                _ => break,
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), conn.close(200, "bye".into())).await;
    }
    out
}

/// Stops the publishers and gathers what they attempted and had confirmed (more than 50).
async fn stop_publishers(
    stop: &tokio::sync::watch::Sender<bool>,
    publishers: Vec<tokio::task::JoinHandle<Published>>,
    c: &Cluster,
) -> Published {
    stop.send_replace(true);
    let mut all = Published::default();
    for p in publishers {
        let p = p.await.expect("publisher");
        all.attempted.extend(p.attempted);
        all.confirmed.extend(p.confirmed);
    }
    assert!(all.confirmed.len() > 50, "only {} publishes confirmed\n{}", all.confirmed.len(), c.logs());
    all
}

/// Waits until `stream` holds as many messages on each of `members` and at least
/// `confirmed`, then reads every copy whole: the first member's copy, which every other
/// member's equals.
async fn same_copies(c: &Cluster, members: &[usize], stream: &str, confirmed: usize) -> Vec<(i64, String)> {
    let count = eventually("every copy holds every confirmed publish", Duration::from_secs(30), || async {
        let mut counts = Vec::new();
        for &i in members {
            let (conn, _) = channel(c, i).await;
            counts.push(stream_extent(&conn, stream).await.1);
        }
        (counts.iter().all(|&n| n == counts[0] && n >= confirmed as u64)).then_some(counts[0])
    })
    .await;
    let copy = read(c, members[0], stream, count as usize).await;
    for &i in &members[1..] {
        assert_eq!(read(c, i, stream, count as usize).await, copy, "n{i}'s copy is n{}'s", members[0]);
    }
    copy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_loses_nothing_confirmed_under_kills_pauses_partitions_and_rolling_restarts() {
    let mut c = Cluster::start_partitionable(3, "command_timeout_ms = 3000");
    c.leader(&[0, 1, 2]).await;
    let (_conn, ch) = channel(&c, 0).await;
    declare_stream(&ch, "total", &[]).await;
    for i in 1..3 {
        eventually("the stream on every member", WAIT, || async {
            let (conn, _) = channel(&c, i).await;
            queue_exists(&conn, "total").await.then_some(())
        })
        .await;
    }
    let addrs: Addrs =
        std::sync::Arc::new(std::sync::Mutex::new((0..3).map(|i| Some(amqp_addr(c.member(i)))).collect()));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let publishers: Vec<_> =
        (0..3).map(|who| tokio::spawn(publisher(who, "total", addrs.clone(), stop.clone()))).collect();
    let running = |c: &Cluster, a: &Addrs| {
        let mut a = a.lock().unwrap();
        for i in 0..3 {
            a[i] = c.members_up().contains(&i).then(|| amqp_addr(c.member(i)));
        }
    };
    let hold = || tokio::time::sleep(Duration::from_secs(3));
    let mut events = 0;
    // Rounds of the nemesis: the data group's leader killed and back, a random member
    // killed and back, one paused, one cut off by a partition, then every member restarted
    // in turn (a rolling restart).
    for round in 0..2 {
        let leader = data_leader(&c, (round + 1) % 3).await;
        c.kill(leader);
        running(&c, &addrs);
        hold().await;
        c.restart(leader);
        running(&c, &addrs);
        hold().await;
        let victim = (leader + 1 + round) % 3;
        c.kill(victim);
        running(&c, &addrs);
        hold().await;
        c.restart(victim);
        running(&c, &addrs);
        hold().await;
        let paused = (victim + 1) % 3;
        c.pause(paused);
        hold().await;
        c.resume(paused);
        hold().await;
        let cut = (paused + 1) % 3;
        let rest: Vec<usize> = (0..3).filter(|&i| i != cut).collect();
        c.partitions().cut(&[&[cut], &rest]);
        hold().await;
        c.partitions().heal();
        hold().await;
        events += 4;
    }
    for i in 0..3 {
        c.kill(i);
        running(&c, &addrs);
        c.restart(i);
        running(&c, &addrs);
        hold().await;
        events += 1;
    }
    assert!(events >= 11, "{events} nemesis events");
    let Published { attempted, confirmed } = stop_publishers(&stop_tx, publishers, &c).await;
    // Healed and drained: every member's copy is the same, holds every confirmed publish,
    // and nothing that was not attempted.
    c.leader(&[0, 1, 2]).await;
    let copy = same_copies(&c, &[0, 1, 2], "total", confirmed.len()).await;
    let present: Vec<&str> = copy.iter().map(|(_, b)| b.as_str()).collect();
    let unique: BTreeSet<&str> = present.iter().copied().collect();
    let lost: Vec<&String> = confirmed.iter().filter(|b| !unique.contains(b.as_str())).collect();
    let unexpected: Vec<&&str> = unique.iter().filter(|b| !attempted.contains(**b)).collect();
    eprintln!(
        "total stream: {} attempted, {} confirmed, {} present, lost {}, unexpected {}, duplicated {}",
        attempted.len(),
        confirmed.len(),
        present.len(),
        lost.len(),
        unexpected.len(),
        present.len() - unique.len()
    );
    assert!(lost.is_empty(), "confirmed but lost: {lost:?}");
    assert!(unexpected.is_empty(), "never attempted: {unexpected:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_and_one_forgotten_under_publishing_leave_every_copy_whole() {
    let mut c = Cluster::start(3, "command_timeout_ms = 3000");
    c.leader(&[0, 1, 2]).await;
    let (_conn, ch) = channel(&c, 1).await;
    declare_stream(&ch, "ledger", &[]).await;
    for i in [0, 2] {
        eventually("the stream on every member", WAIT, || async {
            let (conn, _) = channel(&c, i).await;
            queue_exists(&conn, "ledger").await.then_some(())
        })
        .await;
    }
    // Publishers through n1 and n2 (n0 is the member forgotten below).
    let addrs: Addrs = std::sync::Arc::new(std::sync::Mutex::new(vec![
        None,
        Some(amqp_addr(c.member(1))),
        Some(amqp_addr(c.member(2))),
    ]));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let publishers: Vec<_> =
        [1, 2].map(|who| tokio::spawn(publisher(who, "ledger", addrs.clone(), stop.clone()))).into();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A fourth member joins while they publish: it is sent the data group's log and
    // becomes a voter.
    let joined = c.add();
    eventually("n3 a voter of the data group", Duration::from_secs(60), || async {
        let g = c.status(1).await["data_groups"][0].clone();
        (g["voters"] == json!(["n0", "n1", "n2", "n3"])).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // n0 dies and is forgotten while they publish.
    c.kill(0);
    let (code, body) = c.api(1).delete("/api/ferrymq/cluster/members/n0").await;
    assert_eq!(code, reqwest::StatusCode::NO_CONTENT, "{body}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let Published { attempted, confirmed } = stop_publishers(&stop_tx, publishers, &c).await;
    let copy = same_copies(&c, &[1, 2, joined], "ledger", confirmed.len()).await;
    let unique: BTreeSet<&str> = copy.iter().map(|(_, b)| b.as_str()).collect();
    let lost: Vec<&String> = confirmed.iter().filter(|b| !unique.contains(b.as_str())).collect();
    assert!(lost.is_empty(), "confirmed but lost: {lost:?}");
    assert!(unique.iter().all(|b| attempted.contains(*b)), "nothing unexpected");
    eprintln!("membership under load: {} confirmed, {} in every copy", confirmed.len(), copy.len());
}
