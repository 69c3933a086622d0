"""Delayed delivery with pika and paho-mqtt: an ``x-delayed-message`` exchange (the
convention of RabbitMQ's delayed-message plugin, which Debian's RabbitMQ 3.10 does not
ship) routes a message with an ``x-delay`` header (ms) when its time comes; MQTT's
``$delayed/{seconds}/{topic}`` uses the same scheduler.  FerryMQ-only."""

from __future__ import annotations

import time

import pika
import pytest

from amqpclient import Consumer

pytestmark = [pytest.mark.amqp, pytest.mark.ferrymq_only("x-delayed-message is a RabbitMQ plugin; $delayed is EMQX's")]


def test_pika_publish_with_x_delay_is_routed_after_the_delay(amqp, names):
    conn = amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    x = names("delayed")
    ch.exchange_declare(x, "x-delayed-message", arguments={"x-delayed-type": "topic"})
    q = ch.queue_declare(names("q"), exclusive=True).method.queue
    ch.queue_bind(q, x, "jobs.#")
    c = Consumer(ch, q, auto_ack=True)
    sent = time.monotonic()
    ch.basic_publish(x, "jobs.email", b"in 1 s", pika.BasicProperties(headers={"x-delay": 1000}))
    confirmed = time.monotonic() - sent
    ch.basic_publish(x, "jobs.sms", b"now", pika.BasicProperties(headers={"x-delay": 0}))
    assert confirmed < 1.0, f"the confirm follows the store, not the delivery ({confirmed:.3f} s)"
    first = c.get()
    assert first.body == b"now"
    second = c.get()
    waited = time.monotonic() - sent
    assert (second.body, second.routing_key) == (b"in 1 s", "jobs.email")
    assert waited >= 1.0, f"delivered after {waited:.3f} s, before its delay"
    assert second.properties.headers["x-delay"] == 1000


def test_mqtt_delayed_topic_reaches_a_pika_consumer(amqp, mqtt, names, topic):
    conn = amqp()
    ch = conn.channel()
    q = ch.queue_declare(names("q"), exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", topic.replace("/", ".") + ".#")
    c = Consumer(ch, q, auto_ack=True)
    pub = mqtt(name="pub")
    sent = time.monotonic()
    pub.publish(f"$delayed/1/{topic}/later", b"one second", qos=1)
    d = c.get()
    waited = time.monotonic() - sent
    assert (d.body, d.routing_key) == (b"one second", topic.replace("/", ".") + ".later")
    assert waited >= 1.0, f"delivered after {waited:.3f} s"
