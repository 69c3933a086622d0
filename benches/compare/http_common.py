"""Shared by the management-API benchmarks: start a FerryMQ binary on free loopback ports
and call its HTTP API (guest/guest) with the standard library only."""

import base64
import json
import os
import subprocess
import tempfile
import time
import urllib.request

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


class Broker:
    """A ferrymq process with a fresh data directory; stopped with SIGTERM."""

    def __init__(self, binary, extra_env=None, config=None):
        self.dir = tempfile.TemporaryDirectory(prefix="ferrymq-bench-")
        env = dict(os.environ, **(extra_env or {}))
        extra = []
        if config is not None:
            path = os.path.join(self.dir.name, "ferrymq.toml")
            with open(path, "w") as f:
                f.write(config)
            extra = ["--config", path]
        self.proc = subprocess.Popen(
            [binary, "--data-dir", os.path.join(self.dir.name, "data"), "--mqtt-listen", "127.0.0.1:0", "--mqtt-ws-listen", "",
             "--amqp-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--log", "warn", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        deadline = time.time() + 60
        line = ""
        while time.time() < deadline and "READY" not in line:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError("ferrymq exited before READY")
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        self.mqtt_port = int(fields["mqtt"].rsplit(":", 1)[1])
        self.amqp_port = int(fields["amqp"].rsplit(":", 1)[1])
        self.http = "http://" + fields["http"]

    def call(self, method, path, body=None, timeout=120):
        """(status, seconds, body bytes) of one request."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.http + path, data=data, method=method)
        req.add_header("Authorization", AUTH)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out = resp.read()
            return resp.status, time.perf_counter() - t0, out

    def declare_queues(self, n, prefix="q"):
        """Declares `n` durable queues in one definitions import (fast at 100k)."""
        queues = [{"name": f"{prefix}{i:06d}", "vhost": "/", "durable": True, "auto_delete": False,
                   "arguments": {}} for i in range(n)]
        self.call("POST", "/api/definitions", {"queues": queues}, timeout=600)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()
