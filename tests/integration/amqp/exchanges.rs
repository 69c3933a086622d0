//! AMQP exchanges: the four types and their routing, declaration rules and errors, the
//! pre-declared exchanges, exchange-to-exchange bindings, alternate exchanges, deletion.

use crate::common::amqp::*;

/// A connection with one confirm-mode channel (publishes are routed once confirmed).
async fn setup(t: &Target) -> (Connection, Channel) {
    let (conn, ch) = t.channel().await;
    confirm_select(&ch).await;
    (conn, ch)
}

async fn send(ch: &Channel, exchange: &str, key: &str, body: &str) {
    let c = publish_confirmed(ch, exchange, key, body.as_bytes(), BasicProperties::default()).await;
    assert!(c.is_ack(), "publish to {exchange}/{key} not acked: {c:?}");
}

async fn send_with_headers(ch: &Channel, exchange: &str, body: &str, h: FieldTable) {
    let c = publish_confirmed(ch, exchange, "", body.as_bytes(), BasicProperties::default().with_headers(h)).await;
    assert!(c.is_ack());
}

async fn exclusive_queue(ch: &Channel) -> String {
    declare_queue_with(ch, "", QueueDeclareOptions { exclusive: true, ..Default::default() }, FieldTable::default())
        .await
        .name()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_exchange_routes_by_exact_key() {
    let t = Target::start();
    let (_c, ch) = setup(&t).await;
    let x = unique("direct");
    declare_exchange(&ch, &x, ExchangeKind::Direct, Default::default(), FieldTable::default()).await;
    let q1 = exclusive_queue(&ch).await;
    let q2 = exclusive_queue(&ch).await;
    bind(&ch, &q1, &x, "red", FieldTable::default()).await;
    bind(&ch, &q2, &x, "green", FieldTable::default()).await;
    bind(&ch, &q2, &x, "red", FieldTable::default()).await;
    send(&ch, &x, "red", "r").await;
    send(&ch, &x, "green", "g").await;
    send(&ch, &x, "blue", "b").await;
    send(&ch, &x, "Red", "R").await;
    assert_eq!(drain(&ch, &q1).await, ["r"]);
    assert_eq!(drain(&ch, &q2).await, ["r", "g"]);
    delete_exchange(&ch, &x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_exchange_copies_to_every_bound_queue_ignoring_the_key() {
    let t = Target::start();
    let (_c, ch) = setup(&t).await;
    let x = unique("fanout");
    declare_exchange(&ch, &x, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    let qs = [exclusive_queue(&ch).await, exclusive_queue(&ch).await, exclusive_queue(&ch).await];
    for (i, q) in qs.iter().enumerate() {
        bind(&ch, q, &x, &format!("k{i}"), FieldTable::default()).await;
    }
    send(&ch, &x, "anything", "one").await;
    send(&ch, &x, "", "two").await;
    for q in &qs {
        assert_eq!(drain(&ch, q).await, ["one", "two"]);
    }
    delete_exchange(&ch, &x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_exchange_matches_star_and_hash() {
    let t = Target::start();
    let (_c, ch) = setup(&t).await;
    let x = unique("topic");
    declare_exchange(&ch, &x, ExchangeKind::Topic, Default::default(), FieldTable::default()).await;
    let patterns = ["a.*.c", "a.#", "#", "*.b.*", "a.#.c", "*", "#.z"];
    let mut queues = Vec::new();
    for p in patterns {
        let q = exclusive_queue(&ch).await;
        bind(&ch, &q, &x, p, FieldTable::default()).await;
        queues.push(q);
    }
    let keys = ["a.b.c", "a.c", "a.b.b.c", "x.b.y", "a", "z", "", "q.z", "a..c"];
    for k in keys {
        send(&ch, &x, k, k).await;
    }
    let expected: [&[&str]; 7] = [
        &["a.b.c", "a..c"],                        // a.*.c (empty word matches *)
        &["a.b.c", "a.c", "a.b.b.c", "a", "a..c"], // a.#
        &keys,                                     // #
        &["a.b.c", "x.b.y"],                       // *.b.*
        &["a.b.c", "a.c", "a.b.b.c", "a..c"],      // a.#.c
        &["a", "z"],                               // * (exactly one word; "" has none)
        &["z", "q.z"],                             // #.z
    ];
    for ((p, q), want) in patterns.iter().zip(&queues).zip(expected) {
        assert_eq!(drain(&ch, q).await, want, "pattern {p:?}");
    }
    delete_exchange(&ch, &x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_exchange_matches_all_and_any() {
    let t = Target::start();
    let (_c, ch) = setup(&t).await;
    let x = unique("headers");
    declare_exchange(&ch, &x, ExchangeKind::Headers, Default::default(), FieldTable::default()).await;
    let all = exclusive_queue(&ch).await;
    let any = exclusive_queue(&ch).await;
    let default_is_all = exclusive_queue(&ch).await;
    bind(
        &ch,
        &all,
        &x,
        "",
        table(&[("x-match", string("all")), ("format", string("pdf")), ("type", string("report"))]),
    )
    .await;
    bind(
        &ch,
        &any,
        &x,
        "",
        table(&[("x-match", string("any")), ("format", string("pdf")), ("type", string("report"))]),
    )
    .await;
    bind(&ch, &default_is_all, &x, "", table(&[("format", string("pdf")), ("type", string("report"))])).await;
    send_with_headers(
        &ch,
        &x,
        "both",
        table(&[("format", string("pdf")), ("type", string("report")), ("extra", int(1))]),
    )
    .await;
    send_with_headers(&ch, &x, "format-only", table(&[("format", string("pdf"))])).await;
    send_with_headers(&ch, &x, "wrong-value", table(&[("format", string("zip")), ("type", string("log"))])).await;
    send_with_headers(&ch, &x, "none", FieldTable::default()).await;
    assert_eq!(drain(&ch, &all).await, ["both"]);
    assert_eq!(drain(&ch, &any).await, ["both", "format-only"]);
    assert_eq!(drain(&ch, &default_is_all).await, ["both"]);
    delete_exchange(&ch, &x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_exchange_matches_typed_values_and_routing_key_is_ignored() {
    let t = Target::start();
    let (_c, ch) = setup(&t).await;
    let x = unique("headers-typed");
    declare_exchange(&ch, &x, ExchangeKind::Headers, Default::default(), FieldTable::default()).await;
    let q = exclusive_queue(&ch).await;
    bind(&ch, &q, &x, "ignored", table(&[("x-match", string("all")), ("n", int(42))])).await;
    let c = publish_confirmed(
        &ch,
        &x,
        "other-key",
        b"int",
        BasicProperties::default().with_headers(table(&[("n", int(42))])),
    )
    .await;
    assert!(c.is_ack());
    let c =
        publish_confirmed(&ch, &x, "", b"other-int", BasicProperties::default().with_headers(table(&[("n", int(43))])))
            .await;
    assert!(c.is_ack());
    assert_eq!(drain(&ch, &q).await, ["int"]);
    delete_exchange(&ch, &x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_declare_of_a_missing_exchange_closes_the_channel_with_404() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let x = unique("missing");
    let r = bounded(
        "exchange.declare",
        ch.exchange_declare(
            x.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions { passive: true, ..Default::default() },
            FieldTable::default(),
        ),
    )
    .await;
    let text = expect_code(r, 404);
    assert_eq!(text, format!("NOT_FOUND - no exchange '{x}' in vhost '/'"));
    assert!(!ch.status().connected(), "the channel is closed");
    // Only the channel: the connection still works.
    let ch2 = open_channel(&conn).await;
    assert!(exchange_exists(&conn, "amq.direct").await);
    drop(ch2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeclaring_with_another_type_or_durability_fails_with_406() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let x = unique("redeclare");
    declare_exchange(&ch, &x, ExchangeKind::Direct, Default::default(), FieldTable::default()).await;
    // Same attributes: fine.
    declare_exchange(&ch, &x, ExchangeKind::Direct, Default::default(), FieldTable::default()).await;
    let r =
        ch.exchange_declare(x.as_str().into(), ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    let text = expect_code(r, 406);
    assert!(text.starts_with("PRECONDITION_FAILED - inequivalent arg 'type' for exchange"), "{text:?}");
    let ch = open_channel(&conn).await;
    let r = ch
        .exchange_declare(
            x.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 406);
    assert!(text.starts_with("PRECONDITION_FAILED - inequivalent arg 'durable' for exchange"), "{text:?}");
    let ch = open_channel(&conn).await;
    delete_exchange(&ch, &x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_declare_ignores_type_and_flags() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    let x = unique("passive-any");
    declare_exchange(
        &ch,
        &x,
        ExchangeKind::Topic,
        ExchangeDeclareOptions { durable: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    declare_exchange(
        &ch,
        &x,
        ExchangeKind::Fanout,
        ExchangeDeclareOptions { passive: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    delete_exchange(&ch, &x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_delete_exchange_goes_when_its_last_binding_goes() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let x = unique("autodel");
    declare_exchange(
        &ch,
        &x,
        ExchangeKind::Fanout,
        ExchangeDeclareOptions { auto_delete: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    // Never bound: stays.
    assert!(exchange_exists(&conn, &x).await);
    let q1 = exclusive_queue(&ch).await;
    let q2 = exclusive_queue(&ch).await;
    bind(&ch, &q1, &x, "", FieldTable::default()).await;
    bind(&ch, &q2, &x, "", FieldTable::default()).await;
    bounded("unbind", ch.queue_unbind(q1.as_str().into(), x.as_str().into(), "".into(), FieldTable::default()))
        .await
        .unwrap();
    assert!(exchange_exists(&conn, &x).await, "one binding left");
    // Deleting the queue removes the last binding.
    bounded("queue.delete", ch.queue_delete(q2.as_str().into(), QueueDeleteOptions::default())).await.unwrap();
    eventually("auto-delete exchange removed", WAIT, || async { (!exchange_exists(&conn, &x).await).then_some(()) })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_exchange_cannot_be_published_to_but_routes_from_bindings() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let mut ev = events(&conn);
    let internal = unique("internal");
    let front = unique("front");
    declare_exchange(
        &ch,
        &internal,
        ExchangeKind::Fanout,
        ExchangeDeclareOptions { internal: true, ..Default::default() },
        FieldTable::default(),
    )
    .await;
    declare_exchange(&ch, &front, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    let q = exclusive_queue(&ch).await;
    bind(&ch, &q, &internal, "", FieldTable::default()).await;
    bounded(
        "exchange.bind",
        ch.exchange_bind(
            internal.as_str().into(),
            front.as_str().into(),
            "".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    // Through a binding from another exchange: delivered.
    publish(&ch, &front, "", b"via-front", BasicProperties::default()).await;
    let m = eventually("the message via the exchange binding", WAIT, || get(&ch, &q, true)).await;
    assert_eq!(m.delivery.data, b"via-front");
    // Directly: channel closed with 403.
    publish(&ch, &internal, "", b"direct", BasicProperties::default()).await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(code, 403, "{text}");
    assert_eq!(text, format!("ACCESS_REFUSED - cannot publish to internal exchange '{internal}' in vhost '/'"));
    let ch = open_channel(&conn).await;
    delete_exchange(&ch, &front).await;
    delete_exchange(&ch, &internal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_exchange_routes_by_queue_name_and_cannot_be_bound_or_deleted() {
    let t = Target::start();
    let (conn, ch) = setup(&t).await;
    let q = exclusive_queue(&ch).await;
    send(&ch, "", &q, "by-name").await;
    assert_eq!(drain(&ch, &q).await, ["by-name"]);
    let r =
        ch.queue_bind(q.as_str().into(), "".into(), "other".into(), Default::default(), FieldTable::default()).await;
    let text = expect_code(r, 403);
    assert!(text.starts_with("ACCESS_REFUSED - operation not permitted on the default exchange"), "{text:?}");
    let ch = open_channel(&conn).await;
    let r = ch.exchange_delete("".into(), Default::default()).await;
    let text = expect_code(r, 403);
    assert!(text.starts_with("ACCESS_REFUSED - operation not permitted on the default exchange"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predeclared_amq_exchanges_exist_and_amq_prefix_is_reserved() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    for (name, kind) in [
        ("amq.direct", ExchangeKind::Direct),
        ("amq.fanout", ExchangeKind::Fanout),
        ("amq.topic", ExchangeKind::Topic),
        ("amq.headers", ExchangeKind::Headers),
        ("amq.match", ExchangeKind::Headers),
    ] {
        assert!(exchange_exists(&conn, name).await, "{name}");
        // A non-passive declare with the same type and durable=true is accepted.
        declare_exchange(
            &ch,
            name,
            kind,
            ExchangeDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await;
    }
    let r = ch
        .exchange_declare(
            unique("amq.mine").as_str().into(),
            ExchangeKind::Direct,
            Default::default(),
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 403);
    assert!(text.contains("reserved prefix 'amq.*'"), "{text:?}");
    // amq.fanout delivers to bound queues.
    let ch = open_channel(&conn).await;
    confirm_select(&ch).await;
    let q = exclusive_queue(&ch).await;
    bind(&ch, &q, "amq.fanout", "", FieldTable::default()).await;
    send(&ch, "amq.fanout", "whatever", "fan").await;
    assert_eq!(drain(&ch, &q).await, ["fan"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_to_exchange_bindings_route_and_unbind() {
    let t = Target::start();
    let (_c, ch) = setup(&t).await;
    let src = unique("e2e-src");
    let dst = unique("e2e-dst");
    declare_exchange(&ch, &src, ExchangeKind::Topic, Default::default(), FieldTable::default()).await;
    declare_exchange(&ch, &dst, ExchangeKind::Direct, Default::default(), FieldTable::default()).await;
    let q = exclusive_queue(&ch).await;
    bind(&ch, &q, &dst, "a.b", FieldTable::default()).await;
    bounded(
        "exchange.bind",
        ch.exchange_bind(
            dst.as_str().into(),
            src.as_str().into(),
            "a.*".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    send(&ch, &src, "a.b", "routed").await; // matches a.* then a.b
    send(&ch, &src, "a.c", "dst-drops").await; // matches a.*, no a.c binding on dst
    send(&ch, &src, "b.b", "src-drops").await;
    assert_eq!(drain(&ch, &q).await, ["routed"]);
    bounded(
        "exchange.unbind",
        ch.exchange_unbind(
            dst.as_str().into(),
            src.as_str().into(),
            "a.*".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    send(&ch, &src, "a.b", "after-unbind").await;
    assert!(drain(&ch, &q).await.is_empty());
    delete_exchange(&ch, &src).await;
    delete_exchange(&ch, &dst).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reaching_a_queue_twice_through_e2e_bindings_are_delivered_once() {
    let t = Target::start();
    let (_c, ch) = setup(&t).await;
    let src = unique("e2e-dup-src");
    let dst = unique("e2e-dup-dst");
    declare_exchange(&ch, &src, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    declare_exchange(&ch, &dst, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    let q = exclusive_queue(&ch).await;
    bind(&ch, &q, &src, "", FieldTable::default()).await;
    bind(&ch, &q, &dst, "", FieldTable::default()).await;
    bounded(
        "exchange.bind",
        ch.exchange_bind(
            dst.as_str().into(),
            src.as_str().into(),
            "".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    send(&ch, &src, "", "once").await;
    assert_eq!(drain(&ch, &q).await, ["once"]);
    delete_exchange(&ch, &src).await;
    delete_exchange(&ch, &dst).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternate_exchange_receives_unroutable_messages() {
    let t = Target::start();
    let (_c, ch) = setup(&t).await;
    let ae = unique("ae");
    let x = unique("with-ae");
    declare_exchange(&ch, &ae, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    declare_exchange(&ch, &x, ExchangeKind::Direct, Default::default(), table(&[("alternate-exchange", string(&ae))]))
        .await;
    let routed = exclusive_queue(&ch).await;
    let unrouted = exclusive_queue(&ch).await;
    bind(&ch, &routed, &x, "known", FieldTable::default()).await;
    bind(&ch, &unrouted, &ae, "", FieldTable::default()).await;
    send(&ch, &x, "known", "ok").await;
    // Mandatory and unroutable on x, but routed by the AE: not returned.
    let c = publish_opts(
        &ch,
        &x,
        "unknown",
        BasicPublishOptions { mandatory: true, ..Default::default() },
        b"lost",
        BasicProperties::default(),
    )
    .await;
    let c = bounded("confirm", c).await.unwrap();
    assert_eq!(c, Confirmation::Ack(None), "routed through the alternate exchange, not returned");
    assert_eq!(drain(&ch, &routed).await, ["ok"]);
    let m = get(&ch, &unrouted, true).await.expect("in the alternate exchange's queue");
    assert_eq!(m.delivery.data, b"lost");
    assert_eq!(m.delivery.exchange.as_str(), x, "exchange is the original one");
    assert_eq!(m.delivery.routing_key.as_str(), "unknown", "routing key kept");
    delete_exchange(&ch, &x).await;
    delete_exchange(&ch, &ae).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_if_unused_fails_with_406_while_bound_then_deletes() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let x = unique("del-if-unused");
    declare_exchange(&ch, &x, ExchangeKind::Direct, Default::default(), FieldTable::default()).await;
    let q = exclusive_queue(&ch).await;
    bind(&ch, &q, &x, "k", FieldTable::default()).await;
    let r =
        ch.exchange_delete(x.as_str().into(), ExchangeDeleteOptions { if_unused: true, ..Default::default() }).await;
    let text = expect_code(r, 406);
    assert!(text.starts_with("PRECONDITION_FAILED"), "{text:?}");
    assert!(text.contains("in use"), "{text:?}");
    let ch = open_channel(&conn).await;
    bounded("unbind", ch.queue_unbind(q.as_str().into(), x.as_str().into(), "k".into(), FieldTable::default()))
        .await
        .unwrap();
    bounded(
        "delete",
        ch.exchange_delete(x.as_str().into(), ExchangeDeleteOptions { if_unused: true, ..Default::default() }),
    )
    .await
    .unwrap();
    assert!(!exchange_exists(&conn, &x).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_exchange_removes_its_bindings() {
    let t = Target::start();
    let (conn, ch) = setup(&t).await;
    let x = unique("del-bindings");
    declare_exchange(&ch, &x, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    let q = exclusive_queue(&ch).await;
    bind(&ch, &q, &x, "", FieldTable::default()).await;
    bounded("delete", ch.exchange_delete(x.as_str().into(), Default::default())).await.unwrap();
    assert!(!exchange_exists(&conn, &x).await);
    // Redeclared: the old binding is gone.
    declare_exchange(&ch, &x, ExchangeKind::Fanout, Default::default(), FieldTable::default()).await;
    send(&ch, &x, "", "nobody").await;
    assert!(drain(&ch, &q).await.is_empty());
    delete_exchange(&ch, &x).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_missing_exchange_succeeds() {
    let t = Target::start();
    let (_c, ch) = t.channel().await;
    bounded("delete", ch.exchange_delete(unique("never-declared").as_str().into(), Default::default()))
        .await
        .expect("exchange.delete of a missing exchange is delete-ok");
    assert!(ch.status().connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_to_a_missing_exchange_closes_the_channel_with_404() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let mut ev = events(&conn);
    let x = unique("nowhere");
    publish(&ch, &x, "k", b"x", BasicProperties::default()).await;
    let (code, text) = server_closed(&mut ev).await;
    assert_eq!(code, 404);
    assert_eq!(text, format!("NOT_FOUND - no exchange '{x}' in vhost '/'"));
    eventually("channel closed", WAIT, || {
        let closed = !ch.status().connected();
        async move { closed.then_some(()) }
    })
    .await;
    assert!(conn.status().connected(), "only the channel is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_to_a_missing_exchange_or_queue_fails_with_404() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let q = exclusive_queue(&ch).await;
    let x = unique("missing-x");
    let r = ch
        .queue_bind(q.as_str().into(), x.as_str().into(), "k".into(), Default::default(), FieldTable::default())
        .await;
    let text = expect_code(r, 404);
    assert_eq!(text, format!("NOT_FOUND - no exchange '{x}' in vhost '/'"));
    let ch = open_channel(&conn).await;
    let missing_q = unique("missing-q");
    let r = ch
        .queue_bind(
            missing_q.as_str().into(),
            "amq.direct".into(),
            "k".into(),
            Default::default(),
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 404);
    assert_eq!(text, format!("NOT_FOUND - no queue '{missing_q}' in vhost '/'"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_exchange_type_is_a_503_connection_error() {
    let t = Target::start();
    let (conn, ch) = t.channel().await;
    let r = ch
        .exchange_declare(
            unique("weird").as_str().into(),
            ExchangeKind::Custom("x-no-such-type".into()),
            Default::default(),
            FieldTable::default(),
        )
        .await;
    let text = expect_code(r, 503);
    assert!(text.starts_with("COMMAND_INVALID - unknown exchange type 'x-no-such-type'"), "{text:?}");
    eventually("connection closed", WAIT, || {
        let closed = !conn.status().connected();
        async move { closed.then_some(()) }
    })
    .await;
}
