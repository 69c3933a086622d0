//! MQTT 5.0 features as clients observe them.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use crate::common::{connect_bytes, packet, tail, v5, Broker, Opts, Raw};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Filter, PublishProperties, RetainForwardRule, SubscribeProperties};

fn filter(path: &str, qos: v5::QoS) -> Filter {
    Filter::new(path, qos)
}

#[tokio::test]
async fn shared_subscription_splits_messages_and_reassigns_unacked() {
    let broker = Broker::start();
    let mut o1 = v5::options(&broker, "m1");
    o1.set_manual_acks(true);
    let mut m1 = v5::connect_with(o1).await;
    let mut m2 = v5::connect(&broker, "m2").await;
    m1.subscribe("$share/g/jobs/#", v5::QoS::AtLeastOnce).await;
    m2.subscribe("$share/g/jobs/#", v5::QoS::AtLeastOnce).await;
    let p = v5::connect(&broker, "p").await;
    for i in 0..20u8 {
        p.client.publish("jobs/a", v5::QoS::AtLeastOnce, false, vec![i]).await.unwrap();
    }
    // m1 never acks; m2 acks. Everything must reach the group exactly once while both
    // are connected...
    let mut seen = HashSet::new();
    let mut m1_got = Vec::new();
    let deadline = tokio::time::Instant::now() + common::WAIT;
    while seen.len() < 20 && tokio::time::Instant::now() < deadline {
        tokio::select! {
            Some(Ok(v5::Packet::Publish(m))) = m1.events.recv() => { assert!(seen.insert(m.payload[0]), "duplicate to the group"); m1_got.push(m.payload[0]); }
            Some(Ok(v5::Packet::Publish(m))) = m2.events.recv() => { assert!(seen.insert(m.payload[0]), "duplicate to the group"); }
        }
    }
    assert_eq!(seen.len(), 20);
    assert!(!m1_got.is_empty(), "both members get a share");
    // ...and what m1 left unacked goes to m2 when m1 leaves.
    drop(m1);
    let mut again = HashSet::new();
    while again.len() < m1_got.len() {
        let m = m2.next_publish().await;
        again.insert(m.payload[0]);
    }
    assert_eq!(again, m1_got.into_iter().collect());
}

#[tokio::test]
async fn properties_round_trip() {
    let broker = Broker::start();
    let mut s = v5::connect(&broker, "s").await;
    s.subscribe("rpc/req", v5::QoS::AtLeastOnce).await;
    let p = v5::connect(&broker, "p").await;
    let props = PublishProperties {
        payload_format_indicator: Some(1),
        content_type: Some("application/json".into()),
        response_topic: Some("rpc/resp/42".into()),
        correlation_data: Some(Bytes::from_static(b"\x01\x02corr")),
        user_properties: vec![("k".into(), "v1".into()), ("k".into(), "v2".into()), ("x".into(), "y".into())],
        ..Default::default()
    };
    p.client.publish_with_properties("rpc/req", v5::QoS::AtLeastOnce, false, "{}", props.clone()).await.unwrap();
    let m = s.next_publish().await;
    let got = m.properties.expect("properties");
    assert_eq!(got.payload_format_indicator, Some(1));
    assert_eq!(got.content_type, props.content_type);
    assert_eq!(got.response_topic, props.response_topic);
    assert_eq!(got.correlation_data, props.correlation_data);
    assert_eq!(got.user_properties, props.user_properties, "user properties keep order and duplicates");
}

#[tokio::test]
async fn invalid_utf8_with_payload_format_1_is_refused() {
    let broker = Broker::start();
    let mut p = v5::connect(&broker, "p").await;
    let props = PublishProperties { payload_format_indicator: Some(1), ..Default::default() };
    p.client.publish_with_properties("t", v5::QoS::AtLeastOnce, false, vec![0xff, 0xfe], props).await.unwrap();
    loop {
        if let v5::Packet::PubAck(a) = p.next().await {
            assert_eq!(a.reason, rumqttc::v5::mqttbytes::v5::PubAckReason::PayloadFormatInvalid);
            break;
        }
    }
}

#[tokio::test]
async fn expired_queued_messages_are_dropped() {
    let broker = Broker::start();
    let mut o = v5::options(&broker, "offline");
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(300));
    let mut s = v5::connect_with(o.clone()).await;
    s.subscribe("exp/#", v5::QoS::AtLeastOnce).await;
    s.client.disconnect().await.unwrap();
    drop(s);
    let mut p = v5::connect(&broker, "p").await;
    let short = PublishProperties { message_expiry_interval: Some(1), ..Default::default() };
    let long = PublishProperties { message_expiry_interval: Some(100), ..Default::default() };
    p.client.publish_with_properties("exp/short", v5::QoS::AtLeastOnce, false, "s", short).await.unwrap();
    p.client.publish_with_properties("exp/long", v5::QoS::AtLeastOnce, false, "l", long).await.unwrap();
    let mut acks = 0;
    while acks < 2 {
        if let v5::Packet::PubAck(_) = p.next().await {
            acks += 1;
        }
    }
    // Let the short one expire (time must pass: bounded sleep).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut s = v5::connect_with(o).await;
    let m = s.next_publish().await;
    assert_eq!(&m.topic[..], b"exp/long");
    let left = m.properties.and_then(|p| p.message_expiry_interval).expect("expiry forwarded");
    assert!(left <= 98 && left > 0, "remaining expiry counts down, got {left}");
    s.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn no_local_and_retain_as_published() {
    let broker = Broker::start();
    let mut me = v5::connect(&broker, "me").await;
    let mut f = filter("nl/#", v5::QoS::AtLeastOnce);
    f.nolocal = true;
    me.subscribe_filter(f, None).await;
    let mut rap = v5::connect(&broker, "rap").await;
    let mut f = filter("nl/#", v5::QoS::AtLeastOnce);
    f.preserve_retain = true;
    rap.subscribe_filter(f, None).await;
    let mut plain = v5::connect(&broker, "plain").await;
    plain.subscribe("nl/#", v5::QoS::AtLeastOnce).await;

    me.publish_acked("nl/own", v5::QoS::AtLeastOnce, true, "mine").await;
    let other = v5::connect(&broker, "other").await;
    other.client.publish("nl/other", v5::QoS::AtLeastOnce, true, "theirs").await.unwrap();
    let m = me.next_publish().await;
    assert_eq!(&m.topic[..], b"nl/other", "own message not delivered with no-local");
    let r1 = rap.next_publish().await;
    let r2 = rap.next_publish().await;
    assert!(r1.retain && r2.retain, "retain-as-published keeps the flag");
    let p1 = plain.next_publish().await;
    assert!(!p1.retain, "without retain-as-published the flag is cleared");
}

#[tokio::test]
async fn retain_handling_0_1_2() {
    let broker = Broker::start();
    let mut p = v5::connect(&broker, "p").await;
    p.publish_acked("rh/t", v5::QoS::AtLeastOnce, true, "r").await;
    let mut s = v5::connect(&broker, "s").await;
    // Make sure the retained publish is stored: the first subscription sees it.
    let mut f = filter("rh/t", v5::QoS::AtLeastOnce);
    f.retain_forward_rule = RetainForwardRule::OnEverySubscribe;
    s.subscribe_filter(f.clone(), None).await;
    assert!(s.next_publish().await.retain);
    s.subscribe_filter(f, None).await; // 0: again
    assert!(s.next_publish().await.retain);
    let mut f1 = filter("rh/t", v5::QoS::AtLeastOnce);
    f1.retain_forward_rule = RetainForwardRule::OnNewSubscribe;
    s.subscribe_filter(f1.clone(), None).await; // 1 on an existing subscription: nothing
    s.expect_no_publish(Duration::from_millis(300)).await;
    let mut s2 = v5::connect(&broker, "s2").await;
    s2.subscribe_filter(f1, None).await; // 1 on a new subscription: sent
    assert!(s2.next_publish().await.retain);
    let mut s3 = v5::connect(&broker, "s3").await;
    let mut f2 = filter("rh/t", v5::QoS::AtLeastOnce);
    f2.retain_forward_rule = RetainForwardRule::Never;
    s3.subscribe_filter(f2, None).await; // 2: never
    s3.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn subscription_identifiers_are_returned() {
    let broker = Broker::start();
    let mut s = v5::connect(&broker, "s").await;
    s.subscribe_filter(
        filter("sid/+", v5::QoS::AtLeastOnce),
        Some(SubscribeProperties { id: Some(7), user_properties: vec![] }),
    )
    .await;
    s.subscribe_filter(
        filter("sid/#", v5::QoS::AtLeastOnce),
        Some(SubscribeProperties { id: Some(9), user_properties: vec![] }),
    )
    .await;
    let p = v5::connect(&broker, "p").await;
    p.client.publish("sid/x", v5::QoS::AtLeastOnce, false, "x").await.unwrap();
    let m = s.next_publish().await;
    let mut ids = m.properties.expect("properties").subscription_identifiers;
    ids.sort();
    assert_eq!(ids, vec![7, 9]);
}

#[tokio::test]
async fn client_topic_alias_is_resolved() {
    let broker = Broker::start();
    let mut s = v5::connect(&broker, "s").await;
    s.subscribe("alias/t", v5::QoS::AtMostOnce).await;
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(5, "aliaser", 0x02, 60, &[0])).await;
    let connack = raw.read_at_least(3).await;
    assert_eq!(&connack[..1], &[0x20]);
    // PUBLISH QoS0 topic "alias/t" with Topic Alias 1, then empty topic with alias 1.
    raw.send(&packet(0x30, &[0, 7, b'a', b'l', b'i', b'a', b's', b'/', b't', 3, 0x23, 0, 1, b'1'])).await;
    raw.send(&packet(0x30, &[0, 0, 3, 0x23, 0, 1, b'2'])).await;
    for want in [b"1", b"2"] {
        let m = s.next_publish().await;
        assert_eq!(&m.topic[..], b"alias/t");
        assert_eq!(&m.payload[..], want);
    }
}

#[tokio::test]
async fn server_keep_alive_and_limits_in_connack() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_KEEPALIVE_SECS", "10"));
    let mut o = v5::options(&broker, "ka");
    o.set_keep_alive(Duration::from_secs(60));
    let c = v5::connect_with(o).await;
    let props = c.connack.properties.clone().expect("connack properties");
    assert_eq!(props.server_keep_alive, Some(10));
    assert_eq!(props.max_packet_size, Some(2 * 1024 * 1024));
    assert!(props.receive_max.is_some());
    assert_eq!(props.shared_subscription_available.unwrap_or(1), 1);
}

#[tokio::test]
async fn client_maximum_packet_size_is_respected() {
    let broker = Broker::start();
    let mut o = v5::options(&broker, "small");
    o.set_max_packet_size(Some(200));
    let mut s = v5::connect_with(o).await;
    s.subscribe("size/#", v5::QoS::AtLeastOnce).await;
    let p = v5::connect(&broker, "p").await;
    p.client.publish("size/big", v5::QoS::AtLeastOnce, false, vec![0u8; 1000]).await.unwrap();
    p.client.publish("size/small", v5::QoS::AtLeastOnce, false, vec![0u8; 10]).await.unwrap();
    let m = s.next_publish().await;
    assert_eq!(&m.topic[..], b"size/small", "the oversize message is not sent to this client");
}

#[tokio::test]
async fn outbound_receive_maximum_is_respected() {
    let broker = Broker::start();
    let mut o = v5::options(&broker, "slow");
    o.set_manual_acks(true);
    o.set_receive_maximum(Some(2));
    let mut s = v5::connect_with(o).await;
    s.subscribe("rm", v5::QoS::AtLeastOnce).await;
    let p = v5::connect(&broker, "p").await;
    for i in 0..5u8 {
        p.client.publish("rm", v5::QoS::AtLeastOnce, false, vec![i]).await.unwrap();
    }
    let a = s.next_publish().await;
    let b = s.next_publish().await;
    s.expect_no_publish(Duration::from_millis(400)).await;
    s.client.ack(&a).await.unwrap();
    let c = s.next_publish().await;
    assert_eq!((a.payload[0], b.payload[0], c.payload[0]), (0, 1, 2));
}

#[tokio::test]
async fn inbound_receive_maximum_exceeded_disconnects_with_0x93() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__RECEIVE_MAXIMUM", "2"));
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(5, "greedy", 0x02, 60, &[0])).await;
    let _ = raw.read_at_least(3).await;
    // Three QoS 2 publishes without PUBREL: the third exceeds Receive Maximum 2.
    for id in 1..=3u8 {
        raw.send(&packet(0x34, &[0, 1, b't', 0, id, 0, b'x'])).await;
    }
    let got = raw.read_until_closed().await;
    let disconnect = got.windows(3).any(|w| w[0] == 0xE0 && w[2] == 0x93);
    assert!(disconnect, "expected DISCONNECT 0x93 in {got:02x?}");
}

/// After its DISCONNECT the broker reads and drops what a client still sends until the
/// client closes (bounded), so the client reads the reason instead of running into a
/// reset: Paho's flow-control test keeps publishing past Receive Maximum.
#[tokio::test]
async fn a_client_still_writing_after_the_disconnect_reads_the_reason() {
    use tokio::io::AsyncWriteExt;
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__RECEIVE_MAXIMUM", "2"));
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(5, "eager", 0x02, 60, &[0])).await;
    let _ = raw.read_at_least(3).await;
    let mut written = 0;
    for id in 1..=2000u16 {
        let [hi, lo] = id.to_be_bytes();
        let mut body = vec![0, 1, b't', hi, lo, 0];
        body.extend_from_slice(&[b'x'; 200]);
        match raw.stream.write_all(&packet(0x34, &body)).await {
            Ok(()) => written += 1,
            Err(e) => panic!("write {id} failed after the broker closed: {e}"),
        }
    }
    raw.stream.shutdown().await.unwrap();
    let got = raw.read_until_closed().await;
    assert_eq!(written, 2000);
    let disconnect = got.windows(3).any(|w| w[0] == 0xE0 && w[2] == 0x93);
    assert!(disconnect, "expected DISCONNECT 0x93 in {:02x?}", tail(&got));
}

#[tokio::test]
async fn takeover_disconnect_carries_a_reason_string() {
    let broker = Broker::start();
    let mut first = v5::connect(&broker, "dup-id").await;
    let _second = v5::connect(&broker, "dup-id").await;
    let (code, reason) = first.expect_server_disconnect().await;
    assert_eq!(code, "SessionTakenOver");
    assert!(reason.is_some_and(|r| r.contains("taken over")), "reason string on DISCONNECT");
}

#[tokio::test]
async fn outbound_topic_aliases_are_used_when_the_client_allows_them() {
    let broker = Broker::start();
    let mut raw = Raw::connect(&broker).await;
    // CONNECT v5 with Topic Alias Maximum (0x22) = 5.
    raw.send(&connect_bytes(5, "alias-rx", 0x02, 60, &[3, 0x22, 0, 5])).await;
    let ack = raw.read_at_least(3).await;
    let mut buf = ack[2 + ack[1] as usize..].to_vec();
    raw.send(&packet(0x82, &[0, 1, 0, 0, 3, b'a', b'/', b'b', 0])).await;
    let p = v5::connect(&broker, "alias-tx").await;
    // Wait for SUBACK before publishing.
    while buf.len() < 6 {
        buf.extend(raw.read_at_least(1).await);
    }
    assert_eq!(buf[0], 0x90);
    buf.drain(..6);
    for _ in 0..2 {
        p.client.publish("a/b", v5::QoS::AtMostOnce, false, "x").await.unwrap();
    }
    // First: topic "a/b" + alias; second: empty topic + the same alias.
    while buf.len() < 2 || buf.len() < 2 + buf[1] as usize {
        buf.extend(raw.read_at_least(1).await);
    }
    let first_len = 2 + buf[1] as usize;
    let first = buf[..first_len].to_vec();
    buf.drain(..first_len);
    while buf.len() < 2 || buf.len() < 2 + buf[1] as usize {
        buf.extend(raw.read_at_least(1).await);
    }
    let second = buf[..2 + buf[1] as usize].to_vec();
    assert_eq!(&first[2..7], &[0, 3, b'a', b'/', b'b']);
    let alias_prop = |p: &[u8]| p.windows(3).find(|w| w[0] == 0x23).map(|w| u16::from_be_bytes([w[1], w[2]]));
    let alias = alias_prop(&first[7..]).expect("first PUBLISH sets an alias");
    assert_eq!(&second[2..4], &[0, 0], "second PUBLISH has an empty topic");
    assert_eq!(alias_prop(&second[4..]), Some(alias));
}

#[tokio::test]
async fn topic_level_limit_applies_to_names_and_filters() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_MQTT__MAX_TOPIC_LEVELS", "3"));
    let mut c = v5::connect(&broker, "levels").await;
    let codes = c.subscribe("a/b/c/d", v5::QoS::AtMostOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::TopicFilterInvalid]);
    assert_eq!(c.subscribe("a/b/c", v5::QoS::AtMostOnce).await.len(), 1);
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(5, "levels-raw", 0x02, 60, &[0])).await;
    let ack = raw.read_at_least(3).await;
    let rest = ack[2 + ack[1] as usize..].to_vec();
    raw.send(&packet(0x30, &[0, 7, b'a', b'/', b'b', b'/', b'c', b'/', b'd', 0, b'x'])).await;
    let mut got = rest;
    got.extend(raw.read_until_closed().await);
    assert!(
        got.windows(3).any(|w| w == [0xE0, 1, 0x90]) || got.windows(3).any(|w| w[0] == 0xE0 && w[2] == 0x90),
        "DISCONNECT 0x90: {got:02x?}"
    );
}

/// `$SYS/...` belongs to the broker: a 5.0 client's PUBLISH there is refused with PUBACK
/// 0x87 Not authorized (as Mosquitto), and nobody receives it.
#[tokio::test]
async fn a_publish_to_sys_is_not_authorized() {
    let broker = Broker::start();
    let mut watcher = v5::connect(&broker, "sys-watch").await;
    watcher.subscribe("$SYS/custom/#", v5::QoS::AtLeastOnce).await;
    let mut p = v5::connect(&broker, "sys-writer").await;
    p.client.publish("$SYS/custom/x", v5::QoS::AtLeastOnce, false, "forged").await.unwrap();
    loop {
        if let v5::Packet::PubAck(a) = p.next().await {
            assert_eq!(a.reason, rumqttc::v5::mqttbytes::v5::PubAckReason::NotAuthorized);
            break;
        }
    }
    watcher.expect_no_publish(Duration::from_millis(300)).await;
}

/// MQTT-3.2.0-1: the CONNACK comes first, even for a client whose Maximum Packet Size is
/// smaller than the broker's usual CONNACK: optional properties are dropped until it fits
/// (Mosquitto's test connects with 20 and an assigned client id).
#[tokio::test]
async fn the_connack_fits_a_small_maximum_packet_size() {
    let broker = Broker::start();
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(5, "", 0x02, 60, &[5, 0x27, 0, 0, 0, 20])).await;
    let got = raw.read_at_least(2).await;
    assert_eq!(got[0], 0x20, "CONNACK first: {got:02x?}");
    let len = 2 + got[1] as usize;
    assert!(len <= 20, "{len} bytes: {got:02x?}");
    let got = if got.len() < len { [got.clone(), raw.read_at_least(len - got.len()).await].concat() } else { got };
    assert_eq!(got[3], 0, "Success: {got:02x?}");
    raw.send(&[0xC0, 0]).await;
    assert_eq!(raw.read_at_least(2).await, vec![0xD0, 0], "the connection works");
}

/// A CONNACK trimmed to a client's Maximum Packet Size drops first what carries no
/// information: the Session Expiry Interval 0 of a client that asked for none (absent means
/// the same), not the Topic Alias Maximum, which tells the client it may use aliases.
#[tokio::test]
async fn a_trimmed_connack_keeps_the_topic_alias_maximum_and_drops_a_restated_session_expiry() {
    let broker = Broker::start();
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(5, "small", 0x02, 60, &[5, 0x27, 0, 0, 0, 20])).await;
    let got = raw.read_at_least(2).await;
    let len = 2 + got[1] as usize;
    let got = if got.len() < len { [got.clone(), raw.read_at_least(len - got.len()).await].concat() } else { got };
    assert!(got[0] == 0x20 && len <= 20 && got[3] == 0, "a successful CONNACK of at most 20 bytes: {got:02x?}");
    let ids = connack_property_ids(&got[..len]);
    assert!(ids.contains(&0x22), "Topic Alias Maximum kept: {ids:02x?} in {got:02x?}");
    assert!(!ids.contains(&0x11), "Session Expiry Interval 0 dropped: {ids:02x?} in {got:02x?}");
}

/// Identifiers of the properties of a 5.0 CONNACK (those a broker sends without strings).
fn connack_property_ids(connack: &[u8]) -> Vec<u8> {
    let props = &connack[5..5 + connack[4] as usize];
    let mut ids = Vec::new();
    let mut i = 0;
    while i < props.len() {
        let width = match props[i] {
            0x11 | 0x27 => 4,
            0x13 | 0x21 | 0x22 => 2,
            0x24 | 0x25 | 0x28 | 0x29 | 0x2A => 1,
            id => panic!("unexpected property {id:#04x} in {connack:02x?}"),
        };
        ids.push(props[i]);
        i += 1 + width;
    }
    ids
}

/// A SUBSCRIBE takes effect for every publish the broker reads after it: client B
/// subscribes and client A publishes right after, without waiting for B's SUBACK (as
/// Eclipse Paho's `test_subscribe_options` and `test_request_response` do). The two
/// connections' tasks are woken together; the publish must not be routed first. Repeated,
/// since a wrong order shows as a race: without the broker's yield before the first publish
/// of a read about half the rounds miss. Some misses remain on a 2-worker runtime: when B's
/// bytes arrive within tens of microseconds of A's, another worker may read them after A's
/// read (measured 5-15% of rounds here, back to back from one client task; none in Paho's
/// suite), so the test fails only past 12 of 40. After a miss the subscription must be
/// there: a second publish reaches B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_applies_to_a_publish_read_right_after_it() {
    let broker = Broker::start();
    let subscribe = |topic: &str| {
        let mut body = vec![0, 9, 0];
        body.extend_from_slice(&(topic.len() as u16).to_be_bytes());
        body.extend_from_slice(topic.as_bytes());
        body.push(0x05); // QoS 1, no local
        packet(0x82, &body)
    };
    let publish = |topic: &str| {
        let mut body = (topic.len() as u16).to_be_bytes().to_vec();
        body.extend_from_slice(topic.as_bytes());
        body.extend_from_slice(&[0, 1, 0]); // packet id 1, no properties
        body.extend_from_slice(b"request");
        packet(0x32, &body)
    };
    let connect = |id: &str| connect_bytes(5, id, 0x02, 60, &[0]);
    let mut missed = Vec::new();
    for round in 0..40 {
        let topic = format!("race/{round}");
        let mut a = Raw::connect(&broker).await;
        let mut b = Raw::connect(&broker).await;
        a.send(&connect(&format!("a-{round}"))).await;
        b.send(&connect(&format!("b-{round}"))).await;
        let _ = a.read_at_least(3).await;
        let _ = b.read_at_least(3).await;
        a.send(&subscribe(&topic)).await;
        let _ = a.read_at_least(5).await;
        // B's SUBSCRIBE, then at once A's PUBLISH (no wait for B's SUBACK).
        b.send(&subscribe(&topic)).await;
        a.send(&publish(&topic)).await;
        // B gets its SUBACK and then the PUBLISH (0x32 or 0x3A).
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while !got.windows(7).any(|w: &[u8]| w == b"request") && tokio::time::Instant::now() < deadline {
            use tokio::io::AsyncReadExt;
            let mut chunk = [0u8; 256];
            match tokio::time::timeout_at(deadline, b.stream.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
        if !got.windows(7).any(|w: &[u8]| w == b"request") {
            missed.push(round);
            a.send(&publish(&topic)).await;
            let again = b.read_at_least(20).await;
            assert!(
                again.windows(7).any(|w: &[u8]| w == b"request"),
                "round {round}: B's subscription never took effect: {again:02x?}"
            );
        }
    }
    assert!(missed.len() <= 12, "B's subscription missed the publish read after it in rounds {missed:?}");
}
