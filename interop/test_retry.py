"""Delayed retries and dead letters with pika: RabbitMQ 4.3's ``x-delayed-retry-*``
queue arguments, FerryMQ's ``x-retry-backoff`` list, the
``x-delivery-count`` header, the delivery limit dead-lettering to ``%DLQ%{queue}``, and
a retry that waits across a broker restart.

FerryMQ-only: RabbitMQ 3.10 (the reference node) has none of these.  Timing checks are
lower bounds ("not before due"), measured from the moment the nack was sent."""

from __future__ import annotations

import time

import pika
import pika.exceptions as pex
import pytest

from amqpclient import Consumer, get_message

pytestmark = [pytest.mark.amqp, pytest.mark.ferrymq_only]

SLACK = 0.002  # the broker's due times are whole milliseconds


def nack_and_time(ch, consumer: Consumer, gaps: list[float]) -> list:
    """Nacks the message at each arrival; checks every redelivery comes at least gaps[i]
    seconds after the nack before it; returns the x-delivery-count values seen."""
    d = consumer.get()
    assert not d.redelivered
    counts = [d.headers.get("x-delivery-count")]
    for i, gap in enumerate(gaps):
        sent = time.monotonic()
        ch.basic_nack(d.delivery_tag, requeue=True)
        d = consumer.get()
        waited = time.monotonic() - sent
        assert waited + SLACK >= gap, f"retry {i + 1} after {waited:.3f}s, before its {gap}s backoff"
        assert d.redelivered
        counts.append(d.headers.get("x-delivery-count"))
    ch.basic_ack(d.delivery_tag)
    return counts


def wait_for_queue(conn, name: str, timeout: float = 10.0):
    """A channel on which queue `name` exists (it is created asynchronously), bounded."""
    deadline = time.monotonic() + timeout
    while True:
        ch = conn.channel()
        try:
            ch.queue_declare(name, passive=True)
            return ch
        except pex.ChannelClosedByBroker as e:
            assert e.reply_code == 404, e
            assert time.monotonic() < deadline, f"queue {name!r} not created within {timeout}s"
            conn.sleep(0.02)


def test_retry_backoff_steps_repeat_the_last_one(amqp, names):
    ch = amqp().channel()
    q = names("steps")
    ch.queue_declare(q, arguments={"x-retry-backoff": "250ms,500ms"})
    ch.basic_qos(prefetch_count=1)
    consumer = Consumer(ch, q)
    ch.basic_publish("", q, b"flaky")
    assert nack_and_time(ch, consumer, [0.25, 0.5, 0.5]) == [0, 1, 2, 3]


def test_linear_backoff_and_other_messages_keep_flowing(amqp, names):
    ch = amqp().channel()
    q = names("linear")
    ch.queue_declare(q, arguments={"x-delayed-retry-type": "failed", "x-delayed-retry-min": 400,
                                   "x-delayed-retry-max": 800})
    consumer = Consumer(ch, q)
    ch.basic_publish("", q, b"head")
    head = consumer.get()
    sent = time.monotonic()
    ch.basic_nack(head.delivery_tag, requeue=True)
    # While the head waits for its retry, later messages are delivered.
    ch.basic_publish("", q, b"next")
    d = consumer.get()
    assert (d.body, d.redelivered) == (b"next", False)
    ch.basic_ack(d.delivery_tag)
    again = consumer.get()
    assert again.body == b"head" and again.redelivered
    assert time.monotonic() - sent + SLACK >= 0.4
    assert again.headers["x-delivery-count"] == 1
    ch.basic_ack(again.delivery_tag)


def test_delivery_limit_without_dlx_goes_to_the_dlq_queue(amqp, names):
    ch = amqp().channel()
    q = names("orders")
    x = names("shop")
    ch.exchange_declare(x, "direct")
    ch.queue_declare(q, arguments={"x-delivery-limit": 1, "x-retry-backoff": "50ms"})
    ch.queue_bind(q, x, "order.created")
    ch.basic_qos(prefetch_count=1)
    consumer = Consumer(ch, q)
    ch.basic_publish(x, "order.created", b"poison", pika.BasicProperties(delivery_mode=2))
    for count in (0, 1):  # a limit of 1 allows 2 deliveries
        d = consumer.get()
        assert d.headers["x-delivery-count"] == count
        ch.basic_nack(d.delivery_tag, requeue=True)
    dead = get_message(wait_for_queue(amqp(), f"%DLQ%{q}"), f"%DLQ%{q}")
    assert dead.body == b"poison"
    assert (dead.exchange, dead.routing_key) == (x, "order.created")
    death = dead.headers["x-death"][0]
    assert (death["reason"], death["queue"]) == ("delivery_limit", q)


def test_invalid_retry_arguments_are_refused(amqp, names):
    conn = amqp()
    for args in ({"x-retry-backoff": "1s,2days"}, {"x-delayed-retry-type": "later", "x-delayed-retry-min": 5},
                 {"x-delayed-retry-min": 0}):
        ch = conn.channel()
        with pytest.raises(pex.ChannelClosedByBroker) as ei:
            ch.queue_declare(names("bad"), arguments=args)
        assert ei.value.reply_code == 406
        assert ei.value.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-"), ei.value


@pytest.mark.persistence
def test_a_waiting_retry_survives_a_restart(broker, amqp, names):
    conn = amqp()
    ch = conn.channel()
    q = names("durable-retry")
    ch.queue_declare(q, durable=True, arguments={"x-delayed-retry-min": 3000})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"later", pika.BasicProperties(delivery_mode=2))
    d = Consumer(ch, q).get()
    nacked_at = time.time()
    ch.basic_nack(d.delivery_tag, requeue=True)
    # Answered once the queue owner stored the retry wait.
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    conn.close()  # no consumer left to take it if its time comes during the restart
    broker.restart()
    ch = amqp().channel()
    again = Consumer(ch, q).get()
    assert again.body == b"later" and again.redelivered
    assert time.time() - nacked_at + SLACK >= 3.0, "redelivered before its backoff"
    assert again.headers["x-delivery-count"] == 1
