"""Transaction half messages on a real store: visibility, commit/rollback, check-backs, discard, restart."""
from __future__ import annotations

from pathlib import Path

import pytest

from sparkmq.platform.broker.transaction import CheckRequest, TransactionService
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message, StoredMessage
from sparkmq.platform.store import MessageStore
from sparkmq.platform.store.message_store import iter_all


def _service(store: MessageStore, path: Path, checks: list[CheckRequest], **kw: float) -> TransactionService:
    def deliver(message: Message, queue_id: int, half: StoredMessage):
        return store.put(message, queue_id, born_timestamp=half.born_timestamp)
    return TransactionService(store, path, deliver, lambda req: checks.append(req) or True, **kw)


def _visible(store: MessageStore, topic: str = "Pay") -> list[StoredMessage]:
    return list(iter_all(store, topic, 1))


def test_commit_makes_visible_rollback_never(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    svc = _service(store, tmp_path / "tx.json", [])
    a = svc.prepare(Message("Pay", b"a", tags="T", keys=("order-1",)), 1, "pg")
    b = svc.prepare(Message("Pay", b"b"), 1, "pg")
    assert _visible(store) == [] and svc.open_transactions() == sorted([a.msg_id, b.msg_id])
    committed = svc.end(a.msg_id, "pg", "COMMIT")
    assert committed is not None and committed.msg_id == a.msg_id
    assert svc.end(b.msg_id, "pg", "ROLLBACK") is None
    got = _visible(store)
    assert [m.body for m in got] == [b"a"] and got[0].tags == "T" and got[0].keys == ("order-1",)
    assert not {"TRAN_MSG", "PGROUP", "REAL_TOPIC"} & set(got[0].properties)
    ops = list(iter_all(store, "RMQ_SYS_TRANS_OP_HALF_TOPIC", 0))
    assert [(op.tags, op.body) for op in ops] == [("COMMIT", b"0"), ("ROLLBACK", b"1")]


def test_ending_an_unknown_transaction_changes_nothing(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    svc = _service(store, tmp_path / "tx.json", [])
    half = svc.prepare(Message("Pay", b"a"), 1, "pg")
    end_before = store.commit_log.max_offset
    for tx, group, action, code in [("F" * 32, "pg", "COMMIT", ErrorCode.TRANSACTION_NOT_FOUND),
                                    (half.msg_id, "other", "COMMIT", ErrorCode.TRANSACTION_NOT_FOUND),
                                    (half.msg_id, "pg", "MAYBE", ErrorCode.INVALID_ARGUMENT)]:
        with pytest.raises(SparkMQError) as err:
            svc.end(tx, group, action)
        assert err.value.code is code
    assert svc.end(half.msg_id, "pg", "UNKNOWN") is None
    assert store.commit_log.max_offset == end_before and svc.open_transactions() == [half.msg_id]
    svc.end(half.msg_id, "pg", "ROLLBACK")
    with pytest.raises(SparkMQError) as err:
        svc.end(half.msg_id, "pg", "COMMIT")
    assert err.value.code is ErrorCode.TRANSACTION_NOT_FOUND and _visible(store) == []


def test_check_backs_then_discard_after_max_checks(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    checks: list[CheckRequest] = []
    svc = _service(store, tmp_path / "tx.json", checks, first_check_s=6, check_interval_s=30, max_checks=3)
    half = svc.prepare(Message("Pay", b"a"), 1, "pg")
    t0 = store.read_by_offset_msg_id(half.offset_msg_id).store_timestamp
    assert svc.run_once(t0 + 5_999) == 0
    assert svc.run_once(t0 + 6_000) == 1 and checks[-1].transaction_id == half.msg_id
    assert checks[-1].producer_group == "pg" and checks[-1].topic == "Pay" and checks[-1].check_times == 1
    assert svc.run_once(t0 + 35_999) == 0
    assert svc.run_once(t0 + 36_000) == 1 and svc.run_once(t0 + 66_000) == 1
    assert [c.check_times for c in checks] == [1, 2, 3]
    assert svc.run_once(t0 + 96_000) == 0 and svc.discarded == 1 and svc.open_transactions() == []
    assert [op.tags for op in iter_all(store, "RMQ_SYS_TRANS_OP_HALF_TOPIC", 0)] == ["DISCARD"]
    assert _visible(store) == []


def test_a_restart_keeps_open_halves_and_forgets_settled_ones(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    path = tmp_path / "tx.json"
    first = _service(store, path, [])
    ids = [first.prepare(Message("Pay", b"%d" % i), 1, "pg").msg_id for i in range(4)]
    first.end(ids[0], "pg", "COMMIT")
    first.run_once(0)
    first.persist()
    first.end(ids[1], "pg", "ROLLBACK")  # after the persist: replayed from the op queue
    checks: list[CheckRequest] = []
    second = _service(store, path, checks)
    assert second.open_transactions() == sorted(ids[2:])
    second.run_once(2**62)
    assert sorted(c.transaction_id for c in checks) == sorted(ids[2:])
    second.end(ids[3], "pg", "COMMIT")
    assert sorted(m.body for m in _visible(store)) == [b"0", b"3"]
