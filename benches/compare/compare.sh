#!/usr/bin/env bash
# FerryMQ vs Mosquitto over MQTT, side by side, with mqload.
#
# Usage: benches/compare/compare.sh [OUTDIR]   (default benches/compare/raw/mqtt-<date>-<time>, git-ignored)
# Environment: see lib.sh (FERRYMQ_BIN, MQLOAD, DURATION, QUIET_BUSY, QUIET_MAX, ONLY), and
#   MOSQUITTO     mosquitto binary (default /usr/sbin/mosquitto)
#
# Starts FerryMQ (MQTT listener only) and Mosquitto (default configuration) on free loopback
# ports, runs every scenario against both (the broker that goes first alternates from one
# scenario to the next) and writes per run, into OUTDIR,
#   <id>_<broker>.json        mqload's JSON (last stdout line)
#   <id>_<broker>.txt         mqload's stderr summary, "rc=N" and disk_write_bytes (the broker
#                             process's /proc/PID/io write_bytes over the run)
#   <id>_<broker>.broker.log  what the broker logged during the run (Mosquitto: routine
#                             connect/disconnect lines filtered out, their count kept)
#   <id>_<broker>.quiet       machine-busy samples before the run, and a top snapshot
# plus manifest.tsv (one line per run, with the mqload command line), env.txt, events.log,
# mosquitto.conf, ferrymq.warnings.txt and the full broker logs, then stops both brokers
# (SIGTERM, SIGKILL after 15 s). Every mqload run has --duration/--drain and a `timeout`, so
# the whole script is bounded (about 7-10 minutes with a quiet machine).
set -u

KIND=mqtt
OTHER=mosquitto
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
bench_init "${1:-}" "$MOSQ"
CONNS_TIMEOUT=90

# id | description | mqload args (without --port/--broker-pid)
SCENARIOS=(
  "i|2,000 idle MQTT connections, hold 10 s (fresh brokers)|conns --proto mqtt --count 2000 --hold 10"
  "a|MQTT QoS0 1->1|mqtt --qos 0 --size 64 --duration $D --drain $DRAIN"
  "b|MQTT QoS1 1->1|mqtt --qos 1 --size 64 --duration $D --drain $DRAIN"
  "c|MQTT QoS2 1->1, window 64|mqtt --qos 2 --size 64 --duration $D --drain $DRAIN"
  "c20|MQTT QoS2 1->1, window 20|mqtt --qos 2 --inflight 20 --size 64 --duration $D --drain $DRAIN"
  "d|MQTT QoS1 4->1|mqtt --qos 1 --pubs 4 --size 64 --duration $D --drain $DRAIN"
  "ps|MQTT QoS1 1->1, persistent-session subscriber|mqtt --qos 1 --persistent-subs --size 64 --duration $D --drain $DRAIN"
  "ps4|MQTT QoS1 4->1, persistent-session subscriber|mqtt --qos 1 --pubs 4 --persistent-subs --size 64 --duration $D --drain $DRAIN"
  "e|MQTT QoS0 1->10 fan-out|mqtt --qos 0 --subs 10 --size 64 --duration $D --drain $DRAIN"
  "e1|MQTT QoS1 1->10 fan-out|mqtt --qos 1 --subs 10 --size 64 --duration $D --drain $DRAIN"
  "m5|MQTT 5 QoS1 1->1|mqtt --protocol 5 --qos 1 --size 64 --duration $D --drain $DRAIN"
  "r0|MQTT QoS0 at 10k msg/s|mqtt --qos 0 --rate 10000 --size 64 --duration $D --drain $DRAIN"
  "r1|MQTT QoS1 at 10k msg/s|mqtt --qos 1 --rate 10000 --size 64 --duration $D --drain $DRAIN"
)

write_env "mosquitto: $MOSQ, $("$MOSQ" -h 2>&1 | head -1)"

start_ferrymq
start_mosquitto
sleep 2

run_scenarios
finish
