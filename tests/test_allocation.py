"""Consumer queue allocation strategies: pure logic, checked with properties and examples."""
from __future__ import annotations

import dataclasses
import doctest
import json
import logging
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sparkmq.platform.client.allocation as allocation_module
from sparkmq.platform.client.allocation import (
    STRATEGIES,
    AllocateAveragely,
    AllocateAveragelyByCircle,
    AllocateConsistentHash,
    AllocateStrategy,
    MessageQueue,
    strategy_by_name,
)
from sparkmq.platform.common.errors import ErrorCode, SparkMQError

GROUP = "test_group"
STRATEGY_NAMES = sorted(STRATEGIES)


def queues_of(*counts: int, topic: str = "TopicTest") -> list[MessageQueue]:
    """``counts[i]`` queues on broker ``broker-<letter i>``."""
    return [MessageQueue(topic, f"broker-{chr(ord('a') + b)}", q) for b, n in enumerate(counts) for q in range(n)]


def assignment(strategy: AllocateStrategy, queues: list[MessageQueue], consumers: list[str]) -> dict[str, list]:
    """Every member's share, each computed from the same views as a member would."""
    return {cid: strategy.allocate(GROUP, cid, queues, consumers) for cid in consumers}


def owner_map(assigned: dict[str, list[MessageQueue]]) -> dict[MessageQueue, str]:
    return {q: cid for cid, qs in assigned.items() for q in qs}


# Up to 4 brokers with up to 16 queues each (0..64 in all); up to 10 members with
# arbitrary (non-empty) ids, so sorting is exercised on odd characters too.
broker_counts = st.lists(st.integers(0, 16), min_size=1, max_size=4)
consumer_ids = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=10, unique=True)
topics = st.sampled_from(["TopicTest", "orders", "%RETRY%group_a"])


# ---------------------------------------------------------------------------
# MessageQueue
# ---------------------------------------------------------------------------

def test_message_queue_orders_by_broker_then_queue_then_topic() -> None:
    qs = [MessageQueue("z", "broker-a", 2), MessageQueue("a", "broker-b", 0), MessageQueue("b", "broker-a", 10),
          MessageQueue("a", "broker-a", 2), MessageQueue("m", "broker-a", 0)]
    assert [(q.broker_name, q.queue_id, q.topic) for q in sorted(qs)] == [
        ("broker-a", 0, "m"), ("broker-a", 2, "a"), ("broker-a", 2, "z"), ("broker-a", 10, "b"), ("broker-b", 0, "a")]
    assert MessageQueue("t", "broker-a", 1) < MessageQueue("t", "broker-a", 2) <= MessageQueue("t", "broker-b", 0)
    assert MessageQueue("t", "broker-b", 0) > MessageQueue("t", "broker-a", 9)


def test_message_queue_is_frozen_hashable_and_keyed() -> None:
    q = MessageQueue("TopicTest", "broker-a", 3)
    assert q.key == "broker-a/3"
    assert q == MessageQueue("TopicTest", "broker-a", 3)
    assert len({q, MessageQueue("TopicTest", "broker-a", 3), MessageQueue("Other", "broker-a", 3)}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.queue_id = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        _ = q < "broker-a/4"  # type: ignore[operator]


@pytest.mark.parametrize("args", [("", "b", 0), ("t", "", 0), ("t", "b", -1), ("t", "b", True), ("t", "b", "1")])
def test_message_queue_rejects_bad_fields(args: tuple) -> None:
    with pytest.raises(SparkMQError) as info:
        MessageQueue(*args)
    assert info.value.code is ErrorCode.INVALID_ARGUMENT


# ---------------------------------------------------------------------------
# Properties shared by every strategy
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", STRATEGY_NAMES)
@settings(max_examples=80, deadline=None)
@given(counts=broker_counts, consumers=consumer_ids, topic=topics, data=st.data())
def test_every_queue_to_exactly_one_member_whatever_the_input_order(
        name: str, counts: list[int], consumers: list[str], topic: str, data: st.DataObject) -> None:
    strategy = strategy_by_name(name)
    queues = queues_of(*counts, topic=topic)
    results = {}
    for cid in consumers:
        # Each member sees the views in its own (arbitrary) order, twice over.
        first = strategy.allocate(GROUP, cid, data.draw(st.permutations(queues)), data.draw(st.permutations(consumers)))
        again = strategy.allocate(GROUP, cid, data.draw(st.permutations(queues)), data.draw(st.permutations(consumers)))
        assert first == again
        assert first == sorted(first)
        results[cid] = first
    allocated = [q for share in results.values() for q in share]
    assert len(allocated) == len(set(allocated)), "a queue went to two members"
    assert set(allocated) == set(queues), "the union is not exactly all queues"


@pytest.mark.parametrize("name", ["averagely", "averagely-by-circle"])
@settings(max_examples=60, deadline=None)
@given(counts=broker_counts, consumers=consumer_ids)
def test_even_strategies_sizes_differ_by_at_most_one(name: str, counts: list[int], consumers: list[str]) -> None:
    queues = queues_of(*counts)
    sizes = [len(share) for share in assignment(strategy_by_name(name), queues, consumers).values()]
    assert max(sizes) - min(sizes) <= 1
    # Members are served in sorted-id order: the larger shares go to the first ids.
    by_id = [len(assignment(strategy_by_name(name), queues, consumers)[c]) for c in sorted(consumers)]
    assert by_id == sorted(by_id, reverse=True)


# ---------------------------------------------------------------------------
# averagely
# ---------------------------------------------------------------------------

def test_averagely_matches_rocketmq_example_8_queues_3_consumers() -> None:
    queues = queues_of(8)
    got = assignment(AllocateAveragely(), queues, ["c2", "c0", "c1"])
    assert {c: [q.queue_id for q in qs] for c, qs in got.items()} == {
        "c0": [0, 1, 2], "c1": [3, 4, 5], "c2": [6, 7]}


def test_averagely_blocks_follow_broker_then_queue_order() -> None:
    # 2 brokers x 4 queues, 3 members: the sorted view is a0..a3, b0..b3.
    got = assignment(AllocateAveragely(), queues_of(4, 4), ["c0", "c1", "c2"])
    assert {c: [q.key for q in qs] for c, qs in got.items()} == {
        "c0": ["broker-a/0", "broker-a/1", "broker-a/2"],
        "c1": ["broker-a/3", "broker-b/0", "broker-b/1"],
        "c2": ["broker-b/2", "broker-b/3"]}


def test_averagely_members_beyond_queue_count_get_nothing() -> None:
    got = assignment(AllocateAveragely(), queues_of(2), ["c0", "c1", "c2", "c3"])
    assert {c: [q.queue_id for q in qs] for c, qs in got.items()} == {"c0": [0], "c1": [1], "c2": [], "c3": []}
    got = assignment(AllocateAveragely(), queues_of(3), ["c0", "c1", "c2"])
    assert {c: [q.queue_id for q in qs] for c, qs in got.items()} == {"c0": [0], "c1": [1], "c2": [2]}


# ---------------------------------------------------------------------------
# averagely-by-circle
# ---------------------------------------------------------------------------

def test_by_circle_exact_mapping() -> None:
    got = assignment(AllocateAveragelyByCircle(), queues_of(3, 2), ["c1", "c0"])
    assert {c: [q.key for q in qs] for c, qs in got.items()} == {
        "c0": ["broker-a/0", "broker-a/2", "broker-b/1"],
        "c1": ["broker-a/1", "broker-b/0"]}
    got = assignment(AllocateAveragelyByCircle(), queues_of(2), ["c0", "c1", "c2"])
    assert {c: [q.queue_id for q in qs] for c, qs in got.items()} == {"c0": [0], "c1": [1], "c2": []}


# ---------------------------------------------------------------------------
# consistent-hash
# ---------------------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(counts=broker_counts, consumers=consumer_ids.filter(lambda ids: len(ids) >= 2), data=st.data())
def test_consistent_hash_removing_a_member_moves_only_its_queues(
        counts: list[int], consumers: list[str], data: st.DataObject) -> None:
    strategy = AllocateConsistentHash()
    queues = queues_of(*counts)
    gone = data.draw(st.sampled_from(consumers))
    before = owner_map(assignment(strategy, queues, consumers))
    after = owner_map(assignment(strategy, queues, [c for c in consumers if c != gone]))
    assert set(after) == set(queues)
    for q in queues:
        if before[q] != gone:
            assert after[q] == before[q], f"{q.key} moved between surviving members"
        else:
            assert after[q] != gone


@settings(max_examples=80, deadline=None)
@given(counts=broker_counts, consumers=consumer_ids, newcomer=st.text(min_size=1, max_size=12))
def test_consistent_hash_adding_a_member_only_takes_queues_from_others(
        counts: list[int], consumers: list[str], newcomer: str) -> None:
    if newcomer in consumers:
        return
    strategy = AllocateConsistentHash()
    queues = queues_of(*counts)
    before = owner_map(assignment(strategy, queues, consumers))
    after = owner_map(assignment(strategy, queues, [*consumers, newcomer]))
    assert set(after) == set(queues)
    for q in queues:
        assert after[q] in (before[q], newcomer), f"{q.key} moved between two old members"


def test_consistent_hash_spreads_queues_and_honours_virtual_nodes() -> None:
    queues = queues_of(16, 16, 16, 16)
    consumers = [f"10.0.0.{i}@{1000 + i}" for i in range(4)]
    shares = assignment(AllocateConsistentHash(), queues, consumers)
    assert all(shares.values()), "with 10 virtual nodes each, 4 members over 64 queues all get some"
    # One virtual node still covers everything, just less evenly.
    single = owner_map(assignment(AllocateConsistentHash(virtual_nodes=1), queues, consumers))
    assert set(single) == set(queues)


# A fixed case whose answer every process, machine and Python version must agree on.
_GOLDEN_QUEUES = queues_of(4, 4)
_GOLDEN_CONSUMERS = ["10.0.0.1@100", "10.0.0.2@200", "10.0.0.3@300"]


def _golden() -> dict[str, list[str]]:
    got = assignment(AllocateConsistentHash(), _GOLDEN_QUEUES, _GOLDEN_CONSUMERS)
    return {c: [q.key for q in qs] for c, qs in got.items()}


@pytest.mark.cluster
def test_consistent_hash_is_stable_across_processes_and_hash_seeds() -> None:
    code = ("import json\n"
            "from sparkmq.platform.client.allocation import AllocateConsistentHash, MessageQueue\n"
            "qs = [MessageQueue('TopicTest', f'broker-{b}', q) for b in 'ab' for q in range(4)]\n"
            "cs = ['10.0.0.1@100', '10.0.0.2@200', '10.0.0.3@300']\n"
            "s = AllocateConsistentHash()\n"
            "print(json.dumps({c: [q.key for q in s.allocate('g', c, qs, cs)] for c in cs}))\n")
    here = _golden()
    for seed in ("0", "4242"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert json.loads(out.stdout) == here
    # Pinned (md5-based), so a change of hash function shows up as a failing test,
    # not as members of a mixed-version group silently disagreeing.
    assert here == {
        "10.0.0.1@100": ["broker-a/0", "broker-a/1", "broker-a/2", "broker-a/3"],
        "10.0.0.2@200": ["broker-b/3"],
        "10.0.0.3@300": ["broker-b/0", "broker-b/1", "broker-b/2"],
    }


# ---------------------------------------------------------------------------
# Bad input and the registry
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize(("current", "queues", "consumers", "needle"), [
    ("", queues_of(2), ["c0"], "current consumer id"),
    (None, queues_of(2), ["c0"], "current consumer id"),
    ("c0", queues_of(2), ["c0", "c1", "c0"], "duplicate consumer id"),
    ("c0", [*queues_of(2), MessageQueue("TopicTest", "broker-a", 1)], ["c0"], "duplicate queue"),
    ("c0", queues_of(2), ["c0", ""], "non-empty"),
    ("c0", queues_of(2), "c0", "single string"),
    ("c0", ["broker-a/0"], ["c0"], "MessageQueue"),
])
def test_bad_input_is_invalid_argument(name: str, current, queues, consumers, needle: str) -> None:
    with pytest.raises(SparkMQError) as info:
        strategy_by_name(name).allocate(GROUP, current, queues, consumers)
    assert info.value.code is ErrorCode.INVALID_ARGUMENT
    assert needle in info.value.message


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_member_not_in_view_gets_nothing_and_logs(name: str, caplog: pytest.LogCaptureFixture) -> None:
    # RocketMQ logs and returns empty: the broker may not have our heartbeat yet.
    with caplog.at_level(logging.WARNING, logger=allocation_module.__name__):
        assert strategy_by_name(name).allocate(GROUP, "stranger", queues_of(4), ["c0", "c1"]) == []
        assert strategy_by_name(name).allocate(GROUP, "stranger", queues_of(4), []) == []
    assert "stranger" in caplog.text and GROUP in caplog.text


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_no_queues_means_nothing_to_allocate(name: str) -> None:
    assert strategy_by_name(name).allocate(GROUP, "c0", [], ["c0", "c1"]) == []


def test_registry_and_lookup() -> None:
    assert set(STRATEGIES) == {"averagely", "averagely-by-circle", "consistent-hash"}
    for name, cls in STRATEGIES.items():
        strategy = strategy_by_name(name)
        assert type(strategy) is cls and strategy.name == name
    with pytest.raises(TypeError):
        STRATEGIES["mine"] = AllocateAveragely  # type: ignore[index]
    for bad in ("average", "", None):
        with pytest.raises(SparkMQError) as info:
            strategy_by_name(bad)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.INVALID_ARGUMENT
        assert "averagely, averagely-by-circle, consistent-hash" in info.value.message


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_consistent_hash_rejects_bad_virtual_node_counts(bad) -> None:
    with pytest.raises(SparkMQError) as info:
        AllocateConsistentHash(virtual_nodes=bad)
    assert info.value.code is ErrorCode.INVALID_ARGUMENT


def test_docstring_examples_run() -> None:
    result = doctest.testmod(allocation_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
