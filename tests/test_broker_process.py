"""A real broker process with two real name servers: registration, routes, SIGTERM, persisted offsets."""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable
from tcp_proxy import TcpProxy

from procs import wait_until

pytestmark = pytest.mark.cluster


def route(url: str, topic: str) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{url}/routes/{topic}", timeout=10)
    return response.status_code, response.json()


def test_a_broker_is_ready_once_the_name_servers_know_it(procs, tmp_path: Path) -> None:
    """As RocketMQ's broker registers during its start: right after the ready line (no wait, no retry) the name
    server lists it as its cluster's master, so an admin tool creating a topic at once finds it (notebooks and
    tests did that, and under load met "no live master" now and then).  The link to the name server holds the
    registration's bytes for 1.5 s, so a ready line before the registration ended would show."""
    from sparkmq.platform.client import AdminClient, ClientConfig

    namesrv = procs.start("namesrv", "sparkmq.api.namesrv_main")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    host, port = namesrv.addr.rsplit(":", 1)
    proxy = asyncio.run_coroutine_threadsafe(TcpProxy((host, int(port))).start(), loop).result(10)
    loop.call_soon_threadsafe(proxy.hold)

    def heal_after_the_first_connection() -> None:
        wait_until(lambda: proxy.accepted, 60, "the broker's registration to connect")
        time.sleep(1.5)
        loop.call_soon_threadsafe(proxy.heal)

    heal = threading.Thread(target=heal_after_the_first_connection, daemon=True)
    heal.start()
    try:
        proxied = "{}:{}".format(*proxy.address)
        started = time.monotonic()
        broker = procs.start("broker", "sparkmq.api.broker_main", "--data-dir", str(tmp_path / "b"),
                             "--namesrv", proxied, "--register-interval-s", "60")
        with AdminClient(ClientConfig(namesrv_addrs=namesrv.addr, trace_enabled=False)) as admin:
            assert admin.masters() == {"broker-a": broker.addr}, f"ready after {time.monotonic() - started:.1f} s"
            admin.create_topic("ReadyTopic", read_queue_nums=2, write_queue_nums=2)
    finally:
        heal.join(70)
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_broker_registers_with_every_name_server_and_leaves_cleanly(procs, tmp_path: Path) -> None:
    # A long expiry: a route that disappears right after SIGTERM was unregistered, not expired.
    ns_args = ["--broker-expiry-s", "30", "--scan-interval-s", "0.5"]
    ns1, ns2 = procs.start_many([("namesrv", "sparkmq.api.namesrv_main", ns_args),
                                 ("namesrv", "sparkmq.api.namesrv_main", ns_args)])
    data_dir = tmp_path / "b"
    broker = procs.start("broker", "sparkmq.api.broker_main", "--data-dir", str(data_dir),
                         "--namesrv", f"{ns1.addr};{ns2.addr}", "--register-interval-s", "0.5",
                         "--segment-size", str(8 << 20), "--offset-persist-interval-s", "60")
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        info = http.get("/broker").json()
        assert info["addr"] == broker.addr and info["namesrv_addrs"] == [ns1.addr, ns2.addr]
        created = http.post("/topics", json={"topic": "ProcTopic", "read_queue_nums": 8, "write_queue_nums": 6})
        assert created.status_code == 200, created.text
        for ns in (ns1, ns2):
            status, body = wait_until(lambda ns=ns: (r := route(ns.url, "ProcTopic"))[0] == 200 and r, 30,
                                      f"ProcTopic on {ns.addr}")
            assert body["queue_datas"] == [{"broker_name": "broker-a", "read_queue_nums": 8, "write_queue_nums": 6,
                                            "perm": 6, "topic_sys_flag": 0}]
            assert body["broker_datas"][0]["broker_addrs"] == {"0": broker.addr}
        sent = http.post("/topics/ProcTopic/messages", json={"body": "hello", "queue_id": 0}).json()
        assert sent["status"] == "SEND_OK"
        committed = http.post("/consumers/pcg/offsets", json={"offsets": [{"topic": "ProcTopic", "queue_id": 0,
                                                                           "offset": 1}]})
        assert committed.json() == {"committed": 1}
        assert http.get("/health").json()["status"] == "ok"
    assert broker.stop() == 0, broker.log()[-4000:]
    for ns in (ns1, ns2):
        status, body = route(ns.url, "ProcTopic")
        assert (status, body["code"]) == (404, "TOPIC_NOT_EXIST"), body
    # The offsets were persisted on shutdown (the 60 s interval never came).
    rows = DeltaTable(str(data_dir / "lake" / "consumer_offsets")).to_pyarrow_table().to_pylist()
    assert [(r["broker"], r["group"], r["topic"], r["queue_id"], r["offset"]) for r in rows] == [
        ("broker-a", "pcg", "ProcTopic", 0, 1)]
    assert "Traceback" not in broker.log()
