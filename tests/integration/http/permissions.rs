//! The management API keeps the access model, as RabbitMQ's management plugin does: a
//! `management` user limited to one virtual host deletes, purges, binds, lists and resets
//! only what its permissions reach there (the checks AMQP makes, the same function for
//! bindings), a `monitoring` user reads no message body it could not receive as a client,
//! and shovel URIs are shown without their passwords. Real broker, reqwest, lapin, rumqttc.

use crate::common;

use crate::common::amqp::*;
use crate::common::http::Api;
use crate::common::{v4, Broker, Opts, WAIT};
use lapin::options::QueueBindOptions;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Vhosts `/`, `a` and `b`; `mgr` (management) may open `/` (everything) and `a` (only
/// `mine*`), not `b`; `mon` (monitoring) may only read in `/`; both are denied the MQTT
/// topics `x/#`; `mgr` may bind exchange `feed` only with keys `ok.*`.
const POLICY: &str = r#"
[auth]
authorization = true
vhosts = ["/", "a", "b"]
users = [
  { name = "mgr", password = "pw", tags = ["management"] },
  { name = "mon", password = "pw", tags = ["monitoring"] },
]
permissions = [
  { vhost = "/", user = "mgr", configure = ".*", write = ".*", read = ".*" },
  { vhost = "a", user = "mgr", configure = "^mine", write = "^mine", read = "^mine" },
  { vhost = "/", user = "mon", configure = "", write = "", read = ".*" },
]
topic_permissions = [{ vhost = "/", user = "mgr", exchange = "feed", write = ".*", read = "^ok\\." }]
rules = [
  { permission = "deny", action = "all", user = "mgr", topics = ["x/#"] },
  { permission = "deny", action = "all", user = "mon", topics = ["x/#"] },
]
"#;

fn broker() -> Broker {
    Broker::start_with(Opts::default().config(POLICY))
}

fn amqp_uri(broker: &Broker, user: &str, pass: &str, vhost: &str) -> String {
    format!("amqp://{user}:{pass}@{}/{}", broker.amqp.unwrap(), vhost.replace('/', "%2f"))
}

/// Asserts RabbitMQ's refusal of a logged-in user: 401 `not_authorised` with `reason`.
fn refused(answer: (StatusCode, Value), reason: &str, what: &str) {
    let (status, body) = answer;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
    assert_eq!(body["error"], "not_authorised", "{what}: {body}");
    assert_eq!(body["reason"], reason, "{what}: {body}");
}

const NO_VHOST: &str = "User not authorised to access virtual host";

/// Declares `queue` in `vhost` as the administrator and puts one message in it.
async fn queue_with_a_message(admin: &Api, vhost: &str, queue: &str) {
    let (status, body) = admin.put(&format!("/api/queues/{vhost}/{queue}"), json!({"durable": true})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let msg = json!({"routing_key": queue, "payload": "kept", "payload_encoding": "string",
                     "properties": {"delivery_mode": 2}});
    let (status, body) = admin.post(&format!("/api/exchanges/{vhost}/amq.default/publish"), msg).await;
    assert_eq!((status, &body["routed"]), (StatusCode::OK, &json!(true)), "{body}");
    holds(admin, vhost, queue, 1).await;
}

/// Waits until `queue` of `vhost` holds `n` messages, as the administrator sees it.
async fn holds(admin: &Api, vhost: &str, queue: &str, n: u64) {
    let path = format!("/api/queues/{vhost}/{queue}");
    common::eventually(&format!("{path} holds {n}"), WAIT, || async {
        (admin.ok(&path).await["messages"].as_u64() == Some(n)).then_some(())
    })
    .await;
}

fn names(rows: &Value, key: &str) -> Vec<String> {
    rows.as_array().unwrap().iter().map(|r| r[key].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_management_user_deletes_and_purges_only_what_its_permissions_reach() {
    let broker = broker();
    let admin = Api::of(&broker);
    let mgr = admin.as_user("mgr", "pw");
    // In a vhost it may not open: nothing, whatever the call.
    queue_with_a_message(&admin, "b", "victim").await;
    assert_eq!(admin.put("/api/exchanges/b/victim-x", json!({"type": "fanout"})).await.0, StatusCode::CREATED);
    let (status, body) = admin.post("/api/bindings/b/e/victim-x/q/victim", json!({"routing_key": "k"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    refused(mgr.delete("/api/queues/b/victim").await, NO_VHOST, "delete a queue of b");
    refused(mgr.delete("/api/queues/b/victim/contents").await, NO_VHOST, "purge a queue of b");
    refused(mgr.delete("/api/exchanges/b/victim-x").await, NO_VHOST, "delete an exchange of b");
    refused(mgr.delete("/api/bindings/b/e/victim-x/q/victim/k").await, NO_VHOST, "delete a binding of b");
    refused(mgr.get("/api/queues/b/victim").await, NO_VHOST, "show a queue of b");
    holds(&admin, "b", "victim", 1).await;
    assert_eq!(admin.get("/api/exchanges/b/victim-x").await.0, StatusCode::OK);
    assert_eq!(admin.ok("/api/bindings/b/e/victim-x/q/victim").await.as_array().unwrap().len(), 1);

    // In its own vhost: delete needs configure, purge read, as RabbitMQ.
    queue_with_a_message(&admin, "a", "theirs").await;
    assert_eq!(admin.put("/api/exchanges/a/theirs-x", json!({"type": "fanout"})).await.0, StatusCode::CREATED);
    refused(
        mgr.delete("/api/queues/a/theirs").await,
        "configure access to queue 'theirs' in vhost 'a' refused for user 'mgr'",
        "delete without configure",
    );
    refused(
        mgr.delete("/api/queues/a/theirs/contents").await,
        "read access to queue 'theirs' in vhost 'a' refused for user 'mgr'",
        "purge without read",
    );
    refused(
        mgr.delete("/api/exchanges/a/theirs-x").await,
        "configure access to exchange 'theirs-x' in vhost 'a' refused for user 'mgr'",
        "delete an exchange without configure",
    );
    holds(&admin, "a", "theirs", 1).await;
    assert_eq!(admin.get("/api/exchanges/a/theirs-x").await.0, StatusCode::OK);

    queue_with_a_message(&admin, "a", "mine.q").await;
    assert_eq!(mgr.delete("/api/queues/a/mine.q/contents").await.0, StatusCode::NO_CONTENT);
    holds(&admin, "a", "mine.q", 0).await;
    assert_eq!(mgr.delete("/api/queues/a/mine.q").await.0, StatusCode::NO_CONTENT);
    assert_eq!(admin.get("/api/queues/a/mine.q").await.0, StatusCode::NOT_FOUND);
    assert_eq!(mgr.delete("/api/queues/nowhere/q").await.0, StatusCode::NOT_FOUND, "an unknown vhost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_over_http_is_refused_as_the_same_queue_bind_over_amqp() {
    let broker = broker();
    let admin = Api::of(&broker);
    let mgr = admin.as_user("mgr", "pw");
    assert_eq!(mgr.put("/api/queues/%2f/spy", json!({"durable": false})).await.0, StatusCode::CREATED);
    // The MQTT rules deny mgr x/#: a binding from the MQTT exchange with x.# would read it.
    let denied = "read access to topic 'x.#' in exchange 'amq.topic' in vhost '/' refused for user 'mgr'";
    refused(mgr.post("/api/bindings/%2f/e/amq.topic/q/spy", json!({"routing_key": "x.#"})).await, denied, "to a queue");
    let conn = connect_uri(&amqp_uri(&broker, "mgr", "pw", "/")).await.expect("mgr opens /");
    let ch = open_channel(&conn).await;
    let bound =
        ch.queue_bind("spy".into(), "amq.topic".into(), "x.#".into(), QueueBindOptions::default(), Default::default());
    let text = expect_code(bounded("queue.bind", bound).await, 403);
    assert!(text.ends_with(&format!("ACCESS_REFUSED - {denied}")), "the same check over AMQP: {text}");
    // Exchange to exchange: the same.
    assert_eq!(mgr.put("/api/exchanges/%2f/relay", json!({"type": "topic"})).await.0, StatusCode::CREATED);
    refused(
        mgr.post("/api/bindings/%2f/e/amq.topic/e/relay", json!({"routing_key": "x.#"})).await,
        denied,
        "to an exchange",
    );
    let spy = admin.ok("/api/queues/%2f/spy/bindings").await;
    assert_eq!(names(&spy, "source"), [""], "only the default exchange's binding: {spy}");
    assert_eq!(admin.ok("/api/bindings/%2f/e/amq.topic/e/relay").await, json!([]));

    // RabbitMQ's topic permissions: mgr may bind feed with ok.* only.
    assert_eq!(admin.put("/api/exchanges/%2f/feed", json!({"type": "topic"})).await.0, StatusCode::CREATED);
    refused(
        mgr.post("/api/bindings/%2f/e/feed/q/spy", json!({"routing_key": "no.#"})).await,
        "read access to topic 'no.#' in exchange 'feed' in vhost '/' refused for user 'mgr'",
        "a topic permission",
    );
    let (status, body) = mgr.post("/api/bindings/%2f/e/feed/q/spy", json!({"routing_key": "ok.#"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(mgr.delete("/api/bindings/%2f/e/feed/q/spy/ok.%2523").await.0, StatusCode::NO_CONTENT);
    assert_eq!(admin.ok("/api/bindings/%2f/e/feed/q/spy").await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_management_user_sees_only_the_vhosts_it_may_open() {
    let broker = broker();
    let admin = Api::of(&broker);
    let (mgr, mon) = (admin.as_user("mgr", "pw"), admin.as_user("mon", "pw"));
    for vhost in ["a", "b"] {
        let (status, _) = admin.put(&format!("/api/queues/{vhost}/q-{vhost}"), json!({"durable": false})).await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, _) = admin.put(&format!("/api/exchanges/{vhost}/x-{vhost}"), json!({"type": "fanout"})).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    assert_eq!(names(&mgr.ok("/api/vhosts").await, "name"), ["/", "a"]);
    let vhosts_of = |rows: &Value| {
        let mut v = names(rows, "vhost");
        v.dedup();
        v
    };
    assert_eq!(vhosts_of(&mgr.ok("/api/queues").await), ["a"]);
    assert_eq!(vhosts_of(&mgr.ok("/api/exchanges").await), ["/", "a"]);
    assert_eq!(vhosts_of(&mgr.ok("/api/bindings").await), ["a"], "the default exchange's binding of q-a");
    for path in ["/api/vhosts/b", "/api/queues/b", "/api/exchanges/b", "/api/bindings/b", "/api/exchanges/b/x-b"] {
        refused(mgr.get(path).await, NO_VHOST, path);
    }
    let overview = mgr.ok("/api/overview").await;
    assert_eq!(overview["object_totals"]["queues"], 1, "q-a only: {overview}");
    // A monitoring user sees every vhost exist, and lists what it may open (RabbitMQ's
    // list_visible_vhosts and filter_vhost); an administrator everything.
    assert_eq!(names(&mon.ok("/api/vhosts").await, "name"), ["/", "a", "b"]);
    assert_eq!(mon.ok("/api/queues").await, json!([]));
    assert_eq!(vhosts_of(&admin.ok("/api/queues").await), ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_group_reset_needs_read_on_the_stream() {
    let broker = broker();
    let admin = Api::of(&broker);
    let mgr = admin.as_user("mgr", "pw");
    for (vhost, stream) in [("a", "events"), ("a", "mine.events"), ("b", "events")] {
        let conn = connect_uri(&amqp_uri(&broker, "guest", "guest", vhost)).await.unwrap();
        declare_stream(&open_channel(&conn).await, stream, &[]).await;
    }
    let reset = |vhost: &str, stream: &str| format!("/api/ferrymq/streams/{vhost}/{stream}/groups/billing/reset");
    refused(
        mgr.post(&reset("a", "events"), json!({"to": "first"})).await,
        "read access to queue 'events' in vhost 'a' refused for user 'mgr'",
        "no read on the stream",
    );
    refused(mgr.post(&reset("b", "events"), json!({"to": "first"})).await, NO_VHOST, "a vhost it may not open");
    let groups = admin.ok("/api/ferrymq/streams/a/events/groups").await;
    assert_eq!(groups["groups"], json!([]), "no group was made: {groups}");
    let (status, body) = mgr.post(&reset("a", "mine.events"), json!({"to": "first"})).await;
    assert_eq!(status, StatusCode::OK, "read on its own stream: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitoring_user_reads_no_message_body_it_could_not_receive() {
    let broker = broker();
    let admin = Api::of(&broker);
    let mon = admin.as_user("mon", "pw");
    let mut o = v4::options(&broker, "publisher");
    o.set_credentials("guest", "guest");
    let mut publisher = v4::connect_with(o).await;
    publisher.publish_acked("x/secret", v4::QoS::AtLeastOnce, true, "classified").await;
    publisher.publish_acked("y/public", v4::QoS::AtLeastOnce, true, "hello").await;
    let topics = |rows: Value| names(&rows, "topic");
    assert_eq!(topics(admin.ok("/api/ferrymq/mqtt/retained").await), ["x/secret", "y/public"]);
    assert_eq!(topics(mon.ok("/api/ferrymq/mqtt/retained").await), ["y/public"], "the MQTT rules deny mon x/#");

    // A message of vhost b, where mon has no permissions, found by its key.
    let conn = connect_uri(&amqp_uri(&broker, "guest", "guest", "b")).await.unwrap();
    let ch = open_channel(&conn).await;
    declare_queue(&ch, "orders", Default::default()).await;
    confirm_select(&ch).await;
    publish_confirmed(&ch, "", "orders", b"card 4111", persistent().with_message_id("order-17".into())).await;
    let found = admin.ok("/api/ferrymq/messages?key=order-17").await;
    assert_eq!(found[0]["payload"], "card 4111", "{found}");
    assert_eq!(mon.ok("/api/ferrymq/messages?key=order-17").await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shovel_uris_are_shown_without_their_passwords() {
    let broker = broker();
    let admin = Api::of(&broker);
    let (mgr, mon) = (admin.as_user("mgr", "pw"), admin.as_user("mon", "pw"));
    let dest = "amqp://remote:s3cret@127.0.0.1:1/%2F";
    let def = json!({"value": {
        "src-uri": "amqp://", "src-queue": "outbox", "dest-uri": dest, "dest-queue": "inbox", "reconnect-delay": 60,
    }});
    let (status, body) = admin.put("/api/parameters/shovel/%2F/out", def).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for (who, api) in [("monitoring", &mon), ("administrator", &admin)] {
        let status = api.ok("/api/shovels").await;
        assert_eq!(status[0]["dest_uri"], "amqp://remote:***@127.0.0.1:1/%2F", "{who}: {status}");
        assert!(!status.to_string().contains("s3cret"), "{who}: {status}");
    }
    // Runtime parameters are policymakers' (RabbitMQ); an administrator's export keeps the
    // password, so that the definitions import again.
    let (status, body) = mgr.get("/api/parameters/shovel").await;
    assert_eq!((status, body["reason"].as_str()), (StatusCode::FORBIDDEN, Some("Not policymaker user")), "{body}");
    assert_eq!(admin.ok("/api/parameters/shovel/%2F/out").await["value"]["dest-uri"], dest);
    assert_eq!(admin.ok("/api/definitions").await["parameters"][0]["value"]["dest-uri"], dest);
}
