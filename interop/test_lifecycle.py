"""The broker process contract: READY line, SIGTERM, restart on the same port."""

from __future__ import annotations

import pytest

from brokers import parse_ready_line
from mqttclient import V311


def test_parse_ready_line():
    assert parse_ready_line("FERRYMQ READY mqtt=127.0.0.1:41883\n") == {"mqtt": ("127.0.0.1", 41883)}
    assert parse_ready_line("FERRYMQ READY mqtt=127.0.0.1:1 mqtts=127.0.0.1:2 amqp=[::1]:3") == {
        "mqtt": ("127.0.0.1", 1), "mqtts": ("127.0.0.1", 2), "amqp": ("::1", 3)}
    assert parse_ready_line("2024-01-01 INFO starting") is None
    assert parse_ready_line("FERRYMQ READYish mqtt=1.2.3.4:5") is None


def test_sigterm_exits_cleanly(broker):
    assert broker.alive()
    assert broker.stop() == 0, "SIGTERM must stop the broker with exit code 0"


def test_restart_keeps_listening_on_same_port(broker, mqtt, topic):
    port = broker.port
    c = mqtt(version=V311)
    c.disconnect()
    broker.restart()
    assert broker.port == port
    assert broker.exit_codes == [0]
    again = mqtt(version=V311)
    again.subscribe(topic, qos=1)
    again.publish(topic, b"after-restart", qos=1)
    assert again.get().payload == b"after-restart"


@pytest.mark.persistence
def test_hard_kill_then_restart_serves_again(broker, mqtt, topic):
    """SIGKILL (crash) and start again on the same data dir: the broker must come
    back up and serve; what survives a crash is not asserted here."""
    broker.kill()
    broker.start()
    c = mqtt(version=V311)
    c.subscribe(topic, qos=1)
    c.publish(topic, b"alive", qos=1)
    assert c.get().payload == b"alive"
