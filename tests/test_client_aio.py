"""The asyncio clients (AsyncProducer, AsyncConsumer) against a real name server and broker (``tests/procs.py``).

One name server and broker serve the module; every test has its own topics and groups.  Each test drives
its clients with ``asyncio.run``; waits inside the loop poll with ``asyncio.sleep`` (a blocking wait would
stop the very consumers it waits for).  Intervals are shortened through :func:`procs.fast_client_config`.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from procs import fast_client_config, route_has, wait_until
from sparkmq.platform.client import (
    AdminClient,
    AsyncConsumer,
    AsyncProducer,
    ClientConfig,
    ConsumeStatus,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SendResult,
    SendStatus,
)
from sparkmq.platform.common.errors import ErrorCode, SparkMQError

pytestmark = [pytest.mark.timeout(90)]


@dataclass
class Platform:
    """The module's name server and broker, with an admin client."""

    ns: Any
    broker: Any
    admin: AdminClient
    tmp: Path

    def config(self, **kw: Any) -> ClientConfig:
        return fast_client_config(self.ns.addr, self.tmp / "offsets", **kw)

    def create_topic(self, topic: str, queues: int = 4) -> None:
        self.admin.create_topic(topic, queues, queues)
        wait_until(lambda: route_has(self.admin, topic, queues), what=f"route of {topic}")

    def max_offsets(self, topic: str) -> dict[MessageQueue, int]:
        return {MessageQueue(topic, s.broker_name, s.queue_id): s.max_offset for s in self.admin.topic_stats(topic)}


@pytest.fixture(scope="module")
def platform(module_procs: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    tmp = tmp_path_factory.mktemp("aio")
    ns, broker = module_procs.start_platform(tmp / "b")
    admin = AdminClient(ClientConfig(namesrv_addrs=ns.addr))
    yield Platform(ns, broker, admin, tmp)
    admin.close()


async def until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """``wait_until`` for code on the loop: polls without blocking it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value: {value!r:.300}")
        await asyncio.sleep(0.05)


async def take(consumer: AsyncConsumer, n: int, timeout: float = 15.0) -> list[ReceivedMessage]:
    """The next ``n`` messages of ``consumer`` (``async for``, then break: the last one stays in hand)."""
    got: list[ReceivedMessage] = []

    async def run() -> None:
        async for message in consumer:
            got.append(message)
            if len(got) >= n:
                break
    try:
        await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        raise AssertionError(f"got {len(got)} of {n} messages in {timeout} s: {[m.body for m in got]}") from None
    return got


async def collect_forever(consumer: AsyncConsumer, into: list[ReceivedMessage]) -> None:
    async for message in consumer:
        into.append(message)


def assert_same(sent: Message, result: SendResult, got: ReceivedMessage) -> None:
    """A received message carries what was sent, where the send result said it went."""
    assert got.msg_id == result.msg_id
    assert (got.topic, got.body, got.tags, got.keys, got.user_properties) == (
        sent.topic, sent.body, sent.tags, tuple(sent.keys), dict(sent.properties))
    assert (got.broker_name, got.queue_id, got.queue_offset, got.offset_msg_id) == (
        result.broker_name, result.queue_id, result.queue_offset, result.offset_msg_id)


def _client_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("sparkmq-")}


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run an async test body; it starts no client thread that outlives it (the asyncio clients start none)."""
    before = _client_threads()
    result = asyncio.run(coro_fn())
    wait_until(lambda: not _client_threads() - before, timeout=5,
               what=lambda: f"client threads to stop: {sorted(t.name for t in _client_threads() - before)}")
    return result


# -- producing and consuming -----------------------------------------------------------------

@pytest.mark.cluster
def test_sends_and_batches_arrive_once_with_equal_fields(platform: Platform) -> None:
    topic = "aio-roundtrip"
    platform.create_topic(topic)

    async def main() -> None:
        consumer = AsyncConsumer("acg-all", platform.config(), consume_from_where="FIRST_OFFSET")
        consumer.subscribe(topic)
        tagged = AsyncConsumer("acg-tags", platform.config(), consume_from_where="FIRST_OFFSET")
        tagged.subscribe(topic, "A || C")
        async with consumer, tagged, AsyncProducer("apg", platform.config()) as producer:
            assert len(consumer.assignment()) == 4                    # held before start() returned
            sent: list[tuple[Message, SendResult]] = []
            for i in range(12):
                m = Message(topic, f"single-{i}".encode(), tags="ABC"[i % 3], keys=(f"k{i}", "common"),
                            properties={"n": str(i), "kind": "single"})
                sent.append((m, await producer.send(m)))
            big = Message(topic, b"0123456789abcdef" * 1024, tags="A")   # 16 KiB: compressed on the wire
            sent.append((big, await producer.send(big)))
            ordered = [Message(topic, f"ordered-{i}".encode(), tags="B") for i in range(4)]
            results = [await producer.send(m, sharding_key="customer-7") for m in ordered]
            assert len({r.queue_id for r in results}) == 1
            sent += zip(ordered, results, strict=True)
            # Concurrent sends from many tasks share the connection.
            many = [Message(topic, f"gather-{i}".encode(), tags="C") for i in range(20)]
            sent += zip(many, await asyncio.gather(*(producer.send(m) for m in many)), strict=True)
            batch = [Message(topic, f"batch-{i}".encode(), tags="ABC"[i % 3], keys=(f"b{i}",),
                             properties={"i": str(i)}) for i in range(10)]
            batch_results = await producer.send_batch(batch)
            assert len({(r.broker_name, r.queue_id) for r in batch_results}) == 1
            first = batch_results[0].queue_offset
            assert [r.queue_offset for r in batch_results] == list(range(first, first + 10))
            assert all(r.status is SendStatus.SEND_OK for r in batch_results)
            assert len({r.msg_id for r in batch_results}) == 10
            sent += zip(batch, batch_results, strict=True)
            big_batch = [Message(topic, bytes([65 + i]) * 5000, tags="A") for i in range(3)]   # compressed batch
            sent += zip(big_batch, await producer.send_batch(big_batch, sharding_key="k"), strict=True)

            got = await take(consumer, len(sent))
            assert await consumer.receive(timeout=1.0) is None        # nothing twice
            by_id = {m.msg_id: m for m in got}
            assert len(by_id) == len(got) == len(sent)
            for message, result in sent:
                assert_same(message, result, by_id[result.msg_id])

            matching = [(m, r) for m, r in sent if m.tags in ("A", "C")]
            got_tagged = await take(tagged, len(matching))
            assert await tagged.receive(timeout=1.0) is None
            assert sorted(m.msg_id for m in got_tagged) == sorted(r.msg_id for _, r in matching)

            maxima = platform.max_offsets(topic)
            committed = await consumer.commit()                        # the last one yielded counts as consumed
            assert {mq: o for mq, o in committed.items() if mq.topic == topic} == maxima
            assert set(committed) - set(maxima) <= {q for q in consumer.assignment(include_retry=True)
                                                    if q.topic == "%RETRY%acg-all"}, "and the group's retry queue"
            assert platform.admin.group_offsets("acg-all", topic) == maxima
            # Messages filtered out by tag still move the committed offsets.
            await tagged.commit()
            assert platform.admin.group_offsets("acg-tags", topic) == maxima
            assert platform.admin.group_members("acg-all") == [consumer.client_id]
        assert platform.admin.group_members("acg-all") == []          # shutdown unregistered

    run(main)


@pytest.mark.cluster
def test_a_delay_asked_by_a_property_parks_the_single_send(platform: Platform) -> None:
    # send() packs a message as a batch of one, which the broker refuses to park: a delay property must take the
    # other path (SEND_MESSAGE_V2), as it does for RocketMQ's clients, and be honoured.
    topic = "aio-delay-property"
    platform.create_topic(topic)

    async def main() -> None:
        consumer = AsyncConsumer("acg-delay", platform.config(), consume_from_where="FIRST_OFFSET")
        consumer.subscribe(topic)
        async with consumer, AsyncProducer("apg-delay", platform.config()) as producer:
            delayed = await producer.send(Message(topic, b"later", properties={"DELAY": "1"}))  # level 1: 1 s
            at_once = await producer.send(Message(topic, b"now"))
            first, second = await take(consumer, 2)
            assert (first.msg_id, first.body) == (at_once.msg_id, b"now")
            assert (second.msg_id, second.body, second.topic) == (delayed.msg_id, b"later", topic)
            assert second.properties["DELAY"] == "1"
            assert second.store_timestamp - second.born_timestamp >= 900, "stored again when the level was due"

    run(main)


@pytest.mark.cluster
def test_two_consumers_split_the_queues_and_a_join_rebalances_through_the_pushed_notice(platform: Platform) -> None:
    topic = "aio-pair"
    platform.create_topic(topic)
    # Periodic rebalances and heartbeats far beyond the test's waits: only the broker's pushed
    # NOTIFY_CONSUMER_IDS_CHANGED can explain the quick changes of assignment below.
    slow = platform.config(rebalance_interval_s=120.0, heartbeat_interval_s=120.0)

    async def main() -> None:
        c1 = AsyncConsumer("acg-pair", slow, consume_from_where="FIRST_OFFSET")
        c2 = AsyncConsumer("acg-pair", slow, consume_from_where="FIRST_OFFSET")
        for c in (c1, c2):
            c.subscribe(topic)
        got1: list[ReceivedMessage] = []
        got2: list[ReceivedMessage] = []
        async with c1:
            assert len(c1.assignment()) == 4
            reader1 = asyncio.create_task(collect_forever(c1, got1))
            await c2.start()
            try:
                assert len(c2.assignment()) == 2                     # its own first rebalance
                begin = time.monotonic()
                await until(lambda: len(c1.assignment()) == 2, timeout=3.0, what="c1 to give up two queues")
                assert time.monotonic() - begin < 3.0
                assert not set(c1.assignment()) & set(c2.assignment())
                reader2 = asyncio.create_task(collect_forever(c2, got2))
                async with AsyncProducer("apg", platform.config()) as producer:
                    sent = {(await producer.send(Message(topic, f"p{i}".encode()))).msg_id for i in range(40)}
                await until(lambda: len(got1) + len(got2) >= 40, what="40 messages between the two")
                await asyncio.sleep(0.5)                              # room for a duplicate to show up
                ids1, ids2 = [m.msg_id for m in got1], [m.msg_id for m in got2]
                assert len(ids1) + len(ids2) == 40 and set(ids1) | set(ids2) == sent
                assert ids1 and ids2 and not set(ids1) & set(ids2)
                assert {m.queue_id for m in got1} == {q.queue_id for q in c1.assignment()}
            finally:
                await c2.shutdown()
            await reader2                                             # shutdown ends its async for
            # c2 left (it unregistered): the pushed notice gives c1 every queue.
            await until(lambda: len(c1.assignment()) == 4, timeout=3.0, what="c1 to take every queue")
            async with AsyncProducer("apg", platform.config()) as producer:
                await producer.send(Message(topic, b"after-leave"))
            await until(lambda: any(m.body == b"after-leave" for m in got1), what="c1 to get the new message")
        await reader1

    run(main)


@pytest.mark.cluster
def test_commits_survive_a_restart(platform: Platform) -> None:
    topic = "aio-restart"
    platform.create_topic(topic, queues=1)
    mq = MessageQueue(topic, "broker-a", 0)

    async def main() -> None:
        async with AsyncProducer("apg", platform.config()) as producer:
            for i in range(10):
                await producer.send(Message(topic, f"m{i}".encode()))

            # The handler fails on the sixth message: leaving ``async with`` on that exception
            # commits the five before it, not the one being handled.
            first = AsyncConsumer("acg-restart", platform.config(), consume_from_where="FIRST_OFFSET")
            first.subscribe(topic)
            seen: list[bytes] = []
            with pytest.raises(RuntimeError):
                async with first:
                    async for message in first:
                        seen.append(message.body)
                        if len(seen) == 6:
                            raise RuntimeError("handler failed")
            assert seen == [f"m{i}".encode() for i in range(6)]
            assert platform.admin.group_offsets("acg-restart", topic) == {mq: 5}

            for i in range(10, 13):
                await producer.send(Message(topic, f"m{i}".encode()))
            second = AsyncConsumer("acg-restart", platform.config(), consume_from_where="FIRST_OFFSET",
                                   auto_commit=False)
            second.subscribe(topic)
            async with second:
                got = await take(second, 8)
                assert [m.body for m in got] == [f"m{i}".encode() for i in range(5, 13)]
                assert await second.receive(timeout=0.5) is None
                assert platform.admin.group_offsets("acg-restart", topic) == {mq: 5}   # no auto-commit
            assert platform.admin.group_offsets("acg-restart", topic) == {mq: 13}      # shutdown committed

            third = AsyncConsumer("acg-restart", platform.config(), consume_from_where="FIRST_OFFSET")
            third.subscribe(topic)
            async with third:
                assert await third.receive(timeout=1.0) is None       # nothing committed is replayed
                await producer.send(Message(topic, b"m13"))
                got = await take(third, 1)
                assert got[0].body == b"m13" and got[0].queue_offset == 13
                # Auto-commit (every 0.2 s here) counts a message once the next one is asked for.
                assert await third.receive(timeout=0.5) is None
                await until(lambda: platform.admin.group_offsets("acg-restart", topic) == {mq: 14},
                            what="offset 14 auto-committed")

    run(main)


# -- with the threaded clients -------------------------------------------------------------

@pytest.mark.cluster
def test_threaded_and_async_clients_interoperate(platform: Platform) -> None:
    topic = "aio-interop"
    platform.create_topic(topic)

    # AsyncProducer -> threaded PushConsumer
    got: list[ReceivedMessage] = []
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with lock:
            got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    push = PushConsumer("tcg-interop", platform.config(), consume_from_where="FIRST_OFFSET")
    push.subscribe(topic)
    push.register_listener(listener)
    push.start()
    try:
        async def produce() -> list[tuple[Message, SendResult]]:
            async with AsyncProducer("apg", platform.config()) as producer:
                singles = [Message(topic, f"a{i}".encode(), tags="T", keys=(f"k{i}",), properties={"i": str(i)})
                           for i in range(10)]
                out = [(m, await producer.send(m)) for m in singles]
                batch = [Message(topic, f"ab{i}".encode(), tags="U") for i in range(10)]
                return out + list(zip(batch, await producer.send_batch(batch), strict=True))
        sent = asyncio.run(produce())    # the push consumer's own threads live on meanwhile
        wait_until(lambda: len(got) >= len(sent), what="the push consumer to get every message")
        with lock:
            by_id = {m.msg_id: m for m in got}
            assert len(by_id) == len(got) == len(sent)
        for message, result in sent:
            assert_same(message, result, by_id[result.msg_id])
    finally:
        push.shutdown()

    # threaded Producer -> AsyncConsumer
    with Producer("tpg", platform.config()) as producer:
        singles = [Message(topic, f"t{i}".encode(), tags="V", keys=(f"t{i}",), properties={"x": "y"})
                   for i in range(10)]
        sent = [(m, producer.send(m)) for m in singles]
        batch = [Message(topic, f"tb{i}".encode(), tags="W") for i in range(10)]
        sent += zip(batch, producer.send_batch(batch), strict=True)

    async def consume() -> None:
        consumer = AsyncConsumer("acg-interop", platform.config(), consume_from_where="FIRST_OFFSET")
        consumer.subscribe(topic, "V || W")                           # leaves the first half out
        async with consumer:
            received = await take(consumer, len(sent))
            assert await consumer.receive(timeout=1.0) is None
        by_id = {m.msg_id: m for m in received}
        assert len(by_id) == len(sent)
        for message, result in sent:
            assert_same(message, result, by_id[result.msg_id])
    run(consume)


@pytest.mark.cluster
def test_an_async_member_consumes_its_groups_retry_topic(platform: Platform) -> None:
    """The asyncio consumer holds its share of ``%RETRY%<group>`` as threaded members do, so a message sent
    back to the group (here re-sent through the admin API) reaches it, shown with its original topic."""
    topic, group = "aio-retry", "acg-retry"
    platform.create_topic(topic, 1)
    with Producer("tpg-retry", platform.config()) as producer:
        sent = producer.send(Message(topic, b"again", tags="R"))

    async def consume() -> None:
        consumer = AsyncConsumer(group, platform.config(), consume_from_where="FIRST_OFFSET")
        consumer.subscribe(topic)
        async with consumer:
            assert [m.body for m in await take(consumer, 1)] == [b"again"]
            await until(lambda: [q for q in consumer.assignment(include_retry=True) if q.topic == f"%RETRY%{group}"],
                        20, "the group's retry queue held")
            assert [q.topic for q in consumer.assignment()] == [topic], "the retry topic is plumbing"
            await asyncio.to_thread(platform.admin.resend, sent.offset_msg_id, group)
            again = await take(consumer, 1)
        assert (again[0].topic, again[0].body, again[0].tags) == (topic, b"again", "R")
    run(consume)


# -- without a cluster ---------------------------------------------------------------------

def test_remoting_only_and_lifecycle_errors(tmp_path: Path) -> None:
    config = fast_client_config("127.0.0.1:1", tmp_path)
    with pytest.raises(SparkMQError) as refused:
        AsyncProducer("apg", fast_client_config("127.0.0.1:1", tmp_path, transport="http"))
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT and "remoting only" in str(refused.value)

    async def main() -> None:
        producer = AsyncProducer("apg", config)
        with pytest.raises(SparkMQError) as not_started:
            await producer.send(Message("t", b"x"))
        assert not_started.value.code is ErrorCode.SERVICE_NOT_AVAILABLE
        async with producer:
            # A broker whose route names no remoting endpoint: a clear, retryable error.
            with pytest.raises(SparkMQError) as no_endpoint:
                producer._endpoint("127.0.0.1:9")
            assert no_endpoint.value.code is ErrorCode.SERVICE_NOT_AVAILABLE
            assert "no remoting endpoint" in str(no_endpoint.value)
            with pytest.raises(SparkMQError) as empty:
                await producer.send_batch([])
            assert empty.value.code is ErrorCode.MESSAGE_ILLEGAL
        consumer = AsyncConsumer("acg", config)
        with pytest.raises(SparkMQError):
            await consumer.start()                                    # subscribes to nothing
        with pytest.raises(SparkMQError):
            await consumer.__anext__()                                # not started
    run(main)
