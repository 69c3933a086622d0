"""Start, stop and restart the broker under test.

Two kinds of broker are supported:

* ``ferrymq`` (default): the binary built by ``cargo build --release``.  It is
  started with ``--data-dir <tmp> --mqtt-listen 127.0.0.1:0`` and announces its
  ephemeral ports with one stdout line ``FERRYMQ READY mqtt=127.0.0.1:PORT ...``.
* ``mosquitto``: the reference broker, started from a generated config file on a
  free loopback port.

Both are stopped with SIGTERM (SIGKILL after a deadline).  Restarting keeps the
data directory (FerryMQ) / persistence location (Mosquitto) and the port, so a
client reconnects to the same address as after a real broker restart.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

READY_RE = re.compile(r"^FERRYMQ READY\s+(?P<pairs>.*)$")


def broker_kind() -> str:
    kind = os.environ.get("INTEROP_BROKER", "ferrymq").strip().lower()
    if kind not in ("ferrymq", "mosquitto"):
        raise RuntimeError(f"INTEROP_BROKER must be 'ferrymq' or 'mosquitto', not {kind!r}")
    return kind


def ferrymq_binary() -> Path:
    """Where the FerryMQ binary is: $FERRYMQ_BIN, else $CARGO_TARGET_DIR/release/ferrymq,
    else <repo>/target/release/ferrymq.  A relative CARGO_TARGET_DIR is taken relative
    to the repository root (where run.sh invokes cargo)."""
    explicit = os.environ.get("FERRYMQ_BIN")
    if explicit:
        return Path(explicit)
    target = os.environ.get("CARGO_TARGET_DIR")
    target_dir = Path(target) if target else REPO_ROOT / "target"
    if not target_dir.is_absolute():
        target_dir = REPO_ROOT / target_dir
    return target_dir / "release" / "ferrymq"


def _die_with_parent() -> None:
    """preexec_fn: on Linux, have the broker get SIGTERM if the test process dies
    (e.g. killed by a CI timeout), so no broker outlives the run."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:
        pass


def free_port() -> int:
    """A loopback port that was free a moment ago (bind port 0 and release it).
    Only used for Mosquitto, whose config needs an explicit port; FerryMQ binds
    port 0 itself and reports the port it got."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_ready_line(line: str) -> dict[str, tuple[str, int]] | None:
    """Parse ``FERRYMQ READY mqtt=127.0.0.1:1234 amqp=...`` into
    ``{"mqtt": ("127.0.0.1", 1234), ...}``; None when the line is not the READY line."""
    m = READY_RE.match(line.strip())
    if not m:
        return None
    out: dict[str, tuple[str, int]] = {}
    for pair in m.group("pairs").split():
        if "=" not in pair:
            continue
        key, addr = pair.split("=", 1)
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        try:
            out[key] = (host, int(port))
        except ValueError:
            continue
    return out


class BrokerError(RuntimeError):
    pass


class Broker:
    """One broker process under test.  ``host``/``port`` are the MQTT listener."""

    start_timeout = float(os.environ.get("INTEROP_START_TIMEOUT", "30"))
    stop_timeout = float(os.environ.get("INTEROP_STOP_TIMEOUT", "10"))

    def __init__(self, kind: str, workdir: Path, persistence: bool = False):
        self.kind = kind
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.persistence = persistence
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(exist_ok=True)
        self.log_path = self.workdir / "broker.log"
        self.proc: subprocess.Popen | None = None
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.listeners: dict[str, tuple[str, int]] = {}
        self.exit_codes: list[int] = []
        self.starts = 0
        self._stdout_thread: threading.Thread | None = None
        self._log_lock = threading.Lock()

    # ------------------------------------------------------------------ public
    @property
    def addr(self) -> tuple[str, int]:
        return (self.host, self.port)

    def start(self) -> None:
        if self.proc is not None:
            raise BrokerError("broker already running")
        self.starts += 1
        self._log(f"==== start #{self.starts} ({self.kind}) ====")
        if self.kind == "ferrymq":
            self._start_ferrymq()
        else:
            self._start_mosquitto()

    def stop(self) -> int | None:
        """SIGTERM, wait up to stop_timeout, then SIGKILL.  Returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._log(f"==== broker did not exit {self.stop_timeout}s after SIGTERM: SIGKILL ====")
                proc.kill()
                proc.wait(timeout=self.stop_timeout)
        if self._stdout_thread is not None:
            self._stdout_thread.join(timeout=5)
            self._stdout_thread = None
        rc = proc.returncode
        self.exit_codes.append(rc)
        self._log(f"==== stopped, exit code {rc} ====")
        self.proc = None
        return rc

    def restart(self) -> None:
        """Stop (SIGTERM) and start again on the same data dir and the same port."""
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL: a crash, without any chance to flush state."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.stop()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def read_log(self, max_chars: int = 60000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no broker log)"
        if len(text) > max_chars:
            text = "...(truncated)...\n" + text[-max_chars:]
        return text

    # ----------------------------------------------------------------- helpers
    def _log(self, line: str) -> None:
        with self._log_lock, open(self.log_path, "a") as f:
            f.write(line.rstrip("\n") + "\n")

    def _fail(self, msg: str) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=self.stop_timeout)
        self.proc = None
        raise BrokerError(f"{msg}\n---- broker log ({self.log_path}) ----\n{self.read_log()}")

    # ----------------------------------------------------------------- ferrymq
    def _start_ferrymq(self) -> None:
        binary = ferrymq_binary()
        if not binary.exists():
            raise BrokerError(
                f"FerryMQ binary not found at {binary}; build it with "
                "`cargo build --release --bin ferrymq` (interop/run.sh does) or set FERRYMQ_BIN"
            )
        # First start: ephemeral port.  Restart: the port we had, like a real restart.
        listen = f"{self.host}:{self.port if self.port else 0}"
        cmd = [
            str(binary),
            "--data-dir", str(self.data_dir),
            "--mqtt-listen", listen,
            "--log", os.environ.get("FERRYMQ_LOG", "info"),
        ]
        self._log("$ " + " ".join(cmd))
        logf = open(self.log_path, "a")
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=logf,
                cwd=self.workdir,
                text=True,
                bufsize=1,
                preexec_fn=_die_with_parent,
            )
        finally:
            logf.close()

        ready = threading.Event()
        found: dict[str, dict] = {}

        def pump(stdout):
            # Keep draining stdout for the whole life of the process so the broker
            # can never block on a full pipe; every line also goes to the log.
            for line in stdout:
                self._log("[stdout] " + line)
                if not ready.is_set():
                    parsed = parse_ready_line(line)
                    if parsed is not None:
                        found["listeners"] = parsed
                        ready.set()
            stdout.close()

        self._stdout_thread = threading.Thread(target=pump, args=(self.proc.stdout,), daemon=True)
        self._stdout_thread.start()

        deadline = time.monotonic() + self.start_timeout
        while not ready.wait(0.05):
            if self.proc.poll() is not None:
                self._fail(f"ferrymq exited with code {self.proc.returncode} before printing FERRYMQ READY")
            if time.monotonic() > deadline:
                self._fail(f"ferrymq printed no FERRYMQ READY line within {self.start_timeout}s")
        listeners = found["listeners"]
        if "mqtt" not in listeners:
            self._fail(f"FERRYMQ READY line has no mqtt=ADDR pair: {listeners}")
        self.listeners = listeners
        host, port = listeners["mqtt"]
        if self.port and port != self.port:
            self._fail(f"restarted ferrymq listens on {port}, asked for {self.port}")
        self.host, self.port = host, port
        # The READY line promises a listening socket: check it really accepts.
        self._wait_tcp(deadline=time.monotonic() + 5)

    # --------------------------------------------------------------- mosquitto
    def _start_mosquitto(self) -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            raise BrokerError("mosquitto not installed: apt-get install -y mosquitto mosquitto-clients")
        if self.port is None:
            self.port = free_port()
        conf = self.workdir / "mosquitto.conf"
        lines = [
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
            "log_dest stderr",
            "log_type all",
            "connection_messages true",
            "log_timestamp true",
        ]
        if self.persistence:
            # Saved on SIGTERM and loaded at start.
            lines += ["persistence true", f"persistence_location {self.data_dir}/"]
        else:
            lines += ["persistence false"]
        extra = os.environ.get("INTEROP_MOSQUITTO_EXTRA_CONF")
        if extra:
            # Extra config lines (a file), e.g. to check that tests fail when the
            # reference broker is deliberately misconfigured.
            lines += Path(extra).read_text().splitlines()
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # As root mosquitto would drop to user 'mosquitto', which cannot write
            # the pytest temp dir.
            lines.append("user root")
        conf.write_text("\n".join(lines) + "\n")
        cmd = [exe, "-c", str(conf)]
        self._log("$ " + " ".join(cmd))
        logf = open(self.log_path, "a")
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=self.workdir,
                preexec_fn=_die_with_parent,
            )
        finally:
            logf.close()
        self._wait_tcp(deadline=time.monotonic() + self.start_timeout)

    def _wait_tcp(self, deadline: float) -> None:
        while True:
            if self.proc is None or self.proc.poll() is not None:
                self._fail(f"{self.kind} exited with code {self.proc.returncode if self.proc else '?'} during start")
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self._fail(f"{self.kind} did not accept TCP connections on {self.host}:{self.port}")
            time.sleep(0.02)
