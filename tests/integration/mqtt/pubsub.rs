//! MQTT publish/subscribe as clients observe it: QoS 0/1/2 both ways and both protocol
//! levels, wildcards, `$` topics, order, overlapping subscriptions, unsubscribe.

use crate::common;

use std::time::Duration;

use crate::common::{v4, v5, Broker};

#[tokio::test]
async fn qos_0_1_2_round_trip_v311() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "sub").await;
    assert_eq!(
        sub.subscribe("t/#", v4::QoS::ExactlyOnce).await,
        vec![rumqttc::SubscribeReasonCode::Success(v4::QoS::ExactlyOnce)]
    );
    let pubc = v4::connect(&broker, "pub").await;
    for (i, qos) in [v4::QoS::AtMostOnce, v4::QoS::AtLeastOnce, v4::QoS::ExactlyOnce].into_iter().enumerate() {
        pubc.client.publish(format!("t/{i}"), qos, false, format!("m{i}")).await.unwrap();
        let p = sub.next_publish().await;
        assert_eq!(p.topic, format!("t/{i}"));
        assert_eq!(&p.payload[..], format!("m{i}").as_bytes());
        assert_eq!(p.qos, qos, "delivered at min(publish, granted)");
        assert!(!p.retain);
    }
}

#[tokio::test]
async fn delivery_qos_is_min_of_publish_and_granted() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "sub").await;
    sub.subscribe("a", v4::QoS::AtLeastOnce).await;
    let pubc = v4::connect(&broker, "pub").await;
    pubc.client.publish("a", v4::QoS::ExactlyOnce, false, "x").await.unwrap();
    assert_eq!(sub.next_publish().await.qos, v4::QoS::AtLeastOnce);
    pubc.client.publish("a", v4::QoS::AtMostOnce, false, "y").await.unwrap();
    assert_eq!(sub.next_publish().await.qos, v4::QoS::AtMostOnce);
}

#[tokio::test]
async fn qos_round_trip_v5() {
    let broker = Broker::start();
    let mut sub = v5::connect(&broker, "sub5").await;
    sub.subscribe("x/+/z", v5::QoS::ExactlyOnce).await;
    let pubc = v5::connect(&broker, "pub5").await;
    for qos in [v5::QoS::AtMostOnce, v5::QoS::AtLeastOnce, v5::QoS::ExactlyOnce] {
        pubc.client.publish("x/y/z", qos, false, vec![1u8, 2, 3]).await.unwrap();
        let p = sub.next_publish().await;
        assert_eq!(&p.topic[..], b"x/y/z");
        assert_eq!(&p.payload[..], &[1, 2, 3]);
        assert_eq!(p.qos, qos);
    }
}

#[tokio::test]
async fn wildcards_and_dollar_topics() {
    let broker = Broker::start();
    let mut hash = v4::connect(&broker, "hash").await;
    hash.subscribe("#", v4::QoS::AtMostOnce).await;
    let mut plus = v4::connect(&broker, "plus").await;
    plus.subscribe("+/b", v4::QoS::AtMostOnce).await;
    let mut dollar = v4::connect(&broker, "dollar").await;
    dollar.subscribe("$app/#", v4::QoS::AtMostOnce).await;
    let pubc = v4::connect(&broker, "pub").await;

    pubc.client.publish("$app/b", v4::QoS::AtMostOnce, false, "d").await.unwrap();
    assert_eq!(dollar.next_publish().await.topic, "$app/b");
    pubc.client.publish("a/b", v4::QoS::AtMostOnce, false, "1").await.unwrap();
    // `#` and `+/b` must not have matched `$app/b`: the next thing they see is a/b.
    assert_eq!(hash.next_publish().await.topic, "a/b");
    assert_eq!(plus.next_publish().await.topic, "a/b");
    pubc.client.publish("a/b/c", v4::QoS::AtMostOnce, false, "2").await.unwrap();
    assert_eq!(hash.next_publish().await.topic, "a/b/c");
    plus.expect_no_publish(Duration::from_millis(300)).await;
    dollar.expect_no_publish(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn per_publisher_order_is_preserved() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "sub").await;
    sub.subscribe("o", v4::QoS::AtLeastOnce).await;
    let pubc = v4::connect(&broker, "pub").await;
    for i in 0..500u32 {
        let qos = [v4::QoS::AtMostOnce, v4::QoS::AtLeastOnce, v4::QoS::ExactlyOnce][(i % 3) as usize];
        pubc.client.publish("o", qos, false, i.to_be_bytes().to_vec()).await.unwrap();
    }
    for i in 0..500u32 {
        let p = sub.next_publish().await;
        assert_eq!(u32::from_be_bytes(p.payload[..4].try_into().unwrap()), i);
    }
}

#[tokio::test]
async fn overlapping_subscriptions_deliver_once_at_max_qos() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "sub").await;
    sub.subscribe("a/+", v4::QoS::AtMostOnce).await;
    sub.subscribe("a/#", v4::QoS::ExactlyOnce).await;
    let pubc = v4::connect(&broker, "pub").await;
    pubc.client.publish("a/b", v4::QoS::ExactlyOnce, false, "x").await.unwrap();
    assert_eq!(sub.next_publish().await.qos, v4::QoS::ExactlyOnce);
    sub.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn unsubscribe_stops_delivery() {
    let broker = Broker::start();
    let mut sub = v4::connect(&broker, "sub").await;
    sub.subscribe("u", v4::QoS::AtLeastOnce).await;
    let pubc = v4::connect(&broker, "pub").await;
    pubc.client.publish("u", v4::QoS::AtLeastOnce, false, "1").await.unwrap();
    sub.next_publish().await;
    sub.client.unsubscribe("u").await.unwrap();
    loop {
        if let v4::Packet::UnsubAck(_) = sub.next().await {
            break;
        }
    }
    pubc.client.publish("u", v4::QoS::AtLeastOnce, false, "2").await.unwrap();
    sub.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn invalid_filters_are_refused_in_suback_or_malformed() {
    // rumqttc refuses to send invalid filters, so these go over a raw socket.
    let broker = Broker::start();
    let subscribe = |filter: &str, v5: bool| {
        let mut body = vec![0, 5];
        if v5 {
            body.push(0);
        }
        body.extend_from_slice(&(filter.len() as u16).to_be_bytes());
        body.extend_from_slice(filter.as_bytes());
        body.push(1);
        common::packet(0x82, &body)
    };
    let mut raw = common::Raw::connect(&broker).await;
    raw.send(&common::connect_v4_bytes("bad-filters")).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 2, 0, 0]);
    for bad in ["a/#/b", "a+/b", "#/a", ""] {
        raw.send(&subscribe(bad, false)).await;
        assert_eq!(raw.read_at_least(5).await, vec![0x90, 3, 0, 5, 0x80], "{bad:?}");
    }
    // A valid filter on the same connection still works.
    raw.send(&subscribe("ok/+", false)).await;
    assert_eq!(raw.read_at_least(5).await, vec![0x90, 3, 0, 5, 0x01]);

    // MQTT 5: a filter that breaks the filter syntax makes the packet malformed
    // (MQTT-4.7.1-1, MQTT-4.7.3-1): DISCONNECT 0x81 and close, as Mosquitto does, for
    // SUBSCRIBE and UNSUBSCRIBE alike; a well-formed filter that is not allowed (a bad
    // `$share/` group) gets SUBACK 0x8F on a connection that stays.
    let unsubscribe = |filter: &str| {
        let mut body = vec![0, 6, 0];
        body.extend_from_slice(&(filter.len() as u16).to_be_bytes());
        body.extend_from_slice(filter.as_bytes());
        common::packet(0xA2, &body)
    };
    for bad in ["a/#/b", "#/a", "a+/b", "a/b#", ""] {
        for packet in [subscribe(bad, true), unsubscribe(bad)] {
            let mut raw = common::Raw::connect(&broker).await;
            raw.send(&common::connect_v5_bytes("bad-filters-5")).await;
            let ack = raw.read_at_least(3).await;
            assert_eq!(ack[0], 0x20);
            let connack_len = 2 + ack[1] as usize;
            raw.send(&packet).await;
            let got = raw.read_until_closed().await;
            let rest = &[&ack[connack_len..], &got[..]].concat();
            assert_eq!(rest.first(), Some(&0xE0), "{bad:?}: DISCONNECT in {rest:02x?}");
            assert_eq!(rest.get(2), Some(&0x81), "{bad:?}: Malformed Packet in {rest:02x?}");
        }
    }
    let mut raw = common::Raw::connect(&broker).await;
    raw.send(&common::connect_v5_bytes("bad-share-5")).await;
    let ack = raw.read_at_least(3).await;
    let rest = ack.len() - (2 + ack[1] as usize);
    raw.send(&subscribe("$share//t", true)).await;
    let got = raw.read_at_least(6 + rest).await;
    assert_eq!(&got[rest..], &[0x90, 4, 0, 5, 0, 0x8F]);
    raw.send(&subscribe("ok/+", true)).await;
    assert_eq!(raw.read_at_least(6).await, vec![0x90, 4, 0, 5, 0, 0x01], "the connection stays");
}

#[tokio::test]
async fn v5_publish_without_subscribers_gets_reason_0x10() {
    let broker = Broker::start();
    let mut c = v5::connect(&broker, "lonely").await;
    c.client.publish("nobody/listens", v5::QoS::AtLeastOnce, false, "x").await.unwrap();
    loop {
        if let v5::Packet::PubAck(a) = c.next().await {
            assert_eq!(a.reason, rumqttc::v5::mqttbytes::v5::PubAckReason::NoMatchingSubscribers);
            break;
        }
    }
}

#[tokio::test]
async fn fan_out_reaches_every_subscriber() {
    let broker = Broker::start();
    let mut subs = Vec::new();
    for i in 0..10 {
        let mut s = v4::connect(&broker, &format!("s{i}")).await;
        s.subscribe("fan/+", v4::QoS::AtLeastOnce).await;
        subs.push(s);
    }
    let pubc = v4::connect(&broker, "pub").await;
    for i in 0..20 {
        pubc.client.publish(format!("fan/{i}"), v4::QoS::AtLeastOnce, false, vec![i as u8]).await.unwrap();
    }
    for s in &mut subs {
        for i in 0..20u8 {
            assert_eq!(&s.next_publish().await.payload[..], &[i]);
        }
    }
}
