//! Per-virtual-host and per-user limits as RabbitMQ's (`/api/vhost-limits`,
//! `/api/user-limits`, `limits` in definitions): `max-connections` and `max-queues` of a
//! virtual host, `max-connections` and `max-channels` of a user, refused the way RabbitMQ
//! refuses them (AMQP 530 / 406 with RabbitMQ's texts; MQTT CONNACK 0x97 in 5.0, 5 in
//! 3.1.1 as RabbitMQ's MQTT plugin), kept across restarts and carried by definitions.

use crate::common;

use crate::common::amqp::*;
use crate::common::http::Api;
use crate::common::{v4, v5, Broker, WAIT};
use reqwest::StatusCode;
use serde_json::{json, Value};

fn uri(broker: &Broker, user: &str, pass: &str) -> String {
    format!("amqp://{user}:{pass}@{}/%2f", amqp_addr(broker))
}

/// A user `name` (password `pw`, no tags) with every permission in `/`.
async fn app_user(api: &Api, name: &str) {
    assert_eq!(
        api.put(&format!("/api/users/{name}"), json!({"password": "pw", "tags": ""})).await.0,
        StatusCode::CREATED
    );
    let all = json!({"configure": ".*", "write": ".*", "read": ".*"});
    assert_eq!(api.put(&format!("/api/permissions/%2f/{name}"), all).await.0, StatusCode::CREATED);
}

/// Connects until the broker admits it (a closed connection is uncounted once its task ended).
async fn admitted(uri: &str) -> lapin::Connection {
    common::eventually("a connection admitted again", WAIT, || async move { connect_uri(uri).await.ok() }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_set_listed_and_cleared_as_rabbitmq_s_api_does() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    app_user(&api, "app").await;
    assert_eq!(api.put("/api/vhost-limits/%2f/max-queues", json!({"value": 10})).await.0, StatusCode::NO_CONTENT);
    assert_eq!(api.put("/api/vhost-limits/%2f/max-connections", json!({"value": -1})).await.0, StatusCode::NO_CONTENT);
    assert_eq!(api.put("/api/user-limits/app/max-channels", json!({"value": "5"})).await.0, StatusCode::NO_CONTENT);
    assert_eq!(
        api.ok("/api/vhost-limits").await,
        json!([{"vhost": "/", "value": {"max-connections": -1, "max-queues": 10}}])
    );
    assert_eq!(api.ok("/api/vhost-limits/%2f").await, api.ok("/api/vhost-limits").await);
    assert_eq!(api.ok("/api/user-limits").await, json!([{"user": "app", "value": {"max-channels": 5}}]));
    assert_eq!(api.ok("/api/user-limits/app").await, json!([{"user": "app", "value": {"max-channels": 5}}]));
    assert_eq!(api.ok("/api/users/app").await["limits"], json!({"max-channels": 5}));

    let (status, body) = api.put("/api/vhost-limits/%2f/max-channels", json!({"value": 1})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["reason"].as_str().unwrap().contains("max-channels"), "{body}");
    assert_eq!(api.put("/api/user-limits/app/max-queues", json!({"value": 1})).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(api.put("/api/user-limits/app/max-channels", json!({"value": 1.5})).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(api.put("/api/user-limits/app/max-channels", json!({})).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(api.put("/api/vhost-limits/nowhere/max-queues", json!({"value": 1})).await.0, StatusCode::NOT_FOUND);
    assert_eq!(api.put("/api/user-limits/nobody/max-channels", json!({"value": 1})).await.0, StatusCode::NOT_FOUND);
    // Only administrators set limits (and see users' limits).
    let mgr = json!({"password": "pw", "tags": "management"});
    assert_eq!(api.put("/api/users/mgr", mgr).await.0, StatusCode::CREATED);
    let mgr = api.as_user("mgr", "pw");
    assert_eq!(mgr.put("/api/vhost-limits/%2f/max-queues", json!({"value": 100_000})).await.0, StatusCode::FORBIDDEN);
    assert_eq!(mgr.delete("/api/vhost-limits/%2f/max-queues").await.0, StatusCode::FORBIDDEN);
    assert_eq!(mgr.put("/api/user-limits/mgr/max-channels", json!({"value": -1})).await.0, StatusCode::FORBIDDEN);
    assert_eq!(mgr.get("/api/user-limits").await.0, StatusCode::FORBIDDEN);

    assert_eq!(api.delete("/api/vhost-limits/%2f/max-queues").await.0, StatusCode::NO_CONTENT);
    assert_eq!(api.delete("/api/vhost-limits/%2f/max-connections").await.0, StatusCode::NO_CONTENT);
    assert_eq!(api.delete("/api/user-limits/app/max-channels").await.0, StatusCode::NO_CONTENT);
    assert_eq!(api.ok("/api/vhost-limits").await, json!([]));
    assert_eq!(api.ok("/api/user-limits/app").await, json!([]));
    assert_eq!(api.ok("/api/users/app").await["limits"], json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_connections_past_a_vhost_or_user_limit_are_refused_with_530() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    app_user(&api, "app").await;
    api.put("/api/vhost-limits/%2f/max-connections", json!({"value": 2})).await;
    let first = connect_uri(&uri(&broker, "app", "pw")).await.expect("first");
    let _mqtt = v4::connect(&broker, "counted-in-slash").await;
    let refused = connect_uri(&uri(&broker, "guest", "guest")).await;
    let text = expect_code(refused, 530);
    assert_eq!(text, "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection limit (2) is reached");
    // A closed connection gives its place back.
    bounded("close", first.close(200, "bye".into())).await.unwrap();
    drop(admitted(&uri(&broker, "guest", "guest")).await);

    api.delete("/api/vhost-limits/%2f/max-connections").await;
    api.put("/api/user-limits/app/max-connections", json!({"value": 1})).await;
    let _one = admitted(&uri(&broker, "app", "pw")).await;
    let text = expect_code(connect_uri(&uri(&broker, "app", "pw")).await, 530);
    assert_eq!(text, "NOT_ALLOWED - connection refused for user 'app': user connection limit (1) is reached");
    // Other users are not counted against it.
    let _guest = connect_uri(&uri(&broker, "guest", "guest")).await.expect("another user");
    // 0 refuses every new connection, a negative value none.
    api.put("/api/user-limits/guest/max-connections", json!({"value": 0})).await;
    expect_code(connect_uri(&uri(&broker, "guest", "guest")).await, 530);
    api.put("/api/user-limits/guest/max-connections", json!({"value": -1})).await;
    let _more = connect_uri(&uri(&broker, "guest", "guest")).await.expect("no limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_connections_past_a_limit_get_quota_exceeded_as_rabbitmq_s_mqtt_plugin_answers() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    app_user(&api, "dev").await;
    api.put("/api/user-limits/dev/max-connections", json!({"value": 1})).await;
    let (h, p) = broker.host_port();
    let mut o = v4::MqttOptions::new("d1", h.clone(), p);
    o.set_credentials("dev", "pw");
    let _d1 = v4::connect_with(o).await;
    let mut o = v4::MqttOptions::new("d2", h.clone(), p);
    o.set_credentials("dev", "pw");
    let e = v4::connect_refused(o).await;
    assert!(e.contains("NotAuthorized"), "3.1.1: return code 5, as RabbitMQ maps quota exceeded: {e}");
    let mut o = v5::MqttOptions::new("d3", h.clone(), p);
    o.set_credentials("dev", "pw");
    let e = v5::connect_refused(o).await;
    assert!(e.contains("QuotaExceeded"), "5.0: 0x97: {e}");
    // Anonymous clients count against the virtual host's limit only.
    api.put("/api/vhost-limits/%2f/max-connections", json!({"value": 2})).await;
    let _anon = v5::connect(&broker, "anon-1").await;
    let e = v5::connect_refused(v5::options(&broker, "anon-2")).await;
    assert!(e.contains("QuotaExceeded"), "{e}");
    let text = expect_code(connect_uri(&uri(&broker, "guest", "guest")).await, 530);
    assert!(text.contains("connection limit (2) is reached"), "MQTT connections count in '/': {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_past_a_user_limit_close_the_connection_with_530() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    app_user(&api, "app").await;
    api.put("/api/user-limits/app/max-channels", json!({"value": 2})).await;
    let a = connect_uri(&uri(&broker, "app", "pw")).await.unwrap();
    let b = connect_uri(&uri(&broker, "app", "pw")).await.unwrap();
    let a1 = open_channel(&a).await;
    let _b1 = open_channel(&b).await;
    // Over all of the user's connections.
    let text = expect_code(bounded("channel.open", b.create_channel()).await, 530);
    assert_eq!(
        text,
        "NOT_ALLOWED - number of channels opened for user 'app' has reached the maximum allowed user limit of 2"
    );
    // The refused connection's channel is given back with it, a closed channel too.
    bounded("close", a1.close(200, "bye".into())).await.unwrap();
    let _a2 = open_channel(&a).await;
    let c = admitted(&uri(&broker, "app", "pw")).await;
    let _c1 = open_channel(&c).await;
    expect_code(bounded("channel.open", c.create_channel()).await, 530);
    // Another user's channels are not counted.
    let guest = connect_uri(&uri(&broker, "guest", "guest")).await.unwrap();
    for _ in 0..3 {
        open_channel(&guest).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_past_a_vhost_limit_are_refused_with_406_over_amqp_and_http() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    app_user(&api, "app").await;
    api.put("/api/vhost-limits/%2f/max-queues", json!({"value": 3})).await;
    let conn = connect_uri(&uri(&broker, "app", "pw")).await.unwrap();
    let ch = open_channel(&conn).await;
    for q in ["q1", "q2", "q3"] {
        declare_queue(&ch, q, Default::default()).await;
    }
    declare_queue(&ch, "q1", Default::default()).await; // redeclaring is no new queue
    let r = ch.queue_declare("q4".into(), Default::default(), Default::default()).await;
    let text = expect_code(r, 406);
    assert_eq!(text, "PRECONDITION_FAILED - cannot declare queue 'q4': queue limit in vhost '/' (3) is reached");
    let (status, body) = api.put("/api/queues/%2f/h1", json!({"durable": true})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["reason"].as_str().unwrap().contains("queue limit in vhost '/' (3) is reached"), "{body}");
    // A deleted queue gives its place back.
    let ch = open_channel(&conn).await;
    delete_queue(&ch, "q2").await;
    assert_eq!(api.put("/api/queues/%2f/h1", json!({"durable": true})).await.0, StatusCode::CREATED);
    let r = ch.queue_declare("".into(), Default::default(), Default::default()).await;
    expect_code(r, 406);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_survive_a_restart_and_travel_in_definitions() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    app_user(&api, "app").await;
    api.put("/api/vhosts/tenant", json!({})).await;
    api.put("/api/vhost-limits/tenant/max-queues", json!({"value": 7})).await;
    api.put("/api/vhost-limits/%2f/max-queues", json!({"value": 1})).await;
    api.put("/api/user-limits/app/max-connections", json!({"value": 1})).await;
    let broker = broker.restart();
    let api = Api::of(&broker);
    assert_eq!(
        api.ok("/api/vhost-limits").await,
        json!([{"vhost": "/", "value": {"max-queues": 1}}, {"vhost": "tenant", "value": {"max-queues": 7}}])
    );
    assert_eq!(api.ok("/api/user-limits").await, json!([{"user": "app", "value": {"max-connections": 1}}]));
    let _app = connect_uri(&uri(&broker, "app", "pw")).await.unwrap();
    expect_code(connect_uri(&uri(&broker, "app", "pw")).await, 530);

    let defs = api.ok("/api/definitions").await;
    let vhost = |name: &str| defs["vhosts"].as_array().unwrap().iter().find(|v| v["name"] == name).cloned().unwrap();
    assert_eq!(vhost("tenant")["limits"], json!({"max-queues": 7}));
    let app = defs["users"].as_array().unwrap().iter().find(|u| u["name"] == "app").cloned().unwrap();
    assert_eq!(app["limits"], json!({"max-connections": 1}));
    let params: Vec<&Value> =
        defs["parameters"].as_array().unwrap().iter().filter(|p| p["component"] == "vhost-limits").collect();
    assert_eq!(params.len(), 2, "RabbitMQ's runtime parameters too: {defs}");

    // Into a fresh broker: applied, reported, enforced.
    let other = Broker::start();
    let other_api = Api::of(&other);
    let (status, report) = other_api.post("/api/definitions", defs.clone()).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["imported"]["vhost_limits"], json!(2), "{report}");
    assert_eq!(report["imported"]["user_limits"], json!(1), "{report}");
    assert!(report["unsupported"].as_array().unwrap().is_empty(), "{report}");
    assert_eq!(other_api.ok("/api/vhost-limits").await, api.ok("/api/vhost-limits").await);
    assert_eq!(other_api.ok("/api/user-limits").await, api.ok("/api/user-limits").await);
    let conn = connect_uri(&uri(&other, "app", "pw")).await.unwrap();
    let ch = open_channel(&conn).await;
    declare_queue(&ch, "only", Default::default()).await;
    expect_code(ch.queue_declare("second".into(), Default::default(), Default::default()).await, 406);

    // A bad limit in a definitions file changes nothing.
    let bad = json!({"vhosts": [{"name": "x", "limits": {"max-channels": 1}}]});
    let (status, body) = other_api.post("/api/definitions", bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(other_api.get("/api/vhosts/x").await.0, StatusCode::NOT_FOUND);
    // RabbitMQ's runtime-parameter form alone (a per-vhost export) is applied too.
    let per_vhost = json!({"parameters": [{"vhost": "tenant", "component": "vhost-limits", "name": "limits", "value": {"max-connections": 4}}]});
    assert_eq!(other_api.post("/api/definitions/tenant", per_vhost).await.0, StatusCode::OK);
    assert_eq!(
        other_api.ok("/api/vhost-limits/tenant").await,
        json!([{"vhost": "tenant", "value": {"max-connections": 4}}])
    );
}
