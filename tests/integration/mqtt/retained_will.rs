//! Retained messages and will messages as clients observe them.

use crate::common;

use std::time::Duration;

use crate::common::{v4, v5, Broker, Raw};

#[tokio::test]
async fn retained_set_replace_clear() {
    let broker = Broker::start();
    let mut p = v4::connect(&broker, "p").await;
    p.publish_acked("home/temp", v4::QoS::AtLeastOnce, true, "20").await;
    p.publish_acked("home/temp", v4::QoS::AtLeastOnce, true, "21").await;
    let mut s = v4::connect(&broker, "s1").await;
    s.subscribe("home/temp", v4::QoS::AtLeastOnce).await;
    let m = s.next_publish().await;
    assert!(m.retain, "retained delivery has the retain flag");
    assert_eq!(&m.payload[..], b"21", "the newest value replaced the old one");
    s.expect_no_publish(Duration::from_millis(200)).await;
    // A live publish with retain=1 reaches an existing subscriber without the flag.
    p.client.publish("home/temp", v4::QoS::AtLeastOnce, true, "22").await.unwrap();
    let live = s.next_publish().await;
    assert!(!live.retain);
    // Clear with an empty payload.
    p.publish_acked("home/temp", v4::QoS::AtLeastOnce, true, "").await;
    assert!(s.next_publish().await.payload.is_empty());
    let mut s2 = v4::connect(&broker, "s2").await;
    s2.subscribe("home/temp", v4::QoS::AtLeastOnce).await;
    s2.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn retained_messages_reach_wildcard_subscribers() {
    let broker = Broker::start();
    let mut p = v4::connect(&broker, "p").await;
    for t in ["plant/a/temp", "plant/b/temp", "plant/b/hum", "other/x"] {
        p.publish_acked(t, v4::QoS::AtLeastOnce, true, t).await;
    }
    let mut s = v4::connect(&broker, "s").await;
    s.subscribe("plant/+/temp", v4::QoS::AtLeastOnce).await;
    let mut got: Vec<String> = Vec::new();
    for _ in 0..2 {
        let m = s.next_publish().await;
        assert!(m.retain);
        got.push(m.topic);
    }
    got.sort();
    assert_eq!(got, vec!["plant/a/temp", "plant/b/temp"]);
    let mut all = v4::connect(&broker, "all").await;
    all.subscribe("plant/#", v4::QoS::AtMostOnce).await;
    let mut n = 0;
    while n < 3 {
        assert!(all.next_publish().await.topic.starts_with("plant/"));
        n += 1;
    }
    all.expect_no_publish(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn retained_messages_survive_restart() {
    let broker = Broker::start();
    let mut p = v4::connect(&broker, "p").await;
    p.client.publish("keep/me", v4::QoS::AtLeastOnce, true, "v1").await.unwrap();
    p.client.publish("gone/soon", v4::QoS::AtLeastOnce, true, "x").await.unwrap();
    p.client.publish("gone/soon", v4::QoS::AtLeastOnce, true, "").await.unwrap();
    let mut acks = 0;
    while acks < 3 {
        if let v4::Packet::PubAck(_) = p.next().await {
            acks += 1;
        }
    }
    drop(p);
    let broker = broker.restart();
    let mut s = v4::connect(&broker, "s").await;
    s.subscribe("#", v4::QoS::AtLeastOnce).await;
    let m = s.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..], m.retain), ("keep/me", &b"v1"[..], true));
    s.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn will_is_published_on_abnormal_disconnect_only() {
    let broker = Broker::start();
    let mut watcher = v4::connect(&broker, "watcher").await;
    watcher.subscribe("wills/#", v4::QoS::AtLeastOnce).await;

    // Abnormal: the socket just closes (raw client with a will).
    let mut raw = Raw::connect(&broker).await;
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x02 | 0x04 | 0x08, 0, 60];
    for s in ["dying", "wills/dying", "bye"] {
        body.extend_from_slice(&(s.len() as u16).to_be_bytes());
        body.extend_from_slice(s.as_bytes());
    }
    raw.send(&common::packet(0x10, &body)).await;
    assert_eq!(raw.read_at_least(4).await, vec![0x20, 0x02, 0x00, 0x00]);
    drop(raw);
    let m = watcher.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("wills/dying", &b"bye"[..]));

    // Normal DISCONNECT: no will.
    let mut o = v4::options(&broker, "polite");
    o.set_last_will(v4::LastWill::new("wills/polite", "bye", v4::QoS::AtLeastOnce, false));
    let mut c = v4::connect_with(o).await;
    c.client.disconnect().await.unwrap();
    let _ = c.expect_closed().await;
    watcher.expect_no_publish(Duration::from_millis(500)).await;
}

#[tokio::test]
async fn will_delay_is_cancelled_by_reconnect_and_honoured_otherwise() {
    use rumqttc::v5::mqttbytes::v5::{LastWill, LastWillProperties};
    let broker = Broker::start();
    let mut watcher = v5::connect(&broker, "w").await;
    watcher.subscribe("wd/#", v5::QoS::AtLeastOnce).await;
    let will_opts = |id: &str, topic: &str| {
        let mut o = v5::options(&broker, id);
        o.set_clean_start(false);
        o.set_session_expiry_interval(Some(60));
        let props = LastWillProperties {
            delay_interval: Some(1),
            payload_format_indicator: None,
            message_expiry_interval: None,
            content_type: None,
            response_topic: None,
            correlation_data: None,
            user_properties: Vec::new(),
        };
        o.set_last_will(LastWill::new(topic, "gone", v5::QoS::AtLeastOnce, false, Some(props)));
        o
    };
    // Dies and comes back within the delay: no will.
    let c = v5::connect_with(will_opts("back", "wd/back")).await;
    drop(c);
    let _c = v5::connect_with(will_opts("back", "wd/back")).await;
    // Dies and stays away: the will arrives after about a second.
    let d = v5::connect_with(will_opts("away", "wd/away")).await;
    let started = std::time::Instant::now();
    drop(d);
    let m = watcher.next_publish().await;
    assert_eq!(&m.topic[..], b"wd/away");
    assert!(started.elapsed() >= Duration::from_millis(800), "will delay honoured");
    watcher.expect_no_publish(Duration::from_millis(1500)).await;
}
