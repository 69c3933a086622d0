//! The disk alarm (RabbitMQ's `disk_free_limit`): while the data directory's file system has
//! less free space than `storage.disk_free_limit_bytes`, publishers are blocked (AMQP
//! `connection.blocked` with reason "low on disk"; an MQTT publisher is not read), while
//! consumers and acknowledgements go on. Once space returns (here: the limit lowered in the
//! config file and SIGHUP) they resume without a restart, and what they sent is delivered
//! and confirmed. The limit is set above any disk's size to raise the alarm.

use std::time::Duration;

use crate::common::amqp::*;
use crate::common::{eventually, v4, Broker, Opts};

/// More free space than any file system has (TOML integers are signed 64-bit).
const UNREACHABLE: &str = "9223372036854775807";

fn start() -> Broker {
    Broker::start_with(
        Opts::default().env("FERRYMQ_STORAGE__DISK_FREE_LIMIT_BYTES", UNREACHABLE).config("# reloaded below\n"),
    )
}

fn free_the_disk(broker: &Broker) {
    rewrite_config_and_reload(broker, "[storage]\ndisk_free_limit_bytes = 1\n");
}

/// Messages published before the alarm are consumed while it is raised; the publisher
/// gets connection.blocked "low on disk" and its publish is confirmed once space returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqp_publisher_is_blocked_low_on_disk_while_consumers_drain() {
    let t = Target::start_with(Opts::default().config("# reloaded below\n"));
    let broker = t.broker.as_ref().unwrap();
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    let q = declare_queue(&ch, &unique("disk-q"), FieldTable::default()).await;
    for body in ["a", "b", "c"] {
        let c = publish_confirmed(&ch, "", &q, body.as_bytes(), BasicProperties::default()).await;
        assert_eq!(c, Confirmation::Ack(None));
    }
    let mut ev = events(&conn);
    rewrite_config_and_reload(broker, &format!("[storage]\ndisk_free_limit_bytes = {UNREACHABLE}\n"));
    // The reload is asynchronous (a signal): wait until the broker says the alarm is raised.
    eventually("the disk alarm raised", WAIT, || async {
        broker.log().contains("disk free space below the limit").then_some(())
    })
    .await;
    let (reason, publisher) = publish_into_a_block(&conn, &mut ev, &ch, &q, b"held").await;
    assert_eq!(reason, "low on disk");
    // A connection that only consumes is not blocked: the queue drains.
    let (_c2, consumer) = t.channel().await;
    assert_eq!(drain(&consumer, &q).await, ["a", "b", "c"]);
    free_the_disk(broker);
    match next_event(&mut ev).await {
        Event::ConnectionUnblocked => {}
        other => panic!("expected connection.unblocked, got {other:?}"),
    }
    let confirmation = bounded("confirm after unblock", publisher).await.unwrap().expect("publish");
    assert_eq!(confirmation, Confirmation::Ack(None));
    assert_eq!(drain(&consumer, &q).await, ["held"]);
}

/// An MQTT publisher is not read while the disk alarm is raised: its next QoS 1 publish
/// gets no PUBACK and reaches nobody, while a subscriber still gets what was accepted
/// before; freeing space resumes it.
#[tokio::test]
async fn an_mqtt_publisher_is_not_read_low_on_disk_and_resumes_when_space_returns() {
    let broker = start();
    let mut s = v4::connect(&broker, "disk-sub").await;
    s.subscribe("disk/#", v4::QoS::AtLeastOnce).await;
    let mut p = v4::connect(&broker, "disk-pub").await;
    // The first publish is read (the connection is not known as a publisher yet).
    p.publish_acked("disk/1", v4::QoS::AtLeastOnce, false, "first").await;
    assert_eq!(&s.next_publish().await.payload[..], b"first");
    p.client.publish("disk/2", v4::QoS::AtLeastOnce, false, "held").await.unwrap();
    s.expect_no_publish(Duration::from_millis(700)).await;
    free_the_disk(&broker);
    assert_eq!(&s.next_publish().await.payload[..], b"held");
    loop {
        if let v4::Packet::PubAck(_) = p.next().await {
            break;
        }
    }
}
