#!/usr/bin/env python3
"""MQTT publish throughput with authorization on and 100 rules, against authorization off,
on the same binary in one run (issue 12: "no measurable cost on the publish path").

Usage: benches/compare/authz_overhead.py [FERRYMQ_BIN] [MQLOAD]
(defaults target/release/ferrymq and target/mqload/release/mqload; DURATION seconds
per run, default 8; ROUNDS, default 3; QOS, default "0 1").

Each run is a fresh broker and one mqload MQTT run, 1 publisher -> 1 subscriber, 64-byte
payloads, for DURATION seconds. "rules": `auth.authorization = true` with 99 rules that do
not match mqload's topics (deny rules on other trees, a user-, client-id- and CIDR-scoped
rule among them) before the one that allows them, so a decision that were not cached would
walk all 100 on every publish and every delivery. "off": no authorization (the default).
Modes alternate per round so drift hits both. Prints one JSON line per run and a summary
per QoS (median delivered msgs/s of each mode and their ratio)."""

import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_common import Broker  # noqa: E402


def rules_config():
    rules = []
    for i in range(99):
        who = ["", ' user = "u%d",' % i, ' client_id = "dev-%d-*",' % i, ' source = "10.%d.0.0/16",' % i][i % 4]
        rules.append('{ permission = "deny", action = "all",%s topics = ["other/%d/#", "$SYS/x/%d"] }' % (who, i, i))
    rules.append('{ permission = "allow", action = "all", topics = ["mqload/#"] }')
    return "[auth]\nauthorization = true\nrules = [\n  " + ",\n  ".join(rules) + ",\n]\n"


def run(binary, mqload, mode, qos, duration):
    b = Broker(binary, config=rules_config() if mode == "rules" else None)
    try:
        cmd = [mqload, "--quiet", "--broker-pid", str(b.proc.pid), "mqtt", "--port", str(b.mqtt_port),
               "--qos", str(qos), "--pubs", "1", "--subs", "1", "--size", "64", "--duration", str(duration)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 90)
        report = json.loads(out.stdout.strip().splitlines()[-1])
        return {"mode": mode, "qos": qos, "mqload": report}
    finally:
        b.stop()


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/ferrymq"
    mqload = sys.argv[2] if len(sys.argv) > 2 else "target/mqload/release/mqload"
    duration = int(os.environ.get("DURATION", "8"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    for qos in [int(q) for q in os.environ.get("QOS", "0 1").split()]:
        rates = {"off": [], "rules": []}
        cost = {"off": [], "rules": []}
        for r in range(rounds):
            for mode in (["off", "rules"] if r % 2 == 0 else ["rules", "off"]):
                report = run(binary, mqload, mode, qos, duration)
                m = report["mqload"]
                rate = float(m["delivered_msgs_per_s"])
                rates[mode].append(rate)
                # Broker CPU per delivered message (core-microseconds): steadier than the rate
                # on a shared machine.
                pct = float(m["cpu"]["brokers"][0]["cpu_pct_of_core"])
                cost[mode].append(round(pct / 100 * 1e6 / rate, 3) if rate else None)
                print(json.dumps({"mode": mode, "qos": qos, "delivered_msgs_per_s": rate, "broker_cpu_pct": pct,
                                  "broker_core_us_per_msg": cost[mode][-1], "lost": m.get("lost"),
                                  "duplicates": m.get("duplicates")}), flush=True)
        off, on = statistics.median(rates["off"]), statistics.median(rates["rules"])
        off_us, on_us = statistics.median(cost["off"]), statistics.median(cost["rules"])
        print(json.dumps({"summary": True, "qos": qos, "off_msgs_per_s": off, "rules_msgs_per_s": on,
                          "rules_over_off": round(on / off, 3), "off_core_us_per_msg": off_us,
                          "rules_core_us_per_msg": on_us, "cpu_rules_over_off": round(on_us / off_us, 3),
                          "runs": rates, "core_us_per_msg": cost}), flush=True)


if __name__ == "__main__":
    main()
