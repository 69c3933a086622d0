#!/usr/bin/env bash
# FerryMQ vs RabbitMQ over AMQP 0-9-1, side by side, with mqload.
#
# Usage: interop/bench/compare_amqp.sh [OUTDIR]        (default interop/bench/raw/amqp-<date>-<time>, git-ignored)
# Environment:
#   FERRYMQ_BIN    ferrymq binary (default: $CARGO_TARGET_DIR/release/ferrymq, else <repo>/target/release/ferrymq)
#   MQLOAD         mqload binary  (default /tmp/mqload-target/release/mqload)
#   RABBITMQ_SCRIPTS_DIR  where rabbitmq-server / rabbitmqctl live (default /usr/lib/rabbitmq/bin)
#   DURATION       publishing seconds per run (default 8)
#   SIZE           message body bytes (default 256)
#   QUIET_BUSY     machine-busy % (of all cores, 1 s sample) under which a run may start (default 15)
#   QUIET_MAX      longest wait for a quiet machine before each run, seconds (default 120; the run
#                  then starts anyway and the .quiet file says so)
#   EXTRA_FSYNC    after the main pass, restart FerryMQ with FERRYMQ_STORAGE__FSYNC=<this> and run
#                  the persistent scenarios again on FerryMQ only (ids p1@<policy>, p4@<policy>);
#                  default "never", "" to skip
#
# Starts FerryMQ (its default configuration: conf/ferrymq.toml, fsync "always") and a RabbitMQ
# node of our own (own node name, epmd on its own port, own distribution / CLI ports, cookie,
# Mnesia and log dirs in a temp dir; no plugins) on free loopback ports (never 5672, 5671,
# 1883, 8883, 15672, 25672, 4369, 35672-35682). Runs every scenario against both (the broker that
# goes first alternates from one scenario to the next) and writes per run
#   <id>_<broker>.json        mqload's JSON (last stdout line)
#   <id>_<broker>.txt         mqload's stderr summary + "rc=N"
#   <id>_<broker>.broker.log  what the broker logged during the run (RabbitMQ: routine
#                             connection open/auth/close lines dropped, their count kept)
#   <id>_<broker>.quiet       machine-busy samples before the run, and a top snapshot
# plus manifest.tsv (one line per run), env.txt, events.log, ferrymq.warnings.txt and the
# brokers' own logs (ferrymq.stderr.log, rabbit.log: the caller decides what to keep).
# Both brokers are stopped at the end and on any exit (trap): FerryMQ with SIGTERM (SIGKILL
# after 15 s); RabbitMQ with SIGTERM to its rabbitmq-server process (which stops the Erlang VM
# gracefully), then SIGKILL to whatever is left of its own process group, then its epmd.
# Temp dirs are removed. Every mqload run has --duration/--drain and a `timeout`, the broker
# starts have deadlines, so the whole script is bounded (about 9-11 minutes when quiet).
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$HERE/raw/amqp-$(date +%Y%m%d-%H%M%S)}
D=${DURATION:-8}
SIZE=${SIZE:-256}
DRAIN=10
M=${MQLOAD:-/tmp/mqload-target/release/mqload}
FQ=${FERRYMQ_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/ferrymq}
RQ_DIR=${RABBITMQ_SCRIPTS_DIR:-/usr/lib/rabbitmq/bin}
EPMD=$(command -v epmd || echo /usr/bin/epmd)
QUIET_BUSY=${QUIET_BUSY:-15}
QUIET_MAX=${QUIET_MAX:-120}
EXTRA_FSYNC=${EXTRA_FSYNC-never}

for b in "$M" "$FQ" "$RQ_DIR/rabbitmq-server" "$RQ_DIR/rabbitmqctl" "$EPMD"; do
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
OUT=$(cd "$OUT" && pwd)
ulimit -n "$(ulimit -Hn)" 2>/dev/null  # 1,000 connections need the fds (brokers inherit this)

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/events.log" >&2; }

# N distinct loopback ports that were free a moment ago (all bound at once, then released),
# none of the well-known broker / Erlang ports.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
avoid = {1883, 8883, 5672, 5671, 15672, 25672, 4369} | set(range(35672, 35683))
socks, ports = [], []
while len(ports) < int(sys.argv[1]):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
    p = s.getsockname()[1]
    if p not in avoid:
        ports.append(p)
print(" ".join(map(str, ports)))
for s in socks:
    s.close()
EOF
}

listening() { ss -ltnH "sport = :$1" 2>/dev/null | grep -q .; }

read -r FQ_PORT FQ_MQTT_PORT RQ_PORT RQ_DIST RQ_EPMD RQ_CTL <<<"$(free_ports 6)"
FQ_PID=""; FQ_DATA=""; FQ_ENV=()
RQ_PID=""; RQ_BEAM=""; RQ_EPMD_PID=""; RQ_NODE="ferrymq-amqpbench-$$-$RANDOM@localhost"
RQ_WORK=$(mktemp -d /tmp/ferrymq-amqpbench-rabbit.XXXXXX)

start_ferrymq() {
  FQ_DATA=$(mktemp -d /tmp/ferrymq-amqpbench-data.XXXXXX)
  : >"$OUT/ferrymq.stdout"
  # No FERRYMQ_* variable of the caller (FERRYMQ_BIN would be read as config key "bin"):
  # the broker sees its built-in defaults plus FQ_ENV only.
  local unset=() v
  for v in $(compgen -e | grep '^FERRYMQ_'); do unset+=(-u "$v"); done
  env "${unset[@]}" "${FQ_ENV[@]}" "$FQ" --data-dir "$FQ_DATA" --mqtt-listen "127.0.0.1:$FQ_MQTT_PORT" \
    --amqp-listen "127.0.0.1:$FQ_PORT" --log warn \
    >"$OUT/ferrymq.stdout" 2>>"$OUT/ferrymq.stderr.log" &
  FQ_PID=$!
  for _ in $(seq 1 300); do
    grep -q "FERRYMQ READY .*amqp=127.0.0.1:$FQ_PORT" "$OUT/ferrymq.stdout" 2>/dev/null && break
    kill -0 "$FQ_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "FERRYMQ READY .*amqp=127.0.0.1:$FQ_PORT" "$OUT/ferrymq.stdout" ||
    { log "ferrymq did not become ready"; cat "$OUT/ferrymq.stderr.log" >&2; exit 2; }
  log "ferrymq pid $FQ_PID amqp port $FQ_PORT (mqtt $FQ_MQTT_PORT) data $FQ_DATA env: ${FQ_ENV[*]:-(none)}"
}

# The environment of our node (and of rabbitmqctl aimed at it): nothing inherited but PATH.
rq_envv() {
  RQ_ENVV=(PATH="$PATH" HOME="$RQ_WORK/home" LC_ALL=C.UTF-8 LANG=C.UTF-8
    ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT="$RQ_EPMD"
    RABBITMQ_NODENAME="$RQ_NODE" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$RQ_PORT"
    RABBITMQ_DIST_PORT="$RQ_DIST" RABBITMQ_CTL_DIST_PORT_MIN="$RQ_CTL" RABBITMQ_CTL_DIST_PORT_MAX="$RQ_CTL"
    RABBITMQ_MNESIA_BASE="$RQ_WORK/mnesia" RABBITMQ_LOG_BASE="$RQ_WORK/log"
    RABBITMQ_CONFIG_FILE="$RQ_WORK/rabbitmq.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$RQ_WORK/advanced.config"
    RABBITMQ_ENABLED_PLUGINS_FILE="$RQ_WORK/enabled_plugins" RABBITMQ_CONF_ENV_FILE="$RQ_WORK/rabbitmq-env.conf"
    RABBITMQ_PID_FILE="$RQ_WORK/rabbitmq.pid"
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")
}
rqctl() { rq_envv; env -i "${RQ_ENVV[@]}" timeout -k 5 "${RQCTL_TIMEOUT:-60}" "$RQ_DIR/rabbitmqctl" -q -n "$RQ_NODE" "$@"; }

start_rabbitmq() {
  mkdir -p "$RQ_WORK/home" "$RQ_WORK/mnesia" "$RQ_WORK/log"
  # Defaults everywhere except: listener on our loopback port, file log, no disk alarm on a
  # nearly full tmp dir. Classic queues (3.10's default), no plugins.
  cat >"$RQ_WORK/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$RQ_PORT
log.file = $RQ_WORK/log/rabbit.log
log.file.level = info
log.console = false
disk_free_limit.absolute = 1MB
EOF
  echo "[]." >"$RQ_WORK/enabled_plugins"
  echo "# empty: ignore /etc/rabbitmq/rabbitmq-env.conf" >"$RQ_WORK/rabbitmq-env.conf"
  cp "$RQ_WORK/rabbitmq.conf" "$OUT/rabbitmq.conf"
  # Our own epmd (own port, loopback only): nothing of any other Erlang node is involved.
  # (Simple commands in the background, no shell function: $! is then the process itself.)
  rq_envv
  env -i "${RQ_ENVV[@]}" "$EPMD" -port "$RQ_EPMD" -address 127.0.0.1 >>"$OUT/rabbitmq.console.log" 2>&1 &
  RQ_EPMD_PID=$!
  # Own session: setsid does not fork here (our background child is not a group leader), so
  # $! is the session leader, and cleanup can SIGKILL by process group whatever the node
  # leaves behind, and nothing else.
  env -i "${RQ_ENVV[@]}" setsid "$RQ_DIR/rabbitmq-server" </dev/null >>"$OUT/rabbitmq.console.log" 2>&1 &
  RQ_PID=$!
  local deadline=$((SECONDS + 120)) r
  while :; do
    kill -0 "$RQ_PID" 2>/dev/null || { log "rabbitmq-server exited during start"; tail -30 "$OUT/rabbitmq.console.log" >&2; exit 2; }
    r=$(RQCTL_TIMEOUT=$((deadline - SECONDS + 10)) rqctl await_startup --timeout $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)) 2>&1) && break
    [ $SECONDS -ge $deadline ] && { log "rabbitmq did not start in 120 s: $r"; exit 2; }
    sleep 0.5
  done
  for _ in $(seq 1 100); do listening "$RQ_PORT" && break; sleep 0.1; done
  listening "$RQ_PORT" || { log "rabbitmq does not listen on $RQ_PORT"; exit 2; }
  RQ_BEAM=$(cat "$RQ_WORK/rabbitmq.pid" 2>/dev/null)
  if [ -z "$RQ_BEAM" ] || [ "$(cat /proc/"$RQ_BEAM"/comm 2>/dev/null)" != beam.smp ]; then
    RQ_BEAM=$(ps -o pid=,comm= --ppid "$RQ_PID" | awk '$2 == "beam.smp" {print $1; exit}')
  fi
  [ -n "$RQ_BEAM" ] || { log "cannot find the beam.smp of our node"; exit 2; }
  log "rabbitmq processes (pid ppid pgid sid comm): $(ps -o pid=,ppid=,pgid=,sid=,comm= -s "$RQ_PID" | tr -s ' ' | tr '\n' ';')"
  log "rabbitmq node $RQ_NODE: rabbitmq-server pid $RQ_PID, beam.smp pid $RQ_BEAM, amqp port $RQ_PORT," \
      "dist $RQ_DIST, epmd $RQ_EPMD (pid $RQ_EPMD_PID), cli dist $RQ_CTL, open files $(awk '/Max open files/ {print $4}' /proc/"$RQ_BEAM"/limits)"
}

stop_pid() { # pid name
  local pid=$1 name=$2
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; log "$name ($pid) was already gone, exit status $?"; return 0; }
  kill -TERM "$pid"
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "$name ($pid) ignored SIGTERM for 15 s, SIGKILL"; kill -KILL "$pid"; fi
  wait "$pid" 2>/dev/null; log "$name ($pid) stopped, exit status $?"
}

stop_ferrymq() {
  stop_pid "$FQ_PID" ferrymq; FQ_PID=""
  [ -n "$FQ_DATA" ] && rm -rf "$FQ_DATA"; FQ_DATA=""
}

stop_rabbitmq() {
  # SIGTERM to the Erlang VM: RabbitMQ's own signal handler stops the node gracefully.
  if [ -n "$RQ_BEAM" ] && kill -0 "$RQ_BEAM" 2>/dev/null; then
    kill -TERM "$RQ_BEAM"
    for _ in $(seq 1 300); do kill -0 "$RQ_BEAM" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$RQ_BEAM" 2>/dev/null; then log "beam.smp $RQ_BEAM ignored SIGTERM for 30 s, SIGKILL"; kill -KILL "$RQ_BEAM"
    else log "beam.smp $RQ_BEAM stopped"; fi
  fi
  RQ_BEAM=""
  if [ -n "$RQ_PID" ]; then
    stop_pid "$RQ_PID" rabbitmq-server
    # anything left in the node's own process group (erl_child_setup, inet_gethost)
    if pgrep -s "$RQ_PID" >/dev/null 2>&1; then
      log "leftovers in process group $RQ_PID: $(ps -o pid=,comm= -s "$RQ_PID" | tr '\n' ' '), SIGKILL"
      kill -KILL -- "-$RQ_PID" 2>/dev/null
    fi
    RQ_PID=""
  fi
  stop_pid "$RQ_EPMD_PID" epmd; RQ_EPMD_PID=""
}

cleanup() {
  stop_ferrymq
  stop_rabbitmq
  if [ -n "$RQ_WORK" ] && [ -d "$RQ_WORK" ]; then
    [ -f "$RQ_WORK/log/rabbit.log" ] && cp "$RQ_WORK/log/rabbit.log" "$OUT/rabbit.log"
    rm -rf "$RQ_WORK"
  fi
  RQ_WORK=""
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

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
  if ! kill -0 "$RQ_BEAM" 2>/dev/null; then
    log "rabbitmq (beam.smp $RQ_BEAM) is gone, restarting"; stop_rabbitmq
    read -r RQ_PORT RQ_DIST RQ_EPMD RQ_CTL <<<"$(free_ports 4)"; start_rabbitmq
  fi
}

# RabbitMQ logs three info lines per connection; keep everything else.
filter_rabbit() {
  awk '/accepting AMQP connection|user .* authenticated and granted access|closing AMQP connection|connection_closed_abruptly/ {n++; next}
       {print} END {print "(" n+0 " routine connection open/auth/close lines not kept)"}'
}

# run ID BROKER DESCRIPTION TIMEOUT_S mqload-subcommand-args...   (port and --broker-pid added here)
run() {
  local id=$1 broker=$2 desc=$3 tmo=$4; shift 4
  local name="${id}_${broker}" port pid logf off rc
  ensure_brokers
  if [ "$broker" = ferrymq ]; then port=$FQ_PORT; pid=$FQ_PID; logf=$OUT/ferrymq.stderr.log
  else port=$RQ_PORT; pid=$RQ_BEAM; logf=$RQ_WORK/log/rabbit.log; fi
  local sub=$1; shift
  local cmd=("$M" --quiet --broker-pid "$pid" "$sub" --port "$port" "$@")
  wait_quiet "$OUT/$name.quiet"
  touch "$logf"; off=$(stat -c %s "$logf")
  log "$name: ${cmd[*]}"
  timeout -k 5 "$tmo" "${cmd[@]}" >"$OUT/$name.json" 2>"$OUT/$name.txt"
  rc=$?
  echo "rc=$rc" >>"$OUT/$name.txt"
  sleep 0.5
  if [ "$broker" = ferrymq ]; then
    tail -c +$((off + 1)) "$logf" >"$OUT/$name.broker.log"
  else
    tail -c +$((off + 1)) "$logf" | filter_rabbit >"$OUT/$name.broker.log"
  fi
  kill -0 "$pid" 2>/dev/null || echo "BROKER PROCESS $pid GONE AFTER THIS RUN" >>"$OUT/$name.txt"
  [ "$broker" = ferrymq ] && echo "ferrymq data dir after the run: $(du -sm "$FQ_DATA" | cut -f1) MB" >>"$OUT/$name.txt"
  local envp=""; [ "$broker" = ferrymq ] && [ ${#FQ_ENV[@]} -gt 0 ] && envp="${FQ_ENV[*]} "
  printf '%s\t%s\t%s\t%s\t%s\n' "$id" "$broker" "$desc" "$name" "$envp${cmd[*]}" >>"$OUT/manifest.tsv"
  tail -n 10 "$OUT/$name.txt" | sed 's/^/    /' >&2
}

T=$((D + DRAIN + 40))   # mqload timeout per run: window + drain + connect/ack wait + slack
A="--size $SIZE --duration $D --drain $DRAIN"
CM="--confirm --confirm-window 256 --ack manual --prefetch 100"

# id | description | mqload args (without --port/--broker-pid)
SCENARIOS=(
  "i|1,000 idle AMQP connections + channel, hold 10 s (fresh brokers)|conns --proto amqp --count 1000 --open-channel --hold 10"
  "t1|transient, confirms + manual ack, 1->1|amqp $CM $A"
  "p1|persistent, confirms + manual ack, 1->1|amqp --persistent $CM $A"
  "t4|transient, confirms + manual ack, 4->4|amqp --pubs 4 --consumers 4 $CM $A"
  "p4|persistent, confirms + manual ack, 4->4|amqp --persistent --pubs 4 --consumers 4 $CM $A"
  "fx|fanout exchange -> 1 queue, confirms + manual ack, 1->1|amqp --exchange mqload-fanout --exchange-type fanout $CM $A"
  "lat|transient, confirms + manual ack, 1->1 at 5k msg/s|amqp --rate 5000 $CM $A"
  # raw leaves FerryMQ slower for the confirm scenarios that follow (t1 -25..-35% on the same
  # process): it runs after them, and t1 is repeated after it (t1r) to show the effect.
  "raw|transient, no confirms, auto-ack, 1->1|amqp --ack auto $A"
  "t1r|t1 again, after raw|amqp $CM $A"
)

{
  echo "date: $(date -Is)"
  echo "host: $(uname -srm)"
  echo "cpus: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "mem: $(free -m | awk '/Mem:/ {print $2 " MiB"}')"
  echo "disk for broker data: $(df -T /tmp | awk 'NR==2 {print $1, $2}')"
  echo "ferrymq: $FQ ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null) $(git -C "$REPO" describe --always --dirty 2>/dev/null)), $("$FQ" --version 2>&1), sha256 $(sha256sum "$FQ" | cut -c1-16)"
  echo "ferrymq storage defaults: $(sed -n '/^\[storage\]/,/^\[/p' "$REPO/conf/ferrymq.toml" | grep -E '^(fsync|interval_ms) *=' | tr '\n' ' ')"
  echo "rabbitmq: $(dpkg-query -W -f '${Package} ${Version}' rabbitmq-server 2>/dev/null), erlang $(dpkg-query -W -f '${Version}' erlang-base 2>/dev/null)"
  echo "mqload: $M, $("$M" --version 2>&1)"
  echo "duration: $D s, drain $DRAIN s, body $SIZE bytes, timeout $T s per run"
  echo "open files limit: $(ulimit -n)"
  echo "extra fsync pass: ${EXTRA_FSYNC:-(none)}"
} >"$OUT/env.txt"

start_ferrymq
start_rabbitmq
sleep 5   # let the freshly booted node settle (it is busy for a moment after await_startup)

i=0
for s in "${SCENARIOS[@]}"; do
  IFS='|' read -r id desc args <<<"$s"
  tmo=$T; [ "$id" = i ] && tmo=120
  # shellcheck disable=SC2086  # args are word-split on purpose
  if [ $((i % 2)) -eq 0 ]; then
    run "$id" ferrymq "$desc" "$tmo" $args; sleep 2
    run "$id" rabbitmq "$desc" "$tmo" $args
  else
    run "$id" rabbitmq "$desc" "$tmo" $args; sleep 2
    run "$id" ferrymq "$desc" "$tmo" $args
  fi
  sleep 2
  i=$((i + 1))
done

if [ -n "$EXTRA_FSYNC" ]; then
  stop_ferrymq
  FQ_ENV=("FERRYMQ_STORAGE__FSYNC=$EXTRA_FSYNC")
  start_ferrymq
  sleep 2
  for s in "${SCENARIOS[@]}"; do
    IFS='|' read -r id desc args <<<"$s"
    case $id in p1|p4) ;; *) continue ;; esac
    # shellcheck disable=SC2086
    run "$id@$EXTRA_FSYNC" ferrymq "$desc, FerryMQ fsync $EXTRA_FSYNC" "$T" $args
    sleep 2
  done
fi

rq_log="$RQ_WORK/log/rabbit.log"
cleanup
grep -nE 'WARN|ERROR|panic' "$OUT/ferrymq.stderr.log" >"$OUT/ferrymq.warnings.txt"
echo "ferrymq WARN/ERROR/panic lines: $(wc -l <"$OUT/ferrymq.warnings.txt")" | tee -a "$OUT/events.log" >&2
[ -f "$OUT/rabbit.log" ] && grep -E '\[(warning|error|critical)\]' "$OUT/rabbit.log" >"$OUT/rabbit.warnings.txt"
log "results in $OUT (rabbit log was $rq_log); table: $HERE/table_amqp.py $OUT"
