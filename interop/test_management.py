"""The management HTTP API as operations tools use it: Debian's ``rabbitmqadmin`` (v1, the
script shipped in RabbitMQ's package; ``.ci/run`` unpacks it into ``interop/.tools``
without installing RabbitMQ) drives FerryMQ — list, declare, publish, get, purge, delete,
export and import — and Prometheus' own Python parser (``prometheus_client``'s
OpenMetrics parser) reads ``/metrics`` while pika and paho clients publish.

FerryMQ-only here: the reference node of ``INTEROP_BROKER=rabbitmq`` runs without its
management plugin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.amqp, pytest.mark.ferrymq_only(reason="the reference node has no management listener")]

HERE = Path(__file__).resolve().parent


def rabbitmqadmin() -> str:
    found = os.environ.get("RABBITMQADMIN") or shutil.which("rabbitmqadmin")
    local = HERE / ".tools" / "rabbitmqadmin"
    if not found and local.exists():
        found = str(local)
    if not found:
        if os.environ.get("INTEROP_REQUIRE_RABBITMQADMIN") == "1":
            pytest.fail("rabbitmqadmin not found (.ci/run unpacks it into interop/.tools)")
        pytest.skip("rabbitmqadmin not found; set RABBITMQADMIN or install rabbitmq-server")
    return found


def http_port(broker) -> int:
    http = broker.listeners.get("http")
    assert http, f"FerryMQ's READY line has no http= pair: {broker.listeners}"
    return http[1]


def admin(broker, *args: str) -> str:
    cmd = [sys.executable, rabbitmqadmin(), "-H", "127.0.0.1", "-P", str(http_port(broker)),
           "-u", "guest", "-p", "guest", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def rows(broker, *args: str) -> list[dict]:
    return json.loads(admin(broker, "-f", "raw_json", *args))


def test_rabbitmqadmin_lists_declares_publishes_gets_purges_and_deletes(broker, amqp):
    assert "queue declared" in admin(broker, "declare", "queue", "name=jobs", "durable=true",
                                     'arguments={"x-message-ttl": 60000}')
    admin(broker, "declare", "exchange", "name=work", "type=topic")
    admin(broker, "declare", "binding", "source=work", "destination=jobs", "routing_key=jobs.#")
    assert "Message published" in admin(broker, "publish", "exchange=work", "routing_key=jobs.a", "payload=hello")
    queues = {q["name"]: q for q in rows(broker, "list", "queues")}
    assert queues["jobs"]["messages"] == 1 and queues["jobs"]["arguments"] == {"x-message-ttl": 60000}
    assert {"name": "work", "type": "topic"}.items() <= {k: v for k, v in
                                                       next(x for x in rows(broker, "list", "exchanges")
                                                            if x["name"] == "work").items()}.items()
    bindings = [(b["source"], b["destination"], b["routing_key"]) for b in rows(broker, "list", "bindings")]
    assert ("work", "jobs", "jobs.#") in bindings

    # A pika client sees what rabbitmqadmin made, and rabbitmqadmin sees the client.
    conn = amqp()
    ch = conn.channel()
    assert ch.queue_declare("jobs", passive=True).method.message_count == 1
    connections = rows(broker, "list", "connections")
    assert any(c["protocol"] == "AMQP 0-9-1" and c["user"] == "guest" for c in connections), connections

    got = rows(broker, "get", "queue=jobs", "ackmode=ack_requeue_true")
    assert got[0]["payload"] == "hello" and got[0]["exchange"] == "work"
    assert ch.queue_declare("jobs", passive=True).method.message_count == 1, "looked at, still there"
    assert "queue purged" in admin(broker, "purge", "queue", "name=jobs")
    assert ch.queue_declare("jobs", passive=True).method.message_count == 0
    admin(broker, "delete", "binding", "source=work", "destination_type=queue", "destination=jobs",
          "properties_key=jobs.%23")
    assert ("work", "jobs", "jobs.#") not in [(b["source"], b["destination"], b["routing_key"])
                                              for b in rows(broker, "list", "bindings")]
    admin(broker, "delete", "queue", "name=jobs")
    admin(broker, "delete", "exchange", "name=work")
    assert [q["name"] for q in rows(broker, "list", "queues")] == []
    users = rows(broker, "list", "users")
    assert [u["name"] for u in users] == ["guest"] and users[0]["tags"] == ["administrator"]
    assert [v["name"] for v in rows(broker, "list", "vhosts")] == ["/"]
    assert "rabbitmq_version" in admin(broker, "show", "overview")


# What `rabbitmqadmin export` writes on a RabbitMQ 3.10 node with a small setup (user
# `app` with password `s3cret`, hashed by RabbitMQ with a salt; a policy FerryMQ does
# not apply).
RABBITMQ_EXPORT = {
    "rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8", "product_name": "RabbitMQ",
    "product_version": "3.10.8",
    "users": [
        {"name": "app", "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256",
         "tags": [], "limits": {}},
    ],
    "vhosts": [{"name": "/"}, {"name": "billing"}],
    "permissions": [{"user": "app", "vhost": "billing", "configure": ".*", "write": ".*", "read": ".*"}],
    "topic_permissions": [],
    "parameters": [],
    "global_parameters": [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-x"}],
    "policies": [{"vhost": "billing", "name": "ttl", "pattern": "^inv", "apply-to": "queues",
                  "definition": {"message-ttl": 1000}, "priority": 0}],
    "queues": [{"name": "invoices", "vhost": "billing", "durable": True, "auto_delete": False,
                "arguments": {"x-queue-type": "classic", "x-max-length": 1000}}],
    "exchanges": [{"name": "billing.events", "vhost": "billing", "type": "topic", "durable": True,
                   "auto_delete": False, "internal": False, "arguments": {}}],
    "bindings": [{"source": "billing.events", "vhost": "billing", "destination": "invoices",
                  "destination_type": "queue", "routing_key": "invoice.*", "arguments": {}}],
}


def rabbitmq_hash(password: str) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt ++ sha256(salt ++ password))."""
    import base64
    import hashlib
    salt = bytes.fromhex("908dc60a")
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def test_a_rabbitmq_export_imports_with_rabbitmqadmin_and_round_trips(broker, tmp_path, amqp_addr):
    defs = json.loads(json.dumps(RABBITMQ_EXPORT))
    defs["users"][0]["password_hash"] = rabbitmq_hash("s3cret")
    path = tmp_path / "rabbitmq.json"
    path.write_text(json.dumps(defs))
    assert "Uploaded definitions" in admin(broker, "import", str(path))

    # The imported user logs in with its RabbitMQ password, into the imported vhost.
    params = pika.ConnectionParameters(host=amqp_addr[0], port=amqp_addr[1], virtual_host="billing",
                                       credentials=pika.PlainCredentials("app", "s3cret"))
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("billing.events", "invoice.created", b"42", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare("invoices", passive=True, durable=True).method.message_count == 1
    conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(
            host=amqp_addr[0], port=amqp_addr[1], credentials=pika.PlainCredentials("app", "wrong")))

    # The import answer names what was not applied.
    req = urllib.request.Request(f"http://127.0.0.1:{http_port(broker)}/api/definitions",
                                 data=json.dumps(defs).encode(), method="POST",
                                 headers={"content-type": "application/json",
                                          "authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(req, timeout=10) as resp:
        report = json.load(resp)
    # RabbitMQ's own cluster id is named (FerryMQ keeps none), and so is the policy.
    assert sorted((u["kind"], u["name"]) for u in report["unsupported"]) == \
        [("global_parameters", "internal_cluster_id"), ("policies", "ttl")], report
    assert report["imported"]["queues"] == 1

    out = tmp_path / "ferrymq.json"
    admin(broker, "export", str(out))
    exported = json.loads(out.read_text())
    assert {v["name"] for v in exported["vhosts"]} == {"/", "billing"}
    app = next(u for u in exported["users"] if u["name"] == "app")
    assert app["password_hash"] == defs["users"][0]["password_hash"], "the hash goes back out unchanged"
    q = next(q for q in exported["queues"] if q["name"] == "invoices")
    assert q["arguments"] == {"x-queue-type": "classic", "x-max-length": 1000} and q["vhost"] == "billing"
    assert [(b["source"], b["destination"], b["routing_key"]) for b in exported["bindings"]] == \
        [("billing.events", "invoices", "invoice.*")]
    assert {"user": "app", "vhost": "billing", "configure": ".*", "write": ".*", "read": ".*"} in exported["permissions"]

    # ... and survives a restart.
    broker.restart()
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=broker.amqp_addr[0], port=broker.amqp_addr[1], virtual_host="billing",
        credentials=pika.PlainCredentials("app", "s3cret")))
    assert conn.channel().queue_declare("invoices", passive=True).method.message_count == 1
    conn.close()


def test_prometheus_parses_metrics_and_the_counters_move(broker, amqp, mqtt, topic):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{http_port(broker)}/metrics"

    def scrape() -> dict[tuple[str, str], float]:
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.headers["content-type"].startswith("application/openmetrics-text")
            text = resp.read().decode()
        values = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                values[(s.name, s.labels.get("protocol", ""))] = s.value
        return values

    before = scrape()
    assert before[("rabbitmq_global_messages_received_total", "amqp091")] == 0
    conn = amqp()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("metered")
    for _ in range(7):
        ch.basic_publish("", "metered", b"x", pika.BasicProperties(delivery_mode=2))
    client = mqtt()
    for _ in range(4):
        client.publish(f"{topic}/m", b"1", qos=1)
    deadline = time.monotonic() + 10
    while True:
        after = scrape()
        if after[("rabbitmq_global_messages_received_total", "mqtt")] == 4 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert after[("rabbitmq_global_messages_received_total", "amqp091")] == 7
    assert after[("rabbitmq_global_messages_received_total", "mqtt")] == 4
    assert after[("rabbitmq_global_messages_confirmed_total", "amqp091")] == 7
    assert after[("rabbitmq_queue_messages_ready", "")] == 7
    assert after[("rabbitmq_connections", "")] == 2
    assert after[("ferrymq_journal_fsyncs_total", "")] > before[("ferrymq_journal_fsyncs_total", "")]
