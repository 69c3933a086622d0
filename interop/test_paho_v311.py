"""MQTT 3.1.1 interop tests with paho-mqtt 2.x (and a raw socket where paho
refuses to send what we need)."""

from __future__ import annotations

import struct
import time

import pytest

from brokers import broker_kind
from mqttclient import QUIET, TIMEOUT, V311, unique_id
from rawmqtt import (CONNACK, PINGREQ, PINGRESP, PUBACK, PUBLISH, SUBACK, Raw, connect_packet, mqtt_str, packet,
                     subscribe_packet)

KIND = broker_kind()


def sub_client(mqtt, filters, qos=0, **kw):
    c = mqtt(version=V311, **kw)
    if isinstance(filters, str):
        filters = [filters]
    for f in filters:
        assert c.subscribe(f, qos=qos) == [qos], f"SUBACK for {f}"
    return c


# ----------------------------------------------------------------- CONNECT/CONNACK
def test_connack_clean_session(mqtt):
    c = mqtt(version=V311, connect=False)
    ack = c.connect()
    assert ack.reason_code == 0
    assert ack.session_present is False


def test_connack_unacceptable_protocol_level(broker):
    r = Raw(broker.host, broker.port)
    try:
        r.send(connect_packet("badlevel", level=7))
        seen = r.wait_closed(TIMEOUT)
    finally:
        r.close()
    # [MQTT-3.1.2-2]: CONNACK return code 0x01, then close.
    assert seen == [(CONNACK, 0, b"\x00\x01")]


def test_connack_identifier_rejected_for_empty_id_with_persistent_session(broker):
    r = Raw(broker.host, broker.port)
    try:
        r.send(connect_packet("", level=4, clean=False))
        seen = r.wait_closed(TIMEOUT)
    finally:
        r.close()
    # [MQTT-3.1.3-8]: zero-byte ClientId with CleanSession=0 -> return code 0x02, close.
    assert seen == [(CONNACK, 0, b"\x00\x02")]


def test_empty_client_id_with_clean_session_accepted(mqtt, topic):
    c = mqtt(version=V311, client_id="")
    assert c.subscribe(topic, qos=1) == [1]
    c.publish(topic, b"hello", qos=1)
    assert c.get().payload == b"hello"


def test_second_connect_packet_is_a_protocol_violation(broker):
    r = Raw(broker.host, broker.port)
    try:
        r.send(connect_packet(unique_id(), level=4))
        assert r.read_packet() == (CONNACK, 0, b"\x00\x00")
        r.send(connect_packet(unique_id(), level=4))
        # [MQTT-3.1.0-2]: a second CONNECT is a protocol violation -> disconnect.
        seen = r.wait_closed(TIMEOUT)
    finally:
        r.close()
    assert seen == []


def test_pingreq_pingresp(broker):
    r = Raw(broker.host, broker.port)
    try:
        r.send(connect_packet(unique_id(), level=4))
        assert r.read_packet() == (CONNACK, 0, b"\x00\x00")
        for _ in range(3):
            r.send(packet(PINGREQ, 0, b""))
            assert r.read_packet() == (PINGRESP, 0, b"")
    finally:
        r.close()


def test_keepalive_expiry_closes_connection_and_sends_will(broker, mqtt, topic):
    watcher = sub_client(mqtt, f"{topic}/will", qos=1)
    r = Raw(broker.host, broker.port)
    try:
        body = mqtt_str("MQTT") + bytes([4, 0x02 | 0x04 | (1 << 3)]) + struct.pack("!H", 1)
        body += mqtt_str(unique_id()) + mqtt_str(f"{topic}/will") + mqtt_str(b"keepalive-expired")
        r.send(packet(1, 0, body))
        assert r.read_packet() == (CONNACK, 0, b"\x00\x00")
        t0 = time.monotonic()
        # Keep alive 1 s and silence: [MQTT-3.1.2-24] the server must disconnect
        # after 1.5x keep alive; 1 s of slack for timer granularity.  Mosquitto
        # 2.0.x sweeps keep-alives only every few seconds (measured: ~5-6 s for a
        # 1 s keep alive), so it gets a looser bound.
        limit = 10.0 if KIND == "mosquitto" else 2.5
        r.wait_closed(limit + 1.0)
        elapsed = time.monotonic() - t0
    finally:
        r.close()
    assert 0.9 <= elapsed <= limit, f"closed after {elapsed:.2f}s (keep alive 1 s, limit {limit}s)"
    m = watcher.get()
    assert (m.topic, m.payload, m.qos) == (f"{topic}/will", b"keepalive-expired", 1)


def test_client_id_takeover_disconnects_first_connection(mqtt, topic):
    cid = unique_id("takeover")
    first = mqtt(version=V311, client_id=cid, name="first")
    second = mqtt(version=V311, client_id=cid, name="second")
    # [MQTT-3.1.4-2]: the existing client is disconnected.
    first.wait_closed(TIMEOUT)
    assert second.subscribe(topic, qos=1) == [1]
    second.publish(topic, b"still-works", qos=1)
    assert second.get().payload == b"still-works"
    assert second.connected


# ------------------------------------------------------------------------ pub/sub
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_pubsub_qos_order_and_integrity(mqtt, topic, qos):
    sub = sub_client(mqtt, topic, qos=qos)
    pub = mqtt(version=V311)
    payloads = [f"msg-{i}-".encode() + bytes([i % 256]) * i for i in range(30)]
    for p in payloads:
        pub.publish(topic, p, qos=qos)
    got = sub.expect(len(payloads))
    assert [m.payload for m in got] == payloads
    assert all(m.topic == topic and m.qos == qos and not m.retain for m in got)
    sub.assert_no_message(QUIET)  # no duplicates after the last one


@pytest.mark.parametrize("pub_qos,sub_qos", [(2, 1), (2, 0), (1, 0), (0, 2), (1, 2)])
def test_delivered_qos_is_minimum(mqtt, topic, pub_qos, sub_qos):
    sub = sub_client(mqtt, topic, qos=sub_qos)
    pub = mqtt(version=V311)
    pub.publish(topic, b"x", qos=pub_qos)
    m = sub.get()
    assert m.qos == min(pub_qos, sub_qos)


def test_qos2_exactly_once(mqtt, topic):
    sub = sub_client(mqtt, topic, qos=2)
    pub = mqtt(version=V311)
    n = 100
    for i in range(n):
        pub.publish(topic, str(i).encode(), qos=2)
    got = sub.expect(n)
    got += sub.drain(QUIET)  # anything extra would be a duplicate
    assert [m.payload for m in got] == [str(i).encode() for i in range(n)]


def test_payload_integrity_binary_empty_large(mqtt, topic):
    sub = sub_client(mqtt, topic, qos=1)
    pub = mqtt(version=V311)
    payloads = [
        bytes(range(256)),
        b"",
        b"\x00" * 17,
        "ünïcødé ✓ 🚢".encode(),
        bytes((i * 7919) % 251 for i in range(256 * 1024)),
    ]
    for p in payloads:
        pub.publish(topic, p, qos=1)
    got = sub.expect(len(payloads))
    assert [m.payload for m in got] == payloads


def test_utf8_topic_names(mqtt, topic):
    t = f"{topic}/ünï/café/🚢"
    sub = sub_client(mqtt, f"{topic}/+/café/#", qos=1)
    pub = mqtt(version=V311)
    pub.publish(t, b"u", qos=1)
    m = sub.get()
    assert (m.topic, m.payload) == (t, b"u")


def test_subscribe_many_filters_in_one_packet(mqtt, topic):
    c = mqtt(version=V311)
    codes = c.subscribe([(f"{topic}/q0", 0), (f"{topic}/q1", 1), (f"{topic}/q2", 2)])
    assert codes == [0, 1, 2]
    for q in range(3):
        c.publish(f"{topic}/q{q}", f"{q}".encode(), qos=2)
    got = sorted(c.expect(3), key=lambda m: m.topic)
    assert [(m.topic, m.qos) for m in got] == [(f"{topic}/q{q}", q) for q in range(3)]


def test_resubscribe_replaces_qos(mqtt, topic):
    c = mqtt(version=V311)
    assert c.subscribe(topic, qos=0) == [0]
    assert c.subscribe(topic, qos=2) == [2]
    c.publish(topic, b"one", qos=2)
    m = c.get()
    assert m.qos == 2
    c.assert_no_message(QUIET)  # [MQTT-3.8.4-3] replaced, not a second subscription


# ---------------------------------------------------------------------- wildcards
def test_single_level_wildcard(mqtt, topic):
    sub = sub_client(mqtt, f"{topic}/+/c", qos=1)
    pub = mqtt(version=V311)
    for t in [f"{topic}/a/c", f"{topic}/a/b/c", f"{topic}/c", f"{topic}//c", f"{topic}/b/c", f"{topic}/a/c/d"]:
        pub.publish(t, t.encode(), qos=1)
    pub.publish(f"{topic}/fence/c", b"fence", qos=1)
    got = [m.topic for m in sub.collect_until(b"fence")]
    assert got == [f"{topic}/a/c", f"{topic}//c", f"{topic}/b/c"]


def test_multi_level_wildcard_matches_parent_and_children(mqtt, topic):
    sub = sub_client(mqtt, f"{topic}/a/#", qos=1)
    pub = mqtt(version=V311)
    for t in [f"{topic}/a", f"{topic}/a/b", f"{topic}/a/b/c/d", f"{topic}/b", f"{topic}/ab", f"{topic}/a/"]:
        pub.publish(t, t.encode(), qos=1)
    pub.publish(f"{topic}/a/fence", b"fence", qos=1)
    got = [m.topic for m in sub.collect_until(b"fence")]
    assert got == [f"{topic}/a", f"{topic}/a/b", f"{topic}/a/b/c/d", f"{topic}/a/"]


def test_combined_wildcards(mqtt, topic):
    sub = sub_client(mqtt, f"{topic}/+/x/#", qos=1)
    pub = mqtt(version=V311)
    for t in [f"{topic}/1/x", f"{topic}/2/x/y/z", f"{topic}/1/y/x", f"{topic}/x"]:
        pub.publish(t, t.encode(), qos=1)
    pub.publish(f"{topic}/f/x/fence", b"fence", qos=1)
    assert [m.topic for m in sub.collect_until(b"fence")] == [f"{topic}/1/x", f"{topic}/2/x/y/z"]


def test_dollar_topics_not_matched_by_leading_wildcards(mqtt, topic):
    """[MQTT-4.7.2-1]: '#' and '+/...' must not match topics starting with '$'
    (also covers $SYS, which Mosquitto publishes and retains)."""
    hash_sub = sub_client(mqtt, "#", qos=1, name="hash")
    plus_sub = sub_client(mqtt, "+/x", qos=1, name="plus")
    explicit = sub_client(mqtt, "$interop/x", qos=1, name="explicit")
    pub = mqtt(version=V311)
    pub.publish("$interop/x", b"dollar", qos=1)
    # The explicit subscriber proves the $-message was routed at all.
    m = explicit.get()
    assert (m.topic, m.payload) == ("$interop/x", b"dollar")
    pub.publish("plain/x", b"fence", qos=1)
    for s in (hash_sub, plus_sub):
        before = s.collect_until(b"fence")
        leaked = [x.topic for x in before if x.topic.startswith("$")]
        assert leaked == [], f"{s.name} received $-topics: {leaked}"


# ----------------------------------------------------------------------- retained
def test_retained_delivered_to_new_subscriber_with_flag(mqtt, topic):
    pub = mqtt(version=V311)
    pub.publish(topic, b"r1", qos=1, retain=True)
    sub = mqtt(version=V311)
    assert sub.subscribe(topic, qos=1) == [1]
    m = sub.get()
    assert (m.topic, m.payload, m.retain, m.qos) == (topic, b"r1", True, 1)


def test_retained_qos_is_minimum_of_stored_and_subscription(mqtt, topic):
    pub = mqtt(version=V311)
    pub.publish(topic, b"r2", qos=2, retain=True)
    sub = mqtt(version=V311)
    sub.subscribe(topic, qos=1)
    m = sub.get()
    assert (m.payload, m.retain, m.qos) == (b"r2", True, 1)


def test_retained_replace(mqtt, topic):
    pub = mqtt(version=V311)
    pub.publish(topic, b"old", qos=1, retain=True)
    pub.publish(topic, b"new", qos=1, retain=True)
    sub = mqtt(version=V311)
    sub.subscribe(topic, qos=1)
    m = sub.get()
    assert (m.payload, m.retain) == (b"new", True)
    pub.publish(topic, b"fence", qos=1)
    assert sub.collect_until(b"fence") == []


def test_non_retained_publish_keeps_retained_message(mqtt, topic):
    pub = mqtt(version=V311)
    pub.publish(topic, b"kept", qos=1, retain=True)
    pub.publish(topic, b"transient", qos=1, retain=False)
    sub = mqtt(version=V311)
    sub.subscribe(topic, qos=1)
    m = sub.get()
    assert (m.payload, m.retain) == (b"kept", True)


def test_retained_cleared_by_empty_payload(mqtt, topic):
    live = sub_client(mqtt, topic, qos=1, name="live")
    pub = mqtt(version=V311)
    pub.publish(topic, b"doomed", qos=1, retain=True)
    pub.publish(topic, b"", qos=1, retain=True)
    # [MQTT-3.3.1-10/11] the empty retained message is forwarded as a normal message.
    got = live.expect(2)
    assert [(m.payload, m.retain) for m in got] == [(b"doomed", False), (b"", False)]
    late = mqtt(version=V311, name="late")
    late.subscribe(topic, qos=1)
    pub.publish(topic, b"fence", qos=1)
    assert late.collect_until(b"fence") == [], "retained message was not cleared"


def test_retained_to_wildcard_subscribers(mqtt, topic):
    pub = mqtt(version=V311)
    retained = {f"{topic}/a": b"A", f"{topic}/b/c": b"BC", f"{topic}/d": b"D"}
    for t, p in retained.items():
        pub.publish(t, p, qos=1, retain=True)
    pub.publish(f"{topic}/d", b"", qos=1, retain=True)  # cleared: must not show up
    hash_sub = mqtt(version=V311, name="hash")
    hash_sub.subscribe(f"{topic}/#", qos=1)
    got = hash_sub.expect(2)
    assert {m.topic: m.payload for m in got} == {f"{topic}/a": b"A", f"{topic}/b/c": b"BC"}
    assert all(m.retain for m in got)
    plus_sub = mqtt(version=V311, name="plus")
    plus_sub.subscribe(f"{topic}/+", qos=1)
    m = plus_sub.get()
    assert (m.topic, m.payload, m.retain) == (f"{topic}/a", b"A", True)
    pub.publish(f"{topic}/fence", b"fence", qos=1)
    assert hash_sub.collect_until(b"fence") == []
    assert plus_sub.collect_until(b"fence") == []


def test_live_delivery_of_retained_publish_has_retain_clear(mqtt, topic):
    """[MQTT-3.3.1-9]: delivered to an established subscription -> RETAIN 0."""
    sub = sub_client(mqtt, topic, qos=1)
    pub = mqtt(version=V311)
    pub.publish(topic, b"live", qos=1, retain=True)
    m = sub.get()
    assert (m.payload, m.retain) == (b"live", False)


@pytest.mark.persistence
def test_retained_survives_broker_restart(broker, mqtt, topic):
    pub = mqtt(version=V311)
    pub.publish(topic, b"durable", qos=1, retain=True)
    pub.publish(f"{topic}/gone", b"x", qos=1, retain=True)
    pub.publish(f"{topic}/gone", b"", qos=1, retain=True)
    pub.disconnect()
    broker.restart()
    sub = mqtt(version=V311)
    sub.subscribe(f"{topic}/#", qos=1)
    m = sub.get()
    assert (m.topic, m.payload, m.retain) == (topic, b"durable", True)
    sub.publish(f"{topic}/fence", b"fence", qos=1)
    assert sub.collect_until(b"fence") == []


# -------------------------------------------------------------------------- wills
def test_will_on_abnormal_disconnect(mqtt, topic):
    watcher = sub_client(mqtt, f"{topic}/will", qos=1, name="watcher")
    dying = mqtt(version=V311, name="dying",
                 will=dict(topic=f"{topic}/will", payload=b"gone", qos=1, retain=False))
    dying.drop()
    m = watcher.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (f"{topic}/will", b"gone", 1, False)


def test_no_will_on_clean_disconnect(mqtt, topic):
    watcher = sub_client(mqtt, f"{topic}/will", qos=1, name="watcher")
    polite = mqtt(version=V311, name="polite", will=dict(topic=f"{topic}/will", payload=b"gone", qos=1))
    polite.disconnect()
    # [MQTT-3.14.4-3]: the will is discarded.  Nothing to wait for: observe for a
    # bounded quiet window.
    watcher.assert_no_message(QUIET)


def test_retained_will(mqtt, topic):
    dying = mqtt(version=V311, name="dying",
                 will=dict(topic=f"{topic}/will", payload=b"last", qos=1, retain=True))
    dying.drop()
    late = mqtt(version=V311, name="late")
    late.subscribe(f"{topic}/will", qos=1)
    m = late.get()  # waits for the will to have been published and retained
    assert (m.payload, m.retain) == (b"last", True)


# ----------------------------------------------------------------- sessions
@pytest.mark.parametrize("qos", [1, 2])
def test_persistent_session_queues_messages_while_offline(mqtt, topic, qos):
    cid = unique_id("persist")
    sub = mqtt(version=V311, client_id=cid, clean=False, connect=False)
    assert sub.connect().session_present is False
    assert sub.subscribe(f"{topic}/#", qos=qos) == [qos]
    sub.disconnect()
    pub = mqtt(version=V311)
    payloads = [f"offline-{i}".encode() for i in range(5)]
    for p in payloads:
        pub.publish(f"{topic}/x", p, qos=qos)
    back = mqtt(version=V311, client_id=cid, clean=False, connect=False)
    ack = back.connect()
    assert ack.session_present is True
    got = back.expect(len(payloads))
    assert [m.payload for m in got] == payloads
    assert all(m.qos == qos for m in got)
    # The subscription itself survived: no re-subscribe needed.
    pub.publish(f"{topic}/y", b"online", qos=qos)
    assert back.get().payload == b"online"


def test_clean_session_discards_stored_session(mqtt, topic):
    cid = unique_id("clean")
    sub = mqtt(version=V311, client_id=cid, clean=False)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    pub = mqtt(version=V311)
    pub.publish(topic, b"for-old-session", qos=1)
    fresh = mqtt(version=V311, client_id=cid, clean=True, connect=False)
    assert fresh.connect().session_present is False
    fresh.subscribe(f"{topic}/fence", qos=1)
    pub.publish(topic, b"after", qos=1)
    pub.publish(f"{topic}/fence", b"fence", qos=1)
    assert fresh.collect_until(b"fence") == [], "messages from a discarded session were delivered"
    fresh.disconnect()
    # And the clean session was not kept either.
    again = mqtt(version=V311, client_id=cid, clean=False, connect=False)
    assert again.connect().session_present is False


def test_unacknowledged_qos1_redelivered_with_dup_on_reconnect(broker, mqtt, topic):
    """[MQTT-4.4.0-1]: unacknowledged QoS 1 PUBLISH is resent with DUP=1 when the
    session resumes.  Raw client: it does not send the PUBACK."""
    cid = unique_id("dup")
    r = Raw(broker.host, broker.port)
    try:
        r.send(connect_packet(cid, level=4, clean=False))
        assert r.read_packet() == (CONNACK, 0, b"\x00\x00")
        r.send(subscribe_packet(1, [(topic, 1)], v5=False))
        assert r.read_packet() == (SUBACK, 0, b"\x00\x01\x01")
        pub = mqtt(version=V311)
        pub.publish(topic, b"ack-me", qos=1)
        ptype, flags, body = r.read_packet()
        assert ptype == PUBLISH and (flags >> 1) & 3 == 1 and not flags & 0x08
        tlen = struct.unpack("!H", body[:2])[0]
        assert body[2 + tlen + 2:] == b"ack-me"
    finally:
        r.close()  # no PUBACK, no DISCONNECT
    r = Raw(broker.host, broker.port)
    try:
        r.send(connect_packet(cid, level=4, clean=False))
        # Session present, then the redelivery.  A broker may only notice the old
        # connection is gone when the new one takes over: both orders are fine.
        assert r.read_packet() == (CONNACK, 0, b"\x01\x00")
        ptype, flags, body = r.read_packet()
        assert ptype == PUBLISH
        assert (flags >> 1) & 3 == 1
        assert flags & 0x08, "redelivered PUBLISH must have DUP=1"
        tlen = struct.unpack("!H", body[:2])[0]
        assert body[2:2 + tlen].decode() == topic
        pid = body[2 + tlen:2 + tlen + 2]
        assert body[2 + tlen + 2:] == b"ack-me"
        r.send(packet(PUBACK, 0, pid))
        r.send(packet(PINGREQ, 0, b""))
        assert r.read_packet() == (PINGRESP, 0, b"")  # and nothing else was resent
    finally:
        r.close()


@pytest.mark.persistence
def test_persistent_session_survives_broker_restart(broker, mqtt, topic):
    cid = unique_id("restart")
    sub = mqtt(version=V311, client_id=cid, clean=False)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    pub = mqtt(version=V311)
    for i in range(3):
        pub.publish(topic, f"before-restart-{i}".encode(), qos=1)
    pub.disconnect()
    broker.restart()
    back = mqtt(version=V311, client_id=cid, clean=False, connect=False)
    assert back.connect().session_present is True
    got = back.expect(3)
    assert [m.payload for m in got] == [f"before-restart-{i}".encode() for i in range(3)]
    pub2 = mqtt(version=V311)
    pub2.publish(topic, b"after-restart", qos=1)
    assert back.get().payload == b"after-restart"


# ---------------------------------------------------------------- unsubscribe
def test_unsubscribe_stops_delivery(mqtt, topic):
    sub = mqtt(version=V311)
    sub.subscribe([(f"{topic}/a", 1), (f"{topic}/fence", 1)])
    pub = mqtt(version=V311)
    pub.publish(f"{topic}/a", b"before", qos=1)
    assert sub.get().payload == b"before"
    sub.unsubscribe(f"{topic}/a")  # waits for UNSUBACK
    pub.publish(f"{topic}/a", b"after", qos=1)
    pub.publish(f"{topic}/fence", b"fence", qos=1)
    assert sub.collect_until(b"fence") == []


def test_unsubscribe_one_of_overlapping_filters(mqtt, topic):
    sub = mqtt(version=V311)
    sub.subscribe([(f"{topic}/#", 1), (f"{topic}/a", 1)])
    sub.unsubscribe(f"{topic}/a")
    pub = mqtt(version=V311)
    pub.publish(f"{topic}/a", b"via-hash", qos=1)
    pub.publish(f"{topic}/fence", b"fence", qos=1)
    got = sub.collect_until(b"fence")
    assert [m.payload for m in got] == [b"via-hash"]


def test_unsubscribe_unknown_filter_is_acknowledged(mqtt, topic):
    c = mqtt(version=V311)
    c.unsubscribe(f"{topic}/never")  # [MQTT-3.10.4-5] UNSUBACK even if nothing matched
    assert c.connected
