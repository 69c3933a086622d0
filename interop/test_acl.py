"""MQTT authorization seen by paho clients (3.1.1 and 5.0).  FerryMQ only.

* The Eclipse Paho interoperability suite's ``test_subscribe_failure``
  (``interoperability/client_test.py`` / ``client_test5.py``): a broker configured so that
  ``test/nosubscribe`` may not be subscribed to answers that SUBSCRIBE with a failure, here
  with ``[[auth.rules]]``: SUBACK 0x80 for 3.1.1, 0x87 (Not authorized) for 5.0, while
  ``test/#`` is granted.  (The Paho 5.0 suite itself wants 0x80 and its packet decoder
  refuses any other failure code; 0x87 is one of the MQTT 5 SUBACK codes, §3.9.3.)
* A Mosquitto ``acl_file`` written by the test (``user`` / ``topic`` / ``pattern`` lines,
  ``%u`` / ``%c``) as ``auth.mosquitto_acl_file``, with users logging in with passwords:
  read and write kept apart per user, a 5.0 publish to a topic the user may not write gets
  PUBACK / PUBREC 0x87, a 3.1.1 one is acked and dropped (Mosquitto's way: 3.1.1 has no
  refusal code) and never reaches a subscriber that may read the topic.

Not the reference broker's behaviour on every point: Mosquitto 2.0.11's acl_file never
refuses a SUBSCRIBE (it grants it and filters the deliveries); FerryMQ refuses a filter no
line lets the client read.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from brokers import Broker
from mqttclient import V5, V311, Client, unique_id
from rawmqtt import CONNACK, PUBLISH, Raw, mqtt_str, packet, varint

PUBREC = 5

pytestmark = pytest.mark.ferrymq_only(
    reason="FerryMQ's [[auth.rules]] and auth.mosquitto_acl_file (the reference Mosquitto reads its acl_file "
           "itself and grants every SUBSCRIBE)")

VERSIONS = [pytest.param(V311, id="v311"), pytest.param(V5, id="v5")]
# SUBACK failure: 3.1.1 has one code; 5.0's "Not authorized".
REFUSED = {V311: 0x80, V5: 0x87}


@pytest.fixture
def ferrymq(request, tmp_path):
    """ferrymq(config_text) -> a started FerryMQ given that TOML as --config; made(...)
    -> a paho Client for it (user/password optional), closed at the end of the test."""
    started: list[Broker] = []
    clients: list[Client] = []

    def start(config_text: str) -> Broker:
        conf = tmp_path / f"ferrymq-{len(started)}.toml"
        conf.write_text(config_text)
        b = Broker("ferrymq", tmp_path / f"broker-{len(started)}", config=conf)
        started.append(b)
        # the broker's log goes with a failure report (conftest's makereport hook)
        request.node._interop_brokers = getattr(request.node, "_interop_brokers", []) + [(b, None)]
        b.start()
        return b

    def make(b: Broker, version: int, user: str | None = None, password: str | None = None,
             client_id: str | None = None, connect: bool = True) -> Client:
        c = Client(b.host, b.port, client_id or unique_id(user or "anon"), version=version,
                   name=f"{user or 'anonymous'}/{'5' if version == V5 else '3.1.1'}")
        clients.append(c)
        if user is not None:
            c.c.username_pw_set(user, password)
        if connect:
            c.connect()
        return c

    start.client = make
    yield start
    for c in clients:
        c.close()
    for b in started:
        died = b.proc is not None and b.proc.poll() is not None
        b.stop()
        if died:
            pytest.fail(f"FerryMQ was not running at the end of the test\n{b.read_log()}", pytrace=False)


def sub_many(c: Client, filters: list[str], qos: int = 2) -> list[int]:
    """One SUBSCRIBE with several filters; the SUBACK's codes in order."""
    if c.version == V5:
        return c.subscribe([(f, SubscribeOptions(qos=qos)) for f in filters])
    return c.subscribe([(f, qos) for f in filters])


def connect_v5_with_login(client_id: str, user: str, password: str) -> bytes:
    """An MQTT 5 CONNECT (clean start) with a user name and password."""
    flags = 0x02 | 0x80 | 0x40
    body = mqtt_str("MQTT") + bytes([5, flags]) + struct.pack("!H", 30) + varint(0)
    body += mqtt_str(client_id) + mqtt_str(user) + mqtt_str(password)
    return packet(1, 0, body)


# ---------------------------------------------------------------- [[auth.rules]]
PAHO_SUITE_RULES = """
[auth]
authorization = true

# The Paho interoperability suite's broker: test/nosubscribe may not be subscribed to.
[[auth.rules]]
permission = "deny"
action = "subscribe"
topics = ["test/nosubscribe"]

[[auth.rules]]
permission = "allow"
action = "all"
topics = ["#"]
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_paho_suite_subscribe_failure_with_rules(ferrymq, version):
    b = ferrymq(PAHO_SUITE_RULES)
    # The suite's clients are anonymous (allowed: loopback listener, passwords not checked).
    sub = ferrymq.client(b, version)
    # client_test.py / client_test5.py: subscribe([nosubscribe_topics[0]], [2]) -> failure
    assert sub.subscribe("test/nosubscribe", qos=2) == [REFUSED[version]]
    assert sub.subscribe("test/#", qos=2) == [2]
    # Decided per filter in one SUBSCRIBE; a filter merely overlapping the refused one is granted.
    probe = ferrymq.client(b, version)
    assert sub_many(probe, ["test/+", "test/nosubscribe", "other/x"], qos=1) == [1, REFUSED[version], 1]

    # Publishing there is not refused (the rule is about subscribing; 5.0: 0x00 or 0x10
    # No matching subscribers), and "subscribe" covers receiving: the test/# subscriber is
    # not sent test/nosubscribe, while the fence after it arrives.
    pub = ferrymq.client(b, version)
    assert pub.publish("test/nosubscribe", b"must not arrive", qos=1) in (0x00, 0x10)
    pub.publish("test/fence", b"fence", qos=1)
    assert sub.collect_until(b"fence") == []
    # ...and test/# still delivers everything else.
    pub.publish("test/a", b"hello", qos=2)
    m = sub.get()
    assert (m.topic, m.payload, m.qos) == ("test/a", b"hello", 2)


# ----------------------------------------------------------- Mosquitto's acl_file
# As a team moving off Mosquitto has it.  alice reads sensors (but not sensors/secret) and
# writes commands; bob the other way round.  The patterns apply to every client (even
# after a user line): each client owns clients/<its id>/#, each user may write
# users/<name>/out and read users/<name>/in.  bob also reads everyone's users/+/out.
ACL_FILE = """\
# no `topic` line before the first `user` line: anonymous clients get nothing
user alice
topic read sensors/#
topic deny sensors/secret
topic write commands/#

user bob
topic readwrite sensors/#
topic read commands/#
topic read users/+/out

pattern readwrite clients/%c/#
pattern write users/%u/out
pattern read users/%u/in
"""


def acl_config(acl: Path) -> str:
    return f"""
[auth]
mqtt = true
users = [{{ name = "alice", password = "pw" }}, {{ name = "bob", password = "bob-pw" }}]
mosquitto_acl_file = "{acl}"
"""


@pytest.fixture
def acl_broker(ferrymq, tmp_path):
    acl = tmp_path / "acl_file"
    acl.write_text(ACL_FILE)
    return ferrymq(acl_config(acl))


@pytest.mark.parametrize("version", VERSIONS)
def test_acl_file_separates_read_and_write(ferrymq, acl_broker, version):
    b = acl_broker
    refused = REFUSED[version]
    alice = ferrymq.client(b, version, "alice", "pw")
    bob = ferrymq.client(b, version, "bob", "bob-pw")

    # alice: read-only, write-only and denied filters.
    assert alice.subscribe("sensors/+/temp", qos=1) == [1]
    alice.unsubscribe("sensors/+/temp")
    assert alice.subscribe("sensors/#", qos=1) == [1]
    assert alice.subscribe("commands/#", qos=1) == [refused], "commands/# is write-only for alice"
    assert alice.subscribe("sensors/secret", qos=1) == [refused], "topic deny sensors/secret"
    assert alice.subscribe("#", qos=1) == [refused], "a filter wider than what alice may read"
    assert bob.subscribe("commands/#", qos=1) == [1]

    # What alice writes reaches bob; what bob writes to sensors reaches alice.
    assert alice.publish("commands/pump/1", b"start", qos=1) in (0x00, 0x10)
    m = bob.get()
    assert (m.topic, m.payload) == ("commands/pump/1", b"start")
    assert bob.publish("sensors/room1/temp", b"21.5", qos=1) in (0x00, 0x10)
    m = alice.get()
    assert (m.topic, m.payload) == ("sensors/room1/temp", b"21.5")

    # sensors/# was granted, but sensors/secret is denied to alice: never delivered to her
    # (the fence after it, on a topic she reads, arrives alone).
    bob.publish("sensors/secret", b"classified", qos=1)
    bob.publish("sensors/fence", b"fence", qos=1)
    assert [m.topic for m in alice.collect_until(b"fence")] == []


def test_acl_file_v5_publish_refused_with_0x87(ferrymq, acl_broker):
    b = acl_broker
    alice = ferrymq.client(b, V5, "alice", "pw")
    bob = ferrymq.client(b, V5, "bob", "bob-pw")
    assert bob.subscribe("sensors/#", qos=2) == [2]
    # alice may read sensors, not write them: PUBACK 0x87.
    assert alice.publish("sensors/room1/temp", b"forged", qos=1) == 0x87
    # Nor a topic no line names.
    assert alice.publish("elsewhere/x", b"x", qos=1) == 0x87
    assert alice.connected
    # QoS 2: PUBREC 0x87, which ends the exchange.  Raw: paho 2.2 ignores a PUBREC's reason
    # code (it sends PUBREL anyway and reports the PUBCOMP's 0x92 Packet Identifier not found).
    raw = Raw(b.host, b.port)
    try:
        raw.send(connect_v5_with_login(unique_id("raw"), "alice", "pw"))
        ack = raw.read_packet()
        assert ack is not None and ack[0] == CONNACK and ack[2][1] == 0, f"CONNACK {ack}"
        topic = mqtt_str("sensors/room1/temp")
        raw.send(packet(PUBLISH, 0x04, topic + struct.pack("!H", 7) + varint(0) + b"forged qos2"))
        rec = raw.read_packet()
        assert rec is not None and rec[0] == PUBREC, f"expected PUBREC, got {rec}"
        assert struct.unpack("!H", rec[2][:2])[0] == 7 and rec[2][2] == 0x87, f"PUBREC body {rec[2].hex()}"
    finally:
        raw.close()
    # bob got none of it: the fence after it, from bob himself, arrives alone.
    bob.publish("sensors/fence", b"fence", qos=1)
    assert bob.collect_until(b"fence") == []


def test_acl_file_v311_publish_acked_and_dropped(ferrymq, acl_broker):
    b = acl_broker
    alice = ferrymq.client(b, V311, "alice", "pw")
    bob = ferrymq.client(b, V311, "bob", "bob-pw")
    assert bob.subscribe("sensors/#", qos=1) == [1]
    assert bob.subscribe("commands/#", qos=1) == [1]
    # 3.1.1 has no refusal code for a PUBLISH: acked (PUBACK / PUBCOMP, the connection
    # kept) and silently dropped, as Mosquitto does.
    assert alice.publish("sensors/room1/temp", b"forged qos1", qos=1) == 0
    assert alice.publish("sensors/room1/temp", b"forged qos2", qos=2) == 0
    alice.publish("sensors/room1/temp", b"forged qos0", qos=0)
    assert alice.connected
    # bob may read sensors/# but gets none of them: alice's fence on a topic she may write
    # (and bob read), sent after them on the same connection, arrives first.
    alice.publish("commands/fence", b"fence", qos=1)
    assert bob.collect_until(b"fence") == []


@pytest.mark.parametrize("version", VERSIONS)
def test_acl_file_patterns_name_the_client(ferrymq, acl_broker, version):
    b = acl_broker
    refused = REFUSED[version]
    cid = unique_id("alice")
    alice = ferrymq.client(b, version, "alice", "pw", client_id=cid)
    bob = ferrymq.client(b, version, "bob", "bob-pw")
    other = unique_id("someone")

    # %c: alice's own client id only.
    assert sub_many(alice, [f"clients/{cid}/#", f"clients/{other}/#", "clients/+/#"], qos=1) == [1, refused, refused]
    alice.publish(f"clients/{cid}/status", b"up", qos=1)
    m = alice.get()
    assert (m.topic, m.payload) == (f"clients/{cid}/status", b"up")
    # %u: users/alice/in is readable, users/alice/out writable, other users' not.
    assert alice.subscribe("users/alice/in", qos=1) == [1]
    assert alice.subscribe("users/bob/in", qos=1) == [refused]
    assert alice.subscribe("users/alice/out", qos=1) == [refused], "users/%u/out is write-only"
    assert bob.subscribe("users/+/out", qos=1) == [1]
    assert alice.publish("users/alice/out", b"from alice", qos=1) in (0x00, 0x10)
    m = bob.get()
    assert (m.topic, m.payload) == ("users/alice/out", b"from alice")
    # Writing as another user: refused (5.0) or dropped (3.1.1), never delivered.
    assert alice.publish("users/bob/out", b"spoofed", qos=1) == (0x87 if version == V5 else 0)
    assert alice.publish("users/alice/in", b"read-only", qos=1) == (0x87 if version == V5 else 0)
    alice.publish("users/alice/out", b"fence", qos=1)
    assert bob.collect_until(b"fence") == []
