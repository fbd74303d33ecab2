"""A PushConsumer in its own process, for integration tests that kill consumers with SIGKILL.

Writes one JSON line per event to ``--out`` (flushed at once, so a SIGKILL loses nothing
already reported):

* ``{"e": "ready", "client_id": ...}`` once started;
* ``{"e": "assign", "queues": ["broker-a/0", ...]}`` whenever its assignment changes;
* ``{"e": "msg", "id": msg_id, "q": "broker-a/0", "o": queue_offset, "body": ...}`` per message.

SIGTERM shuts the consumer down cleanly (offsets committed) and exits 0.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.client.push_consumer import ConsumeStatus, PushConsumer
from sparkmq.platform.common.wire import ReceivedMessage


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--expression", default="*")
    parser.add_argument("--model", default="CLUSTERING")
    parser.add_argument("--strategy", default="averagely")
    parser.add_argument("--from-where", default="CONSUME_FROM_LAST_OFFSET")
    parser.add_argument("--out", required=True)
    parser.add_argument("--offset-dir", default=None)
    parser.add_argument("--interval-s", type=float, default=0.5, help="heartbeat / rebalance / commit interval")
    args = parser.parse_args()

    out = open(args.out, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
    lock = threading.Lock()

    def emit(event: dict) -> None:
        with lock:
            out.write(json.dumps(event) + "\n")

    settings = dict(namesrv_addrs=args.namesrv, heartbeat_interval_s=args.interval_s,
                    rebalance_interval_s=args.interval_s * 2, offset_commit_interval_s=args.interval_s,
                    route_refresh_interval_s=args.interval_s * 2, long_poll_wait_ms=2000, change_wait_ms=2000)
    if args.offset_dir:
        settings["offset_store_dir"] = args.offset_dir
    consumer = PushConsumer(args.group, ClientConfig(**settings), message_model=args.model,
                            allocate_strategy=args.strategy, consume_from_where=args.from_where)

    def listener(batch: list[ReceivedMessage]) -> ConsumeStatus:
        for m in batch:
            emit({"e": "msg", "id": m.msg_id, "q": f"{m.broker_name}/{m.queue_id}", "o": m.queue_offset,
                  "body": m.body.decode("utf-8", "replace")})
        return ConsumeStatus.CONSUME_SUCCESS

    consumer.subscribe(args.topic, args.expression)
    consumer.register_listener(listener)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer.start()
    emit({"e": "ready", "client_id": consumer.client_id})
    last: list[str] = []
    while not stop.wait(0.1):
        current = sorted(f"{q.broker_name}/{q.queue_id}" for q in consumer.assignment())
        if current != last:
            emit({"e": "assign", "queues": current})
            last = current
    consumer.shutdown()
    emit({"e": "stopped"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
