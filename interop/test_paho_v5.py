"""MQTT 5.0 interop tests with paho-mqtt 2.x (raw socket where paho refuses to
send what we need)."""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from brokers import broker_kind
from mqttclient import (QUIET, TIMEOUT, V5, V311, Client, MqttError, connect_props, props, publish_props,
                        subscribe_props, unique_id)
from rawmqtt import CONNACK, DISCONNECT, SUBACK, Raw, connect_packet, decode_varint, subscribe_packet

KIND = broker_kind()

SEND_ON_SUBSCRIBE = SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE
SEND_IF_NEW_SUB = SubscribeOptions.RETAIN_SEND_IF_NEW_SUB
DO_NOT_SEND = SubscribeOptions.RETAIN_DO_NOT_SEND


def opts(qos=0, no_local=False, rap=False, rh=SEND_ON_SUBSCRIBE) -> SubscribeOptions:
    return SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=rap, retainHandling=rh)


def sub_client(mqtt, filters, qos=1, **kw):
    c = mqtt(version=V5, **kw)
    for f in [filters] if isinstance(filters, str) else filters:
        assert c.subscribe(f, qos=qos) == [qos], f"SUBACK for {f}"
    return c


# ----------------------------------------------------------------- CONNECT/CONNACK
def test_connack_success(mqtt):
    c = mqtt(connect=False)
    ack = c.connect()
    assert ack.reason_code == 0
    assert ack.session_present is False
    # Optional CONNACK properties, when present, must be well formed.
    if ack.p("ReceiveMaximum") is not None:
        assert 1 <= ack.p("ReceiveMaximum") <= 65535
    if ack.p("MaximumQoS") is not None:
        assert ack.p("MaximumQoS") in (0, 1)


def test_assigned_client_identifier_for_empty_id(mqtt, topic):
    c = mqtt(client_id="", connect=False)
    ack = c.connect()
    assert ack.reason_code == 0
    assigned = ack.p("AssignedClientIdentifier")
    assert isinstance(assigned, str) and assigned, "[MQTT-3.2.2-16] Assigned Client Identifier expected"
    assert c.subscribe(topic, qos=1) == [1]
    c.publish(topic, b"me", qos=1)
    assert c.get().payload == b"me"


def test_request_problem_and_response_information_accepted(mqtt):
    c = mqtt(connect=False)
    ack = c.connect(properties=connect_props(RequestProblemInformation=1, RequestResponseInformation=0,
                                             ReceiveMaximum=10, MaximumPacketSize=1 << 20,
                                             UserProperty=[("client", "interop")]))
    assert ack.reason_code == 0


def test_session_takeover_closes_old_connection(mqtt, topic):
    cid = unique_id("takeover5")
    first = mqtt(client_id=cid, name="first")
    second = mqtt(client_id=cid, name="second")
    first.wait_closed(TIMEOUT)  # [MQTT-3.1.4-3]
    assert second.subscribe(topic, qos=1) == [1]
    second.publish(topic, b"ok", qos=1)
    assert second.get().payload == b"ok"


@pytest.mark.ferrymq_only(reason="Mosquitto 2.0.11 closes the old connection without sending DISCONNECT 0x8E")
def test_session_takeover_sends_disconnect_0x8e(broker):
    cid = unique_id("takeover-raw")
    old = Raw(broker.host, broker.port)
    new = Raw(broker.host, broker.port)
    try:
        old.send(connect_packet(cid, level=5))
        assert old.read_packet()[0] == CONNACK
        new.send(connect_packet(cid, level=5))
        assert new.read_packet()[0] == CONNACK
        seen = old.wait_closed(TIMEOUT)
    finally:
        old.close()
        new.close()
    assert seen and seen[0][0] == DISCONNECT and seen[0][2][:1] == b"\x8e", seen


# ------------------------------------------------------------------------ pub/sub
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_pubsub_qos_order_and_integrity(mqtt, topic, qos):
    sub = sub_client(mqtt, topic, qos=qos)
    pub = mqtt()
    payloads = [bytes([i]) * (i * 13) + f"#{i}".encode() for i in range(30)]
    for p in payloads:
        rc = pub.publish(topic, p, qos=qos)
        assert rc == 0
    got = sub.expect(len(payloads))
    assert [m.payload for m in got] == payloads
    assert all(m.qos == qos and not m.retain and m.topic == topic for m in got)
    sub.assert_no_message(QUIET)  # no duplicates


def test_puback_reason_code_without_subscribers(mqtt, topic):
    pub = mqtt()
    rc = pub.publish(f"{topic}/nobody", b"x", qos=1)
    # 0x10 "No matching subscribers" is allowed, so is 0x00.
    assert rc in (0x00, 0x10)
    rc2 = pub.publish(f"{topic}/nobody", b"x", qos=2)
    assert rc2 in (0x00, 0x10)


def test_v5_and_v311_clients_interoperate(mqtt, topic):
    v5_sub = sub_client(mqtt, topic, qos=1, name="v5sub")
    v3_sub_client = mqtt(version=V311, name="v311")
    assert v3_sub_client.subscribe(topic, qos=1) == [1]
    v5_pub = mqtt(name="v5pub")
    v5_pub.publish(topic, b"from-v5", qos=1,
                   properties=publish_props(UserProperty=[("k", "v")], ContentType="text/plain"))
    m = v3_sub_client.get()
    assert (m.topic, m.payload, m.qos) == (topic, b"from-v5", 1)
    assert v5_sub.get().payload == b"from-v5"
    v3_pub = mqtt(version=V311, name="v3pub")
    v3_pub.publish(topic, b"from-v311", qos=1)
    m5 = v5_sub.get()
    assert m5.payload == b"from-v311"
    assert m5.user_properties == []
    assert m5.p("ContentType") is None
    assert v3_sub_client.get().payload == b"from-v311"


# ------------------------------------------------------------ SUBACK reason codes
def test_suback_granted_qos_reason_codes(mqtt, topic):
    c = mqtt()
    codes = c.subscribe([(f"{topic}/0", opts(0)), (f"{topic}/1", opts(1)), (f"{topic}/2", opts(2)),
                         (f"{topic}/+/x/#", opts(1))])
    assert codes == [0x00, 0x01, 0x02, 0x01]


def _raw_subscribe(broker, filters):
    r = Raw(broker.host, broker.port)
    r.send(connect_packet(unique_id("raw"), level=5))
    assert r.read_packet()[0] == CONNACK
    r.send(subscribe_packet(7, filters, v5=True))
    return r


def _suback_codes(body: bytes) -> list[int]:
    assert body[:2] == b"\x00\x07", "SUBACK must echo the packet identifier"
    plen, pos = decode_varint(body, 2)
    return list(body[pos + plen:])


@pytest.mark.parametrize("bad", ["a/#/b", "a/b#", "a+/b", "#/a"])
def test_malformed_filter_is_a_malformed_packet(broker, topic, bad):
    """A filter that breaks the filter syntax makes SUBSCRIBE malformed (MQTT-4.7.1-1):
    DISCONNECT 0x81 and close, as Mosquitto does."""
    r = _raw_subscribe(broker, [(bad, 1), (f"{topic}/ok", 1)])
    try:
        p = r.read_packet()
        assert p is not None and p[0] == DISCONNECT and p[2][0] == 0x81, f"expected DISCONNECT 0x81, got {p}"
        assert r.wait_closed(TIMEOUT) == []
    finally:
        r.close()


@pytest.mark.ferrymq_only(reason="Mosquitto 2.0.11 answers a bad $share group with DISCONNECT 0x81 "
                                 "(malformed packet) instead of SUBACK 0x8F")
@pytest.mark.parametrize("bad", ["$share/g#/t", "$share/g", "$share//t"])
def test_suback_invalid_shared_filter_reason_code(broker, topic, bad):
    r = _raw_subscribe(broker, [(bad, 1), (f"{topic}/ok", 1)])
    try:
        p = r.read_packet()
        assert p is not None and p[0] == SUBACK, f"expected SUBACK, got {p}"
        assert _suback_codes(p[2]) == [0x8F, 0x01]
        # The connection stays usable.
        r.send(bytes([0xC0, 0]))
        assert r.read_packet() == (13, 0, b"")
    finally:
        r.close()


def test_invalid_filter_rejected(broker, mqtt, topic):
    """Either answer is conformant: SUBACK 0x8F (Topic Filter invalid) for that
    filter, or DISCONNECT with a reason >= 0x80 and close.  Never a success code."""
    r = _raw_subscribe(broker, [("a/#/b", 1)])
    try:
        p = r.read_packet()
        assert p is not None, "connection closed without SUBACK or DISCONNECT"
        if p[0] == SUBACK:
            assert _suback_codes(p[2]) == [0x8F]
        else:
            assert p[0] == DISCONNECT and p[2][0] >= 0x80, p
            assert r.wait_closed(TIMEOUT) == []
    finally:
        r.close()
    # The broker is still fine for everybody else.
    c = sub_client(mqtt, topic)
    c.publish(topic, b"alive", qos=1)
    assert c.get().payload == b"alive"


# ------------------------------------------------------------ shared subscriptions
def gather(clients: list[Client], n: int, timeout: float = TIMEOUT) -> dict[str, list]:
    """Poll several clients until n messages arrived in total (bounded), then
    observe a quiet window so duplicates would be seen."""
    got: dict[str, list] = {c.name: [] for c in clients}
    deadline = time.monotonic() + timeout
    while sum(len(v) for v in got.values()) < n:
        if time.monotonic() > deadline:
            raise MqttError(f"only {sum(len(v) for v in got.values())} of {n} messages: "
                            f"{ {k: len(v) for k, v in got.items()} }")
        for c in clients:
            try:
                got[c.name].append(c.messages.get(timeout=0.02))
            except Exception:
                pass
    for c in clients:
        got[c.name] += c.drain(QUIET / len(clients))
    return got


def test_shared_subscription_each_message_to_exactly_one_member(mqtt, topic):
    members = [sub_client(mqtt, f"$share/g1/{topic}/#", qos=1, name=f"g1-{i}") for i in range(3)]
    other_group = sub_client(mqtt, f"$share/g2/{topic}/#", qos=1, name="g2-0")
    plain = sub_client(mqtt, f"{topic}/#", qos=1, name="plain")
    pub = mqtt(name="pub")
    n = 30
    payloads = [f"job-{i}".encode() for i in range(n)]
    for p in payloads:
        pub.publish(f"{topic}/jobs", p, qos=1)
    # Non-shared subscribers and each other group get everything, in order.
    assert [m.payload for m in plain.expect(n)] == payloads
    assert [m.payload for m in other_group.expect(n)] == payloads
    got = gather(members, n)
    all_payloads = [m.payload for msgs in got.values() for m in msgs]
    assert sorted(all_payloads) == sorted(payloads), "each message exactly once across the group"
    assert all(m.topic == f"{topic}/jobs" and m.qos == 1 for msgs in got.values() for m in msgs)
    for msgs in got.values():  # per member, the order of publication is kept
        mine = [m.payload for m in msgs]
        assert mine == [p for p in payloads if p in set(mine)]


def test_shared_subscription_remaining_members_get_everything(mqtt, topic):
    a = sub_client(mqtt, f"$share/grp/{topic}", qos=1, name="a")
    b = sub_client(mqtt, f"$share/grp/{topic}", qos=1, name="b")
    b.unsubscribe(f"$share/grp/{topic}")
    pub = mqtt()
    payloads = [f"{i}".encode() for i in range(10)]
    for p in payloads:
        pub.publish(topic, p, qos=1)
    assert [m.payload for m in a.expect(10)] == payloads
    b.assert_no_message(QUIET)


def test_shared_subscription_qos0_and_single_member(mqtt, topic):
    only = sub_client(mqtt, f"$share/solo/{topic}", qos=0, name="solo")
    pub = mqtt()
    for i in range(5):
        pub.publish(topic, f"{i}".encode(), qos=0)
    assert [m.payload for m in only.expect(5)] == [f"{i}".encode() for i in range(5)]


# ------------------------------------------------------------------ properties
def test_publish_properties_round_trip(mqtt, topic):
    sub = sub_client(mqtt, topic, qos=1)
    pub = mqtt()
    user = [("a", "1"), ("b", "2"), ("a", "3"), ("ünï", "cødé")]
    corr = bytes(range(256))[::-1]
    pub.publish(topic, "héllo".encode(), qos=1, properties=publish_props(
        UserProperty=user, ContentType="application/json; charset=utf-8",
        ResponseTopic=f"{topic}/reply", CorrelationData=corr, PayloadFormatIndicator=1))
    m = sub.get()
    assert m.payload == "héllo".encode()
    # [MQTT-3.3.2-17/18] user properties forwarded unaltered, order preserved.
    assert m.user_properties == user
    assert m.p("ContentType") == "application/json; charset=utf-8"
    assert m.p("ResponseTopic") == f"{topic}/reply"
    assert m.p("CorrelationData") == corr
    assert m.p("PayloadFormatIndicator") == 1


def test_request_response_with_correlation_data(mqtt, topic):
    requests = f"{topic}/requests"
    responder = sub_client(mqtt, requests, qos=1, name="responder")
    requester = sub_client(mqtt, f"{topic}/responses/#", qos=1, name="requester")
    for i in range(3):
        requester.publish(requests, f"q{i}".encode(), qos=1, properties=publish_props(
            ResponseTopic=f"{topic}/responses/r{i}", CorrelationData=f"corr-{i}".encode()))
    for _ in range(3):
        req = responder.get()
        responder.publish(req.p("ResponseTopic"), req.payload.upper(), qos=1,
                          properties=publish_props(CorrelationData=req.p("CorrelationData")))
    answers = requester.expect(3)
    assert {(m.topic, m.payload, m.p("CorrelationData")) for m in answers} == {
        (f"{topic}/responses/r{i}", f"Q{i}".encode(), f"corr-{i}".encode()) for i in range(3)}


# ------------------------------------------------------------------ message expiry
def test_message_expiry_while_subscriber_offline(mqtt, topic):
    cid = unique_id("expiry")
    sub = mqtt(client_id=cid, clean=True, properties=connect_props(SessionExpiryInterval=300))
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    pub = mqtt()
    pub.publish(topic, b"short", qos=1, properties=publish_props(MessageExpiryInterval=1))
    pub.publish(topic, b"long", qos=1, properties=publish_props(MessageExpiryInterval=120))
    pub.publish(topic, b"forever", qos=1)
    # The point is the passage of time: let the 1 s message expire while queued.
    time.sleep(2.2)
    back = mqtt(client_id=cid, clean=False, connect=False)
    assert back.connect(properties=connect_props(SessionExpiryInterval=300)).session_present is True
    got = back.expect(2)
    assert [m.payload for m in got] == [b"long", b"forever"]
    # [MQTT-3.3.2-6] the forwarded expiry is the remaining lifetime.
    remaining = got[0].p("MessageExpiryInterval")
    assert remaining is not None and 100 <= remaining <= 120, remaining
    assert got[1].p("MessageExpiryInterval") is None
    back.assert_no_message(QUIET)


def test_retained_message_expiry(mqtt, topic):
    pub = mqtt()
    pub.publish(topic, b"ephemeral", qos=1, retain=True, properties=publish_props(MessageExpiryInterval=1))
    early = mqtt(name="early")
    early.subscribe(topic, qos=1)
    m = early.get()
    assert (m.payload, m.retain) == (b"ephemeral", True)
    assert m.p("MessageExpiryInterval") in (0, 1)
    time.sleep(2.2)  # let the retained message expire: time passing is what is tested
    late = mqtt(name="late")
    late.subscribe(topic, qos=1)
    pub.publish(topic, b"fence", qos=1)
    assert late.collect_until(b"fence") == [], "expired retained message was delivered"


# -------------------------------------------------------------- subscription options
def test_no_local(mqtt, topic):
    me = mqtt(name="me")
    assert me.subscribe(topic, options=opts(1, no_local=True)) == [1]
    other = mqtt(name="other")
    me.publish(topic, b"mine", qos=1)  # routed before "theirs" is even sent
    other.publish(topic, b"theirs", qos=1)
    m = me.get()
    assert m.payload == b"theirs", "no-local subscription received the client's own message"
    me.assert_no_message(QUIET)


def test_without_no_local_own_messages_are_delivered(mqtt, topic):
    me = sub_client(mqtt, topic, qos=1)
    me.publish(topic, b"mine", qos=1)
    assert me.get().payload == b"mine"


def test_retain_as_published(mqtt, topic):
    rap = mqtt(name="rap")
    assert rap.subscribe(topic, options=opts(1, rap=True)) == [1]
    plain = mqtt(name="plain")
    assert plain.subscribe(topic, options=opts(1, rap=False)) == [1]
    pub = mqtt()
    pub.publish(topic, b"retained", qos=1, retain=True)
    pub.publish(topic, b"normal", qos=1, retain=False)
    assert [(m.payload, m.retain) for m in rap.expect(2)] == [(b"retained", True), (b"normal", False)]
    assert [(m.payload, m.retain) for m in plain.expect(2)] == [(b"retained", False), (b"normal", False)]


def test_retain_handling_0_send_on_every_subscribe(mqtt, topic):
    pub = mqtt()
    pub.publish(topic, b"R", qos=1, retain=True)
    c = mqtt()
    c.subscribe(topic, options=opts(1, rh=SEND_ON_SUBSCRIBE))
    m = c.get()
    assert (m.payload, m.retain) == (b"R", True)
    c.subscribe(topic, options=opts(1, rh=SEND_ON_SUBSCRIBE))  # re-subscribe: sent again
    m = c.get()
    assert (m.payload, m.retain) == (b"R", True)


def test_retain_handling_1_send_only_for_new_subscription(mqtt, topic):
    pub = mqtt()
    pub.publish(topic, b"R", qos=1, retain=True)
    c = mqtt()
    c.subscribe(topic, options=opts(1, rh=SEND_IF_NEW_SUB))
    m = c.get()
    assert (m.payload, m.retain) == (b"R", True)
    c.subscribe(topic, options=opts(1, rh=SEND_IF_NEW_SUB))  # exists already: not sent
    pub.publish(topic, b"fence", qos=1)
    assert c.collect_until(b"fence") == []


def test_retain_handling_2_never_send(mqtt, topic):
    pub = mqtt()
    pub.publish(topic, b"R", qos=1, retain=True)
    c = mqtt()
    c.subscribe(f"{topic}/#", options=opts(1, rh=DO_NOT_SEND))
    c.subscribe(topic, options=opts(1, rh=DO_NOT_SEND))
    pub.publish(f"{topic}/x", b"fence", qos=1)
    assert c.collect_until(b"fence") == []
    pub.publish(topic, b"live", qos=1)  # live messages still flow
    assert c.get().payload == b"live"


def test_subscription_identifiers(mqtt, topic):
    c = mqtt()
    c.subscribe(f"{topic}/+", qos=1, properties=subscribe_props(SubscriptionIdentifier=7))
    c.subscribe(f"{topic}/a/#", qos=1, properties=subscribe_props(SubscriptionIdentifier=268435455))
    c.subscribe(f"{topic}/plain/#", qos=1)
    pub = mqtt()
    pub.publish(f"{topic}/x", b"only-7", qos=1)
    m = c.get()
    assert (m.payload, m.subscription_ids) == (b"only-7", [7])
    pub.publish(f"{topic}/a/b", b"only-max", qos=1)
    m = c.get()
    assert (m.payload, m.subscription_ids) == (b"only-max", [268435455])
    pub.publish(f"{topic}/plain/x", b"none", qos=1)
    m = c.get()
    assert (m.payload, m.subscription_ids) == (b"none", [])
    # Overlap: {topic}/a matches '+' (id 7) and 'a/#' (id max).  One copy with both
    # identifiers or one copy per subscription: both are allowed [MQTT-3.3.4-3..5].
    pub.publish(f"{topic}/a", b"both", qos=1)
    pub.publish(f"{topic}/plain/fence", b"fence", qos=1)
    copies = c.collect_until(b"fence")
    assert copies and all(x.payload == b"both" for x in copies)
    ids = sorted(i for x in copies for i in x.subscription_ids)
    assert ids == [7, 268435455]


def test_subscription_identifier_updated_by_resubscribe(mqtt, topic):
    c = mqtt()
    c.subscribe(topic, qos=1, properties=subscribe_props(SubscriptionIdentifier=1))
    c.subscribe(topic, qos=1, properties=subscribe_props(SubscriptionIdentifier=2))
    pub = mqtt()
    pub.publish(topic, b"x", qos=1)
    assert c.get().subscription_ids == [2]
    c.assert_no_message(QUIET)


# ------------------------------------------------------------------ topic alias
def test_topic_alias_from_client(mqtt, topic):
    sub = sub_client(mqtt, f"{topic}/#", qos=1)
    pub = mqtt(connect=False)
    ack = pub.connect()
    alias_max = ack.p("TopicAliasMaximum", 0)
    assert alias_max >= 2, f"broker advertises Topic Alias Maximum {alias_max}"
    t1, t2 = f"{topic}/first/long/topic/name", f"{topic}/second"
    pub.publish(t1, b"set-1", qos=1, properties=publish_props(TopicAlias=1))
    pub.publish("", b"use-1", qos=1, properties=publish_props(TopicAlias=1))
    pub.publish(t2, b"set-2", qos=0, properties=publish_props(TopicAlias=2))
    pub.publish("", b"use-2", qos=2, properties=publish_props(TopicAlias=2))
    pub.publish(t2, b"remap-1", qos=1, properties=publish_props(TopicAlias=1))  # alias 1 -> t2
    pub.publish("", b"use-1-again", qos=1, properties=publish_props(TopicAlias=1))
    got = sub.expect(6)
    assert [(m.topic, m.payload) for m in got] == [
        (t1, b"set-1"), (t1, b"use-1"), (t2, b"set-2"), (t2, b"use-2"), (t2, b"remap-1"), (t2, b"use-1-again")]
    # Aliases are per connection: the broker must not forward the client's alias.
    assert all(m.p("TopicAlias") is None for m in got)


def test_topic_alias_above_maximum_is_rejected(mqtt, topic):
    pub = mqtt(connect=False)
    alias_max = pub.connect().p("TopicAliasMaximum", 0)
    with pytest.raises(MqttError):
        pub.publish(topic, b"x", qos=1, properties=publish_props(TopicAlias=alias_max + 1))
    rc = pub.wait_closed()
    assert int(rc.value) == 0x94, f"expected DISCONNECT 0x94 (Topic Alias invalid), got {rc}"


def test_unknown_topic_alias_is_protocol_error(mqtt, topic):
    pub = mqtt()
    with pytest.raises(MqttError):
        pub.publish("", b"x", qos=1, properties=publish_props(TopicAlias=1))
    rc = pub.wait_closed()
    assert int(rc.value) == 0x82, f"expected DISCONNECT 0x82 (Protocol Error), got {rc}"


# --------------------------------------------------------------- session expiry
def test_session_expiry_zero_ends_session_at_disconnect(mqtt, topic):
    cid = unique_id("sx0")
    c = mqtt(client_id=cid, clean=True)  # no Session Expiry Interval: 0
    c.subscribe(topic, qos=1)
    c.disconnect()
    again = mqtt(client_id=cid, clean=False, connect=False)
    assert again.connect().session_present is False


def test_session_expiry_keeps_session_and_queues_messages(mqtt, topic):
    cid = unique_id("sx300")
    c = mqtt(client_id=cid, clean=True, properties=connect_props(SessionExpiryInterval=300))
    c.subscribe(topic, qos=2)
    c.disconnect()
    pub = mqtt()
    for i in range(5):
        pub.publish(topic, f"q{i}".encode(), qos=1 + i % 2)
    back = mqtt(client_id=cid, clean=False, connect=False)
    ack = back.connect(properties=connect_props(SessionExpiryInterval=300))
    assert ack.session_present is True
    got = back.expect(5)
    sent = [(f"q{i}".encode(), 1 + i % 2) for i in range(5)]
    assert sorted((m.payload, m.qos) for m in got) == sorted(sent)
    # Order is only guaranteed among messages of the same QoS (MQTT 5 section 4.6);
    # Mosquitto sends queued QoS 1 before QoS 2.
    for q in (1, 2):
        assert [m.payload for m in got if m.qos == q] == [p for p, pq in sent if pq == q]


def test_session_expires_after_interval(mqtt, topic):
    cid = unique_id("sx1")
    c = mqtt(client_id=cid, clean=True, properties=connect_props(SessionExpiryInterval=1))
    c.subscribe(topic, qos=1)
    c.disconnect()
    pub = mqtt()
    pub.publish(topic, b"too-late", qos=1)
    time.sleep(2.5)  # the session must outlive its 1 s expiry: time passing is what is tested
    back = mqtt(client_id=cid, clean=False, connect=False)
    assert back.connect(properties=connect_props(SessionExpiryInterval=60)).session_present is False
    back.subscribe(f"{topic}/fence", qos=1)
    pub.publish(f"{topic}/fence", b"fence", qos=1)
    assert back.collect_until(b"fence") == []


def test_session_expiry_zero_in_disconnect_overrides_connect(mqtt, topic):
    cid = unique_id("sxdisc")
    c = mqtt(client_id=cid, clean=True, properties=connect_props(SessionExpiryInterval=300))
    c.subscribe(topic, qos=1)
    c.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    back = mqtt(client_id=cid, clean=False, connect=False)
    assert back.connect(properties=connect_props(SessionExpiryInterval=300)).session_present is False


def test_clean_start_discards_existing_session(mqtt, topic):
    cid = unique_id("cs")
    c = mqtt(client_id=cid, clean=True, properties=connect_props(SessionExpiryInterval=300))
    c.subscribe(topic, qos=1)
    c.disconnect()
    fresh = mqtt(client_id=cid, clean=True, connect=False)
    assert fresh.connect(properties=connect_props(SessionExpiryInterval=300)).session_present is False
    fresh.subscribe(f"{topic}/fence", qos=1)
    pub = mqtt()
    pub.publish(topic, b"old-sub", qos=1)
    pub.publish(f"{topic}/fence", b"fence", qos=1)
    assert fresh.collect_until(b"fence") == []


MOSQ_RESTORE = ("Mosquitto 2.0.11 does not restore a v5 session from its persistence file when the "
                "session was created with Clean Start=1 (session_present=0 after restart)")


@pytest.mark.persistence
@pytest.mark.parametrize("first_clean,expiry", [
    pytest.param(False, 0xFFFFFFFF, id="cleanstart0-never-expires"),
    pytest.param(False, 3600, id="cleanstart0-3600s"),
    pytest.param(True, 3600, id="cleanstart1-3600s", marks=pytest.mark.ferrymq_only(reason=MOSQ_RESTORE)),
])
def test_session_and_queued_messages_survive_broker_restart(broker, mqtt, topic, first_clean, expiry):
    cid = unique_id("sxrestart")
    c = mqtt(client_id=cid, clean=first_clean, properties=connect_props(SessionExpiryInterval=expiry))
    c.subscribe(topic, qos=1)
    c.disconnect()
    pub = mqtt()
    pub.publish(topic, b"queued-1", qos=1)
    pub.publish(topic, b"queued-2", qos=2)
    pub.disconnect()
    broker.restart()
    back = mqtt(client_id=cid, clean=False, connect=False)
    assert back.connect(properties=connect_props(SessionExpiryInterval=expiry)).session_present is True
    got = back.expect(2)
    assert [(m.payload, m.qos) for m in got] == [(b"queued-1", 1), (b"queued-2", 1)]


# -------------------------------------------------------------------------- wills
def will_props(**kw) -> Properties:
    return props(PacketTypes.WILLMESSAGE, **kw)


def test_will_on_abnormal_disconnect_with_properties(mqtt, topic):
    watcher = sub_client(mqtt, f"{topic}/will", qos=2, name="watcher")
    dying = mqtt(name="dying", will=dict(
        topic=f"{topic}/will", payload=b"bye", qos=2, retain=False,
        properties=will_props(ContentType="text/plain", UserProperty=[("why", "crash")],
                              ResponseTopic=f"{topic}/ack", CorrelationData=b"\x01\x02")))
    dying.drop()
    m = watcher.get()
    assert (m.topic, m.payload, m.qos) == (f"{topic}/will", b"bye", 2)
    assert m.p("ContentType") == "text/plain"
    assert m.user_properties == [("why", "crash")]
    assert m.p("ResponseTopic") == f"{topic}/ack"
    assert m.p("CorrelationData") == b"\x01\x02"


def test_no_will_on_normal_disconnect(mqtt, topic):
    watcher = sub_client(mqtt, f"{topic}/will", qos=1, name="watcher")
    polite = mqtt(name="polite", will=dict(topic=f"{topic}/will", payload=b"bye", qos=1))
    polite.disconnect()  # reason code 0x00
    # Nothing to wait for: watch for a bounded quiet window.
    watcher.assert_no_message(QUIET)


def test_will_on_disconnect_with_will_message_reason(mqtt, topic):
    watcher = sub_client(mqtt, f"{topic}/will", qos=1, name="watcher")
    c = mqtt(name="leaving", will=dict(topic=f"{topic}/will", payload=b"asked-for", qos=1))
    c.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
    assert watcher.get().payload == b"asked-for"


def test_will_delay_interval(mqtt, topic):
    watcher = sub_client(mqtt, f"{topic}/will", qos=1, name="watcher")
    dying = mqtt(name="dying", properties=connect_props(SessionExpiryInterval=60), will=dict(
        topic=f"{topic}/will", payload=b"late-will", qos=1, properties=will_props(WillDelayInterval=1)))
    t0 = time.monotonic()
    dying.drop()
    m = watcher.get(timeout=TIMEOUT)
    elapsed = time.monotonic() - t0
    assert m.payload == b"late-will"
    assert elapsed >= 0.9, f"will published after {elapsed:.2f}s despite a 1 s Will Delay Interval"


def test_will_delay_cancelled_by_reconnect(mqtt, topic):
    watcher = sub_client(mqtt, f"{topic}/will", qos=1, name="watcher")
    cid = unique_id("wd")
    dying = mqtt(client_id=cid, name="dying", properties=connect_props(SessionExpiryInterval=60), will=dict(
        topic=f"{topic}/will", payload=b"should-not", qos=1, properties=will_props(WillDelayInterval=3)))
    dying.drop()
    back = mqtt(client_id=cid, clean=False, connect=False)
    assert back.connect(properties=connect_props(SessionExpiryInterval=60)).session_present is True
    # [MQTT-3.1.3-9] reconnecting before the delay ends cancels the will.  Watch
    # past the 3 s delay (bounded).
    watcher.assert_no_message(4.0)


# ---------------------------------------------------------------- unsubscribe
def test_unsuback_reason_codes(mqtt, topic):
    c = mqtt()
    c.subscribe(topic, qos=1)
    assert c.unsubscribe([topic, f"{topic}/never"]) == [0x00, 0x11]
    pub = mqtt()
    pub.publish(topic, b"after-unsub", qos=1)
    c.subscribe(f"{topic}/fence", qos=1)
    pub.publish(f"{topic}/fence", b"fence", qos=1)
    assert c.collect_until(b"fence") == []
