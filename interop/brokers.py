"""Start, stop and restart the broker under test.

Three kinds of broker are supported:

* ``ferrymq`` (default): the binary built by ``cargo build --release``.  It is
  started with ``--data-dir <tmp> --mqtt-listen 127.0.0.1:0 --amqp-listen
  127.0.0.1:0`` and announces its ephemeral ports with one stdout line
  ``FERRYMQ READY mqtt=127.0.0.1:PORT amqp=127.0.0.1:PORT ...``.
* ``mosquitto``: the MQTT reference broker, started from a generated config file
  on a free loopback port (no AMQP).
* ``rabbitmq``: the AMQP 0-9-1 reference broker (Debian's rabbitmq-server 3.10
  with the rabbitmq_mqtt plugin): a node of our own (own node name, own epmd,
  own ports, Erlang cookie, Mnesia and log dirs under the work dir), started with
  ``rabbitmq-server`` and awaited with ``rabbitmqctl await_startup``.

All are stopped with SIGTERM (SIGKILL after a deadline).  Restarting keeps the
data directory (FerryMQ) / persistence location (Mosquitto) / Mnesia dir
(RabbitMQ) and the ports, so a client reconnects to the same address as after a
real broker restart.  RabbitMQ's restart is ``rabbitmqctl stop_app`` +
``start_app`` (the broker application restarts inside the running Erlang VM:
every connection is closed, queues are stopped and recovered from disk).
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
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

READY_RE = re.compile(r"^FERRYMQ READY\s+(?P<pairs>.*)$")

# Variables of this suite, not of the broker (kept out of FerryMQ's environment).
HARNESS_VARS = ("FERRYMQ_BIN", "FERRYMQ_LOG")


def broker_kind() -> str:
    kind = os.environ.get("INTEROP_BROKER", "ferrymq").strip().lower()
    if kind not in ("ferrymq", "mosquitto", "rabbitmq"):
        raise RuntimeError(f"INTEROP_BROKER must be 'ferrymq', 'mosquitto' or 'rabbitmq', not {kind!r}")
    return kind


# Where Debian's rabbitmq-server keeps the real scripts.  /usr/sbin/rabbitmqctl is a
# wrapper that, as root, re-runs the command as user 'rabbitmq' with HOME=/var/lib/rabbitmq
# (another Erlang cookie): the scripts below are run directly instead.
RABBITMQ_SCRIPTS = Path(os.environ.get("RABBITMQ_SCRIPTS_DIR", "/usr/lib/rabbitmq/bin"))


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
    Only used for Mosquitto and RabbitMQ, whose configs need explicit ports; FerryMQ
    binds port 0 itself and reports the port it got."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports that were free a moment ago (all bound at once, so
    they differ, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
    """One broker process under test.  ``host``/``port`` are the MQTT listener,
    ``amqp_addr`` the AMQP 0-9-1 listener (None when the broker has none)."""

    start_timeout = float(os.environ.get("INTEROP_START_TIMEOUT", "30"))
    stop_timeout = float(os.environ.get("INTEROP_STOP_TIMEOUT", "10"))
    # A RabbitMQ node needs ~15 s for its first boot on an idle 2-core machine.
    rabbitmq_start_timeout = float(os.environ.get("INTEROP_RABBITMQ_START_TIMEOUT", "120"))

    def __init__(self, kind: str, workdir: Path, persistence: bool = False, config: Path | None = None):
        self.kind = kind
        self.workdir = Path(workdir)
        # FerryMQ only: a TOML configuration file given as --config (kept across restarts),
        # for what FERRYMQ_* variables cannot say (arrays of tables: auth.users, auth.rules).
        self.config = Path(config) if config is not None else None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.persistence = persistence
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(exist_ok=True)
        self.log_path = self.workdir / "broker.log"
        self.proc: subprocess.Popen | None = None
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.listeners: dict[str, tuple[str, int]] = {}
        self.amqp_addr: tuple[str, int] | None = None
        self.exit_codes: list[int] = []
        # RabbitMQ only: node name, private epmd process, ports, rabbitmqctl environment.
        self.node: str | None = None
        self._epmd: subprocess.Popen | None = None
        self._rabbit_ports: dict[str, int] = {}
        self._rabbit_env: dict[str, str] = {}
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
        elif self.kind == "rabbitmq":
            self._start_rabbitmq()
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
                self._kill_proc(proc)
                proc.wait(timeout=self.stop_timeout)
        if self.kind == "rabbitmq":
            # rabbitmq-server runs in its own session: make sure no Erlang VM of ours
            # outlives it, then stop our private epmd.
            self._killpg(proc, signal.SIGKILL)
            self._stop_epmd()
        if self._stdout_thread is not None:
            self._stdout_thread.join(timeout=5)
            self._stdout_thread = None
        rc = proc.returncode
        self.exit_codes.append(rc)
        self._log(f"==== stopped, exit code {rc} ====")
        self.proc = None
        return rc

    def restart(self) -> None:
        """Stop (SIGTERM) and start again on the same data dir and the same port.
        RabbitMQ: ``rabbitmqctl stop_app`` + ``start_app`` on the running node (every
        client connection is closed; durable queues and persistent messages are
        recovered from disk, transient ones are gone), then ``await_startup``."""
        if self.kind == "rabbitmq" and self.alive():
            self._log("==== restart (rabbitmqctl stop_app / start_app) ====")
            self.rabbitmqctl("stop_app", timeout=60)
            self.rabbitmqctl("start_app", timeout=60)
            deadline = time.monotonic() + self.rabbitmq_start_timeout
            self._rabbit_await_startup(deadline)
            self._wait_tcp(deadline=deadline)
            self._wait_tcp(deadline=deadline, port=self.amqp_addr[1])
            return
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL: a crash, without any chance to flush state."""
        if self.proc is not None and self.proc.poll() is None:
            self._kill_proc(self.proc)
        self.stop()

    @property
    def has_amqp(self) -> bool:
        return self.amqp_addr is not None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_files(self) -> list[Path]:
        files = [self.log_path]
        if self.kind == "rabbitmq":
            files.append(self.workdir / "log" / "rabbit.log")
        return files

    def log_mark(self) -> dict[str, int]:
        """Current sizes of the log files, for read_log(since=...)."""
        out = {}
        for f in self.log_files():
            try:
                out[str(f)] = f.stat().st_size
            except FileNotFoundError:
                out[str(f)] = 0
        return out

    def read_log(self, max_chars: int = 60000, since: dict[str, int] | None = None) -> str:
        """The broker's log (for RabbitMQ: the fixture's log, then the node's
        rabbit.log); with ``since`` (from log_mark) only what was written after it."""
        parts = []
        for f in self.log_files():
            try:
                with open(f, "rb") as fh:
                    if since:
                        fh.seek(since.get(str(f), 0))
                    text = fh.read().decode(errors="replace")
            except FileNotFoundError:
                text = "(no log)"
            if len(text) > max_chars:
                text = "...(truncated)...\n" + text[-max_chars:]
            parts.append(text if len(self.log_files()) == 1 else f"---- {f} ----\n{text}")
        return "\n".join(parts)

    # ----------------------------------------------------------------- helpers
    def _log(self, line: str) -> None:
        with self._log_lock, open(self.log_path, "a") as f:
            f.write(line.rstrip("\n") + "\n")

    def _fail(self, msg: str) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._kill_proc(self.proc)
            self.proc.wait(timeout=self.stop_timeout)
        if self.kind == "rabbitmq" and self.proc is not None:
            self._killpg(self.proc, signal.SIGKILL)
            self._stop_epmd()
        self.proc = None
        raise BrokerError(f"{msg}\n---- broker log ({self.log_path}) ----\n{self.read_log()}")

    def _kill_proc(self, proc: subprocess.Popen) -> None:
        if self.kind == "rabbitmq":
            # The shell script and its Erlang VM (its own session / process group).
            self._killpg(proc, signal.SIGKILL)
        else:
            proc.kill()

    @staticmethod
    def _killpg(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # started with start_new_session: pgid == pid
        except (ProcessLookupError, PermissionError):
            pass

    # ----------------------------------------------------------------- ferrymq
    def _start_ferrymq(self) -> None:
        binary = ferrymq_binary()
        if not binary.exists():
            raise BrokerError(
                f"FerryMQ binary not found at {binary}; build it with "
                "`cargo build --release --bin ferrymq` (interop/run.sh does) or set FERRYMQ_BIN"
            )
        # First start: ephemeral ports.  Restart: the ports we had, like a real restart.
        listen = f"{self.host}:{self.port if self.port else 0}"
        amqp_listen = f"{self.host}:{self.amqp_addr[1] if self.amqp_addr else 0}"
        http = self.listeners.get("http")
        http_listen = f"{self.host}:{http[1] if http else 0}"
        ws = self.listeners.get("ws")
        ws_listen = f"{self.host}:{ws[1] if ws else 0}"
        cmd = [
            str(binary),
            "--data-dir", str(self.data_dir),
            "--mqtt-listen", listen,
            "--mqtt-ws-listen", ws_listen,
            "--amqp-listen", amqp_listen,
            "--http-listen", http_listen,
            "--log", os.environ.get("FERRYMQ_LOG", "info"),
        ]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        self._log("$ " + " ".join(cmd))
        # FerryMQ reads FERRYMQ_* variables as configuration (FERRYMQ_MQTT__LISTEN...):
        # the suite's own FERRYMQ_BIN / FERRYMQ_LOG are not for it (an unknown key
        # `bin` is a configuration error).
        env = {k: v for k, v in os.environ.items() if k not in HARNESS_VARS}
        logf = open(self.log_path, "a")
        try:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
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
        # AMQP: optional here (MQTT-only tests must keep running while FerryMQ's AMQP
        # front-end does not exist); the AMQP fixtures fail fast when it is missing.
        amqp = listeners.get("amqp")
        if self.amqp_addr and amqp and amqp != self.amqp_addr:
            self._fail(f"restarted ferrymq has AMQP on {amqp}, asked for {self.amqp_addr}")
        if amqp or not self.amqp_addr:
            self.amqp_addr = amqp
        # The READY line promises listening sockets: check they really accept.
        self._wait_tcp(deadline=time.monotonic() + 5)
        if amqp:
            self._wait_tcp(deadline=time.monotonic() + 5, port=amqp[1])

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

    def _wait_tcp(self, deadline: float, port: int | None = None) -> None:
        port = self.port if port is None else port
        while True:
            if self.proc is None or self.proc.poll() is not None:
                self._fail(f"{self.kind} exited with code {self.proc.returncode if self.proc else '?'} during start")
            try:
                with socket.create_connection((self.host, port), timeout=1):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self._fail(f"{self.kind} did not accept TCP connections on {self.host}:{port}")
            time.sleep(0.02)

    # ---------------------------------------------------------------- rabbitmq
    def rabbitmqctl(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``rabbitmqctl -n <our node> ARGS`` with our node's environment (cookie,
        epmd port).  Only ever aimed at the node this object started."""
        if self.node is None:
            raise BrokerError("no RabbitMQ node of ours")
        cmd = [str(RABBITMQ_SCRIPTS / "rabbitmqctl"), "-q", "-n", self.node, *args]
        r = subprocess.run(cmd, env=self._rabbit_env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            self._log(f"$ {' '.join(cmd)} -> exit {r.returncode}\n{r.stdout}{r.stderr}")
            raise BrokerError(f"{' '.join(cmd)} failed with exit {r.returncode}: {r.stdout}{r.stderr}")
        return r

    def _start_rabbitmq(self) -> None:
        server = RABBITMQ_SCRIPTS / "rabbitmq-server"
        if not server.exists():
            raise BrokerError("rabbitmq-server not installed: apt-get install -y rabbitmq-server")
        epmd = shutil.which("epmd") or "/usr/bin/epmd"
        if self.node is None:
            # First start: our own node name and ports (never the defaults 5672 / 1883 /
            # 25672 / 4369: other brokers and nodes run on this machine).
            self.node = f"interop-{uuid.uuid4().hex[:8]}@localhost"
            amqp, mqtt, dist, epmd_port = free_ports(4)
            self._rabbit_ports = {"amqp": amqp, "mqtt": mqtt, "dist": dist, "epmd": epmd_port}
            self.port = mqtt
            self.amqp_addr = (self.host, amqp)
            self.listeners = {"mqtt": (self.host, mqtt), "amqp": (self.host, amqp)}
        ports = self._rabbit_ports
        home, mnesia, logdir = (self.workdir / d for d in ("home", "mnesia", "log"))
        for d in (home, mnesia, logdir):
            d.mkdir(exist_ok=True)
        conf = self.workdir / "rabbitmq.conf"
        lines = [
            f"listeners.tcp.default = {self.host}:{ports['amqp']}",
            f"mqtt.listeners.tcp.default = {self.host}:{ports['mqtt']}",
            "mqtt.allow_anonymous = true",
            "mqtt.vhost = /",
            "mqtt.exchange = amq.topic",
            f"log.file = {logdir / 'rabbit.log'}",
            "log.file.level = info",
            "log.console = false",
            # no disk alarm (publishers blocked) on a nearly full tmp dir
            "disk_free_limit.absolute = 1MB",
        ]
        extra = os.environ.get("INTEROP_RABBITMQ_EXTRA_CONF")
        if extra:
            # Extra rabbitmq.conf lines (a file), e.g. to check that tests fail when
            # the reference broker is deliberately misconfigured.
            lines += Path(extra).read_text().splitlines()
        conf.write_text("\n".join(lines) + "\n")
        (self.workdir / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        (self.workdir / "rabbitmq-env.conf").write_text("# empty: ignore /etc/rabbitmq/rabbitmq-env.conf\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            # HOME holds the Erlang cookie: ours, not /var/lib/rabbitmq's or /root's.
            "HOME": str(home),
            "LC_ALL": "C.UTF-8",
            "LANG": "C.UTF-8",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(ports["epmd"]),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(ports["amqp"]),
            "RABBITMQ_DIST_PORT": str(ports["dist"]),
            "RABBITMQ_MNESIA_BASE": str(mnesia),
            "RABBITMQ_LOG_BASE": str(logdir),
            "RABBITMQ_CONFIG_FILE": str(conf),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.workdir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(self.workdir / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(self.workdir / "rabbitmq.pid"),
            # Erlang distribution on loopback only.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        })
        self._rabbit_env = env
        # A private epmd (its own port, loopback only): our node registers there, and
        # nothing another engineer runs (their node, their epmd) is involved.
        self._log(f"$ {epmd} -port {ports['epmd']} -address 127.0.0.1")
        logf = open(self.log_path, "a")
        try:
            self._epmd = subprocess.Popen(
                [epmd, "-port", str(ports["epmd"]), "-address", "127.0.0.1"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, env=env, preexec_fn=_die_with_parent,
            )
            cmd = [str(server)]
            self._log(f"$ {' '.join(f'{k}={v}' for k, v in env.items() if k.startswith(('RABBITMQ_', 'ERL_', 'HOME')))} "
                      f"{server}")
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=self.workdir, env=env,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        finally:
            logf.close()
        deadline = time.monotonic() + self.rabbitmq_start_timeout
        self._rabbit_await_startup(deadline)
        self._wait_tcp(deadline=deadline)
        self._wait_tcp(deadline=deadline, port=ports["amqp"])

    def _rabbit_await_startup(self, deadline: float) -> None:
        """``rabbitmqctl await_startup``: it fails at once while the node is not yet
        registered with epmd, so it is retried until it succeeds or the deadline."""
        last = ""
        while True:
            if self.proc is None or self.proc.poll() is not None:
                self._fail(f"rabbitmq-server exited with code {self.proc.returncode if self.proc else '?'} "
                           f"during start\n{last}")
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"rabbitmqctl await_startup did not succeed within {self.rabbitmq_start_timeout}s\n{last}")
            try:
                r = self.rabbitmqctl("await_startup", "--timeout", str(max(int(left), 1)),
                                     timeout=left + 10, check=False)
            except subprocess.TimeoutExpired:
                continue
            if r.returncode == 0:
                self._log(f"==== node {self.node} started ====")
                return
            last = (r.stdout + r.stderr)[-2000:]
            time.sleep(0.2)

    def _stop_epmd(self) -> None:
        e, self._epmd = self._epmd, None
        if e is not None and e.poll() is None:
            e.terminate()
            try:
                e.wait(timeout=5)
            except subprocess.TimeoutExpired:
                e.kill()
                e.wait(timeout=5)
