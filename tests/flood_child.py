"""Child of the overload tests: floods a broker with raw remoting sends, far faster than it can sync them.

    python flood_child.py ADDR TOPIC SECONDS CONNECTIONS DEPTH BODY_SIZE OUT_JSON

SEND_MESSAGE from CONNECTIONS connections with DEPTH sends in flight on each for SECONDS; each body starts
with ``seq=<12 digits>;`` (:func:`body`), so the parent finds every acknowledged one in the store.  Writes to
OUT_JSON: the acknowledged sequence numbers, the latency of each accepted and each SYSTEM_BUSY answer, the busy
answers by reason and any other error.  A process of its own: the flood's CPU must not delay the parent's probe.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time

from sparkmq.platform.common import protocol as p
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import RequestCode
from sparkmq.platform.remoting import RemotingConnection

#: SEND_OK, or stored but not synced / replicated in time: acknowledged as stored either way.
STORED = frozenset({0, 10, 11, 12})


def body(seq: int, size: int) -> bytes:
    """The body of send ``seq``: its sequence number first, padded to ``size`` bytes."""
    head = b"seq=%012d;" % seq
    return head + b"x" * (size - len(head))


def seq_of(data: bytes) -> int | None:
    """The sequence number a :func:`body` starts with, None for another body."""
    return int(data[4:16]) if data.startswith(b"seq=") else None


async def flood(addr: str, topic: str, seconds: float, connections: int, depth: int, size: int) -> dict[str, object]:
    """Run the flood; what it saw (see the module docstring)."""
    acked: list[int] = []
    ok: list[float] = []
    busy: list[float] = []
    reasons: dict[str, int] = {}
    other: list[str] = []
    seqs = itertools.count()
    conns = [await RemotingConnection.connect(addr) for _ in range(connections)]
    end = time.monotonic() + seconds

    async def worker(conn: RemotingConnection) -> None:
        while time.monotonic() < end:
            seq = next(seqs)
            ext = p.ext_fields(p.SendMessageRequestHeader("flood", topic, queueId=seq % 4,
                                                          bornTimestamp=int(time.time() * 1000)))
            began = time.monotonic()
            try:
                await conn.request(RequestCode.SEND_MESSAGE, ext, body(seq, size), timeout=30, ok=STORED)
            except SparkMQError as exc:
                if exc.code is ErrorCode.SYSTEM_BUSY:
                    busy.append(time.monotonic() - began)
                    reason = exc.message.partition("]")[0].lstrip("[")
                    reasons[reason] = reasons.get(reason, 0) + 1
                    await asyncio.sleep(0.02)  # a pause, not a back-off: the flood stays far faster than the disk
                else:
                    other.append(str(exc))
                continue
            ok.append(time.monotonic() - began)
            acked.append(seq)

    await asyncio.gather(*(worker(c) for c in conns for _ in range(depth)))
    for conn in conns:
        await conn.close()
    return {"acked": acked, "ok": ok, "busy": busy, "reasons": reasons, "other": other[:20]}


def main() -> None:
    addr, topic, seconds, connections, depth, size, out = sys.argv[1:8]
    result = asyncio.run(flood(addr, topic, float(seconds), int(connections), int(depth), int(size)))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
