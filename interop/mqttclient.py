"""A thin synchronous wrapper around a paho-mqtt 2.x client for tests.

Every operation waits for the broker's answer (CONNACK, SUBACK, UNSUBACK,
PUBACK/PUBCOMP) on an event, bounded by a timeout, and returns what the client
observed (reason codes, flags, properties).  Received messages go to a queue and
are read with ``get`` / ``expect`` / ``assert_no_message``.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

V311 = paho.MQTTv311
V5 = paho.MQTTv5

# Default bound of every wait in the suite (seconds).
TIMEOUT = 10.0
# How long "no message arrives" is observed.  A negative check can only be a
# bounded wait; this is long enough for a loopback broker to have routed a
# message that it was going to deliver.
QUIET = 1.0


def unique_id(prefix: str = "itest") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def props(packet_type: int, **values: Any) -> Properties:
    """Build MQTT v5 properties: props(PacketTypes.PUBLISH, ContentType="x", UserProperty=[("k","v")])."""
    p = Properties(packet_type)
    for k, v in values.items():
        setattr(p, k, v)
    return p


def publish_props(**values: Any) -> Properties:
    return props(PacketTypes.PUBLISH, **values)


def connect_props(**values: Any) -> Properties:
    return props(PacketTypes.CONNECT, **values)


def subscribe_props(**values: Any) -> Properties:
    return props(PacketTypes.SUBSCRIBE, **values)


def prop(properties: Properties | None, name: str, default: Any = None) -> Any:
    if properties is None:
        return default
    return getattr(properties, name, default)


@dataclass
class Msg:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    mid: int
    properties: Properties | None
    received_at: float = field(default_factory=time.monotonic)

    def p(self, name: str, default: Any = None) -> Any:
        """A v5 property of the PUBLISH (None when absent)."""
        return prop(self.properties, name, default)

    @property
    def user_properties(self) -> list[tuple[str, str]]:
        return list(self.p("UserProperty", []) or [])

    @property
    def subscription_ids(self) -> list[int]:
        v = self.p("SubscriptionIdentifier", [])
        if v is None:
            return []
        return list(v) if isinstance(v, (list, tuple)) else [v]


@dataclass
class ConnAck:
    reason_code: int
    session_present: bool
    properties: Properties | None

    def p(self, name: str, default: Any = None) -> Any:
        return prop(self.properties, name, default)


class MqttError(AssertionError):
    pass


class Client:
    """One MQTT client connection made with paho-mqtt (CallbackAPIVersion.VERSION2)."""

    def __init__(
        self,
        host: str,
        port: int,
        client_id: str | None = None,
        version: int = V5,
        clean: bool = True,
        name: str | None = None,
    ):
        self.host, self.port = host, port
        self.version = version
        self.client_id = unique_id() if client_id is None else client_id
        self.name = name or self.client_id
        kwargs: dict[str, Any] = dict(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=version,
            reconnect_on_failure=False,
        )
        if version != V5:
            kwargs["clean_session"] = clean
        self._clean = clean
        self.c = paho.Client(**kwargs)
        self.messages: queue.Queue[Msg] = queue.Queue()
        self._cond = threading.Condition()
        self._connack: ConnAck | None = None
        self._disconnected: Any = None  # reason code once the connection ended
        self._disconnect_props: Properties | None = None
        self._subacks: dict[int, list[int]] = {}
        self._unsubacks: dict[int, list[int]] = {}
        self._pubacks: dict[int, int] = {}
        self._loop_started = False
        c = self.c
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_subscribe = self._on_subscribe
        c.on_unsubscribe = self._on_unsubscribe
        c.on_publish = self._on_publish
        c.on_message = self._on_message

    # ---------------------------------------------------------------- callbacks
    def _on_connect(self, client, userdata, flags, reason_code, properties):
        with self._cond:
            self._connack = ConnAck(int(reason_code.value), bool(flags.session_present), properties)
            self._cond.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        with self._cond:
            self._disconnected = reason_code
            self._disconnect_props = properties
            self._cond.notify_all()

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties):
        with self._cond:
            self._subacks[mid] = [int(rc.value) if isinstance(rc, ReasonCode) else int(rc) for rc in reason_codes]
            self._cond.notify_all()

    def _on_unsubscribe(self, client, userdata, mid, reason_codes, properties):
        with self._cond:
            self._unsubacks[mid] = [int(rc.value) if isinstance(rc, ReasonCode) else int(rc) for rc in reason_codes]
            self._cond.notify_all()

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        with self._cond:
            self._pubacks[mid] = int(reason_code.value)
            self._cond.notify_all()

    def _on_message(self, client, userdata, m):
        self.messages.put(
            Msg(
                topic=m.topic,
                payload=bytes(m.payload),
                qos=m.qos,
                retain=bool(m.retain),
                dup=bool(m.dup),
                mid=m.mid,
                properties=getattr(m, "properties", None),
            )
        )

    def _wait(self, pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                v = pred()
                if v is not None:
                    return v
                if self._disconnected is not None and what != "disconnect":
                    raise MqttError(f"[{self.name}] connection closed ({self._disconnected}) while waiting for {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MqttError(f"[{self.name}] no {what} within {timeout}s")
                self._cond.wait(left)

    # --------------------------------------------------------------- operations
    def will_set(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False,
                 properties: Properties | None = None) -> None:
        self.c.will_set(topic, payload, qos=qos, retain=retain, properties=properties)

    def connect(
        self,
        keepalive: int = 30,
        properties: Properties | None = None,
        expect_success: bool = True,
        timeout: float = TIMEOUT,
    ) -> ConnAck:
        """Connect and wait for CONNACK.  For MQTT 5, ``clean`` (constructor) is Clean Start."""
        kwargs: dict[str, Any] = {"keepalive": keepalive}
        if self.version == V5:
            kwargs["clean_start"] = self._clean
            kwargs["properties"] = properties
        with self._cond:
            self._connack = None
            self._disconnected = None
        self.c.connect(self.host, self.port, **kwargs)
        self.c.loop_start()
        self._loop_started = True
        ack = self._wait(lambda: self._connack, timeout, "CONNACK")
        if expect_success and ack.reason_code != 0:
            raise MqttError(f"[{self.name}] CONNACK reason code {ack.reason_code}")
        return ack

    def subscribe(
        self,
        topic: str | list,
        qos: int = 0,
        options: SubscribeOptions | None = None,
        properties: Properties | None = None,
        timeout: float = TIMEOUT,
    ) -> list[int]:
        """Subscribe and return the SUBACK reason codes (granted QoS / failure codes)."""
        if self.version == V5 and options is None and not isinstance(topic, list):
            options = SubscribeOptions(qos=qos)
            qos = 0
        if self.version == V5:
            rc, mid = self.c.subscribe(topic, qos=qos, options=options, properties=properties)
        else:
            rc, mid = self.c.subscribe(topic, qos=qos)
        if rc != paho.MQTT_ERR_SUCCESS:
            raise MqttError(f"[{self.name}] subscribe failed locally: {rc}")
        return self._wait(lambda: self._subacks.get(mid), timeout, f"SUBACK for mid {mid}")

    def unsubscribe(self, topic: str | list[str], properties: Properties | None = None,
                    timeout: float = TIMEOUT) -> list[int]:
        """Unsubscribe and return UNSUBACK reason codes (MQTT 5; [] for 3.1.1)."""
        if self.version == V5:
            rc, mid = self.c.unsubscribe(topic, properties=properties)
        else:
            rc, mid = self.c.unsubscribe(topic)
        if rc != paho.MQTT_ERR_SUCCESS:
            raise MqttError(f"[{self.name}] unsubscribe failed locally: {rc}")
        return self._wait(lambda: self._unsubacks.get(mid), timeout, f"UNSUBACK for mid {mid}")

    def publish(
        self,
        topic: str,
        payload: bytes | str | None = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
        timeout: float = TIMEOUT,
    ) -> int:
        """Publish and wait until it is done: written (QoS 0), PUBACK (QoS 1) or
        PUBCOMP (QoS 2).  Returns the v5 PUBACK/PUBREC reason code (0 for QoS 0 / 3.1.1)."""
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise MqttError(f"[{self.name}] publish failed locally: {info.rc}")
        mid = info.mid
        if qos == 0:
            info.wait_for_publish(timeout)
            if not info.is_published():
                raise MqttError(f"[{self.name}] QoS 0 publish not written within {timeout}s")
            return 0
        return self._wait(lambda: self._pubacks.get(mid), timeout, f"{'PUBACK' if qos == 1 else 'PUBCOMP'} for mid {mid}")

    def get(self, timeout: float = TIMEOUT) -> Msg:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise MqttError(f"[{self.name}] no message within {timeout}s") from None

    def expect(self, n: int, timeout: float = TIMEOUT) -> list[Msg]:
        """Exactly-at-least n messages within timeout (overall deadline)."""
        out: list[Msg] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            try:
                out.append(self.messages.get(timeout=max(left, 0.0)))
            except queue.Empty:
                raise MqttError(
                    f"[{self.name}] got {len(out)} of {n} messages within {timeout}s: "
                    f"{[(m.topic, m.payload[:40]) for m in out]}"
                ) from None
        return out

    def collect_until(self, payload: bytes, timeout: float = TIMEOUT) -> list[Msg]:
        """Messages received before the one whose payload is `payload` (a "fence"
        published after the messages under test); the fence itself is not returned.
        This turns "X is not delivered" into an event: once the fence, published
        after X, has arrived, X would have arrived before it."""
        before: list[Msg] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                m = self.messages.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise MqttError(
                    f"[{self.name}] fence {payload!r} not received within {timeout}s; before it: "
                    f"{[(x.topic, x.payload[:40]) for x in before]}"
                ) from None
            if m.payload == payload:
                return before
            before.append(m)

    def drain(self, quiet: float = QUIET) -> list[Msg]:
        """Messages arriving until none arrives for `quiet` seconds (bounded by the
        quiet window; used to count deliveries, e.g. to detect duplicates)."""
        out = []
        while True:
            try:
                out.append(self.messages.get(timeout=quiet))
            except queue.Empty:
                return out

    def assert_no_message(self, quiet: float = QUIET) -> None:
        """Assert that no message arrives within `quiet` seconds.  This is a bounded
        wait by necessity: the absence of a message has no event to wait for."""
        try:
            m = self.messages.get(timeout=quiet)
        except queue.Empty:
            return
        raise MqttError(f"[{self.name}] unexpected message: topic={m.topic!r} payload={m.payload[:80]!r} retain={m.retain}")

    def disconnect(self, reasoncode: ReasonCode | None = None, properties: Properties | None = None,
                   timeout: float = TIMEOUT) -> None:
        """Clean DISCONNECT and stop the network thread."""
        if self._disconnected is None:
            self.c.disconnect(reasoncode=reasoncode, properties=properties)
            self._wait(lambda: self._disconnected, timeout, "disconnect")
        self._stop_loop()

    def drop(self) -> None:
        """Abnormal close: shut the TCP connection down without sending DISCONNECT."""
        sock = self.c.socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.wait_closed()
        self._stop_loop()

    def wait_closed(self, timeout: float = TIMEOUT):
        """Wait until the connection is gone (closed by the broker or by drop());
        returns the disconnect reason code paho reports."""
        return self._wait(lambda: self._disconnected, timeout, "disconnect")

    @property
    def connected(self) -> bool:
        return self._disconnected is None and self._connack is not None and self.c.is_connected()

    @property
    def disconnect_reason(self):
        return self._disconnected

    @property
    def disconnect_properties(self):
        return self._disconnect_props

    def close(self) -> None:
        """Best-effort cleanup at the end of a test."""
        try:
            if self._loop_started and self._disconnected is None and self.c.is_connected():
                self.c.disconnect()
                try:
                    self._wait(lambda: self._disconnected, 2.0, "disconnect")
                except MqttError:
                    pass
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop_started:
            self._loop_started = False
            # With reconnect_on_failure=False the thread ends once disconnected;
            # drop unacked outgoing state so loop_stop cannot wait for it forever.
            with self.c._out_message_mutex:
                self.c._out_messages.clear()
            self.c._out_packet.clear()
            t = self.c._thread
            self.c.loop_stop()
            if t is not None:
                t.join(5)
            try:
                sock = self.c.socket()
                if sock is not None:
                    sock.close()
            except OSError:
                pass
