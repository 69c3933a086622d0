#!/usr/bin/env bash
# Baseline scenarios (a)-(i) against the reference brokers on 127.0.0.1.
# Usage: bench/baseline.sh [OUTDIR] [SECONDS]   (needs the release binary built first)
# Every run is bounded (--duration, --drain, plus `timeout`). Brokers are only read
# (/proc, $SYS topics, management API), never signalled or reconfigured.
set -u
OUT=${1:-/tmp/mqload-baseline}
D=${2:-8}
M=${MQLOAD:-target/mqload/release/mqload}
mkdir -p "$OUT"
BM="--broker-comm mosquitto"
BR="--broker-comm beam.smp"

run() { # name, args...
  local name=$1; shift
  echo "=== $name: mqload $*" >&2
  timeout 120 "$M" --quiet "$@" >"$OUT/$name.json" 2>"$OUT/$name.txt"
  echo "rc=$?" >>"$OUT/$name.txt"
  tail -n 8 "$OUT/$name.txt" >&2
}

mosq_sys() { # current $SYS publish counters (retained; refreshed every 10 s by mosquitto)
  timeout 5 mosquitto_sub -h 127.0.0.1 -p 1883 -v -W 3 -C 2 \
    -t '$SYS/broker/publish/messages/received' -t '$SYS/broker/publish/messages/sent' 2>/dev/null | sort
}
rabbit_stats() { # management API totals (refreshed every 5 s)
  curl -s -u guest:guest http://127.0.0.1:15672/api/overview |
    python3 -c 'import json,sys; m=json.load(sys.stdin)["message_stats"]; print("publish", m.get("publish",0)); print("deliver_get", m.get("deliver_get",0))'
}
rss() { for p in $(pgrep -x mosquitto) $(pgrep -f beam.smp); do echo "$p $(tr -d '\0' </proc/$p/comm) $(grep VmRSS /proc/$p/status)"; done; }

# (a) QoS0 1 -> 1, with $SYS cross-check on Mosquitto
sleep 11; mosq_sys >"$OUT/a_mosq.sys.before"
run a_mosq  $BM mqtt --port 1883 --qos 0 --duration "$D"
sleep 11; mosq_sys >"$OUT/a_mosq.sys.after"
run a_rabbit $BR mqtt --port 1884 --qos 0 --duration "$D"
# (b) QoS1 1 -> 1
run b_mosq   $BM mqtt --port 1883 --qos 1 --duration "$D"
run b_rabbit $BR mqtt --port 1884 --qos 1 --duration "$D"
# (c) QoS2 1 -> 1, Mosquitto only: default window 64, then window 20 (= Mosquitto's max_inflight_messages)
sleep 11; mosq_sys >"$OUT/c_mosq.sys.before"
run c_mosq   $BM mqtt --port 1883 --qos 2 --duration "$D"
sleep 11; mosq_sys >"$OUT/c_mosq.sys.after"
run c_mosq_w20 $BM mqtt --port 1883 --qos 2 --inflight 20 --duration "$D"
# (d) QoS1 4 -> 1
run d_mosq   $BM mqtt --port 1883 --qos 1 --pubs 4 --duration "$D"
run d_rabbit $BR mqtt --port 1884 --qos 1 --pubs 4 --duration "$D"
# (e) QoS0 1 -> 10 fan-out
run e_mosq   $BM mqtt --port 1883 --qos 0 --subs 10 --duration "$D"
run e_rabbit $BR mqtt --port 1884 --qos 0 --subs 10 --duration "$D"
# (f) AMQP confirms -> manual ack, prefetch 100, transient; with management-API cross-check
sleep 6; rabbit_stats >"$OUT/f.stats.before"
run f_amqp $BR amqp --confirm --ack manual --prefetch 100 --duration "$D"
sleep 11; rabbit_stats >"$OUT/f.stats.after"
# (g) same, persistent
run g_amqp $BR amqp --confirm --ack manual --prefetch 100 --persistent --duration "$D"
# (h) no confirms, auto-ack
run h_amqp $BR amqp --ack auto --duration "$D"
# fixed-rate latency rows (10k msgs/s)
run r_mosq_q0   $BM mqtt --port 1883 --qos 0 --rate 10000 --duration "$D"
run r_rabbit_q0 $BR mqtt --port 1884 --qos 0 --rate 10000 --duration "$D"
run r_mosq_q1   $BM mqtt --port 1883 --qos 1 --rate 10000 --duration "$D"
run r_rabbit_q1 $BR mqtt --port 1884 --qos 1 --rate 10000 --duration "$D"
run r_amqp      $BR amqp --confirm --ack manual --rate 10000 --duration "$D"
# (i) 2,000 idle MQTT connections to Mosquitto
rss >"$OUT/i.rss.before"
run i_conns $BM $BR conns --proto mqtt --port 1883 --count 2000 --hold 10
rss >"$OUT/i.rss.after"
echo "results in $OUT" >&2
