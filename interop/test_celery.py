"""Celery 5 end to end: a real worker process (``celery -A celeryapp worker
--pool=solo -c 1``) on the broker's AMQP listener, tasks sent from the test
process with ``delay`` / ``apply_async``, results back through the ``rpc://``
backend (also AMQP).  Each test has its own task queue and worker; the worker is
stopped with SIGTERM (warm shutdown) and must exit by itself."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import celeryapp
from amqpclient import unique

pytestmark = pytest.mark.amqp

HERE = Path(__file__).resolve().parent
RESULT_TIMEOUT = 30.0
WORKER_READY_TIMEOUT = 30.0
WORKER_STOP_TIMEOUT = 15.0


class Worker:
    def __init__(self, broker_url: str, task_queue: str, log_path: Path):
        self.log_path = log_path
        self.lines: queue.Queue[str] = queue.Queue()
        env = dict(os.environ, INTEROP_CELERY_BROKER=broker_url, INTEROP_CELERY_QUEUE=task_queue,
                   PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
        self.cmd = [sys.executable, "-m", "celery", "-A", "celeryapp", "worker", "--pool=solo", "-c", "1",
                    "-Q", task_queue, "-n", f"{unique('interop')}@%h", "--without-gossip", "--without-mingle",
                    "--without-heartbeat", "-l", "INFO"]
        self.proc = subprocess.Popen(self.cmd, cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self):
        with open(self.log_path, "a") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                self.lines.put(line)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float = WORKER_READY_TIMEOUT) -> None:
        """Until the worker logs "celery@<name> ready." (it is then consuming)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"celery worker not ready within {timeout}s\n{self.log()}")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise AssertionError(f"celery worker exited with {self.proc.returncode}\n{self.log()}") from None
                continue
            if " ready." in line:
                return

    def stop(self) -> int:
        """Warm shutdown (SIGTERM): finishes the current task, closes its
        connections, exits.  SIGKILL only if it does not within the bound."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=WORKER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
                raise AssertionError(f"celery worker ignored SIGTERM for {WORKER_STOP_TIMEOUT}s\n{self.log()}")
        self._reader.join(timeout=5)
        return self.proc.returncode


@pytest.fixture
def celery(amqp_addr, tmp_path):
    """(app, worker): the client app and a ready worker on a queue of the test's own."""
    broker_url = f"amqp://guest:guest@{amqp_addr[0]}:{amqp_addr[1]}//"
    task_queue = unique("celery")
    app = celeryapp.make_app(broker_url, task_queue)
    worker = Worker(broker_url, task_queue, tmp_path / "celery-worker.log")
    try:
        worker.wait_ready()
        yield app, worker
        rc = worker.stop()
        assert rc == 0, f"celery worker exit code {rc} after warm shutdown\n{worker.log()}"
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(timeout=5)
        app.close()


def test_task_round_trip(celery):
    app, worker = celery
    add = app.tasks["celeryapp.add"]
    r = add.delay(2, 3)
    assert r.get(timeout=RESULT_TIMEOUT) == 5
    assert r.state == "SUCCESS" and r.successful()
    # A few more, in flight together.
    results = [add.delay(i, i) for i in range(10)]
    assert [x.get(timeout=RESULT_TIMEOUT) for x in results] == [2 * i for i in range(10)]
    assert "Task celeryapp.add[" in worker.log() and "succeeded" in worker.log()


def test_task_failure(celery):
    app, _worker = celery
    r = app.tasks["celeryapp.fail"].delay("boom")
    with pytest.raises(ValueError, match="boom"):
        r.get(timeout=RESULT_TIMEOUT)
    assert r.state == "FAILURE" and r.failed()
    assert isinstance(r.result, ValueError) and str(r.result) == "boom"
    assert "ValueError" in (r.traceback or "")


def test_task_retried_then_succeeds(celery):
    app, worker = celery
    r = app.tasks["celeryapp.flaky"].delay(2)
    assert r.get(timeout=RESULT_TIMEOUT) == 2, "succeeded on the third attempt (2 retries)"
    assert r.state == "SUCCESS"
    assert worker.log().count("Retry in") == 2


def test_apply_async_options_and_send_task(celery):
    """apply_async with an explicit task id and headers, and send_task by name (a
    client without the task code)."""
    app, _worker = celery
    r = app.tasks["celeryapp.echo_headers"].apply_async(("v",), task_id="interop-fixed-id", priority=3)
    out = r.get(timeout=RESULT_TIMEOUT)
    assert out["value"] == "v" and out["task_id"] == "interop-fixed-id" and out["retries"] == 0
    assert out["delivery_info"]["routing_key"] == app.conf.task_default_queue
    assert app.send_task("celeryapp.add", (20, 22)).get(timeout=RESULT_TIMEOUT) == 42
