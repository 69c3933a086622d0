#!/usr/bin/env python3
"""SUBSCRIBE-then-PUBLISH race over raw MQTT 3.1.1 (stdlib only).

usage: subscribe_race.py NAME PORT VARIANT [R] [USER PASS]
  VARIANT: fresh    - topic has no subscriber before B's SUBSCRIBE
           existing - A subscribes to the topic first (waits for its SUBACK)
           control  - sanity check: B waits for its SUBACK before A publishes
Per round: new client ids, topic race/<n>; connect A and B (both CONNACKs), then
b.sendall(SUBSCRIBE) immediately followed by a.sendall(PUBLISH qos1), then read B
until the payload is seen or 2 s after B's SUBACK. A miss = B never got the PUBLISH.
"""
import os, signal, socket, struct, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interop"))
from rawmqtt import mqtt_str as s, varint as enc_len  # noqa: E402

HOST = "127.0.0.1"
WAIT = float(os.environ.get("RACE_WAIT", "2"))
GAP = float(os.environ.get("RACE_GAP", "0"))  # extra only: sleep between the two sends


def pkt(first, body):
    return bytes([first]) + enc_len(len(body)) + body


def connect_pkt(cid, user=None, pw=None):
    flags = 0x02  # clean session
    payload = s(cid)
    if user is not None:
        flags |= 0x80
        payload += s(user)
    if pw is not None:
        flags |= 0x40
        payload += s(pw)
    return pkt(0x10, s("MQTT") + bytes([4, flags]) + struct.pack("!H", 60) + payload)


def subscribe_pkt(pid, topic, qos=1):
    return pkt(0x82, struct.pack("!H", pid) + s(topic) + bytes([qos]))


def publish_pkt(pid, topic, payload):
    return pkt(0x32, s(topic) + struct.pack("!H", pid) + payload)


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection((HOST, port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def sendall(self, b):
        self.sock.sendall(b)

    def read_packet(self, deadline):
        """Return (type_byte, body) or None at deadline."""
        while True:
            if len(self.buf) >= 2:
                mult, n, i = 1, 0, 1
                ok = False
                while i < len(self.buf) and i <= 4:
                    d = self.buf[i]
                    n += (d & 0x7F) * mult
                    mult *= 128
                    i += 1
                    if not d & 0x80:
                        ok = True
                        break
                if ok and len(self.buf) >= i + n:
                    first, body = self.buf[0], self.buf[i:i + n]
                    self.buf = self.buf[i + n:]
                    return first, body
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                d = self.sock.recv(65536)
            except socket.timeout:
                return None
            if not d:
                raise ConnectionError("closed by broker")
            self.buf += d

    def expect(self, ptype, timeout=5.0):
        dl = time.monotonic() + timeout
        while True:
            p = self.read_packet(dl)
            if p is None:
                raise TimeoutError("no packet type %x" % ptype)
            if p[0] >> 4 == ptype:
                return p
            self.handle_other(p)

    def handle_other(self, p):
        if p[0] >> 4 == 3 and (p[0] >> 1) & 3 == 1:  # qos1 publish -> puback
            tl = struct.unpack("!H", p[1][:2])[0]
            pid = p[1][2 + tl:4 + tl]
            self.sendall(b"\x40\x02" + pid)

    def close(self):
        try:
            self.sendall(b"\xe0\x00")
        except OSError:
            pass
        self.sock.close()


def publish_payload(body):
    tl = struct.unpack("!H", body[:2])[0]
    return body[2 + tl + 2:]


def main():
    name, port, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    R = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    user = sys.argv[5] if len(sys.argv) > 5 else None
    pw = sys.argv[6] if len(sys.argv) > 6 else None
    tag = "%d%s" % (os.getpid(), variant[0])
    misses, stats = [], [0, 0, 0, 0]  # errors, pub_before_suback, a_no_puback, rounds done
    late = []  # delivery delay after SUBACK (s)
    t0 = time.time()
    done = 0

    def on_term(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    try:
        loop(port, variant, R, user, pw, tag, misses, late, stats)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    errors, pub_before_suback, a_no_puback, done = stats
    mx = max(late) if late else 0.0
    print("RESULT broker=%s variant=%s R=%d done=%d misses=%d errors=%d pub_before_suback=%d "
          "a_no_puback=%d max_deliv_after_suback=%.3fs elapsed=%.1fs miss_rounds=%s"
          % (name, variant, R, done, len(misses), errors, pub_before_suback, a_no_puback, mx,
             time.time() - t0, misses[:20]), flush=True)


def loop(port, variant, R, user, pw, tag, misses, late, stats):
    for n in range(1, R + 1):
        stats[3] = n - 1
        topic = "race/%d" % n
        payload = ("p-%s-%d" % (tag, n)).encode()
        a = b = None
        try:
            a = Conn(port)
            b = Conn(port)
            a.sendall(connect_pkt("rA-%s-%d" % (tag, n), user, pw))
            b.sendall(connect_pkt("rB-%s-%d" % (tag, n), user, pw))
            for c in (a, b):
                _, body = c.expect(2)
                if body[1] != 0:
                    raise RuntimeError("CONNACK rc %d" % body[1])
            if variant == "existing":
                a.sendall(subscribe_pkt(1, topic))
                a.expect(9)
            # the race
            b.sendall(subscribe_pkt(1, topic))
            if variant == "control":  # sanity check: wait for B's SUBACK before publishing
                b.expect(9)
                a.sendall(publish_pkt(2, topic, payload))
                p = b.expect(3, timeout=2.0)
                b.handle_other(p)
                if publish_payload(p[1]) != payload:
                    misses.append(n)
                a.expect(4, timeout=2.0)
                continue
            if GAP:
                time.sleep(GAP)
            a.sendall(publish_pkt(2, topic, payload))
            got, suback_t = False, None
            dl = time.monotonic() + 5.0  # SUBACK must come within 5 s
            while True:
                p = b.read_packet(dl)
                if p is None:
                    break
                t = p[0] >> 4
                if t == 9 and suback_t is None:
                    if p[1][2:3] == b"\x80":
                        raise RuntimeError("SUBACK failure")
                    suback_t = time.monotonic()
                    dl = suback_t + WAIT
                elif t == 3:
                    b.handle_other(p)
                    if publish_payload(p[1]) == payload:
                        got = True
                        if suback_t is None:
                            stats[1] += 1
                        else:
                            late.append(time.monotonic() - suback_t)
                        if suback_t is not None:
                            break
                        # keep reading for the SUBACK
                if got and suback_t is not None:
                    break
            if suback_t is None:
                raise TimeoutError("no SUBACK")
            if not got:
                misses.append(n)
            # A's PUBACK (diagnostic)
            try:
                a.expect(4, timeout=2.0)
            except TimeoutError:
                stats[2] += 1
        except Exception as e:  # noqa
            stats[0] += 1
            print("round %d error: %r" % (n, e), file=sys.stderr)
        finally:
            for c in (b, a):
                if c is not None:
                    c.close()
    stats[3] = R


if __name__ == "__main__":
    main()
