"""Interop with the Mosquitto command line clients (mosquitto_pub, mosquitto_sub,
mosquitto_rr from Debian's mosquitto-clients), MQTT 3.1.1 and 5.0.

mosquitto_sub runs with -d so that its "received SUBACK" debug line tells when
the subscription is in place (publishing only then, no sleeps), and with -F so
that every message is one parseable line: MSG|qos|retain|topic|hex(payload).
Every process is bounded by -W and by a subprocess timeout.
"""

from __future__ import annotations

import queue
import shutil
import signal
import subprocess
import threading

import pytest

from mqttclient import TIMEOUT, V5, publish_props, unique_id

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_pub") is None or shutil.which("mosquitto_sub") is None,
                                reason="mosquitto-clients not installed")

VERSIONS = ["mqttv311", "mqttv5"]
FMT = "MSG|%q|%r|%t|%x"


def base(broker, version: str, tool: str = "mosquitto_pub") -> list[str]:
    return [tool, "-h", broker.host, "-p", str(broker.port), "-V", version]


def run_pub(broker, version: str, *args: str, stdin: bytes | None = None, timeout: float = 20) -> None:
    cmd = base(broker, version) + list(args)
    p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}: {p.stderr.decode(errors='replace')}"


class Sub:
    """A running mosquitto_sub; messages arrive on .messages as
    (qos, retain, topic, payload) tuples, or as the raw line for custom formats."""

    def __init__(self, broker, version: str, *args: str, fmt: str = FMT, count: int | None = None,
                 wait_s: int = 15, wait_subscribed: bool = True):
        # stdbuf -oL: stdout is a pipe, and mosquitto_sub's debug lines would
        # otherwise sit in the stdio buffer until exit.
        self.cmd = (["stdbuf", "-oL"] if shutil.which("stdbuf") else []) + \
            base(broker, version, "mosquitto_sub") + ["-d", "-F", fmt, "-W", str(wait_s)]
        if count is not None:
            self.cmd += ["-C", str(count)]
        self.cmd += list(args)
        self.raw_format = fmt != FMT
        self.messages: queue.Queue = queue.Queue()
        self.subscribed = threading.Event()
        self.lines: list[str] = []
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if wait_subscribed and not self.subscribed.wait(TIMEOUT):
            self.kill()
            raise AssertionError(f"mosquitto_sub never got its SUBACK: {self.lines}")

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("Client ") and "received SUBACK" in line:
                self.subscribed.set()
            elif line.startswith("MSG|"):
                if self.raw_format:
                    self.messages.put(line)
                else:
                    _, q, r, t, x = line.split("|", 4)
                    self.messages.put((int(q), int(r), t, bytes.fromhex(x)))

    def expect(self, n: int, timeout: float = TIMEOUT) -> list:
        out = []
        for _ in range(n):
            try:
                out.append(self.messages.get(timeout=timeout))
            except queue.Empty:
                raise AssertionError(f"mosquitto_sub: {len(out)} of {n} messages; output: {self.lines}") from None
        return out

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"mosquitto_sub still running after {timeout}s: {self.lines}") from None
        self.reader.join(5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def subs():
    made: list[Sub] = []

    def make(*a, **kw) -> Sub:
        s = Sub(*a, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.kill()


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", VERSIONS)
def test_pub_sub_round_trip(broker, subs, topic, version, qos):
    lines = [f"line {i} {version} q{qos}" for i in range(5)]
    sub = subs(broker, version, "-t", topic, "-q", str(qos), count=len(lines))
    # -l: one message per stdin line, in order.
    run_pub(broker, version, "-t", topic, "-q", str(qos), "-l", stdin=("\n".join(lines) + "\n").encode())
    got = sub.expect(len(lines))
    assert [m[3] for m in got] == [line.encode() for line in lines]
    assert all(m[0] == qos and m[1] == 0 and m[2] == topic for m in got)
    assert sub.wait() == 0  # exited because -C was reached


@pytest.mark.parametrize("version", VERSIONS)
def test_wildcard_subscription_and_null_message(broker, subs, topic, version):
    sub = subs(broker, version, "-t", f"{topic}/+/temp", "-t", f"{topic}/alarm/#", "-q", "1", count=3)
    run_pub(broker, version, "-t", f"{topic}/kitchen/temp", "-q", "1", "-m", "21.5")
    run_pub(broker, version, "-t", f"{topic}/kitchen/humidity", "-q", "1", "-m", "ignored")
    run_pub(broker, version, "-t", f"{topic}/alarm/door/front", "-q", "1", "-n")  # zero-length payload
    run_pub(broker, version, "-t", f"{topic}/hall/temp", "-q", "1", "-m", "19")
    got = sub.expect(3)
    assert [(m[2], m[3]) for m in got] == [(f"{topic}/kitchen/temp", b"21.5"),
                                           (f"{topic}/alarm/door/front", b""),
                                           (f"{topic}/hall/temp", b"19")]
    assert sub.wait() == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_set_replace_clear(broker, subs, topic, version):
    run_pub(broker, version, "-t", topic, "-q", "1", "-r", "-m", "first")
    run_pub(broker, version, "-t", topic, "-q", "1", "-r", "-m", "second")
    s1 = subs(broker, version, "-t", topic, "-q", "1", count=1, wait_subscribed=False)
    (q, r, t, p), = s1.expect(1)
    assert (r, t, p) == (1, topic, b"second")
    assert s1.wait() == 0
    run_pub(broker, version, "-t", topic, "-q", "1", "-r", "-n")  # clear
    s2 = subs(broker, version, "-t", topic, "-q", "1", count=1)
    run_pub(broker, version, "-t", topic, "-q", "1", "-m", "fence")
    (q, r, t, p), = s2.expect(1)
    assert (r, p) == (0, b"fence"), "a cleared retained message was delivered"
    assert s2.wait() == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_to_wildcard_subscriber(broker, subs, topic, version):
    run_pub(broker, version, "-t", f"{topic}/a", "-q", "2", "-r", "-m", "A")
    run_pub(broker, version, "-t", f"{topic}/b/c", "-q", "2", "-r", "-m", "BC")
    sub = subs(broker, version, "-t", f"{topic}/#", "-q", "2", count=2, wait_subscribed=False)
    got = sub.expect(2)
    assert sorted((m[2], m[3], m[1], m[0]) for m in got) == [
        (f"{topic}/a", b"A", 1, 2), (f"{topic}/b/c", b"BC", 1, 2)]
    assert sub.wait() == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_persistent_session_receives_offline_messages(broker, subs, topic, version):
    cid = unique_id("cli")
    session = ["-c", "-i", cid, "-q", "1", "-t", topic] + (["-x", "300"] if version == "mqttv5" else [])
    # -E: exit as soon as the subscription is acknowledged.
    first = subs(broker, version, *session, "-E")
    assert first.wait() == 0
    for i in range(3):
        run_pub(broker, version, "-t", topic, "-q", "1", "-m", f"offline {i}")
    back = subs(broker, version, *session, count=3, wait_subscribed=False)
    got = back.expect(3)
    assert [m[3] for m in got] == [f"offline {i}".encode() for i in range(3)]
    assert all(m[0] == 1 for m in got)
    assert back.wait() == 0


def test_mosquitto_pub_v5_properties_to_paho(broker, mqtt, topic):
    sub = mqtt(version=V5)
    sub.subscribe(topic, qos=1)
    run_pub(broker, "mqttv5", "-t", topic, "-q", "1", "-m", "with props",
            "-D", "publish", "user-property", "origin", "mosquitto_pub",
            "-D", "publish", "user-property", "origin", "twice",
            "-D", "publish", "content-type", "text/plain",
            "-D", "publish", "response-topic", f"{topic}/reply",
            "-D", "publish", "correlation-data", "corr-42",
            "-D", "publish", "payload-format-indicator", "1",
            "-D", "publish", "message-expiry-interval", "120")
    m = sub.get()
    assert m.payload == b"with props"
    assert m.user_properties == [("origin", "mosquitto_pub"), ("origin", "twice")]
    assert m.p("ContentType") == "text/plain"
    assert m.p("ResponseTopic") == f"{topic}/reply"
    assert m.p("CorrelationData") == b"corr-42"
    assert m.p("PayloadFormatIndicator") == 1
    assert 100 <= m.p("MessageExpiryInterval") <= 120


def test_paho_v5_properties_to_mosquitto_sub(broker, mqtt, subs, topic):
    sub = subs(broker, "mqttv5", "-t", topic, "-q", "1", fmt="MSG|%C|%R|%D|%P|%p", count=1)
    pub = mqtt(version=V5)
    pub.publish(topic, b"payload", qos=1, properties=publish_props(
        ContentType="application/x-test", ResponseTopic=f"{topic}/r", CorrelationData=b"cd",
        UserProperty=[("k1", "v1")]))
    line, = sub.expect(1)
    assert line == f"MSG|application/x-test|{topic}/r|cd|k1:v1|payload"
    assert sub.wait() == 0


def test_mosquitto_rr_request_response(broker, mqtt, topic):
    responder = mqtt(version=V5, name="responder")
    responder.subscribe(f"{topic}/req", qos=1)
    rr = subprocess.Popen(base(broker, "mqttv5", "mosquitto_rr") + [
        "-t", f"{topic}/req", "-e", f"{topic}/resp", "-m", "ping?", "-q", "1", "-W", "15"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        req = responder.get()
        assert req.payload == b"ping?"
        assert req.p("ResponseTopic") == f"{topic}/resp"
        responder.publish(req.p("ResponseTopic"), b"pong!", qos=1,
                          properties=publish_props(CorrelationData=req.p("CorrelationData") or b""))
        out, err = rr.communicate(timeout=TIMEOUT)
    finally:
        if rr.poll() is None:
            rr.kill()
            rr.wait(10)
    assert rr.returncode == 0, err
    assert out.decode().strip() == "pong!"


def test_large_payload_from_file(broker, mqtt, topic, tmp_path):
    data = bytes((i * 31 + 7) % 256 for i in range(200_000))
    f = tmp_path / "blob.bin"
    f.write_bytes(data)
    sub = mqtt(version=V5)
    sub.subscribe(topic, qos=2)
    run_pub(broker, "mqttv311", "-t", topic, "-q", "2", "-f", str(f))
    m = sub.get()
    assert m.payload == data and m.qos == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_will_of_killed_mosquitto_sub(broker, mqtt, subs, topic, version):
    watcher = mqtt(version=V5, name="watcher")
    watcher.subscribe(f"{topic}/will", qos=1)
    victim = subs(broker, version, "-t", f"{topic}/nothing", "-k", "30",
                  "--will-topic", f"{topic}/will", "--will-payload", "cli died", "--will-qos", "1")
    victim.proc.send_signal(signal.SIGKILL)  # no DISCONNECT: abnormal close
    victim.proc.wait(10)
    m = watcher.get()
    assert (m.topic, m.payload, m.qos) == (f"{topic}/will", b"cli died", 1)
