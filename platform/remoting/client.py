"""The remoting client connection: many requests in flight on one TCP connection.

:class:`RemotingConnection` lives on one event loop; many requests are in flight at once,
matched by opaque.  Asyncio code awaits :meth:`~RemotingConnection.request`; other threads call
:meth:`~RemotingConnection.request_blocking` or :meth:`~RemotingConnection.request_future`, which
encode in the calling thread, register a light waiter and hand only the write to the loop
(one ``call_soon_threadsafe``) -- the loop's ``data_received`` completes the waiter directly.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import ssl
import threading
from collections.abc import Callable
from typing import Any

from ..common.errors import ErrorCode, SparkMQError
from ..common.protocol import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    RESPONSE_SUCCESS,
    ExtHeader,
    RequestCode,
)
from ..common.validation import split_addr
from .codec import (
    Frame,
    FrameData,
    FrameDecoder,
    ProtocolError,
    RemotingError,
    Reply,
    Response,
    encode_frame,
    error_from_frame,
    error_reply,
)

__all__ = [
    "SUCCESS_ONLY",
    "Ext",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "PushCallback",
    "RemotingConnection",
]

log = logging.getLogger("sparkmq.remoting")

#: Client defaults (client settings, not protocol limits).
DEFAULT_CONNECT_TIMEOUT_S = 3.0
DEFAULT_REQUEST_TIMEOUT_S = 5.0

_PING = int(RequestCode.SPARKMQ_PING)
#: Opaques are Java ints on the other side: this side's stay in the positive half.
_MASK31 = 0x7FFFFFFF

#: The response codes a request answers with by default (any other raises); a pull passes its outcomes too.
SUCCESS_ONLY: frozenset[int] = frozenset({RESPONSE_SUCCESS})
#: A request's header: a typed extFields struct, a ready map of strings, or none.
Ext = ExtHeader | dict[str, str] | None
_INVALID_STATE = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)

#: ``on_push(frame)`` of a connection: called on its loop for each request the server sends.
PushCallback = Callable[[Frame], "Reply | None"]


def _answer(frame: Frame, ok: frozenset[int]) -> Response:
    """The response when its code is one of ``ok``; else the error it stands for is raised."""
    if frame.code in ok:
        return frame
    raise error_from_frame(frame)


class _SyncWaiter:
    """A waiter a blocked thread sleeps on: a pre-acquired lock the loop releases."""

    __slots__ = ("_lock", "frame", "exc")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.frame: Frame | None = None
        self.exc: BaseException | None = None

    def set_result(self, frame: Frame) -> None:
        self.frame = frame
        self._lock.release()

    def set_exception(self, exc: BaseException) -> None:
        self.exc = exc
        self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        return self._lock.acquire(True, -1 if timeout is None else timeout)


class _FutureWaiter:
    """Completes a ``concurrent.futures.Future`` with a :class:`Response` (or the error)."""

    __slots__ = ("future", "timer", "ok")

    def __init__(self, future: concurrent.futures.Future[Response], ok: frozenset[int]) -> None:
        self.future = future
        self.timer: asyncio.TimerHandle | None = None
        self.ok = ok

    def set_result(self, frame: Frame) -> None:
        if self.timer is not None:
            self.timer.cancel()
        try:
            if frame.code in self.ok:
                self.future.set_result(frame)
            else:
                self.future.set_exception(error_from_frame(frame))
        except _INVALID_STATE:  # cancelled by its owner
            pass

    def set_exception(self, exc: BaseException) -> None:
        if self.timer is not None:
            self.timer.cancel()
        try:
            self.future.set_exception(exc)
        except _INVALID_STATE:
            pass


class _PingWaiter:
    __slots__ = ("answered",)

    def __init__(self) -> None:
        self.answered = False

    def set_result(self, frame: Frame) -> None:
        self.answered = True

    def set_exception(self, exc: BaseException) -> None:
        pass


class RemotingConnection(asyncio.Protocol):
    """A client connection to one remoting server (see :meth:`connect`).

    Async methods run on the connection's loop; :meth:`request_blocking`, :meth:`request_future`,
    :meth:`oneway` and :meth:`close_threadsafe` may be called from any thread.  ``on_push(frame)``
    runs on the loop for each request the server sends (a ONEWAY notice); for a request that
    wants an answer it may return a :class:`Reply` (None answers REQUEST_CODE_NOT_SUPPORTED).
    """

    def __init__(self, addr: str, loop: asyncio.AbstractEventLoop, *,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 heartbeat_interval_s: float | None = DEFAULT_HEARTBEAT_INTERVAL_S,
                 on_push: PushCallback | None = None) -> None:
        self.addr = addr
        self.max_frame_bytes = max_frame_bytes
        self.heartbeat_interval_s = heartbeat_interval_s
        self.on_push = on_push
        self._loop = loop
        self._loop_tid = threading.get_ident()
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(max_frame_bytes)
        self._pending: dict[int, Any] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._close_reason = "connection closed"
        self._lost: asyncio.Future[None] = loop.create_future()
        self._wq: list[bytes | memoryview] | None = None
        self._sent = False
        self._ping: _PingWaiter | None = None
        self._heartbeat_handle: asyncio.TimerHandle | None = None

    @classmethod
    async def connect(cls, addr: str, *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                      max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                      heartbeat_interval_s: float | None = DEFAULT_HEARTBEAT_INTERVAL_S,
                      on_push: PushCallback | None = None,
                      ssl_context: ssl.SSLContext | None = None) -> RemotingConnection:
        """Open a connection to ``"host:port"`` on the running loop; raises :class:`RemotingError`.

        With ``ssl_context`` the connection is TLS, the server verified as the context says (a failed
        verification or a server that does not speak TLS is a RemotingError too).
        """
        loop = asyncio.get_running_loop()
        host, port = split_addr(addr, "remoting address")
        conn = cls(addr, loop, max_frame_bytes=max_frame_bytes, heartbeat_interval_s=heartbeat_interval_s,
                   on_push=on_push)
        tls: dict[str, Any] = {} if ssl_context is None else {"ssl": ssl_context, "server_hostname": host}
        try:
            await asyncio.wait_for(loop.create_connection(lambda: conn, host, port, **tls), timeout)
        except TimeoutError:
            raise RemotingError(addr, f"connect timed out after {timeout:g}s") from None
        except ssl.SSLError as exc:  # before OSError: SSLError is one
            raise RemotingError(addr, f"TLS handshake failed ({exc.reason or exc})") from None
        except OSError as exc:
            raise RemotingError(addr, f"connect failed ({exc.strerror or exc})") from None
        return conn

    # ---- state --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once closed (by either side); requests then raise :class:`RemotingError`."""
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests waiting for their response."""
        return len(self._pending)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the connection runs on."""
        return self._loop

    def __repr__(self) -> str:
        return f"<RemotingConnection {self.addr}{' closed' if self._closed else ''} in_flight={len(self._pending)}>"

    # ---- requests -----------------------------------------------------------------------

    async def request(self, code: int, ext: Ext = None, body: bytes | memoryview = b"",
                      timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S, ok: frozenset[int] = SUCCESS_ONLY
                      ) -> Response:
        """Send a request and await its response (on the connection's loop).

        A response whose code is in ``ok`` is returned; any other raises the :class:`SparkMQError` it
        stands for.  :class:`RemotingError` when the connection fails or closes, or no answer comes within
        ``timeout`` (``timed_out``; the connection stays usable).
        """
        if self._closed:
            raise self._closed_error()
        loop = self._loop
        fut = loop.create_future()
        op = self._register(fut)
        self._queue_write(self._encode(code, op, ext, body, fut))
        timer = loop.call_later(timeout, self._expire, op, code, timeout) if timeout is not None else None
        try:
            frame = await fut
        finally:
            if timer is not None:
                timer.cancel()
            if not fut.done() and self._pending.get(op) is fut:  # the awaiting task was cancelled
                del self._pending[op]
        return _answer(frame, ok)

    def request_blocking(self, code: int, ext: Ext = None, body: bytes | memoryview = b"",
                         timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S, ok: frozenset[int] = SUCCESS_ONLY
                         ) -> Response:
        """Send a request from a thread other than the loop's and block for the response.

        Same answers and errors as :meth:`request`.
        """
        if threading.get_ident() == self._loop_tid:
            raise RuntimeError("request_blocking() on the connection's own loop would deadlock; await request()")
        if self._closed:
            raise self._closed_error()
        waiter = _SyncWaiter()
        pending = self._pending
        op = self._register(waiter)
        data = self._encode(code, op, ext, body, waiter)
        # Closed between the check and the registration: the loop's sweep may have missed us.
        if self._closed and pending.pop(op, None) is waiter:
            raise self._closed_error()
        try:
            self._loop.call_soon_threadsafe(self._write_now, data)
        except RuntimeError:
            pending.pop(op, None)
            raise RemotingError(self.addr, "the connection's event loop is closed") from None
        if not waiter.wait(timeout):
            if pending.pop(op, None) is waiter:
                raise RemotingError(self.addr, f"request code {code} timed out after {timeout:g}s", timed_out=True)
            waiter.wait(None)  # answered just as we gave up: take the answer
        frame = waiter.frame
        if frame is None:
            raise waiter.exc  # type: ignore[misc]
        return _answer(frame, ok)

    def request_future(self, code: int, ext: Ext = None, body: bytes | memoryview = b"",
                       timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S, ok: frozenset[int] = SUCCESS_ONLY
                       ) -> concurrent.futures.Future[Response]:
        """Send a request from any thread; a ``concurrent.futures.Future`` of its :class:`Response`.

        The future fails as :meth:`request` would raise; its callbacks run on the loop thread.
        """
        future: concurrent.futures.Future[Response] = concurrent.futures.Future()
        if self._closed:
            future.set_exception(self._closed_error())
            return future
        waiter = _FutureWaiter(future, ok)
        op = self._register(waiter)
        try:
            data = self._encode(code, op, ext, body, waiter)
        except SparkMQError as exc:
            future.set_exception(exc)
            return future
        if threading.get_ident() == self._loop_tid:
            self._send_and_arm(data, op, code, timeout, waiter)
        else:
            try:
                self._loop.call_soon_threadsafe(self._send_and_arm, data, op, code, timeout, waiter)
            except RuntimeError:
                self._pending.pop(op, None)
                future.set_exception(RemotingError(self.addr, "the connection's event loop is closed"))
        return future

    def oneway(self, code: int, ext: Ext = None, body: bytes | memoryview = b"") -> None:
        """Send a ONEWAY request (no response); from any thread; raises RemotingError if closed."""
        if self._closed:
            raise self._closed_error()
        data = encode_frame(code, FLAG_ONEWAY, next(self._ids) & _MASK31, ext, body)
        if threading.get_ident() == self._loop_tid:
            self._queue_write(data)
        else:
            try:
                self._loop.call_soon_threadsafe(self._write_now, data)
            except RuntimeError:
                raise RemotingError(self.addr, "the connection's event loop is closed") from None

    async def close(self) -> None:
        """Close the connection; pending requests fail with :class:`RemotingError`."""
        self._shutdown("connection closed by the client")
        if not self._lost.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._lost), 1.0)
            except TimeoutError:
                if self._transport is not None:
                    self._transport.abort()

    def close_threadsafe(self) -> None:
        """Start closing from any thread (does not wait)."""
        if threading.get_ident() == self._loop_tid:
            self._shutdown("connection closed by the client")
        else:
            try:
                self._loop.call_soon_threadsafe(self._shutdown, "connection closed by the client")
            except RuntimeError:
                pass

    # ---- asyncio protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop transports are not asyncio.Transport subclasses
        if self.heartbeat_interval_s:
            self._heartbeat_handle = self._loop.call_later(self.heartbeat_interval_s, self._heartbeat)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed:
            self._close_reason = f"connection lost ({exc})" if exc else "connection closed by the server"
        self._closed = True
        self._transport = None
        self._wq = None
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
        self._fail_pending()
        if not self._lost.done():
            self._lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            log.warning("remoting protocol error from %s, closing: %s", self.addr, exc)
            self._shutdown(f"protocol error from the server ({exc})", abort=True)
            return
        pending = self._pending
        for frame in frames:
            if frame.flag & FLAG_RESPONSE:
                waiter = pending.pop(frame.opaque, None)
                if waiter is not None:
                    try:
                        waiter.set_result(frame)
                    except _INVALID_STATE:  # an asyncio waiter whose request was cancelled
                        pass
            else:
                self._on_request(frame)

    # ---- internals ----------------------------------------------------------------------

    def _register(self, waiter: Any) -> int:
        """A free opaque for ``waiter``: a positive int32, wrapping, never one in flight; thread-safe.

        ``next()`` on a count and ``dict.setdefault`` are each atomic, so two threads can never
        claim the same opaque.
        """
        pending = self._pending
        while True:
            op = next(self._ids) & _MASK31
            if pending.setdefault(op, waiter) is waiter:
                return op

    def _encode(self, code: int, op: int, ext: Ext, body: bytes | memoryview, waiter: Any) -> FrameData:
        if len(body) > self.max_frame_bytes - 4:
            if self._pending.get(op) is waiter:
                del self._pending[op]
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"request body of {len(body)} bytes exceeds max_frame_bytes {self.max_frame_bytes}")
        return encode_frame(code, 0, op, ext, body)

    def _queue_write(self, data: FrameData) -> None:
        """Coalesce the writes of one loop pass into one ``writelines`` (loop thread only)."""
        if self._transport is None:
            return
        self._sent = True
        wq = self._wq
        if wq is None:
            self._wq = wq = []
            self._loop.call_soon(self._flush)
        if isinstance(data, bytes):
            wq.append(data)
        else:
            wq.extend(data)

    def _flush(self) -> None:
        wq, self._wq = self._wq, None
        transport = self._transport
        if wq and transport is not None:
            if len(wq) == 1:
                transport.write(wq[0])
            else:
                transport.writelines(wq)

    def _write_now(self, data: FrameData) -> None:
        # A write handed over by another thread: one frame, written at once (no extra loop pass).
        transport = self._transport
        if transport is None:
            return
        self._sent = True
        if isinstance(data, bytes):
            transport.write(data)
        else:
            transport.writelines(data)

    def _send_and_arm(self, data: FrameData, op: int, code: int, timeout: float | None, waiter: _FutureWaiter) -> None:
        if self._pending.get(op) is not waiter:
            return  # already failed (the connection closed meanwhile)
        if self._closed:  # registered after the close failed the others
            del self._pending[op]
            waiter.set_exception(self._closed_error())
            return
        self._write_now(data)
        if timeout is not None:
            waiter.timer = self._loop.call_later(timeout, self._expire, op, code, timeout)

    def _expire(self, op: int, code: int, timeout: float) -> None:
        waiter = self._pending.pop(op, None)
        if waiter is not None:
            try:
                waiter.set_exception(RemotingError(self.addr, f"request code {code} timed out after {timeout:g}s",
                                                   timed_out=True))
            except _INVALID_STATE:
                pass

    def _closed_error(self) -> RemotingError:
        return RemotingError(self.addr, self._close_reason)

    def _fail_pending(self) -> None:
        # popitem is atomic: a waiter registered by another thread meanwhile is either failed here
        # or sees ``_closed`` after registering (request_blocking checks).
        pending = self._pending
        while pending:
            try:
                _, waiter = pending.popitem()
            except KeyError:
                break
            try:
                waiter.set_exception(self._closed_error())  # one exception object per waiter
            except _INVALID_STATE:
                pass

    def _shutdown(self, reason: str, *, abort: bool = False) -> None:
        if not self._closed:
            self._close_reason = reason
            self._closed = True
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
        transport = self._transport
        if transport is not None:
            if abort:
                transport.abort()
            else:
                self._flush()
                transport.close()
        self._fail_pending()

    def _heartbeat(self) -> None:
        # A ping still unanswered a whole interval later means the server is gone or stuck.
        interval = self.heartbeat_interval_s
        if self._closed or not interval:
            return
        ping = self._ping
        if ping is not None and not ping.answered:
            self._shutdown(f"heartbeat unanswered for {interval:g}s", abort=True)
            return
        self._ping = None
        if not self._sent:
            self._ping = _PingWaiter()
            op = self._register(self._ping)
            self._queue_write(encode_frame(_PING, 0, op))
        self._sent = False
        self._heartbeat_handle = self._loop.call_later(interval, self._heartbeat)

    def _on_request(self, frame: Frame) -> None:
        """A request from the server: PING is answered here, everything else goes to on_push."""
        oneway = frame.flag & FLAG_ONEWAY
        if frame.code == _PING:
            if not oneway:
                self._queue_write(encode_frame(RESPONSE_SUCCESS, FLAG_RESPONSE, frame.opaque))
            return
        reply = None
        if self.on_push is not None:
            try:
                reply = self.on_push(frame)
            except Exception:
                log.exception("on_push callback failed for request code %d from %s", frame.code, self.addr)
                if not oneway:
                    self._reply(frame.opaque, error_reply(ErrorCode.INTERNAL_ERROR, "on_push failed"))
                return
        if oneway:
            return
        if type(reply) is not Reply:
            reply = error_reply(ErrorCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {frame.code} is not supported")
        self._reply(frame.opaque, reply)

    def _reply(self, opaque: int, reply: Reply) -> None:
        self._queue_write(encode_frame(reply.code, FLAG_RESPONSE, opaque, reply.ext, reply.body, reply.remark))
