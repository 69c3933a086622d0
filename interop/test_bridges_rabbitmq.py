"""Bridges and shovels with a real RabbitMQ node on the other side (Debian's
``rabbitmq-server``, which ``.ci/run`` installs; the node is this module's own, on its own
ports): a shovel moves a FerryMQ queue into a RabbitMQ queue, in order and without loss
while the node restarts mid-stream, and through crashes (SIGKILL, then a start on the same
ports and data) first of the node and then of FerryMQ itself, each mid-stream (the node's
durable queue and FerryMQ's durable shovel and queue come back; second copies of messages
confirmed but not yet acknowledged at a crash are allowed, a shovel is at-least-once); an
MQTT bridge carries topics both ways with RabbitMQ's MQTT plugin.

FerryMQ-only: it is FerryMQ's shovel and bridge under test."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pika
import pika.exceptions
import pytest

import amqpclient
from brokers import Broker
from mqttclient import V311, Client, MqttError, unique_id

pytestmark = [pytest.mark.amqp, pytest.mark.ferrymq_only(reason="FerryMQ's shovels and bridges are under test")]

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
WAIT = 30.0


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory):
    if not RABBITMQ_SERVER.exists():
        if os.environ.get("INTEROP_REQUIRE_RABBITMQ") == "1":
            pytest.fail("rabbitmq-server is not installed (.ci/run installs it)")
        pytest.skip("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
    node = Broker("rabbitmq", tmp_path_factory.mktemp("rabbit"))
    node.start()
    yield node
    node.stop()


def api(broker, method: str, path: str, body=None):
    http = broker.listeners["http"]
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{http[0]}:{http[1]}{path}", data=data, method=method)
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None


def wait_for(what: str, check, limit: float = WAIT):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def shovel_state(broker, name: str) -> dict:
    _, rows = api(broker, "GET", "/api/shovels")
    return next((r for r in rows if r["name"] == name), {})


def consume_all(addr, queue: str, want: set[int]) -> list[int]:
    """Consumes from ``queue`` until every number in ``want`` arrived; the first arrivals
    in order."""
    conn = pika.BlockingConnection(amqpclient.params(addr))
    try:
        ch = conn.channel()
        seen: set[int] = set()
        order: list[int] = []
        deadline = time.monotonic() + WAIT * 2
        for method, _props, body in ch.consume(queue, inactivity_timeout=1.0):
            assert time.monotonic() < deadline, f"missing {sorted(want - seen)[:10]}..."
            if method is None:
                continue
            n = int(body.decode()[1:])
            if n not in seen:
                seen.add(n)
                order.append(n)
            ch.basic_ack(method.delivery_tag)
            if want <= seen:
                break
        ch.cancel()
        return order
    finally:
        conn.close()


def test_a_shovel_moves_a_queue_into_rabbitmq_through_a_restart_of_the_node(broker, rabbit, amqp):
    name = unique_id("shovel")
    _, rport = rabbit.amqp_addr
    status, _ = api(broker, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
        "src-uri": "amqp://", "src-queue": f"{name}.out",
        "dest-uri": f"amqp://guest:guest@127.0.0.1:{rport}/%2F", "dest-queue": f"{name}.in",
        "reconnect-delay": 0.5,
    }})
    assert status == 201
    wait_for("the shovel running", lambda: shovel_state(broker, name).get("state") == "running")

    conn = amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(100):
        ch.basic_publish("", f"{name}.out", f"m{i}".encode(), persistent)
    wait_for("part of the stream moved", lambda: shovel_state(broker, name).get("messages_moved", 0) >= 30)
    # The node restarts mid-stream (every connection closed; durable queue and persistent
    # messages recovered); FerryMQ's publishers go on.
    rabbit.restart()
    for i in range(100, 200):
        ch.basic_publish("", f"{name}.out", f"m{i}".encode(), persistent)
    order = consume_all(rabbit.amqp_addr, f"{name}.in", set(range(200)))
    assert order == sorted(order), f"order kept: {order}"
    assert len(order) == 200
    # The source queue is drained once everything is confirmed at RabbitMQ.
    wait_for("the source queue drained",
             lambda: api(broker, "GET", f"/api/queues/%2F/{name}.out")[1].get("messages") == 0)


def erlang_vm_gone(pid: int) -> bool:
    """The OS process ``pid`` is dead (gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


class Stream(threading.Thread):
    """A publisher in a thread of its own: persistent messages ``m{first}``, ``m{first+1}``...
    to ``queue`` through the default exchange, each confirmed before the next, until
    ``halt`` is set or the connection fails (``error``).  ``next`` is the first number not
    confirmed: whoever goes on republishes from there."""

    def __init__(self, addr, queue: str, first: int):
        super().__init__(daemon=True)
        self.addr, self.queue, self.next = addr, queue, first
        self.halt = threading.Event()
        self.error: Exception | None = None

    def run(self):
        try:
            conn = pika.BlockingConnection(amqpclient.params(self.addr))
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                persistent = pika.BasicProperties(delivery_mode=2)
                while not self.halt.is_set():
                    # mandatory: an unroutable message raises instead of being dropped.
                    ch.basic_publish("", self.queue, f"m{self.next}".encode(), persistent, mandatory=True)
                    self.next += 1
            finally:
                if conn.is_open:
                    conn.close()
        except Exception as e:  # noqa: BLE001 - looked at by the test
            self.error = e

    def finish(self) -> int:
        """Halts and joins (bounded); the first number not confirmed."""
        self.halt.set()
        self.join(WAIT)
        assert not self.is_alive(), f"the publisher of {self.queue} did not stop"
        return self.next


@pytest.mark.timeout(180)  # the node starts twice (~10 s each); the first run's fixture too
def test_a_shovel_loses_nothing_when_the_node_then_ferrymq_are_killed_mid_stream(request, rabbit, tmp_path):
    name = unique_id("shovel")
    src, dest = f"{name}.out", f"{name}.in"
    # A FerryMQ of its own (it is killed); its data dir and ports are kept across the crash.
    ferry = Broker("ferrymq", tmp_path / "ferrymq", persistence=True)
    # On a failure the report shows both brokers' logs (the shared node's from now on).
    request.node._interop_brokers = getattr(request.node, "_interop_brokers", []) + [
        (ferry, None), (rabbit, rabbit.log_mark())]
    streams: list[Stream] = []

    def stream(first: int) -> Stream:
        s = Stream(ferry.amqp_addr, src, first)
        streams.append(s)
        s.start()
        return s

    def moved() -> int:
        return shovel_state(ferry, name).get("messages_moved", 0)

    ferry.start()
    try:
        _, rport = rabbit.amqp_addr
        status, _ = api(ferry, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
            "src-uri": "amqp://", "src-queue": src,
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{rport}/%2F", "dest-queue": dest,
            "reconnect-delay": 0.5,
        }})
        assert status == 201
        # Running: both queues declared (durable), the source consumed.
        wait_for("the shovel running", lambda: shovel_state(ferry, name).get("state") == "running")

        # RabbitMQ 3.10 keeps queue definitions in Mnesia, whose transaction log is
        # written asynchronously (disk_log:alog, flushed within ~2 s): a queue declared just
        # before a SIGKILL is gone after it, with the messages it had confirmed.  That is
        # RabbitMQ's, not under test: its log is synced once the shovel declared the queue.
        vm = int(rabbit.rabbitmqctl(
            "eval", "ok = disk_log:sync(latest_log), list_to_integer(os:getpid()).").stdout.strip())

        # Batch 1 is still being published (and moved) when the node crashes: its Erlang
        # VM SIGKILLed, no clean shutdown, nothing kept but what it had confirmed.  Then it
        # starts again on its ports and Mnesia dir.  FerryMQ's publisher is not concerned.
        batch1 = stream(0)
        wait_for("part of batch 1 moved", lambda: moved() >= 30)
        rabbit.kill()
        end1 = batch1.finish()
        assert batch1.error is None, f"publishing to FerryMQ failed: {batch1.error!r}"
        assert rabbit.exit_codes[-1] == -9, rabbit.exit_codes
        wait_for("the node's Erlang VM dead", lambda: erlang_vm_gone(vm), limit=10)
        rabbit.start()

        # Batch 2 is being published (and moved) when FerryMQ crashes (SIGKILL, with
        # messages confirmed to the publisher, delivered to the shovel, published and not
        # yet confirmed at RabbitMQ).  It starts again on its data dir and ports; the
        # shovel is a durable definition: it starts by itself.
        # What batch 1 left at FerryMQ (published during the outage, requeued when the link
        # failed) is moved first, then batch 2.
        left = api(ferry, "GET", f"/api/queues/%2F/{src}")[1]["messages"]
        before = moved()
        batch2 = stream(end1)
        wait_for("part of batch 2 moved after the node came back", lambda: moved() >= before + left + 30)
        ferry.kill()
        end2 = batch2.finish()
        # The publisher lost its connection; its last message unconfirmed (maybe stored).
        assert isinstance(batch2.error, pika.exceptions.AMQPConnectionError), repr(batch2.error)
        assert ferry.exit_codes[-1] == -9, ferry.exit_codes
        ferry.start()
        wait_for("the shovel running again", lambda: shovel_state(ferry, name).get("state") == "running")

        # Batch 3 from the first message not confirmed (a second copy of it is legitimate).
        total = end2 + 100
        conn = pika.BlockingConnection(amqpclient.params(ferry.amqp_addr))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            persistent = pika.BasicProperties(delivery_mode=2)
            for i in range(end2, total):
                ch.basic_publish("", src, f"m{i}".encode(), persistent, mandatory=True)
        finally:
            conn.close()

        # Every message arrives at RabbitMQ; second copies (confirmed there, not yet
        # acknowledged at the source when a side crashed) are ignored.
        order = consume_all(rabbit.amqp_addr, dest, set(range(total)))
        wrong = next((i for i in range(1, len(order)) if order[i] < order[i - 1]), None)
        assert wrong is None, (f"order kept (batches m0.., m{end1}.., m{end2}..m{total - 1}): first "
                               f"arrivals {order[max(wrong - 5, 0):wrong + 5]} around position {wrong}")
        assert len(order) == total
        # Everything is confirmed at RabbitMQ and acknowledged at FerryMQ: the source drains.
        wait_for("the source queue drained",
                 lambda: api(ferry, "GET", f"/api/queues/%2F/{src}")[1].get("messages") == 0)
    finally:
        for s in streams:
            s.halt.set()
        for s in streams:
            s.join(WAIT)
        ferry.stop()
        # The node is the module's: running again for the tests that follow, whatever
        # happened here.
        if not rabbit.alive():
            rabbit.stop()
            rabbit.start()

def test_an_mqtt_bridge_to_rabbitmqs_mqtt_plugin_carries_topics_both_ways(rabbit, tmp_path):
    t = unique_id("br")
    conf = tmp_path / "bridge.toml"
    conf.write_text(
        "[[bridge.mqtt]]\n"
        'connection = "rabbit"\n'
        f'address = "127.0.0.1:{rabbit.port}"\n'
        'remote_username = "guest"\nremote_password = "guest"\n'
        # RabbitMQ's MQTT plugin refuses Mosquitto's bridge bit: off, as for any such broker.
        "try_private = false\n"
        "restart_timeout = [0.5, 2]\n"
        f'topic = ["{t}/up/# out 1", "{t}/down/# in 1"]\n'
    )
    edge = Broker("ferrymq", tmp_path / "edge", persistence=True, config=conf)
    edge.start()
    try:
        wait_for("the bridge running", lambda: any(
            b["state"] == "running" for b in api(edge, "GET", "/api/ferrymq/bridges")[1]))
        at_rabbit = Client(rabbit.host, rabbit.port, client_id=unique_id("r"), version=V311)
        at_rabbit.c.username_pw_set("guest", "guest")
        at_rabbit.connect()
        at_rabbit.subscribe(f"{t}/up/#", qos=1)
        at_edge = Client(edge.host, edge.port, client_id=unique_id("e"), version=V311)
        at_edge.connect()
        at_edge.subscribe(f"{t}/down/#", qos=1)
        at_edge.publish(f"{t}/up/1", b"to rabbit", qos=1)
        m = at_rabbit.get(timeout=WAIT)
        assert (m.topic, m.payload) == (f"{t}/up/1", b"to rabbit")
        # The bridge's subscription at RabbitMQ is made once it connected: publish until
        # one arrives (RabbitMQ drops QoS 1 publishes nobody is subscribed to).
        got = None
        deadline = time.monotonic() + WAIT
        while got is None and time.monotonic() < deadline:
            at_rabbit.publish(f"{t}/down/1", b"to edge", qos=1)
            try:
                got = at_edge.get(timeout=1.0)
            except MqttError:
                pass
        assert got is not None and (got.topic, got.payload) == (f"{t}/down/1", b"to edge")
        at_rabbit.disconnect()
        at_edge.disconnect()
    finally:
        edge.stop()
