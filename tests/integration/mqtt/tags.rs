//! Tags and tag filters for MQTT 5 clients: the user property `tag` on PUBLISH, the user
//! property `tag-filter` on SUBSCRIBE (clean and persistent sessions), and the gateway to
//! AMQP (`x-tag` header, `x-tag-filter` binding).

use crate::common;

use std::time::Duration;

use crate::common::amqp::{
    as_str, bind, bounded, confirm_select, declare_queue_with, drain, field, headers, publish_confirmed, string, table,
    BasicProperties, FieldTable, QueueDeclareOptions, Target,
};
use crate::common::{v5, Broker};
use rumqttc::v5::mqttbytes::v5::{Filter, PublishProperties, SubscribeProperties, SubscribeReasonCode};

fn tag_filter(expr: &str) -> Option<SubscribeProperties> {
    Some(SubscribeProperties { id: None, user_properties: vec![("tag-filter".into(), expr.into())] })
}

fn tagged(tag: &str) -> PublishProperties {
    PublishProperties { user_properties: vec![("tag".into(), tag.into())], ..Default::default() }
}

/// Publishes (body, tag) pairs at QoS 1 and waits for every PUBACK.
async fn publish_all(p: &mut v5::Client, topic: &str, msgs: &[(&str, Option<&str>)]) {
    for (body, tag) in msgs {
        let props = tag.map(tagged).unwrap_or_default();
        p.client.publish_with_properties(topic, v5::QoS::AtLeastOnce, false, body.to_string(), props).await.unwrap();
    }
    let mut acks = 0;
    while acks < msgs.len() {
        if let v5::Packet::PubAck(_) = p.next().await {
            acks += 1;
        }
    }
}

const MIXED: [(&str, Option<&str>); 5] =
    [("untagged", None), ("a", Some("TagA")), ("c", Some("TagC")), ("b", Some("TagB")), ("lower", Some("taga"))];

#[tokio::test]
async fn subscription_tag_filter_delivers_only_matching_messages() {
    let broker = Broker::start();
    let mut filtered = v5::connect(&broker, "filtered").await;
    let codes =
        filtered.subscribe_filter(Filter::new("sensors/#", v5::QoS::AtLeastOnce), tag_filter("TagA || TagB")).await;
    assert_eq!(codes, [SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]);
    let mut star = v5::connect(&broker, "star").await;
    star.subscribe_filter(Filter::new("sensors/#", v5::QoS::AtMostOnce), tag_filter("*")).await;
    let mut p = v5::connect(&broker, "p").await;
    publish_all(&mut p, "sensors/t1", &MIXED).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let m = filtered.next_publish().await;
        let props = m.properties.expect("properties");
        assert!(
            props.user_properties.iter().any(|(k, _)| k == "tag"),
            "the tag arrives as the user property 'tag': {props:?}"
        );
        got.push(String::from_utf8(m.payload.to_vec()).unwrap());
    }
    assert_eq!(got, ["a", "b"]);
    let mut all = Vec::new();
    for _ in 0..5 {
        all.push(String::from_utf8(star.next_publish().await.payload.to_vec()).unwrap());
    }
    assert_eq!(all, ["untagged", "a", "c", "b", "lower"], "'*' matches tagged and untagged");
    filtered.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn persistent_session_keeps_its_tag_filter_while_offline_and_across_a_restart() {
    let broker = Broker::start();
    let mut o = v5::options(&broker, "offline-tags");
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(3600));
    let mut s = v5::connect_with(o).await;
    s.subscribe_filter(Filter::new("jobs/#", v5::QoS::AtLeastOnce), tag_filter("TagA")).await;
    s.client.disconnect().await.unwrap();
    drop(s);
    let broker = broker.restart();
    let mut p = v5::connect(&broker, "p").await;
    publish_all(&mut p, "jobs/1", &MIXED).await;
    let mut o = v5::options(&broker, "offline-tags");
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(3600));
    let mut s = v5::connect_with(o).await;
    assert!(s.connack.session_present, "session restored");
    assert_eq!(&s.next_publish().await.payload[..], b"a");
    s.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn resubscribing_without_a_tag_filter_removes_it() {
    let broker = Broker::start();
    let mut s = v5::connect(&broker, "resub").await;
    s.subscribe_filter(Filter::new("r/#", v5::QoS::AtLeastOnce), tag_filter("TagA")).await;
    let mut p = v5::connect(&broker, "p").await;
    publish_all(&mut p, "r/x", &[("plain", None), ("a", Some("TagA"))]).await;
    assert_eq!(&s.next_publish().await.payload[..], b"a");
    s.subscribe("r/#", v5::QoS::AtLeastOnce).await;
    publish_all(&mut p, "r/x", &[("plain2", None)]).await;
    assert_eq!(&s.next_publish().await.payload[..], b"plain2");
}

#[tokio::test]
async fn invalid_tag_filter_is_refused_per_filter() {
    let broker = Broker::start();
    let mut s = v5::connect(&broker, "bad").await;
    for expr in ["", "A || ", "* || A"] {
        let codes = s.subscribe_filter(Filter::new("b/#", v5::QoS::AtLeastOnce), tag_filter(expr)).await;
        assert_eq!(codes, [SubscribeReasonCode::ImplementationSpecific], "{expr:?}");
    }
    // Nothing was subscribed.
    let mut p = v5::connect(&broker, "p").await;
    publish_all(&mut p, "b/1", &[("x", Some("A"))]).await;
    s.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_shared_subscription_group_filters_by_tag_and_its_members_must_agree() {
    let broker = Broker::start();
    let mut a = v5::connect(&broker, "a").await;
    let mut b = v5::connect(&broker, "b").await;
    let share = || Filter::new("$share/alarms/plant/#", v5::QoS::AtLeastOnce);
    assert_eq!(
        a.subscribe_filter(share(), tag_filter("TagA || TagB")).await,
        [SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    // The same filter written differently is the same filter.
    assert_eq!(
        b.subscribe_filter(share(), tag_filter("TagB||TagA")).await,
        [SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]
    );
    // A member with another filter (or none) is refused: the group has one binding.
    let mut c = v5::connect(&broker, "c").await;
    assert_eq!(c.subscribe_filter(share(), tag_filter("TagC")).await, [SubscribeReasonCode::ImplementationSpecific]);
    assert_eq!(c.subscribe_filter(share(), None).await, [SubscribeReasonCode::ImplementationSpecific]);
    let mut p = v5::connect(&broker, "p").await;
    publish_all(&mut p, "plant/line1", &MIXED).await;
    publish_all(&mut p, "plant/line2", &MIXED).await;
    // Each matching message to one member; the others reach nobody.
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while got.len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "only {got:?}");
        for m in [&mut a, &mut b] {
            if let Ok(p) = tokio::time::timeout(Duration::from_millis(50), m.next_publish()).await {
                got.push(String::from_utf8(p.payload.to_vec()).unwrap());
            }
        }
    }
    got.sort();
    assert_eq!(got, ["a", "a", "b", "b"]);
    a.expect_no_publish(Duration::from_millis(200)).await;
    b.expect_no_publish(Duration::from_millis(100)).await;
    c.expect_no_publish(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn retained_messages_on_subscribe_pass_the_tag_filter() {
    let broker = Broker::start();
    let mut p = v5::connect(&broker, "p").await;
    for (topic, tag) in [("ret/a", "TagA"), ("ret/b", "TagB")] {
        p.client.publish_with_properties(topic, v5::QoS::AtLeastOnce, true, tag, tagged(tag)).await.unwrap();
    }
    let mut acks = 0;
    while acks < 2 {
        if let v5::Packet::PubAck(_) = p.next().await {
            acks += 1;
        }
    }
    let mut s = v5::connect(&broker, "s").await;
    s.subscribe_filter(Filter::new("ret/#", v5::QoS::AtLeastOnce), tag_filter("TagB")).await;
    assert_eq!(&s.next_publish().await.payload[..], b"TagB");
    s.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_tag_reaches_an_amqp_tag_filter_binding_as_x_tag() {
    let t = Target::ferrymq(Broker::start());
    let (_c, ch) = t.channel().await;
    let q = declare_queue_with(
        &ch,
        "",
        QueueDeclareOptions { exclusive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    bind(&ch, q.name().as_str(), "amq.topic", "plant.#", table(&[("x-tag-filter", string("alarm"))])).await;
    let broker = t.broker.as_ref().unwrap();
    let mut p = v5::connect(broker, "plc").await;
    publish_all(&mut p, "plant/line1", &[("reading", Some("telemetry")), ("overheat", Some("alarm")), ("plain", None)])
        .await;
    let m = common::amqp::get(&ch, q.name().as_str(), true).await.expect("the alarm");
    assert_eq!(m.delivery.data, b"overheat");
    assert_eq!(field(&headers(&m.delivery.properties), "x-tag").and_then(as_str).as_deref(), Some("alarm"));
    assert!(drain(&ch, q.name().as_str()).await.is_empty(), "only the matching tag was routed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_x_tag_reaches_an_mqtt_tag_filter_as_the_tag_property() {
    let t = Target::ferrymq(Broker::start());
    let broker = t.broker.as_ref().unwrap();
    let mut s = v5::connect(broker, "hmi").await;
    s.subscribe_filter(Filter::new("plant/#", v5::QoS::AtLeastOnce), tag_filter("alarm")).await;
    let (_c, ch) = t.channel().await;
    confirm_select(&ch).await;
    for (body, tag) in [("reading", "telemetry"), ("overheat", "alarm")] {
        let props = BasicProperties::default().with_headers(table(&[("x-tag", string(tag))]));
        assert!(bounded("publish", publish_confirmed(&ch, "amq.topic", "plant.line1", body.as_bytes(), props))
            .await
            .is_ack());
    }
    let m = s.next_publish().await;
    assert_eq!(&m.payload[..], b"overheat");
    let props = m.properties.expect("properties");
    assert!(props.user_properties.contains(&("tag".to_string(), "alarm".to_string())), "{:?}", props.user_properties);
    assert!(!props.user_properties.iter().any(|(k, _)| k == "x-tag"), "x-tag is shown as 'tag'");
    s.expect_no_publish(Duration::from_millis(300)).await;
}
