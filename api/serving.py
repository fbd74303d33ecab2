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
import logging
import signal
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Literal, TypeVar

import uvicorn
from fastapi import FastAPI

from ..platform.common.limits import ConnectionLimits, PerAddressCounter, RefusalLog
from ..platform.common.tls import TlsSettings
from ..platform.remoting import RemotingServer, new_event_loop

__all__ = ["Server", "bind_socket", "serve_app", "announcer", "run_service", "http_options", "sniffing_protocol"]

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


def announcer(kind: str, scheme: str = "http") -> Callable[[str, int], None]:
    """``on_ready`` that prints ``<kind> listening on http://HOST:PORT`` (what tests and scripts wait for)."""
    def announce(host: str, port: int) -> None:
        print(f"{kind} listening on {scheme}://{host}:{port}", flush=True)
    return announce


def http_options(tls: TlsSettings | None, limits: ConnectionLimits | None = None,
                 remoting: RemotingServer | None = None) -> dict[str, Any]:
    """``uvicorn.Config`` keywords every sparkmq HTTP port gets: TLS from ``tls`` (an HTTP port with a
    certificate serves TLS only: uvicorn cannot tell TLS from plaintext on one port) and ``limits``
    (connections per address, a deadline for each request's head, keep-alive and concurrency caps).
    With ``remoting`` the port serves RocketMQ remoting too (:func:`sniffing_protocol`)."""
    limits = limits or ConnectionLimits()
    http = guarded_http_protocol(limits)
    if remoting is not None:
        http = sniffing_protocol(http, remoting, limits)
    options: dict[str, Any] = {"http": http, "timeout_keep_alive": limits.http_keep_alive_s,
                               "limit_concurrency": limits.http_max_concurrency}
    if tls is not None and tls.enabled:
        options.update(ssl_certfile=str(tls.cert_file), ssl_keyfile=str(tls.key_file))
    return options


_http_log = logging.getLogger("sparkmq.http")

#: A remoting frame starts with its big-endian length, below 2**26 (64 MiB): a first byte of at most 0x03.
#: An HTTP request starts with its method's first letter, so a byte below 0x20 can only be remoting.
_REMOTING_FIRST_BYTE_MAX = 0x1F


def sniffing_protocol(http_class: type[asyncio.Protocol], remoting: RemotingServer,
                      limits: ConnectionLimits | None = None) -> type[asyncio.Protocol]:
    """A protocol for uvicorn that serves RocketMQ remoting and HTTP on one port, told apart by the first byte
    a client sends (docs/remoting.md, "One port"): a control byte starts a remoting frame (its length's high
    byte), anything else an HTTP request.  The connection then belongs to ``remoting``'s
    :class:`~sparkmq.platform.remoting.ServerConnection` or to ``http_class`` as if it had been accepted by
    it; nothing is sniffed again.  ``remoting`` must be started with ``start_shared()`` on the serving loop.

    A connection that has not said which it is yet is neither's to limit, so ``limits`` apply here too: at
    most ``max_connections_per_ip`` such silent connections per source address (more are closed at once), and
    one that sends nothing within ``http_header_timeout_s`` is closed (a RocketMQ client sends its first
    request as soon as it connects, an HTTP client its request head).
    """
    limits = limits or ConnectionLimits()
    silent = PerAddressCounter(limits.max_connections_per_ip)
    refusals = RefusalLog(_http_log, "connections not yet identified")
    first_byte_timeout_s = limits.http_header_timeout_s

    class SniffingProtocol(asyncio.Protocol):
        __slots__ = ("_args", "_kwargs", "_transport", "_paused", "_ip", "_timer")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._args = args  # uvicorn's (config, server_state, app_state): the HTTP protocol's, made later
            self._kwargs = kwargs
            self._transport: asyncio.Transport | None = None
            self._paused = False
            self._ip: str | None = None
            self._timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = transport.get_extra_info("peername")
            ip = peer[0] if peer else "?"
            if not silent.admit(ip):
                refusals.refused_one(ip, f"{silent[ip]} silent connections open (max_connections_per_ip)")
                transport.abort()  # type: ignore[attr-defined]
                return
            self._transport = transport  # type: ignore[assignment]
            self._ip = ip
            self._timer = asyncio.get_running_loop().call_later(first_byte_timeout_s, self._silent_too_long)

        def _identified(self) -> None:
            """The connection spoke (or went): it no longer counts as silent."""
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._ip is not None:
                silent.release(self._ip)
                self._ip = None

        def _silent_too_long(self) -> None:
            self._timer = None
            if self._transport is not None and not self._transport.is_closing():
                _http_log.debug("closing a connection from %s: nothing sent within %.1f s", self._ip,
                                first_byte_timeout_s)
                self._transport.close()

        def data_received(self, data: bytes) -> None:
            transport = self._transport
            if transport is None or not data:
                return
            self._identified()
            protocol: asyncio.Protocol
            if data[0] <= _REMOTING_FIRST_BYTE_MAX:
                protocol = remoting.adopt()
            else:
                protocol = http_class(*self._args, **self._kwargs)
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
            if self._paused:
                protocol.pause_writing()
            if not transport.is_closing():
                protocol.data_received(data)

        def eof_received(self) -> bool | None:
            return None  # closed before a byte arrived: let the transport close

        def connection_lost(self, exc: Exception | None) -> None:
            self._identified()
            self._transport = None

        def pause_writing(self) -> None:
            self._paused = True

        def resume_writing(self) -> None:
            self._paused = False

    return SniffingProtocol


def guarded_http_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with what uvicorn lacks: at most ``limits.max_connections_per_ip``
    connections per source address (more are closed at once, logged once a minute per address), and a
    request head that has not arrived within ``limits.http_header_timeout_s`` closes the connection (uvicorn
    has no header timeout: a client trickling header bytes would hold its connection for ever)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415  # uvicorn[standard]

    per_ip = PerAddressCounter(limits.max_connections_per_ip)  # one per port: each serve builds its own class
    refusals = RefusalLog(_http_log, "http")
    head_timeout_s = limits.http_header_timeout_s

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _ip: str | None = None
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            ip = self.client[0] if self.client else "?"
            if not per_ip.admit(ip):
                refusals.refused_one(ip, f"{per_ip[ip]} connections open (max_connections_per_ip)")
                transport.abort()
                return
            self._ip = ip
            self._arm_head_timer()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._head_timer is None:  # the next request on a kept-alive connection: its head has a deadline
                self._arm_head_timer()

        def on_headers_complete(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            if self._ip is not None:
                per_ip.release(self._ip)
                self._ip = None
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_too_slow)

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                _http_log.debug("closing %s: no complete request head within %.1f s", self.client, head_timeout_s)
                self.transport.close()

    return GuardedHttpToolsProtocol


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
                    handle_signals: bool = True, log_level: str = "warning",
                    lifespan: Literal["auto", "on", "off"] = "on",
                    server_ready: Callable[[Server], None] | None = None, tls: TlsSettings | None = None,
                    limits: ConnectionLimits | None = None, remoting: RemotingServer | None = None) -> bool:
    """Serve ``app`` on ``sock`` until stopped; returns whether it ever accepted connections.

    ``server_ready(server)`` gets the server as soon as it exists (set ``should_exit`` on it to stop).
    With ``tls`` (a certificate configured) the port serves HTTPS only.  With ``remoting`` (started with
    ``start_shared()``) the port serves RocketMQ remoting too, told apart by the first byte
    (:func:`sniffing_protocol`); stopping it is the caller's.
    """
    config = uvicorn.Config(app, log_level=log_level, lifespan=lifespan, access_log=False,
                            timeout_graceful_shutdown=10, **http_options(tls, limits, remoting))
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
