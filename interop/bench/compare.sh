#!/usr/bin/env bash
# FerryMQ vs Mosquitto, side by side, with mqload.
#
# Usage: interop/bench/compare.sh [OUTDIR]        (default interop/bench/raw/mqtt-<date>-<time>, git-ignored)
# Environment:
#   FERRYMQ_BIN   ferrymq binary (default: $CARGO_TARGET_DIR/release/ferrymq, else <repo>/target/release/ferrymq)
#   MQLOAD        mqload binary  (default /tmp/mqload-target/release/mqload)
#   MOSQUITTO     mosquitto binary (default /usr/sbin/mosquitto)
#   DURATION      publishing seconds per run (default 8)
#   QUIET_BUSY    machine-busy % (of all cores, 1 s sample) under which a run may start (default 15)
#   QUIET_MAX     longest wait for a quiet machine before each run, seconds (default 120; the run
#                 then starts anyway and the .quiet file says so)
#
# Starts both brokers on free loopback ports (never 1883/5672), runs every scenario against
# both (the broker that goes first alternates from one scenario to the next), writes per run
#   <id>_<broker>.json        mqload's JSON (last stdout line)
#   <id>_<broker>.txt         mqload's stderr summary + "rc=N"
#   <id>_<broker>.broker.log  what the broker logged during the run (Mosquitto: routine
#                             connect/disconnect lines filtered out, their count kept)
#   <id>_<broker>.quiet       machine-busy samples before the run, and a top snapshot
# plus manifest.tsv (one line per run), env.txt, the full broker logs, and stops both
# brokers (SIGTERM, SIGKILL after 15 s). Every mqload run has --duration/--drain and a
# `timeout`, so the whole script is bounded (about 7-10 minutes with a quiet machine).
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$HERE/raw/mqtt-$(date +%Y%m%d-%H%M%S)}
D=${DURATION:-8}
DRAIN=10
M=${MQLOAD:-/tmp/mqload-target/release/mqload}
MOSQ=${MOSQUITTO:-/usr/sbin/mosquitto}
FQ=${FERRYMQ_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/ferrymq}
QUIET_BUSY=${QUIET_BUSY:-15}
QUIET_MAX=${QUIET_MAX:-120}

for b in "$M" "$MOSQ" "$FQ"; do
  [ -x "$b" ] || { echo "missing binary: $b" >&2; exit 2; }
done
mkdir -p "$OUT"
# Raw output is never committed: inside the repository only where git ignores it.
case "$(cd "$OUT" && pwd)/" in
  "$REPO"/*) git -C "$REPO" check-ignore -q --no-index "$(cd "$OUT" && pwd)/probe.json" ||
    { echo "$OUT is in the repository but not git-ignored: use interop/bench/raw/ (the default) or a directory outside it" >&2; exit 2; } ;;
esac
if ls "$OUT"/*.json >/dev/null 2>&1; then
  echo "$OUT already holds results; use an empty directory" >&2; exit 2
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null  # 2,000 connections need the fds (brokers inherit this)

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/events.log" >&2; }

free_port() {
  python3 - <<'EOF'
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p not in (1883, 5672, 8883, 5671):
        print(p); break
EOF
}

listening() { ss -ltnH "sport = :$1" 2>/dev/null | grep -q .; }

FQ_PID=""; MQ_PID=""; FQ_DATA=""
FQ_PORT=$(free_port)
MQ_PORT=$(free_port)
while [ "$MQ_PORT" = "$FQ_PORT" ]; do MQ_PORT=$(free_port); done

start_ferrymq() {
  FQ_DATA=$(mktemp -d /tmp/ferrymq-bench-data.XXXXXX)
  "$FQ" --data-dir "$FQ_DATA" --mqtt-listen "127.0.0.1:$FQ_PORT" --amqp-listen "" --log warn \
    >"$OUT/ferrymq.stdout" 2>>"$OUT/ferrymq.stderr.log" &
  FQ_PID=$!
  for _ in $(seq 1 300); do
    grep -q "FERRYMQ READY mqtt=127.0.0.1:$FQ_PORT" "$OUT/ferrymq.stdout" 2>/dev/null && break
    kill -0 "$FQ_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "FERRYMQ READY mqtt=127.0.0.1:$FQ_PORT" "$OUT/ferrymq.stdout" ||
    { log "ferrymq did not become ready"; cat "$OUT/ferrymq.stderr.log" >&2; exit 2; }
  log "ferrymq pid $FQ_PID port $FQ_PORT data $FQ_DATA"
}

start_mosquitto() {
  # Only what the brief asks for; everything else stays at Mosquitto's defaults
  # (max_inflight_messages 20, max_queued_messages 1000, Nagle on, logging to stdout).
  cat >"$OUT/mosquitto.conf" <<EOF
listener $MQ_PORT 127.0.0.1
allow_anonymous true
persistence false
EOF
  chmod 644 "$OUT/mosquitto.conf"
  "$MOSQ" -c "$OUT/mosquitto.conf" >>"$OUT/mosquitto.log" 2>&1 &
  MQ_PID=$!
  for _ in $(seq 1 100); do listening "$MQ_PORT" && break; sleep 0.1; done
  listening "$MQ_PORT" || { log "mosquitto did not start"; cat "$OUT/mosquitto.log" >&2; exit 2; }
  log "mosquitto pid $MQ_PID port $MQ_PORT"
}

stop_pid() { # pid name
  local pid=$1 name=$2
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || { log "$name ($pid) was already gone"; return 0; }
  kill -TERM "$pid"
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "$name ($pid) ignored SIGTERM for 15 s, SIGKILL"; kill -KILL "$pid"; fi
  wait "$pid" 2>/dev/null; log "$name ($pid) stopped, exit status $?"
}

cleanup() {
  stop_pid "$FQ_PID" ferrymq; FQ_PID=""
  stop_pid "$MQ_PID" mosquitto; MQ_PID=""
  [ -n "$FQ_DATA" ] && rm -rf "$FQ_DATA"; FQ_DATA=""
}
trap cleanup EXIT
trap 'exit 130' INT TERM

busy_sample() { # machine busy % over 1 s (all cores), like mqload's machine_busy_pct
  local a b
  a=$(head -1 /proc/stat); sleep 1; b=$(head -1 /proc/stat)
  python3 -c '
import sys
a=[int(x) for x in sys.argv[1].split()[1:]]; b=[int(x) for x in sys.argv[2].split()[1:]]
d=[y-x for x,y in zip(a,b)]; idle=d[3]+d[4]; tot=sum(d[:8])
print(round(100*(tot-idle)/tot,1) if tot else 0)' "$a" "$b"
}

wait_quiet() { # file
  local f=$1 start=$SECONDS busy
  while :; do
    busy=$(busy_sample)
    echo "busy ${busy}% at +$((SECONDS - start)) s" >>"$f"
    python3 -c "import sys; sys.exit(0 if float('$busy') < $QUIET_BUSY else 1)" && break
    if [ $((SECONDS - start)) -ge "$QUIET_MAX" ]; then
      echo "NOT QUIET: started anyway after $QUIET_MAX s" >>"$f"; log "machine not quiet (busy ${busy}%), starting anyway"; break
    fi
    sleep 4
  done
  top -bn1 -w 200 | head -15 >>"$f"
}

ensure_brokers() {
  kill -0 "$FQ_PID" 2>/dev/null || { log "ferrymq ($FQ_PID) is gone, restarting"; wait "$FQ_PID" 2>/dev/null; log "its exit status $?"; start_ferrymq; }
  kill -0 "$MQ_PID" 2>/dev/null || { log "mosquitto ($MQ_PID) is gone, restarting"; wait "$MQ_PID" 2>/dev/null; start_mosquitto; }
}

# run ID BROKER DESCRIPTION TIMEOUT_S mqload-subcommand-args...   (port and --broker-pid added here)
run() {
  local id=$1 broker=$2 desc=$3 tmo=$4; shift 4
  local name="${id}_${broker}" port pid logf off rc
  ensure_brokers
  if [ "$broker" = ferrymq ]; then port=$FQ_PORT; pid=$FQ_PID; logf=$OUT/ferrymq.stderr.log
  else port=$MQ_PORT; pid=$MQ_PID; logf=$OUT/mosquitto.log; fi
  local sub=$1; shift
  local cmd=("$M" --quiet --broker-pid "$pid" "$sub" --port "$port" "$@")
  wait_quiet "$OUT/$name.quiet"
  off=$(stat -c %s "$logf")
  log "$name: ${cmd[*]}"
  timeout -k 5 "$tmo" "${cmd[@]}" >"$OUT/$name.json" 2>"$OUT/$name.txt"
  rc=$?
  echo "rc=$rc" >>"$OUT/$name.txt"
  sleep 0.5
  if [ "$broker" = ferrymq ]; then
    tail -c +$((off + 1)) "$logf" >"$OUT/$name.broker.log"
  else
    tail -c +$((off + 1)) "$logf" |
      awk '/New connection from|New client connected from|Client mqload-[^ ]* disconnected\.$/ {n++; next} {print}
           END {print "(" n+0 " routine connect/disconnect lines not kept)"}' >"$OUT/$name.broker.log"
  fi
  kill -0 "$pid" 2>/dev/null || echo "BROKER PROCESS $pid GONE AFTER THIS RUN" >>"$OUT/$name.txt"
  printf '%s\t%s\t%s\t%s\t%s\n' "$id" "$broker" "$desc" "$name" "${cmd[*]}" >>"$OUT/manifest.tsv"
  tail -n 9 "$OUT/$name.txt" | sed 's/^/    /' >&2
}

T=$((D + DRAIN + 40))   # mqload timeout per run: window + drain + connect/ack wait + slack

# id | description | mqload args (without --port/--broker-pid)
SCENARIOS=(
  "i|2,000 idle MQTT connections, hold 10 s (fresh brokers)|conns --proto mqtt --count 2000 --hold 10"
  "a|MQTT QoS0 1->1|mqtt --qos 0 --size 64 --duration $D --drain $DRAIN"
  "b|MQTT QoS1 1->1|mqtt --qos 1 --size 64 --duration $D --drain $DRAIN"
  "c|MQTT QoS2 1->1, window 64|mqtt --qos 2 --size 64 --duration $D --drain $DRAIN"
  "c20|MQTT QoS2 1->1, window 20|mqtt --qos 2 --inflight 20 --size 64 --duration $D --drain $DRAIN"
  "d|MQTT QoS1 4->1|mqtt --qos 1 --pubs 4 --size 64 --duration $D --drain $DRAIN"
  "e|MQTT QoS0 1->10 fan-out|mqtt --qos 0 --subs 10 --size 64 --duration $D --drain $DRAIN"
  "e1|MQTT QoS1 1->10 fan-out|mqtt --qos 1 --subs 10 --size 64 --duration $D --drain $DRAIN"
  "m5|MQTT 5 QoS1 1->1|mqtt --protocol 5 --qos 1 --size 64 --duration $D --drain $DRAIN"
  "r0|MQTT QoS0 at 10k msg/s|mqtt --qos 0 --rate 10000 --size 64 --duration $D --drain $DRAIN"
  "r1|MQTT QoS1 at 10k msg/s|mqtt --qos 1 --rate 10000 --size 64 --duration $D --drain $DRAIN"
)

{
  echo "date: $(date -Is)"
  echo "host: $(uname -srm)"
  echo "cpus: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "mem: $(free -m | awk '/Mem:/ {print $2 " MiB"}')"
  echo "ferrymq: $FQ ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null) $(git -C "$REPO" describe --always --dirty 2>/dev/null)), $("$FQ" --version 2>&1)"
  echo "mosquitto: $MOSQ, $("$MOSQ" -h 2>&1 | head -1)"
  echo "mqload: $M, $("$M" --version 2>&1)"
  echo "duration: $D s, drain $DRAIN s, timeout $T s per run"
  echo "open files limit: $(ulimit -n)"
} >"$OUT/env.txt"

start_ferrymq
start_mosquitto
sleep 2

i=0
for s in "${SCENARIOS[@]}"; do
  IFS='|' read -r id desc args <<<"$s"
  tmo=$T; [ "$id" = i ] && tmo=90
  # shellcheck disable=SC2086  # args are word-split on purpose
  if [ $((i % 2)) -eq 0 ]; then
    run "$id" ferrymq "$desc" "$tmo" $args; sleep 2
    run "$id" mosquitto "$desc" "$tmo" $args
  else
    run "$id" mosquitto "$desc" "$tmo" $args; sleep 2
    run "$id" ferrymq "$desc" "$tmo" $args
  fi
  sleep 2
  i=$((i + 1))
done

cleanup
grep -nE 'WARN|ERROR|panic' "$OUT/ferrymq.stderr.log" >"$OUT/ferrymq.warnings.txt"
echo "ferrymq WARN/ERROR/panic lines: $(wc -l <"$OUT/ferrymq.warnings.txt")" | tee -a "$OUT/events.log" >&2
log "results in $OUT; table: $HERE/table.py $OUT"
