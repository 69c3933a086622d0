"""Fixtures of the FerryMQ interop suite.

* ``broker``: a fresh broker per test (FerryMQ by default, Mosquitto with
  INTEROP_BROKER=mosquitto) on an ephemeral loopback port, with its own temp
  data dir / config.  ``broker.restart()`` restarts it on the same data dir and
  port; ``broker.host`` / ``broker.port`` are the MQTT listener.
* ``mqtt``: a factory of connected paho clients bound to that broker, all
  closed at the end of the test.
* ``topic``: a unique topic prefix for the test.

Markers (declared in pytest.ini):
* ``persistence``: the test restarts the broker and needs on-disk state.  FerryMQ
  is always persistent; Mosquitto is then started with ``persistence true``.
* ``ferrymq_only``: a FerryMQ feature the reference Mosquitto (Debian's 2.0.x)
  lacks or implements differently; skipped with INTEROP_BROKER=mosquitto.
* ``mosquitto_specific``: checks a behaviour the MQTT spec leaves open, as
  Mosquitto does it; skipped against FerryMQ unless INTEROP_STRICT=1.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import Broker, BrokerError, broker_kind  # noqa: E402
from mqttclient import V5, Client, unique_id  # noqa: E402

KIND = broker_kind()


def pytest_report_header(config):
    return f"interop broker under test: {KIND}"


def pytest_collection_modifyitems(config, items):
    strict = os.environ.get("INTEROP_STRICT") == "1"
    for item in items:
        if KIND == "mosquitto" and item.get_closest_marker("ferrymq_only"):
            m = item.get_closest_marker("ferrymq_only")
            why = m.kwargs.get("reason") or (m.args[0] if m.args else "")
            item.add_marker(pytest.mark.skip(reason=f"ferrymq_only: {why}"))
        if KIND == "ferrymq" and item.get_closest_marker("mosquitto_specific") and not strict:
            m = item.get_closest_marker("mosquitto_specific")
            why = m.kwargs.get("reason") or (m.args[0] if m.args else "")
            item.add_marker(pytest.mark.skip(reason=f"mosquitto_specific (INTEROP_STRICT=1 runs it): {why}"))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    # On a failure, attach the log of every broker the test used to the report.
    if rep.failed and rep.when in ("call", "setup"):
        for b in getattr(item, "_interop_brokers", []):
            rep.sections.append((f"broker log ({b.kind}, {b.log_path})", b.read_log()))
    return rep


@pytest.fixture(scope="session", autouse=True)
def broker_starts(tmp_path_factory):
    """Start and stop the broker once before any test: if it cannot even start,
    stop the run with its log instead of erroring every test the same way."""
    b = Broker(KIND, tmp_path_factory.mktemp("smoke"), persistence=KIND == "ferrymq")
    try:
        b.start()
    except BrokerError as e:
        pytest.exit(f"the broker under test ({KIND}) does not start; no test run.\n{e}", returncode=1)
    rc = b.stop()
    if rc == -9:  # still running INTEROP_STOP_TIMEOUT after SIGTERM: killed
        pytest.exit(f"the broker under test ({KIND}) does not stop on SIGTERM\n{b.read_log()}", returncode=1)
    yield


@pytest.fixture
def broker(request, tmp_path):
    persistence = KIND == "ferrymq" or request.node.get_closest_marker("persistence") is not None
    b = Broker(KIND, tmp_path / "broker", persistence=persistence)
    request.node._interop_brokers = getattr(request.node, "_interop_brokers", []) + [b]
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


__all__ = ["Broker", "BrokerError"]
