#!/usr/bin/env bash
# Usage: BEFORE=/path/ferrymq AFTER=/path/ferrymq [M=/path/mqload] [ROUNDS=2] benches/compare/disk-bytes.sh
#
# Bytes written to disk per persistent message: MQTT QoS 1, 64-byte payloads, to a
# persistent-session subscriber (`mqload mqtt --persistent-subs`), 1 -> 1 and 4 -> 1, fsync
# `always` (the default), each binary on a fresh data directory, alternating BEFORE and AFTER.
# Per run it prints the delivered count, loss and duplicates (mqload), the broker process's
# `write_bytes` from /proc/PID/io over the run (what its threads made the kernel write to
# storage), the growth of the commit log (its end position, from /metrics), and the
# sectors written to the data directory's block device from /proc/diskstats over the run
# (the whole device: it includes the ext4 journal, and anything else writing at the time).
set -uo pipefail
M=${M:-target/mqload/release/mqload}
ROUNDS=${ROUNDS:-2}
DEV=$(basename "$(df --output=source /tmp | tail -1)")

sectors() { awk -v d="$DEV" '$3 == d { print $10 }' /proc/diskstats; }
write_bytes() { awk '/^write_bytes:/ { print $2 }' "/proc/$1/io"; }
# The commit log's next position (its growth over a run: records, effects records, padding;
# retention deleting segments does not change it).
log_end() { curl -s -u guest:guest "http://127.0.0.1:$1/metrics" | awk '/^ferrymq_journal_log_end_bytes/ { print $2 }'; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

run() { # which binary pubs
  local which=$1 bin=$2 pubs=$3 d port hport pid out wb0 wb1 s0 s1 e0 e1 log
  d=$(mktemp -d); port=$(free_port); hport=$(free_port); log=$(mktemp)
  "$bin" --data-dir "$d" --mqtt-listen "127.0.0.1:$port" --amqp-listen "" --http-listen "127.0.0.1:$hport" --mqtt-ws-listen "" \
    --log info >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  sync; sleep 1
  wb0=$(write_bytes $pid); s0=$(sectors); e0=$(log_end $hport)
  out=$(timeout 120 "$M" mqtt --port "$port" --qos 1 --pubs "$pubs" --subs 1 --size 64 --duration 8 --drain 10 \
    --persistent-subs 2>/dev/null)
  wb1=$(write_bytes $pid); s1=$(sectors); e1=$(log_end $hport)
  kill $pid; wait $pid 2>/dev/null
  echo "$out" | python3 -c '
import json, sys
which, pubs, wb, logb, dev = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
r = json.load(sys.stdin)
r = r.get("results", r)
n = r.get("delivered") or 1
lost, dup = r.get("lost"), r.get("duplicates")
print(f"{which} {pubs}->1: delivered {n}, lost {lost}, duplicates {dup}, "
      f"process writes {wb / n:.0f} B/msg, commit log growth {logb / n:.0f} B/msg, "
      f"device {dev * 512 / n:.0f} B/msg")
'  "$which" "$pubs" $((wb1 - wb0)) $((e1 - e0)) $((s1 - s0))
  grep -a "group_commits" "$log" | tail -1 | sed "s/.*group_commits/  group_commits/" | cut -c1-300
  rm -rf "$d" "$log"
}

for round in $(seq 1 "$ROUNDS"); do
  for pubs in 1 4; do
    for which in before after; do
      if [ "$which" = before ]; then run before "$BEFORE" $pubs; else run after "$AFTER" $pubs; fi
      sleep 2
    done
  done
done
