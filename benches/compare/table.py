#!/usr/bin/env python3
"""Markdown tables from the output directories of benches/compare/compare.sh (FerryMQ vs
Mosquitto, MQTT) and compare_amqp.sh (FerryMQ vs RabbitMQ, AMQP 0-9-1).

Usage: benches/compare/table.py [OUTDIR ...]   (default: the newest benches/compare/raw/*)

Which comparison a directory holds is read from its manifest.tsv (a `rabbitmq` run makes it
AMQP). Per directory: the run's environment (env.txt) and broker configuration, one
throughput/latency table (rows in run order of manifest.tsv, FerryMQ first within a
scenario, the ratio of FerryMQ's delivered msg/s to the other broker's on the FerryMQ row;
AMQP rows with an id like ``p1@never`` are FerryMQ with another fsync policy, compared with
RabbitMQ's ``p1``), the idle-connection rows, then a list of anomalies (loss, duplicates,
reordering, foreign payloads, nacks, returns, errors, non-zero exit codes, broker log
warnings, runs that started on a busy machine). With several AMQP directories a summary
table comes first (delivered msg/s and latencies side by side per run).
"""
import json
import os
import sys

NAMES = {"ferrymq": "FerryMQ", "mosquitto": "Mosquitto", "rabbitmq": "RabbitMQ"}


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


def broker_log(path):
    """Lines of the per-run broker log that are not routine (the script counted the routine
    ones and wrote that count as a line in parentheses; ferrymq runs at --log warn)."""
    try:
        return [l for l in open(path).read().splitlines()
                if l.strip() and not (l.startswith("(") and "routine conn" in l)]
    except FileNotFoundError:
        return []


def summarize_log(lines):
    """RabbitMQ writes multi-line reports: count lines per level, keep the first line of each."""
    levels, firsts = {}, []
    for l in lines:
        for lev in ("[warning]", "[error]", "[critical]", "WARN", "ERROR", "panic"):
            if lev in l:
                levels[lev] = levels.get(lev, 0) + 1
                if len(firsts) < 2:
                    firsts.append(l[:220])
                break
    return levels, firsts


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


def read_dir(out):
    """(scenario ids in run order, {(id, broker): run}) from manifest.tsv and the run files."""
    manifest = []
    with open(os.path.join(out, "manifest.tsv")) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 4:
                manifest.append(parts)
    order, runs = [], {}
    for id_, broker, desc, name, *cmd in manifest:
        if id_ not in order:
            order.append(id_)
        runs[(id_, broker)] = {
            "desc": desc, "name": name, "cmd": cmd[0] if cmd else "",
            "d": load(os.path.join(out, name + ".json")),
            "rc": rc_of(os.path.join(out, name + ".txt")),
            "log": broker_log(os.path.join(out, name + ".broker.log")),
        }
    return order, runs


def other_of(runs):
    """The broker FerryMQ is compared with in this directory."""
    return "rabbitmq" if any(b == "rabbitmq" for _, b in runs) else "mosquitto"


def label(id_, broker):
    if broker == "ferrymq" and "@" in id_:
        return f"FerryMQ (fsync {id_.split('@', 1)[1]})"
    return NAMES.get(broker, broker)


def ratio_of(runs, id_, d, other):
    ref = runs.get((id_.split("@", 1)[0], other))
    if ref and ref["d"].get("delivered_msgs_per_s") and d.get("delivered_msgs_per_s") is not None:
        return d["delivered_msgs_per_s"] / ref["d"]["delivered_msgs_per_s"]
    return None


def lat(d, key):
    x = d.get(key) or {}
    if not x.get("samples"):
        return "-"
    return f"{ms(x.get('p50'))} / {ms(x.get('p99'))}"


def bolded(x):
    return f"**{x:,}**" if x else "0"


def rss_cell(d, c):
    return " + ".join(f"{x.get('rss_kb_start', 0) / 1024:.0f} / {x.get('rss_kb_end', 0) / 1024:.0f}"
                      for x in (d.get("cpu_total_run") or c).get("brokers", [])) or "-"


def cpu_cell(c):
    return " + ".join(f"{x.get('cpu_pct_of_core', 0):.0f}%" for x in c.get("brokers", [])) or "-"


def mqtt_row(id_, desc, lab, name, d, rc, ratio, anomalies):
    """One row of the MQTT table (columns of MQTT_HEADER); adds to `anomalies`."""
    p, c, lat_ = d["params"], d["cpu"], d["latency_ms"]
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
    lost, dup, reord = d.get("lost", 0), d.get("duplicates", 0), d.get("reordered", 0)
    print("| " + " | ".join([
        id_, desc, lab, n(d.get("published_msgs_per_s")), n(d.get("delivered_msgs_per_s")),
        f"{ratio:.2f}x" if ratio is not None else "",
        f"{d.get('delivered', 0):,} / {d.get('expected_deliveries', 0):,}", bolded(lost), bolded(dup), bolded(reord),
        f"{ms(lat_.get('p50'))} / {ms(lat_.get('p95'))} / {ms(lat_.get('p99'))}",
        pct(c.get("client_cpu_pct_of_core")), cpu_cell(c), pct(c.get("machine_busy_pct")), rss_cell(d, c),
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
        bug = name.endswith("_ferrymq") and p.get("qos", 0) > 0 and (lost or dup)
        anomalies.append(f"{name} (QoS {p.get('qos')}, {desc}): " + ", ".join(what)
                         + f"; delivered {d.get('delivered', 0):,} of {d.get('expected_deliveries', 0):,},"
                         f" drain {d.get('drain_end')}" + (" **QoS>0 on FerryMQ: BUG**" if bug else ""))
    for e in d.get("errors", []):
        anomalies.append(f"{name}: error: {str(e)[:300]}")


def amqp_row(id_, desc, lab, name, d, rc, ratio, anomalies):
    """One row of the AMQP table (columns of AMQP_HEADER); adds to `anomalies`."""
    p, c, a = d["params"], d["cpu"], d.get("amqp") or {}
    ferrymq = name.endswith("_ferrymq")
    notes = []
    if d.get("drain_end") not in ("complete", None):
        notes.append(f"drain {d['drain_end']} {d.get('drain_s')} s")
    for key, what in (("nacked", "nacked"), ("returned", "returned"), ("redelivered", "redelivered"),
                      ("connection_blocked_events", "connection.blocked"),
                      ("messages_left_in_queue_at_delete", "left in queue")):
        if a.get(key):
            notes.append(f"{what} {a[key]:,}")
    if d.get("foreign"):
        notes.append(f"foreign {d['foreign']:,}")
    if d.get("reordered"):
        notes.append(f"reordered {d['reordered']:,}")
    if d.get("unacked_at_end"):
        notes.append(f"unconfirmed {d['unacked_at_end']:,}")
    if a.get("consumer_batched_reads"):
        notes.append("read coalescing on")
    if not p.get("confirm") and not p.get("rate_per_pub"):
        notes.append("unpaced: latency is queueing")
    if d.get("errors"):
        notes.append(f"{len(d['errors'])} error(s)")
    if rc not in (0, None):
        notes.append(f"rc {rc}")
    lost, dup = d.get("lost", 0), d.get("duplicates", 0)
    print("| " + " | ".join([
        id_, desc, lab, n(d.get("published_msgs_per_s")), n(d.get("delivered_msgs_per_s")),
        f"{ratio:.2f}x" if ratio is not None else "",
        f"{d.get('delivered', 0):,} / {d.get('expected_deliveries', 0):,}", bolded(lost), bolded(dup),
        lat(d, "latency_ms"), lat(d, "ack_latency_ms"),
        pct(c.get("client_cpu_pct_of_core")), cpu_cell(c), pct(c.get("machine_busy_pct")), rss_cell(d, c),
        ", ".join(notes)]) + " |")
    what = []
    if lost:
        what.append(f"lost {lost:,} ({d.get('lost_pct')}%)")
    if dup:
        what.append(f"duplicates {dup:,}")
    for key in ("foreign", "unacked_at_end"):
        if d.get(key):
            what.append(f"{key} {d[key]:,}")
    if a.get("nacked"):
        what.append(f"nacked {a['nacked']:,}")
    if a.get("returned"):
        what.append(f"returned {a['returned']:,}")
    if what:
        bug = ferrymq and (lost or dup or d.get("unacked_at_end") or a.get("nacked"))
        anomalies.append(f"{name} ({desc}): " + ", ".join(what)
                         + f"; delivered {d.get('delivered', 0):,} of {d.get('expected_deliveries', 0):,},"
                         f" drain {d.get('drain_end')}" + (" **FerryMQ: BUG**" if bug else ""))
    for e in d.get("errors", []):
        anomalies.append(f"{name}: error: {str(e)[:300]}" + (" **FerryMQ: BUG**" if ferrymq else ""))


MQTT_HEADER = ["id", "scenario", "broker", "published msg/s", "delivered msg/s", "FerryMQ / Mosquitto",
               "delivered / expected", "lost", "dup", "reord.", "latency p50 / p95 / p99 ms",
               "client CPU", "broker CPU", "machine busy", "broker RSS MB start / end", "notes"]
AMQP_HEADER = ["id", "scenario", "broker", "published msg/s", "delivered msg/s", "FerryMQ / RabbitMQ",
               "delivered / expected", "lost", "dup", "delivery latency p50 / p99 ms", "confirm latency p50 / p99 ms",
               "client CPU", "broker CPU", "machine busy", "broker RSS MB start / end", "notes"]


def conns_table(conns, amqp, anomalies):
    """The idle-connection rows (mqload conns)."""
    print()
    print("| id | broker | connected | conn/s | handshake p50 / p99 ms | broker RSS before / connected / hold end / after close kB"
          " | RSS per connection | alive at end of hold | client CPU (connect) | broker CPU (connect) |")
    print("|" + "---|" * 10)
    for id_, lab, name, d in conns:
        def rss(key):
            v = d.get(key) or []
            return f"{v[0]['rss_kb']:,}" if v else "-"
        per = (d.get("broker_rss_per_connection") or [{}])[0]
        cl = d.get("connect_latency_ms", {})
        cc = d.get("cpu_connect_phase", {})
        delta = per.get("rss_delta_kb")
        if amqp:
            delta_s = f"{'+' + format(delta, ',') if delta is not None else '-'} kB"
        else:
            delta_s = f"+{per.get('rss_delta_kb', '-'):,} kB"
        print(f"| {id_} | {lab} | {d.get('succeeded')} / {d.get('requested')} | {n(d.get('connect_rate_per_s'))}"
              f" | {ms(cl.get('p50'))} / {ms(cl.get('p99'))}"
              f" | {rss('broker_rss_before')} / {rss('broker_rss_connected')} / {rss('broker_rss_hold_end')} / {rss('broker_rss_after_close')}"
              f" | {delta_s} = {per.get('kb_per_connection', '-')} kB"
              f" | {d.get('alive_at_end_of_hold')} | {pct(cc.get('client_cpu_pct_of_core'))} | {cpu_cell(cc)} |")
        if d.get("failed") or d.get("dropped_during_hold"):
            anomalies.append(f"{name}: failed {d.get('failed')}, dropped during hold {d.get('dropped_during_hold')}"
                             + (" **FerryMQ: BUG?**" if amqp and name.endswith("_ferrymq") else ""))
        for e in d.get("errors", []):
            anomalies.append(f"{name}: error: {str(e)[:300]}")


def table(out):
    env = env_block(out)
    if env:
        print(env)
    order, runs = read_dir(out)
    other = other_of(runs)
    amqp = other == "rabbitmq"
    hdr = AMQP_HEADER if amqp else MQTT_HEADER
    row = amqp_row if amqp else mqtt_row
    anomalies = []
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    conns = []
    for id_ in order:
        for broker in ("ferrymq", other):
            r = runs.get((id_, broker))
            if not r:
                continue
            d, name, desc, rc = r["d"], r["name"], r["desc"], r["rc"]
            lab = label(id_, broker)
            if amqp:
                levels, firsts = summarize_log(r["log"])
                if levels:
                    anomalies.append(f"{name}: broker log: " + ", ".join(f"{v} {k} line(s)" for k, v in levels.items())
                                     + "; first: " + " / ".join(firsts))
                elif r["log"] and broker == "ferrymq":
                    anomalies.append(f"{name}: broker log: {len(r['log'])} line(s); first: {r['log'][0][:220]}")
            else:
                for l in r["log"]:
                    anomalies.append(f"{name}: broker log: {l[:300]}")
            if rc not in (0, None):
                anomalies.append(f"{name}: mqload exit code {rc}")
            if d.get("mode") == "conns":
                conns.append((id_, lab, name, d))
                continue
            if not d.get("params"):
                print(f"| {id_} | {desc} | {lab} | fatal: {d.get('fatal')} |" + " |" * (len(hdr) - 4))
                anomalies.append(f"{name}: fatal: {d.get('fatal')}")
                continue
            ratio = ratio_of(runs, id_, d, other) if broker == "ferrymq" else None
            row(id_, desc, lab, name, d, rc, ratio, anomalies)

    if conns:
        conns_table(conns, amqp, anomalies)

    warnings = [("ferrymq.warnings.txt", "ferrymq.stderr.log: {} WARN/ERROR/panic line(s)", 200, 5)]
    if amqp:
        warnings = [("ferrymq.warnings.txt", "ferrymq.stderr.log: {} WARN/ERROR/panic line(s)", 160, 2),
                    ("rabbit.warnings.txt", "rabbit.log: {} warning/error/critical line(s) over the whole run", 160, 2)]
    for f, what, width, first in warnings:
        path = os.path.join(out, f)
        if os.path.exists(path):
            lines = [l for l in open(path).read().splitlines() if l.strip()]
            anomalies.append(what.format(len(lines)) + (": " + " | ".join(l[:width] for l in lines[:first]) if lines else ""))
    quiet = [f[:-6] for f in sorted(os.listdir(out))
             if f.endswith(".quiet") and "NOT QUIET" in open(os.path.join(out, f)).read()]
    if quiet:
        anomalies.append("machine not quiet before: " + ", ".join(quiet))
    print()
    print("Anomalies:" if anomalies else "Anomalies: none")
    for a in anomalies:
        print(f"* {a}")


def summary(dirs):
    """AMQP, several directories: one line per scenario with FerryMQ's and RabbitMQ's delivered
    msg/s and latencies, run by run."""
    data = [read_dir(d) for d in dirs]
    order = []
    for o, _ in data:
        for id_ in o:
            if id_ not in order:
                order.append(id_)
    k = len(dirs)
    sl = lambda xs: "; ".join(xs)  # noqa: E731
    print("| id | scenario | FerryMQ msg/s | RabbitMQ msg/s | FerryMQ / RabbitMQ | FerryMQ delivery p50 / p99 ms"
          " | RabbitMQ delivery p50 / p99 ms | FerryMQ confirm p50 / p99 ms | RabbitMQ confirm p50 / p99 ms"
          " | broker CPU FerryMQ / RabbitMQ | broker RSS MB end FerryMQ / RabbitMQ | lost / dup (all runs) |")
    print("|" + "---|" * 12)
    note = (f"Values per run ({k} run(s), in the order given, separated by '; '). Rows with '@': FerryMQ with"
            " another fsync policy, compared with RabbitMQ's row of the same scenario.")
    for id_ in order:
        rows = {b: [r.get((id_, b)) for _, r in data] for b in ("ferrymq", "rabbitmq")}
        if id_.split("@")[0] != id_:
            rows["rabbitmq"] = [r.get((id_.split("@")[0], "rabbitmq")) for _, r in data]
        any_run = next((x for b in rows for x in rows[b] if x), None)
        if not any_run or any_run["d"].get("mode") == "conns":
            continue
        desc = any_run["desc"]

        def col(b, f):
            return sl([f(x["d"]) if x and x["d"].get("params") else "-" for x in rows[b]])

        def latcol(b, key):
            return sl([lat(x["d"], key) if x and x["d"].get("params") else "-" for x in rows[b]])

        def ratio(f, r):
            v = ratio_of(r, id_, f["d"], "rabbitmq") if f and f["d"].get("params") else None
            return f"{v:.2f}x" if v is not None else "-"

        ratios = sl([ratio(f, r) for f, (_, r) in zip(rows["ferrymq"], data)])
        cpu = lambda d: " + ".join(f"{x.get('cpu_pct_of_core', 0):.0f}%" for x in d["cpu"].get("brokers", []))  # noqa: E731
        rssend = lambda d: " + ".join(f"{x.get('rss_kb_end', 0) / 1024:.0f}" for x in (d.get("cpu_total_run") or d["cpu"]).get("brokers", []))  # noqa: E731
        losses = []
        for b in rows:
            for x in rows[b]:
                if x and x["d"].get("params") and (x["d"].get("lost") or x["d"].get("duplicates")):
                    losses.append(f"**{NAMES[b]} {x['d'].get('lost', 0):,} / {x['d'].get('duplicates', 0):,}**")
        print("| " + " | ".join([
            id_, desc,
            col("ferrymq", lambda d: n(d.get("delivered_msgs_per_s"))),
            col("rabbitmq", lambda d: n(d.get("delivered_msgs_per_s"))),
            ratios, latcol("ferrymq", "latency_ms"), latcol("rabbitmq", "latency_ms"),
            latcol("ferrymq", "ack_latency_ms"), latcol("rabbitmq", "ack_latency_ms"),
            col("ferrymq", cpu) + " vs " + col("rabbitmq", cpu),
            col("ferrymq", rssend) + " vs " + col("rabbitmq", rssend),
            "; ".join(losses) or "0 / 0"]) + " |")
    # idle connections
    for id_ in order:
        cells = []
        for b in ("ferrymq", "rabbitmq"):
            vals = []
            for _, r in data:
                x = r.get((id_, b))
                if x and x["d"].get("mode") == "conns":
                    per = (x["d"].get("broker_rss_per_connection") or [{}])[0]
                    vals.append(f"{per.get('kb_per_connection', '-')} kB/conn, {n(x['d'].get('connect_rate_per_s'))} conn/s,"
                                f" {x['d'].get('succeeded')}/{x['d'].get('requested')} ok")
            if vals:
                cells.append(f"{NAMES[b]}: " + "; ".join(vals))
        if cells:
            print(f"\nIdle connections ({id_}): " + "; ".join(cells) + ".")
    print(f"\n{note}")


def newest():
    """The most recent output directory of either compare script under raw/."""
    raw = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raw")
    runs = sorted((os.path.getmtime(os.path.join(raw, d)), d) for d in os.listdir(raw)) if os.path.isdir(raw) else []
    if not runs:
        sys.exit(f"nothing in {raw}: name the output directories")
    return [os.path.join(raw, runs[-1][1])]


def main():
    dirs = sys.argv[1:] or newest()
    amqp = [other_of(read_dir(d)[1]) == "rabbitmq" for d in dirs]
    if len(dirs) > 1 and all(amqp):
        print("### Summary (" + ", ".join(os.path.basename(os.path.normpath(d)) for d in dirs) + ")\n")
        summary(dirs)
        print()
    for i, out in enumerate(dirs):
        if len(dirs) > 1:
            print(("\n" if i or all(amqp) else "") + f"### {os.path.basename(os.path.normpath(out))}\n")
        table(out)


if __name__ == "__main__":
    main()
