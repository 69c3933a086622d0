"""Fixtures of the FerryMQ interop suite.

* ``broker``: a fresh broker per test (FerryMQ by default, Mosquitto with
  INTEROP_BROKER=mosquitto) on ephemeral loopback ports, with its own temp
  data dir / config.  ``broker.restart()`` restarts it on the same data dir and
  ports; ``broker.host`` / ``broker.port`` are the MQTT listener,
  ``broker.amqp_addr`` the AMQP one.  With INTEROP_BROKER=rabbitmq it is one
  RabbitMQ node for the whole session (a node takes ~15 s to boot): tests
  isolate themselves with unique queue / exchange names (``names``).
* ``mqtt``: a factory of connected paho clients bound to that broker, all
  closed at the end of the test.
* ``topic``: a unique topic prefix for the test.
* ``amqp_addr`` / ``amqp_url``: the broker's AMQP 0-9-1 listener (host, port) /
  ``amqp://guest:guest@127.0.0.1:PORT/%2F``.  Against a FerryMQ whose READY line
  has no ``amqp=`` pair the test fails at once with a message saying so.
* ``amqp``: a factory of pika BlockingConnections to it, closed at the end.
* ``names``: unique queue / exchange names for the test (deleted afterwards on
  the shared RabbitMQ node).

Markers (declared in pytest.ini):
* ``persistence``: the test restarts the broker and needs on-disk state.  FerryMQ
  is always persistent; Mosquitto is then started with ``persistence true``.
* ``amqp``: needs the broker's AMQP 0-9-1 listener; skipped with
  INTEROP_BROKER=mosquitto.  In rabbitmq mode only ``amqp`` tests (and those
  needing no broker) run: the MQTT-only tests' reference broker is Mosquitto.
* ``ferrymq_only``: a FerryMQ feature the reference broker (Debian's Mosquitto
  2.0.x, or RabbitMQ 3.10 for AMQP) lacks or implements differently; skipped
  with INTEROP_BROKER=mosquitto or rabbitmq.
* ``mosquitto_specific``: checks a behaviour the MQTT spec leaves open, as
  Mosquitto does it; skipped against FerryMQ unless INTEROP_STRICT=1.
* ``rabbitmq_specific``: checks how RabbitMQ 3.10 does something FerryMQ does
  differently on purpose (or that only RabbitMQ has); skipped against FerryMQ
  unless INTEROP_STRICT=1.

Skips: those markers skip by design against one broker or another.  Any other skip
(a tool or a browser missing) is a test that did not run where it was meant to:
every skip is listed with its reason in the summary (``-ra``), and with
INTEROP_FAIL_ON_SKIP=1 (``.ci/run`` sets it) a skip the markers did not decide fails
the run, unless its test id contains one of the space-separated words of
INTEROP_EXPECTED_SKIPS.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import amqpclient  # noqa: E402
from brokers import Broker, BrokerError, broker_kind  # noqa: E402
from mqttclient import V5, Client, unique_id  # noqa: E402

KIND = broker_kind()

# Filled by the session fixture: the session's RabbitMQ node (rabbitmq mode), and
# what the FerryMQ smoke start announced (ferrymq mode).
SESSION: dict = {"rabbitmq": None, "ferrymq_listeners": None, "amqp_smoke_error": None}


def no_amqp_message(listeners) -> str:
    return (
        "FerryMQ has no AMQP 0-9-1 listener: it was started with --amqp-listen 127.0.0.1:0 but its "
        f"`FERRYMQ READY` line has no amqp=ADDR pair (it announced {listeners}). FerryMQ's AMQP "
        "front-end is not implemented yet (or ignores --amqp-listen); the AMQP tests cannot run. "
        "They were validated against RabbitMQ: INTEROP_BROKER=rabbitmq interop/run.sh"
    )


def pytest_report_header(config):
    return f"interop broker under test: {KIND}"


def _why(m) -> str:
    return m.kwargs.get("reason") or (m.args[0] if m.args else "")


# Test ids the markers skip by design against this broker (see the module doc), and the
# skips seen while running that were not among them.
SKIPPED_BY_DESIGN: set[str] = set()
UNEXPECTED_SKIPS: list[tuple[str, str]] = []


def pytest_collection_modifyitems(config, items):
    strict = os.environ.get("INTEROP_STRICT") == "1"
    for item in items:
        _mark_skips_by_design(item, strict)
        if item.get_closest_marker("skip"):
            SKIPPED_BY_DESIGN.add(item.nodeid)


def pytest_runtest_logreport(report):
    if report.skipped and report.when in ("setup", "call") and report.nodeid not in SKIPPED_BY_DESIGN:
        allowed = os.environ.get("INTEROP_EXPECTED_SKIPS", "").split()
        if not any(word in report.nodeid for word in allowed):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            UNEXPECTED_SKIPS.append((report.nodeid, reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if UNEXPECTED_SKIPS:
        terminalreporter.section("skipped, though meant to run here")
        for nodeid, reason in UNEXPECTED_SKIPS:
            terminalreporter.write_line(f"SKIPPED: {nodeid}: {reason}")
        if os.environ.get("INTEROP_FAIL_ON_SKIP") == "1":
            terminalreporter.write_line("INTEROP_FAIL_ON_SKIP=1: these skips fail the run")


def pytest_sessionfinish(session, exitstatus):
    if UNEXPECTED_SKIPS and os.environ.get("INTEROP_FAIL_ON_SKIP") == "1" and exitstatus == 0:
        session.exitstatus = 1


def _mark_skips_by_design(item, strict: bool) -> None:
    """The markers' skips (see the module doc)."""
    amqp = item.get_closest_marker("amqp") is not None
    if KIND == "mosquitto" and amqp:
        item.add_marker(pytest.mark.skip(reason="amqp: Mosquitto has no AMQP 0-9-1"))
    if KIND == "rabbitmq" and not amqp and "broker" in item.fixturenames:
        item.add_marker(pytest.mark.skip(
            reason="MQTT-only test: its reference broker is Mosquitto (INTEROP_BROKER=mosquitto); "
                   "rabbitmq mode runs the AMQP and cross-protocol tests"))
    if KIND != "ferrymq" and item.get_closest_marker("ferrymq_only"):
        item.add_marker(pytest.mark.skip(reason=f"ferrymq_only: {_why(item.get_closest_marker('ferrymq_only'))}"))
    if KIND == "ferrymq" and item.get_closest_marker("mosquitto_specific") and not strict:
        m = item.get_closest_marker("mosquitto_specific")
        item.add_marker(pytest.mark.skip(reason=f"mosquitto_specific (INTEROP_STRICT=1 runs it): {_why(m)}"))
    if KIND == "ferrymq" and item.get_closest_marker("rabbitmq_specific") and not strict:
        m = item.get_closest_marker("rabbitmq_specific")
        item.add_marker(pytest.mark.skip(reason=f"rabbitmq_specific (INTEROP_STRICT=1 runs it): {_why(m)}"))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    # On a failure, attach the log of every broker the test used to the report.
    if rep.failed and rep.when in ("call", "setup"):
        for b, since in getattr(item, "_interop_brokers", []):
            # The shared RabbitMQ node: only what it logged during this test.
            rep.sections.append((f"broker log ({b.kind}, {b.log_path})", b.read_log(since=since)))
    return rep


@pytest.fixture(scope="session", autouse=True)
def broker_starts(tmp_path_factory):
    """Start and stop the broker once before any test: if it cannot even start,
    stop the run with its log instead of erroring every test the same way.
    RabbitMQ: this is the session's node, kept running until the end."""
    b = Broker(KIND, tmp_path_factory.mktemp("smoke" if KIND != "rabbitmq" else "rabbitmq"),
               persistence=KIND == "ferrymq")
    try:
        b.start()
    except BrokerError as e:
        pytest.exit(f"the broker under test ({KIND}) does not start; no test run.\n{e}", returncode=1)
    if KIND == "rabbitmq":
        SESSION["rabbitmq"] = b
        yield
        SESSION["rabbitmq"] = None
        b.stop()
        return
    SESSION["ferrymq_listeners"] = dict(b.listeners)
    if b.amqp_addr is not None:
        SESSION["amqp_smoke_error"] = amqp_smoke_check(b.amqp_addr)
    rc = b.stop()
    if rc == -9:  # still running INTEROP_STOP_TIMEOUT after SIGTERM: killed
        pytest.exit(f"the broker under test ({KIND}) does not stop on SIGTERM\n{b.read_log()}", returncode=1)
    yield


def amqp_smoke_check(addr, bound: float = 15.0) -> str | None:
    """Open and close one pika connection and channel, bounded (pika's channel open
    has no timeout of its own).  None when it works, else why: then every AMQP test
    fails at once with that, instead of each one hanging until its timeout."""
    import threading

    import pika

    result: dict = {}

    def attempt():
        try:
            conn = pika.BlockingConnection(amqpclient.params(addr))
            conn.channel().close()
            conn.close()
            result["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported as is
            result["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(bound)
    if result.get("ok"):
        return None
    return result.get("error") or f"no answer within {bound}s"


@pytest.fixture
def broker(request, tmp_path):
    amqp_test = request.node.get_closest_marker("amqp") is not None
    if KIND == "rabbitmq":
        b = SESSION["rabbitmq"]
        request.node._interop_brokers = getattr(request.node, "_interop_brokers", []) + [(b, b.log_mark())]
        if not b.alive():
            pytest.fail(f"the session's RabbitMQ node is not running\n{b.read_log()}", pytrace=False)
        yield b
        if not b.alive():
            pytest.fail("the RabbitMQ node was not running at the end of the test", pytrace=False)
        return
    if amqp_test and KIND == "ferrymq" and "amqp" not in (SESSION["ferrymq_listeners"] or {"amqp": None}):
        # Known from the smoke start: fail at once, without starting a broker.
        pytest.fail(no_amqp_message(SESSION["ferrymq_listeners"]), pytrace=False)
    if amqp_test and KIND == "ferrymq" and SESSION["amqp_smoke_error"]:
        pytest.fail(f"FerryMQ announces amqp={SESSION['ferrymq_listeners'].get('amqp')} but a pika connection + "
                    f"channel open/close failed in the session's smoke check: {SESSION['amqp_smoke_error']}",
                    pytrace=False)
    persistence = KIND == "ferrymq" or request.node.get_closest_marker("persistence") is not None
    b = Broker(KIND, tmp_path / "broker", persistence=persistence)
    request.node._interop_brokers = getattr(request.node, "_interop_brokers", []) + [(b, None)]
    b.start()
    yield b
    # A broker a test stopped on purpose (b.stop()) has proc None; one that exited
    # by itself during the test has crashed.
    died = b.proc is not None and b.proc.poll() is not None
    b.stop()
    if died:
        pytest.fail(f"the broker was not running at the end of the test\n{b.read_log()}", pytrace=False)


@pytest.fixture
def topic(request) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:60]
    return f"itest/{name}/{unique_id('t')}"


@pytest.fixture
def mqtt(broker):
    """mqtt(version=V5, client_id=None, clean=True, connect=True, **connect_kwargs) -> Client"""
    made: list[Client] = []

    def make(version: int = V5, client_id: str | None = None, clean: bool = True,
             connect: bool = True, name: str | None = None, will: dict | None = None, **connect_kwargs):
        c = Client(broker.host, broker.port, client_id=client_id, version=version, clean=clean, name=name)
        made.append(c)
        if will:
            c.will_set(**will)
        if connect:
            c.connect(**connect_kwargs)
        return c

    yield make
    for c in made:
        c.close()


# ------------------------------------------------------------------------- AMQP
@pytest.fixture
def amqp_addr(broker) -> tuple[str, int]:
    if broker.amqp_addr is None:
        if broker.kind == "ferrymq":
            pytest.fail(no_amqp_message(broker.listeners), pytrace=False)
        pytest.skip(f"{broker.kind} has no AMQP 0-9-1 listener")
    return broker.amqp_addr


@pytest.fixture
def amqp_url(amqp_addr) -> str:
    return amqpclient.url(amqp_addr)


@pytest.fixture
def amqp(amqp_addr):
    """amqp(**pika ConnectionParameters kwargs, user=..., password=...) -> BlockingConnection"""
    import pika

    made: list = []

    def make(**kw):
        conn = pika.BlockingConnection(amqpclient.params(amqp_addr, **kw))
        made.append(conn)
        return conn

    make.addr = amqp_addr
    make.params = lambda **kw: amqpclient.params(amqp_addr, **kw)
    yield make
    for conn in made:
        try:
            if conn.is_open:
                conn.close()
        except Exception:
            pass


@pytest.fixture
def names(request, broker):
    """names(kind) -> a unique name "itest.<test>.<kind>.<random>" for a queue or
    exchange.  On the shared RabbitMQ node every name handed out is deleted (as a
    queue and as an exchange) after the test."""
    made: list[str] = []
    test = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:40]

    def make(kind: str = "q") -> str:
        n = f"itest.{test}.{kind}.{unique_id('n')[2:]}"
        made.append(n)
        return n

    yield make
    if KIND == "rabbitmq" and made and broker.alive():
        import pika

        try:
            conn = pika.BlockingConnection(amqpclient.params(broker.amqp_addr))
        except Exception:
            return
        try:
            ch = conn.channel()
            for n in made:
                # Both are idempotent in RabbitMQ (no 404 for a missing name); an
                # exclusive queue of another connection (405) goes with its connection.
                for delete in (ch.queue_delete, ch.exchange_delete):
                    try:
                        delete(n)
                    except Exception:
                        ch = conn.channel()
        except Exception:
            pass
        finally:
            try:
                conn.close()
            except Exception:
                pass


__all__ = ["Broker", "BrokerError"]
