"""Remoting transport benchmark: one line of figures, ``remoting_transport key=value …``.

    python benchmarks/bench_remoting_transport.py [--quick] [--requests N] [--pipelined N]

An echo server (synchronous handler: the hot path) runs in a child process; this process
measures

* ``sync_p50_us`` / ``sync_p99_us`` / ``sync_rps``: the blocking round trip of one thread through
  :class:`SyncRemotingClient` (the process-wide loop thread, one connection);
* ``pipelined_rps``: small requests kept ``--window`` in flight on one connection by asyncio
  workers awaiting ``RemotingConnection.request``;
* ``future_rps``: the same through ``SyncRemotingClient.request_future`` from one thread.

The machine is shared and noisy: compare figures from the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

from sparkmq.platform.remoting import (
    RemotingConnection,
    RemotingServer,
    Reply,
    SyncRemotingClient,
    new_event_loop,
)

ECHO = 10  # any request code: the transport does not interpret codes (PING aside)
HEADER = b"\x81\xa5topic\xa5bench"  # a small msgpack map, as a typical request header
BODY = b"x" * 64


def line(name: str, **figures: object) -> None:
    """Print one benchmark line."""
    parts = [name] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(" ".join(parts), flush=True)


def serve() -> None:
    """Child process: an echo server on a free port; prints the port, runs until SIGTERM."""

    def echo(conn, frame):
        return Reply(0, frame.header, frame.body)

    async def main() -> None:
        server = await RemotingServer(echo).start("127.0.0.1", 0)
        print(server.port, flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(1.0)

    loop = new_event_loop()
    loop.run_until_complete(main())
    loop.close()


def bench_sync(addr: str, n: int) -> tuple[float, float, float]:
    """p50 µs, p99 µs and requests/s of sequential blocking round trips."""
    client = SyncRemotingClient()
    try:
        for _ in range(min(n, 2000)):  # warm up (connect, caches)
            client.request(addr, ECHO, HEADER, BODY)
        lat = []
        perf = time.perf_counter
        start = perf()
        for _ in range(n):
            t = perf()
            client.request(addr, ECHO, HEADER, BODY)
            lat.append(perf() - t)
        elapsed = perf() - start
        lat.sort()
        return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6, n / elapsed
    finally:
        client.close()


def bench_futures(addr: str, n: int, window: int) -> float:
    """Requests/s through request_future with ``window`` in flight."""
    client = SyncRemotingClient()
    try:
        client.request(addr, ECHO, HEADER, BODY)
        start = time.perf_counter()
        sent = 0
        while sent < n:
            batch = [client.request_future(addr, ECHO, HEADER, BODY) for _ in range(min(window, n - sent))]
            for f in batch:
                f.result()
            sent += len(batch)
        return n / (time.perf_counter() - start)
    finally:
        client.close()


def bench_pipelined(addr: str, n: int, window: int) -> float:
    """Requests/s with ``window`` asyncio workers each awaiting requests back to back on one connection."""

    async def main() -> float:
        conn = await RemotingConnection.connect(addr)
        per_worker = n // window

        async def worker() -> None:
            request = conn.request
            for _ in range(per_worker):
                await request(ECHO, HEADER, BODY)

        try:
            await asyncio.gather(*(worker() for _ in range(window // 10)))  # warm up
            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(window)))
            return per_worker * window / (time.perf_counter() - start)
        finally:
            await conn.close()

    loop = new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--requests", type=int, default=20000, help="sequential sync round trips")
    parser.add_argument("--pipelined", type=int, default=300000, help="pipelined requests")
    parser.add_argument("--window", type=int, default=500, help="requests in flight when pipelining")
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.quick:
        args.requests, args.pipelined = 2000, 20000
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        addr = f"127.0.0.1:{int(child.stdout.readline())}"
        p50, p99, sync_rps = bench_sync(addr, args.requests)
        pipelined = bench_pipelined(addr, args.pipelined, args.window)
        futures = bench_futures(addr, args.pipelined // 2, args.window)
        line("remoting_transport", sync_p50_us=p50, sync_p99_us=p99, sync_rps=sync_rps,
             pipelined_rps=pipelined, future_rps=futures, window=args.window, body_bytes=len(BODY))
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


if __name__ == "__main__":
    main()
