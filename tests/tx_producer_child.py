"""A TransactionProducer in its own process that sends half messages and then waits to be killed.

Each local transaction answers UNKNOWN (the outcome is left to the check-backs) and the producer
has no check listener, so only another producer of the group can settle them.  Prints one JSON
line per half message (``{"tx": transaction_id, "msg_id": ..., "body": ...}``) and then ``{"e": "sent"}``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.client.transaction_producer import TransactionProducer, TransactionState
from sparkmq.platform.common.message import Message


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--bodies", nargs="+", required=True)
    args = parser.parse_args()
    producer = TransactionProducer(args.group, ClientConfig(namesrv_addrs=args.namesrv, heartbeat_interval_s=0.5),
                                   check_wait_ms=1000)
    producer.start()
    for body in args.bodies:
        result = producer.send_message_in_transaction(Message(args.topic, body.encode()),
                                                      lambda m, a: TransactionState.UNKNOWN)
        print(json.dumps({"tx": result.transaction_id, "msg_id": result.msg_id, "body": body}), flush=True)
    print(json.dumps({"e": "sent"}), flush=True)
    while True:  # until SIGKILL
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
