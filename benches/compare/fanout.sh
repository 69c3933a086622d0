#!/usr/bin/env bash
# Wide fan-out to durable subscribers: one publisher, QoS 1, to 1, 100, 1,000 and 10,000
# persistent-session MQTT subscribers of one topic, FerryMQ vs Mosquitto; and AMQP: one
# publisher with confirms to a fanout exchange bound to 1,000 durable queues (one consumer
# each, manual acks), FerryMQ vs RabbitMQ. A fresh broker for every row.
#
# Usage: benches/compare/fanout.sh [OUTDIR]   (default benches/compare/raw/fanout-<date>-<time>, git-ignored)
#        benches/compare/fanout.sh --table OUTDIR   (the table of a finished run again, on stdout)
# Environment: FERRYMQ_BIN, MQLOAD, MOSQUITTO, RABBITMQ_SCRIPTS_DIR, QUIET_BUSY, QUIET_MAX as
# for compare.sh / compare_amqp.sh (see lib.sh), and
#   WIDTHS        MQTT subscriber counts, one row each (default "1 100 1000 10000")
#   DELIVERIES    deliveries per row: each row publishes DELIVERIES / width messages
#                 (default 500000; at least 20 messages)
#   AMQP_QUEUES   queues of the AMQP row (default 1000; 0 = no AMQP row)
#   RABBIT        1: RabbitMQ for the AMQP row (default 1 when rabbitmq-server is installed),
#                 0: FerryMQ alone
#   ROW_MAX       longest publishing window and longest drain per row, seconds (default 60)
#   FERRYMQ_EXTRA_ENV  FerryMQ settings added to every FerryMQ row (NAME=value ...)
#   WARMUP        messages published (and delivered everywhere) before each row's measured
#                 window, so that a broker's one-time costs of a queue's first message stay out
#                 of the figures; their time is the table's "warm-up" column (default 2, 0 = none)
#
# Subscribers are persistent sessions (MQTT 3.1.1 clean session 0; mqload --persistent-subs)
# subscribed at QoS 1 before the publisher starts; the publisher keeps 64 QoS 1 messages in
# flight and stops after its count (mqload --count). The figure that matters is
# delivered_overall_msgs_per_s: every delivery over the time from the first publish to the last
# delivery. FerryMQ runs its defaults (fsync "always"; retention's disk-use ratio off, see
# FQ_ENV below) and is sampled for the CPU of its journal
# writer thread (mqload --broker-thread ferrymq-journal: /proc/PID/task/*/stat of the thread of
# that name) over the publishing window and over the whole run; Mosquitto (persistence off,
# default limits: max_queued_messages 1000, max_inflight_messages 20) is one thread.
#
# Writes per row <row>_<broker>.json (mqload's JSON), .txt (its stderr summary, rc, the broker's
# disk writes), manifest.tsv (command lines), env.txt, events.log, and prints a table
# (also written to table.md). Bounded: every mqload run has --count, --duration, --drain and a
# `timeout`; brokers are stopped after each row and on exit.
set -u

table() { # OUTDIR: the run's environment and its table, in markdown
  echo '```'
  cat "$1/env.txt"
  echo '```'
  echo
  python3 - "$1" <<'PYEOF'

import csv, json, sys
out = sys.argv[1]
rows = [r for r in csv.DictReader(open(f"{out}/manifest.tsv"), delimiter="\t")]
def load(name):
    try:
        return json.loads(open(f"{out}/{name}.json").read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None
def fmt(x):
    return f"{x:,.0f}" if isinstance(x, (int, float)) else str(x)
print("| row | broker | subscribers / queues | messages | deliveries / expected | lost | deliveries/s (to the last delivery) | per subscriber /s | broker CPU µs per delivery | journal writer CPU s (window / run) | journal µs per delivery | client CPU % | warm-up s |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    v = load(f"{r['row']}_{r['broker']}")
    if v is None or "fatal" in v:
        print(f"| {r['row']} | {r['broker']} | | | failed: {v.get('fatal') if v else 'no output'} | | | | | | | | |")
        continue
    p = v["params"]
    width = p.get("subs") or p.get("queues")
    rate = v["delivered_overall_msgs_per_s"]
    b = (v["cpu_total_run"]["brokers"] or [{}])[0]
    bw = (v["cpu"]["brokers"] or [{}])[0]
    jt = b.get("threads", {}).get("ferrymq-journal", {})
    jw = bw.get("threads", {}).get("ferrymq-journal", {})
    j = f"{jw.get('cpu_s', 0):.2f} / {jt['cpu_s']:.2f}" if "cpu_s" in jt else "-"
    per = f"{jt['cpu_s'] * 1e6 / v['delivered']:.2f}" if "cpu_s" in jt and v["delivered"] else "-"
    bper = f"{b['cpu_s'] * 1e6 / v['delivered']:.2f}" if "cpu_s" in b and v["delivered"] else "-"
    warm = p.get("warmup_s")
    print(f"| {r['row']} | {r['broker']} | {fmt(width)} | {fmt(v['sent'])} | {fmt(v['delivered'])} / {fmt(v['expected_deliveries'])} | {fmt(v['lost'])} "
          f"| {fmt(rate)} | {rate / width:,.1f} | {bper} | {j} | {per} | {v['cpu_total_run']['client_cpu_pct_of_core']} | {f'{warm:.1f}' if warm else '-'} |")
PYEOF
}

if [ "${1:-}" = --table ]; then
  table "$2"
  exit 0
fi

KIND=amqp   # FerryMQ gets both listeners; rows pick the port they need
OTHER=mosquitto
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
bench_init "${1:-$(dirname "$0")/raw/fanout-$(date +%Y%m%d-%H%M%S)}" "$MOSQ"
WIDTHS=${WIDTHS:-1 100 1000 10000}
DELIVERIES=${DELIVERIES:-500000}
AMQP_QUEUES=${AMQP_QUEUES:-1000}
ROW_MAX=${ROW_MAX:-60}
WARMUP=${WARMUP:-2}
if [ -z "${RABBIT:-}" ]; then
  if [ -x "$RQ_DIR/rabbitmq-server" ] && [ -x "$RQ_DIR/rabbitmqctl" ]; then RABBIT=1; else RABBIT=0; fi
fi
ROW_TIMEOUT=$((2 * ROW_MAX + 120))   # window + drain + set-up of 10,000 sessions + slack
D=$ROW_MAX DRAIN=$ROW_MAX T=$ROW_TIMEOUT   # what env.txt reports
# Retention's disk-use ratio is about the machine's file system, not the broker's data: off, so
# that a shared, nearly full disk does not make the writer roll segments during a row.
# FERRYMQ_EXTRA_ENV adds settings (space-separated NAME=value), e.g.
# FERRYMQ_EXTRA_ENV=FERRYMQ_STORAGE__FSYNC=interval for the ceiling without an fsync per batch.
FQ_ENV=(FERRYMQ_STORAGE__RETENTION_MAX_DISK_USED_RATIO=0)
# shellcheck disable=SC2206 # split on spaces on purpose
[ -n "${FERRYMQ_EXTRA_ENV:-}" ] && FQ_ENV+=(${FERRYMQ_EXTRA_ENV})

# Every broker this script may have started is stopped on exit (lib.sh's trap calls this).
cleanup() {
  stop_ferrymq
  stop_mosquitto
  stop_rabbitmq
  teardown_rabbitmq
}

write_env "mosquitto: $MOSQ, $("$MOSQ" -h 2>&1 | head -1)" \
  "rabbitmq: $([ "$RABBIT" = 1 ] && dpkg-query -W -f '${Package} ${Version}' rabbitmq-server 2>/dev/null || echo '(not used)')" \
  "WIDTHS=$WIDTHS DELIVERIES=$DELIVERIES AMQP_QUEUES=$AMQP_QUEUES ROW_MAX=$ROW_MAX WARMUP=$WARMUP RABBIT=$RABBIT"
printf 'row\tbroker\tcommand\n' >"$OUT/manifest.tsv"

count_for() { # width -> messages to publish
  local n=$((DELIVERIES / $1))
  [ "$n" -lt 20 ] && n=20
  echo "$n"
}

# row ID BROKER PROTO(mqtt|amqp) mqload-subcommand-args...: a fresh broker, one mqload run, stop.
row() {
  local id=$1 b=$2 proto=$3; shift 3
  local port pid name="${id}_$b" rc wb0 wb1 threads=()
  "start_$b"
  pid=$("pid_$b")
  case "$b/$proto" in
    ferrymq/mqtt) port=$FQ_MQTT_PORT ;;
    ferrymq/amqp) port=$FQ_AMQP_PORT ;;
    *) port=$("port_$b") ;;
  esac
  [ "$b" = ferrymq ] && threads=(--broker-thread ferrymq-journal)
  local cmd=("$M" --quiet --broker-pid "$pid" "${threads[@]}" "$proto" --port "$port" "$@")
  wait_quiet "$OUT/$name.quiet"
  printf '%s\t%s\t%s\n' "$id" "$b" "${cmd[*]}" >>"$OUT/manifest.tsv"
  log "$name: ${cmd[*]}"
  wb0=$(write_bytes "$pid")
  timeout -k 5 "$ROW_TIMEOUT" "${cmd[@]}" >"$OUT/$name.json" 2>"$OUT/$name.txt"
  rc=$?
  wb1=$(write_bytes "$pid")
  { echo "rc=$rc"; echo "disk_write_bytes=$((wb1 - wb0))"; } >>"$OUT/$name.txt"
  kill -0 "$pid" 2>/dev/null || echo "BROKER PROCESS $pid GONE AFTER THIS RUN" >>"$OUT/$name.txt"
  tail -n 4 "$OUT/$name.txt" | sed 's/^/    /' >&2
  "stop_$b"
  sleep 2
}

i=0
for w in $WIDTHS; do
  n=$(count_for "$w")
  args=(--qos 1 --persistent-subs --subs "$w" --count "$n" --warmup "$WARMUP" --size 64 --duration "$ROW_MAX" --drain "$ROW_MAX")
  # The broker that goes first alternates from one row to the next.
  if [ $((i % 2)) -eq 0 ]; then row "w$w" ferrymq mqtt "${args[@]}"; row "w$w" mosquitto mqtt "${args[@]}"
  else row "w$w" mosquitto mqtt "${args[@]}"; row "w$w" ferrymq mqtt "${args[@]}"; fi
  i=$((i + 1))
done

if [ "$AMQP_QUEUES" -gt 0 ]; then
  n=$(count_for "$AMQP_QUEUES")
  args=(--exchange mqload-fanout --exchange-type fanout --queues "$AMQP_QUEUES" --persistent --confirm
    --confirm-window 256 --ack manual --prefetch 100 --count "$n" --warmup "$WARMUP" --size 64 --duration "$ROW_MAX" --drain "$ROW_MAX")
  row "x$AMQP_QUEUES" ferrymq amqp "${args[@]}"
  [ "$RABBIT" = 1 ] && row "x$AMQP_QUEUES" rabbitmq amqp "${args[@]}"
fi

cleanup
grep -nE 'WARN|ERROR|panic' "$OUT/ferrymq.stderr.log" >"$OUT/ferrymq.warnings.txt" 2>/dev/null
log "ferrymq WARN/ERROR/panic lines: $(wc -l <"$OUT/ferrymq.warnings.txt")"

table "$OUT" | tee "$OUT/table.md"
log "results in $OUT"
