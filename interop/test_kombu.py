"""AMQP 0-9-1 with kombu 5 (Celery's messaging layer) over its ``amqp://``
transport (py-amqp): SimpleQueue, Producer / Consumer with Exchange + Queue +
routing key, serializers, compression, message properties and headers, queue
options kombu turns into x-arguments."""

from __future__ import annotations

import json
import time
import zlib

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

from amqpclient import TIMEOUT, get_message

pytestmark = pytest.mark.amqp


@pytest.fixture
def kombu_conn(amqp_url):
    conns: list[Connection] = []

    def make() -> Connection:
        c = Connection(amqp_url, connect_timeout=5, heartbeat=0)
        c.ensure_connection(max_retries=1)
        conns.append(c)
        return c

    yield make
    for c in conns:
        c.release()


def drain_until(conn: Connection, pred, timeout: float = TIMEOUT, what: str = "messages"):
    """conn.drain_events until pred() is true, bounded."""
    deadline = time.monotonic() + timeout
    while not pred():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {what} within {timeout}s")
        try:
            conn.drain_events(timeout=min(left, 0.2))
        except TimeoutError:
            pass


# ------------------------------------------------------------------------- SimpleQueue
def test_simple_queue_put_get(kombu_conn, names):
    conn = kombu_conn()
    q = conn.SimpleQueue(names("simple"))
    try:
        q.put({"hello": "world", "n": [1, 2, 3]})
        q.put("second")
        m = q.get(block=True, timeout=TIMEOUT)
        assert m.payload == {"hello": "world", "n": [1, 2, 3]}
        assert m.content_type == "application/json"
        m.ack()
        m2 = q.get(block=True, timeout=TIMEOUT)
        assert m2.payload == "second"
        m2.ack()
        with pytest.raises(q.Empty):
            q.get_nowait()
    finally:
        q.close()


def test_simple_queue_qsize_and_clear(kombu_conn, names):
    conn = kombu_conn()
    q = conn.SimpleQueue(names("simple"))
    try:
        for i in range(3):
            q.put(i)
        # qsize() is a passive queue.declare (message_count); routing into the queue
        # may complete after the publish returns, so poll it, bounded.
        deadline = time.monotonic() + TIMEOUT
        while q.qsize() != 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert q.qsize() == 3
        assert q.clear() == 3
        assert q.qsize() == 0
    finally:
        q.close()


def test_simple_queue_unacked_message_comes_back(kombu_conn, names):
    name = names("simple")
    conn = kombu_conn()
    q = conn.SimpleQueue(name)
    q.put("once")
    m = q.get(block=True, timeout=TIMEOUT)
    assert m.payload == "once" and m.delivery_info["redelivered"] is False
    q.close()
    conn.release()  # unacked on a closed connection: requeued
    conn2 = kombu_conn()
    q2 = conn2.SimpleQueue(name)
    try:
        again = q2.get(block=True, timeout=TIMEOUT)
        assert again.payload == "once" and again.delivery_info["redelivered"] is True
        again.ack()
    finally:
        q2.close()


# ---------------------------------------------------------------- Producer / Consumer
def test_producer_consumer_with_exchange_queue_and_routing_key(kombu_conn, names):
    conn = kombu_conn()
    exchange = Exchange(names("x"), type="direct", durable=False)
    queue = Queue(names("q"), exchange=exchange, routing_key="orders.created", durable=False)
    other = Queue(names("other"), exchange=exchange, routing_key="orders.deleted", durable=False)
    got: list = []
    with Consumer(conn, [queue], callbacks=[lambda body, msg: (got.append((body, msg)), msg.ack())]):
        producer = Producer(conn)
        producer.publish({"id": 1}, exchange=exchange, routing_key="orders.created", declare=[queue, other])
        producer.publish({"id": 2}, exchange=exchange, routing_key="orders.deleted")
        producer.publish({"id": 3}, exchange=exchange, routing_key="orders.created")
        drain_until(conn, lambda: len(got) >= 2)
    assert [b for b, _ in got] == [{"id": 1}, {"id": 3}]
    body, msg = got[0]
    assert msg.delivery_info["exchange"] == exchange.name
    assert msg.delivery_info["routing_key"] == "orders.created"
    # The other key went to the other queue only.
    with conn.SimpleQueue(other.name, no_ack=True, queue_opts={"durable": False},
                          exchange_opts={"type": "direct", "durable": False}) as sq:
        assert sq.get(timeout=TIMEOUT).payload == {"id": 2}


def test_message_properties_and_headers_round_trip(kombu_conn, names):
    conn = kombu_conn()
    exchange = Exchange(names("x"), type="topic", durable=False)
    queue = Queue(names("q"), exchange=exchange, routing_key="events.#", durable=False)
    headers = {"trace-id": "abc123", "attempt": 3, "urgent": True, "tags": ["a", "b"], "meta": {"k": "v"}}
    got: list = []
    with Consumer(conn, [queue], callbacks=[lambda body, msg: (got.append((body, msg)), msg.ack())]):
        Producer(conn).publish(
            {"payload": "ü"}, exchange=exchange, routing_key="events.user.login", declare=[queue],
            headers=headers, correlation_id="corr-42", reply_to="replies", priority=7, delivery_mode=2,
            expiration=60, message_id="mid-1", type="login", app_id="interop-kombu",
        )
        drain_until(conn, lambda: got)
    body, msg = got[0]
    assert body == {"payload": "ü"}
    assert msg.headers == headers
    p = msg.properties
    assert p["correlation_id"] == "corr-42"
    assert p["reply_to"] == "replies"
    assert p["priority"] == 7
    assert p["delivery_mode"] == 2
    assert p["expiration"] == "60000", "kombu sends expiration in ms as a string"
    assert p["message_id"] == "mid-1"
    assert p["type"] == "login" and p["app_id"] == "interop-kombu"
    assert msg.content_type == "application/json" and msg.content_encoding == "utf-8"
    assert msg.delivery_info["routing_key"] == "events.user.login"


@pytest.mark.parametrize("serializer,body,content_type", [
    ("json", {"a": [1, 2.5, None, True]}, "application/json"),
    ("pickle", {"a": (1, 2), "s": {3}}, "application/x-python-serialize"),
    (None, b"\x00\x01raw bytes", "application/data"),
])
def test_serializers(kombu_conn, names, serializer, body, content_type):
    conn = kombu_conn()
    queue = Queue(names("q"), durable=False)
    got: list = []
    with Consumer(conn, [queue], callbacks=[lambda b, m: (got.append((b, m)), m.ack())],
                  accept=["json", "pickle", "application/data"]):
        Producer(conn).publish(body, routing_key=queue.name, serializer=serializer, declare=[queue])
        drain_until(conn, lambda: got)
    b, m = got[0]
    assert b == body
    assert m.content_type == content_type


def test_compression_header(kombu_conn, names):
    conn = kombu_conn()
    queue = Queue(names("q"), durable=False)
    got: list = []
    big = {"text": "x" * 10000}
    with Consumer(conn, [queue], callbacks=[lambda b, m: (got.append((b, m)), m.ack())]):
        Producer(conn).publish(big, routing_key=queue.name, compression="zlib", declare=[queue])
        drain_until(conn, lambda: got)
    b, m = got[0]
    assert b == big
    assert m.headers["compression"] == "application/x-gzip"


def test_kombu_publish_pika_consume(kombu_conn, amqp, names):
    """What kombu puts on the wire, seen by another client: a zlib-compressed JSON
    body with kombu's headers and properties."""
    conn = kombu_conn()
    queue = Queue(names("q"), durable=False)
    Producer(conn).publish({"k": "v" * 1000}, routing_key=queue.name, compression="zlib", declare=[queue],
                           headers={"h": 1}, correlation_id="c1")
    d = get_message(amqp().channel(), queue.name)
    assert json.loads(zlib.decompress(d.body)) == {"k": "v" * 1000}
    assert d.headers == {"h": 1, "compression": "application/x-gzip"}
    assert (d.properties.content_type, d.properties.content_encoding) == ("application/json", "utf-8")
    assert d.properties.correlation_id == "c1" and d.properties.delivery_mode == 2


def test_reject_and_requeue(kombu_conn, names):
    conn = kombu_conn()
    queue = Queue(names("q"), durable=False)
    seen: list = []

    def on_message(body, msg):
        seen.append((body, msg.delivery_info["redelivered"]))
        if len(seen) == 1:
            msg.requeue()
        elif len(seen) == 2:
            msg.reject()
        else:
            msg.ack()

    with Consumer(conn, [queue], callbacks=[on_message]):
        p = Producer(conn)
        p.publish("first", routing_key=queue.name, declare=[queue])
        drain_until(conn, lambda: len(seen) >= 2)
        p.publish("fence", routing_key=queue.name)
        drain_until(conn, lambda: len(seen) >= 3)
    assert seen == [("first", False), ("first", True), ("fence", False)]


def test_queue_options_become_x_arguments(kombu_conn, names):
    """kombu's Queue(max_length=..., message_ttl=...) declares x-max-length /
    x-message-ttl (seconds → ms); the broker enforces them."""
    conn = kombu_conn()
    queue = Queue(names("q"), durable=False, max_length=2, message_ttl=60)
    p = Producer(conn)
    for i in range(3):
        p.publish(i, routing_key=queue.name, declare=[queue])
    got: list = []
    with Consumer(conn, [queue], callbacks=[lambda b, m: (got.append(b), m.ack())]):
        p.publish("fence", routing_key=queue.name)
        drain_until(conn, lambda: "fence" in got)
    assert got == [1, 2, "fence"]


def test_prefetch_count(kombu_conn, names):
    conn = kombu_conn()
    queue = Queue(names("q"), durable=False)
    p = Producer(conn)
    for i in range(4):
        p.publish(i, routing_key=queue.name, declare=[queue])
    held: list = []
    with Consumer(conn, [queue], callbacks=[lambda b, m: held.append(m)], prefetch_count=2):
        drain_until(conn, lambda: len(held) >= 2)
        # A full prefetch window lets no fence through: a bounded quiet window.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.1)
            except TimeoutError:
                pass
        assert [m.payload for m in held] == [0, 1]
        held[0].ack()
        drain_until(conn, lambda: len(held) >= 3)
        assert held[2].payload == 2
        for m in held[1:]:
            m.ack()
        drain_until(conn, lambda: len(held) >= 4)
        held[3].ack()
