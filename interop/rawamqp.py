"""A hand-made AMQP 0-9-1 client on a raw socket, for what a well-behaved library
will not do: negotiate a heartbeat and then stay silent (pika and aio-pika send
heartbeats on their own), or look at the frames the broker sends.

Only the connection handshake and frame reading are implemented."""

from __future__ import annotations

import socket
import struct
import time

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE

# (class, method) ids
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)


def shortstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!B", len(b)) + b


def longstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!I", len(b)) + b


def method_frame(channel: int, ids: tuple[int, int], args: bytes) -> bytes:
    payload = struct.pack("!HH", *ids) + args
    return struct.pack("!BHI", FRAME_METHOD, channel, len(payload)) + payload + bytes([FRAME_END])


class Frame:
    def __init__(self, type_: int, channel: int, payload: bytes):
        self.type, self.channel, self.payload = type_, channel, payload

    @property
    def method(self) -> tuple[int, int] | None:
        if self.type != FRAME_METHOD:
            return None
        return struct.unpack("!HH", self.payload[:4])

    def close_reply(self) -> tuple[int, str]:
        """(reply-code, reply-text) of a connection.close / channel.close."""
        code, n = struct.unpack("!HB", self.payload[4:7])
        return code, self.payload[7:7 + n].decode(errors="replace")

    def __repr__(self) -> str:
        return f"Frame(type={self.type}, channel={self.channel}, method={self.method}, {len(self.payload)} bytes)"


class Closed(Exception):
    """The broker closed the TCP connection (EOF or reset)."""


class RawAmqp:
    def __init__(self, host: str, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self, timeout: float) -> Frame:
        """The next frame; Closed when the broker closes the connection, TimeoutError
        when nothing arrives within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                type_, channel, size = struct.unpack("!BHI", self.buf[:7])
                if len(self.buf) >= 8 + size:
                    payload, end = self.buf[7:7 + size], self.buf[7 + size]
                    self.buf = self.buf[8 + size:]
                    if end != FRAME_END:
                        raise AssertionError(f"bad frame end byte {end:#x}")
                    return Frame(type_, channel, payload)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete frame within {timeout}s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError(f"no complete frame within {timeout}s") from None
            except (ConnectionResetError, BrokenPipeError) as e:
                raise Closed(repr(e)) from None
            if not chunk:
                raise Closed("EOF")
            self.buf += chunk

    def expect_method(self, ids: tuple[int, int], timeout: float = 10.0) -> Frame:
        while True:
            f = self.read_frame(timeout)
            if f.type == FRAME_HEARTBEAT:
                continue
            if f.method != ids:
                raise AssertionError(f"expected method {ids}, got {f}")
            return f

    def handshake(self, heartbeat: int, user: str = "guest", password: str = "guest", vhost: str = "/") -> dict:
        """Protocol header, Start/Start-Ok (PLAIN), Tune/Tune-Ok with `heartbeat`,
        Open/Open-Ok.  Returns the broker's Tune values."""
        self.send(PROTOCOL_HEADER)
        self.expect_method(CONNECTION_START)
        client_props = b""  # empty field table
        start_ok = (struct.pack("!I", len(client_props)) + client_props + shortstr("PLAIN")
                    + longstr(b"\x00" + user.encode() + b"\x00" + password.encode()) + shortstr("en_US"))
        self.send(method_frame(0, CONNECTION_START_OK, start_ok))
        tune = self.expect_method(CONNECTION_TUNE)
        channel_max, frame_max, server_hb = struct.unpack("!HIH", tune.payload[4:12])
        self.send(method_frame(0, CONNECTION_TUNE_OK, struct.pack("!HIH", channel_max, frame_max, heartbeat)))
        self.send(method_frame(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00"))
        self.expect_method(CONNECTION_OPEN_OK)
        return {"channel_max": channel_max, "frame_max": frame_max, "heartbeat": server_hb}
