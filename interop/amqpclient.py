"""Helpers for the AMQP 0-9-1 tests: connection parameters / URLs for the broker
under test, and a bounded consumer on a pika BlockingChannel.

Every wait drives the connection's I/O loop (``process_data_events``) in short
slices until the expected event (a delivery, a fence) has happened, bounded by a
timeout; nothing sleeps.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

import pika
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

# Default bound of every wait (seconds), as in mqttclient.
TIMEOUT = 10.0
# How long "no message arrives" is observed where no fence is possible.
QUIET = 1.0

USER = "guest"
PASSWORD = "guest"
VHOST = "/"


def unique(prefix: str = "itest") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def url(addr: tuple[str, int], user: str = USER, password: str = PASSWORD, vhost: str = VHOST,
        **query: Any) -> str:
    """``amqp://guest:guest@127.0.0.1:PORT/%2F`` (the vhost is URL-encoded: ``/`` is ``%2F``)."""
    host, port = addr
    u = f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{quote(vhost, safe='')}"
    if query:
        u += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return u


def params(addr: tuple[str, int], user: str = USER, password: str = PASSWORD, vhost: str = VHOST,
           **kw: Any) -> pika.ConnectionParameters:
    """pika connection parameters with bounded socket / handshake timeouts and a single
    attempt, so a broker that does not answer fails the test instead of hanging it."""
    kw.setdefault("connection_attempts", 1)
    kw.setdefault("socket_timeout", 5)
    kw.setdefault("stack_timeout", 10)
    kw.setdefault("blocked_connection_timeout", 10)
    return pika.ConnectionParameters(host=addr[0], port=addr[1], virtual_host=vhost,
                                     credentials=pika.PlainCredentials(user, password), **kw)


@dataclass
class Delivery:
    """One message as a pika consumer (basic.deliver) or basic.get observed it."""

    method: Any
    properties: pika.BasicProperties
    body: bytes

    @property
    def delivery_tag(self) -> int:
        return self.method.delivery_tag

    @property
    def redelivered(self) -> bool:
        return self.method.redelivered

    @property
    def routing_key(self) -> str:
        return self.method.routing_key

    @property
    def exchange(self) -> str:
        return self.method.exchange

    @property
    def headers(self) -> dict:
        return dict(self.properties.headers or {})


class AmqpWaitError(AssertionError):
    pass


def pump(conn: BlockingConnection, pred: Callable[[], Any], timeout: float = TIMEOUT, what: str = "event") -> Any:
    """Drive the connection's I/O until pred() returns something truthy (returned),
    at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        left = deadline - time.monotonic()
        if left <= 0:
            raise AmqpWaitError(f"no {what} within {timeout}s")
        conn.process_data_events(time_limit=min(left, 0.05))


class Consumer:
    """``basic.consume`` on a BlockingChannel; deliveries are queued in arrival order
    and read with get / expect / collect_until / assert_none."""

    def __init__(self, ch: BlockingChannel, queue: str, auto_ack: bool = False, **kw: Any):
        self.ch = ch
        self.conn = ch.connection
        self.queue = queue
        self.pending: deque[Delivery] = deque()
        self.tag = ch.basic_consume(queue, self._on_message, auto_ack=auto_ack, **kw)

    def _on_message(self, ch, method, properties, body) -> None:
        self.pending.append(Delivery(method, properties, body))

    def get(self, timeout: float = TIMEOUT) -> Delivery:
        pump(self.conn, lambda: len(self.pending) > 0, timeout, f"delivery from {self.queue!r}")
        return self.pending.popleft()

    def expect(self, n: int, timeout: float = TIMEOUT) -> list[Delivery]:
        """n deliveries within an overall deadline."""
        try:
            pump(self.conn, lambda: len(self.pending) >= n, timeout, f"{n} deliveries from {self.queue!r}")
        except AmqpWaitError:
            raise AmqpWaitError(f"got {len(self.pending)} of {n} deliveries from {self.queue!r} within {timeout}s: "
                                f"{[d.body[:40] for d in self.pending]}") from None
        return [self.pending.popleft() for _ in range(n)]

    def collect_until(self, fence: bytes, timeout: float = TIMEOUT) -> list[Delivery]:
        """Deliveries before the one whose body is `fence` (published after the
        messages under test), which is consumed and not returned.  "X is not
        delivered" becomes an event: X would have arrived before the fence."""
        before: list[Delivery] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                d = self.get(timeout=max(left, 0.0))
            except AmqpWaitError:
                raise AmqpWaitError(f"fence {fence!r} not received from {self.queue!r} within {timeout}s; "
                                    f"before it: {[x.body[:40] for x in before]}") from None
            if d.body == fence:
                return before
            before.append(d)

    def assert_none(self, quiet: float = QUIET) -> None:
        """No delivery within `quiet` seconds (a bounded wait by necessity: used only
        where no fence can get through, e.g. a prefetch window that is full)."""
        deadline = time.monotonic() + quiet
        while time.monotonic() < deadline:
            if self.pending:
                break
            self.conn.process_data_events(time_limit=min(deadline - time.monotonic(), 0.05))
        if self.pending:
            d = self.pending[0]
            raise AmqpWaitError(f"unexpected delivery from {self.queue!r}: {d.body[:80]!r}")

    def cancel(self) -> None:
        if self.ch.is_open:
            self.ch.basic_cancel(self.tag)


def get_message(ch: BlockingChannel, queue: str, auto_ack: bool = True, timeout: float = TIMEOUT) -> Delivery:
    """basic.get until a message is there (routing into a queue is asynchronous with
    respect to another channel's publish), bounded."""
    got: list[Delivery] = []

    def poll():
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            got.append(Delivery(method, props, body))
        return got

    pump(ch.connection, poll, timeout, f"message in {queue!r} (basic.get)")
    return got[0]


def message_count(ch: BlockingChannel, queue: str) -> int:
    """Ready messages in a queue, from a passive queue.declare (Declare-Ok)."""
    return ch.queue_declare(queue, passive=True).method.message_count


def declare_stream(ch: BlockingChannel, name: str, **args: Any) -> None:
    """A stream (``x-queue-type: stream``, durable) with extra declaration arguments."""
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream", **args})
