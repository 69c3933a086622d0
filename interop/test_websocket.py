"""MQTT over WebSocket: paho-mqtt clients with ``transport="websockets"`` (path ``/mqtt``,
paho offers the ``mqtt`` subprotocol, binary frames) on FerryMQ's WebSocket listener (the
READY line's ``ws=`` pair, ``--mqtt-ws-listen`` with an ephemeral port), talking to paho
TCP clients on the same broker: QoS 0/1/2 both ways for MQTT 3.1.1 and 5.0 with payloads
intact (up to 200 kB, several WebSocket frames on either side of the 64 KiB frame-length
boundary), a will published when a WebSocket client goes away without DISCONNECT (the TCP
connection shut, or a WebSocket close frame), not after a DISCONNECT, and a retained
message delivered to a WebSocket subscriber.

FerryMQ only: the reference Mosquitto is started with a TCP listener alone."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from mqttclient import V5, V311, Client, unique_id

pytestmark = pytest.mark.ferrymq_only(reason="the harness gives only FerryMQ a WebSocket listener (READY ws=)")

VERSIONS = [pytest.param(V311, id="v311"), pytest.param(V5, id="v5")]
PAYLOADS = [
    b"",
    b"hello over websocket",
    bytes(range(256)),
    "ünïcødé ✓".encode(),
    os.urandom(65_535),   # around the WebSocket 16-bit / 64-bit frame-length boundary
    os.urandom(65_536),
    os.urandom(200_000),  # > 64 KiB
]


class WsClient(Client):
    """The suite's paho wrapper (mqttclient.Client) over MQTT-over-WebSocket."""

    def __init__(self, host: str, port: int, path: str = "/mqtt", **kw):
        super().__init__(host, port, **kw)
        self.c.transport = "websockets"
        self.c.ws_set_options(path=path)

    def _tcp(self) -> socket.socket | None:
        ws = self.c.socket()  # paho's _WebsocketWrapper around the TCP socket
        return getattr(ws, "_socket", None)

    def drop(self) -> None:
        """Abnormal close: the TCP connection shut, no DISCONNECT, no WebSocket close frame."""
        sock = self._tcp()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.wait_closed()
        self._stop_loop()

    def ws_close(self) -> None:
        """A WebSocket close frame (1000, masked as a client's must be) without an MQTT DISCONNECT."""
        sock = self._tcp()
        assert sock is not None, "not connected"
        ws = self.c.socket()
        sock.sendall(bytes(ws._create_frame(ws.OPCODE_CONNCLOSE, bytearray(struct.pack("!H", 1000)), 1)))
        self.wait_closed()
        self._stop_loop()


@pytest.fixture
def ws_addr(broker) -> tuple[str, int]:
    ws = broker.listeners.get("ws")
    if ws is None:
        pytest.fail(f"FerryMQ's READY line has no ws=ADDR pair (started with --mqtt-ws-listen): {broker.listeners}",
                    pytrace=False)
    return ws


@pytest.fixture
def ws(ws_addr):
    """ws(version=V5, client_id=None, will=None, connect=True, **connect_kwargs) -> WsClient"""
    made: list[WsClient] = []

    def make(version: int = V5, client_id: str | None = None, will: dict | None = None, connect: bool = True,
             **connect_kwargs) -> WsClient:
        c = WsClient(ws_addr[0], ws_addr[1], client_id=client_id or unique_id("ws"), version=version)
        made.append(c)
        if will:
            c.will_set(**will)
        if connect:
            c.connect(**connect_kwargs)
        return c

    yield make
    for c in made:
        c.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_websocket_and_tcp_clients_exchange_every_qos_both_ways(ws, mqtt, topic, version):
    w = ws(version=version)
    t = mqtt(version=version)
    assert w.subscribe(f"{topic}/to-ws/#", qos=2) == [2]
    assert t.subscribe(f"{topic}/to-tcp/#", qos=2) == [2]
    for src, dst, direction in ((t, w, "to-ws"), (w, t, "to-tcp")):
        for qos in (0, 1, 2):
            for i, payload in enumerate(PAYLOADS):
                src.publish(f"{topic}/{direction}/q{qos}/{i}", payload, qos=qos)
            got = dst.expect(len(PAYLOADS))
            assert [m.topic for m in got] == [f"{topic}/{direction}/q{qos}/{i}" for i in range(len(PAYLOADS))]
            for m, payload in zip(got, PAYLOADS):
                assert m.payload == payload, f"{direction} QoS {qos}: {len(m.payload)} bytes, sent {len(payload)}"
                assert (m.qos, m.retain, m.dup) == (qos, False, False), (direction, qos, m.qos, m.retain, m.dup)
    # Still connected both ways after ~40 messages and ~2 MB over the WebSocket.
    assert w.connected and t.connected


def test_a_websocket_client_talks_to_a_websocket_client(ws, topic):
    a, b = ws(version=V311), ws(version=V5)
    b.subscribe(f"{topic}/#", qos=1)
    a.publish(f"{topic}/x", b"ws to ws", qos=1)
    m = b.get()
    assert (m.topic, m.payload, m.qos) == (f"{topic}/x", b"ws to ws", 1)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("how", ["tcp-shutdown", "websocket-close-frame"])
def test_a_websocket_clients_will_reaches_a_tcp_subscriber(ws, mqtt, topic, version, how):
    sub = mqtt(version=version)
    sub.subscribe(f"{topic}/will", qos=1)
    # A DISCONNECT first: no will.
    polite = ws(version=version, will=dict(topic=f"{topic}/will", payload=b"polite", qos=1))
    polite.disconnect()
    w = ws(version=version, will=dict(topic=f"{topic}/will", payload=b"gone \x00\xff", qos=1))
    getattr(w, "drop" if how == "tcp-shutdown" else "ws_close")()
    m = sub.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (f"{topic}/will", b"gone \x00\xff", 1, False)
    # The polite client's will, had it been published, would most likely have come first (it
    # disconnected first); no fence orders two connections' wills, so also a bounded quiet window.
    sub.assert_no_message()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_retained_message_is_delivered_to_a_websocket_subscriber(ws, mqtt, topic, version):
    pub = mqtt(version=V311)
    big = os.urandom(100_000)
    pub.publish(f"{topic}/state", b"on", qos=1, retain=True)
    pub.publish(f"{topic}/big", big, qos=1, retain=True)
    w = ws(version=version)
    assert w.subscribe(f"{topic}/#", qos=1) == [1]
    got = sorted(w.expect(2), key=lambda m: m.topic)
    assert [(m.topic, m.retain, m.qos) for m in got] == [(f"{topic}/big", True, 1), (f"{topic}/state", True, 1)]
    assert got[0].payload == big and got[1].payload == b"on"
    # Live delivery afterwards has retain 0.
    pub.publish(f"{topic}/state", b"off", qos=1, retain=True)
    m = w.get()
    assert (m.topic, m.payload, m.retain) == (f"{topic}/state", b"off", False)


def test_the_overview_names_the_websocket_listener(broker, ws_addr):
    # What the dashboard relies on: the ws listener is its own port, named in /api/overview.
    import base64
    import json
    import urllib.request

    assert ws_addr[1] != broker.port
    host, port = broker.listeners["http"]
    req = urllib.request.Request(f"http://{host}:{port}/api/overview",
                                 headers={"authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        listeners = json.load(r)["listeners"]
    assert any(l["protocol"] == "http/web-mqtt" and l["port"] == ws_addr[1] for l in listeners), listeners
