"""MQTT ⇄ AMQP 0-9-1 on one broker: paho-mqtt clients and pika clients see each
other's messages through the topic exchange ``amq.topic``.

The mapping checked (RabbitMQ's MQTT plugin defines it; FerryMQ follows it):
* an MQTT PUBLISH to topic ``a/b/c`` is an AMQP message published to
  ``amq.topic`` with routing key ``a.b.c``; an MQTT subscription ``x/+`` (``#``)
  is a binding ``x.*`` (``#``) of ``amq.topic``;
* MQTT QoS ≥ 1 ⇒ persistent (delivery_mode 2), QoS 0 ⇒ transient; a persistent
  AMQP message reaches a QoS 1 subscription at QoS 1.

RabbitMQ 3.10's MQTT plugin speaks MQTT 3.1.1 only, so the tests that run on both
brokers use MQTT 3.1.1; the MQTT 5 property mappings are ``ferrymq_only``:
* user properties ⇄ headers (AMQP values shown to MQTT as text: 42 → "42",
  True → "true"), content type ⇄ content_type, correlation data ⇄ correlation_id;
* response topic ⇄ reply_to, in routing-key form: Response Topic ``r/s`` is
  reply_to ``r.s``, and reply_to ``r.s`` is Response Topic ``r/s`` (a responder
  publishes its answer to ``amq.topic`` with routing key = reply_to).  This is
  FerryMQ's choice; RabbitMQ 3.13+ (the first with MQTT 5) instead carries the
  response topic in a header ``x-reply-to-topic`` and leaves reply_to alone.
Where RabbitMQ 3.10 diverges on purpose-less details, the tests say so
(``rabbitmq_specific`` / ``ferrymq_only`` with the reason)."""

from __future__ import annotations

import pika
import pytest

from amqpclient import Consumer, get_message
from brokers import broker_kind
from mqttclient import V5, V311, publish_props

pytestmark = pytest.mark.amqp

KIND = broker_kind()

NO_MQTT5 = "RabbitMQ 3.10's MQTT plugin has no MQTT 5 (CONNECT with protocol level 5 is refused)"


def rk(topic: str) -> str:
    """The AMQP routing key of an MQTT topic (topic levels → words)."""
    return topic.replace("/", ".")


def bound_queue(ch, binding_key: str) -> str:
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", binding_key)
    return q


# ------------------------------------------------------------------ MQTT → AMQP
def test_mqtt_publish_reaches_amqp_queue_bound_to_amq_topic(mqtt, amqp, topic):
    ch = amqp().channel()
    q = bound_queue(ch, f"{rk(topic)}.*.c")
    consumer = Consumer(ch, q, auto_ack=True)
    pub = mqtt(version=V311)
    pub.publish(f"{topic}/b/c", b"match qos1", qos=1)
    pub.publish(f"{topic}/b/b/c", b"too deep", qos=1)
    pub.publish(f"{topic}/c", b"too shallow", qos=1)
    pub.publish(f"{topic}/x/c", b"match qos0", qos=0)
    pub.publish(f"{topic}/fence/c", b"fence", qos=1)
    got = consumer.collect_until(b"fence")
    assert [(d.exchange, d.routing_key, d.body) for d in got] == [
        ("amq.topic", f"{rk(topic)}.b.c", b"match qos1"),
        ("amq.topic", f"{rk(topic)}.x.c", b"match qos0"),
    ]
    assert got[0].properties.delivery_mode == 2, "MQTT QoS 1 is a persistent AMQP message"
    assert got[1].properties.delivery_mode in (None, 1), "MQTT QoS 0 is a transient AMQP message"


def test_mqtt_payloads_arrive_intact_in_amqp(mqtt, amqp, topic):
    ch = amqp().channel()
    q = bound_queue(ch, f"{rk(topic)}.#")
    consumer = Consumer(ch, q, auto_ack=True)
    pub = mqtt(version=V311)
    payloads = [b"", bytes(range(256)), "ünïcödé".encode(), b"x" * 300_000]
    for p in payloads:
        pub.publish(f"{topic}/data", p, qos=1)
    assert [d.body for d in consumer.expect(len(payloads))] == payloads


def test_mqtt_qos1_stream_keeps_order_in_amqp(mqtt, amqp, topic):
    ch = amqp().channel()
    q = bound_queue(ch, rk(topic))
    consumer = Consumer(ch, q, auto_ack=True)
    pub = mqtt(version=V311)
    for i in range(100):
        pub.publish(topic, str(i).encode(), qos=1)
    got = consumer.expect(100)
    assert [int(d.body) for d in got] == list(range(100))
    assert {d.properties.delivery_mode for d in got} == {2}


def test_amqp_hash_binding_gets_every_depth(mqtt, amqp, topic):
    ch = amqp().channel()
    q = bound_queue(ch, f"{rk(topic)}.#")
    consumer = Consumer(ch, q, auto_ack=True)
    pub = mqtt(version=V311)
    for t in (topic, f"{topic}/a", f"{topic}/a/b/c"):
        pub.publish(t, t.encode(), qos=1)
    assert [d.routing_key for d in consumer.expect(3)] == [rk(topic), f"{rk(topic)}.a", f"{rk(topic)}.a.b.c"]


@pytest.mark.rabbitmq_specific(reason="RabbitMQ 3.10 adds headers x-mqtt-publish-qos and x-mqtt-dup to messages "
                                      "from MQTT; FerryMQ need not")
def test_rabbitmq_marks_mqtt_origin_in_headers(mqtt, amqp, topic):
    ch = amqp().channel()
    q = bound_queue(ch, f"{rk(topic)}.#")
    pub = mqtt(version=V311)
    pub.publish(f"{topic}/q0", b"0", qos=0)
    pub.publish(f"{topic}/q1", b"1", qos=1)
    got = Consumer(ch, q, auto_ack=True).expect(2)
    assert [d.headers for d in got] == [{"x-mqtt-publish-qos": 0, "x-mqtt-dup": False},
                                        {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False}]
    assert [d.properties.delivery_mode for d in got] == [1, 2]


# ------------------------------------------------------------------ AMQP → MQTT
def test_amqp_publish_reaches_mqtt_subscriber(mqtt, amqp, topic):
    sub = mqtt(version=V311)
    assert sub.subscribe(f"{topic}/+", qos=1) == [1]
    ch = amqp().channel()
    persistent = pika.BasicProperties(delivery_mode=2)
    ch.basic_publish("amq.topic", f"{rk(topic)}.y", b"to x/y", persistent)
    ch.basic_publish("amq.topic", f"{rk(topic)}.y.z", b"too deep", persistent)
    ch.basic_publish("amq.topic", rk(topic), b"parent level", persistent)
    ch.basic_publish("amq.direct", f"{rk(topic)}.y", b"other exchange", persistent)
    ch.basic_publish("amq.topic", f"{rk(topic)}.fence", b"fence", persistent)
    got = sub.collect_until(b"fence")
    assert [(m.topic, m.payload) for m in got] == [(f"{topic}/y", b"to x/y")]
    assert got[0].qos == 1, "a persistent AMQP message reaches a QoS 1 subscription at QoS 1"
    assert got[0].retain is False and got[0].dup is False


def test_amqp_to_mqtt_qos_is_capped_by_subscription(mqtt, amqp, topic):
    sub0 = mqtt(version=V311)
    assert sub0.subscribe(f"{topic}/#", qos=0) == [0]
    ch = amqp().channel()
    ch.basic_publish("amq.topic", f"{rk(topic)}.a", b"persistent", pika.BasicProperties(delivery_mode=2))
    m = sub0.get()
    assert (m.topic, m.payload, m.qos) == (f"{topic}/a", b"persistent", 0)


@pytest.mark.ferrymq_only(reason="RabbitMQ 3.10 delivers every AMQP-published message at the subscription's QoS "
                                 "(transient ones at QoS 1 too); FerryMQ, like RabbitMQ 3.13+, maps "
                                 "delivery_mode 1 to QoS 0")
def test_transient_amqp_message_reaches_qos1_subscriber_at_qos0(mqtt, amqp, topic):
    sub = mqtt(version=V311)
    assert sub.subscribe(f"{topic}/#", qos=1) == [1]
    ch = amqp().channel()
    ch.basic_publish("amq.topic", f"{rk(topic)}.t", b"transient", pika.BasicProperties(delivery_mode=1))
    ch.basic_publish("amq.topic", f"{rk(topic)}.t", b"no properties")
    got = sub.expect(2)
    assert [(m.payload, m.qos) for m in got] == [(b"transient", 0), (b"no properties", 0)]


@pytest.mark.rabbitmq_specific(reason="RabbitMQ 3.10 delivers transient AMQP messages at QoS 1 to a QoS 1 "
                                      "subscription (FerryMQ: QoS 0, see the ferrymq_only test)")
def test_rabbitmq_310_delivers_transient_amqp_at_subscription_qos(mqtt, amqp, topic):
    sub = mqtt(version=V311)
    assert sub.subscribe(f"{topic}/#", qos=1) == [1]
    ch = amqp().channel()
    ch.basic_publish("amq.topic", f"{rk(topic)}.t", b"transient", pika.BasicProperties(delivery_mode=1))
    assert sub.get().qos == 1


def test_amqp_payloads_arrive_intact_in_mqtt(mqtt, amqp, topic):
    sub = mqtt(version=V311)
    assert sub.subscribe(f"{topic}/#", qos=1) == [1]
    ch = amqp().channel()
    payloads = [b"", bytes(range(256)), b"y" * 300_000]
    for p in payloads:
        ch.basic_publish("amq.topic", f"{rk(topic)}.p", p, pika.BasicProperties(delivery_mode=2))
    assert [m.payload for m in sub.expect(len(payloads))] == payloads


def test_amqp_stream_keeps_order_for_mqtt(mqtt, amqp, topic):
    sub = mqtt(version=V311)
    assert sub.subscribe(topic, qos=1) == [1]
    ch = amqp().channel()
    ch.confirm_delivery()
    for i in range(100):
        ch.basic_publish("amq.topic", rk(topic), str(i).encode(), pika.BasicProperties(delivery_mode=2))
    assert [int(m.payload) for m in sub.expect(100)] == list(range(100))


def test_amqp_messages_queued_for_offline_persistent_mqtt_session(mqtt, amqp, topic):
    """An MQTT 3.1.1 session with clean session 0 keeps receiving AMQP publishes
    while its client is away (they wait in the session) and gets them, in order, on
    reconnect with session present = 1."""
    cid = f"cross-{topic.rsplit('/', 1)[-1]}"
    first = mqtt(version=V311, client_id=cid, clean=False)
    assert first.subscribe(f"{topic}/#", qos=1) == [1]
    first.disconnect()
    ch = amqp().channel()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("amq.topic", f"{rk(topic)}.offline", f"o{i}".encode(), pika.BasicProperties(delivery_mode=2))
    again = mqtt(version=V311, client_id=cid, clean=False, connect=False)
    ack = again.connect()
    assert ack.session_present is True
    got = again.expect(3)
    assert [(m.topic, m.payload, m.qos) for m in got] == [(f"{topic}/offline", f"o{i}".encode(), 1) for i in range(3)]
    again.disconnect()
    # Clean up the persistent session (on the shared RabbitMQ node too).
    mqtt(version=V311, client_id=cid, clean=True).disconnect()


def test_mqtt_and_amqp_subscribers_both_get_each_publish(mqtt, amqp, topic):
    """One topic, both worlds subscribed, both publishing: every message reaches
    every subscriber once."""
    msub = mqtt(version=V311)
    assert msub.subscribe(f"{topic}/#", qos=1) == [1]
    ch = amqp().channel()
    q = bound_queue(ch, f"{rk(topic)}.#")
    consumer = Consumer(ch, q, auto_ack=True)
    mpub = mqtt(version=V311)
    mpub.publish(f"{topic}/from-mqtt", b"m", qos=1)
    ch.basic_publish("amq.topic", f"{rk(topic)}.from-amqp", b"a", pika.BasicProperties(delivery_mode=2))
    assert sorted((m.topic, m.payload) for m in msub.expect(2)) == [
        (f"{topic}/from-amqp", b"a"), (f"{topic}/from-mqtt", b"m")]
    assert sorted((d.routing_key, d.body) for d in consumer.expect(2)) == [
        (f"{rk(topic)}.from-amqp", b"a"), (f"{rk(topic)}.from-mqtt", b"m")]


# --------------------------------------------------------- MQTT 5 properties (FerryMQ)
@pytest.mark.ferrymq_only(reason=NO_MQTT5)
def test_mqtt5_properties_become_amqp_properties(mqtt, amqp, topic):
    ch = amqp().channel()
    q = bound_queue(ch, f"{rk(topic)}.#")
    consumer = Consumer(ch, q, auto_ack=True)
    pub = mqtt(version=V5)
    pub.publish(f"{topic}/req", b'{"q": 1}', qos=1, properties=publish_props(
        UserProperty=[("tenant", "acme"), ("trace", "t-1")], ContentType="application/json",
        CorrelationData=b"req-42", ResponseTopic=f"{topic}/replies/r1"))
    d = consumer.get()
    assert d.body == b'{"q": 1}' and d.routing_key == f"{rk(topic)}.req"
    p = d.properties
    assert p.delivery_mode == 2
    assert p.content_type == "application/json"
    assert p.correlation_id == "req-42"
    assert p.reply_to == f"{rk(topic)}.replies.r1", "Response Topic → reply_to in routing-key form"
    # Every user property is a header; any other header the broker adds is an x- one.
    headers = d.headers
    assert {k: v for k, v in headers.items() if not k.startswith("x-")} == {"tenant": "acme", "trace": "t-1"}


@pytest.mark.ferrymq_only(reason=NO_MQTT5)
def test_amqp_properties_become_mqtt5_properties(mqtt, amqp, topic):
    sub = mqtt(version=V5)
    assert sub.subscribe(f"{topic}/#", qos=1) == [1]
    ch = amqp().channel()
    ch.basic_publish("amq.topic", f"{rk(topic)}.evt", b"payload", pika.BasicProperties(
        delivery_mode=2, content_type="text/plain", correlation_id="corr-7", reply_to=f"{rk(topic)}.answers",
        headers={"s": "v", "n": 42, "flag": True}))
    m = sub.get()
    assert (m.topic, m.payload, m.qos) == (f"{topic}/evt", b"payload", 1)
    assert m.p("ContentType") == "text/plain"
    assert m.p("CorrelationData") == b"corr-7"
    assert m.p("ResponseTopic") == f"{topic}/answers", "reply_to → Response Topic, routing key → topic form"
    assert sorted(m.user_properties) == [("flag", "true"), ("n", "42"), ("s", "v")]


@pytest.mark.ferrymq_only(reason=NO_MQTT5)
def test_mqtt5_qos2_publish_is_persistent_for_amqp(mqtt, amqp, topic):
    ch = amqp().channel()
    q = bound_queue(ch, rk(topic))
    pub = mqtt(version=V5)
    pub.publish(topic, b"exactly once", qos=2)
    d = get_message(ch, q)
    assert (d.body, d.properties.delivery_mode) == (b"exactly once", 2)


@pytest.mark.ferrymq_only(reason=NO_MQTT5)
def test_mqtt5_request_amqp_responder(mqtt, amqp, topic):
    """An MQTT 5 requester (response topic + correlation data) and a pika responder
    that answers the AMQP way: publish to amq.topic with routing key = reply_to and
    the request's correlation_id."""
    requester = mqtt(version=V5)
    assert requester.subscribe(f"{topic}/responses/#", qos=1) == [1]
    ch = amqp().channel()
    q = bound_queue(ch, f"{rk(topic)}.requests")
    responder = Consumer(ch, q)
    for i in range(3):
        requester.publish(f"{topic}/requests", f"n={i}".encode(), qos=1, properties=publish_props(
            ResponseTopic=f"{topic}/responses/client1", CorrelationData=f"c{i}".encode()))
    for req in responder.expect(3):
        ch.basic_publish("amq.topic", req.properties.reply_to, req.body.upper(),
                         pika.BasicProperties(correlation_id=req.properties.correlation_id, delivery_mode=2))
        ch.basic_ack(req.delivery_tag)
    answers = requester.expect(3)
    assert [(m.topic, m.payload, m.p("CorrelationData")) for m in answers] == [
        (f"{topic}/responses/client1", f"N={i}".encode(), f"c{i}".encode()) for i in range(3)]


@pytest.mark.ferrymq_only(reason=NO_MQTT5)
def test_amqp_request_mqtt5_responder(mqtt, amqp, topic):
    """A pika requester (reply_to = routing key of its reply binding, correlation_id)
    and an MQTT 5 responder that answers the MQTT way: publish to the Response Topic
    with the Correlation Data."""
    responder = mqtt(version=V5)
    assert responder.subscribe(f"{topic}/requests", qos=1) == [1]
    ch = amqp().channel()
    replies = bound_queue(ch, f"{rk(topic)}.replies.pika")
    consumer = Consumer(ch, replies, auto_ack=True)
    ch.basic_publish("amq.topic", f"{rk(topic)}.requests", b"ping", pika.BasicProperties(
        reply_to=f"{rk(topic)}.replies.pika", correlation_id="rpc-1", delivery_mode=2))
    req = responder.get()
    assert req.p("ResponseTopic") == f"{topic}/replies/pika"
    assert req.p("CorrelationData") == b"rpc-1"
    responder.publish(req.p("ResponseTopic"), b"pong", qos=1,
                      properties=publish_props(CorrelationData=req.p("CorrelationData")))
    d = consumer.get()
    assert (d.body, d.routing_key, d.properties.correlation_id) == (b"pong", f"{rk(topic)}.replies.pika", "rpc-1")
