# shellcheck shell=bash
# Shared by compare.sh (FerryMQ vs Mosquitto, MQTT) and compare_amqp.sh (FerryMQ vs RabbitMQ,
# AMQP 0-9-1). Sourced, not run. The caller sets KIND (mqtt|amqp) and OTHER (mosquitto|rabbitmq),
# sources this file, calls `bench_init "$@"`, sets SCENARIOS and calls `run_scenarios`.
#
# Environment (both scripts):
#   FERRYMQ_BIN   ferrymq binary (default: $CARGO_TARGET_DIR/release/ferrymq, else <repo>/target/release/ferrymq)
#   MQLOAD        mqload binary  (default target/mqload/release/mqload, built from benches/mqload when missing)
#   DURATION      publishing seconds per run (default 8)
#   QUIET_BUSY    machine-busy % (of all cores, 1 s sample) under which a run may start (default 15)
#   QUIET_MAX     longest wait for a quiet machine before each run, seconds (default 120; the run
#                 then starts anyway and the .quiet file says so)
#   ONLY          run only these scenario ids (space- or comma-separated; default: all), e.g. for
#                 a quick check of the scripts: ONLY=b DURATION=1 QUIET_MAX=0
#
# Brokers (each `start_<broker>` / `stop_<broker>`, `alive_<broker>`, and for run():
# `port_<broker>`, `pid_<broker>` (the process mqload samples), `log_<broker>` (its log file)
# and `filter_<broker>` (what of that log a run keeps)):
#   ferrymq    fresh data dir, built-in defaults plus FQ_ENV, its MQTT listener (and for KIND=amqp
#              its AMQP listener; none for KIND=mqtt) on free loopback ports, ready when its READY
#              line names them, `--log warn`; SIGTERM, SIGKILL after 15 s
#   mosquitto  generated mosquitto.conf (listener, anonymous, no persistence, plus MQ_EXTRA_CONF;
#              everything else default), ready when it listens; SIGTERM, SIGKILL after 15 s
#   rabbitmq   a node of our own (own node name, epmd on its own port, own distribution / CLI
#              ports, cookie, Mnesia and log dirs in a temp dir; no plugins), ready after
#              `rabbitmqctl await_startup` and listening; SIGTERM to the VM, then SIGKILL to what
#              is left of its own process group, then its epmd
# Ports are never the well-known broker / Erlang ones (1883, 8883, 5672, 5671, 15672, 25672,
# 4369, 35672-35682). Everything started is stopped on exit (trap), temp dirs are removed.

LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$LIB_DIR/../.." && pwd)
D=${DURATION:-8}
DRAIN=10
M=${MQLOAD:-$REPO/target/mqload/release/mqload}
FQ=${FERRYMQ_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/ferrymq}
QUIET_BUSY=${QUIET_BUSY:-15}
QUIET_MAX=${QUIET_MAX:-120}
ONLY=${ONLY:-}
T=$((D + DRAIN + 40))   # mqload timeout per run: window + drain + connect/ack wait + slack

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/events.log" >&2; }

# bench_init [OUTDIR] BINARY...: checks the binaries, makes OUT (default raw/KIND-<date>-<time>,
# git-ignored), refuses a directory that already holds results or that git would commit.
bench_init() {
  OUT=${1:-$LIB_DIR/raw/$KIND-$(date +%Y%m%d-%H%M%S)}
  shift
  local b
  if [ -z "${MQLOAD:-}" ] && [ ! -x "$M" ]; then
    echo "building mqload (benches/mqload) into $REPO/target/mqload" >&2
    cargo build --release --quiet --manifest-path "$REPO/benches/mqload/Cargo.toml" --target-dir "$REPO/target/mqload" || exit 2
  fi
  for b in "$M" "$FQ" "$@"; do
    [ -x "$b" ] || { echo "missing binary: $b" >&2; exit 2; }
  done
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  # Raw output is never committed: inside the repository only where git ignores it.
  case "$OUT/" in
    "$REPO"/*)
      if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1 && ! git -C "$REPO" check-ignore -q --no-index "$OUT/probe.json"; then
        echo "$OUT is in the repository but not git-ignored: use benches/compare/raw/ (the default) or a directory outside it" >&2
        exit 2
      fi ;;
  esac
  if ls "$OUT"/*.json >/dev/null 2>&1; then
    echo "$OUT already holds results; use an empty directory" >&2; exit 2
  fi
  ulimit -n "$(ulimit -Hn)" 2>/dev/null  # thousands of connections need the fds (brokers inherit this)
  read -r FQ_MQTT_PORT FQ_AMQP_PORT <<<"$(free_ports 2)"
  FQ_PID=""; FQ_DATA=""; FQ_ENV=()
  trap cleanup EXIT
  trap 'exit 130' INT TERM HUP
}

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

stop_pid() { # pid name
  local pid=$1 name=$2
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; log "$name ($pid) was already gone, exit status $?"; return 0; }
  kill -TERM "$pid"
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "$name ($pid) ignored SIGTERM for 15 s, SIGKILL"; kill -KILL "$pid"; fi
  wait "$pid" 2>/dev/null; log "$name ($pid) stopped, exit status $?"
}

# ----- FerryMQ ---------------------------------------------------------------------------------

start_ferrymq() {
  FQ_DATA=$(mktemp -d /tmp/ferrymq-bench-data.XXXXXX)
  : >"$OUT/ferrymq.stdout"
  # No FERRYMQ_* variable of the caller (FERRYMQ_BIN would be read as config key "bin"):
  # the broker sees its built-in defaults plus FQ_ENV only.
  local unset=() v amqp="" ready="FERRYMQ READY mqtt=127\.0\.0\.1:$FQ_MQTT_PORT( |$)"
  for v in $(compgen -e | grep '^FERRYMQ_'); do unset+=(-u "$v"); done
  if [ "$KIND" = amqp ]; then amqp=127.0.0.1:$FQ_AMQP_PORT; ready="$ready.*amqp=127\.0\.0\.1:$FQ_AMQP_PORT( |$)"; fi
  env "${unset[@]}" "${FQ_ENV[@]}" "$FQ" --data-dir "$FQ_DATA" --mqtt-listen "127.0.0.1:$FQ_MQTT_PORT" \
    --mqtt-ws-listen "" --amqp-listen "$amqp" --http-listen "${FQ_HTTP_LISTEN:-}" --log warn \
    >"$OUT/ferrymq.stdout" 2>>"$OUT/ferrymq.stderr.log" &
  FQ_PID=$!
  for _ in $(seq 1 300); do
    grep -qE "$ready" "$OUT/ferrymq.stdout" 2>/dev/null && break
    kill -0 "$FQ_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -qE "$ready" "$OUT/ferrymq.stdout" ||
    { log "ferrymq did not become ready"; cat "$OUT/ferrymq.stderr.log" >&2; exit 2; }
  log "ferrymq pid $FQ_PID mqtt port $FQ_MQTT_PORT amqp ${amqp:-(none)} data $FQ_DATA env: ${FQ_ENV[*]:-(none)}"
}

stop_ferrymq() {
  stop_pid "$FQ_PID" ferrymq; FQ_PID=""
  [ -n "$FQ_DATA" ] && rm -rf "$FQ_DATA"; FQ_DATA=""
}

alive_ferrymq() { [ -n "$FQ_PID" ] && kill -0 "$FQ_PID" 2>/dev/null; }
port_ferrymq() { if [ "$KIND" = amqp ]; then echo "$FQ_AMQP_PORT"; else echo "$FQ_MQTT_PORT"; fi; }
pid_ferrymq() { echo "$FQ_PID"; }
log_ferrymq() { echo "$OUT/ferrymq.stderr.log"; }
filter_ferrymq() { cat; }   # runs at --log warn: every line counts

# ----- Mosquitto -------------------------------------------------------------------------------

MQ_PID=""; MQ_PORT=""
MOSQ=${MOSQUITTO:-/usr/sbin/mosquitto}

start_mosquitto() {
  [ -n "$MQ_PORT" ] || MQ_PORT=$(free_ports 1)
  # Only what the comparison needs; everything else stays at Mosquitto's defaults
  # (max_inflight_messages 20, max_queued_messages 1000, Nagle on, logging to stdout).
  cat >"$OUT/mosquitto.conf" <<EOF
listener $MQ_PORT 127.0.0.1
allow_anonymous true
persistence false
${MQ_EXTRA_CONF:-}
EOF
  chmod 644 "$OUT/mosquitto.conf"
  "$MOSQ" -c "$OUT/mosquitto.conf" >>"$OUT/mosquitto.log" 2>&1 &
  MQ_PID=$!
  for _ in $(seq 1 100); do listening "$MQ_PORT" && break; sleep 0.1; done
  listening "$MQ_PORT" || { log "mosquitto did not start"; cat "$OUT/mosquitto.log" >&2; exit 2; }
  log "mosquitto pid $MQ_PID port $MQ_PORT"
}

stop_mosquitto() { stop_pid "$MQ_PID" mosquitto; MQ_PID=""; }
alive_mosquitto() { [ -n "$MQ_PID" ] && kill -0 "$MQ_PID" 2>/dev/null; }
port_mosquitto() { echo "$MQ_PORT"; }
pid_mosquitto() { echo "$MQ_PID"; }
log_mosquitto() { echo "$OUT/mosquitto.log"; }
# Mosquitto logs every connect and disconnect: count those, keep the rest.
filter_mosquitto() {
  awk '/New connection from|New client connected from|Client mqload-[^ ]* disconnected\.$/ {n++; next} {print}
       END {print "(" n+0 " routine connect/disconnect lines not kept)"}'
}

# ----- RabbitMQ --------------------------------------------------------------------------------

RQ_DIR=${RABBITMQ_SCRIPTS_DIR:-/usr/lib/rabbitmq/bin}
EPMD=$(command -v epmd || echo /usr/bin/epmd)
RQ_PID=""; RQ_BEAM=""; RQ_EPMD_PID=""; RQ_WORK=""; RQ_PORT=""
RQ_NODE="ferrymq-amqpbench-$$-$RANDOM@localhost"

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
  # Fresh ports at every start (a restart after a crash must not race the old node's sockets).
  read -r RQ_PORT RQ_DIST RQ_EPMD RQ_CTL <<<"$(free_ports 4)"
  [ -n "$RQ_WORK" ] || RQ_WORK=$(mktemp -d /tmp/ferrymq-amqpbench-rabbit.XXXXXX)
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
  # $! is the session leader, and stop_rabbitmq can SIGKILL by process group whatever the node
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

# At the end: keep the node's log, remove its temp dir.
teardown_rabbitmq() {
  if [ -n "$RQ_WORK" ] && [ -d "$RQ_WORK" ]; then
    [ -f "$RQ_WORK/log/rabbit.log" ] && cp "$RQ_WORK/log/rabbit.log" "$OUT/rabbit.log"
    rm -rf "$RQ_WORK"
  fi
  RQ_WORK=""
}

alive_rabbitmq() { [ -n "$RQ_BEAM" ] && kill -0 "$RQ_BEAM" 2>/dev/null; }
port_rabbitmq() { echo "$RQ_PORT"; }
pid_rabbitmq() { echo "$RQ_BEAM"; }
log_rabbitmq() { echo "$RQ_WORK/log/rabbit.log"; }
# RabbitMQ logs three info lines per connection: count those, keep everything else.
filter_rabbitmq() {
  awk '/accepting AMQP connection|user .* authenticated and granted access|closing AMQP connection|connection_closed_abruptly/ {n++; next}
       {print} END {print "(" n+0 " routine connection open/auth/close lines not kept)"}'
}

# ----- runs ------------------------------------------------------------------------------------

cleanup() {
  stop_ferrymq
  [ -n "${OTHER:-}" ] && "stop_$OTHER"
  if [ -n "${OTHER:-}" ] && [ "$(type -t "teardown_$OTHER")" = function ]; then "teardown_$OTHER"; fi
}

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
  local b
  for b in ferrymq "$OTHER"; do
    "alive_$b" && continue
    log "$b is gone, restarting"
    "stop_$b"
    "start_$b"
  done
}

# env.txt: the machine, the binaries and the run's parameters; then one line per argument.
write_env() {
  {
    echo "date: $(date -Is)"
    echo "host: $(uname -srm)"
    echo "cpus: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "mem: $(free -m | awk '/Mem:/ {print $2 " MiB"}')"
    echo "disk for broker data: $(df -T /tmp | awk 'NR==2 {print $1, $2}')"
    echo "ferrymq: $FQ ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null) $(git -C "$REPO" describe --always --dirty 2>/dev/null)), $("$FQ" --version 2>&1), sha256 $(sha256sum "$FQ" | cut -c1-16)"
    echo "ferrymq storage defaults: $(sed -n '/^\[storage\]/,/^\[/p' "$REPO/conf/ferrymq.toml" | grep -E '^(fsync|interval_ms) *=' | tr '\n' ' ')"
    echo "mqload: $M, $("$M" --version 2>&1)"
    echo "duration: $D s, drain $DRAIN s, timeout $T s per run"
    echo "open files limit: $(ulimit -n)"
    if [ -n "$ONLY" ]; then echo "only scenarios: $ONLY"; fi
    printf '%s\n' "$@"
  } >"$OUT/env.txt"
}

# run ID BROKER DESCRIPTION TIMEOUT_S mqload-subcommand-args...   (port and --broker-pid added here)
# Writes <id>_<broker>.json (mqload's JSON, its last stdout line), .txt (its stderr summary +
# "rc=N"), .broker.log (what the broker logged during the run, filtered), .quiet (machine-busy
# samples before the run and a top snapshot), and a line of manifest.tsv.
run() {
  local id=$1 broker=$2 desc=$3 tmo=$4; shift 4
  local name="${id}_${broker}" port pid logf off rc
  ensure_brokers
  port=$("port_$broker"); pid=$("pid_$broker"); logf=$("log_$broker")
  local sub=$1; shift
  local cmd=("$M" --quiet --broker-pid "$pid" "$sub" --port "$port" "$@")
  wait_quiet "$OUT/$name.quiet"
  touch "$logf"; off=$(stat -c %s "$logf")
  log "$name: ${cmd[*]}"
  local wb0 wb1; wb0=$(write_bytes "$pid")
  timeout -k 5 "$tmo" "${cmd[@]}" >"$OUT/$name.json" 2>"$OUT/$name.txt"
  rc=$?
  wb1=$(write_bytes "$pid")
  echo "rc=$rc" >>"$OUT/$name.txt"
  # What the broker process made the kernel write to storage during the run (all threads).
  echo "disk_write_bytes=$((wb1 - wb0))" >>"$OUT/$name.txt"
  sleep 0.5
  tail -c +$((off + 1)) "$logf" | "filter_$broker" >"$OUT/$name.broker.log"
  kill -0 "$pid" 2>/dev/null || echo "BROKER PROCESS $pid GONE AFTER THIS RUN" >>"$OUT/$name.txt"
  [ "$broker" = ferrymq ] && echo "ferrymq data dir after the run: $(du -sm "$FQ_DATA" | cut -f1) MB" >>"$OUT/$name.txt"
  local envp=""; [ "$broker" = ferrymq ] && [ ${#FQ_ENV[@]} -gt 0 ] && envp="${FQ_ENV[*]} "
  printf '%s\t%s\t%s\t%s\t%s\n' "$id" "$broker" "$desc" "$name" "$envp${cmd[*]}" >>"$OUT/manifest.tsv"
  tail -n 10 "$OUT/$name.txt" | sed 's/^/    /' >&2
}

# Bytes the process PID caused to be written to storage so far (/proc/PID/io write_bytes).
write_bytes() { awk '/^write_bytes:/ { print $2 }' "/proc/$1/io" 2>/dev/null || echo 0; }

# True when scenario ID is to run (ONLY unset, or ID listed in it).
selected() { [ -z "$ONLY" ] || [[ " ${ONLY//,/ } " == *" $1 "* ]]; }

# Runs every selected entry of SCENARIOS ("id|description|mqload args") against FerryMQ and
# OTHER, the one that goes first alternating from one scenario to the next. The idle-connection
# scenario (id i) gets CONNS_TIMEOUT seconds instead of T.
run_scenarios() {
  local i=0 s id desc args tmo
  for s in "${SCENARIOS[@]}"; do
    IFS='|' read -r id desc args <<<"$s"
    selected "$id" || continue
    tmo=$T; [ "$id" = i ] && tmo=$CONNS_TIMEOUT
    # shellcheck disable=SC2086  # args are word-split on purpose
    if [ $((i % 2)) -eq 0 ]; then
      run "$id" ferrymq "$desc" "$tmo" $args; sleep 2
      run "$id" "$OTHER" "$desc" "$tmo" $args
    else
      run "$id" "$OTHER" "$desc" "$tmo" $args; sleep 2
      run "$id" ferrymq "$desc" "$tmo" $args
    fi
    sleep 2
    i=$((i + 1))
  done
}

# Stops everything, then lists FerryMQ's WARN/ERROR/panic lines (and the other broker's).
finish() {
  cleanup
  grep -nE 'WARN|ERROR|panic' "$OUT/ferrymq.stderr.log" >"$OUT/ferrymq.warnings.txt"
  echo "ferrymq WARN/ERROR/panic lines: $(wc -l <"$OUT/ferrymq.warnings.txt")" | tee -a "$OUT/events.log" >&2
  [ -f "$OUT/rabbit.log" ] && grep -E '\[(warning|error|critical)\]' "$OUT/rabbit.log" >"$OUT/rabbit.warnings.txt"
  log "results in $OUT; tables: $LIB_DIR/table.py $OUT"
}
