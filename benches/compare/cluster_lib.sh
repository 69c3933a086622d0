# shellcheck shell=bash
# Shared by cluster_forwarding.sh and cluster_streams.sh: FerryMQ members (or a single node)
# on loopback, each in a data directory of its own. Sourced, not run. The caller sets REPO,
# FQ (the ferrymq binary), OUT (where members' logs go) and LISTEN (the client listener the
# rows use: mqtt or amqp), then calls start_member / start_cluster and stop_all; everything
# started is stopped on exit.

PIDS=()
DIRS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 1 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
  done
  for d in "${DIRS[@]}"; do rm -rf "$d"; done
  PIDS=(); DIRS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM HUP

# free_ports N: N free loopback ports.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# start_member NAME PORT [CLUSTER_TOML]: a member (or, without CLUSTER_TOML, a single node)
# with its $LISTEN listener on PORT and no other, ready when its READY line names the port.
start_member() {
  local name=$1 port=$2 cluster=${3:-} dir mqtt="" amqp=""
  case $LISTEN in
    mqtt) mqtt="127.0.0.1:$port" ;;
    amqp) amqp="127.0.0.1:$port" ;;
  esac
  dir=$(mktemp -d /tmp/ferrymq-cluster-bench.XXXXXX)
  DIRS+=("$dir")
  printf '%s\n' "$cluster" >"$dir/ferrymq.toml"
  : >"$dir/stdout"
  env $(compgen -e | grep '^FERRYMQ_' | sed 's/^/-u /') "$FQ" --config "$dir/ferrymq.toml" --data-dir "$dir/data" \
    --mqtt-listen "$mqtt" --amqp-listen "$amqp" --mqtt-ws-listen "" --http-listen "" --log warn \
    >"$dir/stdout" 2>"$OUT/$name.log" &
  PIDS+=($!)
  for _ in $(seq 1 300); do grep -q "FERRYMQ READY.*$LISTEN=127.0.0.1:$port" "$dir/stdout" && return 0; sleep 0.1; done
  echo "$name did not become ready" >&2; cat "$OUT/$name.log" >&2; exit 2
}

# start_cluster: three members n0..n2; their client ports in P0 P1 P2.
start_cluster() {
  local peer i j
  read -r P0 P1 P2 R0 R1 R2 <<<"$(free_ports 6)"
  local r=("$R0" "$R1" "$R2") ports=("$P0" "$P1" "$P2")
  for i in 0 1 2; do
    peer=""
    for j in 0 1 2; do [ "$i" = "$j" ] || peer="$peer\"n$j@127.0.0.1:${r[$j]}\","; done
    start_member "n$i" "${ports[$i]}" "[cluster]
node_name = \"n$i\"
listen = \"127.0.0.1:${r[$i]}\"
peers = [${peer%,}]
secret = \"benchmark-secret-0123456789abcdef\""
  done
  sleep 3   # the metadata and data groups form; interest links come up
}
