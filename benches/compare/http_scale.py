#!/usr/bin/env python3
"""How long the management API and /metrics take to answer as queues grow.

Usage: benches/compare/http_scale.py [FERRYMQ_BIN] [COUNTS...]
(default target/release/ferrymq, counts 10000 100000). For each count: a fresh broker, that
many durable queues declared in one definitions import, then the median and worst of 10
requests of: /api/queues?page=1&page_size=100, /api/queues?disable_stats=true&
enable_queue_totals=true (unpaged), /api/overview, /metrics, /metrics/per-object.
Prints one JSON object per count. Loopback only; bounded (each request times out)."""

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_common import Broker  # noqa: E402

CALLS = [
    "/api/queues?page=1&page_size=100",
    "/api/queues?disable_stats=true&enable_queue_totals=true",
    "/api/overview",
    "/metrics",
    "/metrics/per-object",
]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/ferrymq"
    counts = [int(c) for c in sys.argv[2:]] or [10000, 100000]
    for n in counts:
        b = Broker(binary)
        try:
            b.declare_queues(n)
            result = {"queues": n}
            for path in CALLS:
                times, size = [], 0
                for _ in range(10):
                    status, secs, body = b.call("GET", path)
                    assert status == 200, (path, status)
                    times.append(secs * 1000)
                    size = len(body)
                result[path] = {"median_ms": round(statistics.median(times), 1),
                                "max_ms": round(max(times), 1), "bytes": size}
            print(json.dumps(result), flush=True)
        finally:
            b.stop()


if __name__ == "__main__":
    main()
