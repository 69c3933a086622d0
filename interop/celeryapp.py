"""The Celery application of test_celery.py.

The worker is a real ``celery -A celeryapp worker`` process; it reads the broker
URL and its queue from the environment (INTEROP_CELERY_BROKER,
INTEROP_CELERY_QUEUE).  The test process builds its own app with make_app() and
the same task names.  Results use the ``rpc://`` backend, so they travel back
over AMQP too (a reply queue of the client's, correlation id = task id)."""

from __future__ import annotations

import os

from celery import Celery


def make_app(broker_url: str, queue: str) -> Celery:
    app = Celery("celeryapp", broker=broker_url, backend="rpc://")
    app.conf.update(
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # Fail, don't retry for minutes, when the broker is not there.
        broker_connection_retry=False,
        broker_connection_retry_on_startup=False,
        broker_connection_max_retries=0,
        broker_connection_timeout=5,
        broker_pool_limit=2,
        # AMQP heartbeats on (py-amqp sends them, the broker must accept them) but
        # short: the worker's event loop wakes on the heartbeat timer (every
        # heartbeat/2 s, at most 10 s with the default 120 s), which bounds how fast
        # it notices SIGTERM and, with a prefetch window of 1, the next message.
        broker_heartbeat=4,
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        result_expires=None,
    )

    @app.task(name="celeryapp.add", shared=False)
    def add(x, y):
        return x + y

    @app.task(name="celeryapp.fail", shared=False)
    def fail(message):
        raise ValueError(message)

    @app.task(name="celeryapp.flaky", bind=True, max_retries=5, shared=False)
    def flaky(self, failures):
        """Fails `failures` times (each time retried at once), then returns how many
        retries it took."""
        if self.request.retries < failures:
            raise self.retry(exc=RuntimeError(f"attempt {self.request.retries}"), countdown=0)
        return self.request.retries

    @app.task(name="celeryapp.echo_headers", bind=True, shared=False)
    def echo_headers(self, value):
        return {"value": value, "task_id": self.request.id, "retries": self.request.retries,
                "delivery_info": {k: self.request.delivery_info.get(k) for k in ("exchange", "routing_key")}}

    return app


# For the worker process (`celery -A celeryapp worker`).  The default URL points at
# port 1 on purpose (nothing listens there): the test always sets the variable.
app = make_app(os.environ.get("INTEROP_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:1//"),
               os.environ.get("INTEROP_CELERY_QUEUE", "interop-celery"))
