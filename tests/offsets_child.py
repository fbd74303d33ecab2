"""Child process for the consumer-offsets crash test.

Usage: ``python offsets_child.py TABLE_PATH BROKER_NAME ROUNDS``

Each round commits offsets for two groups and calls ``persist()``, then prints
``PERSISTED <json>`` with the full offset state that is now durable.  Afterwards it
commits more offsets WITHOUT persisting, prints ``READY`` and sleeps until the
parent kills it with SIGKILL: the parent must see exactly the last PERSISTED state.
"""
from __future__ import annotations

import json
import sys
import time

from sparkmq.platform.broker.offsets import ConsumerOffsetManager


def main() -> None:
    table_path, broker_name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # A long interval and no start(): only the explicit persists below reach the table.
    manager = ConsumerOffsetManager(table_path, broker_name, persist_interval_s=3600)
    manager.load()
    for r in range(1, rounds + 1):
        for group in ("crash_g1", "crash_g2"):
            for queue_id in range(4):
                manager.commit(group, "CrashTopic", queue_id, r * 100 + queue_id)
        if r % 2 == 0:
            manager.reset("crash_g2", "CrashTopic", {0: r})  # a backwards move must persist too
        manager.persist()
        state = {g: manager.offsets_of(g, "CrashTopic") for g in manager.groups()}
        print("PERSISTED " + json.dumps(state), flush=True)
    for queue_id in range(4):
        manager.commit("crash_g1", "CrashTopic", queue_id, 999_999)  # never persisted
    manager.commit("crash_g3", "CrashTopic", 0, 1)                   # never persisted
    print("READY", flush=True)
    time.sleep(60)


if __name__ == "__main__":
    main()
