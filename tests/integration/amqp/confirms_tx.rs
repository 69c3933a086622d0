//! Publisher confirms (confirm.select, acks for every publish, nacks for messages that
//! cannot be stored) and transactions (tx.select / commit / rollback of publishes and acks).

use crate::common::amqp::*;

async fn exclusive_queue(ch: &Channel, args: FieldTable) -> String {
    declare_queue_with(ch, "", QueueDeclareOptions { exclusive: true, ..Default::default() }, args)
        .await
        .name()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publish_is_acked_in_confirm_mode() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    let q = exclusive_queue(&ch, FieldTable::default()).await;
    // Before confirm.select nothing is confirmed.
    let c = publish_opts(&ch, "", &q, BasicPublishOptions::default(), b"plain", BasicProperties::default()).await;
    assert_eq!(bounded("confirm", c).await.unwrap(), Confirmation::NotRequested);
    confirm_select(&ch).await;
    assert!(ch.status().confirm());
    let mut pending = Vec::new();
    for i in 0..500 {
        pending.push(
            publish_opts(
                &ch,
                "",
                &q,
                BasicPublishOptions::default(),
                format!("{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await,
        );
    }
    // The broker may acknowledge with multiple=true; every single publish resolves as acked.
    for (i, c) in pending.into_iter().enumerate() {
        assert_eq!(bounded("confirm", c).await.unwrap(), Confirmation::Ack(None), "publish #{i}");
    }
    assert_eq!(queue_counts(&ch, &q).await.unwrap().0, 501);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_confirms_covers_all_outstanding_publishes() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    // confirm.select twice is fine.
    confirm_select(&ch).await;
    let q = exclusive_queue(&ch, FieldTable::default()).await;
    for i in 0..100 {
        publish(&ch, "", &q, format!("{i}").as_bytes(), persistent()).await;
    }
    let returned = bounded("wait_for_confirms", ch.wait_for_confirms()).await.unwrap();
    assert!(returned.is_empty());
    assert_eq!(queue_counts(&ch, &q).await.unwrap().0, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_messages_to_durable_queues_are_acked() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = unique("durable-confirm");
    declare_queue_with(&ch, &q, QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default())
        .await;
    for i in 0..20 {
        let c = publish_confirmed(&ch, "", &q, format!("p{i}").as_bytes(), persistent()).await;
        assert_eq!(c, Confirmation::Ack(None));
    }
    let m = get(&ch, &q, true).await.unwrap();
    assert_eq!(m.delivery.properties.delivery_mode(), &Some(2));
    assert_eq!(m.message_count, 19);
    delete_queue(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_that_cannot_be_stored_are_nacked() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    let full = exclusive_queue(&ch, table(&[("x-max-length", int(1)), ("x-overflow", string("reject-publish"))])).await;
    let roomy = exclusive_queue(&ch, FieldTable::default()).await;
    let x = unique("fan");
    declare_exchange(&ch, &x, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    bind(&ch, &full, &x, "", FieldTable::default()).await;
    bind(&ch, &roomy, &x, "", FieldTable::default()).await;
    assert!(publish_confirmed(&ch, &x, "", b"fits", BasicProperties::default()).await.is_ack());
    // One of two queues refuses: the publish is nacked (though the other queue got it).
    let c = publish_confirmed(&ch, &x, "", b"overflow", BasicProperties::default()).await;
    assert!(c.is_nack(), "{c:?}");
    assert_eq!(drain(&ch, &roomy).await, ["fits", "overflow"]);
    assert_eq!(drain(&ch, &full).await, ["fits"]);
    // Acks and nacks interleave correctly on one channel.
    let mut pending = Vec::new();
    for body in ["a", "b", "c"] {
        pending.push(
            publish_opts(&ch, "", &full, BasicPublishOptions::default(), body.as_bytes(), BasicProperties::default())
                .await,
        );
    }
    let mut acked = Vec::new();
    for c in pending {
        acked.push(bounded("confirm", c).await.unwrap().is_ack());
    }
    assert_eq!(acked, [true, false, false]);
    delete_exchange(&ch, &x).await;
}

/// Room in a reject-publish queue is only taken by messages that get stored: a rolled-back
/// transactional publish (and, on FerryMQ, a repeat that an `x-message-deduplication`
/// exchange does not route) leaves it free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_publish_room_is_kept_for_messages_that_are_stored() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = exclusive_queue(&ch, table(&[("x-max-length", int(2)), ("x-overflow", string("reject-publish"))])).await;
    let txc = open_channel(&conn).await;
    bounded("tx.select", txc.tx_select()).await.unwrap();
    for body in ["r1", "r2", "r3"] {
        publish(&txc, "", &q, body.as_bytes(), BasicProperties::default()).await;
    }
    bounded("tx.rollback", txc.tx_rollback()).await.unwrap();
    if against_rabbitmq() {
        assert!(publish_confirmed(&ch, "", &q, b"first", BasicProperties::default()).await.is_ack());
    } else {
        // A repeat is confirmed without being routed (so stored) again.
        let once = unique("once");
        declare_exchange(
            &ch,
            &once,
            ExchangeKind::Custom("x-message-deduplication".into()),
            ExchangeDeclareOptions::default(),
            table(&[("x-cache-size", int(10))]),
        )
        .await;
        bind(&ch, &q, &once, "", FieldTable::default()).await;
        let keyed = || BasicProperties::default().with_headers(table(&[("x-deduplication-header", string("k"))]));
        assert!(publish_confirmed(&ch, &once, "", b"first", keyed()).await.is_ack());
        assert!(publish_confirmed(&ch, &once, "", b"first", keyed()).await.is_ack());
    }
    assert!(publish_confirmed(&ch, "", &q, b"second", BasicProperties::default()).await.is_ack());
    assert!(publish_confirmed(&ch, "", &q, b"third", BasicProperties::default()).await.is_nack());
    assert_eq!(drain(&ch, &q).await, ["first", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_and_tx_modes_exclude_each_other_with_406() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    bounded("tx.select", ch.tx_select()).await.unwrap();
    let text = expect_code(ch.confirm_select(ConfirmSelectOptions::default()).await, 406);
    assert_eq!(text, "PRECONDITION_FAILED - cannot switch from tx to confirm mode");
    let ch = open_channel(&conn).await;
    confirm_select(&ch).await;
    let text = expect_code(ch.tx_select().await, 406);
    assert_eq!(text, "PRECONDITION_FAILED - cannot switch from confirm to tx mode");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_commit_publishes_and_rollback_discards() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let q = exclusive_queue(&ch, FieldTable::default()).await;
    let observer = open_channel(&conn).await;
    bounded("tx.select", ch.tx_select()).await.unwrap();
    publish(&ch, "", &q, b"t1", BasicProperties::default()).await;
    publish(&ch, "", &q, b"t2", BasicProperties::default()).await;
    // Not visible before the commit.
    assert_eq!(queue_counts(&observer, &q).await.unwrap().0, 0);
    bounded("tx.commit", ch.tx_commit()).await.unwrap();
    assert_eq!(queue_counts(&observer, &q).await.unwrap().0, 2);
    publish(&ch, "", &q, b"r1", BasicProperties::default()).await;
    bounded("tx.rollback", ch.tx_rollback()).await.unwrap();
    // The channel stays transactional: a later commit does not bring r1 back.
    publish(&ch, "", &q, b"t3", BasicProperties::default()).await;
    bounded("tx.commit", ch.tx_commit()).await.unwrap();
    assert_eq!(drain(&observer, &q).await, ["t1", "t2", "t3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_rollback_undoes_acks_and_commit_applies_them() {
    let t = Target::start();
    let (conn, setup) = t.channel().await;
    let q = exclusive_queue(&setup, FieldTable::default()).await;
    fill(&setup, &q, &["a", "b"]).await;
    let ch = open_channel(&conn).await;
    bounded("tx.select", ch.tx_select()).await.unwrap();
    let a = get(&ch, &q, false).await.unwrap();
    let b = get(&ch, &q, false).await.unwrap();
    bounded("ack", ch.basic_ack(a.delivery.delivery_tag, BasicAckOptions::default())).await.unwrap();
    bounded("ack", ch.basic_ack(b.delivery.delivery_tag, BasicAckOptions::default())).await.unwrap();
    bounded("tx.rollback", ch.tx_rollback()).await.unwrap();
    // Both are still unacked; ack "a" for real.
    bounded("ack", ch.basic_ack(a.delivery.delivery_tag, BasicAckOptions::default())).await.unwrap();
    bounded("tx.commit", ch.tx_commit()).await.unwrap();
    bounded("channel.close", ch.close(200, "bye".into())).await.unwrap();
    // Closing the channel requeued only "b".
    let mut out = Vec::new();
    while let Some(m) = get(&setup, &q, true).await {
        out.push((String::from_utf8(m.delivery.data).unwrap(), m.delivery.redelivered));
    }
    assert_eq!(out, [("b".to_string(), true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_commit_without_select_fails_with_406() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let text = expect_code(ch.tx_commit().await, 406);
    assert_eq!(text, "PRECONDITION_FAILED - channel is not transactional");
    let ch = open_channel(&conn).await;
    let text = expect_code(ch.tx_rollback().await, 406);
    assert_eq!(text, "PRECONDITION_FAILED - channel is not transactional");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncommitted_publishes_are_lost_when_the_channel_closes() {
    let t = Target::start();
    let (conn, observer) = t.channel().await;
    let q = exclusive_queue(&observer, FieldTable::default()).await;
    let ch = open_channel(&conn).await;
    bounded("tx.select", ch.tx_select()).await.unwrap();
    publish(&ch, "", &q, b"never", BasicProperties::default()).await;
    bounded("channel.close", ch.close(200, "bye".into())).await.unwrap();
    assert_eq!(queue_counts(&observer, &q).await.unwrap().0, 0);
}
