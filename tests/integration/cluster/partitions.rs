//! Network partitions of the metadata group, as RabbitMQ's Jepsen suite makes them (an
//! isolated leader, halves, a majority ring), through a proxy on every peer link: only a
//! side with a majority acknowledges changes, the other refuses them and keeps serving
//! what it has, and once healed every member holds what was acknowledged and nothing that
//! was refused.

use std::time::{Duration, Instant};

use serde_json::json;

use super::publish_then_get;
use crate::common::amqp::*;
use crate::common::cluster::Cluster;
use crate::common::{eventually, WAIT};

/// Waits for a member to apply what it missed while cut off, or for an election.
const CATCH_UP: Duration = Duration::from_secs(30);

/// Declares durable queue `q` on member `i`: the reply code and text of a refusal.
async fn declare(c: &Cluster, i: usize, q: &str) -> Result<(), (u16, String)> {
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", amqp_addr(c.member(i)))).await.expect("connect");
    let ch = open_channel(&conn).await;
    let opts = QueueDeclareOptions { durable: true, ..Default::default() };
    match bounded("queue.declare", ch.queue_declare(q.into(), opts, FieldTable::default())).await {
        Ok(_) => Ok(()),
        Err(e) => Err(amqp_error(&e).unwrap_or((0, e.to_string()))),
    }
}

/// Declares durable queue `q` on member `i`, again after each refusal (an election in
/// progress), until acknowledged.
async fn declare_acknowledged(c: &Cluster, i: usize, q: &str) {
    eventually(&format!("{q} acknowledged by n{i}"), CATCH_UP, || async { declare(c, i, q).await.ok() }).await;
}

/// Asserts that member `i` refuses to declare `q` as a member without a majority does.
async fn assert_refused(c: &Cluster, i: usize, q: &str) {
    match declare(c, i, q).await {
        Err((541, text)) => assert!(text.contains("not committed"), "{text}"),
        other => panic!("n{i}, cut from the majority, acknowledged or refused {q} otherwise: {other:?}"),
    }
}

/// Whether member `i` has queue `q` (its management API).
async fn has(c: &Cluster, i: usize, q: &str) -> bool {
    c.api(i).get(&format!("/api/queues/%2f/{q}")).await.0.is_success()
}

/// Waits until member `i` has queue `q`.
async fn wait_has(c: &Cluster, i: usize, q: &str) {
    eventually(&format!("{q} on n{i}"), CATCH_UP, || async { has(c, i, q).await.then_some(()) }).await;
}

/// Waits until member `i` lists each of `others` as not running (not heard from).
async fn wait_sees_down(c: &Cluster, i: usize, others: &[usize]) {
    let api = c.api(i);
    eventually(&format!("n{i} listing {others:?} as not running"), WAIT, || async {
        let nodes = api.ok("/api/nodes").await;
        let nodes = nodes.as_array()?;
        others
            .iter()
            .all(|o| nodes.iter().any(|n| n["name"] == json!(format!("n{o}")) && n["running"] == json!(false)))
            .then_some(())
    })
    .await;
}

/// Sleeps until `since + length`: the partition lasts that long whatever the test did in it.
async fn hold(since: Instant, length: Duration) {
    tokio::time::sleep(length.saturating_sub(since.elapsed())).await;
}

/// Declares durable queue `q` and waits until every member has it.
async fn declare_everywhere(c: &Cluster, q: &str) {
    declare_acknowledged(c, 0, q).await;
    for i in 0..3 {
        wait_has(c, i, q).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_refuses_changes_and_follows_the_majority_once_healed() {
    let c = Cluster::start_partitionable(3, "command_timeout_ms = 3000");
    let leader = c.leader(&[0, 1, 2]).await;
    let rest: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    declare_everywhere(&c, "before").await;

    let cut = Instant::now();
    c.partitions().cut(&[&[leader], &rest]);
    // The two others elect one of them and acknowledge changes, through either of them.
    let new_leader = c.leader(&rest).await;
    let follower = rest.iter().copied().find(|i| *i != new_leader).unwrap();
    declare_acknowledged(&c, new_leader, "majority-side").await;
    declare_acknowledged(&c, follower, "majority-side-forwarded").await;
    // The old leader, alone, refuses; it sees the others as gone and still serves its
    // clients what exists (a persistent message to a queue declared before).
    assert_refused(&c, leader, "minority-side").await;
    wait_sees_down(&c, leader, &rest).await;
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", amqp_addr(c.member(leader)))).await.unwrap();
    let ch = open_channel(&conn).await;
    assert_eq!(publish_then_get(&ch, "", "before", "before", b"cut off").await, b"cut off");
    hold(cut, Duration::from_secs(10)).await;

    c.partitions().heal();
    // The old leader follows the new one, has what the majority acknowledged, and what it
    // refused is nowhere.
    eventually("the old leader following the new one", CATCH_UP, || async {
        (c.status(leader).await["leader"] == json!(format!("n{new_leader}"))).then_some(())
    })
    .await;
    for i in 0..3 {
        wait_has(&c, i, "majority-side").await;
        wait_has(&c, i, "majority-side-forwarded").await;
        assert!(!has(&c, i, "minority-side").await, "n{i} has the declaration the isolated leader refused");
    }
    declare_acknowledged(&c, leader, "after-healing").await;
    for i in 0..3 {
        wait_has(&c, i, "after-healing").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_for_30_s_refuses_changes_and_is_sent_what_it_missed() {
    let c = Cluster::start_partitionable(3, "command_timeout_ms = 3000");
    let leader = c.leader(&[0, 1, 2]).await;
    let cut_off = (0..3).find(|i| *i != leader).unwrap();
    let other = (0..3).find(|i| *i != leader && *i != cut_off).unwrap();
    declare_everywhere(&c, "before").await;

    let cut = Instant::now();
    c.partitions().cut(&[&[cut_off], &[leader, other]]);
    // The side with the leader goes on (n{other} forwards to it); the member cut off
    // refuses, sees the others as gone, and serves its clients what exists.
    for (n, i) in [leader, other].into_iter().enumerate() {
        declare_acknowledged(&c, i, &format!("during-{n}")).await;
    }
    assert_refused(&c, cut_off, "cut-off-side").await;
    wait_sees_down(&c, cut_off, &[leader, other]).await;
    // The leader counts the member cut off out of the in-sync set: two of three hold on.
    let mut in_sync: Vec<String> = [leader, other].iter().map(|i| format!("n{i}")).collect();
    in_sync.sort();
    eventually("the member cut off out of the in-sync set", WAIT, || async {
        (c.status(leader).await["in_sync"] == json!(in_sync)).then_some(())
    })
    .await;
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", amqp_addr(c.member(cut_off)))).await.unwrap();
    let ch = open_channel(&conn).await;
    assert_eq!(publish_then_get(&ch, "", "before", "before", b"cut off").await, b"cut off");
    assert!(!has(&c, cut_off, "during-0").await, "the member cut off cannot have the majority's change yet");
    hold(cut, Duration::from_secs(30)).await;

    c.partitions().heal();
    c.leader(&[0, 1, 2]).await;
    for i in 0..3 {
        wait_has(&c, i, "during-0").await;
        wait_has(&c, i, "during-1").await;
        assert!(!has(&c, i, "cut-off-side").await, "n{i} has the declaration the member cut off refused");
    }
    declare_acknowledged(&c, cut_off, "after-healing").await;
    for i in 0..3 {
        wait_has(&c, i, "after-healing").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_majority_ring_changes_through_the_members_that_see_a_leader_are_kept() {
    // The link between the leader and one follower is cut; the third member still sees
    // both. Each member sees a majority (itself and one other), but not the same one.
    let c = Cluster::start_partitionable(3, "command_timeout_ms = 3000");
    let leader = c.leader(&[0, 1, 2]).await;
    let cut_off = (0..3).find(|i| *i != leader).unwrap();
    let middle = (0..3).find(|i| *i != leader && *i != cut_off).unwrap();

    let cut = Instant::now();
    c.partitions().cut_link(leader, cut_off);
    // The member cut from the leader may call elections, which may move the leadership
    // (and refuse a change meanwhile); changes through the leader and the member that sees
    // both are acknowledged (again after such a refusal). The member cut off has no way to
    // the leader while it leads: what it answers, acknowledged or refused, is kept below.
    let mut acknowledged = Vec::new();
    for (n, i) in [leader, middle].into_iter().enumerate() {
        let q = format!("ring-{n}");
        declare_acknowledged(&c, i, &q).await;
        acknowledged.push(q);
    }
    let through_cut_off = declare(&c, cut_off, "ring-cut-off").await;
    eprintln!("n{cut_off}, cut from the leader n{leader}, answered {through_cut_off:?}");
    if let Err((code, text)) = &through_cut_off {
        assert_eq!(*code, 541, "a refusal without a leader in reach is 541: {text}");
    }
    hold(cut, Duration::from_secs(10)).await;

    c.partitions().heal();
    c.leader(&[0, 1, 2]).await;
    for q in &acknowledged {
        for i in 0..3 {
            wait_has(&c, i, q).await;
        }
    }
    // What the member cut off acknowledged is everywhere; what it refused, nowhere.
    for i in 0..3 {
        match &through_cut_off {
            Ok(()) => wait_has(&c, i, "ring-cut-off").await,
            Err(_) => assert!(!has(&c, i, "ring-cut-off").await, "n{i} has what the member cut off refused"),
        }
    }
}
