"""The official-client scenarios both Java suites run: against Apache RocketMQ (test_java_harness.py, which proves
the drivers) and against a sparkmq cluster (test_java_clients.py, which proves sparkmq).

Each scenario takes a :class:`Target` -- where the name servers are, where the clients' logs go -- runs RocketMQ's
own Java clients through the drivers (``java_clients.py``) and asserts on what they reported.  A queue is named
``(brokerName, queueId)``: a topic may live on several brokers.
"""
from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any, Protocol

from java_clients import DriverResult, JavaClient, run_driver

from conftest import need

__all__ = ["Target", "drain", "lite_pull_commit_is_where_the_next_one_starts", "need",
           "orderly_consumer_locks_its_queues_and_keeps_order", "queue_set", "reconsume_later_then_dlq", "run",
           "every_send_is_accounted_for", "tag_and_sql_subscriptions", "transactions_commit_rollback_and_check_back",
           "two_members_share_the_queues", "wait_queues"]

Event = dict[str, Any]


class Target(Protocol):
    """What a scenario needs of the servers under test."""

    #: The name servers, ``;``-separated, as a client's ``namesrvAddr``.
    namesrv: str
    #: Where the drivers' logs go.
    work: Path


def run(target: Target, mode: str, *args: str, timeout: float = 120.0) -> DriverResult:
    """A driver run to its end against the target's name servers."""
    return run_driver(mode, "--namesrv", target.namesrv, *args, work_dir=target.work, timeout=timeout)


def drain(target: Target, topic: str, count: int, *extra: str, idle_ms: int = 5000) -> list[Event]:
    """The messages of ``topic`` read with a lite pull consumer (assigned, from the beginning) until ``count``
    came, none came for ``idle_ms`` (0: no idle stop), or 60 s passed."""
    result = run(target, "litepull", "--topic", topic, "--group", f"reader-{time.monotonic_ns()}", "--seek-begin",
                 "--count", str(count), "--idle-ms", str(idle_ms), "--duration-s", "60", *extra)
    assert result.returncode == 0, result.errors
    return result.events_of("received")


def queue_set(queues: list[Event], topic: str) -> set[tuple[str, int]]:
    """An assignment's queues of ``topic`` as ``(brokerName, queueId)``."""
    return {(q["brokerName"], q["queueId"]) for q in queues if q["topic"] == topic}


def wait_queues(client: JavaClient, topic: str, n: int, timeout: float = 60.0) -> set[tuple[str, int]]:
    """Wait until the consumer's latest assignment holds ``n`` queues of ``topic``; returns them."""
    def last(events: list[Event]) -> set[tuple[str, int]] | None:
        mine = [e for e in events if e["event"] == "assignment"]
        qs = queue_set(mine[-1]["queues"], topic) if mine else set()
        return qs if len(qs) == n else None
    return client.wait_for(last, timeout, f"{n} queues of {topic}")  # type: ignore[no-any-return]


def every_send_is_accounted_for(target: Target, topic: str) -> list[Event]:
    """Sync, async, one-way, batch, ordered and delayed sends: every id a ``sent`` event names is read back, with
    the same tags, keys, properties and body, and the same offsetMsgId, queue and offset (a delayed message is
    stored again when it is due: its SendResult names the parked copy, the consumer the one delivered a second or
    more later).  Returns the ``sent`` events."""
    sent: list[Event] = []
    for label, mode, extra in [("sync", "sync", []), ("async", "async", []), ("oneway", "oneway", []),
                               ("batch", "batch", ["--batch-size", "4"]), ("ordered", "ordered", ["--order-keys", "2"]),
                               ("delayed", "sync", ["--delay-level", "1"])]:
        result = run(target, "produce", "--topic", topic, "--count", "8", "--send", mode, "--tags", "A,B",
                     "--keys-prefix", f"{label}-", "--prop", "color=blue", "--body", f"{label}-{{i}}", *extra)
        assert result.returncode == 0 and not result.errors, result.errors
        events = result.events_of("sent")
        assert len(events) == 8 and all(e["msgId"] for e in events), (label, result.events[-6:], result.stderr)
        sent += events
    assert len({e["msgId"] for e in sent}) == len(sent)
    got = {e["msgId"]: e for e in drain(target, topic, len(sent))}
    assert set(got) == {e["msgId"] for e in sent}, ("missing", [e for e in sent if e["msgId"] not in got],
                                                    "extra", [e for k, e in got.items() if k not in
                                                              {s["msgId"] for s in sent}])
    for e in sent:
        m = got[e["msgId"]]
        assert m["tags"] == e["tags"] and m["keys"] == e["keys"] and m["properties"]["color"] == "blue"
        assert base64.b64decode(m["body"]).decode() == e["keys"]
        if e["keys"].startswith("delayed-"):
            assert m["properties"]["DELAY"] == "1" and m["storeTimestamp"] - m["bornTimestamp"] >= 900
        elif not e.get("oneway"):  # a one-way send has no SendResult
            assert (m["offsetMsgId"], m["brokerName"], m["queueId"], m["queueOffset"]) == (
                e["offsetMsgId"], e["brokerName"], e["queueId"], e["queueOffset"]), (m, e)
    ordered = [e for e in sent if "orderKey" in e]
    assert all(len({(e["brokerName"], e["queueId"]) for e in ordered if e["orderKey"] == k}) == 1 for k in (0, 1))
    return sent


def reconsume_later_then_dlq(target: Target, topic: str, group: str) -> None:
    """RECONSUME_LATER every time: deliveries with reconsume times 0, 1, 2, then the message is in
    %DLQ%<group>."""
    [sent] = run(target, "produce", "--topic", topic, "--count", "1").events_of("sent")
    consumer = JavaClient.start(None, "push", "--namesrv", target.namesrv, "--group", group, "--topic", topic,
                                "--later-all", "--max-reconsume-times", "2", "--poll-namesrv-ms", "1000",
                                "--rebalance-ms", "1000", work_dir=target.work)
    try:
        deliveries = consumer.wait_count("received", 3, 120)
        time.sleep(3)  # the third answer's send-back (to the DLQ) completes before the consumer shuts down
    finally:
        consumer.stop()
    assert [d["reconsumeTimes"] for d in deliveries] == [0, 1, 2]
    assert {d["msgId"] for d in deliveries} == {sent["msgId"]}
    assert all(d["status"] == "RECONSUME_LATER" for d in deliveries)
    dead = drain(target, f"%DLQ%{group}", 1)
    assert [(d["msgId"], d["reconsumeTimes"]) for d in dead] == [(sent["msgId"], 3)], dead


def transactions_commit_rollback_and_check_back(target: Target, topic: str, group: str) -> DriverResult:
    """commit and rollback are final; an UNKNOW half message is checked back (answered UNKNOW once, then COMMIT)
    and then delivered; the rolled-back one never is.  Returns the producer's result."""
    result = run(target, "transaction", "--topic", topic, "--group", group, "--count", "3",
                 "--states", "commit,rollback,unknown", "--check-unknown-first", "1", "--check-answer", "commit",
                 "--wait-resolved", "--duration-s", "90", timeout=150)
    (target.work / f"{topic}-transaction-events.json").write_text(json.dumps(result.events, indent=1))  # post-mortem
    assert result.returncode == 0, result.errors
    sent = result.events_of("sent")
    assert [e["localState"] for e in sent] == ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"]
    assert result.events_of("stopping")[0]["reason"] == "resolved"
    checks = [c for c in result.events_of("check") if c["msgId"] == sent[2]["msgId"]]
    assert [c["answer"] for c in checks[:2]] == ["UNKNOW", "COMMIT_MESSAGE"]
    got = {e["msgId"] for e in drain(target, topic, 2, idle_ms=0)}  # the checked one may come a while later
    assert got == {sent[0]["msgId"], sent[2]["msgId"]}, (sent, result.events_of("check"))
    return result


def two_members_share_the_queues(target: Target, topic: str, group: str, total: int,
                                 timeout: float = 60.0) -> None:
    """Clustering: one member holds all ``total`` queues; when a second joins each holds half, disjoint; when it
    leaves the first has all again (each within ``timeout`` s)."""
    run(target, "produce", "--topic", topic, "--count", "1")
    args = ["--namesrv", target.namesrv, "--group", group, "--topic", topic, "--rebalance-ms", "1000"]
    one = JavaClient.start(None, "push", *args, work_dir=target.work)
    try:
        everything = wait_queues(one, topic, total, timeout)
        two = JavaClient.start(None, "push", *args, work_dir=target.work)
        try:
            a, b = wait_queues(one, topic, total // 2, timeout), wait_queues(two, topic, total - total // 2, timeout)
            assert not a & b and a | b == everything
        finally:
            two.stop()
        assert wait_queues(one, topic, total, timeout) == everything
    finally:
        one.stop()


def orderly_consumer_locks_its_queues_and_keeps_order(target: Target, topic: str, group: str) -> list[Event]:
    """An orderly consumer reports its queues locked and gets each order key's messages in send order.  Returns
    the ``sent`` events."""
    sent = run(target, "produce", "--topic", topic, "--count", "12", "--send", "ordered",
               "--order-keys", "3").events_of("sent")
    consumer = JavaClient.start(None, "push", "--namesrv", target.namesrv, "--group", group,
                                "--topic", topic, "--orderly", work_dir=target.work)
    try:
        got = consumer.wait_count("received", 12, 60)
        locked = consumer.wait_for(lambda evs: [e for e in evs if e["event"] == "assignment" and e["queues"]
                                                and all(q["locked"] for q in e["queues"])], 60, "locked queues")
    finally:
        consumer.stop()
    assert locked
    for key in range(3):
        want = [e["msgId"] for e in sent if e["orderKey"] == key]
        assert [e["msgId"] for e in got if e["msgId"] in want] == want
    return sent


def tag_and_sql_subscriptions(target: Target, topic: str, tag_group: str, sql_group: str) -> None:
    """A tag subscription and a MessageSelector.bySql subscription receive exactly their messages."""
    sent = run(target, "produce", "--topic", topic, "--count", "8", "--tags", "A,B", "--prop", "n={i}"
               ).events_of("sent")
    for group, selector, want in ((tag_group, ["--tags", "B"], [e for e in sent if e["tags"] == "B"]),
                                  (sql_group, ["--sql", "n >= 4 AND TAGS = 'A'"],
                                   [e for e in sent[4:] if e["tags"] == "A"])):
        consumer = JavaClient.start(None, "push", "--namesrv", target.namesrv, "--group", group, "--topic", topic,
                                    *selector, work_dir=target.work)
        try:
            consumer.wait_count("received", len(want), 60)
            time.sleep(2)  # nothing else arrives
            got = consumer.snapshot("received")
        finally:
            consumer.stop()
        assert sorted(e["msgId"] for e in got) == sorted(e["msgId"] for e in want)


def lite_pull_commit_is_where_the_next_one_starts(target: Target, topic: str, group: str) -> None:
    """A subscribed lite pull consumer commits after 5 of 10 (all in one queue); the next member of its group
    reads the other 5."""
    run(target, "produce", "--topic", topic, "--count", "10", "--send", "ordered", "--order-keys", "1")
    first = run(target, "litepull", "--topic", topic, "--group", group, "--subscribe", "--pull-batch", "1",
                "--commit", "sync", "--count", "5", "--duration-s", "60")
    assert len(first.events_of("received")) >= 5
    read_first = len(first.events_of("received"))
    second = run(target, "litepull", "--topic", topic, "--group", group, "--subscribe", "--count",
                 str(10 - read_first), "--idle-ms", "5000", "--duration-s", "60")
    offsets = [e["queueOffset"] for e in first.events_of("received") + second.events_of("received")]
    assert sorted(offsets) == list(range(10))
