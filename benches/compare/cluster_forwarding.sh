#!/usr/bin/env bash
# What forwarding between cluster members costs: three FerryMQ members on loopback, one MQTT
# publisher on n0, one subscriber either on n0 too (no hop) or on n1 (each message forwarded
# over the peer link), QoS 0 and QoS 1 (a forwarded QoS 1 publish is acknowledged once n1
# stored it), 64-byte payloads; a single node without [cluster] as the reference. Every
# row a fresh cluster (or node) in its own data directories.
#
# Usage: benches/compare/cluster_forwarding.sh [OUTDIR]   (default benches/compare/raw/cluster-<date>-<time>, git-ignored)
# Environment: FERRYMQ_BIN (default target/release/ferrymq), MQLOAD (default
# target/mqload/release/mqload, built when missing), DURATION (publishing seconds per row,
# default 8).
#
# Writes <row>.json (mqload's JSON) and prints a table of delivered msgs/s and the
# publisher's ack latency p50/p99. Bounded: mqload runs with --duration, --drain and a
# `timeout`; every member is stopped after each row and on exit.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
D=${DURATION:-8}
FQ=${FERRYMQ_BIN:-$REPO/target/release/ferrymq}
M=${MQLOAD:-$REPO/target/mqload/release/mqload}
OUT=${1:-$REPO/benches/compare/raw/cluster-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
if [ -z "${MQLOAD:-}" ] && [ ! -x "$M" ]; then
  cargo build --release --quiet --manifest-path "$REPO/benches/mqload/Cargo.toml" --target-dir "$REPO/target/mqload" || exit 2
fi
[ -x "$FQ" ] || { echo "missing $FQ (cargo build --release)" >&2; exit 2; }

LISTEN=mqtt
# shellcheck source=cluster_lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/cluster_lib.sh"

# row NAME PUB_PORT SUB_PORT QOS
row() {
  local name=$1 pub=$2 sub=$3 qos=$4
  timeout $((D + 60)) "$M" --quiet mqtt --port "$pub" --sub-port "$sub" --qos "$qos" --pubs 1 --subs 1 \
    --size 64 --duration "$D" --drain 10 >"$OUT/$name.json" 2>"$OUT/$name.txt"
  echo "$name rc=$?" >>"$OUT/events.log"
}

for qos in 0 1; do
  read -r SP <<<"$(free_ports 1)"
  start_member single "$SP"
  sleep 1
  row "single-qos$qos" "$SP" "$SP" "$qos"
  stop_all
  start_cluster
  row "same-member-qos$qos" "$P0" "$P0" "$qos"
  row "forwarded-qos$qos" "$P0" "$P1" "$qos"
  stop_all
done

python3 - "$OUT" <<'EOF' | tee "$OUT/table.md"
import json, os, sys
out = sys.argv[1]
print("| row | delivered msgs/s | end-to-end p50 / p99 ms | publisher ack p50 / p99 ms | lost | duplicates |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for qos in (0, 1):
    for row in ("single", "same-member", "forwarded"):
        path = os.path.join(out, f"{row}-qos{qos}.json")
        try:
            r = json.loads([l for l in open(path) if l.strip()][-1])
        except Exception as e:
            print(f"| {row} QoS {qos} | (no result: {e}) | | | | |")
            continue
        lat, ack = r.get("latency_ms") or {}, r.get("ack_latency_ms") or {}
        acks = f"{ack.get('p50')} / {ack.get('p99')}" if ack else "-"
        print(f"| {row}, QoS {qos} | {r.get('delivered_msgs_per_s')} | {lat.get('p50')} / {lat.get('p99')} | {acks} | "
              f"{r.get('lost')} | {r.get('duplicates')} |")
EOF
