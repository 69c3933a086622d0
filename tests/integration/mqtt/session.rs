//! Sessions as clients observe them: persistent sessions across disconnects, restarts and
//! crashes; clean sessions; take-over; expiry; client ids; QoS 2 exactly-once.

use std::time::Duration;

use crate::common::{connect_bytes, packet, v4, v5, Broker, Opts, Raw};

async fn publish_n(broker: &Broker, topic: &str, n: u32, qos: v4::QoS) {
    let mut p = v4::connect(broker, "publisher").await;
    for i in 0..n {
        p.client.publish(topic, qos, false, i.to_be_bytes().to_vec()).await.unwrap();
    }
    // Wait until every publish is acknowledged (stored) before returning.
    let mut acked = 0;
    while acked < n {
        match p.next().await {
            v4::Packet::PubAck(_) | v4::Packet::PubComp(_) => acked += 1,
            _ => {}
        }
    }
}

async fn offline_subscriber(broker: &Broker, id: &str, filter: &str) {
    let mut s = v4::connect_persistent(broker, id).await;
    s.subscribe(filter, v4::QoS::AtLeastOnce).await;
    s.client.disconnect().await.unwrap();
    let _ = s.expect_closed().await;
}

fn seq(p: &v4::Publish) -> u32 {
    u32::from_be_bytes(p.payload[..4].try_into().unwrap())
}

#[tokio::test]
async fn persistent_session_gets_messages_published_while_offline() {
    let broker = Broker::start();
    offline_subscriber(&broker, "dev-1", "sensors/#").await;
    publish_n(&broker, "sensors/t", 20, v4::QoS::AtLeastOnce).await;
    let mut s = v4::connect_persistent(&broker, "dev-1").await;
    assert!(s.connack.session_present, "session must be present");
    for i in 0..20 {
        let p = s.next_publish().await;
        assert_eq!(p.topic, "sensors/t");
        assert_eq!(seq(&p), i);
    }
    // Subscriptions survived too: a new message arrives without subscribing again.
    publish_n(&broker, "sensors/x", 1, v4::QoS::AtLeastOnce).await;
    assert_eq!(s.next_publish().await.topic, "sensors/x");
}

#[tokio::test]
async fn persistent_session_survives_a_restart() {
    let broker = Broker::start();
    offline_subscriber(&broker, "dev-2", "r/+").await;
    publish_n(&broker, "r/a", 10, v4::QoS::ExactlyOnce).await;
    let broker = broker.restart();
    let mut s = v4::connect_persistent(&broker, "dev-2").await;
    assert!(s.connack.session_present);
    for i in 0..10 {
        assert_eq!(seq(&s.next_publish().await), i);
    }
    publish_n(&broker, "r/b", 1, v4::QoS::AtLeastOnce).await;
    assert_eq!(s.next_publish().await.topic, "r/b");
}

#[tokio::test]
async fn acknowledged_messages_survive_sigkill() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_STORAGE__FSYNC", "always"));
    offline_subscriber(&broker, "crash-sub", "c/#").await;
    let n = 300;
    publish_n(&broker, "c/1", n, v4::QoS::AtLeastOnce).await;
    let broker = broker.crash_restart();
    let mut s = v4::connect_persistent(&broker, "crash-sub").await;
    assert!(s.connack.session_present);
    let mut seen = vec![false; n as usize];
    let mut next = 0;
    while next < n {
        let p = s.next_publish().await;
        let i = seq(&p);
        if seen[i as usize] {
            assert!(p.dup, "a repeated delivery must carry DUP");
            continue;
        }
        assert_eq!(i, next, "in order");
        seen[i as usize] = true;
        next += 1;
    }
}

#[tokio::test]
async fn messages_never_delivered_go_out_without_dup_after_a_restart_or_a_crash() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_STORAGE__FSYNC", "always"));
    offline_subscriber(&broker, "never-sent", "n/#").await;
    publish_n(&broker, "n/1", 3, v4::QoS::AtLeastOnce).await;
    let broker = broker.restart();
    publish_n(&broker, "n/1", 3, v4::QoS::AtLeastOnce).await;
    let broker = broker.crash_restart();
    let mut s = v4::connect_persistent(&broker, "never-sent").await;
    assert!(s.connack.session_present);
    for i in 0..6u32 {
        let p = s.next_publish().await;
        assert_eq!(seq(&p), i % 3, "in order");
        assert!(!p.dup, "message {i} was never sent before: no DUP");
    }
}

#[tokio::test]
async fn clean_session_discards_the_stored_one() {
    let broker = Broker::start();
    offline_subscriber(&broker, "dev-3", "d").await;
    publish_n(&broker, "d", 3, v4::QoS::AtLeastOnce).await;
    let mut s = v4::connect(&broker, "dev-3").await;
    assert!(!s.connack.session_present);
    s.expect_no_publish(Duration::from_millis(300)).await;
    s.client.disconnect().await.unwrap();
    let _ = s.expect_closed().await;
    let s = v4::connect_persistent(&broker, "dev-3").await;
    assert!(!s.connack.session_present, "the old session was discarded");
}

#[tokio::test]
async fn unacked_qos1_is_redelivered_with_dup_on_reconnect() {
    let broker = Broker::start();
    let mut o = v4::options(&broker, "manual");
    o.set_clean_session(false);
    o.set_manual_acks(true);
    let mut s = v4::connect_with(o.clone()).await;
    s.subscribe("m", v4::QoS::AtLeastOnce).await;
    publish_n(&broker, "m", 1, v4::QoS::AtLeastOnce).await;
    let first = s.next_publish().await;
    assert!(!first.dup);
    drop(s); // no PUBACK: the connection just goes away
    let mut s = v4::connect_with(o).await;
    assert!(s.connack.session_present);
    let again = s.next_publish().await;
    assert_eq!(again.payload, first.payload);
    assert!(again.dup, "redelivery carries DUP");
    assert_eq!(again.pkid, first.pkid, "same packet id on resend");
}

#[tokio::test]
async fn same_client_id_takes_over() {
    let broker = Broker::start();
    let mut first = v5::connect(&broker, "twin").await;
    let _second = v5::connect(&broker, "twin").await;
    let (code, _) = first.expect_server_disconnect().await;
    assert_eq!(code, "SessionTakenOver");
}

#[tokio::test]
async fn v5_session_expiry_removes_the_session() {
    let broker = Broker::start();
    let mut o = v5::options(&broker, "exp");
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(1));
    let mut s = v5::connect_with(o.clone()).await;
    assert!(!s.connack.session_present);
    s.subscribe("e", v5::QoS::AtLeastOnce).await;
    s.client.disconnect().await.unwrap();
    drop(s);
    // Within the expiry the session is there...
    let s = v5::connect_with(o.clone()).await;
    assert!(s.connack.session_present);
    s.client.disconnect().await.unwrap();
    drop(s);
    // ...and after it, it is gone. (Expiry is about time passing: a bounded sleep.)
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let s = v5::connect_with(o).await;
    assert!(!s.connack.session_present, "expired session must not be resumed");
}

#[tokio::test]
async fn v5_session_with_zero_expiry_ends_at_disconnect() {
    let broker = Broker::start();
    let mut o = v5::options(&broker, "zero");
    o.set_clean_start(false);
    let mut s = v5::connect_with(o.clone()).await;
    s.subscribe("z", v5::QoS::AtLeastOnce).await;
    s.client.disconnect().await.unwrap();
    drop(s);
    let s = v5::connect_with(o).await;
    assert!(!s.connack.session_present);
}

/// A DISCONNECT with Session Expiry 0 ends the session even when the client's next CONNECT
/// (clean start 0) arrives at once on another connection: the old connection handles what
/// its socket holds before the new one takes the session over. Bounded repetitions, since
/// which connection the broker serves first is a race.
#[tokio::test]
async fn a_disconnect_ending_the_session_is_handled_before_an_immediate_reconnect() {
    let broker = Broker::start();
    // Session Expiry Interval 300 (property 0x11), in a CONNECT with clean start 0.
    let expiry_300 = [5, 0x11, 0, 0, 1, 0x2c];
    for round in 0..40 {
        let id = format!("bounce-{round}");
        let mut old = Raw::connect(&broker).await;
        old.send(&connect_bytes(5, &id, 0x00, 60, &expiry_300)).await;
        let _ = old.read_at_least(3).await;
        // SUBSCRIBE id 1, no properties, "b/t" at QoS 1; its SUBACK means the session exists.
        old.send(&packet(0x82, &[0, 1, 0, 0, 3, b'b', b'/', b't', 1])).await;
        let suback = old.read_at_least(5).await;
        assert_eq!(suback[0], 0x90, "SUBACK, round {round}: {suback:02x?}");
        let mut new = Raw::connect(&broker).await;
        // Back to back: DISCONNECT (normal, Session Expiry 0), then the new CONNECT.
        old.send(&packet(0xE0, &[0, 5, 0x11, 0, 0, 0, 0])).await;
        new.send(&connect_bytes(5, &id, 0x00, 60, &expiry_300)).await;
        let connack = new.read_at_least(4).await;
        assert_eq!(connack[0], 0x20, "CONNACK, round {round}: {connack:02x?}");
        assert_eq!(connack[2] & 1, 0, "round {round}: the session ended by the DISCONNECT was resumed");
    }
}

#[tokio::test]
async fn empty_client_id_rules() {
    let broker = Broker::start();
    // 3.1.1 with clean session = 0 and an empty id: return code 2 (identifier rejected).
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "", 0x00, 60, &[])).await;
    let got = raw.read_until_closed().await;
    assert_eq!(got, vec![0x20, 0x02, 0x00, 0x02]);
    // 3.1.1 clean: accepted.
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "", 0x02, 60, &[])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x00, 0x00]);
    // 5.0: accepted with an Assigned Client Identifier.
    let s = v5::connect(&broker, "").await;
    let props = s.connack.properties.clone().expect("connack properties");
    let assigned = props.assigned_client_identifier.expect("assigned client id");
    assert!(!assigned.is_empty());
}

#[tokio::test]
async fn qos2_resend_before_pubrel_is_delivered_once() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "q2sub").await;
    sub.subscribe("q2", v4::QoS::ExactlyOnce).await;
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "q2pub", 0x02, 60, &[])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x00, 0x00]);
    let publish = |dup: bool| packet(0x34 | if dup { 0x08 } else { 0 }, &[0, 2, b'q', b'2', 0, 7, b'x']);
    raw.send(&publish(false)).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x50, 0x02, 0x00, 0x07], "PUBREC");
    raw.send(&publish(true)).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x50, 0x02, 0x00, 0x07], "PUBREC again");
    raw.send(&packet(0x62, &[0, 7])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x70, 0x02, 0x00, 0x07], "PUBCOMP");
    let p = sub.next_publish().await;
    assert_eq!(&p.payload[..], b"x");
    sub.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn qos2_inbound_state_survives_restart() {
    let broker = Broker::start();
    offline_subscriber(&broker, "q2store", "q2r").await;
    // Persistent publisher sends QoS 2, gets PUBREC, then the broker restarts.
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "q2pub-p", 0x00, 60, &[])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x00, 0x00]);
    let publish = |dup: bool| packet(0x34 | if dup { 0x08 } else { 0 }, &[0, 3, b'q', b'2', b'r', 0, 9, b'y']);
    raw.send(&publish(false)).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x50, 0x02, 0x00, 0x09]);
    drop(raw);
    let broker = broker.restart();
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "q2pub-p", 0x00, 60, &[])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x01, 0x00], "session present");
    // The resend of the same packet id must not be routed a second time.
    raw.send(&publish(true)).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x50, 0x02, 0x00, 0x09]);
    raw.send(&packet(0x62, &[0, 9])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x70, 0x02, 0x00, 0x09]);
    let mut s = v4::connect_persistent(&broker, "q2store").await;
    assert_eq!(&s.next_publish().await.payload[..], b"y");
    s.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn outbound_qos2_resumes_with_pubrel_after_restart() {
    let broker = Broker::start();
    // Persistent subscriber on a raw socket, QoS 2.
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "q2out", 0x00, 60, &[])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x00, 0x00]);
    raw.send(&packet(0x82, &[0, 1, 0, 4, b'q', b'2', b'/', b'o', 2])).await;
    assert_eq!(raw.read_at_least(5).await, vec![0x90, 3, 0, 1, 2]);
    publish_n(&broker, "q2/o", 1, v4::QoS::ExactlyOnce).await;
    let publish = raw.read_at_least(2).await;
    assert_eq!(publish[0] & 0xF6, 0x34, "QoS 2 PUBLISH: {publish:02x?}");
    // Topic "q2/o" (2 + 4 bytes) after the 2-byte fixed header, then the packet id.
    let pkid = [publish[8], publish[9]];
    raw.send(&packet(0x50, &pkid)).await; // PUBREC
    assert_eq!(raw.read_at_least(4).await, vec![0x62, 2, pkid[0], pkid[1]], "PUBREL");
    drop(raw); // no PUBCOMP
    let broker = broker.restart();
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "q2out", 0x00, 60, &[])).await;
    let got = raw.read_at_least(8).await;
    assert_eq!(&got[..4], &[0x20, 0x02, 0x01, 0x00], "session present");
    assert_eq!(&got[4..8], &[0x62, 2, pkid[0], pkid[1]], "PUBREL resent with the same id, not the message");
    raw.send(&packet(0x70, &pkid)).await; // PUBCOMP
    raw.send(&packet(0xC0, &[])).await; // PINGREQ: its answer shows PUBCOMP was read
    assert_eq!(raw.read_at_least(2).await, vec![0xD0, 0]);
    // Nothing else is pending: reconnecting once more gets only CONNACK.
    drop(raw);
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "q2out", 0x00, 60, &[])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x01, 0x00]);
    raw.send(&packet(0xC0, &[])).await; // PINGREQ
    assert_eq!(raw.read_at_least(2).await, vec![0xD0, 0], "only PINGRESP follows");
}

/// Settlements a client sends just before the broker stops (PUBREC, PUBACK: the broker
/// forwards them to the queue's owner without waiting) are stored by the shutdown: after the
/// restart the QoS 2 message is past its PUBREC (PUBREL again, not the message) and the
/// acknowledged QoS 1 message does not come back. Repeated, because the window is short.
#[tokio::test]
async fn settlements_just_before_shutdown_are_kept() {
    let mut broker = Broker::start();
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(4, "settle", 0x00, 60, &[])).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x00, 0x00]);
    raw.send(&packet(0x82, &[0, 1, 0, 4, b's', b'/', b'q', b'2', 2, 0, 4, b's', b'/', b'q', b'1', 1])).await;
    assert_eq!(raw.read_at_least(6).await, vec![0x90, 4, 0, 1, 2, 1]);
    for round in 0..6 {
        // QoS 1: PUBACK, then PINGREQ/PINGRESP proves the broker read it.
        publish_n(&broker, "s/q1", 1, v4::QoS::AtLeastOnce).await;
        let publish = raw.read_at_least(2).await;
        assert_eq!(publish[0] & 0xF6, 0x32, "round {round}: QoS 1 PUBLISH: {publish:02x?}");
        let pkid = [publish[8], publish[9]];
        raw.send(&packet(0x40, &pkid)).await; // PUBACK
        raw.send(&packet(0xC0, &[])).await;
        assert_eq!(raw.read_at_least(2).await, vec![0xD0, 0], "round {round}");
        // QoS 2: PUBREC, answered by PUBREL; then the broker stops at once.
        publish_n(&broker, "s/q2", 1, v4::QoS::ExactlyOnce).await;
        let publish = raw.read_at_least(2).await;
        assert_eq!(publish[0] & 0xF6, 0x34, "round {round}: QoS 2 PUBLISH: {publish:02x?}");
        let pkid = [publish[8], publish[9]];
        raw.send(&packet(0x50, &pkid)).await; // PUBREC
        assert_eq!(raw.read_at_least(4).await, vec![0x62, 2, pkid[0], pkid[1]], "round {round}: PUBREL");
        drop(raw);
        broker = broker.restart();
        raw = Raw::connect(&broker).await;
        raw.send(&connect_bytes(4, "settle", 0x00, 60, &[])).await;
        let got = raw.read_at_least(8).await;
        assert_eq!(&got[..4], &[0x20, 0x02, 0x01, 0x00], "round {round}: session present");
        assert_eq!(&got[4..8], &[0x62, 2, pkid[0], pkid[1]], "round {round}: only the PUBREL is resent");
        raw.send(&packet(0x70, &pkid)).await; // PUBCOMP
        raw.send(&packet(0xC0, &[])).await;
        assert_eq!(raw.read_at_least(2).await, vec![0xD0, 0], "round {round}: nothing else was pending");
    }
}

#[tokio::test]
async fn full_offline_queue_drops_qos0_first() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_QUEUED_MESSAGES", "5"));
    offline_subscriber(&broker, "limited", "lim/#").await;
    let mut p = v4::connect(&broker, "lim-pub").await;
    for i in 0..3u32 {
        p.client.publish("lim/q0", v4::QoS::AtMostOnce, false, i.to_be_bytes().to_vec()).await.unwrap();
    }
    for i in 10..16u32 {
        p.publish_acked("lim/q1", v4::QoS::AtLeastOnce, false, i.to_be_bytes().to_vec()).await;
    }
    drop(p);
    let mut s = v4::connect_persistent(&broker, "limited").await;
    let mut got = Vec::new();
    for _ in 0..5 {
        let m = s.next_publish().await;
        got.push((m.topic.clone(), seq(&m)));
    }
    let want: Vec<(String, u32)> = (10..15).map(|i| ("lim/q1".to_string(), i)).collect();
    assert_eq!(got, want, "QoS 0 entries were evicted for QoS 1 ones; the sixth QoS 1 was dropped");
    s.expect_no_publish(Duration::from_millis(300)).await;
}

/// A QoS 2 PUBLISH (3.1.1) with packet id `pkid`.
fn qos2_publish(pkid: u16, topic: &str, payload: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&pkid.to_be_bytes());
    body.extend_from_slice(payload.as_bytes());
    packet(0x34, &body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos2_id_released_just_before_a_reconnect_is_free_for_the_next_message() {
    // A persistent session's PUBREL is followed at once by a reconnect: the resumed
    // session must not still hold the id, or the client's next message under it would be
    // taken for a re-send and dropped.
    let broker = Broker::start();
    let mut watch = v4::connect(&broker, "watch").await;
    watch.subscribe("q2/#", v4::QoS::AtMostOnce).await;
    for round in 0..10 {
        let mut raw = Raw::connect(&broker).await;
        raw.send(&connect_bytes(4, "q2-client", 0x00, 60, &[])).await;
        assert_eq!(raw.read_at_least(4).await[..2], [0x20, 0x02], "CONNACK");
        raw.send(&qos2_publish(1, "q2/a", &format!("r{round}"))).await;
        assert_eq!(raw.read_at_least(4).await, [0x50, 0x02, 0x00, 0x01], "PUBREC");
        raw.send(&[0x62, 0x02, 0x00, 0x01]).await; // PUBREL, and gone without its PUBCOMP
        let mut again = Raw::connect(&broker).await;
        again.send(&connect_bytes(4, "q2-client", 0x00, 60, &[])).await;
        drop(raw);
        assert_eq!(again.read_at_least(4).await[..2], [0x20, 0x02], "CONNACK");
        again.send(&qos2_publish(1, "q2/a", &format!("r{round}-next"))).await;
        assert_eq!(String::from_utf8_lossy(&watch.next_publish().await.payload), format!("r{round}"));
        let next = watch.next_publish().await;
        assert_eq!(String::from_utf8_lossy(&next.payload), format!("r{round}-next"), "round {round}");
        // This one's exchange is finished before the next round reuses the id.
        assert_eq!(again.read_at_least(4).await, [0x50, 0x02, 0x00, 0x01], "PUBREC");
        again.send(&[0x62, 0x02, 0x00, 0x01]).await;
        assert_eq!(again.read_at_least(4).await, [0x70, 0x02, 0x00, 0x01], "PUBCOMP");
    }
}
