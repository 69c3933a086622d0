#!/usr/bin/env python3
"""Open and hold idle MQTT 3.1.1 connections, each optionally subscribed and/or over TLS,
and report the broker's RSS per connection (what `mqload conns` does for plain ones).

Usage: idle_clients.py --port P --pid BROKER_PID [--count N] [--hold S] [--subscribe]
                       [--tls CA_PEM] [--concurrency C]

Each connection sends CONNECT (clean session, keep-alive 60 s, client id idle-<i>) and waits
for CONNACK; with --subscribe it then subscribes to its own topic `idle/<i>` at QoS 1 and
waits for SUBACK. Once every attempt finished and 2 s passed, the broker's RSS is sampled (VmRSS of
/proc/PID/status); the connections are held for --hold seconds (RSS sampled again at the
end), then closed. Prints one
JSON line. Bounded: every step has a timeout, the whole run at most a few minutes.
"""
import argparse
import asyncio
import json
import resource
import ssl
import struct
import sys
import time


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def utf8(s):
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def packet(kind, body):
    n, rem = len(body), b""
    while True:
        byte, n = n % 128, n // 128
        rem += bytes([byte | (0x80 if n else 0)])
        if not n:
            return bytes([kind]) + rem + body


def connect_packet(client_id):
    return packet(0x10, utf8("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + utf8(client_id))


def subscribe_packet(topic):
    return packet(0x82, struct.pack("!H", 1) + utf8(topic) + bytes([1]))


async def read_packet(reader):
    head = await reader.readexactly(1)
    mult, length = 1, 0
    while True:
        b = (await reader.readexactly(1))[0]
        length += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            break
    return head[0], await reader.readexactly(length)


async def open_one(i, args, ctx, held, sem):
    async with sem:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(args.host, args.port, ssl=ctx, server_hostname="localhost" if ctx else None),
                args.step_timeout)
            writer.write(connect_packet(f"idle-{i}"))
            kind, body = await asyncio.wait_for(read_packet(reader), args.step_timeout)
            if kind != 0x20 or body[1] != 0:
                raise RuntimeError(f"CONNACK refused: {body!r}")
            if args.subscribe:
                writer.write(subscribe_packet(f"idle/{i}"))
                kind, body = await asyncio.wait_for(read_packet(reader), args.step_timeout)
                if kind != 0x90 or body[2:] != b"\x01":
                    raise RuntimeError(f"SUBACK refused: {body!r}")
            held.append(writer)
            return True
        except Exception as e:  # counted, the first few printed
            if args.errors < 5:
                print(f"connection {i}: {e!r}", file=sys.stderr)
            args.errors += 1
            return False


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--count", type=int, default=10000)
    p.add_argument("--hold", type=float, default=10)
    p.add_argument("--subscribe", action="store_true")
    p.add_argument("--tls", metavar="CA_PEM")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--step-timeout", type=float, default=30)
    args = p.parse_args()
    args.errors = 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ctx = None
    if args.tls:
        ctx = ssl.create_default_context(cafile=args.tls)
    before = rss_kb(args.pid)
    held, sem = [], asyncio.Semaphore(args.concurrency)
    started = time.monotonic()
    results = await asyncio.gather(*(open_one(i, args, ctx, held, sem) for i in range(args.count)))
    took = time.monotonic() - started
    await asyncio.sleep(2)  # let the broker settle (its idle memory given back)
    connected = rss_kb(args.pid)
    await asyncio.sleep(max(0.0, args.hold - 2))
    held_rss = rss_kb(args.pid)
    for w in held:
        w.close()
    ok = sum(results)
    print(json.dumps({
        "succeeded": ok,
        "failed": args.count - ok,
        "subscribe": args.subscribe,
        "tls": bool(args.tls),
        "connect_seconds": round(took, 2),
        "broker_rss_before_kb": before,
        "broker_rss_connected_kb": connected,
        "broker_rss_end_of_hold_kb": held_rss,
        "kb_per_connection": round((connected - before) / ok, 3) if ok else None,
    }))
    return 0 if ok == args.count else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
