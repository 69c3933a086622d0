#!/usr/bin/env python3
"""Markdown tables from the output directory of interop/bench/compare.sh.

Usage: interop/bench/table.py [OUTDIR ...]   (default: the newest interop/bench/raw/mqtt-*)

One throughput/latency table per directory (rows in run order of manifest.tsv, FerryMQ
first within a scenario), with the ratio FerryMQ / Mosquitto of delivered msg/s on the
FerryMQ row, then the idle-connection rows, then a list of anomalies (loss, duplicates,
reordering, foreign payloads, errors, non-zero exit codes, broker log warnings).
"""
import json
import os
import sys

NAMES = {"ferrymq": "FerryMQ", "mosquitto": "Mosquitto"}


def load(path):
    try:
        lines = [l for l in open(path).read().splitlines() if l.strip()]
        return json.loads(lines[-1])
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "fatal": f"unreadable {os.path.basename(path)}: {e}"}


def n(x):
    return "-" if x is None else f"{x:,.0f}"


def ms(x):
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def pct(x):
    return "-" if x is None else f"{x:.0f}%"


def rc_of(txt):
    try:
        for line in reversed(open(txt).read().splitlines()):
            if line.startswith("rc="):
                return int(line[3:])
    except Exception:  # noqa: BLE001
        pass
    return None


def broker_log_lines(path):
    """Lines of the per-run broker log that are not routine (ferrymq runs at --log warn)."""
    try:
        out = []
        for l in open(path).read().splitlines():
            if not l.strip() or l.startswith("(") and "routine connect/disconnect" in l:
                continue
            out.append(l)
        return out
    except FileNotFoundError:
        return []


def env_block(out, confs=("mosquitto.conf", "rabbitmq.conf")):
    """The run's environment (env.txt) and broker configuration files, as Markdown, so that
    the summary keeps them once the raw files are gone."""
    parts = []
    for f in ("env.txt",) + tuple(confs):
        path = os.path.join(out, f)
        if os.path.exists(path):
            body = open(path).read().rstrip("\n")
            parts.append(f"`{f}`:\n\n```text\n{body}\n```\n")
    return "\n".join(parts)


def table(out):
    env = env_block(out)
    if env:
        print(env)
    manifest = []
    with open(os.path.join(out, "manifest.tsv")) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 4:
                manifest.append(parts)
    order = []
    runs = {}
    for id_, broker, desc, name, *cmd in manifest:
        if id_ not in order:
            order.append(id_)
        d = load(os.path.join(out, name + ".json"))
        runs[(id_, broker)] = (desc, name, d, rc_of(os.path.join(out, name + ".txt")),
                               broker_log_lines(os.path.join(out, name + ".broker.log")))

    anomalies = []
    hdr = ["id", "scenario", "broker", "published msg/s", "delivered msg/s", "FerryMQ / Mosquitto",
           "delivered / expected", "lost", "dup", "reord.", "latency p50 / p95 / p99 ms",
           "client CPU", "broker CPU", "machine busy", "broker RSS MB start / end", "notes"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    conns = []
    for id_ in order:
        for broker in ("ferrymq", "mosquitto"):
            if (id_, broker) not in runs:
                continue
            desc, name, d, rc, blog = runs[(id_, broker)]
            label = NAMES[broker]
            for l in blog:
                anomalies.append(f"{name}: broker log: {l[:300]}")
            if rc not in (0, None):
                anomalies.append(f"{name}: mqload exit code {rc}")
            if d.get("mode") == "conns":
                conns.append((id_, desc, label, name, d))
                continue
            if not d.get("params"):
                print(f"| {id_} | {desc} | {label} | fatal: {d.get('fatal')} |" + " |" * (len(hdr) - 4))
                anomalies.append(f"{name}: fatal: {d.get('fatal')}")
                continue
            p, c, lat = d["params"], d["cpu"], d["latency_ms"]
            ratio = ""
            if broker == "ferrymq" and (id_, "mosquitto") in runs:
                m = runs[(id_, "mosquitto")][2]
                if m.get("delivered_msgs_per_s"):
                    ratio = f"{d['delivered_msgs_per_s'] / m['delivered_msgs_per_s']:.2f}x"
            rss = " + ".join(f"{x.get('rss_kb_start', 0) / 1024:.0f} / {x.get('rss_kb_end', 0) / 1024:.0f}"
                             for x in (d.get("cpu_total_run") or c).get("brokers", [])) or "-"
            bcpu = " + ".join(f"{x.get('cpu_pct_of_core', 0):.0f}%" for x in c.get("brokers", [])) or "-"
            notes = []
            if d.get("drain_end") not in ("complete", None):
                notes.append(f"drain {d['drain_end']} {d.get('drain_s')} s")
            if d.get("foreign"):
                notes.append(f"foreign {d['foreign']:,}")
            if d.get("unacked_at_end"):
                notes.append(f"unacked {d['unacked_at_end']:,}")
            mq = d.get("mqtt") or {}
            if p.get("qos", 0) > 0:
                notes.append(f"window {mq.get('effective_window')}")
            if mq.get("server_receive_maximum") is not None:
                notes.append(f"server Receive Max {mq['server_receive_maximum']}")
            if mq.get("subscriber_batched_reads"):
                notes.append("read coalescing on")
            if p.get("rate_per_pub", 0) == 0 and p.get("qos", 0) == 0:
                notes.append("unpaced: latency is queueing")
            if d.get("errors"):
                notes.append(f"{len(d['errors'])} error(s)")
            if rc not in (0, None):
                notes.append(f"rc {rc}")
            lost = d.get("lost", 0)
            lost_s = f"**{lost:,}**" if lost else "0"
            dup = d.get("duplicates", 0)
            dup_s = f"**{dup:,}**" if dup else "0"
            reord = d.get("reordered", 0)
            reord_s = f"**{reord:,}**" if reord else "0"
            print("| " + " | ".join([
                id_, desc, label, n(d.get("published_msgs_per_s")), n(d.get("delivered_msgs_per_s")), ratio,
                f"{d.get('delivered', 0):,} / {d.get('expected_deliveries', 0):,}", lost_s, dup_s, reord_s,
                f"{ms(lat.get('p50'))} / {ms(lat.get('p95'))} / {ms(lat.get('p99'))}",
                pct(c.get("client_cpu_pct_of_core")), bcpu, pct(c.get("machine_busy_pct")), rss,
                ", ".join(notes)]) + " |")
            what = []
            if lost:
                what.append(f"lost {lost:,} ({d.get('lost_pct')}%)")
            if dup:
                what.append(f"duplicates {dup:,}")
            if reord:
                what.append(f"reordered {reord:,}")
            if d.get("foreign"):
                what.append(f"foreign {d['foreign']:,}")
            if d.get("unacked_at_end"):
                what.append(f"unacked at end {d['unacked_at_end']:,}")
            if what:
                sev = "QoS>0 on FerryMQ: BUG" if broker == "ferrymq" and p.get("qos", 0) > 0 and (lost or dup) else ""
                anomalies.append(f"{name} (QoS {p.get('qos')}, {desc}): " + ", ".join(what)
                                 + f"; delivered {d.get('delivered', 0):,} of {d.get('expected_deliveries', 0):,},"
                                 f" drain {d.get('drain_end')}" + (f" **{sev}**" if sev else ""))
            for e in d.get("errors", []):
                anomalies.append(f"{name}: error: {str(e)[:300]}")

    if conns:
        print()
        print("| id | broker | connected | conn/s | handshake p50 / p99 ms | broker RSS before / connected / hold end / after close kB"
              " | RSS per connection | alive at end of hold | client CPU (connect) | broker CPU (connect) |")
        print("|" + "---|" * 10)
        for id_, desc, label, name, d in conns:
            def rss(key):
                v = d.get(key) or []
                return f"{v[0]['rss_kb']:,}" if v else "-"
            per = (d.get("broker_rss_per_connection") or [{}])[0]
            cl = d.get("connect_latency_ms", {})
            cc = d.get("cpu_connect_phase", {})
            bc = " + ".join(f"{x.get('cpu_pct_of_core', 0):.0f}%" for x in cc.get("brokers", [])) or "-"
            print(f"| {id_} | {label} | {d.get('succeeded')} / {d.get('requested')} | {n(d.get('connect_rate_per_s'))}"
                  f" | {ms(cl.get('p50'))} / {ms(cl.get('p99'))}"
                  f" | {rss('broker_rss_before')} / {rss('broker_rss_connected')} / {rss('broker_rss_hold_end')} / {rss('broker_rss_after_close')}"
                  f" | +{per.get('rss_delta_kb', '-'):,} kB = {per.get('kb_per_connection', '-')} kB"
                  f" | {d.get('alive_at_end_of_hold')} | {pct(cc.get('client_cpu_pct_of_core'))} | {bc} |")
            if d.get("failed") or d.get("dropped_during_hold"):
                anomalies.append(f"{name}: failed {d.get('failed')}, dropped during hold {d.get('dropped_during_hold')}")
            for e in d.get("errors", []):
                anomalies.append(f"{name}: error: {str(e)[:300]}")

    warn = os.path.join(out, "ferrymq.warnings.txt")
    if os.path.exists(warn):
        lines = [l for l in open(warn).read().splitlines() if l.strip()]
        anomalies.append(f"ferrymq.stderr.log: {len(lines)} WARN/ERROR/panic line(s)"
                         + (": " + " | ".join(l[:200] for l in lines[:5]) if lines else ""))
    quiet = []
    for f in sorted(os.listdir(out)):
        if f.endswith(".quiet") and "NOT QUIET" in open(os.path.join(out, f)).read():
            quiet.append(f[:-6])
    if quiet:
        anomalies.append("machine not quiet before: " + ", ".join(quiet))
    print()
    print("Anomalies:" if anomalies else "Anomalies: none")
    for a in anomalies:
        print(f"* {a}")


def newest(kind):
    """The most recent output directory of the compare script of `kind` under raw/."""
    raw = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raw")
    runs = sorted(d for d in os.listdir(raw) if d.startswith(kind + "-")) if os.path.isdir(raw) else []
    if not runs:
        sys.exit(f"no {raw}/{kind}-* directory: name the output directories")
    return [os.path.join(raw, runs[-1])]


def main():
    dirs = sys.argv[1:] or newest("mqtt")
    for i, out in enumerate(dirs):
        if len(dirs) > 1:
            print(("\n" if i else "") + f"### {os.path.basename(os.path.normpath(out))}\n")
        table(out)


if __name__ == "__main__":
    main()
