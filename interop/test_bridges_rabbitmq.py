"""Bridges and shovels with a real RabbitMQ node on the other side (Debian's
``rabbitmq-server``, which ``.ci/run`` installs; the node is this module's own, on its own
ports): a shovel moves a FerryMQ queue into a RabbitMQ queue, in order and without loss
while the node restarts mid-stream; an MQTT bridge carries topics both ways with
RabbitMQ's MQTT plugin.

FerryMQ-only: it is FerryMQ's shovel and bridge under test."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pika
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
