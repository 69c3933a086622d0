//! Metadata through the metadata group: exchanges, queues, bindings, users and
//! permissions made on one member are applied on every member, with a majority's commit
//! before the client's acknowledgement.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::common::amqp::*;
use crate::common::cluster::Cluster;
use crate::common::{eventually, WAIT};

/// An AMQP channel on member `i` as guest.
async fn channel(c: &Cluster, i: usize) -> (Connection, Channel) {
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", amqp_addr(c.member(i)))).await.expect("connect");
    let ch = open_channel(&conn).await;
    (conn, ch)
}

/// Declares durable topic exchange `name`.
async fn durable_topic(ch: &Channel, name: &str) {
    let opts = ExchangeDeclareOptions { durable: true, ..Default::default() };
    declare_exchange(ch, name, ExchangeKind::Topic, opts, FieldTable::default()).await;
}

/// Declares durable queue `name`.
async fn durable_queue(ch: &Channel, name: &str) {
    declare_queue_with(ch, name, QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default())
        .await;
}

/// True when member `i` has queue `q` and exchange `x` (passive declarations).
async fn has(c: &Cluster, i: usize, x: &str, q: &str) -> bool {
    let (_conn, ch) = channel(c, i).await;
    let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
    if bounded(
        "passive exchange.declare",
        ch.exchange_declare(x.into(), ExchangeKind::Topic, passive, FieldTable::default()),
    )
    .await
    .is_err()
    {
        return false;
    }
    let (_conn, ch) = channel(c, i).await;
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    bounded("passive queue.declare", ch.queue_declare(q.into(), passive, FieldTable::default())).await.is_ok()
}

/// Waits (at most `limit`) until member `i` has exchange `x` and queue `q`.
async fn wait_has(c: &Cluster, i: usize, x: &str, q: &str, limit: Duration) {
    eventually(&format!("exchange {x} and queue {q} on n{i}"), limit, || async { has(c, i, x, q).await.then_some(()) })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_agree_on_one_leader_and_list_each_other() {
    let c = Cluster::start(3, "");
    let leader = c.leader(&[0, 1, 2]).await;
    let status = c.status(leader).await;
    let members: Vec<&str> =
        status["members"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(members, ["n0", "n1", "n2"], "{status}");
    // The leader hears from every follower; /api/nodes lists all three, running.
    let api = c.api(leader);
    eventually("every member listed as running", WAIT, || async {
        let nodes = api.ok("/api/nodes").await;
        let running: Vec<&str> = nodes
            .as_array()?
            .iter()
            .filter(|n| n["running"] == json!(true))
            .filter_map(|n| n["name"].as_str())
            .collect();
        (running.len() == 3).then_some(())
    })
    .await;
    let (code, _) = api.get("/api/nodes/n1").await;
    assert_eq!(code, StatusCode::OK);
    // The leader sees every member holding its whole log.
    eventually("no member lagging behind the leader, all three in sync", WAIT, || async {
        let s = c.status(leader).await;
        let caught_up = s["members"].as_array()?.iter().all(|m| m["lag"] == json!(0));
        (caught_up && s["in_sync"] == json!(["n0", "n1", "n2"])).then_some(())
    })
    .await;
    // /metrics names the member its figures are of, as RabbitMQ's identity series does.
    let metrics = reqwest::get(format!("{}/metrics", c.api(1).base)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("rabbitmq_identity_info{rabbitmq_node=\"n1\""), "{metrics}");
    // `ferrymq ctl cluster status` prints the same.
    let out = std::process::Command::new(crate::common::binary())
        .args(["ctl", "--url", &format!("http://{}", c.member(1).http.unwrap()), "cluster", "status"])
        .output()
        .expect("ctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("leader n{leader}")) && text.contains("n0") && text.contains("n2"), "{text}");
    // The leader's view has the in-sync set.
    let out = std::process::Command::new(crate::common::binary())
        .args(["ctl", "--url", &format!("http://{}", c.member(leader).http.unwrap()), "cluster", "status"])
        .output()
        .expect("ctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("in sync: n0, n1, n2 (3 of 3 members)"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarations_on_one_member_route_on_every_member() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    // Declared through a follower or the leader alike: member 1.
    let (_conn, ch) = channel(&c, 1).await;
    durable_topic(&ch, "orders").await;
    durable_queue(&ch, "eu-orders").await;
    bind(&ch, "eu-orders", "orders", "eu.#", FieldTable::default()).await;
    for i in [0, 2] {
        wait_has(&c, i, "orders", "eu-orders", WAIT).await;
    }
    // The binding routes on member 2: a publish there reaches its queue.
    let (_conn, ch) = channel(&c, 2).await;
    eventually("binding listed on n2", WAIT, || async {
        let b = c.api(2).ok("/api/queues/%2f/eu-orders/bindings").await;
        b.as_array()?.iter().any(|b| b["source"] == json!("orders") && b["routing_key"] == json!("eu.#")).then_some(())
    })
    .await;
    assert_eq!(super::publish_then_get(&ch, "orders", "eu.de", "eu-orders", b"o-1").await, b"o-1");
    // Deleted through member 0: gone everywhere.
    let (_conn, ch) = channel(&c, 0).await;
    bounded("queue.delete", ch.queue_delete("eu-orders".into(), QueueDeleteOptions::default())).await.expect("delete");
    for i in [1, 2] {
        eventually(&format!("queue gone on n{i}"), WAIT, || async {
            let (code, _) = c.api(i).get("/api/queues/%2f/eu-orders").await;
            (code == StatusCode::NOT_FOUND).then_some(())
        })
        .await;
    }
}

/// Declares durable queue `q` on member `i` with `x-max-length` `len`: the AMQP reply code
/// of a refusal.
async fn declare_with_length(c: &Cluster, i: usize, q: &str, len: i32) -> Result<(), u16> {
    let (_conn, ch) = channel(c, i).await;
    let opts = QueueDeclareOptions { durable: true, ..Default::default() };
    let declared = bounded("queue.declare", ch.queue_declare(q.into(), opts, table(&[("x-max-length", int(len))])));
    match declared.await {
        Ok(_) => Ok(()),
        Err(e) => Err(amqp_error(&e).map_or(0, |(code, _)| code)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_declarations_on_two_members_settle_on_one_everywhere() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    // Members 1 and 2 declare each queue at once, with different arguments. Whichever
    // commits first is the queue; the other is refused as RabbitMQ refuses an inequivalent
    // redeclaration (406), whether it saw the queue already or was judged in the log.
    let mut winners = Vec::new();
    for n in 0..12 {
        let q = format!("contested-{n}");
        let (one, two) = tokio::join!(declare_with_length(&c, 1, &q, 1), declare_with_length(&c, 2, &q, 2));
        let winner = match (one, two) {
            (Ok(()), Err(406)) => 1,
            (Err(406), Ok(())) => 2,
            other => panic!("{q}: exactly one declaration is accepted, the other refused with 406: {other:?}"),
        };
        winners.push((q, winner));
    }
    // Every member holds the accepted declaration's argument.
    for i in 0..3 {
        let api = c.api(i);
        for (q, len) in &winners {
            eventually(&format!("{q} with x-max-length {len} on n{i}"), WAIT, || async {
                let (status, queue) = api.get(&format!("/api/queues/%2f/{q}")).await;
                (status == StatusCode::OK && queue["arguments"]["x-max-length"] == json!(len)).then_some(())
            })
            .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_made_on_one_member_logs_in_on_another_until_deleted() {
    let c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let (code, _) = c.api(0).put("/api/users/alice", json!({"password": "wonderland", "tags": ""})).await;
    assert_eq!(code, StatusCode::CREATED);
    let (code, _) =
        c.api(0).put("/api/permissions/%2f/alice", json!({"configure": ".*", "write": ".*", "read": ".*"})).await;
    assert_eq!(code, StatusCode::CREATED);
    let uri = format!("amqp://alice:wonderland@{}/%2f", amqp_addr(c.member(2)));
    eventually("alice logs in on n2", WAIT, || async { connect_uri(&uri).await.ok() }).await;
    let (code, _) = c.api(1).delete("/api/users/alice").await;
    assert_eq!(code, StatusCode::NO_CONTENT);
    eventually("alice refused on n2", WAIT, || async { connect_uri(&uri).await.is_err().then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_go_on_without_a_dead_leader_and_it_catches_up_on_return() {
    let mut c = Cluster::start(3, "");
    let leader = c.leader(&[0, 1, 2]).await;
    c.kill(leader);
    let rest: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let new_leader = c.leader(&rest).await;
    assert_ne!(new_leader, leader);
    // Acknowledged by the two that are left (a majority of three).
    let other = rest.iter().copied().find(|i| *i != new_leader).unwrap();
    let (_conn, ch) = channel(&c, other).await;
    durable_topic(&ch, "after").await;
    durable_queue(&ch, "after-q").await;
    // The old leader comes back and is sent what it missed.
    c.restart(leader);
    wait_has(&c, leader, "after", "after-q", Duration::from_secs(30)).await;
    c.leader(&[0, 1, 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_a_declaration_or_deletion_is_refused_and_not_made() {
    let mut c = Cluster::start(3, "command_timeout_ms = 2000");
    c.leader(&[0, 1, 2]).await;
    let (_conn, ch) = channel(&c, 0).await;
    durable_queue(&ch, "stays").await;
    durable_topic(&ch, "stays-x").await;
    c.kill(1);
    c.kill(2);
    // A deletion without a majority is refused too, and the queue is left as it was.
    let (_conn, ch) = channel(&c, 0).await;
    let deleted =
        bounded("queue.delete without a majority", ch.queue_delete("stays".into(), QueueDeleteOptions::default()))
            .await;
    let text = expect_code(deleted, 541);
    assert!(text.contains("not committed"), "{text}");
    assert!(c.api(0).get("/api/queues/%2f/stays").await.0.is_success(), "the refused deletion left the queue");
    let (_conn, ch) = channel(&c, 0).await;
    let deleted = bounded(
        "exchange.delete without a majority",
        ch.exchange_delete("stays-x".into(), ExchangeDeleteOptions::default()),
    )
    .await;
    expect_code(deleted, 541);
    assert!(c.api(0).get("/api/exchanges/%2f/stays-x").await.0.is_success(), "the refused deletion left the exchange");
    let (_conn, ch) = channel(&c, 0).await;
    let declared = bounded(
        "exchange.declare without a majority",
        ch.exchange_declare(
            "lonely".into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        ),
    )
    .await;
    let code = expect_code(declared, 541);
    assert!(code.contains("not committed") && code.contains("majority"), "{code}");
    let (code, _) = c.api(0).get("/api/exchanges/%2f/lonely").await;
    assert_eq!(code, StatusCode::NOT_FOUND, "a refused declaration leaves nothing behind");
    // A second member back: a majority again, and the same declaration is acknowledged.
    c.restart(1);
    c.leader(&[0, 1]).await;
    let (_conn, ch) = channel(&c, 0).await;
    durable_topic(&ch, "lonely").await;
    eventually("declared on n1 too", WAIT, || async {
        let (code, _) = c.api(1).get("/api/exchanges/%2f/lonely").await;
        code.is_success().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_joins_by_itself_and_a_forgotten_one_no_longer_counts() {
    let mut c = Cluster::start(3, "command_timeout_ms = 3000");
    c.leader(&[0, 1, 2]).await;
    let (_conn, ch) = channel(&c, 0).await;
    durable_topic(&ch, "before").await;
    durable_queue(&ch, "before-q").await;
    // n3 names the group in its cluster.peers: it is added (sent the log first).
    let joined = c.add();
    eventually("n3 a voting member on n0", Duration::from_secs(30), || async {
        let s = c.status(0).await;
        let m = s["members"].as_array()?.iter().find(|m| m["name"] == json!("n3"))?.clone();
        (m["role"] == json!("follower") && m["running"] == json!(true)).then_some(())
    })
    .await;
    wait_has(&c, joined, "before", "before-q", WAIT).await;
    // Four members: two dead ones leave no majority, until one of them is forgotten.
    c.kill(1);
    let ctl = |args: &[&str]| {
        let url = format!("http://{}", c.member(0).http.unwrap());
        std::process::Command::new(crate::common::binary())
            .args(["ctl", "--url", &url])
            .args(args)
            .output()
            .expect("ctl")
    };
    let out = ctl(&["cluster", "forget", "n1"]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    c.kill(2);
    let (_conn, ch) = channel(&c, joined).await;
    durable_topic(&ch, "after-forget").await;
    let s = c.status(0).await;
    let names: Vec<&str> = s["members"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["n0", "n2", "n3"], "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_limits_and_the_cluster_name_set_on_one_member_hold_on_every_member() {
    let c = Cluster::start(3, "\n[auth]\nauthorization = true");
    c.leader(&[0, 1, 2]).await;
    let mut anon = crate::common::v4::connect(c.member(2), "anon-before").await;
    let refused = anon.subscribe("news/#", rumqttc::QoS::AtMostOnce).await;
    assert_eq!(refused, vec![rumqttc::SubscribeReasonCode::Failure]);
    let rules = json!([{ "permission": "allow", "action": "subscribe", "anonymous": true, "topics": ["news/#"] }]);
    assert_eq!(c.api(0).put("/api/mqtt/rules", rules).await.0, StatusCode::NO_CONTENT);
    eventually("the rule applies on n2", WAIT, || async {
        let mut anon = crate::common::v4::connect(c.member(2), "anon-after").await;
        let granted = anon.subscribe("news/#", rumqttc::QoS::AtMostOnce).await;
        (granted == vec![rumqttc::SubscribeReasonCode::Success(rumqttc::QoS::AtMostOnce)]).then_some(())
    })
    .await;
    // A vhost limit set through n1 refuses a queue on n2.
    assert_eq!(c.api(1).put("/api/vhost-limits/%2f/max-queues", json!({"value": 1})).await.0, StatusCode::NO_CONTENT);
    eventually("the limit is on n2", WAIT, || async {
        let limits = c.api(2).ok("/api/vhost-limits/%2f").await;
        (limits[0]["value"]["max-queues"] == json!(1)).then_some(())
    })
    .await;
    let (_conn, ch) = channel(&c, 2).await;
    durable_queue(&ch, "only-one").await;
    let second = bounded(
        "queue.declare past the limit",
        ch.queue_declare("two".into(), QueueDeclareOptions::default(), FieldTable::default()),
    )
    .await;
    expect_code(second, 406);
    // The cluster name, set through n1, is every member's.
    assert_eq!(c.api(1).put("/api/cluster-name", json!({"name": "fleet"})).await.0, StatusCode::NO_CONTENT);
    eventually("the cluster name on n0", WAIT, || async {
        (c.api(0).ok("/api/cluster-name").await["name"] == json!("fleet")).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_is_replaced_and_follows_once_resumed() {
    let c = Cluster::start(3, "");
    let leader = c.leader(&[0, 1, 2]).await;
    c.pause(leader);
    let rest: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let new_leader = c.leader(&rest).await;
    let (_conn, ch) = channel(&c, new_leader).await;
    durable_topic(&ch, "while-paused").await;
    durable_queue(&ch, "while-paused-q").await;
    c.resume(leader);
    // The old leader learns of the newer term, follows, and is sent what it missed.
    eventually("the resumed member follows the new leader", Duration::from_secs(30), || async {
        let s = c.status(leader).await;
        (s["leader"] == json!(format!("n{new_leader}"))).then_some(())
    })
    .await;
    wait_has(&c, leader, "while-paused", "while-paused-q", WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_disk_was_replaced_rejoins_as_a_new_node() {
    let mut c = Cluster::start(3, "");
    c.leader(&[0, 1, 2]).await;
    let (_conn, ch) = channel(&c, 0).await;
    durable_topic(&ch, "kept").await;
    durable_queue(&ch, "kept-q").await;
    let old_ids = c.status(0).await;
    c.kill(2);
    c.wipe(2);
    c.restart(2);
    // It is sent everything again, and its old id is out of the group: three members.
    wait_has(&c, 2, "kept", "kept-q", Duration::from_secs(30)).await;
    eventually("n2 a voting member once, under its new id", Duration::from_secs(30), || async {
        let s = c.status(0).await;
        let members = s["members"].as_array()?;
        let n2: Vec<_> = members.iter().filter(|m| m["name"] == json!("n2")).collect();
        (members.len() == 3 && n2.len() == 1 && n2[0]["role"] == json!("follower")).then_some(())
    })
    .await;
    assert_eq!(old_ids["members"].as_array().unwrap().len(), 3);
    // A majority of the new membership acknowledges with n0 gone.
    c.kill(0);
    c.leader(&[1, 2]).await;
    let (_conn, ch) = channel(&c, 2).await;
    durable_topic(&ch, "after-replacement").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_leaves_is_no_longer_counted() {
    let mut c = Cluster::start(3, "command_timeout_ms = 3000");
    let leader = c.leader(&[0, 1, 2]).await;
    // The leader itself leaves: the other two go on as a cluster of two.
    let url = format!("http://{}", c.member(leader).http.unwrap());
    let out = std::process::Command::new(crate::common::binary())
        .args(["ctl", "--url", &url, "cluster", "leave"])
        .output()
        .expect("ctl");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains(&format!("n{leader} left the cluster")), "{said}");
    c.kill(leader);
    let rest: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    c.leader(&rest).await;
    let s = c.status(rest[0]).await;
    let names: Vec<&str> = s["members"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    let expected: Vec<String> = rest.iter().map(|i| format!("n{i}")).collect();
    assert_eq!(names, expected, "{s}");
    // Both left must commit (a majority of two), and do.
    let (_conn, ch) = channel(&c, rest[1]).await;
    durable_topic(&ch, "after-leave").await;
    eventually("declared on the other member", WAIT, || async {
        c.api(rest[0]).get("/api/exchanges/%2f/after-leave").await.0.is_success().then_some(())
    })
    .await;
}
