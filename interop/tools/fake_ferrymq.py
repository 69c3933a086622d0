#!/usr/bin/env python3
"""A stand-in for the FerryMQ binary, for testing the suite's FerryMQ code path
(READY line, ephemeral port, restart on the same data dir and port, SIGTERM)
before FerryMQ itself exists.  It runs Mosquitto behind FerryMQ's command line:

    FERRYMQ_BIN=interop/tools/fake_ferrymq.py interop/run.sh

Only the options the suite uses are implemented.  The ferrymq_only tests are
expected to fail with it (they check what Mosquitto lacks)."""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--mqtt-listen", default="127.0.0.1:1883")
    ap.add_argument("--mqtts-listen")
    ap.add_argument("--amqp-listen")
    ap.add_argument("--http-listen")
    ap.add_argument("--log", default="info")
    a = ap.parse_args()

    host, _, port = a.mqtt_listen.rpartition(":")
    port = int(port)
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    os.makedirs(a.data_dir, exist_ok=True)
    conf = os.path.join(a.data_dir, "fake-mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} {host}\nallow_anonymous true\nlog_dest stderr\n"
                f"persistence true\npersistence_location {a.data_dir}/\n")
        if os.geteuid() == 0:
            f.write("user root\n")
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    def die_with_wrapper():
        # If this wrapper is SIGKILLed (a simulated crash), Mosquitto goes too.
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    child = subprocess.Popen([exe, "-c", conf], stdin=subprocess.DEVNULL, stdout=sys.stderr,
                             preexec_fn=die_with_wrapper)

    def forward(sig, _frame):
        child.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    deadline = time.monotonic() + 10
    while True:
        if child.poll() is not None:
            return child.returncode or 1
        try:
            socket.create_connection((host, port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                child.kill()
                return 1
            time.sleep(0.02)
    print(f"FERRYMQ READY mqtt={host}:{port}", flush=True)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
