#!/usr/bin/env bash
# Usage: benches/compare/qos2-pubrel.sh (needs target/mqload/release/mqload, the old binary in /tmp/old-target and the new in /tmp/ci-check/target; edit the paths).
# QoS 2 to a persistent-session subscriber, 1 -> 1: the binary before (b26532a) and after (757906d) PUBREL-after-durable, alternating.
M=target/mqload/release/mqload
for round in 1 2; do
  for which in old new; do
    if [ $which = old ]; then BIN=/tmp/old-target/release/ferrymq; else BIN=/tmp/ci-check/target/release/ferrymq; fi
    D=$(mktemp -d); PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    $BIN --data-dir $D --mqtt-listen 127.0.0.1:$PORT --amqp-listen "" --http-listen "" --mqtt-ws-listen "" > $D.log 2>&1 &
    P=$!; for i in $(seq 1 50); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    OUT=$(timeout 120 $M mqtt --port $PORT --qos 2 --pubs 1 --subs 1 --size 64 --duration 8 --persistent-subs 2>/dev/null)
    echo "$round $which $(echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); r=d.get("results",d); print({k:v for k,v in r.items() if k in ("delivered_per_sec","received_per_sec","sent_per_sec","lost","duplicates","latency_ms")})' 2>/dev/null || echo "$OUT" | head -c 600)"
    kill $P; wait $P 2>/dev/null; rm -rf $D $D.log
  done
done
