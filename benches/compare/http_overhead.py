#!/usr/bin/env python3
"""Publish throughput with the management API polled and Prometheus scraped, against
without, on the same binary in one run.

Usage: benches/compare/http_overhead.py [FERRYMQ_BIN] [MQLOAD]
(defaults target/release/ferrymq and target/mqload/release/mqload; DURATION seconds
per run, default 8; ROUNDS, default 3; QUEUES, default 1000).

Each run is a fresh broker with QUEUES durable queues (so the polled calls have something to
list), then mqload MQTT QoS 1, 1 publisher -> 1 subscriber, 64-byte payloads (as compare.sh), for DURATION
seconds. "polled" runs a poller meanwhile that asks /api/overview, /api/queues?page=1&
page_size=100 and /api/connections every second and scrapes /metrics every 5 s, as a
dashboard plus Prometheus would. Rounds alternate quiet/polled so drift hits both. Prints
one JSON line per run and a summary line (median throughput of each mode and their ratio)."""

import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_common import Broker  # noqa: E402


def poll(b, stop, counts):
    """Polls until `stop` is set: API calls every 1 s, /metrics every 5 s."""
    tick = 0
    while not stop.wait(0 if tick == 0 else 1.0):
        for path in ["/api/overview", "/api/queues?page=1&page_size=100", "/api/connections"]:
            b.call("GET", path, timeout=10)
            counts["api"] += 1
        if tick % 5 == 0:
            b.call("GET", "/metrics", timeout=10)
            counts["metrics"] += 1
        tick += 1


def run(binary, mqload, mode, duration, queues):
    b = Broker(binary)
    try:
        b.declare_queues(queues)
        stop, counts = threading.Event(), {"api": 0, "metrics": 0}
        poller = threading.Thread(target=poll, args=(b, stop, counts), daemon=True)
        if mode == "polled":
            poller.start()
        cmd = [mqload, "--quiet", "--broker-pid", str(b.proc.pid), "mqtt", "--port", str(b.mqtt_port),
               "--qos", "1", "--pubs", "1", "--subs", "1", "--size", "64", "--duration", str(duration)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 90)
        stop.set()
        if poller.is_alive():
            poller.join(timeout=15)
        report = json.loads(out.stdout.strip().splitlines()[-1])
        return {"mode": mode, "requests": counts, "mqload": report}
    finally:
        b.stop()


def throughput(report):
    """Messages delivered per second to the subscriber in the publishing window (mqload's
    `delivered_msgs_per_s`)."""
    return float(report["mqload"]["delivered_msgs_per_s"])


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/ferrymq"
    mqload = sys.argv[2] if len(sys.argv) > 2 else "target/mqload/release/mqload"
    duration = int(os.environ.get("DURATION", "8"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    queues = int(os.environ.get("QUEUES", "1000"))
    rates = {"quiet": [], "polled": []}
    for r in range(rounds):
        for mode in (["quiet", "polled"] if r % 2 == 0 else ["polled", "quiet"]):
            report = run(binary, mqload, mode, duration, queues)
            rates[mode].append(throughput(report))
            print(json.dumps(report), flush=True)
    quiet, polled = statistics.median(rates["quiet"]), statistics.median(rates["polled"])
    print(json.dumps({"summary": True, "quiet_msgs_per_s": quiet, "polled_msgs_per_s": polled,
                      "polled_over_quiet": round(polled / quiet, 3), "runs": rates}), flush=True)


if __name__ == "__main__":
    main()
