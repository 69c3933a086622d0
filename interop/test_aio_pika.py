"""AMQP 0-9-1 with aio-pika (asyncio, on aiormq / pamqp): connect_robust, declare,
publish with publisher confirms, consume with the async queue iterator and
message.process() acks, the RPC pattern (reply_to / correlation_id, by hand and
with aio_pika.patterns.RPC), and a robust connection surviving a broker restart.

Each test runs its coroutine with asyncio.run under an overall deadline."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import uuid

import aio_pika
import aiormq
import pamqp.commands
import pytest
from aio_pika.patterns import RPC

pytestmark = pytest.mark.amqp

DEADLINE = 30.0
TIMEOUT = 10.0


def run(coro, deadline: float = DEADLINE):
    return asyncio.run(asyncio.wait_for(coro, deadline))


async def connect(url: str, **kw) -> aio_pika.abc.AbstractRobustConnection:
    return await aio_pika.connect_robust(url, timeout=5, **kw)


def test_connect_declare_publish_confirm_consume(amqp_url, names):
    xname, qname = names("x"), names("q")

    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()  # publisher confirms on by default
            x = await ch.declare_exchange(xname, aio_pika.ExchangeType.DIRECT)
            q = await ch.declare_queue(qname)
            await q.bind(x, routing_key="jobs")
            for i in range(20):
                confirm = await x.publish(
                    aio_pika.Message(f"job-{i}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key="jobs")
                assert isinstance(confirm, pamqp.commands.Basic.Ack), confirm
            got = []
            async with q.iterator() as it:
                async for message in it:
                    async with message.process():  # acks on leaving the block
                        got.append((message.body, message.routing_key, message.exchange, message.redelivered))
                    if len(got) == 20:
                        break
            assert [g[0] for g in got] == [f"job-{i}".encode() for i in range(20)]
            assert {g[1:] for g in got} == {("jobs", xname, False)}
            again = await ch.declare_queue(qname, passive=True)
            assert again.declaration_result.message_count == 0, "every message was acked"

    run(main())


def test_properties_and_headers_round_trip(amqp_url, names):
    """pamqp's field-table encoding (it has floats, which pika cannot send) kept
    value for value."""
    qname = names("q")
    headers = {"float": 1.5, "int": 7, "big": 2**40, "neg": -3, "str": "ü", "bool": True, "list": [1, "a"],
               "table": {"k": "v"}, "dec": decimal.Decimal("1.23"),
               "ts": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc), "void": None}

    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(qname)
            await ch.default_exchange.publish(aio_pika.Message(
                b"props", headers=headers, content_type="text/plain", content_encoding="utf-8",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT, priority=4, correlation_id="c-1", reply_to="r-1",
                expiration=60, message_id="m-1", timestamp=datetime.datetime(2024, 5, 6, tzinfo=datetime.timezone.utc),
                type="t", user_id="guest", app_id="aio"), routing_key=qname)
            m = await q.get(timeout=TIMEOUT)
            await m.ack()
            assert m.body == b"props"
            assert m.headers == headers
            assert (m.content_type, m.content_encoding, m.priority, m.correlation_id, m.reply_to) == (
                "text/plain", "utf-8", 4, "c-1", "r-1")
            assert m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            assert m.expiration == 60  # seconds in aio-pika; "60000" on the wire
            assert (m.message_id, m.type, m.user_id, m.app_id) == ("m-1", "t", "guest", "aio")
            assert m.timestamp == datetime.datetime(2024, 5, 6, tzinfo=datetime.timezone.utc)

    run(main())


def test_mandatory_unroutable_is_returned(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel(on_return_raises=True)
            key = names("nowhere")
            with pytest.raises(aiormq.exceptions.PublishError) as ei:
                await ch.default_exchange.publish(aio_pika.Message(b"x"), routing_key=key, mandatory=True)
            frame = ei.value.frame
            assert (frame.reply_code, frame.reply_text, frame.routing_key) == (312, "NO_ROUTE", key)
            # Without on_return_raises the returned message is handed back instead.
            ch2 = await conn.channel()
            r = await ch2.default_exchange.publish(aio_pika.Message(b"y"), routing_key=key, mandatory=True)
            assert isinstance(r.delivery, pamqp.commands.Basic.Return) and r.body == b"y"

    run(main())


def test_nack_requeue_and_reject(amqp_url, names):
    qname = names("q")

    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=10)
            q = await ch.declare_queue(qname)
            for body in (b"retry", b"drop"):
                await ch.default_exchange.publish(aio_pika.Message(body), routing_key=qname)
            seen = []
            async with q.iterator() as it:
                async for m in it:
                    seen.append((m.body, m.redelivered))
                    if m.body == b"retry" and not m.redelivered:
                        await m.nack(requeue=True)
                    elif m.body == b"drop":
                        await m.reject(requeue=False)
                        await ch.default_exchange.publish(aio_pika.Message(b"fence"), routing_key=qname)
                    else:
                        await m.ack()
                    if m.body == b"fence":
                        break
            assert (b"retry", False) in seen and (b"retry", True) in seen
            assert seen.count((b"drop", False)) == 1 and seen[-1] == (b"fence", False)
            assert len(seen) == 4

    run(main())


def test_process_context_requeues_on_exception(amqp_url, names):
    """message.process(requeue=True): an exception inside the block rejects with
    requeue, the message comes back redelivered."""
    qname = names("q")

    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(qname)
            await ch.default_exchange.publish(aio_pika.Message(b"flaky"), routing_key=qname)
            attempts = []
            async with q.iterator() as it:
                async for m in it:
                    try:
                        async with m.process(requeue=True):
                            attempts.append(m.redelivered)
                            if len(attempts) == 1:
                                raise RuntimeError("first attempt fails")
                    except RuntimeError:
                        continue
                    break
            assert attempts == [False, True]

    run(main())


def test_rpc_with_reply_to_and_correlation_id(amqp_url, names):
    """The classic RPC pattern: requests to a named queue, replies through the
    default exchange to the client's exclusive reply queue, matched on
    correlation_id; several calls in flight at once."""
    rpc_queue = names("rpc")

    async def main():
        async with await connect(amqp_url) as server_conn, await connect(amqp_url) as client_conn:
            sch = await server_conn.channel()
            requests = await sch.declare_queue(rpc_queue)

            async def serve(message: aio_pika.abc.AbstractIncomingMessage):
                async with message.process():
                    n = int(message.body)
                    await sch.default_exchange.publish(
                        aio_pika.Message(str(n * n).encode(), correlation_id=message.correlation_id),
                        routing_key=message.reply_to)

            await requests.consume(serve)

            cch = await client_conn.channel()
            callback = await cch.declare_queue(exclusive=True, auto_delete=True)
            futures: dict[str, asyncio.Future] = {}

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage):
                async with message.process():
                    futures.pop(message.correlation_id).set_result(int(message.body))

            await callback.consume(on_reply)
            loop = asyncio.get_running_loop()

            async def call(n: int) -> int:
                corr = str(uuid.uuid4())
                fut = futures[corr] = loop.create_future()
                await cch.default_exchange.publish(
                    aio_pika.Message(str(n).encode(), correlation_id=corr, reply_to=callback.name),
                    routing_key=rpc_queue)
                return await asyncio.wait_for(fut, TIMEOUT)

            results = await asyncio.gather(*(call(n) for n in range(10)))
            assert results == [n * n for n in range(10)]
            assert not futures

    run(main())


def test_aio_pika_patterns_rpc(amqp_url):
    """aio_pika.patterns.RPC: a headers exchange as dead-letter exchange, mandatory
    publishes, an exclusive result queue (what applications using the pattern
    need from the broker)."""

    async def multiply(*, x, y):
        return x * y

    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            rpc = await RPC.create(ch)
            method = f"multiply_{uuid.uuid4().hex[:8]}"
            await rpc.register(method, multiply, auto_delete=True)
            assert await asyncio.wait_for(rpc.call(method, kwargs=dict(x=6, y=7)), TIMEOUT) == 42
            results = await asyncio.gather(*(rpc.call(method, kwargs=dict(x=i, y=2)) for i in range(5)))
            assert results == [0, 2, 4, 6, 8]
            await rpc.close()

    run(main())


def test_connect_robust_recovers_after_broker_restart(broker, amqp_url, names):
    """A robust connection reconnects after the broker restarts, redeclares its
    queue and binding and resumes its consumer (RabbitMQ: stop_app closes the
    connection with 320 CONNECTION_FORCED; the transient queue is gone after the
    restart and comes back through the client's redeclare)."""
    xname, qname = names("x"), names("q")

    async def main():
        conn = await connect(amqp_url, reconnect_interval=0.2)
        try:
            reconnected = asyncio.Event()
            conn.reconnect_callbacks.add(lambda *_: reconnected.set())
            ch = await conn.channel()
            x = await ch.declare_exchange(xname, aio_pika.ExchangeType.FANOUT, durable=True)
            q = await ch.declare_queue(qname, auto_delete=False)
            await q.bind(x)
            got: asyncio.Queue = asyncio.Queue()

            async def on_message(m):
                async with m.process():
                    await got.put(m.body)

            await q.consume(on_message)
            await x.publish(aio_pika.Message(b"before"), routing_key="")
            assert await asyncio.wait_for(got.get(), TIMEOUT) == b"before"

            # Restarted from the event loop's own (main) thread, blocking it for the
            # restart: a FerryMQ started from a worker thread would get its
            # die-with-parent SIGTERM when that thread ends.  The client notices the
            # closed connection once the loop runs again.
            broker.restart()
            await asyncio.wait_for(reconnected.wait(), 20)
            # The robust channel replays declare / bind / consume on reconnect.
            await x.publish(aio_pika.Message(b"after"), routing_key="")
            assert await asyncio.wait_for(got.get(), TIMEOUT) == b"after"
        finally:
            await conn.close()

    run(main(), deadline=60)
