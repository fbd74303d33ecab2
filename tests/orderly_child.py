"""An orderly PushConsumer in its own process, for the ordered-consumption test that kills one with SIGKILL.

Writes one JSON line per consumed message to ``--out`` (flushed at once, so a SIGKILL loses
nothing already reported): ``{"c": name, "t": time_ns, "k": order_key, "s": step}``; ``{"e": "ready"}``
once started.  SIGTERM shuts it down cleanly.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.client.push_consumer import ConsumeOrderlyStatus, PushConsumer
from sparkmq.platform.common.wire import ReceivedMessage


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="work per message")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    out = open(args.out, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
    lock = threading.Lock()

    def emit(event: dict) -> None:
        with lock:
            out.write(json.dumps(event) + "\n")

    config = ClientConfig(namesrv_addrs=args.namesrv, heartbeat_interval_s=0.3, rebalance_interval_s=0.5,
                          offset_commit_interval_s=0.2, route_refresh_interval_s=0.5, long_poll_wait_ms=1000,
                          change_wait_ms=2000, pull_error_backoff_s=0.2)
    consumer = PushConsumer(args.group, config, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            lock_interval_s=0.5, client_lock_expiry_s=2.0)

    def listener(batch: list[ReceivedMessage]) -> ConsumeOrderlyStatus:
        for m in batch:
            if args.sleep_ms:
                time.sleep(args.sleep_ms / 1000)
            key, _, step = m.body.decode().partition(":")
            emit({"c": args.name, "t": time.time_ns(), "k": key, "s": int(step)})
        return ConsumeOrderlyStatus.SUCCESS

    consumer.subscribe(args.topic)
    consumer.register_listener_orderly(listener)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer.start()
    emit({"e": "ready", "c": args.name})
    last: list[str] = []
    while not stop.wait(0.2):
        current = sorted(f"{q.queue_id}:{int(consumer.lock_held(q))}" for q in consumer.assignment())
        if current != last:
            emit({"e": "assign", "c": args.name, "queues": current})
            last = current
    consumer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
