"""The ``sparkmq`` command line against a real name server and broker."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from procs import ProcessHarness, ServiceProcess, child_env, wait_until

pytestmark = pytest.mark.cluster


@pytest.fixture
def platform(procs: ProcessHarness, tmp_path: Path) -> tuple[ServiceProcess, ServiceProcess]:
    ns, broker = procs.start_platform(tmp_path / "b", "--broker-name", "broker-a")
    wait_until(lambda: httpx.get(f"{ns.url}/cluster", timeout=5).json()["live_brokers"], 20, "the broker registered",
               interval=0.1)
    return ns, broker


def sparkmq(ns: ServiceProcess, *args: str, stdin: str | None = None, expect: int = 0) -> Any:
    """Run ``sparkmq <args> --json`` (JSON where the command prints one document)."""
    result = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", *args], input=stdin, capture_output=True,
                            text=True, timeout=120, env=child_env(SPARKMQ_NAMESRV=ns.addr))
    assert result.returncode == expect, result.stdout + result.stderr
    return result.stdout


def test_topics_produce_consume_groups_and_messages(platform: tuple[ServiceProcess, ServiceProcess]) -> None:
    ns, broker = platform
    created = json.loads(sparkmq(ns, "admin", "--json", "topic", "create", "CliTopic", "--read-queues", "2",
                                 "--write-queues", "2"))
    assert created == [{"broker": broker.addr, "topic": "CliTopic", "read_queue_nums": 2, "write_queue_nums": 2,
                        "perm": 6, "order": False, "topic_sys_flag": 0}], created
    wait_until(lambda: "CliTopic" in sparkmq(ns, "admin", "--json", "topic", "list"), 10, "CliTopic listed",
               interval=0.2)
    route = json.loads(sparkmq(ns, "admin", "--json", "topic", "route", "CliTopic"))
    assert route == [{"broker": "broker-a", "addr": broker.addr, "read_queue_nums": 2, "write_queue_nums": 2,
                      "perm": 6}]
    sent = json.loads(sparkmq(ns, "produce", "CliTopic", "--tags", "t", "--keys", "k1 k2", "--property", "a=1",
                              "--json", stdin="one\ntwo\nthree\nfour\n"))
    assert [r["status"] for r in sent] == ["SEND_OK"] * 4 and {r["queue_id"] for r in sent} == {0, 1}
    stats = json.loads(sparkmq(ns, "admin", "--json", "topic", "stats", "CliTopic"))
    assert sum(s["max_offset"] for s in stats) == 4

    lines = sparkmq(ns, "consume", "CliTopic", "--group", "cli-g", "--count", "4", "--timeout", "10",
                    "--json").splitlines()
    got = [json.loads(line) for line in lines]
    assert sorted(m["body"] for m in got) == ["four", "one", "three", "two"]
    assert all(m["tags"] == "t" and m["keys"] == ["k1", "k2"] and m["properties"] == {"a": "1"} for m in got)

    offsets = json.loads(sparkmq(ns, "admin", "--json", "group", "offsets", "cli-g"))
    assert sum(o["offset"] for o in offsets) == 4
    lag = json.loads(sparkmq(ns, "admin", "--json", "group", "lag", "cli-g"))
    assert lag["total_lag"] == 0
    view = json.loads(sparkmq(ns, "admin", "--json", "msg", "view", sent[0]["offset_msg_id"]))
    assert view["body"] == "one" and view["msg_id"] == sent[0]["msg_id"]
    clusters = json.loads(sparkmq(ns, "admin", "--json", "cluster", "list"))
    assert "broker-a" in clusters["clusters"]["DefaultCluster"]
    # People get tables.
    assert "CliTopic" in sparkmq(ns, "admin", "topic", "stats", "CliTopic")


def test_errors_are_stable_codes_with_exit_1(platform: tuple[ServiceProcess, ServiceProcess]) -> None:
    ns, _broker = platform
    out = sparkmq(ns, "admin", "--json", "topic", "create", "bad topic!", expect=1)
    assert json.loads(out)["code"] == "TOPIC_ILLEGAL"
    out = sparkmq(ns, "admin", "--json", "msg", "view", "nothex", expect=1)
    assert json.loads(out)["code"] == "MESSAGE_ID_ILLEGAL"
    out = sparkmq(ns, "admin", "--json", "topic", "route", "NoSuchTopic", expect=1)
    assert json.loads(out)["code"] == "TOPIC_NOT_EXIST"
