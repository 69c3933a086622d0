#!/usr/bin/env bash
# Memory per idle MQTT 3.1.1 connection: FerryMQ vs Mosquitto, side by side in one run, a
# fresh broker for every row.
#
# Usage: benches/compare/idle.sh [OUTDIR]   (default benches/compare/raw/idle-<date>-<time>, git-ignored)
# Environment: FERRYMQ_BIN, MQLOAD, MOSQUITTO as for compare.sh (see lib.sh), and
#   COUNT   connections per row (default 10000)
#   HOLD    seconds they are held once all are open (default 10)
#
# Rows, each against FerryMQ (built-in defaults) and Mosquitto (default configuration):
#   plain       `mqload conns`: CONNECT, CONNACK, nothing else
#   subscribed  benches/compare/idle_clients.py --subscribe: each also subscribes to a topic
#               of its own at QoS 1
#   tls         benches/compare/idle_clients.py --tls: plain connections over TLS 1.3 (RSA
#               2048 certificate from certs/gen.sh, each broker's default cipher choice)
# Writes <row>_<broker>.json (the client's JSON line) and manifest.tsv (the command lines)
# into OUTDIR and prints a table: broker RSS growth divided by the connections held.
# Bounded: every client run has a `timeout`; brokers are stopped on exit.
set -u

KIND=mqtt
OTHER=mosquitto
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
bench_init "${1:-$(dirname "$0")/raw/idle-$(date +%Y%m%d-%H%M%S)}" "$MOSQ"
COUNT=${COUNT:-10000}
HOLD=${HOLD:-10}
CLIENT_TIMEOUT=$((HOLD + 300))

CERTS=$OUT/certs
"$REPO/certs/gen.sh" "$CERTS" >/dev/null
# Mosquitto started as root reads its files as its own user.
chmod 755 "$CERTS" && chmod 644 "$CERTS"/*
read -r TLS_PORT <<<"$(free_ports 1)"

write_env "mosquitto: $MOSQ, $("$MOSQ" -h 2>&1 | head -1); COUNT=$COUNT HOLD=$HOLD"
printf 'row\tbroker\tcommand\n' >"$OUT/manifest.tsv"

# start BROKER TLS(0|1)
start() {
  if [ "$1" = ferrymq ]; then
    FQ_ENV=()
    [ "$2" = 1 ] && FQ_ENV=(FERRYMQ_MQTT__TLS_LISTEN="127.0.0.1:$TLS_PORT"
      FERRYMQ_TLS__CERT="$CERTS/server-fullchain.pem" FERRYMQ_TLS__KEY="$CERTS/server.key")
    start_ferrymq
  else
    MQ_EXTRA_CONF=""
    [ "$2" = 1 ] && MQ_EXTRA_CONF="listener $TLS_PORT 127.0.0.1
certfile $CERTS/server.pem
keyfile $CERTS/server.key"
    start_mosquitto
    [ "$2" = 1 ] && for _ in $(seq 1 100); do listening "$TLS_PORT" && break; sleep 0.1; done
  fi
}

# row ID BROKER: one fresh broker, one client run
row() {
  local id=$1 b=$2 tls=0 port pid cmd
  [ "$id" = tls ] && tls=1
  start "$b" "$tls"
  port=$("port_$b"); pid=$("pid_$b")
  [ "$tls" = 1 ] && port=$TLS_PORT
  case "$id" in
    plain) cmd=("$M" conns --proto mqtt --port "$port" --count "$COUNT" --hold "$HOLD" --broker-pid "$pid" --quiet) ;;
    subscribed) cmd=("$LIB_DIR/idle_clients.py" --port "$port" --pid "$pid" --count "$COUNT" --hold "$HOLD" --subscribe) ;;
    tls) cmd=("$LIB_DIR/idle_clients.py" --port "$port" --pid "$pid" --count "$COUNT" --hold "$HOLD" --tls "$CERTS/ca.pem") ;;
  esac
  printf '%s\t%s\t%s\n' "$id" "$b" "${cmd[*]}" >>"$OUT/manifest.tsv"
  log "$id $b: ${cmd[*]}"
  timeout -k 5 "$CLIENT_TIMEOUT" "${cmd[@]}" 2>"$OUT/${id}_$b.txt" | tail -1 >"$OUT/${id}_$b.json"
  "stop_$b"
}

for id in plain subscribed tls; do
  # The broker that goes first alternates from one row to the next.
  if [ "$id" = subscribed ]; then row "$id" mosquitto; row "$id" ferrymq
  else row "$id" ferrymq; row "$id" mosquitto; fi
done

python3 - "$OUT" "$COUNT" <<'PYEOF'
import json, sys
out, count = sys.argv[1], sys.argv[2]
def per_conn(path):
    try:
        v = json.load(open(path))
    except (OSError, ValueError):
        return "failed"
    if "broker_rss_per_connection" in v:  # mqload conns
        ok, kb = v.get("succeeded"), v["broker_rss_per_connection"][0]["kb_per_connection"]
    else:
        ok, kb = v.get("succeeded"), v.get("kb_per_connection")
    return f"{kb:.2f} kB ({ok} held)" if kb is not None else "failed"
print(f"| {count} idle MQTT 3.1.1 connections | FerryMQ | Mosquitto |")
print("| --- | --- | --- |")
for row in ("plain", "subscribed", "tls"):
    print(f"| {row} | {per_conn(f'{out}/{row}_ferrymq.json')} | {per_conn(f'{out}/{row}_mosquitto.json')} |")
PYEOF
log "results in $OUT"
