"""Consumer groups on streams and partitioned streams with pika: members of an
``x-consumer-group`` share a committed offset and split the messages; with
``x-super-stream`` a group reads each partition of a consistent-hash super stream with
one member, spread evenly and spread again when a member joins or leaves.  Consumer
groups over AMQP 0-9-1 are a FerryMQ extension, so every test here is
``ferrymq_only``."""

from __future__ import annotations

import time

import pika
import pytest

from amqpclient import TIMEOUT, AmqpWaitError, Consumer, declare_stream

pytestmark = [pytest.mark.amqp, pytest.mark.ferrymq_only(reason="x-consumer-group / x-super-stream")]



def pump_all(consumers, n, timeout=TIMEOUT):
    """Drives every consumer's connection until `n` deliveries arrived in total; acks
    each and returns (consumer index, delivery) in arrival order per consumer."""
    got = []
    deadline = time.monotonic() + timeout
    conns = {id(c.conn): c.conn for c in consumers}.values()
    while len(got) < n:
        if time.monotonic() > deadline:
            raise AmqpWaitError(f"got {len(got)} of {n} deliveries within {timeout}s")
        for conn in conns:
            conn.process_data_events(time_limit=0.02)
        for i, c in enumerate(consumers):
            while c.pending:
                d = c.pending.popleft()
                c.ch.basic_ack(d.delivery_tag)
                got.append((i, d))
    return got


def test_pika_group_members_split_a_stream_and_the_group_resumes(amqp, names):
    conn = amqp()
    ch = conn.channel()
    s = names("events")
    declare_stream(ch, s)
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", s, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    members = []
    for _ in range(2):
        mconn = amqp()
        mch = mconn.channel()
        mch.basic_qos(prefetch_count=5)
        members.append(Consumer(mch, s, arguments={"x-consumer-group": "billing", "x-stream-offset": "first"}))
    got = pump_all(members, 20)
    bodies = sorted(int(d.body[1:]) for _, d in got)
    assert bodies == list(range(20)), "each message to one member"
    assert {i for i, _ in got} == {0, 1}, "both members got work"
    for m in members:
        m.conn.close()
    # The group resumes after what it acknowledged; x-stream-offset no longer counts.
    for i in range(20, 23):
        ch.basic_publish("", s, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    mconn = amqp()
    mch = mconn.channel()
    mch.basic_qos(prefetch_count=5)
    c = Consumer(mch, s, arguments={"x-consumer-group": "billing", "x-stream-offset": "first"})
    assert [d.body for d in c.expect(3)] == [b"m20", b"m21", b"m22"]
    c.assert_none(0.3)
    ch.queue_delete(s)


def test_pika_partitioned_stream_spreads_partitions_over_members(amqp, names):
    conn = amqp()
    ch = conn.channel()
    x = names("orders")
    ch.exchange_declare(x, "x-consistent-hash", durable=True)
    parts = [f"{x}-{i}" for i in range(4)]
    for i, p in enumerate(parts):
        declare_stream(ch, p)
        ch.queue_bind(p, x, routing_key="1", arguments={"x-stream-partition-order": i})
    ch.confirm_delivery()

    def publish(seqs):
        for seq in seqs:
            key = f"order{seq % 24}"
            ch.basic_publish(x, key, f"{key}:{seq}".encode(), pika.BasicProperties(delivery_mode=2))

    def member():
        mconn = amqp()
        mch = mconn.channel()
        mch.basic_qos(prefetch_count=20)
        args = {"x-consumer-group": "billing", "x-super-stream": x, "x-stream-offset": "first"}
        return [Consumer(mch, p, arguments=args) for p in parts]

    def owners(consumers, got):
        """member -> the partitions it received from (consumer index = member * 4 + partition)."""
        out: dict[int, set[int]] = {}
        for i, _ in got:
            out.setdefault(i // 4, set()).add(i % 4)
        return out

    a = member()
    publish(range(0, 120))
    got = pump_all(a, 120)
    assert owners(a, got) == {0: {0, 1, 2, 3}}
    all_got = list(got)

    b = member()
    publish(range(120, 240))
    got = pump_all(a + b, 120)
    assert owners(a + b, got) == {0: {0, 1}, 1: {2, 3}}, "average allocation in joining order"
    all_got += got

    a[0].conn.close()
    publish(range(240, 360))
    got = pump_all(b, 120)
    assert owners(b, got) == {0: {0, 1, 2, 3}}, "the remaining member takes every partition"
    all_got += got

    seqs_by_key: dict[str, list[int]] = {}
    for _, d in all_got:
        key, seq = d.body.decode().split(":")
        seqs_by_key.setdefault(key, []).append(int(seq))
    assert sorted(s for v in seqs_by_key.values() for s in v) == list(range(360)), "nothing lost, nothing twice"
    for key, seqs in seqs_by_key.items():
        assert seqs == sorted(seqs), f"{key} out of order"
    for p in parts:
        ch.queue_delete(p)
    ch.exchange_delete(x)


def test_pika_stream_consumer_tag_filter_skips_other_tags(amqp, names):
    conn = amqp()
    ch = conn.channel()
    s = names("tagged")
    declare_stream(ch, s)
    ch.confirm_delivery()
    for i, tag in enumerate(["red", "green", None, "blue", "red"]):
        headers = {"x-tag": tag} if tag else {}
        ch.basic_publish("", s, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2, headers=headers))
    rch = conn.channel()
    rch.basic_qos(prefetch_count=10)
    c = Consumer(rch, s, arguments={"x-stream-offset": "first", "x-tag-filter": "red || blue",
                                    "x-consumer-group": "alerts"})
    got = c.expect(3)
    assert [(d.body, d.headers["x-stream-offset"]) for d in got] == [(b"m0", 0), (b"m3", 3), (b"m4", 4)]
    for d in got:
        rch.basic_ack(d.delivery_tag)
    c.assert_none(0.3)
    ch.queue_delete(s)
