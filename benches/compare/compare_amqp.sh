#!/usr/bin/env bash
# FerryMQ vs RabbitMQ over AMQP 0-9-1, side by side, with mqload.
#
# Usage: benches/compare/compare_amqp.sh [OUTDIR]   (default benches/compare/raw/amqp-<date>-<time>, git-ignored)
# Environment: see lib.sh (FERRYMQ_BIN, MQLOAD, DURATION, QUIET_BUSY, QUIET_MAX, ONLY), and
#   RABBITMQ_SCRIPTS_DIR  where rabbitmq-server / rabbitmqctl live (default /usr/lib/rabbitmq/bin)
#   SIZE           message body bytes (default 256)
#   EXTRA_FSYNC    after the main pass, restart FerryMQ with FERRYMQ_STORAGE__FSYNC=<this> and run
#                  the persistent scenarios again on FerryMQ only (ids p1@<policy>, p4@<policy>);
#                  default "never", "" to skip
#
# Starts FerryMQ (its default configuration: conf/ferrymq.toml, fsync "always") and a RabbitMQ
# node of our own (see lib.sh) on free loopback ports. Runs every scenario against both (the
# broker that goes first alternates from one scenario to the next) and writes per run, into
# OUTDIR,
#   <id>_<broker>.json        mqload's JSON (last stdout line)
#   <id>_<broker>.txt         mqload's stderr summary, "rc=N" and disk_write_bytes (the broker
#                             process's /proc/PID/io write_bytes over the run)
#   <id>_<broker>.broker.log  what the broker logged during the run (RabbitMQ: routine
#                             connection open/auth/close lines dropped, their count kept)
#   <id>_<broker>.quiet       machine-busy samples before the run, and a top snapshot
# plus manifest.tsv (one line per run, with the mqload command line), env.txt, events.log,
# rabbitmq.conf, ferrymq.warnings.txt, rabbit.warnings.txt and the brokers' own logs
# (ferrymq.stderr.log, rabbit.log). Both brokers are stopped at the end and on any exit. Every
# mqload run has --duration/--drain and a `timeout`, the broker starts have deadlines, so the
# whole script is bounded (about 9-11 minutes when quiet).
set -u

KIND=amqp
OTHER=rabbitmq
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
bench_init "${1:-}" "$RQ_DIR/rabbitmq-server" "$RQ_DIR/rabbitmqctl" "$EPMD"
CONNS_TIMEOUT=120
SIZE=${SIZE:-256}
EXTRA_FSYNC=${EXTRA_FSYNC-never}

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

write_env "rabbitmq: $(dpkg-query -W -f '${Package} ${Version}' rabbitmq-server 2>/dev/null), erlang $(dpkg-query -W -f '${Version}' erlang-base 2>/dev/null)" \
  "body: $SIZE bytes" \
  "extra fsync pass: ${EXTRA_FSYNC:-(none)}"

start_ferrymq
start_rabbitmq
sleep 5   # let the freshly booted node settle (it is busy for a moment after await_startup)

run_scenarios

if [ -n "$EXTRA_FSYNC" ]; then
  stop_ferrymq
  FQ_ENV=("FERRYMQ_STORAGE__FSYNC=$EXTRA_FSYNC")
  start_ferrymq
  sleep 2
  for s in "${SCENARIOS[@]}"; do
    IFS='|' read -r id desc args <<<"$s"
    case $id in p1|p4) ;; *) continue ;; esac
    selected "$id" || continue
    # shellcheck disable=SC2086  # args are word-split on purpose
    run "$id@$EXTRA_FSYNC" ferrymq "$desc, FerryMQ fsync $EXTRA_FSYNC" "$T" $args
    sleep 2
  done
fi

finish
