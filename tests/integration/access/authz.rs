//! Authorization as RabbitMQ, Mosquitto and EMQX users expect it: RabbitMQ's permissions
//! and topic permissions refused with RabbitMQ's codes and texts, MQTT rules (config,
//! Mosquitto `acl_file`, EMQX `acl.conf`, the management API) refused with SUBACK 0x80 /
//! 0x87, PUBACK 0x87 or a silent drop for 3.1.1, read rules on deliveries, retained
//! messages and wills, one rule governing both protocols on the MQTT exchange, and
//! changes applied to open connections without a restart. Real broker, lapin and rumqttc.

use crate::common;

use std::time::Duration;

use crate::common::amqp::{
    amqp_error, bounded, confirm_select, connect_uri, consume, events, open_channel, publish, server_closed,
};
use crate::common::http::Api;
use crate::common::{run_binary, v4, v5, Broker, Opts, WAIT};
use lapin::options::{BasicPublishOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use serde_json::json;

fn uri(broker: &Broker, user: &str) -> String {
    format!("amqp://{user}:pw@{}/%2f", broker.amqp.unwrap())
}

fn mqtt_v4(broker: &Broker, id: &str, user: &str) -> v4::MqttOptions {
    let mut o = v4::options(broker, id);
    o.set_credentials(user, "pw");
    o
}

fn mqtt_v5(broker: &Broker, id: &str, user: &str) -> v5::MqttOptions {
    let mut o = v5::options(broker, id);
    o.set_credentials(user, "pw");
    o
}

const AMQP_POLICY: &str = r#"
[auth]
authorization = true
users = [{ name = "app", password = "pw" }, { name = "stranger", password = "pw" }]
permissions = [{ vhost = "/", user = "app", configure = "^app\\.", write = "^(app\\..*|amq\\.topic)$", read = "^app\\." }]
topic_permissions = [{ vhost = "/", user = "app", exchange = "amq.topic", write = "^devices\\.{username}\\.", read = "^devices\\." }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_permissions_refuse_with_rabbitmq_codes_and_texts() {
    let broker = Broker::start_with(Opts::default().config(AMQP_POLICY));
    // No permissions in the vhost: Connection.Open refused, as RabbitMQ.
    let e = connect_uri(&uri(&broker, "stranger")).await.expect_err("no permissions in /");
    assert_eq!(
        amqp_error(&e),
        Some((530, "NOT_ALLOWED - access to vhost '/' refused for user 'stranger'".into())),
        "{e}"
    );

    let conn = connect_uri(&uri(&broker, "app")).await.unwrap();
    let ch = open_channel(&conn).await;
    let declare = |ch: lapin::Channel, name: &'static str| async move {
        bounded("queue.declare", ch.queue_declare(name.into(), QueueDeclareOptions::default(), FieldTable::default()))
            .await
    };
    declare(ch.clone(), "app.q").await.expect("configure on ^app\\. is granted");
    let e = declare(ch, "other").await.expect_err("configure on other is not");
    assert_eq!(
        amqp_error(&e),
        Some((403, "ACCESS_REFUSED - configure access to queue 'other' in vhost '/' refused for user 'app'".into()))
    );
    // A channel error: the connection stays.
    let mut ev = events(&conn);
    let ch = open_channel(&conn).await;
    publish(&ch, "", "app.q", b"to the default exchange", BasicProperties::default()).await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(
        (code, text.as_str()),
        (403, "ACCESS_REFUSED - write access to exchange 'amq.default' in vhost '/' refused for user 'app'")
    );
    // Topic permissions: routing keys on amq.topic name the user.
    let ch = open_channel(&conn).await;
    confirm_select(&ch).await;
    let ok = ch
        .basic_publish(
            "amq.topic".into(),
            "devices.app.t".into(),
            BasicPublishOptions::default(),
            b"x",
            Default::default(),
        )
        .await
        .unwrap();
    assert!(bounded("confirm", ok).await.unwrap().is_ack());
    publish(&ch, "amq.topic", "devices.bob.t", b"not mine", BasicProperties::default()).await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(
        (code, text.as_str()),
        (
            403,
            "ACCESS_REFUSED - write access to topic 'devices.bob.t' in exchange 'amq.topic' in vhost '/' refused for user 'app'"
        )
    );
    // Binding app.q to amq.topic needs write on the queue (granted) and read on the
    // exchange (not granted).
    let ch = open_channel(&conn).await;
    let e = bounded(
        "queue.bind",
        ch.queue_bind(
            "app.q".into(),
            "amq.topic".into(),
            "devices.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect_err("read on amq.topic is not granted");
    assert_eq!(
        amqp_error(&e),
        Some((403, "ACCESS_REFUSED - read access to exchange 'amq.topic' in vhost '/' refused for user 'app'".into()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_publishes_and_gets_with_the_callers_permissions() {
    let config = r#"
[auth]
authorization = true
users = [{ name = "ops", password = "pw", tags = ["management"] }]
permissions = [{ vhost = "/", user = "ops", configure = ".*", write = "^ops\\.", read = "^ops\\." }]
"#;
    let broker = Broker::start_with(Opts::default().config(config));
    let api = Api::of(&broker).as_user("ops", "pw");
    let (status, _) = api.put("/api/queues/%2f/ops.q", json!({"durable": false})).await;
    assert_eq!(status, 201);
    let (status, _) = api.put("/api/exchanges/%2f/ops.x", json!({"type": "fanout"})).await;
    assert_eq!(status, 201);
    let body = json!({"routing_key": "ops.q", "payload": "x", "payload_encoding": "string", "properties": {}});
    let (status, e) = api.post("/api/exchanges/%2f/amq.default/publish", body.clone()).await;
    assert_eq!(status, 401, "{e}");
    assert_eq!(e["reason"], "write access to exchange 'amq.default' in vhost '/' refused for user 'ops'");
    let (status, _) = api.post("/api/exchanges/%2f/ops.x/publish", body).await;
    assert_eq!(status, 200);
    // Topic permissions hold through the API too.
    let (status, _) = api.put("/api/exchanges/%2f/ops.t", json!({"type": "topic"})).await;
    assert_eq!(status, 201);
    let (status, _) = Api::of(&broker)
        .put("/api/topic-permissions/%2f/ops", json!({"exchange": "ops.t", "write": "^mine\\.", "read": ".*"}))
        .await;
    assert_eq!(status, 201);
    let topic = |key: &str| json!({"routing_key": key, "payload": "x", "payload_encoding": "string", "properties": {}});
    let (status, _) = api.post("/api/exchanges/%2f/ops.t/publish", topic("mine.a")).await;
    assert_eq!(status, 200);
    let (status, e) = api.post("/api/exchanges/%2f/ops.t/publish", topic("theirs.a")).await;
    assert_eq!(status, 401, "{e}");
    assert_eq!(e["reason"], "write access to topic 'theirs.a' in exchange 'ops.t' in vhost '/' refused for user 'ops'");
    let get = json!({"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"});
    let (status, _) = api.post("/api/queues/%2f/ops.q/get", get).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_changes_through_the_api_apply_to_open_connections() {
    let broker = Broker::start_with(Opts::default().config(AMQP_POLICY));
    let api = Api::of(&broker);
    let conn = connect_uri(&uri(&broker, "app")).await.unwrap();
    let ch = open_channel(&conn).await;
    let declare = |ch: lapin::Channel| async move {
        bounded("queue.declare", ch.queue_declare("jobs".into(), QueueDeclareOptions::default(), FieldTable::default()))
            .await
    };
    assert_eq!(amqp_error(&declare(ch).await.unwrap_err()).map(|e| e.0), Some(403));
    let (status, _) =
        api.put("/api/permissions/%2f/app", json!({"configure": ".*", "write": ".*", "read": ".*"})).await;
    assert_eq!(status, 204);
    let ch = open_channel(&conn).await;
    declare(ch.clone()).await.expect("granted now, on the same connection");
    let _consumer = consume(&ch, "jobs", Default::default(), FieldTable::default()).await;
    // Topic permissions through RabbitMQ's API, listed in the definitions export.
    let (status, _) = api
        .put("/api/topic-permissions/%2f/app", json!({"exchange": "amq.topic", "write": "^x\\.", "read": ".*"}))
        .await;
    assert_eq!(status, 204, "replacing the configured one");
    let listed = api.ok("/api/topic-permissions/%2f/app").await;
    assert_eq!(listed[0]["write"], "^x\\.", "{listed}");
    let defs = api.ok("/api/definitions").await;
    assert!(defs["topic_permissions"].as_array().unwrap().iter().any(|p| p["user"] == "app"), "{defs}");
    let mut ev = events(&conn);
    publish(&ch, "amq.topic", "devices.app.t", b"x", BasicProperties::default()).await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(code, 403, "{text}");
    // A bad expression is refused whole; nothing changes.
    let (status, body) = api.put("/api/permissions/%2f/app", json!({"configure": "(", "write": "", "read": ""})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(api.ok("/api/permissions/%2f/app").await["configure"], ".*");
}

const MQTT_RULES: &str = r##"
[auth]
mqtt = true
authorization = true
users = [{ name = "alice", password = "pw" }, { name = "bob", password = "pw" }, { name = "ops", password = "pw", tags = ["ops"] }]
rules = [
  { permission = "deny", action = "subscribe", topics = ["test/nosubscribe"] },
  { permission = "deny", action = "receive", topics = ["alice/secret"] },
  { permission = "allow", action = "all", topics = ["%u/#"] },
  { permission = "allow", action = "subscribe", group = "ops", topics = ["#", "$SYS/#"] },
  { permission = "allow", action = "subscribe", topics = ["test/#", "public/#"] },
  { permission = "allow", action = "publish", user = "alice", topics = ["test/#", "public/#"] },
]
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_rules_refuse_as_each_protocol_version_expects() {
    let broker = Broker::start_with(Opts::default().config(MQTT_RULES));
    // The Paho interoperability suite's test_subscribe_failure: 3.1.1 0x80, 5.0 0x87.
    let mut a4 = v4::connect_with(mqtt_v4(&broker, "a4", "alice")).await;
    let codes = a4.subscribe("test/nosubscribe", v4::QoS::AtLeastOnce).await;
    assert_eq!(codes, vec![rumqttc::SubscribeReasonCode::Failure]);
    let codes = a4.subscribe("test/#", v4::QoS::AtLeastOnce).await;
    assert_eq!(codes, vec![rumqttc::SubscribeReasonCode::Success(v4::QoS::AtLeastOnce)]);
    let mut b5 = v5::connect_with(mqtt_v5(&broker, "b5", "bob")).await;
    let codes = b5.subscribe("test/nosubscribe", v5::QoS::AtLeastOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::NotAuthorized]);
    let codes = b5.subscribe("#", v5::QoS::AtLeastOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::NotAuthorized]);
    let codes = b5.subscribe("test/#", v5::QoS::AtLeastOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]);

    // bob may not publish to test/#: 5.0 PUBACK 0x87; nothing is delivered.
    b5.client.publish("test/x", v5::QoS::AtLeastOnce, false, "from bob").await.unwrap();
    loop {
        if let v5::Packet::PubAck(ack) = b5.next().await {
            assert_eq!(ack.reason, rumqttc::v5::mqttbytes::v5::PubAckReason::NotAuthorized);
            break;
        }
    }
    // 3.1.1: acked as Mosquitto does, and dropped.
    let mut b4 = v4::connect_with(mqtt_v4(&broker, "b4", "bob")).await;
    b4.publish_acked("test/y", v4::QoS::AtLeastOnce, false, "from bob").await;
    // alice may: the subscriber gets it, and not bob's earlier ones.
    a4.publish_acked("test/z", v4::QoS::AtLeastOnce, false, "from alice").await;
    let p = b5.next_publish().await;
    assert_eq!((p.topic.as_ref(), p.payload.as_ref()), (b"test/z".as_ref(), b"from alice".as_ref()));

    // Read rules on deliveries: alice subscribes to alice/# but alice/secret is denied,
    // live and retained.
    let mut ops = v5::connect_with(mqtt_v5(&broker, "ops", "ops")).await;
    let codes = ops.subscribe("alice/#", v5::QoS::AtLeastOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]);
    let mut a_sub = v4::connect_with(mqtt_v4(&broker, "a-sub", "alice")).await;
    a_sub.subscribe("alice/#", v4::QoS::AtLeastOnce).await;
    a4.publish_acked("alice/secret", v4::QoS::AtLeastOnce, true, "dropped").await;
    a4.publish_acked("alice/open", v4::QoS::AtLeastOnce, true, "kept").await;
    assert_eq!(a_sub.next_publish().await.topic, "alice/open");
    assert_eq!(ops.next_publish().await.topic, b"alice/open".as_ref());
    let mut late = v4::connect_with(mqtt_v4(&broker, "late", "alice")).await;
    late.subscribe("alice/#", v4::QoS::AtLeastOnce).await;
    let p = late.next_publish().await;
    assert_eq!((p.topic.as_str(), p.retain), ("alice/open", true));
    late.expect_no_publish(Duration::from_millis(300)).await;

    // $SYS honours read rules: ops may, alice may not.
    let codes = a4.subscribe("$SYS/#", v4::QoS::AtMostOnce).await;
    assert_eq!(codes, vec![rumqttc::SubscribeReasonCode::Failure]);
    let codes = ops.subscribe("$SYS/#", v5::QoS::AtMostOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(v5::QoS::AtMostOnce)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_is_published_only_where_its_topic_is_writable() {
    let broker = Broker::start_with(Opts::default().config(MQTT_RULES));
    let mut watcher = v5::connect_with(mqtt_v5(&broker, "watcher", "ops")).await;
    watcher.subscribe("#", v5::QoS::AtLeastOnce).await;
    for (id, topic) in [("w-denied", "test/will"), ("w-ok", "bob/will")] {
        let mut o = mqtt_v4(&broker, id, "bob");
        o.set_last_will(rumqttc::LastWill::new(topic, "gone", v4::QoS::AtLeastOnce, false));
        let c = v4::connect_with(o).await;
        drop(c); // the socket closes without DISCONNECT: the will is due
    }
    let p = watcher.next_publish().await;
    assert_eq!(p.topic, b"bob/will".as_ref(), "only the writable will is published");
    watcher.expect_no_publish(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_on_a_reserved_topic_is_not_published() {
    let broker = Broker::start();
    let mut watcher = v4::connect(&broker, "watcher").await;
    watcher.subscribe("$SYS/fake", v4::QoS::AtLeastOnce).await;
    watcher.subscribe("fence", v4::QoS::AtLeastOnce).await;
    for (id, topic) in [("spoof", "$SYS/fake"), ("fence-will", "fence")] {
        let mut o = v4::options(&broker, id);
        o.set_last_will(rumqttc::LastWill::new(topic, "x", v4::QoS::AtLeastOnce, true));
        drop(v4::connect_with(o).await);
    }
    assert_eq!(watcher.next_publish().await.topic, "fence", "the $SYS will was dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_rule_governs_mqtt_and_amqp_on_the_mqtt_exchange() {
    let config = r#"
[auth]
authorization = true
users = [{ name = "app", password = "pw" }]
permissions = [{ vhost = "/", user = "app", configure = ".*", write = ".*", read = ".*" }]
rules = [{ permission = "deny", action = "all", topics = ["plant/secret/#"] }]
"#;
    let broker = Broker::start_with(Opts::default().config(config));
    // MQTT: no rule grants plant/a, so the user's permissions on amq.topic decide (write .*).
    let mut m = v5::connect_with(mqtt_v5(&broker, "m", "app")).await;
    let codes = m.subscribe("plant/#", v5::QoS::AtLeastOnce).await;
    assert_eq!(codes, vec![rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce)]);
    // AMQP on amq.topic with key plant.secret.x is the MQTT publish to plant/secret/x: denied.
    let conn = connect_uri(&uri(&broker, "app")).await.unwrap();
    let mut ev = events(&conn);
    let ch = open_channel(&conn).await;
    publish(&ch, "amq.topic", "plant.a", b"open", BasicProperties::default()).await;
    let p = m.next_publish().await;
    assert_eq!(p.topic, b"plant/a".as_ref());
    publish(&ch, "amq.topic", "plant.secret.x", b"closed", BasicProperties::default()).await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(
        (code, text.as_str()),
        (
            403,
            "ACCESS_REFUSED - write access to topic 'plant.secret.x' in exchange 'amq.topic' in vhost '/' refused for user 'app'"
        )
    );
    // And binding a queue to it (an AMQP subscription) is refused the same way.
    let ch = open_channel(&conn).await;
    let q =
        bounded("queue.declare", ch.queue_declare("".into(), QueueDeclareOptions::default(), FieldTable::default()))
            .await
            .unwrap();
    let e = bounded(
        "queue.bind",
        ch.queue_bind(
            q.name().as_str().into(),
            "amq.topic".into(),
            "plant.secret.*".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect_err("the MQTT rule denies the filter plant/secret/+");
    assert_eq!(amqp_error(&e).map(|e| e.0), Some(403));
    m.expect_no_publish(Duration::from_millis(200)).await;

    // Routes into the MQTT exchange that would carry messages past the MQTT rules (an
    // exchange binding, an alternate or a dead-letter exchange) are refused.
    let ch = open_channel(&conn).await;
    bounded(
        "exchange.declare",
        ch.exchange_declare("mine".into(), lapin::ExchangeKind::Topic, Default::default(), FieldTable::default()),
    )
    .await
    .unwrap();
    let e = bounded(
        "exchange.bind",
        ch.exchange_bind("amq.topic".into(), "mine".into(), "#".into(), Default::default(), FieldTable::default()),
    )
    .await
    .expect_err("no exchange binding into amq.topic");
    assert_eq!(amqp_error(&e).map(|e| e.0), Some(403));
    let ch = open_channel(&conn).await;
    let mut ae = FieldTable::default();
    ae.insert("alternate-exchange".into(), lapin::types::AMQPValue::LongString("amq.topic".into()));
    let e = bounded(
        "exchange.declare",
        ch.exchange_declare("mine-ae".into(), lapin::ExchangeKind::Direct, Default::default(), ae),
    )
    .await
    .expect_err("no alternate exchange into amq.topic");
    assert_eq!(amqp_error(&e).map(|e| e.0), Some(403));
    let ch = open_channel(&conn).await;
    let mut dlx = FieldTable::default();
    dlx.insert("x-dead-letter-exchange".into(), lapin::types::AMQPValue::LongString("amq.topic".into()));
    let e = bounded("queue.declare", ch.queue_declare("mine-dlx".into(), QueueDeclareOptions::default(), dlx))
        .await
        .expect_err("no dead-letter exchange into amq.topic");
    assert_eq!(amqp_error(&e).map(|e| e.0), Some(403));
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_and_emqx_acl_files_are_used_as_they_are_and_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let acl = write(dir.path(), "acl", "user alice\ntopic readwrite alice/#\n\npattern read public/%c\n");
    let emqx = write(dir.path(), "acl.conf", "{allow, {user, \"bob\"}, publish, [\"bob/${clientid}\"]}.\n");
    let config = format!(
        "[auth]\nmqtt = true\nmosquitto_acl_file = \"{acl}\"\nemqx_acl_file = \"{emqx}\"\n\
         users = [{{ name = \"alice\", password = \"pw\" }}, {{ name = \"bob\", password = \"pw\" }}]\n"
    );
    let broker = Broker::start_with(Opts::default().config(&config));
    let mut alice = v5::connect_with(mqtt_v5(&broker, "a", "alice")).await;
    let ok = rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(v5::QoS::AtLeastOnce);
    // As Mosquitto 2.0: every subscription is granted, what may not be read is filtered.
    assert_eq!(alice.subscribe("alice/#", v5::QoS::AtLeastOnce).await, vec![ok]);
    assert_eq!(alice.subscribe("public/#", v5::QoS::AtLeastOnce).await, vec![ok]);
    let mut bob = v4::connect_with(mqtt_v4(&broker, "b1", "bob")).await;
    bob.publish_acked("alice/x", v4::QoS::AtLeastOnce, false, "not bob's to write").await;
    bob.publish_acked("bob/b1", v4::QoS::AtLeastOnce, false, "the emqx rule").await;
    // AMQP is not checked (only ACL files were given: MQTT authorization only), and no
    // MQTT rule denies these keys: they are published; alice reads only public/a (%c = a).
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", broker.amqp.unwrap())).await.unwrap();
    let ch = open_channel(&conn).await;
    confirm_select(&ch).await;
    let publish_confirmed = |key: &'static str| {
        let ch = ch.clone();
        async move {
            let c = ch.basic_publish(
                "amq.topic".into(),
                key.into(),
                BasicPublishOptions::default(),
                key.as_bytes(),
                Default::default(),
            );
            assert!(bounded("confirm", c.await.unwrap()).await.unwrap().is_ack());
        }
    };
    publish_confirmed("public.b").await;
    publish_confirmed("public.a").await;
    let mut fence = v4::connect_with(mqtt_v4(&broker, "a2", "alice")).await;
    fence.publish_acked("alice/fence", v4::QoS::AtLeastOnce, false, "fence").await;
    let topics = [alice.next_publish().await.topic, alice.next_publish().await.topic];
    assert_eq!(topics, [b"public/a".as_ref(), b"alice/fence".as_ref()], "not bob's publish, not public/b");

    // SIGHUP reads the files again: the open connection decides with the new rules.
    std::fs::write(&acl, "user alice\ntopic readwrite alice/#\ntopic read public/#\n").unwrap();
    let pid = broker.pid().unwrap();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success());
    common::eventually("the reloaded rules", WAIT, || {
        let log = broker.log();
        async move { log.contains("MQTT rules reloaded").then_some(()) }
    })
    .await;
    publish_confirmed("public.b").await;
    assert_eq!(alice.next_publish().await.topic, b"public/b".as_ref());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_rules_through_the_api_apply_at_once_and_survive_a_restart() {
    let broker = Broker::start_with(Opts::default().config("[auth]\nauthorization = true\n"));
    let api = Api::of(&broker);
    let mut c = v4::connect(&broker, "anon").await;
    assert_eq!(c.subscribe("news/#", v4::QoS::AtMostOnce).await, vec![rumqttc::SubscribeReasonCode::Failure]);
    let rules = json!([{ "permission": "allow", "action": "subscribe", "anonymous": true, "topics": ["news/#"] }]);
    let (status, body) = api.put("/api/mqtt/rules", rules.clone()).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(
        c.subscribe("news/#", v4::QoS::AtMostOnce).await,
        vec![rumqttc::SubscribeReasonCode::Success(v4::QoS::AtMostOnce)]
    );
    let shown = api.ok("/api/mqtt/rules").await;
    assert_eq!((shown["enabled"].as_bool(), shown["source"].as_str()), (Some(true), Some("api")));
    assert_eq!(shown["rules"], rules);
    // A bad rule is refused whole.
    let (status, body) =
        api.put("/api/mqtt/rules", json!([{ "permission": "allow", "action": "poke", "topics": ["#"] }])).await;
    assert_eq!(status, 400, "{body}");
    drop(c);
    let broker = broker.restart();
    let mut c = v4::connect(&broker, "anon").await;
    assert_eq!(
        c.subscribe("news/#", v4::QoS::AtMostOnce).await,
        vec![rumqttc::SubscribeReasonCode::Success(v4::QoS::AtMostOnce)],
        "the API's rules were kept"
    );
}

#[test]
fn bad_acl_files_and_rules_stop_start_up_naming_file_line_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let acl = write(dir.path(), "acl", "user a\ntopic read ok/#\ntopic read a/#/b\n");
    let cfg = write(dir.path(), "c.toml", &format!("[auth]\nmosquitto_acl_file = \"{acl}\"\n"));
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let (code, out) = run_binary(&["--config", &cfg, "--data-dir", data, "--mqtt-listen", "127.0.0.1:0"], &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains(&format!("{acl}:3: topic `a/#/b`")), "{out}");
    let emqx = write(dir.path(), "acl.conf", "{allow, all}.\n{allow, {peer, \"x\"}, all, [\"#\"]}.\n");
    let cfg = write(dir.path(), "c2.toml", &format!("[auth]\nemqx_acl_file = \"{emqx}\"\n"));
    let (code, out) = run_binary(&["--config", &cfg, "--data-dir", data, "--mqtt-listen", "127.0.0.1:0"], &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains(&format!("{emqx}:2: `peer` is not")), "{out}");
    let cfg = write(
        dir.path(),
        "c3.toml",
        "[auth]\nrules = [{ permission = \"allow\", action = \"publish\", topics = [\"a/#/b\"] }]\n",
    );
    let (code, out) = run_binary(&["--config", &cfg, "--data-dir", data, "--mqtt-listen", "127.0.0.1:0"], &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("auth.rules") && out.contains("rule 1") && out.contains("a/#/b"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_keeps_only_the_subscriptions_its_new_user_may_make() {
    let broker = Broker::start_with(Opts::default().config(MQTT_RULES));
    let api = Api::of(&broker);
    let subs_of = |all: serde_json::Value| -> Vec<String> {
        all.as_array()
            .unwrap()
            .iter()
            .filter(|s| s["clientid"] == "handover")
            .map(|s| s["topic"].as_str().unwrap().to_owned())
            .collect()
    };
    // ops (may subscribe to anything) makes a persistent session and leaves.
    let mut o = mqtt_v4(&broker, "handover", "ops");
    o.set_clean_session(false);
    let mut ops = v4::connect_with(o).await;
    ops.subscribe("ops/#", v4::QoS::AtLeastOnce).await;
    ops.subscribe("public/#", v4::QoS::AtLeastOnce).await;
    ops.subscribe("$share/team/ops/#", v4::QoS::AtLeastOnce).await;
    drop(ops);
    let mut seen = subs_of(api.ok("/api/ferrymq/mqtt/subscriptions").await);
    seen.sort();
    assert_eq!(seen, ["ops/#", "public/#"]);
    // Another member of the shared group, allowed to be one.
    let mut mate = v4::connect_with(mqtt_v4(&broker, "mate", "ops")).await;
    mate.subscribe("$share/team/ops/#", v4::QoS::AtLeastOnce).await;
    // alice resumes the client id: the subscriptions she could not make are gone, the
    // shared one too (the session left the group).
    let mut o = mqtt_v4(&broker, "handover", "alice");
    o.set_clean_session(false);
    let mut alice = v4::connect_with(o).await;
    assert!(alice.connack.session_present);
    assert_eq!(subs_of(api.ok("/api/ferrymq/mqtt/subscriptions").await), ["public/#"]);
    let mut publisher = v4::connect_with(mqtt_v4(&broker, "pub", "ops")).await;
    for i in 1..=4 {
        publisher.publish_acked(&format!("ops/{i}"), v4::QoS::AtLeastOnce, false, format!("ops-{i}")).await;
    }
    let mut alice_pub = v4::connect_with(mqtt_v4(&broker, "alice-pub", "alice")).await;
    alice_pub.publish_acked("public/1", v4::QoS::AtLeastOnce, false, "for all").await;
    assert_eq!(&alice.next_publish().await.payload[..], b"for all");
    // The group's messages all go to the member left in it: alice's session takes no
    // turns (which it could not receive).
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(String::from_utf8_lossy(&mate.next_publish().await.payload).into_owned());
    }
    assert_eq!(got, ["ops-1", "ops-2", "ops-3", "ops-4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_empty_permissions_open_the_vhost_and_nothing_else_and_survive_a_restart() {
    let broker = Broker::start_with(Opts::default().config(AMQP_POLICY));
    let api = Api::of(&broker);
    // rabbitmqctl set_permissions stranger "" "" "": the vhost opens, nothing in it is usable.
    let (status, body) =
        api.put("/api/permissions/%2f/stranger", json!({"configure": "", "write": "", "read": ""})).await;
    assert!(status.is_success(), "{body}");
    let check = |broker: &Broker| {
        let u = uri(broker, "stranger");
        async move {
            let conn = connect_uri(&u).await.expect("the vhost opens");
            let ch = open_channel(&conn).await;
            let opts = QueueDeclareOptions::default();
            let e = bounded("queue.declare", ch.queue_declare("q".into(), opts, FieldTable::default()))
                .await
                .expect_err("configure is refused");
            assert_eq!(amqp_error(&e).map(|e| e.0), Some(403), "{e}");
        }
    };
    check(&broker).await;
    let broker = broker.restart();
    check(&broker).await;
    assert_eq!(Api::of(&broker).ok("/api/permissions/%2f/stranger").await["configure"], "");
    // DELETE takes the vhost away again, also across a restart.
    let (status, _) = Api::of(&broker).delete("/api/permissions/%2f/stranger").await;
    assert_eq!(status, 204);
    let broker = broker.restart();
    let e = connect_uri(&uri(&broker, "stranger")).await.expect_err("no permissions in /");
    assert_eq!(amqp_error(&e).map(|e| e.0), Some(530), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_sets_up_no_route_into_the_mqtt_exchange_while_mqtt_rules_are_on() {
    // As over AMQP: an alternate or dead-letter exchange, or an exchange binding, into
    // amq.topic would carry messages past the MQTT rules.
    let broker = Broker::start_with(Opts::default().config(MQTT_RULES));
    let api = Api::of(&broker);
    let refusals = [
        api.put("/api/queues/%2f/dlq-in", json!({"arguments": {"x-dead-letter-exchange": "amq.topic"}})).await,
        api.put(
            "/api/exchanges/%2f/ae-in",
            json!({"type": "fanout", "arguments": {"alternate-exchange": "amq.topic"}}),
        )
        .await,
        api.post("/api/bindings/%2f/e/amq.fanout/e/amq.topic", json!({"routing_key": "x"})).await,
    ];
    for (status, body) in refusals {
        assert_eq!(status, 403, "{body}");
        assert!(body["reason"].as_str().unwrap_or_default().contains("MQTT-checked"), "{body}");
    }
    assert_eq!(api.get("/api/queues/%2f/dlq-in").await.0, 404, "nothing was made");
    // Other routes are made as before.
    let (status, body) =
        api.put("/api/queues/%2f/dlq-ok", json!({"arguments": {"x-dead-letter-exchange": "amq.direct"}})).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = api.post("/api/bindings/%2f/e/amq.fanout/e/amq.direct", json!({"routing_key": "x"})).await;
    assert_eq!(status, 201, "{body}");

    // A definitions import is held to the same rule, each kind of route, and refused
    // before anything of it is applied.
    let routes = [
        json!({"queues": [{"name": "imp-dlq", "vhost": "/", "durable": true, "arguments": {"x-dead-letter-exchange": "amq.topic"}}]}),
        json!({"exchanges": [{"name": "imp-ae", "vhost": "/", "type": "fanout", "arguments": {"alternate-exchange": "amq.topic"}}]}),
        json!({"bindings": [{"source": "amq.fanout", "vhost": "/", "destination": "amq.topic", "destination_type": "exchange", "routing_key": "x", "arguments": {}}]}),
    ];
    for mut defs in routes {
        // Each also declares a plain queue, to show nothing is half-applied.
        if defs.get("queues").is_none() {
            defs["queues"] = json!([{"name": "imp-plain", "vhost": "/", "durable": true}]);
        }
        let (status, body) = api.post("/api/definitions", defs.clone()).await;
        assert_eq!(status, 400, "{defs}: {body}");
        assert!(body["reason"].as_str().unwrap_or_default().contains("MQTT-checked"), "{body}");
    }
    assert_eq!(api.get("/api/queues/%2f/imp-plain").await.0, 404, "nothing of a refused import was applied");
    assert_eq!(api.get("/api/queues/%2f/imp-dlq").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_a_users_tags_reaches_its_open_connections_as_a_rule_change_does() {
    // Rules name groups by tag ("ops" may subscribe to everything): bob's open
    // connection is judged by his tags as they are now, with no reconnect.
    let broker = Broker::start_with(Opts::default().config(MQTT_RULES));
    let api = Api::of(&broker);
    let mut bob = v4::connect_with(mqtt_v4(&broker, "bob-1", "bob")).await;
    assert_eq!(bob.subscribe("#", v4::QoS::AtLeastOnce).await, vec![rumqttc::SubscribeReasonCode::Failure]);
    let (status, body) = api.put("/api/users/bob", json!({"password": "pw", "tags": "ops"})).await;
    assert!(status.is_success(), "{body}");
    let granted = vec![rumqttc::SubscribeReasonCode::Success(v4::QoS::AtLeastOnce)];
    assert_eq!(bob.subscribe("#", v4::QoS::AtLeastOnce).await, granted, "bob is in group ops now");
    let (status, body) = api.put("/api/users/bob", json!({"password": "pw", "tags": ""})).await;
    assert!(status.is_success(), "{body}");
    let codes = bob.subscribe("$SYS/#", v4::QoS::AtLeastOnce).await;
    assert_eq!(codes, vec![rumqttc::SubscribeReasonCode::Failure], "and out of it again");
}
