//! A cluster of three real `ferrymq` processes (`common::cluster`): the metadata group
//! forms and elects a leader, declarations and users made through one member are on every
//! member, a member that was down catches up, a change without a majority is refused,
//! the peer port refuses whoever does not hold `cluster.secret`, snapshots bring members
//! back past a purged log, network partitions leave only a majority acknowledging, a
//! publish through any member reaches the subscribers of every member, and the data group
//! elects, follows the membership and holds streams alike on every member.

mod data_group;
mod forwarding;
mod metadata;
mod partitions;
mod peers;
mod snapshots;
mod streams;

use crate::common::amqp::*;
use crate::common::{eventually, WAIT};

/// Publishes `body` to `exchange` with `key` on `ch`, persistent, waits for its confirm, then
/// for it in `queue` (basic.get): what arrived.
async fn publish_then_get(ch: &Channel, exchange: &str, key: &str, queue: &str, body: &[u8]) -> Vec<u8> {
    confirm_select(ch).await;
    let confirm = bounded(
        "publish",
        ch.basic_publish(exchange.into(), key.into(), BasicPublishOptions::default(), body, persistent()),
    )
    .await
    .expect("publish");
    bounded("confirm", confirm).await.expect("confirm");
    let got = eventually(&format!("the message in {queue}"), WAIT, || async {
        bounded("basic.get", ch.basic_get(queue.into(), BasicGetOptions { no_ack: true })).await.ok().flatten()
    })
    .await;
    got.delivery.data
}
