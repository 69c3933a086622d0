//! Virtual hosts, users, permissions and definitions over the management API, against the
//! real broker: what is made over HTTP is what AMQP clients log in with and connect to,
//! it survives restarts, deleting takes it away, and a RabbitMQ definitions file loads at
//! start (`--definitions`).

use crate::common;

use crate::common::amqp::*;
use crate::common::http::Api;
use crate::common::{Broker, Opts};
use reqwest::StatusCode;
use serde_json::{json, Value};

fn amqp_uri(broker: &Broker, user: &str, pass: &str, vhost: &str) -> String {
    format!("amqp://{user}:{pass}@{}/{}", broker.amqp.unwrap(), vhost.replace('/', "%2f"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_vhosts_and_permissions_made_over_http_are_used_and_survive_a_restart() {
    let broker = Broker::start_with(Opts::default().config("[auth]\nusers = [{ name = \"old\", password = \"o\" }]\n"));
    let api = Api::of(&broker);
    assert_eq!(api.put("/api/vhosts/staging", json!({"description": "pre-production"})).await.0, StatusCode::CREATED);
    assert_eq!(api.put("/api/vhosts/staging", json!({})).await.0, StatusCode::NO_CONTENT);
    assert_eq!(
        api.put("/api/users/ops", json!({"password": "pw", "tags": "monitoring,management"})).await.0,
        StatusCode::CREATED
    );
    let hash = ferrymq::access::auth::hash_password(ferrymq::access::auth::HashingAlgorithm::Sha512, "hashed-pw");
    let body = json!({"password_hash": hash, "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": []});
    assert_eq!(api.put("/api/users/svc", body).await.0, StatusCode::CREATED);
    let perm = json!({"configure": "^svc-.*", "write": ".*", "read": ".*"});
    assert_eq!(api.put("/api/permissions/staging/svc", perm).await.0, StatusCode::CREATED);
    let sha1 = json!({"password_hash": "x", "hashing_algorithm": "rabbit_password_hashing_sha1"});
    let (status, body) = api.put("/api/users/bad", sha1).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let not_a_hash = json!({"password_hash": "x", "hashing_algorithm": "rabbit_password_hashing_md5"});
    assert_eq!(api.put("/api/users/bad", not_a_hash).await.0, StatusCode::BAD_REQUEST);

    let ops = api.ok("/api/users/ops").await;
    assert_eq!(ops["tags"], json!(["monitoring", "management"]));
    assert!(ops["password_hash"].as_str().unwrap().len() > 40, "stored hashed, never in clear: {ops}");
    let (status, _) = api.as_user("ops", "pw").get("/api/nodes").await;
    assert_eq!(status, StatusCode::OK, "a monitoring user made at runtime logs in over HTTP");
    let conn = connect_uri(&amqp_uri(&broker, "svc", "hashed-pw", "staging")).await.expect("svc logs in to staging");
    let vhost = api.ok("/api/vhosts/staging").await;
    assert_eq!(vhost["description"], "pre-production");
    let perms = api.ok("/api/vhosts/staging/permissions").await;
    assert_eq!(
        perms,
        json!([{"user": "svc", "vhost": "staging", "configure": "^svc-.*", "write": ".*", "read": ".*"}])
    );
    drop(conn);

    // A configured user deleted over HTTP stays deleted; its open connection is closed,
    // as RabbitMQ closes a deleted user's connections.
    let old_conn = connect_uri(&amqp_uri(&broker, "old", "o", "/")).await.expect("old logs in");
    let mut ev = events(&old_conn);
    assert_eq!(api.delete("/api/users/old").await.0, StatusCode::NO_CONTENT);
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(code, 320, "{text}");
    assert!(text.contains("user deleted"), "{text}");
    assert_eq!(api.delete("/api/users/old").await.0, StatusCode::NOT_FOUND);
    assert!(connect_uri(&amqp_uri(&broker, "old", "o", "/")).await.is_err());

    let broker = broker.restart();
    let api = Api::of(&broker);
    let names: Vec<String> = api
        .ok("/api/users")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["guest", "ops", "svc"], "after the restart");
    assert!(connect_uri(&amqp_uri(&broker, "old", "o", "/")).await.is_err(), "still deleted");
    let conn = connect_uri(&amqp_uri(&broker, "svc", "hashed-pw", "staging")).await.expect("svc still logs in");
    let mut events = events(&conn);
    assert_eq!(api.ok("/api/vhosts/staging").await["description"], "pre-production");
    assert_eq!(api.ok("/api/permissions/staging/svc").await["configure"], "^svc-.*");

    // Deleting the vhost closes its connections and deletes what it held.
    let ch = open_channel(&conn).await;
    declare_queue(&ch, "staged", FieldTable::default()).await;
    assert_eq!(api.delete("/api/vhosts/staging").await.0, StatusCode::NO_CONTENT);
    let (code, text) = server_closed(&mut events).await;
    assert_eq!(code, 320, "{text}");
    let err = connect_uri(&amqp_uri(&broker, "svc", "hashed-pw", "staging")).await.expect_err("vhost gone");
    assert_eq!(amqp_error(&err).map(|e| e.0), Some(530), "{err:?}");
    assert_eq!(api.ok("/api/queues").await, json!([]));
    assert_eq!(api.delete("/api/vhosts/%2F").await.0, StatusCode::BAD_REQUEST, "MQTT's vhost stays");
    let broker = broker.restart();
    let api = Api::of(&broker);
    let vhosts: Vec<Value> =
        api.ok("/api/vhosts").await.as_array().unwrap().iter().map(|v| v["name"].clone()).collect();
    assert_eq!(vhosts, [json!("/")]);
}

/// A definitions file as `rabbitmqadmin export` writes it on RabbitMQ 3.10.
fn rabbitmq_definitions(password_hash: &str) -> Value {
    json!({
        "rabbit_version": "3.10.8",
        "users": [{"name": "app", "password_hash": password_hash, "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "management", "limits": {}}],
        "vhosts": [{"name": "/"}, {"name": "shop"}],
        "permissions": [{"user": "app", "vhost": "shop", "configure": ".*", "write": ".*", "read": ".*"}],
        "topic_permissions": [{"user": "app", "vhost": "shop", "exchange": "amq.topic", "write": ".*", "read": ".*"}],
        "parameters": [{"value": {"src-uri": "amqp://"}, "vhost": "shop", "component": "shovel", "name": "s1"}],
        "global_parameters": [{"name": "cluster_name", "value": "rabbit@old"}],
        "policies": [{"vhost": "shop", "name": "ha", "pattern": ".*", "apply-to": "queues", "definition": {"ha-mode": "all"}, "priority": 0}],
        "queues": [
            {"name": "orders", "vhost": "shop", "durable": true, "auto_delete": false, "arguments": {"x-max-length": 100}},
            {"name": "audit", "vhost": "shop", "durable": true, "auto_delete": false, "arguments": {}}
        ],
        "exchanges": [
            {"name": "shop.events", "vhost": "shop", "type": "topic", "durable": true, "auto_delete": false, "internal": false, "arguments": {}},
            {"name": "shop.audit", "vhost": "shop", "type": "fanout", "durable": true, "auto_delete": false, "internal": false, "arguments": {}}
        ],
        "bindings": [
            {"source": "shop.events", "vhost": "shop", "destination": "orders", "destination_type": "queue", "routing_key": "order.*", "arguments": {}},
            {"source": "shop.events", "vhost": "shop", "destination": "shop.audit", "destination_type": "exchange", "routing_key": "#", "arguments": {}},
            {"source": "shop.audit", "vhost": "shop", "destination": "audit", "destination_type": "queue", "routing_key": "", "arguments": {}}
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_definitions_import_report_what_is_not_applied_and_export_again() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let hash = ferrymq::access::auth::hash_password(ferrymq::access::auth::HashingAlgorithm::Sha256, "shop-pw");
    let defs = rabbitmq_definitions(&hash);
    let (status, report) = api.post("/api/definitions", defs.clone()).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        report["imported"],
        json!({"vhosts": 2, "users": 1, "permissions": 1, "topic_permissions": 1, "global_parameters": 1, "exchanges": 2, "queues": 2, "bindings": 3})
    );
    let kinds: Vec<&str> =
        report["unsupported"].as_array().unwrap().iter().map(|u| u["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["policies", "parameters"], "{report}");

    // Routed as RabbitMQ would: order.* to orders, everything via shop.audit to audit.
    let conn = connect_uri(&amqp_uri(&broker, "app", "shop-pw", "shop")).await.expect("the imported user logs in");
    let ch = open_channel(&conn).await;
    confirm_select(&ch).await;
    publish_confirmed(&ch, "shop.events", "order.created", b"o1", persistent()).await;
    assert_eq!(drain(&ch, "orders").await, ["o1"]);
    assert_eq!(drain(&ch, "audit").await, ["o1"]);

    let exported = api.ok("/api/definitions").await;
    for key in [
        "rabbit_version",
        "users",
        "vhosts",
        "permissions",
        "topic_permissions",
        "parameters",
        "global_parameters",
        "policies",
        "queues",
        "exchanges",
        "bindings",
    ] {
        assert!(exported.get(key).is_some(), "export has {key}");
    }
    let app = exported["users"].as_array().unwrap().iter().find(|u| u["name"] == "app").unwrap().clone();
    assert_eq!(app["password_hash"], hash.as_str());
    assert_eq!(app["tags"], json!(["management"]));
    let shop = api.ok("/api/definitions/shop").await;
    assert!(shop.get("users").is_none(), "a vhost's definitions hold no users");
    assert_eq!(shop["queues"].as_array().unwrap().len(), 2);
    assert_eq!(shop["bindings"].as_array().unwrap().len(), 3);

    // The export imports into a fresh broker and exports the same again.
    let other = Broker::start();
    let other_api = Api::of(&other);
    let (status, report) = other_api.post("/api/definitions", exported.clone()).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    let again = other_api.ok("/api/definitions").await;
    for key in ["vhosts", "permissions", "topic_permissions", "queues", "exchanges", "bindings"] {
        assert_eq!(again[key], exported[key], "{key} round-trips");
    }

    // An item that cannot be applied is a 400 naming it.
    let mut bad = json!({"queues": [{"name": "orders", "vhost": "shop", "durable": false, "arguments": {}}]});
    let (status, body) = api.post("/api/definitions", bad.take()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["reason"].as_str().unwrap().contains("inequivalent arg 'durable'"), "{body}");
}

/// A RabbitMQ 3.13 export holds global parameters, and files written by hand or by other
/// tools hold sections and keys FerryMQ does not read: what it supports is applied
/// (`cluster_name`, kept across restarts and exported again), everything else is named in
/// the answer, and at start in the log (issue 30: `global_parameters` were dropped silently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_parameters_are_applied_and_whatever_is_not_is_reported_never_dropped_silently() {
    let defs = json!({
        "rabbit_version": "3.13.7",
        "rabbitmq_version": "3.13.7",
        "global_parameters": [
            {"name": "cluster_name", "value": "rabbit@shop-prod"},
            {"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-Hq1hR3MNc0hHQ9dHYtk5qQ"},
            {"name": "mqtt_port_to_vhost_mapping", "value": {"1883": "shop"}}
        ],
        "vhosts": [{"name": "shop", "metadata": {"description": "", "tags": [], "default_queue_type": "quorum"}}],
        "federation_upstreams": [{"name": "dc2", "uri": "amqp://dc2"}],
        "queues": [
            {"name": "ledger", "vhost": "shop", "durable": true, "auto_delete": false, "arguments": {}, "type": "stream"},
            {"name": "jobs", "vhost": "shop", "durable": true, "auto_delete": false, "arguments": {}, "node": "rabbit@a"},
            {"name": "mail", "vhost": "shop", "durable": true, "auto_delete": false, "arguments": {}, "node": "rabbit@b"}
        ]
    });
    let broker = Broker::start();
    let api = Api::of(&broker);
    let (status, report) = api.post("/api/definitions", defs.clone()).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["imported"], json!({"vhosts": 1, "global_parameters": 1, "queues": 3}), "{report}");
    let named: Vec<(String, String)> = report["unsupported"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["kind"].as_str().unwrap().to_owned(), u["name"].as_str().unwrap_or_default().to_owned()))
        .collect();
    for want in [
        ("section", "federation_upstreams"),
        ("key", "queues[].node"),
        ("vhosts", "shop"),
        ("global_parameters", "internal_cluster_id"),
        ("global_parameters", "mqtt_port_to_vhost_mapping"),
    ] {
        assert!(named.contains(&(want.0.to_owned(), want.1.to_owned())), "{want:?} reported: {report}");
    }
    assert_eq!(named.len(), 5, "{report}");
    let node_key = report["unsupported"].as_array().unwrap().iter().find(|u| u["kind"] == "key").unwrap();
    assert_eq!(node_key["items"], 2, "one entry per key, with how many items had it: {node_key}");

    assert_eq!(api.ok("/api/overview").await["cluster_name"], "rabbit@shop-prod");
    assert_eq!(api.ok("/api/cluster-name").await, json!({"name": "rabbit@shop-prod"}));
    assert_eq!(api.ok("/api/queues/shop/ledger").await["type"], "stream", "the queue type beside the arguments");
    let exported = api.ok("/api/definitions").await;
    assert_eq!(exported["global_parameters"], json!([{"name": "cluster_name", "value": "rabbit@shop-prod"}]));

    // A virtual host's import takes that vhost's items only, and says so.
    let (status, report) = api.post("/api/definitions/shop", json!({"users": [{"name": "x", "password": "y"}]})).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["unsupported"][0]["kind"], "section", "{report}");
    assert_eq!(report["unsupported"][0]["name"], "users", "{report}");
    assert_eq!(api.get("/api/users/x").await.0, StatusCode::NOT_FOUND);
    let (status, _) = api.put("/api/cluster-name", json!({"name": ""})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let broker = broker.restart();
    assert_eq!(Api::of(&broker).ok("/api/overview").await["cluster_name"], "rabbit@shop-prod", "kept");

    // At start (`--definitions`), the same is logged.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("definitions.json");
    std::fs::write(&file, defs.to_string()).unwrap();
    let at_start = Broker::start_with(Opts::default().args(&["--definitions", file.to_str().unwrap()]));
    assert!(at_start.wait_log("definitions imported"), "{}", at_start.log());
    let log = at_start.log();
    for name in ["internal_cluster_id", "mqtt_port_to_vhost_mapping", "federation_upstreams", "queues[].node"] {
        assert!(log.lines().any(|l| l.contains("definition not applied") && l.contains(name)), "{name} logged:\n{log}");
    }
    assert_eq!(Api::of(&at_start).ok("/api/overview").await["cluster_name"], "rabbit@shop-prod");
}

/// `count` durable queues named `{prefix}{i}` in vhost `/`, as definitions.
fn many_queues(prefix: &str, count: usize) -> Value {
    let queues: Vec<Value> = (0..count)
        .map(|i| json!({"name": format!("{prefix}{i:06}"), "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}))
        .collect();
    json!({ "queues": queues })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_definitions_import_is_read_up_to_max_body_size() {
    // About 3 MB: over axum's 2 MB default, well under RabbitMQ's 20 MiB.
    let broker = Broker::start();
    let api = Api::of(&broker);
    let defs = many_queues(&"a-queue-name-of-two-hundred-bytes-".repeat(6), 10_000);
    assert!(defs.to_string().len() > 2_500_000);
    let (status, report) = api.post("/api/definitions", defs).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["imported"]["queues"], 10_000);
    let page = api.ok("/api/queues?page=1&page_size=1").await;
    assert_eq!(page["total_count"], 10_000);

    // Over the configured limit: 413, and nothing of it applied.
    let small = Broker::start_with(Opts::default().config("[http]\nmax_body_size = 100000\n"));
    let small_api = Api::of(&small);
    let (status, _) = small_api.post("/api/definitions", many_queues("q", 2_000)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(small_api.ok("/api/queues?page=1&page_size=1").await["total_count"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definitions_file_loads_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("definitions.json");
    let hash = ferrymq::access::auth::hash_password(ferrymq::access::auth::HashingAlgorithm::Sha256, "shop-pw");
    std::fs::write(&file, rabbitmq_definitions(&hash).to_string()).unwrap();
    let broker = Broker::start_with(Opts::default().args(&["--definitions", file.to_str().unwrap()]));
    common::eventually("the unsupported items are logged", WAIT, || async {
        broker.log().contains("definition not applied").then_some(())
    })
    .await;
    let conn = connect_uri(&amqp_uri(&broker, "app", "shop-pw", "shop")).await.expect("imported at start");
    let ch = open_channel(&conn).await;
    assert_eq!(queue_counts(&ch, "orders").await.unwrap().0, 0);
    drop((ch, conn));
    // Every start imports it again; what exists and is equivalent is kept.
    let broker = broker.restart();
    assert!(queue_exists(&connect_uri(&amqp_uri(&broker, "app", "shop-pw", "shop")).await.unwrap(), "orders").await);

    std::fs::write(&file, "{ not json").unwrap();
    let data = tempfile::tempdir().unwrap();
    let (code, err) = common::run_binary(
        &[
            "--data-dir",
            data.path().to_str().unwrap(),
            "--mqtt-listen",
            "127.0.0.1:0",
            "--mqtt-ws-listen",
            "127.0.0.1:0",
            "--amqp-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--definitions",
            file.to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("is not JSON"), "{err}");
}
