"""The remoting server: accepts connections, hands request frames to one handler, writes replies.

It runs on the loop that calls :meth:`RemotingServer.start` (the broker shares uvicorn's).
A handler answering synchronously is served without creating a task -- the hot path; an
awaitable answer runs as a task, a :class:`Deferred` one from its future's done callback.  PING is
answered here; everything else is the handler's.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, cast

from ..common.errors import ErrorCode, SparkMQError
from ..common.limits import ConnectionLimits, PerAddressCounter, RefusalLog
from ..common.protocol import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    RESPONSE_SUCCESS,
    SERVER_VERSION,
    ExtHeader,
    RequestCode,
)
from ..common.tls import Listener, TlsSettings, create_server
from .codec import (
    Frame,
    FrameData,
    FrameDecoder,
    ProtocolError,
    RemotingError,
    Reply,
    encode_frame,
)

__all__ = ["Deferred", "Handler", "RemotingServer", "ServerConnection"]

log = logging.getLogger("sparkmq.remoting")


class Deferred(NamedTuple):
    """An answer that waits for an asyncio ``future`` of the server's loop without a task: once it is done,
    ``finish(future)`` makes the :class:`Reply` (or raises as a handler would) in the future's done callback."""

    future: asyncio.Future[Any]
    finish: Callable[[asyncio.Future[Any]], Reply | None]


#: ``handler(conn, frame)``: a :class:`Reply`, an awaitable of one, a :class:`Deferred` one, or None (no
#: answer to a ONEWAY request, an empty success to any other).
Handler = Callable[["ServerConnection", Frame], "Reply | Awaitable[Reply | None] | Deferred | None"]

_PING = int(RequestCode.SPARKMQ_PING)
#: Opaques are Java ints: this side's own requests keep to the positive half.
_MASK31 = 0x7FFFFFFF
#: Stop reading a connection whose unsent replies exceed this, until they drain to a quarter of it.
DEFAULT_WRITE_HIGH_WATER = 4 << 20
#: A request with at most this many body bytes is always taken, whatever the unanswered-bytes limits say: its
#: bytes are few, and control traffic (heartbeats, offset commits) must get through an overloaded server.
SMALL_REQUEST_BYTES = 4096


class ServerConnection(asyncio.Protocol):
    """One accepted connection.

    ``peer`` is ``"ip:port"``; ``attributes`` is free for the broker (a bound client id, groups).
    :meth:`push` and :meth:`close` may be called from any thread.
    """

    def __init__(self, server: RemotingServer) -> None:
        self.server = server
        self.peer = "?"
        #: The source IP, counted against the per-address limit once admitted.
        self.ip: str | None = None
        self.attributes: dict[str, Any] = {}
        self._loop = server._loop
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(server.max_frame_bytes)
        self._closed = False
        self._close_callbacks: list[Callable[[ServerConnection], None]] = []
        self._push_ids = itertools.count(1)
        #: opaque -> the future of a request this side sent and wants answered (:meth:`request`).
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._wq: list[bytes | memoryview] | None = None  # writes coalesced until the next loop pass
        self._inflight = 0    # handler tasks not yet answered (a connection with some is not idle)
        self._active = True   # received something since the last idle sweep
        self._idle_since = 0.0
        self._write_paused = False     # the peer does not read its replies (backpressure)
        self._inflight_paused = False  # too many of its requests are being answered (backpressure)
        #: Body bytes of its requests read and not answered yet (held by their handlers).
        self.unanswered_bytes = 0
        #: ``time.monotonic()`` when the read that completed the request being handled was decoded: a handler's
        #: ``time.monotonic() - conn.received_at`` is how long its request waited in this server.
        self.received_at = 0.0

    # ---- public -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection is closed or closing."""
        return self._closed

    def push(self, code: int, ext: ExtHeader | dict[str, str] | None = None, body: bytes | memoryview = b"") -> bool:
        """Send a ONEWAY request to the client (a notice); thread-safe; False if the connection is gone."""
        if self._closed:
            return False
        data = encode_frame(code, FLAG_ONEWAY, next(self._push_ids) & _MASK31, ext, body, version=SERVER_VERSION)
        if threading.get_ident() == self.server._loop_thread_id:
            self._queue_write(data)
            return True
        try:
            self._loop.call_soon_threadsafe(self._queue_write, data)
        except RuntimeError:  # the loop is closed
            return False
        return True

    async def request(self, code: int, ext: ExtHeader | dict[str, str] | None = None, body: bytes | memoryview = b"",
                      timeout_s: float = 3.0) -> Frame:
        """Send a request to the client and await its response (any code); on the server's loop only.

        RemotingError when the connection closes or the client does not answer within ``timeout_s``.
        """
        if self._closed:
            raise RemotingError(self.peer, "connection closed")
        opaque = next(self._push_ids) & _MASK31
        future: asyncio.Future[Frame] = self._loop.create_future()
        self._pending[opaque] = future
        self._queue_write(encode_frame(code, 0, opaque, ext, body, version=SERVER_VERSION))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise RemotingError(self.peer, f"no answer to request code {code} within {timeout_s} s",
                                timed_out=True) from None
        finally:
            self._pending.pop(opaque, None)

    def close(self) -> None:
        """Close after the replies already written are flushed; thread-safe."""
        if threading.get_ident() == self.server._loop_thread_id:
            self._close()
        else:
            try:
                self._loop.call_soon_threadsafe(self._close)
            except RuntimeError:
                pass

    def on_close(self, callback: Callable[[ServerConnection], None]) -> None:
        """Call ``callback(conn)`` on the loop once the connection is closed (at once if it already is)."""
        if self._closed and self._transport is None:
            self._loop.call_soon(callback, self)
        else:
            self._close_callbacks.append(callback)

    def __repr__(self) -> str:
        return f"<ServerConnection {self.peer}{' closed' if self._closed else ''}>"

    # ---- asyncio protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's transport has asyncio.Transport's methods (uvloop's are not its subclasses).
        self._transport = stream = cast(asyncio.Transport, transport)
        peer = stream.get_extra_info("peername")
        host = "?"
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = peer[0]
            self.peer = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
        if not self.server._admit(self, host):
            self._closed = True
            stream.abort()
            return
        high = self.server.write_high_water
        stream.set_write_buffer_limits(high=high, low=high // 4)
        self.server._opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._transport = None
        self._wq = None
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(RemotingError(self.peer, "connection closed"))
        if self.ip is None:  # refused in connection_made: never opened as far as the server is concerned
            return
        self.server._lost(self)
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("on_close callback of %s failed", self.peer)

    def pause_writing(self) -> None:
        # Backpressure: the peer does not read its replies fast enough; stop taking its requests.
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._write_paused or self._inflight_paused:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._active = True
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            self.server._protocol_error(self, exc)
            return
        self.received_at = time.monotonic()  # decoded: from now on its requests wait for their turn
        server = self.server
        server.requests += len(frames)
        handler = server._handler
        out: list[bytes | memoryview] = []
        for frame in frames:
            flags = frame.flag
            if flags & FLAG_RESPONSE:
                future = self._pending.pop(frame.opaque, None)  # an answer to request(); any other is a stray
                if future is not None and not future.done():
                    future.set_result(frame)
                continue
            oneway = flags & FLAG_ONEWAY
            if frame.code == _PING:
                if not oneway:
                    out.append(_success_frame(frame.opaque))
                continue
            if server._stopping:
                if not oneway:
                    _extend(out, _error_frame(frame.opaque, ErrorCode.SERVICE_NOT_AVAILABLE, "server is stopping"))
                continue
            size = len(frame.body)
            if size > SMALL_REQUEST_BYTES and (self.unanswered_bytes or server.unanswered_bytes) \
                    and self._over_bytes(size):
                if not oneway:
                    _extend(out, _error_frame(frame.opaque, ErrorCode.SYSTEM_BUSY, self._over_bytes(size)))
                server._busy("UNANSWERED_BYTES_FULL")
                continue
            try:
                reply = handler(self, frame)
            except SparkMQError as exc:
                if not oneway:
                    _extend(out, _error_frame(frame.opaque, exc.code, exc.message))
                continue
            except Exception as exc:
                server._handler_failed(frame, exc)
                if not oneway:
                    _extend(out, _error_frame(frame.opaque, ErrorCode.INTERNAL_ERROR, _internal_message(exc)))
                continue
            if type(reply) is Reply:
                if not oneway:
                    _extend(out, _reply_frame(frame.opaque, reply))
            elif reply is None:
                if not oneway:
                    out.append(_success_frame(frame.opaque))
            else:
                self._spawn(frame, reply)
        if out and not self._closed:
            transport = self._transport
            if transport is not None:
                if len(out) == 1:
                    transport.write(out[0])
                else:
                    transport.writelines(out)

    # ---- internals ----------------------------------------------------------------------

    def _over_bytes(self, size: int) -> str:
        """Why a request of ``size`` body bytes may not be taken now (its bytes would be held beyond a limit), or ""."""
        limits = self.server.limits
        if self.unanswered_bytes and self.unanswered_bytes + size > limits.max_unanswered_bytes_per_connection:
            return (f"[UNANSWERED_BYTES_FULL]broker busy, start flow control for a while: {self.unanswered_bytes} "
                    f"bytes of this connection's requests are not answered yet "
                    f"(max_unanswered_bytes_per_connection is {limits.max_unanswered_bytes_per_connection})")
        held = self.server.unanswered_bytes
        if held and held + size > limits.max_unanswered_bytes:
            return (f"[UNANSWERED_BYTES_FULL]broker busy, start flow control for a while: {held} bytes of requests "
                    f"are not answered yet (max_unanswered_bytes is {limits.max_unanswered_bytes})")
        return ""

    def _spawn(self, frame: Frame, awaitable: Any) -> None:
        self._inflight += 1
        size = len(frame.body)
        self.unanswered_bytes += size
        self.server.unanswered_bytes += size
        if self._inflight >= self.server.limits.max_inflight_per_connection and not self._inflight_paused:
            # Read no more of its requests until answers go out (a long-poll flood, a runaway pipeline).
            self._inflight_paused = True
            self._update_reading()
        if type(awaitable) is Deferred:
            finish = awaitable.finish
            awaitable.future.add_done_callback(lambda f: self._answer_deferred(frame, finish, f))
            self.server._track(awaitable.future)
            return
        task = self._loop.create_task(self._answer_later(frame, awaitable))
        self.server._track(task)

    async def _answer_later(self, frame: Frame, awaitable: Awaitable[Reply | None]) -> None:
        try:
            reply = await awaitable
        except Exception as exc:
            self._answered(frame, None, exc)
        except BaseException:  # cancelled (a stop past its grace): nothing to answer
            self._done_one(frame)
            raise
        else:
            self._answered(frame, reply, None)

    def _answer_deferred(self, frame: Frame, finish: Callable[[asyncio.Future[Any]], Reply | None],
                         future: asyncio.Future[Any]) -> None:
        if future.cancelled():  # a stop past its grace: nothing to answer
            self._done_one(frame)
            return
        try:
            reply = finish(future)
        except Exception as exc:
            self._answered(frame, None, exc)
        else:
            self._answered(frame, reply, None)

    def _answered(self, frame: Frame, reply: Any, error: Exception | None) -> None:
        """Queue the answer to a request answered later: its reply, or the error its handler raised."""
        self._done_one(frame)
        if frame.flag & FLAG_ONEWAY:
            if error is not None and not isinstance(error, SparkMQError):
                self.server._handler_failed(frame, error)
            return
        if isinstance(error, SparkMQError):
            data = _error_frame(frame.opaque, error.code, error.message)
        elif error is None and reply is None:
            data = _success_frame(frame.opaque)
        elif error is None and type(reply) is Reply:
            data = _reply_frame(frame.opaque, reply)
        else:
            if error is None:
                error = TypeError(f"handler answered {type(reply).__name__}, not Reply")
            self.server._handler_failed(frame, error)
            data = _error_frame(frame.opaque, ErrorCode.INTERNAL_ERROR, _internal_message(error))
        self._queue_write(data)

    def _done_one(self, frame: Frame) -> None:
        self._inflight -= 1
        size = len(frame.body)
        self.unanswered_bytes -= size
        self.server.unanswered_bytes -= size
        if self._inflight_paused and self._inflight < self.server.limits.max_inflight_per_connection // 2:
            self._inflight_paused = False
            self._update_reading()

    def _queue_write(self, data: FrameData) -> None:
        """Write on the next loop pass, together with everything else queued in this one."""
        if self._closed:
            return
        wq = self._wq
        if wq is None:
            self._wq = wq = []
            self._loop.call_soon(self._flush)
        _extend(wq, data)

    def _flush(self) -> None:
        wq, self._wq = self._wq, None
        transport = self._transport
        if wq and transport is not None and not self._closed:
            if len(wq) == 1:
                transport.write(wq[0])
            else:
                transport.writelines(wq)

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._wq:
            self._flush_before_close()
        if self._transport is not None:
            self._transport.close()

    def _flush_before_close(self) -> None:
        wq, self._wq = self._wq, None
        if wq and self._transport is not None:
            self._transport.writelines(wq)

    def _abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()


def _extend(out: list[bytes | memoryview], data: FrameData) -> None:
    if isinstance(data, bytes):
        out.append(data)
    else:
        out.extend(data)


def _error_frame(opaque: int, code: ErrorCode, message: str) -> FrameData:
    return encode_frame(code.remoting_code, FLAG_RESPONSE, opaque, {"errorCode": code.name}, b"", message,
                        version=SERVER_VERSION)


def _reply_frame(opaque: int, reply: Reply) -> FrameData:
    return encode_frame(reply.code, FLAG_RESPONSE, opaque, reply.ext, reply.body, reply.remark,
                        version=SERVER_VERSION)


def _success_frame(opaque: int) -> bytes:
    return encode_frame(RESPONSE_SUCCESS, FLAG_RESPONSE, opaque, version=SERVER_VERSION)  # type: ignore[return-value]


def _internal_message(exc: BaseException) -> str:
    return f"internal error: {type(exc).__name__}: {exc}"


class RemotingServer:
    """A remoting server on the running event loop.

    ``handler(conn, frame)`` answers each request frame (PING excepted): a :class:`Reply`
    (written at once, no task), an awaitable of one (run as a task), or None (nothing for a
    ONEWAY request, an empty success otherwise).  A raised :class:`SparkMQError` becomes an error
    response with its code; any other exception INTERNAL_ERROR (logged once per request code and
    exception type).  Request codes it does not know it answers with
    :func:`~.codec.unsupported_reply`.

    ``on_connect(conn)`` is called for each accepted connection; :attr:`connection_count` and
    :meth:`stats` report on them.  A connection that sent nothing for ``idle_timeout_s`` (and has
    no request being answered) is closed; one whose unsent replies exceed ``write_high_water`` is
    not read until they drain to a quarter of it (backpressure).  A request (of more than
    :data:`SMALL_REQUEST_BYTES`) whose body would take the bytes
    read and not answered beyond ``limits.max_unanswered_bytes_per_connection`` (that connection's) or
    ``limits.max_unanswered_bytes`` (all together) is answered SYSTEM_BUSY at once; ``on_busy(reason)`` hears
    of each.  A protocol error closes only the
    connection that made it.  With ``tls`` (certificates configured) the port speaks TLS, and plaintext
    too unless ``tls.required``.
    """

    def __init__(self, handler: Handler, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, write_high_water: int = DEFAULT_WRITE_HIGH_WATER,
                 backlog: int = 1024, on_connect: Callable[[ServerConnection], None] | None = None,
                 tls: TlsSettings | None = None, limits: ConnectionLimits | None = None) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_s
        self.write_high_water = write_high_water
        self.backlog = backlog
        self.on_connect = on_connect
        #: TLS of the port (:func:`~sparkmq.platform.common.tls.create_server`): off, both, or TLS only.
        self.tls = tls
        #: Connections per source address and requests in flight per connection (settable before start).
        self.limits = limits or ConnectionLimits()
        self.host: str | None = None
        self.port: int | None = None
        self.requests = 0
        #: Body bytes of requests read and not answered yet, all connections together.
        self.unanswered_bytes = 0
        #: ``on_busy(reason)`` for each request this server answers SYSTEM_BUSY itself (the broker counts them).
        self.on_busy: Callable[[str], None] | None = None
        self._busy_answers = 0
        self._handler = handler
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()
        self._loop_thread_id: int | None = None
        self._server: Listener | None = None
        self._conns: set[ServerConnection] = set()
        #: Answers not yet given: handler tasks and Deferred futures.
        self._tasks: set[asyncio.Future[Any]] = set()
        self._stopping = False
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._all_closed: asyncio.Event | None = None
        self._accepted = 0
        self._protocol_errors = 0
        self._idle_closed = 0
        self._handler_errors = 0
        self._logged_failures: set[tuple[int, type]] = set()
        self._per_ip: PerAddressCounter | None = None
        self._refusals = RefusalLog(log, "remoting")

    @property
    def connection_count(self) -> int:
        """Open connections."""
        return len(self._conns)

    @property
    def connections(self) -> list[ServerConnection]:
        """A snapshot of the open connections."""
        return list(self._conns)

    def stats(self) -> dict[str, int]:
        """Counters: open connections, accepted, requests, protocol errors, idle closes, handler errors."""
        return {"connections": len(self._conns), "accepted": self._accepted, "requests": self.requests,
                "protocol_errors": self._protocol_errors, "idle_closed": self._idle_closed,
                "handler_errors": self._handler_errors, "in_flight": len(self._tasks),
                "unanswered_bytes": self.unanswered_bytes, "busy": self._busy_answers,
                "refused": sum(self._refusals.refused.values())}

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> RemotingServer:
        """Listen on ``host:port`` (0 = a free port, see :attr:`port`) on the running loop; returns self."""
        if self._server is not None:
            raise RuntimeError("RemotingServer already started")
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._stopping = False
        self._server = await create_server(lambda: ServerConnection(self), host, port, tls=self.tls,
                                           backlog=self.backlog)
        sock = self._server.sockets[0]
        self.host, self.port = sock.getsockname()[:2]
        self._arm_sweep()
        return self

    def start_shared(self) -> RemotingServer:
        """Serve connections another listener accepted and handed over (:meth:`adopt`) on the running loop,
        without a port of its own: an HTTP port that tells remoting from HTTP by the first byte
        (``api/serving.py``).  Returns self."""
        if self._loop_thread_id is not None and not self._stopping:
            raise RuntimeError("RemotingServer already started")
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._stopping = False
        self._arm_sweep()
        return self

    def adopt(self) -> ServerConnection:
        """A new connection of this server for a transport accepted elsewhere: the caller calls its
        ``connection_made(transport)`` and feeds it the bytes already read."""
        if self._loop_thread_id is None:
            raise RuntimeError("start() or start_shared() the RemotingServer before adopting connections")
        return ServerConnection(self)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop gracefully: accept nothing new, answer in-flight requests (up to ``grace_s``), then close.

        Requests arriving meanwhile get SERVICE_NOT_AVAILABLE.  Handlers still running after the
        grace period are cancelled and their connections aborted.
        """
        if self._server is None and (self._loop_thread_id is None or self._stopping):
            return
        loop = self._loop
        deadline = loop.time() + max(grace_s, 0.0)
        self._stopping = True
        if self._server is not None:
            self._server.close()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=max(deadline - loop.time(), 0.0))
        leftover = list(self._tasks)
        for task in leftover:
            task.cancel()
        if leftover:
            await asyncio.gather(*leftover, return_exceptions=True)
        for conn in list(self._conns):
            conn._close()  # flushes the answers already written, then closes
        if self._conns:
            self._all_closed = asyncio.Event()
            try:
                await asyncio.wait_for(self._all_closed.wait(), max(deadline - loop.time(), 0.0) + 0.05)
            except TimeoutError:
                pass
            self._all_closed = None
        for conn in list(self._conns):
            conn._abort()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except TimeoutError:  # pragma: no cover - defensive
                pass
        self._server = None
        self._loop_thread_id = None

    # ---- called by connections ----------------------------------------------------------

    def _admit(self, conn: ServerConnection, ip: str) -> bool:
        if self._per_ip is None or self._per_ip.limit != self.limits.max_connections_per_ip:
            self._per_ip = PerAddressCounter(self.limits.max_connections_per_ip)
        if not self._per_ip.admit(ip):
            self._refusals.refused_one(ip, f"{self._per_ip[ip]} connections open, the most one address may hold "
                                           f"(max_connections_per_ip)")
            return False
        conn.ip = ip
        return True

    def _opened(self, conn: ServerConnection) -> None:
        self._accepted += 1
        self._conns.add(conn)
        if self._stopping:
            conn._abort()
            return
        if self.on_connect is not None:
            try:
                self.on_connect(conn)
            except Exception:
                log.exception("on_connect callback failed for %s", conn.peer)

    def _lost(self, conn: ServerConnection) -> None:
        self._conns.discard(conn)
        if conn.ip is not None and self._per_ip is not None:
            self._per_ip.release(conn.ip)
        if not self._conns and self._all_closed is not None:
            self._all_closed.set()

    def _track(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _busy(self, reason: str) -> None:
        self._busy_answers += 1
        if self.on_busy is not None:
            self.on_busy(reason)

    def _protocol_error(self, conn: ServerConnection, exc: ProtocolError) -> None:
        # The next frame boundary is lost: send nothing more, drop the connection.
        self._protocol_errors += 1
        log.warning("remoting protocol error from %s, closing: %s", conn.peer, exc)
        conn._abort()

    def _handler_failed(self, frame: Frame, exc: BaseException) -> None:
        self._handler_errors += 1
        key = (frame.code, type(exc))
        if key in self._logged_failures:
            log.debug("handler failed again on request code %d: %r", frame.code, exc)
            return
        self._logged_failures.add(key)
        log.error("handler failed on request code %d (answered INTERNAL_ERROR; logged once per code and type)",
                  frame.code, exc_info=exc)

    def _arm_sweep(self) -> None:
        interval = min(max(self.idle_timeout_s / 4, 0.05), 5.0)
        self._sweep_handle = self._loop.call_later(interval, self._sweep)

    def _sweep(self) -> None:
        # One timer for all connections: a connection that received nothing across sweeps spanning
        # idle_timeout_s (and has no request being answered) is closed.
        now = self._loop.time()
        for conn in list(self._conns):
            if conn._active:
                conn._active = False
                conn._idle_since = now
            elif conn._inflight == 0 and now - conn._idle_since >= self.idle_timeout_s:
                self._idle_closed += 1
                log.debug("closing idle remoting connection %s", conn.peer)
                conn._close()
        self._arm_sweep()
