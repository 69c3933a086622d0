#!/usr/bin/env bash
# Run the FerryMQ interop suite.
#
#   interop/run.sh                              # against FerryMQ (builds it if missing)
#   INTEROP_BROKER=mosquitto interop/run.sh     # against the reference Mosquitto (MQTT)
#   INTEROP_BROKER=rabbitmq interop/run.sh      # against a reference RabbitMQ node (AMQP + MQTT gateway)
#   interop/run.sh -k retained -x               # extra arguments go to pytest
#
# Environment: INTEROP_BROKER (ferrymq|mosquitto|rabbitmq), INTEROP_TIMEOUT (per-test
# seconds, default 60), CARGO_TARGET_DIR (honoured), FERRYMQ_BIN (use this binary,
# skip the build), FERRYMQ_LOG (broker --log level, default info), INTEROP_STRICT=1
# (also run mosquitto_specific tests against FerryMQ), PYTHON (default python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
broker="${INTEROP_BROKER:-ferrymq}"
venv="$here/.venv"
python="${PYTHON:-python3}"

log() { printf '[interop] %s\n' "$*" >&2; }

# ---- Python environment -----------------------------------------------------
req_stamp="$venv/.requirements.sha256"
req_hash="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" ]] && ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    log "$venv is broken (its python moved?): recreating"
    rm -rf "$venv"
fi
if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv"
    "$python" -m venv "$venv" || {
        rm -rf "$venv"
        log "python3 -m venv failed; on Debian: apt-get install -y python3-venv"
        exit 2
    }
fi
if [[ ! -f "$req_stamp" || "$(cat "$req_stamp")" != "$req_hash" ]]; then
    log "installing $here/requirements.txt"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$here/requirements.txt"
    echo "$req_hash" > "$req_stamp"
fi

# ---- broker under test ------------------------------------------------------
case "$broker" in
ferrymq)
    if [[ -n "${FERRYMQ_BIN:-}" ]]; then
        bin="$FERRYMQ_BIN"
    else
        target="${CARGO_TARGET_DIR:-$repo/target}"
        [[ "$target" = /* ]] || target="$repo/$target"
        bin="$target/release/ferrymq"
        if [[ ! -x "$bin" ]]; then
            log "building FerryMQ: cargo build --release --bin ferrymq"
            (cd "$repo" && cargo build --release --bin ferrymq)
        fi
    fi
    [[ -x "$bin" ]] || { log "FerryMQ binary not found at $bin"; exit 2; }
    log "broker under test: FerryMQ ($bin)"
    ;;
mosquitto)
    command -v mosquitto >/dev/null || [[ -x /usr/sbin/mosquitto ]] || {
        log "mosquitto not installed: apt-get install -y mosquitto mosquitto-clients"; exit 2; }
    log "broker under test: Mosquitto ($( (mosquitto -h 2>/dev/null || /usr/sbin/mosquitto -h 2>/dev/null) | sed -n 1p))"
    ;;
rabbitmq)
    [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] || {
        log "rabbitmq-server not installed: apt-get install -y rabbitmq-server"; exit 2; }
    log "broker under test: RabbitMQ ($(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo '?'), own node, started by the fixture)"
    ;;
*)
    log "INTEROP_BROKER must be ferrymq, mosquitto or rabbitmq, not '$broker'"; exit 2 ;;
esac
command -v mosquitto_pub >/dev/null || log "warning: mosquitto_pub not on PATH (apt-get install -y mosquitto-clients); its tests will fail"

# ---- run ---------------------------------------------------------------------
export INTEROP_BROKER="$broker"
cd "$here"
exec "$venv/bin/python" -m pytest --timeout="${INTEROP_TIMEOUT:-60}" "$@"
