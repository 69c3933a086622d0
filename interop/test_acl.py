"""MQTT authorization seen by paho clients (3.1.1 and 5.0).

* The Eclipse Paho interoperability suite's ``test_subscribe_failure``
  (``interoperability/client_test.py`` / ``client_test5.py``): a broker configured so that
  ``test/nosubscribe`` may not be subscribed to answers that SUBSCRIBE with a failure, here
  with FerryMQ's ``[[auth.rules]]``: SUBACK 0x80 for 3.1.1, 0x87 (Not authorized) for 5.0,
  while ``test/#`` is granted.  (The Paho 5.0 suite itself wants 0x80 and its packet decoder
  refuses any other failure code; 0x87 is one of the MQTT 5 SUBACK codes, §3.9.3.)
  FerryMQ only.
* A Mosquitto ``acl_file`` written by the test (``user`` / ``topic`` / ``pattern`` lines,
  ``%u`` / ``%c``), with users logging in with passwords: read and write kept apart per
  user.  FerryMQ behaves as Mosquitto 2.0.11 does with an ``acl_file``: every SUBSCRIBE is
  granted with the QoS asked for (whatever the client may read), and a message on a topic
  the client may not read is not delivered to it (checked at delivery); a 5.0 publish to a
  topic the user may not write gets PUBACK / PUBREC 0x87, a 3.1.1 one is acked and dropped
  (3.1.1 has no refusal code) and never reaches a subscriber that may read the topic.
  These tests run against both brokers: FerryMQ is given the file as
  ``auth.mosquitto_acl_file`` (users in ``auth.users``); with ``INTEROP_BROKER=mosquitto``
  the reference Mosquitto gets it as ``acl_file``, with a ``password_file`` made by its
  ``mosquitto_passwd`` (both lines added through ``INTEROP_MOSQUITTO_EXTRA_CONF``).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from brokers import Broker, broker_kind
from mqttclient import V5, V311, Client, unique_id
from rawmqtt import CONNACK, PUBLISH, Raw, mqtt_str, packet, varint

PUBREC = 5

VERSIONS = [pytest.param(V311, id="v311"), pytest.param(V5, id="v5")]
# SUBACK failure: 3.1.1 has one code; 5.0's "Not authorized".
REFUSED = {V311: 0x80, V5: 0x87}
# A publish the user may not write: 5.0 PUBACK 0x87 (Not authorized); 3.1.1 acked (0).
NOT_WRITTEN = {V311: 0, V5: 0x87}
# A publish that is allowed: 5.0 PUBACK 0x00, or 0x10 (No matching subscribers).
WRITTEN = (0x00, 0x10)


@pytest.fixture
def brokers(request, tmp_path, monkeypatch):
    """brokers.ferrymq(config_text) -> a started FerryMQ given that TOML as --config;
    brokers.mosquitto(conf_lines) -> a started reference Mosquitto with these extra config
    lines; both stopped at the end of the test.  brokers.client(broker, version, user=None,
    password=None, client_id=None) -> a connected paho Client for it, closed at the end."""
    started: list[Broker] = []
    clients: list[Client] = []

    def start(b: Broker) -> Broker:
        started.append(b)
        # the broker's log goes with a failure report (conftest's makereport hook)
        request.node._interop_brokers = getattr(request.node, "_interop_brokers", []) + [(b, None)]
        b.start()
        return b

    def ferrymq(config_text: str) -> Broker:
        conf = tmp_path / f"ferrymq-{len(started)}.toml"
        conf.write_text(config_text)
        return start(Broker("ferrymq", tmp_path / f"broker-{len(started)}", config=conf))

    def mosquitto(conf_lines: list[str]) -> Broker:
        # The harness's hook for extra Mosquitto config lines; any the run was given are kept.
        extra = tmp_path / f"mosquitto-extra-{len(started)}.conf"
        given = os.environ.get("INTEROP_MOSQUITTO_EXTRA_CONF")
        before = Path(given).read_text().splitlines() if given else []
        extra.write_text("\n".join(before + conf_lines) + "\n")
        monkeypatch.setenv("INTEROP_MOSQUITTO_EXTRA_CONF", str(extra))
        return start(Broker("mosquitto", tmp_path / f"broker-{len(started)}"))

    def client(b: Broker, version: int, user: str | None = None, password: str | None = None,
               client_id: str | None = None, connect: bool = True) -> Client:
        c = Client(b.host, b.port, client_id or unique_id(user or "anon"), version=version,
                   name=f"{user or 'anonymous'}/{'5' if version == V5 else '3.1.1'}")
        clients.append(c)
        if user is not None:
            c.c.username_pw_set(user, password)
        if connect:
            c.connect()
        return c

    yield SimpleNamespace(ferrymq=ferrymq, mosquitto=mosquitto, client=client)
    for c in clients:
        c.close()
    for b in started:
        died = b.proc is not None and b.proc.poll() is not None
        b.stop()
        if died:
            pytest.fail(f"{b.kind} was not running at the end of the test\n{b.read_log()}", pytrace=False)


def sub_many(c: Client, filters: list[str], qos: int = 2) -> list[int]:
    """One SUBSCRIBE with several filters; the SUBACK's codes in order."""
    if c.version == V5:
        return c.subscribe([(f, SubscribeOptions(qos=qos)) for f in filters])
    return c.subscribe([(f, qos) for f in filters])


def received(c: Client, fence: bytes) -> list[tuple[str, bytes]]:
    """(topic, payload) of what c received before the fence message."""
    return [(m.topic, m.payload) for m in c.collect_until(fence)]


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


@pytest.mark.ferrymq_only(reason="FerryMQ's [[auth.rules]] (Mosquitto's acl_file never refuses a SUBSCRIBE)")
@pytest.mark.parametrize("version", VERSIONS)
def test_paho_suite_subscribe_failure_with_rules(brokers, version):
    b = brokers.ferrymq(PAHO_SUITE_RULES)
    # The suite's clients are anonymous (allowed: loopback listener, passwords not checked).
    sub = brokers.client(b, version)
    # client_test.py / client_test5.py: subscribe([nosubscribe_topics[0]], [2]) -> failure
    assert sub.subscribe("test/nosubscribe", qos=2) == [REFUSED[version]]
    assert sub.subscribe("test/#", qos=2) == [2]
    # Decided per filter in one SUBSCRIBE; a filter merely overlapping the refused one is granted.
    probe = brokers.client(b, version)
    assert sub_many(probe, ["test/+", "test/nosubscribe", "other/x"], qos=1) == [1, REFUSED[version], 1]

    # Publishing there is not refused (the rule is about subscribing; 5.0: 0x00 or 0x10
    # No matching subscribers), and "subscribe" covers receiving: the test/# subscriber is
    # not sent test/nosubscribe, while the fence after it arrives.
    pub = brokers.client(b, version)
    assert pub.publish("test/nosubscribe", b"must not arrive", qos=1) in WRITTEN
    pub.publish("test/fence", b"fence", qos=1)
    assert sub.collect_until(b"fence") == []
    # ...and test/# still delivers everything else.
    pub.publish("test/a", b"hello", qos=2)
    m = sub.get()
    assert (m.topic, m.payload, m.qos) == ("test/a", b"hello", 2)


# ----------------------------------------------------------- Mosquitto's acl_file
# As a team moving off Mosquitto has it.  alice reads sensors (but not sensors/secret) and
# writes commands; bob the other way round, and dispatches: he reads everyone's
# users/+/out and writes everyone's users/+/in.  The patterns apply to every client (even
# after a user line): each client owns clients/<its id>/#, each user may write
# users/<name>/out and read users/<name>/in.
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
topic write users/+/in

pattern readwrite clients/%c/#
pattern write users/%u/out
pattern read users/%u/in
"""
USERS = {"alice": "pw", "bob": "bob-pw"}


@pytest.fixture
def acl_broker(brokers, tmp_path):
    """The broker under test with ACL_FILE and USERS: FerryMQ with auth.mosquitto_acl_file
    and auth.users; the reference Mosquitto (INTEROP_BROKER=mosquitto) with acl_file and a
    password_file made by mosquitto_passwd."""
    acl = tmp_path / "acl_file"
    acl.write_text(ACL_FILE)
    if broker_kind() == "mosquitto":
        tool = shutil.which("mosquitto_passwd")
        assert tool, "mosquitto_passwd (Debian's mosquitto package) is needed for the password file"
        pwfile = tmp_path / "passwd"
        for i, (user, password) in enumerate(USERS.items()):
            subprocess.run([tool, *(["-c"] if i == 0 else []), "-b", str(pwfile), user, password],
                           check=True, capture_output=True, timeout=30)
        return brokers.mosquitto([f"password_file {pwfile}", f"acl_file {acl}"])
    users = ", ".join(f'{{ name = "{u}", password = "{pw}" }}' for u, pw in USERS.items())
    return brokers.ferrymq(f"""
[auth]
mqtt = true
users = [{users}]
mosquitto_acl_file = "{acl}"
""")


@pytest.mark.parametrize("version", VERSIONS)
def test_acl_file_separates_read_and_write(brokers, acl_broker, version):
    b = acl_broker
    alice = brokers.client(b, version, "alice", "pw")
    bob = brokers.client(b, version, "bob", "bob-pw")

    # Every SUBSCRIBE is granted with the QoS asked for, whatever alice may read: the
    # acl_file is applied to what is delivered.  (One client per filter, so that
    # overlapping filters cannot make copies; sensors/fence, which alice reads, is the fence.)
    assert alice.subscribe("sensors/+/temp", qos=1) == [1]
    alice.unsubscribe("sensors/+/temp")
    assert alice.subscribe("sensors/#", qos=1) == [1]
    alice_cmd = brokers.client(b, version, "alice", "pw")
    assert sub_many(alice_cmd, ["commands/#", "sensors/fence"], qos=1) == [1, 1], "commands/# is write-only for alice"
    alice_secret = brokers.client(b, version, "alice", "pw")
    assert sub_many(alice_secret, ["sensors/secret", "sensors/fence"], qos=2) == [2, 2], "topic deny sensors/secret"
    alice_all = brokers.client(b, version, "alice", "pw")
    assert alice_all.subscribe("#", qos=1) == [1], "a filter wider than what alice may read"
    assert bob.subscribe("commands/#", qos=1) == [1]

    # What alice writes reaches bob...
    assert alice.publish("commands/pump/1", b"start", qos=1) in WRITTEN
    m = bob.get()
    assert (m.topic, m.payload) == ("commands/pump/1", b"start")
    # ...and bob's sensors reach alice, except sensors/secret: bob's fence after them (on a
    # topic every alice client reads) arrives after sensors/room1/temp alone.  alice's
    # command, which bob had received before he published, is not delivered to her either.
    bob.publish("sensors/secret", b"classified", qos=1)
    assert bob.publish("sensors/room1/temp", b"21.5", qos=1) in WRITTEN
    bob.publish("sensors/fence", b"fence", qos=1)
    reading = [("sensors/room1/temp", b"21.5")]
    assert received(alice, b"fence") == reading
    assert received(alice_all, b"fence") == reading, "# delivers only what alice may read"
    assert received(alice_cmd, b"fence") == [], "commands/# granted, nothing delivered"
    assert received(alice_secret, b"fence") == [], "sensors/secret granted, nothing delivered"

    # What alice may read keeps coming on the same subscriptions.
    bob.publish("sensors/room2/temp", b"19.0", qos=1)
    assert (alice.get().topic, alice_all.get().topic) == ("sensors/room2/temp",) * 2


def test_acl_file_v5_publish_refused_with_0x87(brokers, acl_broker):
    b = acl_broker
    alice = brokers.client(b, V5, "alice", "pw")
    bob = brokers.client(b, V5, "bob", "bob-pw")
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


def test_acl_file_v311_publish_acked_and_dropped(brokers, acl_broker):
    b = acl_broker
    alice = brokers.client(b, V311, "alice", "pw")
    bob = brokers.client(b, V311, "bob", "bob-pw")
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
def test_acl_file_patterns_name_the_client(brokers, acl_broker, version):
    b = acl_broker
    cid, other = unique_id("alice"), unique_id("someone")
    alice = brokers.client(b, version, "alice", "pw", client_id=cid)
    bob = brokers.client(b, version, "bob", "bob-pw")
    # bob again, from another client id: clients/<other>/# is his there.
    someone = brokers.client(b, version, "bob", "bob-pw", client_id=other)

    # Granted with the QoS asked for, whatever the patterns let alice read; sensors/fence
    # (alice reads it, bob writes it) is the fence.
    assert sub_many(alice, ["clients/+/status", "users/+/in", "users/alice/out", "sensors/fence"],
                    qos=1) == [1, 1, 1, 1]
    assert bob.subscribe("users/+/out", qos=1) == [1]

    # %c: alice's own client id only.
    assert alice.publish(f"clients/{cid}/status", b"up", qos=1) in WRITTEN
    m = alice.get()
    assert (m.topic, m.payload) == (f"clients/{cid}/status", b"up")
    assert alice.publish(f"clients/{other}/status", b"not alice's", qos=1) == NOT_WRITTEN[version]
    assert someone.publish(f"clients/{other}/status", b"someone's", qos=1) in WRITTEN
    # %u: alice writes users/alice/out (bob reads it; write-only for her: not delivered to
    # her own users/alice/out subscription) and reads users/alice/in, not users/carol/in.
    assert alice.publish("users/alice/out", b"from alice", qos=1) in WRITTEN
    m = bob.get()
    assert (m.topic, m.payload) == ("users/alice/out", b"from alice")
    assert someone.publish("users/carol/in", b"for carol", qos=1) in WRITTEN
    assert someone.publish("users/alice/in", b"for alice", qos=1) in WRITTEN
    someone.publish("sensors/fence", b"fence", qos=1)
    assert received(alice, b"fence") == [("users/alice/in", b"for alice")]

    # Writing as another user, or where alice may only read: refused (5.0) or dropped
    # (3.1.1), never delivered (the fences come after them on alice's connection).
    assert alice.publish("users/bob/out", b"spoofed", qos=1) == NOT_WRITTEN[version]
    assert alice.publish("users/alice/in", b"read-only", qos=1) == NOT_WRITTEN[version]
    alice.publish("users/alice/out", b"fence-bob", qos=1)
    alice.publish(f"clients/{cid}/status", b"fence-alice", qos=1)
    assert bob.collect_until(b"fence-bob") == []
    assert alice.collect_until(b"fence-alice") == []
