//! Snapshots of the metadata group: once its log is purged below a snapshot, a member that
//! was down past the purge point, and a member that joins later, are sent the snapshot and
//! end with the same metadata as the others — what was deleted meanwhile deleted too.

use reqwest::StatusCode;
use serde_json::json;

use crate::common::amqp::*;
use crate::common::cluster::Cluster;
use crate::common::{eventually, WAIT};

/// Snapshots every ten entries (the lowest allowed), so that a few dozen changes purge the log.
const SMALL_SNAPSHOTS: &str = "snapshot_interval_entries = 10";

async fn channel(c: &Cluster, i: usize) -> (Connection, Channel) {
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", amqp_addr(c.member(i)))).await.expect("connect");
    let ch = open_channel(&conn).await;
    (conn, ch)
}

/// The status of queue `q` in the management API of member `i`.
async fn queue_status(c: &Cluster, i: usize, q: &str) -> StatusCode {
    c.api(i).get(&format!("/api/queues/%2f/{q}")).await.0
}

/// Waits until member `i` has what the writer made: the last queue bound (a publish on
/// `i` reaches it), the user, and not the deleted queue.
async fn holds_the_metadata(c: &Cluster, i: usize) {
    eventually(&format!("n{i} has the last queue and the user, not the deleted queue"), WAIT, || async {
        let ok = queue_status(c, i, "snap-29").await == StatusCode::OK
            && queue_status(c, i, "gone").await == StatusCode::NOT_FOUND
            && c.api(i).get("/api/users/late").await.0 == StatusCode::OK;
        ok.then_some(())
    })
    .await;
    let (_conn, ch) = channel(c, i).await;
    eventually(&format!("snap-29 bound on n{i}"), WAIT, || async {
        let b = c.api(i).ok("/api/queues/%2f/snap-29/bindings").await;
        b.as_array()?.iter().any(|b| b["source"] == json!("snap-x")).then_some(())
    })
    .await;
    assert_eq!(super::publish_then_get(&ch, "snap-x", "k.29", "snap-29", b"m").await, b"m");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_behind_the_purged_log_are_sent_a_snapshot_with_the_deletions() {
    let mut c = Cluster::start(3, SMALL_SNAPSHOTS);
    let leader = c.leader(&[0, 1, 2]).await;
    let behind = (0..3).find(|i| *i != leader).expect("a follower");
    let (_conn, ch) = channel(&c, leader).await;
    let opts = ExchangeDeclareOptions { durable: true, ..Default::default() };
    declare_exchange(&ch, "snap-x", ExchangeKind::Topic, opts, FieldTable::default()).await;
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    declare_queue_with(&ch, "gone", durable, FieldTable::default()).await;
    bind(&ch, "gone", "snap-x", "gone", FieldTable::default()).await;
    eventually("'gone' on the member that will fall behind", WAIT, || async {
        (queue_status(&c, behind, "gone").await == StatusCode::OK).then_some(())
    })
    .await;
    // While it is down: 'gone' is deleted, and more than enough changes to purge the log.
    c.kill(behind);
    bounded("queue.delete", ch.queue_delete("gone".into(), QueueDeleteOptions::default())).await.expect("delete");
    for n in 0..30 {
        let q = format!("snap-{n}");
        declare_queue_with(&ch, &q, durable, FieldTable::default()).await;
        bind(&ch, &q, "snap-x", &format!("k.{n}"), FieldTable::default()).await;
    }
    let (code, body) = c.api(leader).put("/api/users/late", json!({ "password": "late-pw", "tags": "" })).await;
    assert!(code.is_success(), "{code} {body}");
    assert!(c.member(leader).wait_log("took a snapshot of the metadata"), "{}", c.logs());
    // Back on its data directory: its log ends below the purge point, so it is sent the
    // snapshot, which deletes 'gone' there too.
    c.restart(behind);
    holds_the_metadata(&c, behind).await;
    assert!(c.member(behind).wait_log("installed a snapshot of the metadata"), "{}", c.logs());
    // A member that joins now starts from the snapshot as well.
    let joined = c.add();
    holds_the_metadata(&c, joined).await;
    assert!(c.member(joined).wait_log("installed a snapshot of the metadata"), "{}", c.logs());
}
