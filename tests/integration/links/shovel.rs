//! AMQP shovels, as a RabbitMQ operator defines and watches them: the runtime parameter
//! `/api/parameters/shovel/{vhost}/{name}` (kept across restarts, in the definitions
//! export), `[[shovel]]` tables, the status at `/api/shovels`; messages move in order and
//! none is lost when the destination broker goes away mid-stream or FerryMQ is killed. A
//! side on FerryMQ itself (`amqp://` without a host) is an in-process `direct` connection,
//! checked as any client: it needs no AMQP listener and no password.

use crate::common;

use crate::common::amqp::*;
use crate::common::http::Api;
use crate::common::{eventually, free_port, v4, Broker, Opts, WAIT};
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use serde_json::{json, Value};

/// A broker whose AMQP listener is on `port`, so that it comes back there.
fn broker_on(port: u16) -> Broker {
    Broker::start_with(Opts::default().args(&["--amqp-listen", &format!("127.0.0.1:{port}")]))
}

fn uri_of(broker: &Broker) -> String {
    format!("amqp://guest:guest@{}/%2F", amqp_addr(broker))
}

async fn channel_of(broker: &Broker) -> (lapin::Connection, lapin::Channel) {
    let c = connect_uri(&uri_of(broker)).await.unwrap();
    let ch = open_channel(&c).await;
    (c, ch)
}

async fn running(api: &Api, name: &str) {
    eventually(&format!("shovel {name} running"), WAIT, || async {
        let all = api.ok("/api/shovels").await;
        all.as_array()?.iter().any(|s| s["name"] == name && s["state"] == "running").then_some(())
    })
    .await;
}

/// Publishes persistent messages `range` to `queue` with confirms.
async fn publish_range(broker: &Broker, queue: &str, range: std::ops::Range<u32>) {
    let (_c, ch) = channel_of(broker).await;
    confirm_select(&ch).await;
    for i in range {
        publish_confirmed(&ch, "", queue, format!("m{i}").as_bytes(), persistent()).await;
    }
}

/// Consumes until every message of `want` arrived (at least once); returns their first
/// arrivals in order. Second copies of earlier messages (a shovel is at least once: one
/// whose source ack a crash took is moved again) are consumed and left out.
async fn consume_until(broker: &Broker, queue: &str, want: std::ops::Range<u32>) -> Vec<u32> {
    let (_c, ch) = channel_of(broker).await;
    let mut consumer = consume(&ch, queue, BasicConsumeOptions::default(), FieldTable::default()).await;
    let mut seen = std::collections::BTreeSet::new();
    let mut order = Vec::new();
    while !want.clone().all(|i| seen.contains(&i)) {
        let d = match tokio::time::timeout(WAIT, futures_util::StreamExt::next(&mut consumer)).await {
            Ok(Some(Ok(d))) => d,
            other => {
                // Say what is missing and where the queue stands, so that a failure tells a
                // message lost from one still on its way.
                let missing: Vec<u32> = want.clone().filter(|i| !seen.contains(i)).collect();
                let (_, q) = Api::of(broker).get(&format!("/api/queues/%2F/{queue}")).await;
                panic!(
                    "no delivery from {queue} within {WAIT:?} ({other:?}); missing {} of {want:?}: {missing:?}; \
                     the queue: messages {} ready {} unacked {} consumers {}",
                    missing.len(),
                    q["messages"],
                    q["messages_ready"],
                    q["messages_unacknowledged"],
                    q["consumers"]
                );
            }
        };
        let i: u32 = std::str::from_utf8(&d.data).unwrap()[1..].parse().unwrap();
        if want.contains(&i) && seen.insert(i) {
            order.push(i);
        }
        ch.basic_ack(d.delivery_tag, BasicAckOptions::default()).await.unwrap();
    }
    order
}

fn in_order(v: &[u32]) -> bool {
    v.windows(2).all(|w| w[0] < w[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamic_shovel_moves_a_queue_in_order_through_outages_and_restarts() {
    let port = free_port();
    let mut dest = broker_on(port);
    let source = Broker::start();
    let api = Api::of(&source);
    let def = json!({ "value": {
        "src-uri": "amqp://", "src-queue": "outbox",
        "dest-uri": format!("amqp://guest:guest@127.0.0.1:{port}/%2F"), "dest-queue": "inbox",
        "reconnect-delay": 0.2,
    }});
    let (code, body) = api.put("/api/parameters/shovel/%2F/move", def.clone()).await;
    assert_eq!(code.as_u16(), 201, "{body}");
    running(&api, "move").await;
    // Both queues were declared durable by the shovel.
    let q = api.ok("/api/queues/%2F/outbox").await;
    assert_eq!(q["durable"], true, "{q}");

    publish_range(&source, "outbox", 0..50).await;
    assert_eq!(consume_until(&dest, "inbox", 0..50).await, (0..50).collect::<Vec<_>>());

    // The destination goes away while nothing moves: the state says so at once, not at
    // the next message.
    dest.stop();
    eventually("the shovel down with a reason", WAIT, || async {
        let s = api.ok("/api/shovels").await;
        (s[0]["state"] != "running" && s[0]["reason"].is_string()).then_some(())
    })
    .await;
    let mut dest = dest.start_again();
    running(&api, "move").await;

    // The destination goes away mid-stream: messages wait in the source queue.
    let feeder = {
        let uri = uri_of(&source);
        tokio::spawn(async move {
            let c = connect_uri(&uri).await.unwrap();
            let ch = open_channel(&c).await;
            confirm_select(&ch).await;
            for i in 50..250u32 {
                publish_confirmed(&ch, "", "outbox", format!("m{i}").as_bytes(), persistent()).await;
            }
        })
    };
    eventually("some of the stream moved", WAIT, || async {
        let s = api.ok("/api/shovels").await;
        (s[0]["messages_moved"].as_u64() >= Some(100)).then_some(())
    })
    .await;
    dest.stop();
    tokio::time::timeout(WAIT * 3, feeder).await.expect("publishes confirmed by the source").unwrap();
    let dest = dest.start_again();
    let order = consume_until(&dest, "inbox", 50..250).await;
    assert!(in_order(&order), "order kept: {order:?}");

    // FerryMQ (the source) is killed: the shovel was kept and comes back with it.
    let source = source.crash_restart();
    let api = Api::of(&source);
    running(&api, "move").await;
    publish_range(&source, "outbox", 250..260).await;
    assert_eq!(consume_until(&dest, "inbox", 250..260).await, (250..260).collect::<Vec<_>>());

    // It is in the definitions export, as RabbitMQ writes parameters; another broker
    // imports it and runs it too.
    let defs = api.ok("/api/definitions").await;
    let p = &defs["parameters"][0];
    assert_eq!(
        (p["component"].as_str(), p["name"].as_str(), p["vhost"].as_str()),
        (Some("shovel"), Some("move"), Some("/"))
    );
    assert_eq!(p["value"]["src-queue"], "outbox", "{p}");
    let listed = api.ok("/api/parameters/shovel/%2F/move").await;
    assert_eq!(listed["value"]["dest-queue"], "inbox", "{listed}");

    let (code, _) = api.delete("/api/parameters/shovel/%2F/move").await;
    assert_eq!(code.as_u16(), 204);
    assert_eq!(api.ok("/api/shovels").await, json!([]));
    let (code, _) = api.delete("/api/parameters/shovel/%2F/move").await;
    assert_eq!(code.as_u16(), 404);

    let other = Broker::start();
    let (code, body) = Api::of(&other).post("/api/definitions", defs).await;
    assert!(code.is_success(), "{body}");
    running(&Api::of(&other), "move").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shovel_from_the_configuration_carries_an_exchange_across_protocols() {
    let dest = Broker::start();
    let (h, p) = (amqp_addr(&dest).ip(), amqp_addr(&dest).port());
    let source = Broker::start_with(Opts::default().config(&format!(
        "[[shovel]]\nname = \"telemetry\"\nsrc-uri = \"amqp://\"\nsrc-exchange = \"amq.topic\"\n\
         src-exchange-key = \"sensors.#\"\ndest-uri = \"amqp://guest:guest@{h}:{p}/%2F\"\n\
         dest-exchange = \"amq.topic\"\nack-mode = \"on-publish\"\nreconnect-delay = 0.2\n"
    )));
    let api = Api::of(&source);
    running(&api, "telemetry").await;
    assert_eq!(api.ok("/api/shovels").await[0]["type"], "static");
    let metrics = reqwest::get(format!("{}/metrics", api.base)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ferrymq_shovel_up{vhost=\"/\",shovel=\"telemetry\"} 1"), "{metrics}");
    // `ferrymq ctl list shovels`, for people.
    let out = std::process::Command::new(common::binary())
        .args(["ctl", "--url", &format!("http://{}", source.http.unwrap()), "list", "shovels"])
        .output()
        .expect("run ferrymq ctl");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row[..4], ["/", "telemetry", "static", "running"], "{table}");
    assert_eq!(api.ok("/api/parameters/shovel").await, json!([]), "a static shovel is no parameter");
    // Nor can a dynamic one take its name.
    let value = json!({ "value": { "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b" }});
    let (code, body) = api.put("/api/parameters/shovel/%2F/telemetry", value).await;
    assert_eq!(code.as_u16(), 400, "{body}");
    assert!(body["reason"].as_str().unwrap_or_default().contains("defined in the configuration"), "{body}");
    assert_eq!(api.ok("/api/shovels").await[0]["type"], "static", "still the configuration's");

    // An MQTT publish at the source reaches an MQTT subscriber at the destination.
    let mut sub = v4::connect(&dest, "dashboard").await;
    sub.subscribe("sensors/#", v4::QoS::AtLeastOnce).await;
    let mut sensor = v4::connect(&source, "sensor").await;
    sensor.publish_acked("sensors/7/temp", v4::QoS::AtLeastOnce, false, "19.5").await;
    let m = sub.next_publish().await;
    assert_eq!((m.topic.as_str(), &m.payload[..]), ("sensors/7/temp", &b"19.5"[..]));
}

/// A shovel whose queues do not exist yet declares them and runs; the log of that normal
/// start (and of the stop that follows) holds no ERROR: the AMQP client library logs each
/// channel the broker closes as one (the passive declare of a missing queue, the broker
/// shutting down), and the shovel reports what matters itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shovel_starts_and_stops_without_an_error_in_the_log() {
    let mut broker = Broker::start_with(Opts::default().log("info").config(
        "[[shovel]]\nname = \"local\"\nsrc-uri = \"amqp://\"\nsrc-queue = \"in\"\n\
         dest-uri = \"amqp://\"\ndest-queue = \"out\"\n",
    ));
    running(&Api::of(&broker), "local").await;
    publish_range(&broker, "in", 0..3).await;
    assert_eq!(consume_until(&broker, "out", 0..3).await, vec![0, 1, 2]);
    broker.stop();
    let log = broker.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_shovel_definitions_are_refused_with_the_reason() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let base = json!({ "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b" });
    let tmp = tempfile::tempdir().unwrap();
    let no_cert = tmp.path().join("empty.pem");
    std::fs::write(&no_cert, "not a certificate\n").unwrap();
    let empty_ca = format!("amqps://remote?cacertfile={}", no_cert.display());
    for (change, why) in [
        (json!({ "ack-mode": "no-ack", "src-delete-after": 5 }), "src-delete-after needs ack-mode"),
        (json!({ "dest-uri": empty_ca }), "holds no certificate"),
        (json!({ "src-exchange": "x" }), "one of src-queue and src-exchange"),
        (json!({ "ack-mode": "sometimes" }), "ack-mode"),
        (json!({ "src-uri": "amqps://remote?cacertfile=/nonexistent/ca.pem" }), "/nonexistent/ca.pem"),
        (json!({ "src-uri": "amqps://remote?verify=verify_none" }), "verify=verify_none"),
        (json!({ "src-uri": "amqps:///%2F" }), "needs a host"),
        (json!({ "src-uri": "http://remote" }), "amqp:// or amqps://"),
        (json!({ "dest-add-timestamp-header": true }), "dest-add-timestamp-header"),
        (json!({ "src-delete-after": "sometime" }), "src-delete-after"),
        (json!({ "src-exchange": "x", "src-queue": null, "src-delete-after": "queue-length" }), "needs a src-queue"),
    ] {
        let mut value = base.clone();
        for (k, v) in change.as_object().unwrap() {
            value[k] = v.clone();
        }
        let (code, body) = api.put("/api/parameters/shovel/%2F/bad", json!({ "value": value })).await;
        assert_eq!(code.as_u16(), 400, "{change}: {body}");
        assert!(body["reason"].as_str().unwrap_or_default().contains(why), "{change}: {body}");
    }
    assert_eq!(api.ok("/api/shovels").await, json!([]), "nothing was started");
    // Monitoring users read the status; only administrators define shovels.
    let (code, _) = api.anonymous().put("/api/parameters/shovel/%2F/x", json!({ "value": base })).await;
    assert_eq!(code.as_u16(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shovel_with_src_delete_after_moves_that_many_and_deletes_itself() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let (_c, ch) = channel_of(&broker).await;
    let durable = lapin::options::QueueDeclareOptions { durable: true, ..Default::default() };
    declare_queue_with(&ch, "batch.out", durable, FieldTable::default()).await;
    publish_range(&broker, "batch.out", 0..8).await;
    // A number: five messages move, in order, then the shovel and its definition are gone;
    // the rest stays at the source, in order.
    let five = json!({ "value": {
        "src-uri": "amqp://", "src-queue": "batch.out", "dest-uri": "amqp://", "dest-queue": "batch.in",
        "src-delete-after": 5,
    }});
    let (code, body) = api.put("/api/parameters/shovel/%2F/five", five).await;
    assert_eq!(code.as_u16(), 201, "{body}");
    eventually("the shovel deleted itself", WAIT, || async {
        let (code, _) = api.get("/api/parameters/shovel/%2F/five").await;
        (code.as_u16() == 404 && api.ok("/api/shovels").await == json!([])).then_some(())
    })
    .await;
    assert_eq!(drain(&ch, "batch.in").await, ["m0", "m1", "m2", "m3", "m4"]);
    assert_eq!(drain(&ch, "batch.out").await, ["m5", "m6", "m7"]);

    // `queue-length`: as many as the source queue held when the shovel started.
    publish_range(&broker, "batch.out", 10..14).await;
    let length = json!({ "value": {
        "src-uri": "amqp://", "src-queue": "batch.out", "dest-uri": "amqp://", "dest-queue": "batch.in",
        "src-delete-after": "queue-length",
    }});
    let (code, body) = api.put("/api/parameters/shovel/%2F/length", length).await;
    assert_eq!(code.as_u16(), 201, "{body}");
    eventually("the queue-length shovel deleted itself", WAIT, || async {
        (api.ok("/api/shovels").await == json!([])).then_some(())
    })
    .await;
    assert_eq!(drain(&ch, "batch.in").await, ["m10", "m11", "m12", "m13"]);
    // Gone for good: not started again after a restart.
    drop((ch, _c));
    let broker = broker.restart();
    let api = Api::of(&broker);
    assert_eq!(api.ok("/api/shovels").await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shovel_reaches_a_broker_over_amqps_trusting_the_ca_its_uri_names() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = common::make_pki(tmp.path(), &[]);
    let tls = format!("[tls]\ncert = \"{}\"\nkey = \"{}\"\n", pki.server_cert.display(), pki.server_key.display());
    let central = Broker::start_with(Opts::default().config(&tls).args(&["--amqps-listen", "127.0.0.1:0"]));
    let port = central.amqps.unwrap().port();
    let edge = Broker::start();
    let api = Api::of(&edge);
    // RabbitMQ's spelling: the CA file as a query parameter of the amqps:// URI.
    let dest = format!("amqps://guest:guest@localhost:{port}/%2F?cacertfile={}&heartbeat=10", pki.ca_file.display());
    let value = json!({ "value": {
        "src-uri": "amqp://", "src-queue": "tls.out", "dest-uri": dest, "dest-queue": "tls.in",
        "reconnect-delay": 0.2,
    }});
    let (code, body) = api.put("/api/parameters/shovel/%2F/sealed", value).await;
    assert_eq!(code.as_u16(), 201, "{body}");
    running(&api, "sealed").await;
    publish_range(&edge, "tls.out", 0..20).await;
    assert_eq!(consume_until(&central, "tls.in", 0..20).await, (0..20).collect::<Vec<_>>());

    // Without the CA the certificate is not trusted: the shovel says why and stays down.
    let value = json!({ "value": {
        "src-uri": "amqp://", "src-queue": "tls.out", "dest-uri": format!("amqps://guest:guest@localhost:{port}/%2F"),
        "dest-queue": "tls.in", "reconnect-delay": 0.2,
    }});
    let (code, _) = api.put("/api/parameters/shovel/%2F/untrusted", value).await;
    assert_eq!(code.as_u16(), 201);
    eventually("the untrusted shovel's reason", WAIT, || async {
        let all = api.ok("/api/shovels").await;
        let s = all.as_array()?.iter().find(|s| s["name"] == "untrusted")?.clone();
        (s["state"] != "running" && s["reason"].as_str()?.to_lowercase().contains("certificate")).then_some(())
    })
    .await;
}

/// Publishes persistent messages `m{i}` for `range` to `queue` of `/` through the
/// management API (the broker may have no AMQP listener); each is stored when answered.
async fn publish_over_http(api: &Api, queue: &str, range: std::ops::Range<u32>) {
    for i in range {
        let body = json!({
            "routing_key": queue, "payload": format!("m{i}"), "payload_encoding": "string",
            "properties": { "delivery_mode": 2 },
        });
        let (code, answer) = api.post("/api/exchanges/%2F/amq.default/publish", body).await;
        assert_eq!((code.as_u16(), &answer["routed"]), (200, &json!(true)), "m{i}: {answer}");
    }
}

/// The messages of `queue` in `/` (ready and unacknowledged), as the management API
/// counts them; `None` while there is no such queue.
async fn messages_in(api: &Api, queue: &str) -> Option<u64> {
    let (code, q) = api.get(&format!("/api/queues/%2F/{queue}")).await;
    code.is_success().then(|| q["messages"].as_u64()).flatten()
}

/// Takes every message of `queue` in `/` through the management API: their numbers, in
/// the order the queue held them.
async fn take_over_http(api: &Api, queue: &str) -> Vec<u32> {
    let get = json!({ "count": 10_000, "ackmode": "ack_requeue_false", "encoding": "auto" });
    let (code, got) = api.post(&format!("/api/queues/%2F/{queue}/get"), get).await;
    assert_eq!(code.as_u16(), 200, "{got}");
    let number = |m: &Value| -> u32 { m["payload"].as_str().and_then(|p| p[1..].parse().ok()).expect("m{i}") };
    got.as_array().expect("a list of messages").iter().map(number).collect()
}

/// The connections shovel `name` holds open to this broker (named `Shovel {name}`, as
/// RabbitMQ's shovels name theirs).
async fn connections_of(api: &Api, name: &str) -> Vec<Value> {
    let all = api.ok("/api/connections").await;
    let named = |c: &&Value| c["client_properties"]["connection_name"] == format!("Shovel {name}");
    all.as_array().expect("a list of connections").iter().filter(named).cloned().collect()
}

/// `amqp://` is FerryMQ itself, reached in-process as RabbitMQ's local shovels use a
/// direct connection: with the AMQP listener off, a shovel between two of its queues runs,
/// moves every message once and in order (on-confirm: the source is acknowledged once the
/// destination stored the message), loses none across a crash of the broker, and does not
/// hold up a shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_shovel_runs_in_process_with_the_amqp_listener_off() {
    let broker = Broker::start_with(Opts::default().args(&["--amqp-listen", ""]));
    assert_eq!(broker.amqp, None, "no AMQP listener");
    let api = Api::of(&broker);
    let def = json!({ "value": {
        "src-uri": "amqp://", "src-queue": "in", "dest-uri": "amqp:///%2F", "dest-queue": "out",
        "ack-mode": "on-confirm", "reconnect-delay": 0.2,
    }});
    let (code, body) = api.put("/api/parameters/shovel/%2F/inproc", def).await;
    assert_eq!(code.as_u16(), 201, "{body}");
    running(&api, "inproc").await;

    publish_over_http(&api, "in", 0..100).await;
    eventually("every message moved", WAIT, || async {
        (messages_in(&api, "in").await == Some(0) && messages_in(&api, "out").await == Some(100)).then_some(())
    })
    .await;
    assert_eq!(take_over_http(&api, "out").await, (0..100).collect::<Vec<_>>(), "each once, in order");
    assert_eq!(api.ok("/api/shovels").await[0]["messages_moved"], 100);

    // Killed while moving: what the source let go of is stored at the destination (a
    // message may come twice: one moved but not yet acknowledged at the source).
    publish_over_http(&api, "in", 100..300).await;
    let mut broker = broker.crash_restart();
    let api = Api::of(&broker);
    running(&api, "inproc").await;
    eventually("the rest moved after the restart", WAIT, || async {
        (messages_in(&api, "in").await == Some(0)).then_some(())
    })
    .await;
    let moved = take_over_http(&api, "out").await;
    let mut firsts = Vec::new();
    for i in &moved {
        if !firsts.contains(i) {
            firsts.push(*i);
        }
    }
    assert_eq!(firsts, (100..300).collect::<Vec<_>>(), "none lost, in order: {moved:?}");

    // A shutdown with the shovel's in-process connections open ends cleanly and in time.
    broker.stop();
}

/// The local side's connections are listed as RabbitMQ lists its direct connections
/// (`type` `direct`, as the default user, in the shovel's virtual host), none of them a
/// TCP login; they close when the shovel is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_shovels_connections_are_direct_and_close_with_it() {
    let broker = Broker::start();
    let api = Api::of(&broker);
    let def = json!({ "value": {
        "src-uri": "amqp://", "src-queue": "pipe.in", "dest-uri": "amqp://", "dest-queue": "pipe.out",
        "reconnect-delay": 0.2,
    }});
    let (code, body) = api.put("/api/parameters/shovel/%2F/pipe", def).await;
    assert_eq!(code.as_u16(), 201, "{body}");
    running(&api, "pipe").await;
    let both = eventually("the shovel's two connections listed", WAIT, || async {
        let conns = connections_of(&api, "pipe").await;
        (conns.len() == 2).then_some(conns)
    })
    .await;
    for c in &both {
        assert_eq!(
            (c["type"].as_str(), c["user"].as_str(), c["vhost"].as_str(), c["protocol"].as_str()),
            (Some("direct"), Some("guest"), Some("/"), Some("AMQP 0-9-1")),
            "{c}"
        );
        assert_eq!(c["auth_mechanism"], "EXTERNAL", "the local side logs in without a password: {c}");
        assert!(c["name"].as_str().is_some_and(|n| n.starts_with("<direct.")), "{c}");
    }
    assert_ne!(both[0]["name"], both[1]["name"], "each named apart");
    assert_eq!(api.ok("/api/connections").await.as_array().map(Vec::len), Some(2), "no other connection");

    let (code, _) = api.delete("/api/parameters/shovel/%2F/pipe").await;
    assert_eq!(code.as_u16(), 204);
    eventually("the shovel's connections closed", WAIT, || async {
        (api.ok("/api/connections").await == json!([])).then_some(())
    })
    .await;
}

/// The local side acts as `auth.default_user` and is checked as that user's clients are:
/// refused a virtual host it has no permissions in, then the queues its permissions do
/// not let it declare; running once they do. No AMQP listener is needed for any of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_shovel_has_its_users_permissions_and_no_more() {
    let broker =
        Broker::start_with(Opts::default().config("[auth]\nauthorization = true\n").args(&["--amqp-listen", ""]));
    let api = Api::of(&broker);
    // Made at run time: nobody has permissions in it.
    assert_eq!(api.put("/api/vhosts/cold", json!({})).await.0.as_u16(), 201);
    let def = json!({ "value": {
        "src-uri": "amqp:///cold", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b",
        "reconnect-delay": 0.2,
    }});
    let (code, body) = api.put("/api/parameters/shovel/%2F/cold", def).await;
    assert_eq!(code.as_u16(), 201, "{body}");
    let reason = |why: &'static str| {
        let api = &api;
        async move {
            eventually(&format!("the shovel down: {why}"), WAIT, || async {
                let s = api.ok("/api/shovels").await[0].clone();
                (s["state"] != "running" && s["reason"].as_str()?.contains(why)).then_some(())
            })
            .await
        }
    };
    reason("access to vhost 'cold' refused for user 'guest'").await;

    let read_write = json!({ "configure": "^$", "write": ".*", "read": ".*" });
    assert_eq!(api.put("/api/permissions/cold/guest", read_write).await.0.as_u16(), 201);
    reason("ACCESS_REFUSED - configure access to queue 'a' in vhost 'cold' refused for user 'guest'").await;

    let all = json!({ "configure": ".*", "write": ".*", "read": ".*" });
    assert_eq!(api.put("/api/permissions/cold/guest", all).await.0.as_u16(), 204);
    running(&api, "cold").await;
}
