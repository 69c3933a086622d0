"""Ordered partitions and tag filters with pika and paho-mqtt 5: the
``x-consistent-hash`` exchange (the RabbitMQ plugin's convention: binding key = weight,
``hash-header`` / ``hash-property``), ``x-tag-filter`` bindings,
the MQTT 5 ``tag`` / ``tag-filter`` user properties, across the gateway and across a
restart.  Tag filters are a FerryMQ extension; RabbitMQ 3.10 has the consistent-hash
exchange only as a plugin, so every test here is ``ferrymq_only``."""

from __future__ import annotations

import time

import pika
import pika.exceptions as pex
import pytest

from amqpclient import Consumer
from mqttclient import V5, publish_props, subscribe_props

pytestmark = [pytest.mark.amqp, pytest.mark.ferrymq_only(reason="x-consistent-hash plugin / tag filters")]


def drain(ch, q: str) -> list[bytes]:
    out = []
    while True:
        method, _props, body = ch.basic_get(q, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def placement(ch, queues: list[str]) -> dict[bytes, int]:
    at: dict[bytes, int] = {}
    for i, q in enumerate(queues):
        for body in drain(ch, q):
            assert body not in at, f"{body!r} reached two queues"
            at[body] = i
    return at


def test_pika_consistent_hash_keeps_keys_on_one_queue_and_refuses_bad_weights(amqp, names):
    conn = amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    x = names("chx")
    ch.exchange_declare(x, "x-consistent-hash")
    queues = []
    for w in ("1", "1", "2"):
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, x, routing_key=w)
        queues.append(q)
    for seq in range(2):
        for k in range(200):
            ch.basic_publish(x, f"user-{k}", f"user-{k}:{seq}".encode())
    at = placement(ch, queues)
    assert len(at) == 400
    assert all(at[f"user-{k}:0".encode()] == at[f"user-{k}:1".encode()] for k in range(200))
    counts = [sum(1 for i in at.values() if i == n) for n in range(3)]
    assert all(c > 0 for c in counts), counts
    assert counts[2] > max(counts[0], counts[1]), f"weight 2 gets the largest share: {counts}"
    with pytest.raises(pex.ChannelClosedByBroker) as ei:
        ch.queue_bind(queues[0], x, routing_key="heavy")
    assert ei.value.reply_code == 406
    assert "must be an integer" in ei.value.reply_text
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as ei:
        ch.exchange_declare(names("chx"), "x-consistent-hash",
                            arguments={"hash-header": "h", "hash-property": "message_id"})
    assert ei.value.reply_code == 406


def test_pika_hash_property_correlation_id_and_missing_property_is_returned(amqp, names):
    conn = amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    x = names("chx")
    ch.exchange_declare(x, "x-consistent-hash", arguments={"hash-property": "correlation_id"})
    queues = []
    for _ in range(2):
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, x, routing_key="1")
        queues.append(q)
    for k in range(40):
        for seq in range(2):
            ch.basic_publish(x, f"rk-{seq}", f"c{k}:{seq}".encode(), pika.BasicProperties(correlation_id=f"c{k}"))
    at = placement(ch, queues)
    assert len(at) == 80
    assert all(at[f"c{k}:0".encode()] == at[f"c{k}:1".encode()] for k in range(40))
    with pytest.raises(pex.UnroutableError):
        ch.basic_publish(x, "rk", b"no correlation id", mandatory=True)


def test_pika_tag_filter_binding(amqp, names):
    ch = amqp().channel()
    ch.confirm_delivery()
    x = names("x")
    ch.exchange_declare(x, "topic")
    want = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(want, x, "orders.#", arguments={"x-tag-filter": "paid || refunded"})
    every = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(every, x, "orders.#", arguments={"x-tag-filter": "*"})
    for body, tag in ((b"new", "created"), (b"paid", "paid"), (b"none", None), (b"refund", "refunded"), (b"PAID", "Paid")):
        headers = {"x-tag": tag} if tag else None
        ch.basic_publish(x, "orders.eu", body, pika.BasicProperties(headers=headers))
    assert drain(ch, want) == [b"paid", b"refund"]
    assert drain(ch, every) == [b"new", b"paid", b"none", b"refund", b"PAID"]
    with pytest.raises(pex.ChannelClosedByBroker) as ei:
        ch.queue_bind(want, x, "orders.#", arguments={"x-tag-filter": "paid || "})
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-tag-filter'")


def test_paho_v5_tag_filter_subscription(mqtt, topic):
    sub = mqtt(version=V5)
    assert sub.subscribe(f"{topic}/#", qos=1, properties=subscribe_props(UserProperty=[("tag-filter", "TagA || TagB")])) == [1]
    pub = mqtt(version=V5)
    for body, tag in ((b"a", "TagA"), (b"c", "TagC"), (b"plain", None), (b"b", "TagB")):
        p = publish_props(UserProperty=[("tag", tag)]) if tag else None
        pub.publish(f"{topic}/x", body, qos=1, properties=p)
    got = sub.expect(2)
    assert [m.payload for m in got] == [b"a", b"b"]
    assert ("tag", "TagA") in got[0].user_properties
    sub.assert_no_message()
    bad = mqtt(version=V5)
    assert bad.subscribe(f"{topic}/#", qos=1, properties=subscribe_props(UserProperty=[("tag-filter", "")])) == [0x83]


def test_paho_v5_shared_subscription_with_a_tag_filter(mqtt, topic):
    share = f"$share/alarms/{topic}/#"
    members = [mqtt(version=V5) for _ in range(2)]
    for m in members:
        assert m.subscribe(share, qos=1, properties=subscribe_props(UserProperty=[("tag-filter", "alarm || fault")])) == [1]
    other = mqtt(version=V5)
    assert other.subscribe(share, qos=1, properties=subscribe_props(UserProperty=[("tag-filter", "telemetry")])) == [0x83]
    pub = mqtt(version=V5)
    for i, tag in enumerate(["alarm", "telemetry", "fault", None, "alarm", "fault"]):
        p = publish_props(UserProperty=[("tag", tag)]) if tag else None
        pub.publish(f"{topic}/line{i}", f"m{i}-{tag}".encode(), qos=1, properties=p)
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 4 and time.monotonic() < deadline:
        for m in members:
            got.extend(m.drain(quiet=0.05))
    assert sorted(x.payload for x in got) == [b"m0-alarm", b"m2-fault", b"m4-alarm", b"m5-fault"]
    for m in members:
        m.assert_no_message(quiet=0.3)


def test_mqtt_tag_to_amqp_tag_filter_binding(mqtt, amqp, topic):
    ch = amqp().channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", topic.replace("/", ".") + ".#", arguments={"x-tag-filter": "alarm"})
    consumer = Consumer(ch, q, auto_ack=True)
    pub = mqtt(version=V5)
    pub.publish(f"{topic}/line1", b"reading", qos=1, properties=publish_props(UserProperty=[("tag", "telemetry")]))
    pub.publish(f"{topic}/line1", b"overheat", qos=1, properties=publish_props(UserProperty=[("tag", "alarm")]))
    d = consumer.get()
    assert d.body == b"overheat"
    assert d.headers.get("x-tag") in ("alarm", b"alarm")
    consumer.assert_none()


@pytest.mark.persistence
def test_durable_hash_exchange_and_tag_filter_binding_survive_restart(broker, amqp, names):
    x, parts, urgent = names("chx"), [names("part") for _ in range(3)], names("urgent")
    ch = amqp().channel()
    ch.confirm_delivery()
    ch.exchange_declare(x, "x-consistent-hash", durable=True)
    for q in parts:
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, x, "1")
    ch.queue_declare(urgent, durable=True)
    ch.queue_bind(urgent, "amq.topic", "alerts.#", arguments={"x-tag-filter": "urgent"})
    keys = [f"k{i}" for i in range(60)]
    for k in keys:
        ch.basic_publish(x, k, k.encode(), pika.BasicProperties(delivery_mode=2))
    before = placement(ch, parts)
    broker.restart()
    ch = amqp().channel()
    ch.confirm_delivery()
    for k in keys:
        ch.basic_publish(x, k, k.encode(), pika.BasicProperties(delivery_mode=2))
    assert placement(ch, parts) == before, "same key, same queue after the restart"
    for body, tag in ((b"u", "urgent"), (b"n", "normal")):
        ch.basic_publish("amq.topic", "alerts.disk", body, pika.BasicProperties(headers={"x-tag": tag}))
    assert drain(ch, urgent) == [b"u"]
