"""Child process of the POP kill -9 test: a broker that receives and acks until it is killed.

    python pop_child.py DATA_DIR EVENTS_FILE

Opens a broker on DATA_DIR (the parent sent the messages before), then loops: receive up to 8
messages (invisible 1.5 s), and for each (5 ms of "work") acks two bodies out of three, writing ``ACKING body``
before the ack and ``ACKED body`` after it returned (line by line, flushed: a SIGKILL keeps what
was written).  Unacked ones come back after their invisible time and are received again.
Prints ``READY`` to the events file once serving.
"""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from sparkmq.platform.broker.broker import Broker
from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.common.protocol import PopRequest

TOPIC = "PopCrash"
GROUP = "pop-crash"
INVISIBLE_MS = 1500


def config(data_dir: Path) -> BrokerConfig:
    """The broker settings the child and the checking parent share."""
    return BrokerConfig(data_dir=data_dir, port=10911, store={"segment_size": 8 << 20}, pop_min_invisible_ms=50,
                        trace_enabled=False)


async def run(broker: Broker, events) -> None:  # type: ignore[no-untyped-def]
    pop = broker.pop_processor
    events.write("READY\n")
    events.flush()
    while True:
        popped = await pop.receive(PopRequest(GROUP, TOPIC, max_messages=8, invisible_ms=INVISIBLE_MS,
                                              long_poll_ms=500))
        for p in popped:
            time.sleep(0.005)  # "work": the parent's SIGKILL lands mid-consumption
            body = p.message.body.decode()
            events.write(f"GOT {body} {p.delivery_attempt}\n")
            if int(body.split("-")[1]) % 3 != 0:
                events.write(f"ACKING {body}\n")
                events.flush()
                pop.ack(GROUP, TOPIC, p.receipt_handle)
                events.write(f"ACKED {body}\n")
            events.flush()


def main() -> None:
    data_dir, events_path = Path(sys.argv[1]), Path(sys.argv[2])
    broker = Broker(config(data_dir)).start(register=False)
    with events_path.open("a") as events:
        asyncio.run(run(broker, events))


if __name__ == "__main__":
    main()
