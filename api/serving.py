"""Serving a FastAPI app with uvicorn the way every sparkmq service does.

* The socket is bound first (:func:`bind_socket`), so ``--port 0`` knows its real port
  before anything uses it (the broker writes its address into every record).
* :class:`Server` turns SIGTERM/SIGINT into a graceful exit and, unlike uvicorn, does
  not re-raise the signal afterwards: the service still has to unregister and persist.
* :func:`serve_app` calls ``on_ready(host, port)`` once connections are accepted; the
  runners print their ``<kind> listening on http://HOST:PORT`` line from it.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI

from ..platform.remoting import new_event_loop

__all__ = ["Server", "bind_socket", "serve_app", "announcer", "run_service"]

T = TypeVar("T")


def run_service(main: Coroutine[Any, Any, T]) -> T:
    """Run a service's main coroutine to the end on a new uvloop event loop (asyncio's when uvloop is missing).

    uvloop's transports cost a fraction of asyncio's per read and write: the remoting port and the
    HTTP API share this loop, so every request is cheaper.
    """
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 = a free port); uvicorn listens on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio turns TCP_NODELAY on only for sockets whose protocol says TCP,
    # and without it every response body waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def announcer(kind: str) -> Callable[[str, int], None]:
    """``on_ready`` that prints ``<kind> listening on http://HOST:PORT`` (what tests and scripts wait for)."""
    def announce(host: str, port: int) -> None:
        print(f"{kind} listening on http://{host}:{port}", flush=True)
    return announce


class Server(uvicorn.Server):
    """uvicorn's server, but a caught SIGTERM/SIGINT is not re-raised after serving.

    uvicorn re-raises the signal once it stopped serving, which would kill the process
    before a broker unregisters and persists its offsets.
    """

    def __init__(self, config: uvicorn.Config, handle_signals: bool) -> None:
        super().__init__(config)
        self._handle_signals = handle_signals

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Turn SIGINT/SIGTERM into a graceful exit while serving (main thread only)."""
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


async def serve_app(app: FastAPI, sock: socket.socket, on_ready: Callable[[str, int], None], *,
                    handle_signals: bool = True, log_level: str = "warning", lifespan: str = "on",
                    server_ready: Callable[[Server], None] | None = None) -> bool:
    """Serve ``app`` on ``sock`` until stopped; returns whether it ever accepted connections.

    ``server_ready(server)`` gets the server as soon as it exists (set ``should_exit`` on it to stop).
    """
    config = uvicorn.Config(app, log_level=log_level, lifespan=lifespan, access_log=False,
                            timeout_graceful_shutdown=10)
    server = Server(config, handle_signals)
    if server_ready is not None:
        server_ready(server)

    async def watch() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        host, port = sock.getsockname()[:2]
        on_ready(host, port)

    watcher = asyncio.create_task(watch())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        sock.close()
    return server.started
