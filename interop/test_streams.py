"""Streams with pika, as the RabbitMQ stream documentation shows them: declare with
``x-queue-type: stream``, ``basic_qos`` then ``basic_consume(arguments={"x-stream-offset": ...})``,
ack to get credit back.  Reply codes and texts are RabbitMQ's (3.9+)."""

from __future__ import annotations

import datetime

import pika
import pika.exceptions as pex
import pytest

from amqpclient import Consumer, declare_stream, message_count

pytestmark = pytest.mark.amqp



def publish(ch, name, bodies):
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish("", name, b, pika.BasicProperties(delivery_mode=2))


def offsets_and_bodies(deliveries):
    return [(d.headers["x-stream-offset"], d.body) for d in deliveries]


def test_pika_replays_a_stream_from_first_and_each_consumer_gets_everything(amqp, names):
    conn = amqp()
    ch = conn.channel()
    s = names("stream")
    declare_stream(ch, s, **{"x-max-age": "7D"})
    publish(ch, s, [b"m0", b"m1", b"m2"])
    readers = []
    for _ in range(2):
        rch = conn.channel()
        rch.basic_qos(prefetch_count=10)
        readers.append((rch, Consumer(rch, s, arguments={"x-stream-offset": "first"})))
    for rch, c in readers:
        got = c.expect(3)
        assert offsets_and_bodies(got) == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
        for d in got:
            rch.basic_ack(d.delivery_tag)
    # Acks removed nothing.
    assert message_count(ch, s) == 3
    # An absolute offset and `last`.
    rch = conn.channel()
    rch.basic_qos(prefetch_count=10)
    assert offsets_and_bodies(Consumer(rch, s, arguments={"x-stream-offset": 1}).expect(2)) == [(1, b"m1"), (2, b"m2")]
    rch = conn.channel()
    rch.basic_qos(prefetch_count=10)
    assert offsets_and_bodies(Consumer(rch, s, arguments={"x-stream-offset": "last"}).expect(1)) == [(2, b"m2")]
    ch.queue_delete(s)


def test_pika_timestamp_offset_and_next(amqp, names):
    conn = amqp()
    ch = conn.channel()
    s = names("stream")
    declare_stream(ch, s)
    publish(ch, s, [b"a"])
    nch = conn.channel()
    nch.basic_qos(prefetch_count=10)
    nxt = Consumer(nch, s)  # default: next
    tch = conn.channel()
    tch.basic_qos(prefetch_count=10)
    # A timestamp long ago: from the first message kept.
    old = Consumer(tch, s, arguments={"x-stream-offset": datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)})
    assert offsets_and_bodies(old.expect(1)) == [(0, b"a")]
    publish(ch, s, [b"b"])
    assert offsets_and_bodies(nxt.expect(1)) == [(1, b"b")]
    ch.queue_delete(s)


def test_pika_stream_rules(amqp, names, broker):
    conn = amqp()
    s = names("stream")
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as ei:
        ch.queue_declare(s, durable=False, arguments={"x-queue-type": "stream"})
    assert ei.value.reply_code == 406
    ch = conn.channel()
    declare_stream(ch, s)
    with pytest.raises(pex.ChannelClosedByBroker) as ei:
        ch.basic_consume(s, lambda *a: None, arguments={"x-stream-offset": "first"})
    assert ei.value.reply_code == 406
    assert "consumer prefetch count is not set" in ei.value.reply_text
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    # FerryMQ refuses no-ack with 406 on the channel; RabbitMQ closes the connection (540).
    closed = pex.ConnectionClosedByBroker if broker.kind == "rabbitmq" else pex.ChannelClosedByBroker
    with pytest.raises(closed) as ei:
        ch.basic_consume(s, lambda *a: None, auto_ack=True)
    assert ei.value.reply_code == (540 if broker.kind == "rabbitmq" else 406)
    conn = amqp()
    conn.channel().queue_delete(s)
