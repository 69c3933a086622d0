//! The management HTTP API against the real broker, driven by an HTTP client (`reqwest`)
//! as `rabbitmqadmin`, curl scripts and Terraform drive RabbitMQ's: authentication and user
//! tags, RabbitMQ's JSON shapes, queues and exchanges declared, published to, read and
//! deleted, connections of both protocols listed and closed, health checks, and the
//! Prometheus `/metrics` counters moving as messages flow.
//!
//! With `FERRYMQ_TEST_RABBITMQ_HTTP=http://guest:guest@HOST:15672` set, the shape test also
//! asks a RabbitMQ node the same calls and compares the key sets (skipped otherwise).

use crate::common;

use crate::common::amqp::*;
use crate::common::http::Api;
use crate::common::{v5, Broker, Opts};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    k.sort();
    k
}

fn assert_has(v: &Value, wanted: &[&str], what: &str) {
    for k in wanted {
        assert!(v.get(*k).is_some(), "{what} lacks `{k}`: {v}");
    }
}

/// The fields rabbitmqadmin v2 cannot parse a queue without, and the counts tools read.
const QUEUE_FIELDS: &[&str] = &[
    "name",
    "vhost",
    "type",
    "durable",
    "auto_delete",
    "exclusive",
    "arguments",
    "node",
    "state",
    "consumers",
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "message_bytes",
];

async fn amqp_channel(broker: &Broker) -> (Connection, Channel) {
    let conn = connect_uri(&format!("amqp://guest:guest@{}/%2f", broker.amqp.unwrap())).await.unwrap();
    let ch = open_channel(&conn).await;
    (conn, ch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_the_api_answers_401_and_with_them_the_overview() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let (status, body) = api.anonymous().get("/api/overview").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"], "not_authorized", "{body}");
    let (status, _) = api.as_user("guest", "wrong").get("/api/overview").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let o = api.ok("/api/overview").await;
    assert_has(
        &o,
        &[
            "management_version",
            "rabbitmq_version",
            "product_version",
            "node",
            "cluster_name",
            "listeners",
            "exchange_types",
            "message_stats",
            "queue_totals",
            "object_totals",
            "churn_rates",
        ],
        "overview",
    );
    assert_eq!(o["product_name"], "FerryMQ");
    let protocols: Vec<&str> =
        o["listeners"].as_array().unwrap().iter().map(|l| l["protocol"].as_str().unwrap()).collect();
    for p in ["amqp", "mqtt", "http"] {
        assert!(protocols.contains(&p), "listener {p} in {protocols:?}");
    }
    let amqp_port =
        o["listeners"].as_array().unwrap().iter().find(|l| l["protocol"] == "amqp").unwrap()["port"].clone();
    assert_eq!(amqp_port, broker.amqp.unwrap().port());

    let me = api.ok("/api/whoami").await;
    assert_eq!(me["name"], "guest");
    assert_eq!(me["tags"], json!(["administrator"]));
    let nodes = api.ok("/api/nodes").await;
    assert_eq!(nodes.as_array().unwrap().len(), 1);
    assert_has(&nodes[0], &["name", "running", "mem_used", "mem_limit", "disk_free", "fd_used", "uptime"], "node");
    let name = nodes[0]["name"].as_str().unwrap().to_string();
    assert_eq!(api.ok(&format!("/api/nodes/{name}")).await["name"], name.as_str());
    assert_eq!(api.ok("/api/vhosts").await[0]["name"], "/");

    let (status, body) = api.get("/api/no-such-thing").await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::NOT_FOUND, Some("Object Not Found")));
    let (status, body) = api.call(Method::PATCH, "/api/overview", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert!(body["error"].is_string(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_tags_decide_what_a_user_may_call() {
    let users = r#"
[auth]
users = [
  { name = "ops", password = "o", tags = ["monitoring"] },
  { name = "dev", password = "d", tags = ["management"] },
  { name = "app", password = "a" },
]
"#;
    let broker = Broker::start_with(Opts::default().config(users));
    let api = Api::of(&broker);
    let (ops, dev, app) = (api.as_user("ops", "o"), api.as_user("dev", "d"), api.as_user("app", "a"));
    let (status, body) = app.get("/api/overview").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no management tag: {body}");
    assert_eq!(body["reason"], "Not management user");
    assert_eq!(dev.get("/api/queues").await.0, StatusCode::OK);
    assert_eq!(dev.get("/api/nodes").await.0, StatusCode::FORBIDDEN);
    assert_eq!(ops.get("/api/nodes").await.0, StatusCode::OK);
    let (status, body) = ops.get("/api/users").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["reason"], "Not administrator user");
    let users = api.ok("/api/users").await;
    let tags: Vec<(String, Value)> = users
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["name"].as_str().unwrap().to_string(), u["tags"].clone()))
        .collect();
    assert!(tags.contains(&("ops".into(), json!(["monitoring"]))), "{tags:?}");
    assert!(tags.contains(&("app".into(), json!([]))), "{tags:?}");
    let perms = api.ok("/api/permissions").await;
    assert!(perms.as_array().unwrap().iter().any(|p| p["user"] == "dev" && p["vhost"] == "/" && p["write"] == ".*"));
    // A monitoring user sees every connection, a management user only its own.
    let (_c, _ch) = amqp_channel(&broker).await;
    let seen = common::eventually("the AMQP connection is listed", WAIT, || async {
        let c = ops.ok("/api/connections").await;
        (c.as_array().unwrap().len() == 1).then_some(c)
    })
    .await;
    assert_eq!(seen[0]["user"], "guest");
    assert_eq!(dev.ok("/api/connections").await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_declared_over_amqp_shows_its_depth_and_pages() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let (_c, ch) = amqp_channel(&broker).await;
    confirm_select(&ch).await;
    for name in ["orders", "orders.dlq", "payments"] {
        declare_queue(&ch, name, FieldTable::default()).await;
    }
    for i in 0..3 {
        publish_confirmed(&ch, "", "orders", format!("m{i}").as_bytes(), persistent()).await;
    }
    let q = common::eventually("the queue shows its depth", WAIT, || async {
        let q = api.ok("/api/queues/%2F/orders").await;
        (q["messages"] == 3).then_some(q)
    })
    .await;
    assert_has(&q, QUEUE_FIELDS, "queue");
    assert_eq!((q["messages_ready"].as_u64(), q["messages_unacknowledged"].as_u64()), (Some(3), Some(0)));
    assert_eq!(q["message_bytes"], 6);
    assert_eq!((q["type"].as_str(), q["durable"].as_bool()), (Some("classic"), Some(false)), "declared transient");

    let all = api.ok("/api/queues").await;
    let names: Vec<&str> = all.as_array().unwrap().iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["orders", "orders.dlq", "payments"]);
    let page = api.ok("/api/queues?page=2&page_size=2").await;
    assert_eq!(
        (page["page"].as_u64(), page["page_count"].as_u64(), page["total_count"].as_u64(), page["item_count"].as_u64()),
        (Some(2), Some(2), Some(3), Some(1))
    );
    assert_eq!(page["items"][0]["name"], "payments");
    let filtered = api.ok("/api/queues/%2F?page=1&page_size=100&name=orders").await;
    assert_eq!(filtered["filtered_count"], 2);
    let regex = api.ok("/api/queues?page=1&name=%5Eorders%24&use_regex=true").await;
    assert_eq!(regex["filtered_count"], 1);
    let bare = api.ok("/api/queues?disable_stats=true").await;
    assert!(bare[0].get("messages").is_none(), "no counts without stats: {}", bare[0]);
    let totals = api.ok("/api/queues?disable_stats=true&enable_queue_totals=true").await;
    assert_eq!(totals[0]["messages"], 3);
    assert!(totals[0].get("message_stats").is_none(), "totals without rates: {}", totals[0]);
    assert!(totals[0].get("messages_details").is_none(), "totals without rates: {}", totals[0]);
    let o = api.ok("/api/overview").await;
    assert_eq!(o["queue_totals"]["messages"], 3);
    assert_eq!(o["object_totals"]["queues"], 3);
    let (status, _) = api.get("/api/queues/%2F/missing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api.get("/api/queues/nohost").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_and_exchanges_are_declared_published_to_read_and_deleted_over_http() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    assert_eq!(api.put("/api/queues/%2F/jobs", json!({"durable": true, "arguments": {}})).await.0, StatusCode::CREATED);
    assert_eq!(api.put("/api/queues/%2F/jobs", json!({"durable": true})).await.0, StatusCode::NO_CONTENT);
    let (status, body) = api.put("/api/queues/%2F/jobs", json!({"durable": false})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["reason"],
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'jobs' in vhost '/': \
         received 'false' but current is 'true'",
        "{body}"
    );
    let (status, _) = api.put("/api/exchanges/%2F/work", json!({"type": "topic", "durable": true})).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = api.put("/api/exchanges/%2F/bad", json!({"type": "nonsense"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let x = api.ok("/api/exchanges/%2F/work").await;
    assert_has(&x, &["name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"], "exchange");
    assert_eq!(x["type"], "topic");

    // Bound over AMQP, published over HTTP, consumed over AMQP.
    let (_c, ch) = amqp_channel(&broker).await;
    bind(&ch, "jobs", "work", "jobs.#", FieldTable::default()).await;
    let publish = |key: &str, payload: &str| {
        json!({"routing_key": key, "payload": payload, "payload_encoding": "string",
               "properties": {"delivery_mode": 2, "headers": {"trace": "t1"}}})
    };
    let (status, body) = api.post("/api/exchanges/%2F/work/publish", publish("jobs.a", "first")).await;
    assert_eq!((status, body.clone()), (StatusCode::OK, json!({"routed": true})), "{body}");
    let (_, body) = api.post("/api/exchanges/%2F/work/publish", publish("other", "lost")).await;
    assert_eq!(body, json!({"routed": false}));
    let (_, body) = api.post("/api/exchanges/%2F/amq.default/publish", publish("jobs", "second")).await;
    assert_eq!(body, json!({"routed": true}), "amq.default names the default exchange");
    let bindings = api.ok("/api/queues/%2F/jobs/bindings").await;
    let sources: Vec<(&str, &str)> = bindings
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["source"].as_str().unwrap(), b["routing_key"].as_str().unwrap()))
        .collect();
    assert_eq!(sources, [("", "jobs"), ("work", "jobs.#")]);
    assert!(bindings[1]["properties_key"].is_string());
    let all = api.ok("/api/bindings/%2F").await;
    assert!(all.as_array().unwrap().iter().any(|b| b["source"] == "work" && b["destination_type"] == "queue"));

    // Looking at messages leaves them; taking them removes them.
    let get = |mode: &str| json!({"count": 5, "ackmode": mode, "encoding": "auto", "truncate": 50000});
    let (status, got) = api.post("/api/queues/%2F/jobs/get", get("ack_requeue_true")).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let payloads: Vec<&str> = got.as_array().unwrap().iter().map(|m| m["payload"].as_str().unwrap()).collect();
    assert_eq!(payloads, ["first", "second"]);
    assert_eq!(got[0]["properties"]["headers"]["trace"], "t1");
    assert_eq!(got[0]["properties"]["delivery_mode"], 2);
    assert_eq!(got[0]["exchange"], "work");
    assert_eq!(got[0]["payload_encoding"], "string");
    let depth = common::eventually("the messages went back", WAIT, || async {
        let q = api.ok("/api/queues/%2F/jobs").await;
        (q["messages_ready"] == 2).then_some(q["messages"].clone())
    })
    .await;
    assert_eq!(depth, 2);
    let (_, got) = api
        .post("/api/queues/%2F/jobs/get", json!({"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"}))
        .await;
    assert_eq!(got[0]["payload"], "Zmlyc3Q=", "base64 of 'first': {got}");
    assert_eq!(got[0]["redelivered"], true, "it was looked at before");
    assert_eq!(drain(&ch, "jobs").await, ["second"], "an AMQP client takes what is left");

    let (status, _) = api.post("/api/exchanges/%2F/work/publish", publish("jobs.b", "third")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = api.delete("/api/queues/%2F/jobs?if-empty=true").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "not empty: {body}");
    assert_eq!(api.delete("/api/queues/%2F/jobs/contents").await.0, StatusCode::NO_CONTENT);
    assert_eq!(queue_counts(&ch, "jobs").await.unwrap().0, 0, "purged");
    assert_eq!(api.delete("/api/queues/%2F/jobs?if-empty=true").await.0, StatusCode::NO_CONTENT);
    assert_eq!(api.get("/api/queues/%2F/jobs").await.0, StatusCode::NOT_FOUND);
    assert_eq!(api.delete("/api/exchanges/%2F/work").await.0, StatusCode::NO_CONTENT);
    assert_eq!(api.get("/api/exchanges/%2F/work").await.0, StatusCode::NOT_FOUND);
    let (status, _) = api.delete("/api/exchanges/%2F/amq.topic").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "the standard exchanges stay");

    // What was declared over HTTP is durable like an AMQP declaration.
    api.put("/api/queues/%2F/kept", json!({})).await;
    api.put("/api/exchanges/%2F/kept.x", json!({"type": "fanout"})).await;
    drop((_c, ch));
    let broker = broker.restart();
    let api = Api::of(&broker);
    assert_eq!(api.get("/api/queues/%2F/kept").await.0, StatusCode::OK);
    assert_eq!(api.ok("/api/exchanges/%2F/kept.x").await["type"], "fanout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_of_both_protocols_are_listed_and_closed_by_an_operator() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let (conn, _ch) = amqp_channel(&broker).await;
    let mut events = events(&conn);
    let mut mqtt = v5::connect(&broker, "sensor-7").await;
    let list = common::eventually("both connections are listed", WAIT, || async {
        let l = api.ok("/api/connections").await;
        (l.as_array().unwrap().len() == 2).then_some(l)
    })
    .await;
    let by_protocol = |p: &str| list.as_array().unwrap().iter().find(|c| c["protocol"] == p).cloned().unwrap();
    let amqp = by_protocol("AMQP 0-9-1");
    let device = by_protocol("MQTT 5.0");
    for c in [&amqp, &device] {
        assert_has(
            c,
            &[
                "name",
                "user",
                "vhost",
                "peer_host",
                "peer_port",
                "connected_at",
                "recv_oct",
                "send_oct",
                "channels",
                "client_properties",
            ],
            "connection",
        );
    }
    assert_eq!(amqp["user"], "guest");
    assert_eq!(amqp["port"], broker.amqp.unwrap().port());
    assert_eq!(amqp["channels"], 1);
    assert!(amqp["recv_oct"].as_u64().unwrap() > 0);
    assert_eq!(amqp["client_properties"]["product"], "lapin", "{}", amqp["client_properties"]);
    assert_eq!(device["client_id"], "sensor-7");
    assert_eq!(device["client_properties"]["client_id"], "sensor-7");
    // The mechanism each logged in with (lapin: PLAIN; RabbitMQ lists MQTT ones as MQTT).
    assert_eq!((amqp["auth_mechanism"].as_str(), device["auth_mechanism"].as_str()), (Some("PLAIN"), Some("MQTT")));
    let name = amqp["name"].as_str().unwrap();
    assert!(name.ends_with(&format!(" -> {}", broker.amqp.unwrap())), "{name}");
    let one = api.ok(&format!("/api/connections/{}", urlencode(name))).await;
    assert_eq!(one["name"], name);

    let resp = api
        .http
        .delete(format!("{}/api/connections/{}", api.base, urlencode(name)))
        .basic_auth("guest", Some("guest"))
        .header("X-Reason", "maintenance window")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let (code, text) = server_closed(&mut events).await;
    assert_eq!(code, 320);
    assert_eq!(text, "CONNECTION_FORCED - maintenance window");

    let device_name = device["name"].as_str().unwrap();
    assert_eq!(api.delete(&format!("/api/connections/{}", urlencode(device_name))).await.0, StatusCode::NO_CONTENT);
    let (code, _) = mqtt.expect_server_disconnect().await;
    assert_eq!(code, "AdministrativeAction");
    common::eventually("both are gone from the list", WAIT, || async {
        (api.ok("/api/connections").await == json!([])).then_some(())
    })
    .await;
    assert_eq!(api.get(&format!("/api/connections/{}", urlencode(name))).await.0, StatusCode::NOT_FOUND);
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_answer_as_rabbitmqs_do() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    assert_eq!(api.ok("/api/health/checks/alarms").await, json!({"status": "ok"}));
    assert_eq!(api.ok("/api/health/checks/local-alarms").await["status"], "ok");
    assert_eq!(api.ok("/api/health/checks/virtual-hosts").await["status"], "ok");
    let port = broker.amqp.unwrap().port();
    assert_eq!(api.ok(&format!("/api/health/checks/port-listener/{port}")).await["status"], "ok");
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (status, body) = api.get(&format!("/api/health/checks/port-listener/{unused}")).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("failed")));
    assert_eq!(api.ok("/api/health/checks/protocol-listener/amqp091").await["status"], "ok");
    assert_eq!(api.ok("/api/health/checks/protocol-listener/mqtt").await["status"], "ok");
    assert_eq!(api.get("/api/health/checks/protocol-listener/mqtt%2Fssl").await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(api.ok("/api/aliveness-test/%2F").await, json!({"status": "ok"}));
    assert_eq!(api.ok("/api/aliveness-test/%2F").await, json!({"status": "ok"}), "again, on the existing queue");
    assert_eq!(api.get("/api/aliveness-test/nohost").await.0, StatusCode::NOT_FOUND);

    // A raised memory alarm fails the alarm checks (a 1-byte watermark is always exceeded).
    let alarmed = Broker::start_with(Opts::default().config("[broker]\nmemory_high_watermark_bytes = 1\n"));
    let api = Api::of(&alarmed);
    let (status, body) = api.get("/api/health/checks/alarms").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["alarms"][0]["resource"], "memory");
    assert_eq!(api.ok("/api/nodes").await[0]["mem_alarm"], true);
}

/// One sample of a metric without labels, or with `protocol` = `label`.
fn sample(text: &str, name: &str, label: Option<&str>) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let wanted = match label {
            None => name.to_string(),
            Some(p) => format!("{name}{{protocol=\"{p}\"}}"),
        };
        (series == wanted).then(|| value.parse().ok()).flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_metrics_use_rabbitmqs_names_and_move_as_messages_flow() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let scrape = || async {
        let resp = reqwest::get(format!("{}/metrics", api.base)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "no credentials needed by default");
        let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
        resp.text().await.unwrap()
    };
    let before = scrape().await;
    assert!(before.trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");
    assert_eq!(sample(&before, "rabbitmq_global_messages_received_total", Some("amqp091")), Some(0.0));
    assert!(before.contains("# TYPE rabbitmq_queue_messages_ready gauge"), "{before}");

    let (_c, ch) = amqp_channel(&broker).await;
    confirm_select(&ch).await;
    declare_queue(&ch, "metered", FieldTable::default()).await;
    for _ in 0..5 {
        publish_confirmed(&ch, "", "metered", b"x", persistent()).await;
    }
    let mut device = v5::connect(&broker, "meter").await;
    for _ in 0..3 {
        device.publish_acked("meters/1", v5::QoS::AtLeastOnce, false, "42").await;
    }
    let after = common::eventually("the counters moved", WAIT, || async {
        let t = scrape().await;
        (sample(&t, "rabbitmq_queue_messages_ready", None) == Some(5.0)
            && sample(&t, "rabbitmq_global_messages_received_total", Some("mqtt")) == Some(3.0))
        .then_some(t)
    })
    .await;
    assert_eq!(sample(&after, "rabbitmq_global_messages_received_total", Some("amqp091")), Some(5.0));
    assert_eq!(sample(&after, "rabbitmq_global_messages_confirmed_total", Some("amqp091")), Some(5.0));
    assert_eq!(sample(&after, "rabbitmq_queues", None), Some(1.0));
    assert_eq!(sample(&after, "rabbitmq_connections", None), Some(2.0));
    assert_eq!(sample(&after, "ferrymq_mqtt_connections", None), Some(1.0));
    let syncs = sample(&after, "ferrymq_journal_fsyncs_total", None).unwrap();
    assert!(syncs >= 1.0, "confirmed persistent messages were synced: {syncs}");
    assert!(sample(&after, "ferrymq_journal_fsync_seconds_count", None).unwrap() >= 1.0, "a latency histogram");
    assert!(after.contains("ferrymq_journal_fsync_seconds_bucket{le=\"+Inf\"}"), "{after}");
    assert!(sample(&after, "ferrymq_journal_group_commit_submissions_count", None).unwrap() >= 1.0);
    assert_eq!(sample(&after, "ferrymq_mqtt_sessions", None), Some(1.0));
    assert!(!after.contains("rabbitmq_detailed_queue"), "per-object series stay off /metrics");
    let per_object = reqwest::get(format!("{}/metrics/per-object", api.base)).await.unwrap().text().await.unwrap();
    let series = "rabbitmq_detailed_queue_messages_ready{vhost=\"/\",queue=\"metered\"} 5";
    assert!(per_object.contains(series), "{per_object}");
    drain(&ch, "metered").await;
    let drained = common::eventually("deliveries and acks are counted", WAIT, || async {
        let t = scrape().await;
        (sample(&t, "rabbitmq_global_messages_delivered_total", Some("amqp091")) == Some(5.0)).then_some(t)
    })
    .await;
    assert_eq!(sample(&drained, "rabbitmq_queue_messages", None), Some(0.0));

    // With metrics_without_auth off, a monitoring user is needed.
    let locked = Broker::start_with(Opts::default().config("[http]\nmetrics_without_auth = false\n"));
    let base = format!("http://{}/metrics", locked.http.unwrap());
    let client = reqwest::Client::new();
    assert_eq!(client.get(&base).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let ok = client.get(&base).basic_auth("guest", Some("guest")).send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
}

/// The same calls against a RabbitMQ node (`FERRYMQ_TEST_RABBITMQ_HTTP`) answer at least
/// the keys FerryMQ answers for the objects both have. Needs that node, so it is listed as
/// ignored in the summary and run with `cargo test --test integration http::api:: -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "compares with a RabbitMQ node: FERRYMQ_TEST_RABBITMQ_HTTP=http://user:pass@host:15672, run with --ignored"]
async fn key_sets_match_a_rabbitmq_node_where_one_runs() {
    let reference = std::env::var("FERRYMQ_TEST_RABBITMQ_HTTP")
        .expect("FERRYMQ_TEST_RABBITMQ_HTTP=http://user:pass@host:15672 names the RabbitMQ node to compare with");
    let url = reqwest::Url::parse(&reference).expect("http://user:pass@host:port");
    let rabbit = Api {
        base: format!("{}://{}:{}", url.scheme(), url.host_str().unwrap(), url.port().unwrap_or(15672)),
        http: reqwest::Client::new(),
        user: Some((url.username().to_string(), url.password().unwrap_or("").to_string())),
    };
    let broker = Broker::start();
    let ours = Api::of(&broker);
    let q = common::amqp::unique("keys");
    for api in [&rabbit, &ours] {
        api.put(&format!("/api/queues/%2F/{q}"), json!({"durable": true})).await;
    }
    for path in ["/api/overview".to_string(), format!("/api/queues/%2F/{q}"), "/api/exchanges/%2F/amq.topic".into()] {
        let theirs = keys(&rabbit.ok(&path).await);
        let mine = keys(&ours.ok(&path).await);
        let missing: Vec<&String> = theirs.iter().filter(|k| !mine.contains(k)).collect();
        eprintln!("{path}: RabbitMQ keys FerryMQ lacks: {missing:?}");
        for k in mine.iter().filter(|k| !theirs.contains(k)) {
            eprintln!("{path}: FerryMQ-only key {k}");
        }
        if path.starts_with("/api/queues") {
            for k in QUEUE_FIELDS {
                assert!(theirs.contains(&k.to_string()), "RabbitMQ has {k}");
            }
        }
    }
    rabbit.delete(&format!("/api/queues/%2F/{q}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_is_served_from_the_binary_without_credentials() {
    let broker = Broker::start();
    let base = format!("http://{}", broker.http.unwrap());
    for (path, kind, needle) in [
        ("/", "text/html", "<script src=\"app.js\"></script>"),
        ("/app.js", "text/javascript", "async function api("),
        ("/style.css", "text/css", "table {"),
        // MQTT.js's browser build, vendored, for the MQTT client page.
        ("/vendor/mqtt.min.js", "text/javascript", "mqtt"),
    ] {
        let resp = reqwest::get(format!("{base}{path}")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let headers = resp.headers().clone();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind), "{path}: {headers:?}");
        assert!(headers["content-security-policy"].to_str().unwrap().contains("default-src 'self'"));
        assert!(resp.text().await.unwrap().contains(needle), "{path}");
    }
    // The page's own calls get a 401 without WWW-Authenticate (no browser dialog).
    let resp = reqwest::Client::new()
        .get(format!("{base}/api/whoami"))
        .header("x-requested-with", "XMLHttpRequest")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(resp.headers().get("www-authenticate").is_none());
}

/// Sends one HTTP/1.1 request over `io` and answers the whole response (the server closes).
async fn raw_request<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: S, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let auth = "Z3Vlc3Q6Z3Vlc3Q="; // guest:guest
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n");
    io.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(common::WAIT, io.read_to_end(&mut out)).await.expect("response in time").unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_over_https_and_metrics_on_a_listener_of_their_own() {
    use rustls_pki_types::pem::PemObject;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, ca_pem) = common::make_certs(tmp.path());
    let broker = Broker::start_with(
        Opts::default()
            .args(&["--https-listen", "127.0.0.1:0", "--prometheus-listen", "127.0.0.1:0"])
            .env("FERRYMQ_TLS__CERT", cert.to_str().unwrap())
            .env("FERRYMQ_TLS__KEY", key.to_str().unwrap()),
    );
    let https = broker.https.expect("https address in the READY line");
    let prometheus = broker.prometheus.expect("prometheus address in the READY line");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls_pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    // A client that opens the TLS port and never says hello holds up nobody.
    let _stalled = tokio::net::TcpStream::connect(https).await.unwrap();
    let tls = |c: tokio_rustls::TlsConnector| async move {
        let tcp = tokio::net::TcpStream::connect(https).await.unwrap();
        c.connect("localhost".try_into().unwrap(), tcp).await.expect("TLS handshake with the broker's certificate")
    };
    let answer = raw_request(tls(connector.clone()).await, "/api/overview").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"product_name\":\"FerryMQ\""), "{answer}");
    // The listeners are reported as RabbitMQ names them.
    let listeners = Api::of(&broker).ok("/api/overview").await["listeners"].clone();
    let protocols: Vec<&str> = listeners.as_array().unwrap().iter().map(|l| l["protocol"].as_str().unwrap()).collect();
    assert!(protocols.contains(&"https") && protocols.contains(&"http/prometheus"), "{listeners}");
    let port = format!("/api/health/checks/port-listener/{}", https.port());
    assert!(raw_request(tls(connector).await, &port).await.contains("\"status\":\"ok\""));
    // The Prometheus listener answers /metrics and nothing else.
    let metrics = reqwest::get(format!("http://{prometheus}/metrics")).await.unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    assert!(metrics.text().await.unwrap().contains("rabbitmq_connections"));
    let api = reqwest::get(format!("http://{prometheus}/api/overview")).await.unwrap();
    assert_eq!(api.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_counts_and_rates_what_its_clients_did() {
    let broker = Broker::start_with(Opts::default().env("FERRYMQ_HTTP__COLLECT_STATISTICS_INTERVAL", "100"));
    let api = Api::of(&broker);
    let (_c, ch) = amqp_channel(&broker).await;
    confirm_select(&ch).await;
    declare_queue(&ch, "stats", FieldTable::default()).await;
    for i in 0..10 {
        publish_confirmed(&ch, "", "stats", format!("m{i}").as_bytes(), persistent()).await;
    }
    // Two fetched and acknowledged, eight delivered; one of those nacked back and
    // delivered again.
    for _ in 0..2 {
        let m = get(&ch, "stats", false).await.expect("a message to get");
        bounded("ack", ch.basic_ack(m.delivery.delivery_tag, BasicAckOptions::default())).await.unwrap();
    }
    let mut consumer = consume(&ch, "stats", BasicConsumeOptions::default(), FieldTable::default()).await;
    let mut redelivered = false;
    for i in 0..9 {
        let d = next_delivery(&mut consumer).await;
        redelivered |= d.redelivered;
        if i == 0 {
            let nack = BasicNackOptions { multiple: false, requeue: true };
            bounded("nack", ch.basic_nack(d.delivery_tag, nack)).await.unwrap();
        } else {
            bounded("ack", ch.basic_ack(d.delivery_tag, BasicAckOptions::default())).await.unwrap();
        }
    }
    assert!(redelivered, "the nacked message came back marked redelivered");
    let stats = common::eventually("the queue's counters", WAIT, || async {
        let q = api.ok("/api/queues/%2F/stats").await;
        (q["message_stats"]["ack"] == 10).then_some(q["message_stats"].clone())
    })
    .await;
    let count = |k: &str| stats[k].as_u64().unwrap_or_else(|| panic!("{k} in {stats}"));
    assert_eq!(
        [count("publish"), count("get"), count("deliver"), count("deliver_get"), count("redeliver"), count("ack")],
        [10, 2, 9, 11, 1, 10],
        "{stats}"
    );
    assert!(stats["publish_details"]["rate"].is_number());
    // While a publisher keeps going, the queue's publish rate and depth rate show it.
    let publisher = tokio::spawn({
        let ch = ch.clone();
        async move {
            for i in 0..400 {
                publish_confirmed(&ch, "", "stats", format!("r{i}").as_bytes(), persistent()).await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    });
    // The first samples may still span the acknowledgements above (the depth falling):
    // the depth rate turns positive once the window holds the publishes alone.
    let rate = |q: &Value, k: &str| q[k]["rate"].as_f64().unwrap_or(0.0);
    common::eventually("a publish rate and a rising depth", WAIT, || async {
        let q = api.ok("/api/queues/%2F/stats").await;
        (rate(&q["message_stats"], "publish_details") > 0.0 && rate(&q, "messages_details") > 0.0).then_some(q)
    })
    .await;
    common::eventually("the connection's byte rates", WAIT, || async {
        let c = api.ok("/api/connections").await[0].clone();
        let (recv, send) = (c["recv_oct_details"]["rate"].as_f64(), c["send_oct_details"]["rate"].as_f64());
        (recv.unwrap_or(0.0) > 0.0 && send.unwrap_or(0.0) > 0.0).then_some(())
    })
    .await;
    publisher.abort();
    let text = reqwest::get(format!("http://{}/metrics/per-object", broker.http.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let of_stats = |name: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(&format!("{name}{{")) && l.contains("queue=\"stats\""));
        line.and_then(|l| l.rsplit_once(' ')).and_then(|(_, v)| v.parse().ok()).unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(of_stats("rabbitmq_detailed_queue_messages_acked_total"), 10.0, "per-object counter");
    assert!(of_stats("rabbitmq_detailed_queue_messages_published_total") >= 10.0);
}
