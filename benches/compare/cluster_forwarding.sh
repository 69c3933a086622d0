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

PIDS=()
DIRS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 1 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
  done
  for d in "${DIRS[@]}"; do rm -rf "$d"; done
  PIDS=(); DIRS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM HUP

free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# start_member NAME MQTT_PORT [CLUSTER_TOML]: a member (or, without CLUSTER_TOML, a single
# node), ready when its READY line names its MQTT port.
start_member() {
  local name=$1 port=$2 cluster=${3:-} dir
  dir=$(mktemp -d /tmp/ferrymq-cluster-bench.XXXXXX)
  DIRS+=("$dir")
  printf '%s\n' "$cluster" >"$dir/ferrymq.toml"
  : >"$dir/stdout"
  env $(compgen -e | grep '^FERRYMQ_' | sed 's/^/-u /') "$FQ" --config "$dir/ferrymq.toml" --data-dir "$dir/data" \
    --mqtt-listen "127.0.0.1:$port" --mqtt-ws-listen "" --amqp-listen "" --http-listen "" --log warn \
    >"$dir/stdout" 2>"$OUT/$name.log" &
  PIDS+=($!)
  for _ in $(seq 1 300); do grep -q "FERRYMQ READY mqtt=127.0.0.1:$port" "$dir/stdout" && return 0; sleep 0.1; done
  echo "$name did not become ready" >&2; cat "$OUT/$name.log" >&2; exit 2
}

# start_cluster: three members; MQTT ports in P0 P1 P2.
start_cluster() {
  local peer
  read -r P0 P1 P2 R0 R1 R2 <<<"$(free_ports 6)"
  local r=("$R0" "$R1" "$R2")
  for i in 0 1 2; do
    peer=""
    for j in 0 1 2; do [ "$i" = "$j" ] || peer="$peer\"n$j@127.0.0.1:${r[$j]}\","; done
    local ports=("$P0" "$P1" "$P2")
    start_member "n$i" "${ports[$i]}" "[cluster]
node_name = \"n$i\"
listen = \"127.0.0.1:${r[$i]}\"
peers = [${peer%,}]
secret = \"benchmark-secret-0123456789abcdef\""
  done
  sleep 3   # the metadata group forms; interest links come up (each member announces every second)
}

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
