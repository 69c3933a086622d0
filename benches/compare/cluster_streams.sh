#!/usr/bin/env bash
# What replicating a stream costs: AMQP 0-9-1 publishers with confirms (persistent, 256 in
# flight each) to a stream, one consumer with manual acks (prefetch 100), 1 KiB bodies:
#   single    one FerryMQ node without [cluster] (the stream on one disk);
#   ferrymq3  three FerryMQ members on loopback: publish through n1, consume through n2 (each
#             publish confirmed once a majority of the data group holds it);
#   rabbit3   three RabbitMQ nodes on loopback (../shared/tools/rabbit3.sh, or RABBIT3=path):
#             a stream, publish through rq2, consume through rq3; and a quorum queue the same
#             way (rabbit3-quorum), for reference.
# Every FerryMQ row starts fresh members in their own data directories; the RabbitMQ
# cluster is started once (left running) and each row declares and deletes its own queue.
#
# Usage: benches/compare/cluster_streams.sh [OUTDIR]  (default benches/compare/raw/streams-<date>-<time>, git-ignored)
# Environment: FERRYMQ_BIN (default target/release/ferrymq), MQLOAD (default
# target/mqload/release/mqload, built when missing), DURATION (publishing seconds, default 8),
# PUBS (publishers, default 1), ROWS (default "single ferrymq3 rabbit3 rabbit3-quorum"),
# RABBIT3 (default ../shared/tools/rabbit3.sh beside the repository).
#
# Writes <row>.json (mqload's JSON) and prints a table. Bounded: mqload runs with --duration,
# --drain and a `timeout`; FerryMQ members are stopped after each row and on exit.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
D=${DURATION:-8}
PUBS=${PUBS:-1}
ROWS=${ROWS:-single ferrymq3 rabbit3 rabbit3-quorum}
FQ=${FERRYMQ_BIN:-$REPO/target/release/ferrymq}
M=${MQLOAD:-$REPO/target/mqload/release/mqload}
RABBIT3=${RABBIT3:-$REPO/../shared/tools/rabbit3.sh}
OUT=${1:-$REPO/benches/compare/raw/streams-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
if [ -z "${MQLOAD:-}" ] && [ ! -x "$M" ]; then
  cargo build --release --quiet --manifest-path "$REPO/benches/mqload/Cargo.toml" --target-dir "$REPO/target/mqload" || exit 2
fi
[ -x "$FQ" ] || { echo "missing $FQ (cargo build --release)" >&2; exit 2; }

LISTEN=amqp
# shellcheck source=cluster_lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/cluster_lib.sh"

# load NAME PUB_PORT CONSUMER_PORT TYPE: declares queue NAME of TYPE through PUB_PORT (kept),
# waits a second (a cluster's other members apply the declaration), then runs the load.
load() {
  local name=$1 pub=$2 con=$3 kind=$4 q="bench-$1-$$"
  timeout 60 "$M" --quiet amqp --port "$pub" --queue "$q" --queue-type "$kind" --declare-only \
    >"$OUT/$name-declare.json" 2>"$OUT/$name-declare.txt"
  sleep 1
  timeout $((D + 90)) "$M" --quiet amqp --port "$pub" --consumer-port "$con" --queue "$q" --existing-queue \
    --confirm --confirm-window 256 --persistent --ack manual --prefetch 100 --size 1024 --pubs "$PUBS" \
    --consumers 1 --duration "$D" --drain 30 --drain-idle 5 >"$OUT/$name.json" 2>"$OUT/$name.txt"
  echo "$name rc=$?" >>"$OUT/events.log"
}

for row in $ROWS; do
  case $row in
    single)
      read -r SP <<<"$(free_ports 1)"
      start_member single "$SP"
      load single "$SP" "$SP" stream
      stop_all ;;
    ferrymq3)
      start_cluster
      load ferrymq3 "$P1" "$P2" stream
      stop_all ;;
    rabbit3|rabbit3-quorum)
      bash "$RABBIT3" >"$OUT/rabbit3-start.txt" 2>&1 || { echo "rabbit3.sh failed" >&2; continue; }
      kind=stream; [ "$row" = rabbit3-quorum ] && kind=quorum
      load "$row" 5682 5683 "$kind" ;;
  esac
done

python3 - "$OUT" "$ROWS" <<'PY' | tee "$OUT/table.md"
import json, os, sys
out, rows = sys.argv[1], sys.argv[2].split()
print("| row | published (confirmed) msgs/s | delivered msgs/s | confirm p50 / p99 ms | end-to-end p50 / p99 ms | lost | duplicates |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for row in rows:
    path = os.path.join(out, f"{row}.json")
    try:
        r = json.loads([l for l in open(path) if l.strip()][-1])
    except Exception as e:
        print(f"| {row} | (no result: {e}) | | | | | |")
        continue
    lat, ack = r.get("latency_ms") or {}, r.get("ack_latency_ms") or {}
    print(f"| {row} | {r.get('published_msgs_per_s', r.get('sent_msgs_per_s'))} | {r.get('delivered_msgs_per_s')} | "
          f"{ack.get('p50')} / {ack.get('p99')} | {lat.get('p50')} / {lat.get('p99')} | {r.get('lost')} | {r.get('duplicates')} |")
PY
