"""Hand-made MQTT packets over a plain socket, for what a well-behaved client
library will not send (bad protocol levels, invalid filters, empty client ids
with a persistent session, silent keep-alive expiry)."""

from __future__ import annotations

import socket
import struct
import time

CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK = 8, 9, 10, 11
PINGREQ, PINGRESP, DISCONNECT = 12, 13, 14


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        if n:
            b |= 0x80
        out.append(b)
        if not n:
            return bytes(out)


def mqtt_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes([(ptype << 4) | flags]) + varint(len(body)) + body


def connect_packet(client_id: str = "", level: int = 4, clean: bool = True, keepalive: int = 30,
                   protocol_name: str = "MQTT", v5_props: bytes = b"") -> bytes:
    flags = 0x02 if clean else 0
    body = mqtt_str(protocol_name) + bytes([level, flags]) + struct.pack("!H", keepalive)
    if level == 5:
        body += varint(len(v5_props)) + v5_props
    body += mqtt_str(client_id)
    return packet(CONNECT, 0, body)


def subscribe_packet(pid: int, filters: list[tuple[str, int]], v5: bool) -> bytes:
    body = struct.pack("!H", pid)
    if v5:
        body += varint(0)
    for f, opts in filters:
        body += mqtt_str(f) + bytes([opts])
    return packet(SUBSCRIBE, 0x2, body)


class Raw:
    """A raw MQTT connection.  Every read is bounded by `timeout`."""

    def __init__(self, host: str, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.timeout = timeout
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read_exact(self, n: int, deadline: float) -> bytes | None:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete packet in time")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None  # closed by peer
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_packet(self, timeout: float | None = None) -> tuple[int, int, bytes] | None:
        """(type, flags, body), or None when the broker closed the connection."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        first = self._read_exact(1, deadline)
        if first is None:
            return None
        mult, length = 1, 0
        while True:
            b = self._read_exact(1, deadline)
            if b is None:
                return None
            length += (b[0] & 0x7F) * mult
            mult *= 128
            if not b[0] & 0x80:
                break
        body = self._read_exact(length, deadline) if length else b""
        if body is None:
            return None
        return first[0] >> 4, first[0] & 0x0F, body

    def wait_closed(self, timeout: float) -> list[tuple[int, int, bytes]]:
        """Read until the broker closes the connection; returns the packets seen
        before the close.  Raises TimeoutError if it is still open at the deadline."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                p = self.read_packet(timeout=max(deadline - time.monotonic(), 0.001))
            except (ConnectionResetError, BrokenPipeError):
                return seen
            if p is None:
                return seen
            seen.append(p)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def decode_varint(data: bytes, pos: int) -> tuple[int, int]:
    mult, value = 1, 0
    while True:
        b = data[pos]
        pos += 1
        value += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            return value, pos
