//! The management API's views of live state, against the real broker: AMQP channels and
//! consumers, FerryMQ's MQTT views (clients, sessions with offline ones, subscriptions,
//! retained messages; kick, delete a session, delete a retained message), stream consumer
//! groups with their lag and reset, and message lookup by key.

use crate::common;

use std::time::Duration;

use crate::common::amqp::*;
use crate::common::http::Api;
use crate::common::{v4, v5, Broker};
use reqwest::StatusCode;
use serde_json::{json, Value};

fn amqp_uri(broker: &Broker) -> String {
    format!("amqp://guest:guest@{}/%2f", broker.amqp.unwrap())
}

fn find<'a>(rows: &'a Value, key: &str, value: &str) -> Option<&'a Value> {
    rows.as_array()?.iter().find(|r| r[key] == value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_and_consumers_are_listed_as_they_come_and_go() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let conn = connect_uri(&amqp_uri(&broker)).await.unwrap();
    let ch = open_channel(&conn).await;
    let other = open_channel(&conn).await;
    declare_queue(&ch, "work", FieldTable::default()).await;
    bounded("qos", ch.basic_qos(7, BasicQosOptions::default())).await.unwrap();
    let opts = BasicConsumeOptions { exclusive: true, ..Default::default() };
    let _consumer =
        bounded("consume", ch.basic_consume("work".into(), "worker-1".into(), opts, table(&[("x-priority", int(3))])))
            .await
            .unwrap();
    let consumers = common::eventually("the consumer is listed", WAIT, || async {
        let c = api.ok("/api/consumers").await;
        (c.as_array().unwrap().len() == 1).then_some(c)
    })
    .await;
    let c = &consumers[0];
    assert_eq!(c["consumer_tag"], "worker-1");
    assert_eq!(c["queue"], json!({"name": "work", "vhost": "/"}));
    assert_eq!((c["ack_required"].as_bool(), c["exclusive"].as_bool()), (Some(true), Some(true)));
    assert_eq!(c["prefetch_count"], 7);
    assert_eq!(c["arguments"], json!({"x-priority": 3}));
    assert_eq!(api.ok("/api/consumers/%2F").await.as_array().unwrap().len(), 1);
    let channels = api.ok("/api/channels").await;
    let numbers: Vec<u64> = channels.as_array().unwrap().iter().map(|c| c["number"].as_u64().unwrap()).collect();
    assert_eq!(numbers.len(), 2, "{channels}");
    assert_eq!(channels.as_array().unwrap().iter().map(|c| c["consumer_count"].as_u64().unwrap()).sum::<u64>(), 1);
    let conn_name = channels[0]["connection_details"]["name"].as_str().unwrap().to_string();
    assert!(channels[0]["name"].as_str().unwrap().starts_with(&conn_name));
    assert_eq!(api.ok("/api/queues/%2F/work").await["consumers"], 1);

    bounded("cancel", ch.basic_cancel("worker-1".into(), BasicCancelOptions::default())).await.unwrap();
    bounded("close", other.close(200, "bye".into())).await.unwrap();
    common::eventually("the consumer and the channel are gone", WAIT, || async {
        let consumers = api.ok("/api/consumers").await;
        let channels = api.ok("/api/channels").await;
        (consumers == json!([]) && channels.as_array().unwrap().len() == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_clients_sessions_subscriptions_and_retained_messages_are_seen_and_managed() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let mut sensor = v4::connect_persistent(&broker, "sensor-1").await;
    sensor.subscribe("cmd/sensor-1/+", v4::QoS::AtLeastOnce).await;
    let mut panel = v5::connect(&broker, "panel").await;
    panel.subscribe("status/#", v5::QoS::AtMostOnce).await;

    let clients = api.ok("/api/ferrymq/mqtt/clients").await;
    let s = find(&clients, "clientid", "sensor-1").expect("sensor-1 listed");
    assert_eq!((s["proto_ver"].as_u64(), s["clean_start"].as_bool()), (Some(4), Some(false)));
    assert_eq!(s["subscriptions_cnt"], 1);
    assert_eq!(find(&clients, "clientid", "panel").unwrap()["proto_ver"], 5);
    let subs = api.ok("/api/ferrymq/mqtt/subscriptions").await;
    let pairs: Vec<(String, String, u64)> = subs
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (s["clientid"].as_str().unwrap().into(), s["topic"].as_str().unwrap().into(), s["qos"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(pairs, [("panel".into(), "status/#".into(), 0), ("sensor-1".into(), "cmd/sensor-1/+".into(), 1)]);

    // Offline, the persistent session is listed with what it holds.
    drop(sensor);
    let mut publisher = v4::connect(&broker, "ops").await;
    common::eventually("sensor-1 is offline", WAIT, || async {
        let sessions = api.ok("/api/ferrymq/mqtt/sessions").await;
        let s = find(&sessions, "clientid", "sensor-1")?.clone();
        (s["connected"] == false).then_some(())
    })
    .await;
    for i in 0..3 {
        publisher.publish_acked("cmd/sensor-1/reboot", v4::QoS::AtLeastOnce, false, format!("r{i}")).await;
    }
    let sessions = api.ok("/api/ferrymq/mqtt/sessions").await;
    let s = find(&sessions, "clientid", "sensor-1").unwrap();
    assert_eq!(s["persistent"], true);
    assert_eq!(s["mqueue_len"], 3, "{s}");
    assert_eq!(s["subscriptions"], json!([{"topic": "cmd/sensor-1/+", "qos": 1}]));

    // Deleting it drops the session: the client comes back to a fresh one.
    assert_eq!(api.delete("/api/ferrymq/mqtt/sessions/sensor-1").await.0, StatusCode::NO_CONTENT);
    assert!(find(&api.ok("/api/ferrymq/mqtt/sessions").await, "clientid", "sensor-1").is_none());
    let mut back = v4::connect_persistent(&broker, "sensor-1").await;
    assert!(!back.connack.session_present, "the session was deleted");
    back.expect_no_publish(Duration::from_millis(300)).await;
    assert_eq!(api.delete("/api/ferrymq/mqtt/sessions/nobody").await.0, StatusCode::NOT_FOUND);

    // Kicking a 5.0 client: DISCONNECT 0x98.
    assert_eq!(api.delete("/api/ferrymq/mqtt/clients/panel").await.0, StatusCode::NO_CONTENT);
    assert_eq!(panel.expect_server_disconnect().await.0, "AdministrativeAction");

    // Retained messages: listed by filter, deleted without a publish, for good.
    publisher.publish_acked("status/door", v4::QoS::AtLeastOnce, true, "open").await;
    publisher.publish_acked("status/light", v4::QoS::AtLeastOnce, true, "on").await;
    let retained = api.ok("/api/ferrymq/mqtt/retained?topic=status/%23").await;
    let topics: Vec<&str> = retained.as_array().unwrap().iter().map(|r| r["topic"].as_str().unwrap()).collect();
    assert_eq!(topics, ["status/door", "status/light"]);
    assert_eq!(retained[0]["payload"], "open");
    let mut watcher = v4::connect(&broker, "watcher").await;
    watcher.subscribe("status/#", v4::QoS::AtLeastOnce).await;
    let mut at_subscribe = vec![watcher.next_publish().await.topic, watcher.next_publish().await.topic];
    at_subscribe.sort();
    assert_eq!(at_subscribe, ["status/door", "status/light"], "both retained, in no particular order");
    assert_eq!(api.delete("/api/ferrymq/mqtt/retained/status/door").await.0, StatusCode::NO_CONTENT);
    watcher.expect_no_publish(Duration::from_millis(300)).await;
    assert_eq!(api.delete("/api/ferrymq/mqtt/retained/status/door").await.0, StatusCode::NOT_FOUND);
    drop((back, publisher, watcher));
    let broker = broker.restart();
    let api = Api::of(&broker);
    let retained = api.ok("/api/ferrymq/mqtt/retained").await;
    let topics: Vec<&str> = retained.as_array().unwrap().iter().map(|r| r["topic"].as_str().unwrap()).collect();
    assert_eq!(topics, ["status/light"], "the delete is durable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_groups_show_their_lag_and_reset_to_an_offset() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let conn = connect_uri(&amqp_uri(&broker)).await.unwrap();
    let ch = open_channel(&conn).await;
    declare_stream(&ch, "events", &[]).await;
    confirm_select(&ch).await;
    for i in 0..10 {
        publish_confirmed(&ch, "", "events", format!("e{i}").as_bytes(), persistent()).await;
    }
    let args = table(&[("x-consumer-group", string("billing")), ("x-stream-offset", string("first"))]);
    let (member_ch, mut member) = stream_consumer(&conn, 4, "events", args).await;
    for _ in 0..4 {
        let d = next_delivery(&mut member).await;
        bounded("ack", d.ack(BasicAckOptions::default())).await.unwrap();
    }
    let groups = common::eventually("four acknowledged", WAIT, || async {
        let g = api.ok("/api/ferrymq/streams/%2F/events/groups").await;
        (g["groups"][0]["committed_offset"] == 4).then_some(g)
    })
    .await;
    assert_eq!((groups["first_offset"].as_u64(), groups["end_offset"].as_u64()), (Some(0), Some(10)));
    let billing = &groups["groups"][0];
    assert_eq!(billing["name"], "billing");
    assert_eq!(billing["lag"], 6);
    assert_eq!(billing["members"], 1);
    drop((member, member_ch));

    let (status, body) = api.post("/api/ferrymq/streams/%2F/events/groups/billing/reset", json!({"offset": 1})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["committed_offset"], 1);
    let (_ch2, mut again) =
        stream_consumer(&conn, 4, "events", table(&[("x-consumer-group", string("billing"))])).await;
    assert_eq!(offset_of(&next_delivery(&mut again).await), 1, "the group continues from the reset offset");
    let (status, _) = api.post("/api/ferrymq/streams/%2F/events/groups/billing/reset", json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an offset, a timestamp or first/last/next is needed");
    let (status, _) = api.post("/api/ferrymq/streams/%2F/events/groups/audit/reset", json!({"to": "last"})).await;
    assert_eq!(status, StatusCode::OK, "a group that does not exist yet starts there");
    let g = api.ok("/api/ferrymq/streams/%2F/events/groups").await;
    assert_eq!(find(&g["groups"], "name", "audit").unwrap()["committed_offset"], 9);
    declare_queue(&ch, "plain", FieldTable::default()).await;
    assert_eq!(api.get("/api/ferrymq/streams/%2F/plain/groups").await.0, StatusCode::BAD_REQUEST);
    assert_eq!(api.get("/api/ferrymq/streams/%2F/nothing/groups").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_found_by_key_in_a_time_range() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let conn = connect_uri(&amqp_uri(&broker)).await.unwrap();
    let ch = open_channel(&conn).await;
    declare_queue(&ch, "orders", FieldTable::default()).await;
    confirm_select(&ch).await;
    let props = persistent().with_message_id("order-17".into());
    publish_confirmed(&ch, "", "orders", b"seventeen", props).await;
    let keyed = persistent().with_headers(table(&[("x-key", string("customer-9"))]));
    publish_confirmed(&ch, "", "orders", b"nine", keyed).await;
    let found = api.ok("/api/ferrymq/messages?key=order-17").await;
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["payload"], "seventeen");
    assert_eq!(found[0]["routing_key"], "orders");
    assert_eq!(found[0]["properties"]["message_id"], "order-17");
    assert!(found[0]["log_position"].is_u64());
    let by_header = api.ok("/api/ferrymq/messages?key=customer-9").await;
    assert_eq!(by_header[0]["payload"], "nine");
    assert_eq!(by_header[0]["headers"]["x-key"], "customer-9");
    assert_eq!(api.ok("/api/ferrymq/messages?key=order-17&to=1").await, json!([]), "outside the time range");
    assert_eq!(api.get("/api/ferrymq/messages?key=").await.0, StatusCode::BAD_REQUEST);
}

/// The value of the first series `name{...}` whose labels contain `label`.
fn series(text: &str, name: &str, label: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label));
    line.and_then(|l| l.rsplit_once(' ')).and_then(|(_, v)| v.parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_clients_show_inflight_and_drops_and_metrics_count_them_by_reason() {
    use crate::common::{connect_bytes, packet, Raw, WAIT};
    let broker = Broker::start_with(common::Opts::default().env("FERRYMQ_HTTP__COLLECT_STATISTICS_INTERVAL", "100"));
    let api = Api::of(&broker);
    let metrics_url = format!("http://{}/metrics", broker.http.unwrap());
    // An MQTT 5 subscriber that takes packets of at most 100 bytes and acknowledges nothing.
    let mut raw = Raw::connect(&broker).await;
    raw.send(&connect_bytes(5, "small", 0x02, 60, &[5, 0x27, 0, 0, 0, 100])).await;
    let connack = raw.read_at_least(4).await;
    assert_eq!((connack[0], connack[3]), (0x20, 0), "CONNACK success: {connack:02x?}");
    let mut sub = vec![0, 1, 0];
    for (topic, qos) in [("sm/bg", 0u8), ("sm/q1", 1)] {
        sub.extend_from_slice(&(topic.len() as u16).to_be_bytes());
        sub.extend_from_slice(topic.as_bytes());
        sub.push(qos);
    }
    raw.send(&packet(0x82, &sub)).await;
    assert_eq!(raw.read_at_least(7).await, vec![0x90, 5, 0, 1, 0, 0, 1], "SUBACK");
    let mut p = v4::connect(&broker, "feeder").await;
    p.client.publish("sm/bg", v4::QoS::AtMostOnce, false, vec![b'x'; 500]).await.unwrap();
    p.client.publish("sm/bg", v4::QoS::AtMostOnce, false, "ok").await.unwrap();
    let small = raw.read_at_least(2).await;
    assert!(small.ends_with(b"ok") && small[0] == 0x30, "only the small one comes: {small:02x?}");
    p.client.publish("sm/q1", v4::QoS::AtLeastOnce, false, "held").await.unwrap();
    let held = raw.read_at_least(2).await;
    assert_eq!(held[0], 0x32, "QoS 1 PUBLISH, left unacknowledged: {held:02x?}");
    let client = common::eventually("the client's delivery state", WAIT, || async {
        let clients = api.ok("/api/ferrymq/mqtt/clients").await;
        let c = find(&clients, "clientid", "small")?.clone();
        (c["mqueue_dropped"] == 1 && c["inflight_cnt"] == 1).then_some(c)
    })
    .await;
    assert_eq!(client["mqueue_len"], 0, "{client}");
    // Publishes nobody takes, and one to a topic reserved for the broker.
    p.publish_acked("nobody/listens", v4::QoS::AtLeastOnce, false, "lost").await;
    p.publish_acked("$SYS/forbidden", v4::QoS::AtLeastOnce, false, "no").await;
    p.publish_acked("$delayed/600/later/x", v4::QoS::AtLeastOnce, false, "in ten minutes").await;
    assert!(connect_uri(&format!("amqp://guest:wrong@{}/%2f", broker.amqp.unwrap())).await.is_err());
    let text = common::eventually("the drop and login counters", WAIT, || async {
        let text = reqwest::get(&metrics_url).await.ok()?.text().await.ok()?;
        let ready = series(&text, "ferrymq_mqtt_dropped_total", "reason=\"no_subscribers\"") >= 1.0
            && series(&text, "ferrymq_mqtt_dropped_total", "reason=\"not_authorized\"") >= 1.0
            && series(&text, "rabbitmq_auth_attempts_failed_total", "protocol=\"amqp091\"") >= 1.0;
        ready.then_some(text)
    })
    .await;
    for reason in ["too_large", "no_subscribers", "not_authorized"] {
        let n = series(&text, "ferrymq_mqtt_dropped_total", &format!("reason=\"{reason}\""));
        assert!(n >= 1.0, "{reason}: {n}");
    }
    assert_eq!(series(&text, "ferrymq_mqtt_dropped_total", "reason=\"expired\""), 0.0);
    assert!(series(&text, "rabbitmq_auth_attempts_succeeded_total", "protocol=\"mqtt\"") >= 2.0);
    assert!(series(&text, "rabbitmq_auth_attempts_total", "protocol=\"amqp091\"") >= 1.0);
    let delayed = common::eventually("the delayed count", WAIT, || async {
        let d = api.ok("/api/ferrymq/mqtt/delayed").await;
        (d["pending"] == 1).then_some(d)
    })
    .await;
    assert_eq!(delayed["at_limit"], false);
    let text = reqwest::get(&metrics_url).await.unwrap().text().await.unwrap();
    assert!(text.contains("\nferrymq_delayed_messages 1\n"), "the gauge follows the sample");
    drop(raw);
}

/// A stream is counted where a queue is (issue 30: a stream holding 13,000 entries showed 0
/// messages and 0 rates): its entries, bytes and offsets in `/api/queues`, its rates,
/// `/metrics/per-object` and `ferrymq ctl list queues`; after a restart too, where the
/// bytes of what it held are counted in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reports_its_length_bytes_offsets_and_rates_where_a_queue_does() {
    let opts = common::Opts::default().env("FERRYMQ_HTTP__COLLECT_STATISTICS_INTERVAL", "100");
    let broker = Broker::start_with(opts);
    let api = Api::of(&broker);
    let conn = connect_uri(&amqp_uri(&broker)).await.unwrap();
    let ch = open_channel(&conn).await;
    declare_stream(&ch, "ledger", &[]).await;
    confirm_select(&ch).await;
    for i in 0..300 {
        publish_confirmed(&ch, "", "ledger", format!("{i:0100}").as_bytes(), persistent()).await;
    }
    let (reader_ch, mut reader) =
        stream_consumer(&conn, 20, "ledger", table(&[("x-stream-offset", string("first"))])).await;
    for _ in 0..10 {
        let d = next_delivery(&mut reader).await;
        bounded("ack", d.ack(BasicAckOptions::default())).await.unwrap();
    }
    let q = common::eventually("the stream's counters", WAIT, || async {
        let q = api.ok("/api/queues/%2F/ledger").await;
        (q["message_stats"]["ack"] == 10).then_some(q)
    })
    .await;
    assert_eq!(q["type"], "stream");
    assert_eq!(
        [&q["messages"], &q["messages_ready"], &q["messages_unacknowledged"], &q["message_bytes"]],
        [&json!(300), &json!(300), &json!(0), &json!(30_000)],
        "entries are what a stream holds; reading removes none: {q}"
    );
    assert_eq!(
        [&q["first_offset"], &q["last_offset"], &q["committed_offset"]],
        [&json!(0), &json!(299), &json!(299)],
        "{q}"
    );
    assert_eq!(q["message_stats"]["publish"], 300, "{q}");
    assert!(q["message_stats"]["deliver"].as_u64() >= Some(20), "a prefetch of 20, then one per ack: {q}");
    let listed = api.ok("/api/queues").await;
    let row = find(&listed, "name", "ledger").unwrap();
    assert_eq!((row["messages"].as_u64(), row["last_offset"].as_u64()), (Some(300), Some(299)), "{row}");
    drop((reader, reader_ch));

    // Rates: while a publisher keeps going, the stream's publish rate and depth rate move.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = tokio::spawn({
        let (ch, stop) = (ch.clone(), stop.clone());
        async move {
            let mut n = 0u64;
            while n < 400 && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                publish_confirmed(&ch, "", "ledger", format!("r{n}").as_bytes(), persistent()).await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n
        }
    });
    common::eventually("the stream's publish and depth rates", WAIT, || async {
        let q = api.ok("/api/queues/%2F/ledger").await;
        let publish = q["message_stats"]["publish_details"]["rate"].as_f64().unwrap_or(0.0);
        let depth = q["messages_details"]["rate"].as_f64().unwrap_or(0.0);
        (publish > 0.0 && depth > 0.0).then_some(())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let end = 300 + publisher.await.unwrap();
    common::eventually("the gauge after the last publish", WAIT, || async {
        (api.ok("/api/queues/%2F/ledger").await["messages"] == end).then_some(())
    })
    .await;
    let text = reqwest::get(format!("http://{}/metrics/per-object", broker.http.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let label = "queue=\"ledger\"";
    assert_eq!(series(&text, "rabbitmq_detailed_queue_messages", label), end as f64, "{text}");
    assert_eq!(series(&text, "rabbitmq_detailed_queue_messages_ready", label), end as f64);
    assert!(series(&text, "rabbitmq_detailed_queue_messages_bytes", label) >= 30_000.0);
    assert_eq!(series(&text, "rabbitmq_detailed_queue_messages_published_total", label), end as f64);
    assert_eq!(series(&text, "ferrymq_stream_first_offset", label), 0.0);
    assert_eq!(series(&text, "ferrymq_stream_last_offset", label), (end - 1) as f64);
    drop((ch, conn));

    let broker = broker.restart();
    let api = Api::of(&broker);
    let bytes = common::eventually("the bytes held at start, counted in the background", WAIT, || async {
        let q = api.ok("/api/queues/%2F/ledger").await;
        let bytes = q["message_bytes"].as_u64()?;
        (q["messages"] == end && bytes >= 30_000).then_some(bytes)
    })
    .await;
    let out = std::process::Command::new(common::binary())
        .args(["ctl", "--url", &format!("http://{}", broker.http.unwrap()), "list", "queues", "--json"])
        .output()
        .expect("run ferrymq ctl");
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = find(&rows, "name", "ledger").unwrap();
    assert_eq!((row["messages"].as_u64(), row["message_bytes"].as_u64()), (Some(end), Some(bytes)), "{row}");
    let table = std::process::Command::new(common::binary())
        .args(["ctl", "--url", &format!("http://{}", broker.http.unwrap()), "list", "queues"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    let line = table.lines().find(|l| l.contains("ledger")).unwrap_or_else(|| panic!("{table}"));
    assert!(line.split_whitespace().any(|w| w == end.to_string()), "the table counts the entries: {table}");
}
