"""AMQP 0-9-1 with pika 1.x: BlockingConnection for nearly everything, a raw
socket for a client that stays silent after negotiating heartbeats, and one
SelectConnection (callback style) round trip with publisher confirms.

Validated against RabbitMQ 3.10 (INTEROP_BROKER=rabbitmq); error codes and texts
asserted are RabbitMQ's (reply codes are the spec's; the texts' leading
constant, e.g. ``NOT_FOUND``, is what clients log and match on)."""

from __future__ import annotations

import datetime
import decimal
import time

import pika
import pika.exceptions as pex
import pytest

from amqpclient import QUIET, TIMEOUT, Consumer, Delivery, get_message, message_count, pump
from rawamqp import CONNECTION_CLOSE, FRAME_HEARTBEAT, Closed, RawAmqp

pytestmark = pytest.mark.amqp


def declare(ch, name, **kw) -> str:
    return ch.queue_declare(name, **kw).method.queue


def expect_channel_closed(fn, code: int, text_start: str) -> pex.ChannelClosedByBroker:
    with pytest.raises(pex.ChannelClosedByBroker) as ei:
        fn()
    assert ei.value.reply_code == code, ei.value
    assert ei.value.reply_text.startswith(text_start), ei.value
    return ei.value


# --------------------------------------------------------------------- publish / consume
def test_publish_consume_round_trip_all_properties(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    headers = {
        "str": "text é", "int": 42, "big": 2**40, "neg": -5, "bool": True, "dec": decimal.Decimal("3.14"),
        "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc), "bytes": b"\x00\xff",
        "list": [1, "two", False], "table": {"inner": "v", "k": 1}, "void": None,
    }
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", headers=headers, delivery_mode=2,
        priority=5, correlation_id="corr-1", reply_to="reply.queue", expiration="60000", message_id="msg-1",
        timestamp=1700000000, type="order.created", user_id="guest", app_id="interop",
    )
    ch.basic_publish("", q, b'{"a": 1}', props)
    d = Consumer(ch, q, auto_ack=True).get()
    assert d.body == b'{"a": 1}'
    assert (d.exchange, d.routing_key, d.redelivered) == ("", q, False)
    p = d.properties
    for attr in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                 "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(p, attr) == getattr(props, attr), attr
    # Every field-table type pika encodes comes back with its type and value.
    assert p.headers == headers
    assert type(p.headers["int"]) is int and type(p.headers["bool"]) is bool
    assert type(p.headers["bytes"]) is bytes and type(p.headers["dec"]) is decimal.Decimal


def test_messages_without_properties_and_odd_bodies(amqp, names):
    """Empty body, binary body, a body larger than frame_max (split in several body
    frames: RabbitMQ's frame_max is 128 KiB), in publish order."""
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    bodies = [b"", bytes(range(256)), b"x" * (1024 * 1024 + 7), "ünïcödé".encode()]
    for b in bodies:
        ch.basic_publish("", q, b)
    got = Consumer(ch, q, auto_ack=True).expect(len(bodies))
    assert [d.body for d in got] == bodies
    # Published without properties: no headers appear; delivery mode absent (RabbitMQ
    # passes the empty property set through) or 1, which means the same (transient).
    assert got[0].properties.headers is None and got[0].properties.delivery_mode in (None, 1)


def test_order_kept_for_many_messages(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    n = 500
    for i in range(n):
        ch.basic_publish("", q, str(i).encode())
    got = Consumer(ch, q, auto_ack=True).expect(n)
    assert [int(d.body) for d in got] == list(range(n))


def test_publisher_and_consumer_on_separate_connections(amqp, names):
    pub, sub = amqp(), amqp()
    sch = sub.channel()
    q = declare(sch, names("q"))
    c = Consumer(sch, q)
    pch = pub.channel()
    for i in range(3):
        pch.basic_publish("", q, f"m{i}".encode())
    got = c.expect(3)
    assert [d.body for d in got] == [b"m0", b"m1", b"m2"]
    assert [d.delivery_tag for d in got] == [1, 2, 3], "delivery tags count from 1 per channel"
    for d in got:
        sch.basic_ack(d.delivery_tag)
    assert message_count(sch, q) == 0


def test_basic_get(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    assert ch.basic_get(q) == (None, None, None), "basic.get-empty on an empty queue"
    for i in range(3):
        ch.basic_publish("", q, f"g{i}".encode())
    first = get_message(ch, q, auto_ack=False)
    assert first.body == b"g0"
    assert first.method.message_count == 2, "Get-Ok's message-count: messages left in the queue"
    ch.basic_ack(first.delivery_tag)
    second = get_message(ch, q, auto_ack=True)
    assert (second.body, second.method.message_count, second.redelivered) == (b"g1", 1, False)
    third = get_message(ch, q, auto_ack=False)
    assert third.body == b"g2"
    ch.close()  # unacknowledged: back in the queue, flagged redelivered
    ch2 = conn.channel()
    again = get_message(ch2, q, auto_ack=True)
    assert (again.body, again.redelivered, again.method.message_count) == (b"g2", True, 0)
    assert ch2.basic_get(q) == (None, None, None)


def test_default_and_predeclared_exchanges_exist(amqp, names):
    conn = amqp()
    ch = conn.channel()
    for x, type_ in [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                     ("amq.headers", "headers"), ("amq.match", "headers")]:
        ch.exchange_declare(x, type_, passive=True)
        ch.exchange_declare(x, type_, durable=True)  # redeclaring with the same attributes is allowed
    q = declare(ch, names("q"))
    ch.queue_bind(q, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"via amq.direct")
    ch.basic_publish("", q, b"via default exchange")
    got = Consumer(ch, q, auto_ack=True).expect(2)
    assert [(d.exchange, d.routing_key, d.body) for d in got] == [
        ("amq.direct", "k", b"via amq.direct"), ("", q, b"via default exchange")]


# ------------------------------------------------------------------------ confirms / returns
def test_confirms_ack_every_publish(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"), durable=True)
    ch.confirm_delivery()
    for i in range(50):
        # BlockingChannel waits for basic.ack; a nack would raise NackError.
        ch.basic_publish("", q, f"c{i}".encode(), pika.BasicProperties(delivery_mode=2))
    assert message_count(ch, q) == 50
    # An unroutable message without mandatory is confirmed too (and dropped).
    ch.basic_publish("amq.direct", names("nowhere"), b"dropped")


def test_confirm_mandatory_unroutable_raises_unroutable_error(amqp, names):
    conn = amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    key = names("nowhere")
    with pytest.raises(pex.UnroutableError) as ei:
        ch.basic_publish("amq.direct", key, b"lost?", pika.BasicProperties(message_id="u1"), mandatory=True)
    (returned,) = ei.value.messages
    assert returned.method.reply_code == 312
    assert returned.method.reply_text == "NO_ROUTE"
    assert (returned.method.exchange, returned.method.routing_key) == ("amq.direct", key)
    assert returned.body == b"lost?" and returned.properties.message_id == "u1"
    # The channel stays usable: a routable mandatory publish is simply confirmed.
    q = declare(ch, names("q"))
    ch.basic_publish("", q, b"routable", mandatory=True)
    assert get_message(ch, q).body == b"routable"


def test_mandatory_return_without_confirms(amqp, names):
    conn = amqp()
    ch = conn.channel()
    returned: list = []
    ch.add_on_return_callback(lambda _ch, method, props, body: returned.append((method, body)))
    key = names("nowhere")
    ch.basic_publish("amq.direct", key, b"bounce", mandatory=True)
    pump(conn, lambda: returned, TIMEOUT, "basic.return")
    method, body = returned[0]
    assert (method.reply_code, method.reply_text, method.routing_key, body) == (312, "NO_ROUTE", key, b"bounce")


def test_publish_to_missing_exchange_closes_channel_404(amqp, names):
    conn = amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    x = names("x")
    err = expect_channel_closed(lambda: ch.basic_publish(x, "k", b"x"), 404, "NOT_FOUND")
    assert err.reply_text == f"NOT_FOUND - no exchange '{x}' in vhost '/'"
    assert ch.is_closed and conn.is_open
    assert conn.channel().queue_declare("", exclusive=True).method.queue


# ------------------------------------------------------------------ ack / nack / reject
def test_nack_with_requeue_redelivers(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    ch.basic_publish("", q, b"again")
    c = Consumer(ch, q)
    d = c.get()
    assert d.redelivered is False
    ch.basic_nack(d.delivery_tag, requeue=True)
    d2 = c.get()
    assert (d2.body, d2.redelivered) == (b"again", True)
    assert d2.delivery_tag > d.delivery_tag
    ch.basic_ack(d2.delivery_tag)
    c.cancel()
    assert message_count(ch, q) == 0


def test_reject_without_requeue_drops(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    ch.basic_publish("", q, b"drop me")
    c = Consumer(ch, q)
    d = c.get()
    ch.basic_reject(d.delivery_tag, requeue=False)
    ch.basic_publish("", q, b"fence")
    assert c.collect_until(b"fence") == [], "a rejected message must not come back"


def test_reject_with_requeue_redelivers(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    ch.basic_publish("", q, b"r")
    c = Consumer(ch, q)
    ch.basic_reject(c.get().delivery_tag, requeue=True)
    d = c.get()
    assert (d.body, d.redelivered) == (b"r", True)


def test_nack_multiple_requeues_in_original_order(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    for i in range(4):
        ch.basic_publish("", q, f"n{i}".encode())
    c = Consumer(ch, q)
    got = c.expect(4)
    ch.basic_ack(got[0].delivery_tag)
    ch.basic_nack(got[3].delivery_tag, multiple=True, requeue=True)  # n1..n3
    again = c.expect(3)
    assert [d.body for d in again] == [b"n1", b"n2", b"n3"]
    assert all(d.redelivered for d in again)


def test_ack_multiple(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    for i in range(5):
        ch.basic_publish("", q, f"a{i}".encode())
    c = Consumer(ch, q)
    got = c.expect(5)
    ch.basic_ack(got[2].delivery_tag, multiple=True)  # a0..a2
    c.cancel()
    ch.close()  # a3, a4 unacked: requeued
    ch2 = conn.channel()
    rest = Consumer(ch2, q, auto_ack=True).expect(2)
    assert [(d.body, d.redelivered) for d in rest] == [(b"a3", True), (b"a4", True)]
    assert message_count(ch2, q) == 0


def test_unacked_messages_requeued_when_connection_closes(amqp, names):
    first = amqp()
    ch = first.channel()
    q = declare(ch, names("q"))
    ch.basic_publish("", q, b"u0")
    ch.basic_publish("", q, b"u1")
    Consumer(ch, q).expect(2)
    first.close()
    second = amqp()
    got = Consumer(second.channel(), q, auto_ack=True).expect(2)
    assert [(d.body, d.redelivered) for d in got] == [(b"u0", True), (b"u1", True)]


def test_ack_of_unknown_delivery_tag_closes_channel_406(amqp, names):
    conn = amqp()
    ch = conn.channel()
    declare(ch, names("q"))
    ch.basic_ack(999)
    # The error comes back asynchronously; the next synchronous call reports it.
    err = expect_channel_closed(lambda: ch.queue_declare("", exclusive=True), 406, "PRECONDITION_FAILED")
    assert "unknown delivery tag 999" in err.reply_text


# ------------------------------------------------------------------------------ prefetch
def test_prefetch_count_limits_unacknowledged_deliveries(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    for i in range(5):
        ch.basic_publish("", q, f"p{i}".encode())
    ch.basic_qos(prefetch_count=2)
    c = Consumer(ch, q)
    got = c.expect(2)
    assert [d.body for d in got] == [b"p0", b"p1"]
    # No fence can pass a full prefetch window: a bounded quiet window, plus the
    # broker's own count of what it still holds.
    c.assert_none(QUIET)
    assert message_count(ch, q) == 3
    ch.basic_ack(got[0].delivery_tag)
    (nxt,) = c.expect(1)
    assert nxt.body == b"p2"
    c.assert_none(QUIET)
    ch.basic_ack(nxt.delivery_tag, multiple=True)  # p1, p2: the window opens for p3, p4
    assert [d.body for d in c.expect(2)] == [b"p3", b"p4"]


def test_prefetch_is_per_consumer(amqp, names):
    """basic.qos with global=false (pika's default) limits each consumer on the
    channel separately."""
    conn = amqp()
    ch = conn.channel()
    q1, q2 = declare(ch, names("q1")), declare(ch, names("q2"))
    for q in (q1, q2):
        for i in range(3):
            ch.basic_publish("", q, f"{i}".encode())
    ch.basic_qos(prefetch_count=1)
    c1, c2 = Consumer(ch, q1), Consumer(ch, q2)
    assert len(c1.expect(1)) == 1 and len(c2.expect(1)) == 1
    c1.assert_none(QUIET)
    assert message_count(ch, q1) == 2 and message_count(ch, q2) == 2


# ----------------------------------------------------------------------- consumers
def test_basic_cancel_stops_delivery(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    c = Consumer(ch, q, auto_ack=True)
    ch.basic_publish("", q, b"before")
    assert c.get().body == b"before"
    c.cancel()
    ch.basic_publish("", q, b"after")
    assert get_message(ch, q).body == b"after", "after basic.cancel the message stays in the queue"
    assert not c.pending


def test_two_consumers_share_a_queue_round_robin(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    c1, c2 = Consumer(ch, q, auto_ack=True), Consumer(ch, q, auto_ack=True)
    for i in range(10):
        ch.basic_publish("", q, f"{i}".encode())
    pump(conn, lambda: len(c1.pending) + len(c2.pending) >= 10, TIMEOUT, "10 deliveries")
    b1 = [int(d.body) for d in c1.pending]
    b2 = [int(d.body) for d in c2.pending]
    assert sorted(b1 + b2) == list(range(10)), "each message to exactly one consumer"
    assert b1 and b2, "both consumers get messages"
    assert b1 == sorted(b1) and b2 == sorted(b2)


def test_queue_delete_cancels_consumer_with_notification(amqp, names):
    """consumer_cancel_notify: the broker sends basic.cancel when the queue goes."""
    conn = amqp()
    ch = conn.channel()
    assert conn._impl.server_capabilities.get("consumer_cancel_notify") is True
    q = declare(ch, names("q"))
    cancelled: list = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method))
    c = Consumer(ch, q)
    conn.channel().queue_delete(q)
    pump(conn, lambda: cancelled, TIMEOUT, "basic.cancel from the broker")
    assert cancelled[0].consumer_tag == c.tag


def test_exclusive_consumer_refuses_a_second_one_403(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    Consumer(ch, q, exclusive=True)
    other = amqp().channel()
    err = expect_channel_closed(lambda: other.basic_consume(q, lambda *a: None), 403, "ACCESS_REFUSED")
    assert err.reply_text == f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"


# ------------------------------------------------------------------------------ exchanges
def test_direct_exchange_routes_on_exact_key(amqp, names):
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "direct")
    q = declare(ch, names("q"))
    ch.queue_bind(q, x, "red")
    ch.queue_bind(q, x, "green")
    for key in ("red", "blue", "green", "Red", "red.x", ""):
        ch.basic_publish(x, key, key.encode() or b"<empty>")
    ch.basic_publish("", q, b"fence")
    got = Consumer(ch, q, auto_ack=True).collect_until(b"fence")
    assert [(d.routing_key, d.body, d.exchange) for d in got] == [("red", b"red", x), ("green", b"green", x)]


def test_fanout_exchange_copies_to_every_bound_queue(amqp, names):
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "fanout")
    q1, q2 = declare(ch, names("q1")), declare(ch, names("q2"))
    ch.queue_bind(q1, x, "ignored")
    ch.queue_bind(q2, x)
    ch.basic_publish(x, "any.key", b"to all")
    for q in (q1, q2):
        d = get_message(ch, q)
        assert (d.body, d.routing_key, d.exchange) == (b"to all", "any.key", x)


@pytest.mark.parametrize("pattern,matching,not_matching", [
    ("a.*.c", ["a.b.c", "a.xyz.c", "a..c"], ["a.b.b.c", "a.c", "a.b.c.d", "b.b.c"]),
    ("a.#", ["a", "a.b", "a.b.c.d"], ["b.a", "ab", "ab.c"]),
    ("#.c", ["c", "a.c", "a.b.c"], ["c.a", "ac"]),
    ("#", ["a", "a.b.c", ""], []),
    ("*", ["a", "xyz"], ["a.b"]),
    ("a.*.#", ["a.b", "a.b.c", "a.b.c.d"], ["a", "b.a.c"]),
    ("a.b.c", ["a.b.c"], ["a.b", "a.b.c.d", "a.b.C"]),
])
def test_topic_exchange_patterns(amqp, names, pattern, matching, not_matching):
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "topic")
    q = declare(ch, names("q"))
    ch.queue_bind(q, x, pattern)
    keys = [k for pair in zip(matching + [None] * len(not_matching), not_matching + [None] * len(matching))
            for k in pair if k is not None]
    for key in keys:
        ch.basic_publish(x, key, f"key={key}".encode())
    ch.basic_publish("", q, b"fence")  # same channel, same queue: arrives after all of them
    got = Consumer(ch, q, auto_ack=True).collect_until(b"fence")
    assert [d.routing_key for d in got] == [k for k in keys if k in matching]


def test_headers_exchange_all_and_any(amqp, names):
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "headers")
    q_all, q_any = declare(ch, names("all")), declare(ch, names("any"))
    ch.queue_bind(q_all, x, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(q_any, x, arguments={"x-match": "any", "format": "pdf", "type": "report"})
    cases = [
        ("both", {"format": "pdf", "type": "report"}),
        ("both+extra", {"format": "pdf", "type": "report", "lang": "en"}),
        ("format-only", {"format": "pdf"}),
        ("type-only", {"type": "report"}),
        ("wrong-value", {"format": "zip", "type": "log"}),
        ("none", None),
    ]
    for name, headers in cases:
        ch.basic_publish(x, "routing key is ignored", name.encode(), pika.BasicProperties(headers=headers))
    for q in (q_all, q_any):
        ch.basic_publish("", q, b"fence")
    got_all = [d.body for d in Consumer(ch, q_all, auto_ack=True).collect_until(b"fence")]
    got_any = [d.body for d in Consumer(ch, q_any, auto_ack=True).collect_until(b"fence")]
    assert got_all == [b"both", b"both+extra"]
    assert got_any == [b"both", b"both+extra", b"format-only", b"type-only"]


def test_headers_exchange_matches_typed_values(amqp, names):
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "headers")
    q = declare(ch, names("q"))
    ch.queue_bind(q, x, arguments={"x-match": "all", "n": 7, "flag": True})
    ch.basic_publish(x, "", b"match", pika.BasicProperties(headers={"n": 7, "flag": True}))
    ch.basic_publish(x, "", b"string 7", pika.BasicProperties(headers={"n": "7", "flag": True}))
    ch.basic_publish("", q, b"fence")
    assert [d.body for d in Consumer(ch, q, auto_ack=True).collect_until(b"fence")] == [b"match"]


def test_unbind_stops_routing(amqp, names):
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "direct")
    q = declare(ch, names("q"))
    ch.queue_bind(q, x, "k")
    ch.basic_publish(x, "k", b"bound")
    ch.queue_unbind(q, x, "k")
    ch.basic_publish(x, "k", b"unbound")
    ch.basic_publish("", q, b"fence")
    assert [d.body for d in Consumer(ch, q, auto_ack=True).collect_until(b"fence")] == [b"bound"]


def test_unbind_is_idempotent_for_missing_queue_or_exchange(amqp, names):
    """RabbitMQ answers queue.unbind / exchange.unbind with unbind-ok when the queue or
    exchange is gone (aio-pika's RPC unbinds its auto-delete result queue after
    cancelling its consumer, which deleted the queue)."""
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "direct")
    q = ch.queue_declare(names("q"), auto_delete=True).method.queue
    ch.queue_bind(q, x, "k")
    tag = ch.basic_consume(q, lambda *a: None, auto_ack=True)
    ch.basic_cancel(tag)  # last consumer gone: the auto-delete queue is deleted
    ch.queue_unbind(q, x, "k")
    with pytest.raises(pex.ChannelClosedByBroker) as e:
        ch.queue_declare(q, passive=True)
    assert e.value.reply_code == 404
    ch = conn.channel()
    other = declare(ch, names("q"))
    ch.queue_unbind(other, names("missing-x"), "k")
    ch.exchange_unbind(x, names("missing-x"), "k")
    ch.exchange_unbind(names("missing-x"), x, "k")


def test_deletes_and_unbind_of_missing_things_answer_ok(amqp, names):
    """RabbitMQ answers queue.delete / exchange.delete of a missing queue or exchange,
    and queue.unbind of a binding that does not exist, with their -ok (kombu and the
    suite's own cleanup delete without checking)."""
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "headers")
    q = declare(ch, names("q"))
    ch.queue_unbind(q, x, "", arguments={"x-match": "any", "k": "v"})  # no such binding
    ch.queue_unbind(names("missing-q"), x, "")  # no such queue
    assert ch.queue_delete(names("missing-q")).method.message_count == 0
    ch.exchange_delete(names("missing-x"))
    assert ch.is_open


def test_redeclare_with_other_attributes_is_406(amqp, names):
    conn = amqp()
    ch = conn.channel()
    x = names("x")
    ch.exchange_declare(x, "direct")
    err = expect_channel_closed(lambda: ch.exchange_declare(x, "fanout"), 406, "PRECONDITION_FAILED")
    assert err.reply_text == (f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{x}' in vhost '/': "
                              "received 'fanout' but current is 'direct'")
    ch = conn.channel()
    q = declare(ch, names("q"), arguments={"x-message-ttl": 1000})
    err = expect_channel_closed(lambda: ch.queue_declare(q, arguments={"x-message-ttl": 2000}), 406,
                                "PRECONDITION_FAILED")
    assert "inequivalent arg 'x-message-ttl'" in err.reply_text
    ch = conn.channel()
    err = expect_channel_closed(lambda: ch.queue_declare(q, durable=True, arguments={"x-message-ttl": 1000}),
                                406, "PRECONDITION_FAILED")
    assert "inequivalent arg 'durable'" in err.reply_text
    ch = conn.channel()
    assert declare(ch, q, arguments={"x-message-ttl": 1000}) == q, "an identical redeclare is fine"


def test_reserved_amq_prefix_is_refused_403(amqp):
    ch = amqp().channel()
    err = expect_channel_closed(lambda: ch.queue_declare("amq.interop"), 403, "ACCESS_REFUSED")
    assert err.reply_text == "ACCESS_REFUSED - queue name 'amq.interop' contains reserved prefix 'amq.*'"


# -------------------------------------------------------------------------------- queues
def test_server_named_queue(amqp):
    conn = amqp()
    ch = conn.channel()
    ok = ch.queue_declare("", exclusive=True).method
    assert ok.queue and (ok.message_count, ok.consumer_count) == (0, 0)
    ch.basic_publish("", ok.queue, b"to a server-named queue")
    assert get_message(ch, ok.queue).body == b"to a server-named queue"


@pytest.mark.rabbitmq_specific(reason="RabbitMQ names server-named queues amq.gen-<base64>; any unique name "
                                      "satisfies the spec")
def test_server_named_queue_prefix(amqp):
    assert amqp().channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


def test_passive_declare_reports_counts(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    for i in range(3):
        ch.basic_publish("", q, b"m")
    Consumer(conn.channel(), q, auto_ack=False)
    # The consumer takes the messages (unacked: no longer "ready"); wait for that.
    pump(conn, lambda: ch.queue_declare(q, passive=True).method.consumer_count == 1
         and message_count(ch, q) == 0, TIMEOUT, "consumer_count=1, message_count=0")
    ok = ch.queue_declare(q, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (q, 0, 1)


def test_passive_declare_of_missing_queue_closes_channel_404(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = names("missing")
    err = expect_channel_closed(lambda: ch.queue_declare(q, passive=True), 404, "NOT_FOUND")
    assert err.reply_text == f"NOT_FOUND - no queue '{q}' in vhost '/'"
    assert ch.is_closed
    with pytest.raises(pex.ChannelWrongStateError):
        ch.basic_publish("", "x", b"on a closed channel")
    assert conn.is_open, "a channel error leaves the connection open"
    ch2 = conn.channel()
    assert ch2.channel_number != 0
    x = names("x")
    err = expect_channel_closed(lambda: ch2.exchange_declare(x, "direct", passive=True), 404, "NOT_FOUND")
    assert err.reply_text == f"NOT_FOUND - no exchange '{x}' in vhost '/'"


def test_exclusive_queue_is_locked_for_other_connections_405(amqp, names):
    owner = amqp()
    och = owner.channel()
    q = declare(och, names("excl"), exclusive=True)
    other = amqp()
    # RabbitMQ's full text goes on "It could be originally declared on another connection
    # or the exclusive property value does not match that of the original declaration.",
    # cut to the 255 bytes of a short string and ended with "..." when it does not fit.
    locked = f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'."
    for attempt in (lambda ch: ch.queue_declare(q, exclusive=True),
                    lambda ch: ch.queue_declare(q),
                    lambda ch: ch.basic_consume(q, lambda *a: None),
                    lambda ch: ch.basic_get(q)):
        ch = other.channel()
        err = expect_channel_closed(lambda: attempt(ch), 405, "RESOURCE_LOCKED")
        assert err.reply_text.startswith(locked) and len(err.reply_text.encode()) <= 255, err.reply_text
    assert other.is_open
    # The owner itself uses it normally, on any of its channels.
    och2 = owner.channel()
    och2.basic_publish("", q, b"mine")
    assert get_message(och2, q).body == b"mine"


def test_exclusive_queue_deleted_when_owner_closes(amqp, names):
    owner = amqp()
    q = declare(owner.channel(), names("excl"), exclusive=True)
    owner.close()
    other = amqp()

    def gone():
        ch = other.channel()
        try:
            ch.queue_declare(q, passive=True)
        except pex.ChannelClosedByBroker as e:
            return e.reply_code == 404
        ch.close()
        return False

    pump(other, gone, TIMEOUT, f"exclusive queue {q} deleted after its connection closed")


def test_auto_delete_queue_deleted_after_last_consumer_cancels(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("ad"), auto_delete=True)
    c1, c2 = Consumer(ch, q), Consumer(ch, q)
    c1.cancel()
    assert ch.queue_declare(q, passive=True).method.consumer_count == 1, "still there with one consumer left"
    c2.cancel()
    other = conn.channel()
    err = expect_channel_closed(lambda: other.queue_declare(q, passive=True), 404, "NOT_FOUND")
    assert q in err.reply_text


def test_purge_and_delete_report_counts(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    for _ in range(4):
        ch.basic_publish("", q, b"m")
    pump(conn, lambda: message_count(ch, q) == 4, TIMEOUT, "4 messages in the queue")
    assert ch.queue_purge(q).method.message_count == 4
    ch.basic_publish("", q, b"left")
    pump(conn, lambda: message_count(ch, q) == 1, TIMEOUT, "1 message in the queue")
    assert ch.queue_delete(q).method.message_count == 1


def test_transactions_commit_and_rollback(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"))
    ch.tx_select()
    ch.basic_publish("", q, b"rolled back")
    assert message_count(ch, q) == 0, "not visible before commit"
    ch.tx_rollback()
    ch.basic_publish("", q, b"committed")
    ch.tx_commit()
    assert message_count(ch, q) == 1
    assert get_message(ch, q).body == b"committed"


# ---------------------------------------------------------------- queue arguments / DLX
def dlx_setup(ch, names, **queue_args):
    """A work queue dead-lettering to exchange dlx (direct) with key 'dead', and the
    dead-letter queue bound to it.  Returns (work queue, dead-letter queue, dlx)."""
    dlx = names("dlx")
    ch.exchange_declare(dlx, "direct")
    dlq = declare(ch, names("dlq"))
    ch.queue_bind(dlq, dlx, "dead")
    args = {"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead", **queue_args}
    q = declare(ch, names("work"), arguments=args)
    return q, dlq, dlx


def check_x_death(d: Delivery, queue: str, reason: str, count: int = 1, routing_keys=None) -> dict:
    """x-death as RabbitMQ 3.10 writes it: a list of tables, the most recent first,
    one per (queue, reason), each {count, reason, queue, time, exchange,
    routing-keys[, original-expiration]}; plus x-first-death-{exchange,queue,reason}."""
    deaths = d.headers["x-death"]
    assert isinstance(deaths, list) and deaths, d.headers
    last = deaths[0]
    assert last["queue"] == queue
    assert last["reason"] == reason
    assert last["count"] == count
    assert last["exchange"] == ""  # published through the default exchange
    assert last["routing-keys"] == (routing_keys or [queue])
    assert isinstance(last["time"], datetime.datetime)
    assert abs(last["time"].timestamp() - time.time()) < 120
    return last


def test_dead_letter_on_reject_with_x_death(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q, dlq, dlx = dlx_setup(ch, names)
    ch.basic_publish("", q, b"poison", pika.BasicProperties(headers={"app": "h"}, message_id="m-1",
                                                             delivery_mode=2))
    c = Consumer(ch, q)
    ch.basic_reject(c.get().delivery_tag, requeue=False)
    d = get_message(ch, dlq)
    assert (d.body, d.exchange, d.routing_key) == (b"poison", dlx, "dead")
    assert d.properties.message_id == "m-1" and d.properties.delivery_mode == 2
    assert d.headers["app"] == "h", "the message's own headers are kept"
    last = check_x_death(d, q, "rejected")
    assert set(last) == {"count", "reason", "queue", "time", "exchange", "routing-keys"}
    assert d.headers["x-first-death-queue"] == q
    assert d.headers["x-first-death-reason"] == "rejected"
    assert d.headers["x-first-death-exchange"] == ""


def test_dead_letter_on_nack_keeps_original_routing_key_without_dlrk(amqp, names):
    """Without x-dead-letter-routing-key the message keeps its routing key(s)."""
    conn = amqp()
    ch = conn.channel()
    dlx = names("dlx")
    ch.exchange_declare(dlx, "topic")
    dlq = declare(ch, names("dlq"))
    ch.queue_bind(dlq, dlx, "#")
    x = names("x")
    ch.exchange_declare(x, "direct")
    q = declare(ch, names("work"), arguments={"x-dead-letter-exchange": dlx})
    ch.queue_bind(q, x, "orders.eu")
    ch.basic_publish(x, "orders.eu", b"n")
    c = Consumer(ch, q)
    ch.basic_nack(c.get().delivery_tag, requeue=False)
    d = get_message(ch, dlq)
    assert (d.exchange, d.routing_key) == (dlx, "orders.eu")
    death = d.headers["x-death"][0]
    assert (death["exchange"], death["routing-keys"], death["reason"]) == (x, ["orders.eu"], "rejected")


def test_queue_message_ttl_dead_letters_expired(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q, dlq, dlx = dlx_setup(ch, names, **{"x-message-ttl": 100})
    ch.basic_publish("", q, b"short-lived")
    # The expiry is observed as the dead-lettered copy arriving (an event), not by sleeping.
    d = Consumer(ch, dlq, auto_ack=True).get(timeout=TIMEOUT)
    assert d.body == b"short-lived"
    check_x_death(d, q, "expired")
    assert "original-expiration" not in d.headers["x-death"][0]
    assert message_count(ch, q) == 0


def test_per_message_expiration_dead_letters_with_original_expiration(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q, dlq, dlx = dlx_setup(ch, names)
    ch.basic_publish("", q, b"expires", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", q, b"stays")
    d = Consumer(ch, dlq, auto_ack=True).get()
    assert d.body == b"expires"
    death = check_x_death(d, q, "expired")
    assert death["original-expiration"] == "50"
    assert d.properties.expiration is None, "the expiration property is removed from the dead-lettered copy"
    assert get_message(ch, q).body == b"stays"


def test_message_ttl_without_dlx_just_drops(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"), arguments={"x-message-ttl": 100})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"gone")  # confirmed: the queue has taken it
    # Nobody consumes: after 100 ms the message is dropped (no dead-letter exchange).
    # Observed as the queue's own count reaching 0, polled with a bound; a consumer
    # attached afterwards gets nothing before the fence.
    pump(conn, lambda: message_count(ch, q) == 0, TIMEOUT, "the expired message to leave the queue")
    c = Consumer(ch, q, auto_ack=True)
    ch.basic_publish("", q, b"fence")  # delivered at once to the consumer: does not expire
    assert c.collect_until(b"fence") == []


def test_message_ttl_zero_delivers_only_to_a_waiting_consumer(amqp, names):
    """x-message-ttl 0: a message expires on arrival unless a consumer can take it at
    once (RabbitMQ's documented replacement for basic.publish immediate)."""
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"), arguments={"x-message-ttl": 0})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"nobody waits")
    pump(conn, lambda: message_count(ch, q) == 0, TIMEOUT, "the TTL-0 message to be dropped")
    c = Consumer(ch, q, auto_ack=True)
    ch.basic_publish("", q, b"fence")
    assert c.collect_until(b"fence") == []


def test_max_length_drops_head_and_dead_letters_it(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q, dlq, dlx = dlx_setup(ch, names, **{"x-max-length": 2})
    for i in range(3):
        ch.basic_publish("", q, f"m{i}".encode())
    d = get_message(ch, dlq)
    assert d.body == b"m0", "overflow drop-head: the oldest message goes"
    check_x_death(d, q, "maxlen")
    assert [get_message(ch, q).body for _ in range(2)] == [b"m1", b"m2"]
    assert ch.basic_get(q) == (None, None, None)


def test_max_length_reject_publish_nacks_with_confirms(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"), arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"fits")
    with pytest.raises(pex.NackError):
        ch.basic_publish("", q, b"overflows")
    assert get_message(ch, q).body == b"fits"
    ch.basic_publish("", q, b"room again")


def test_max_length_bytes(amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = declare(ch, names("q"), arguments={"x-max-length-bytes": 10})
    for body in (b"12345", b"67890", b"abcde"):
        ch.basic_publish("", q, body)
    pump(conn, lambda: message_count(ch, q) == 2, TIMEOUT, "2 messages (10 bytes) left")
    assert [get_message(ch, q).body for _ in range(2)] == [b"67890", b"abcde"]


def test_x_death_count_grows_on_a_dead_letter_cycle(amqp, names):
    """A → (reject) → B → (reject) → A → (reject) → B: the entry for (A, rejected)
    is counted twice and moved to the front."""
    conn = amqp()
    ch = conn.channel()
    xa, xb = names("xa"), names("xb")
    ch.exchange_declare(xa, "fanout")
    ch.exchange_declare(xb, "fanout")
    qa = declare(ch, names("qa"), arguments={"x-dead-letter-exchange": xb})
    qb = declare(ch, names("qb"), arguments={"x-dead-letter-exchange": xa})
    ch.queue_bind(qa, xa)
    ch.queue_bind(qb, xb)
    ch.basic_publish("", qa, b"cycle")
    ca, cb = Consumer(ch, qa), Consumer(ch, qb)
    ch.basic_reject(ca.get().delivery_tag, requeue=False)
    ch.basic_reject(cb.get().delivery_tag, requeue=False)
    ch.basic_reject(ca.get().delivery_tag, requeue=False)
    d = cb.get()
    deaths = d.headers["x-death"]
    assert [(e["queue"], e["reason"], e["count"]) for e in deaths] == [(qa, "rejected", 2), (qb, "rejected", 1)]
    assert d.headers["x-first-death-queue"] == qa


# ------------------------------------------------------------------------ authentication
@pytest.mark.parametrize("user,password", [("guest", "wrong"), ("nobody", "guest")])
def test_wrong_credentials_are_refused(amqp, user, password):
    with pytest.raises((pex.ProbableAuthenticationError, pex.AuthenticationError)) as ei:
        amqp(user=user, password=password)
    # RabbitMQ announces authentication_failure_close and closes with 403.
    assert "403" in str(ei.value) and "ACCESS_REFUSED" in str(ei.value), ei.value
    assert "Login was refused using authentication mechanism PLAIN" in str(ei.value)


def test_unknown_vhost_is_refused_530(amqp):
    with pytest.raises(pex.ProbableAccessDeniedError) as ei:
        amqp(vhost="no-such-vhost")
    assert "530" in str(ei.value) and "NOT_ALLOWED - vhost no-such-vhost not found" in str(ei.value)


def test_server_properties_and_capabilities(amqp):
    conn = amqp()
    caps = conn._impl.server_capabilities
    # What pika, kombu and aio-pika look at.
    for cap in ("publisher_confirms", "basic.nack", "consumer_cancel_notify", "exchange_exchange_bindings",
                "authentication_failure_close", "per_consumer_qos"):
        assert caps.get(cap) is True, cap
    assert conn._impl.server_properties.get("product")


# ---------------------------------------------------------------------------- heartbeats
def test_heartbeat_negotiated_and_connection_kept_alive(amqp, names):
    conn = amqp(heartbeat=1)
    assert conn._impl.params.heartbeat == 1, "the client's heartbeat (1 s) is what Tune-Ok settles on"
    ch = conn.channel()
    q = declare(ch, names("q"))
    # Time passing is the thing under test: 3 s idle = 3 heartbeat intervals, during
    # which pika's I/O loop sends heartbeats (connection.sleep keeps it running).
    conn.sleep(3)
    assert conn.is_open
    ch.basic_publish("", q, b"still alive")
    assert get_message(ch, q).body == b"still alive"


def test_silent_client_gets_heartbeats_then_is_disconnected(broker, amqp_addr):
    """A raw client negotiates a 1 s heartbeat and then sends nothing: the broker
    sends heartbeat frames, and closes the connection when it misses the client's
    (RabbitMQ: after two intervals without traffic; it just closes the socket)."""
    raw = RawAmqp(*amqp_addr)
    try:
        tune = raw.handshake(heartbeat=1)
        assert tune["heartbeat"] > 0 and tune["frame_max"] >= 4096
        t0 = time.monotonic()
        heartbeats = 0
        closed_by = None
        while time.monotonic() - t0 < 15:
            try:
                f = raw.read_frame(timeout=15 - (time.monotonic() - t0))
            except Closed as e:
                closed_by = f"socket closed ({e})"
                break
            if f.type == FRAME_HEARTBEAT:
                assert f.channel == 0 and f.payload == b""
                heartbeats += 1
            elif f.method == CONNECTION_CLOSE:
                closed_by = f"connection.close {f.close_reply()}"
                break
        elapsed = time.monotonic() - t0
        assert closed_by is not None, "the broker kept a silent client connected for 15 s with a 1 s heartbeat"
        assert heartbeats >= 1, "the broker sent no heartbeat before closing"
        assert 1.0 <= elapsed <= 10, f"closed after {elapsed:.1f}s ({closed_by})"
    finally:
        raw.close()


# ----------------------------------------------------------------------- persistence
@pytest.mark.persistence
def test_durable_queue_and_persistent_messages_survive_restart(broker, amqp, names):
    conn = amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    durable = declare(ch, names("durable"), durable=True)
    transient_q = declare(ch, names("transient"))
    x = names("x")
    ch.exchange_declare(x, "direct", durable=True)
    ch.queue_bind(durable, x, "k")
    ch.basic_publish("", durable, b"persistent", pika.BasicProperties(delivery_mode=2, message_id="p1"))
    ch.basic_publish("", durable, b"transient", pika.BasicProperties(delivery_mode=1))
    ch.basic_publish("", transient_q, b"in a transient queue", pika.BasicProperties(delivery_mode=2))
    conn.close()
    addr = broker.amqp_addr
    broker.restart()
    assert broker.amqp_addr == addr, "a restarted broker listens on the same AMQP address"
    conn = amqp()
    ch = conn.channel()
    d = get_message(ch, durable)
    assert (d.body, d.properties.message_id, d.properties.delivery_mode) == (b"persistent", "p1", 2)
    assert ch.basic_get(durable) == (None, None, None), "a transient message does not survive a restart"
    ch.basic_publish(x, "k", b"binding survived")
    assert get_message(ch, durable).body == b"binding survived"
    err = expect_channel_closed(lambda: ch.queue_declare(transient_q, passive=True), 404, "NOT_FOUND")
    assert transient_q in err.reply_text


# ------------------------------------------------------------------- SelectConnection
def test_select_connection_publish_consume_with_confirms(amqp_addr, amqp, names):
    """The callback-style adapter: open, channel, confirm.select, declare, consume,
    publish 20 persistent messages, collect 20 basic.ack confirms and 20 deliveries,
    close.  Bounded by an ioloop timer."""
    q = names("q")
    n = 20
    state = {"acks": set(), "nacks": 0, "delivered": [], "error": None, "closed": False}

    def fail(msg):
        state["error"] = msg
        conn.ioloop.stop()

    def on_open(c):
        c.channel(on_open_callback=on_channel)

    def on_channel(ch):
        state["ch"] = ch
        ch.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _f: ch.queue_declare(
            q, durable=True, callback=on_declared))

    def on_confirm(frame):
        m = frame.method
        tags = range(1, m.delivery_tag + 1) if m.multiple else [m.delivery_tag]
        if m.NAME == "Basic.Ack":
            state["acks"].update(tags)
        else:
            state["nacks"] += 1
        maybe_done()

    def on_declared(_frame):
        ch = state["ch"]
        ch.basic_consume(q, on_message, callback=lambda _f: publish_all(ch))

    def publish_all(ch):
        for i in range(n):
            ch.basic_publish("", q, f"s{i}".encode(), pika.BasicProperties(delivery_mode=2))

    def on_message(ch, method, props, body):
        state["delivered"].append(body)
        ch.basic_ack(method.delivery_tag)
        maybe_done()

    def maybe_done():
        if len(state["acks"]) == n and len(state["delivered"]) == n and not state["closed"]:
            state["closed"] = True
            conn.close()

    conn = pika.SelectConnection(
        amqp.params(), on_open_callback=on_open,
        on_open_error_callback=lambda _c, e: fail(f"open failed: {e!r}"),
        on_close_callback=lambda _c, reason: conn.ioloop.stop(),
    )
    timer = conn.ioloop.call_later(TIMEOUT, lambda: fail(f"timed out: {len(state['acks'])} confirms, "
                                                         f"{len(state['delivered'])} deliveries"))
    conn.ioloop.start()
    conn.ioloop.remove_timeout(timer)
    assert state["error"] is None, state["error"]
    assert state["acks"] == set(range(1, n + 1)) and state["nacks"] == 0
    assert state["delivered"] == [f"s{i}".encode() for i in range(n)]
    ch = amqp().channel()
    assert message_count(ch, q) == 0
