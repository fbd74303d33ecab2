"""Issue 4 features against real broker processes: pending timers and delays survive kill -9."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from procs import broker_restart_ports, wait_until

pytestmark = pytest.mark.cluster


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def _pull_all(http: httpx.Client, topic: str, queue_id: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    offset = 0
    while True:
        got = _ok(http.get(f"/topics/{topic}/queues/{queue_id}/messages", params={"offset": offset, "max": 256}))
        out.extend(got["messages"])
        if got["status"] != "FOUND":
            return out
        offset = got["next_offset"]


def test_pending_timers_and_delays_survive_kill9_and_a_recalled_timer_never_arrives(procs, tmp_path: Path) -> None:
    ns = procs.start("namesrv", "sparkmq.api.namesrv_main")
    data_dir = tmp_path / "b"
    args = ["--data-dir", str(data_dir), "--namesrv", ns.addr, "--segment-size", str(8 << 20),
            "--message-delay-level", "200ms 400ms 3s", "--timer-max-delay-s", "60"]
    broker = procs.start("broker", "sparkmq.api.broker_main", *args)
    topic = "ProcTimers"
    due: dict[str, int] = {}
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        _ok(http.post("/topics", json={"topic": topic, "read_queue_nums": 2, "write_queue_nums": 2}))
        base = int(time.time() * 1000) + 3000
        for i in range(50):
            sent = _ok(http.post(f"/topics/{topic}/messages",
                                 json={"body": f"t{i}", "queue_id": i % 2, "deliver_at_ms": base + i * 40}))
            due[sent["msg_id"]] = base + i * 40
        recalled = list(due)[7]
        assert _ok(http.delete(f"/timers/{recalled}"))["recalled"] is True
        del due[recalled]
        before = int(time.time() * 1000)
        delayed = _ok(http.post(f"/topics/{topic}/messages", json={"body": "delayed", "queue_id": 0,
                                                                   "delay_level": 3}))
        due[delayed["msg_id"]] = before + 3000
        assert _pull_all(http, topic, 0) == [] and _pull_all(http, topic, 1) == []
    broker.kill9()
    broker = procs.start("broker", "sparkmq.api.broker_main", *args, *broker_restart_ports(broker.port))
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        got: dict[str, dict[str, Any]] = {}

        def all_due() -> bool:
            for q in (0, 1):
                for m in _pull_all(http, topic, q):
                    got[m["msg_id"]] = m
            return len(got) >= len(due)
        wait_until(all_due, 20, lambda: f"every due message; missing {set(due) - set(got)}; log:\n"
                                        f"{broker.log()[-3000:]}", interval=0.2)
        assert set(got) == set(due), f"missing {set(due) - set(got)}; log:\n{broker.log()[-3000:]}"
        for msg_id, m in got.items():
            assert m["store_timestamp"] >= due[msg_id], (msg_id, m["store_timestamp"], due[msg_id])
        time.sleep(0.5)
        assert recalled not in {m["msg_id"] for q in (0, 1) for m in _pull_all(http, topic, q)}


def test_open_halves_survive_kill9_and_are_checked_back_then_committed(procs, tmp_path: Path) -> None:
    ns = procs.start("namesrv", "sparkmq.api.namesrv_main")
    args = ["--data-dir", str(tmp_path / "b"), "--namesrv", ns.addr, "--segment-size", str(8 << 20),
            "--transaction-check-first-s", "1", "--transaction-check-interval-s", "1", "--transaction-check-max", "30"]
    broker = procs.start("broker", "sparkmq.api.broker_main", *args)
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        keep = _ok(http.post("/topics/ProcTx/half", json={"body": "keep", "queue_id": 0, "producer_group": "ppg"}))
        drop = _ok(http.post("/topics/ProcTx/half", json={"body": "drop", "queue_id": 0, "producer_group": "ppg"}))
        settled = _ok(http.post("/topics/ProcTx/half", json={"body": "done", "queue_id": 0, "producer_group": "ppg"}))
        _ok(http.post(f"/transactions/{settled['transaction_id']}", json={"producer_group": "ppg",
                                                                         "action": "COMMIT"}))
    broker.kill9()
    broker = procs.start("broker", "sparkmq.api.broker_main", *args, *broker_restart_ports(broker.port))
    answers = {keep["transaction_id"]: "COMMIT", drop["transaction_id"]: "ROLLBACK"}
    seen: set[str] = set()
    with httpx.Client(base_url=broker.url, timeout=20) as http:
        def answered_all() -> bool:
            checks = _ok(http.get("/transactions/checks", params={"producer_group": "ppg", "client_id": "new-producer",
                                                                  "wait_ms": 3000}))["checks"]
            for check in checks:
                tx = check["transaction_id"]
                assert tx != settled["transaction_id"], "a settled transaction was checked back"
                if tx not in seen:
                    seen.add(tx)
                    _ok(http.post(f"/transactions/{tx}", json={"producer_group": "ppg", "action": answers[tx],
                                                               "from_check": True}))
            return seen == set(answers)
        wait_until(answered_all, 20, lambda: f"check-backs of both open halves (answered {seen})", interval=0)
        bodies = sorted(m["body"] for m in _pull_all(http, "ProcTx", 0))
        assert bodies == sorted(["ZG9uZQ==", "a2VlcA=="])  # base64 of "done", "keep"
