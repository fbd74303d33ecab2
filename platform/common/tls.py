"""TLS for every sparkmq listener and outgoing connection: one settings type, the contexts it builds.

A service turns TLS on with a certificate and its key (PEM files); every port it opens then speaks TLS:

* HTTP (uvicorn) and gRPC serve TLS only: their servers cannot share a port between TLS and plaintext.
* The binary ports (remoting, HA, DLedger) serve TLS only with ``required`` (RocketMQ's ``enforcing``
  mode); without it they accept TLS *and* plaintext on the same port, told apart by the first byte a
  client sends (RocketMQ's ``permissive`` mode: clients can move to TLS one by one).

Outgoing connections (a broker to its name servers, a slave to its master, a DLedger member to its
peers, a client to brokers) use TLS when ``connect`` says so (by default: when the process serves TLS
itself, i.e. the whole cluster speaks TLS) and verify the server against ``ca_file`` (the system's
trust store when None), including its host name or IP address unless ``check_hostname`` is off.

Example::

    >>> TlsSettings().enabled, TlsSettings().connects
    (False, False)
    >>> TlsSettings(ca_file=None, connect=True).client_context().check_hostname
    True
"""
from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT_S", "TLS_RECORD_HANDSHAKE", "Listener", "TlsSettings", "create_server",
           "http_verify", "start_stream_server"]

log = logging.getLogger("sparkmq.tls")

#: A client that has not finished its TLS handshake (or, on a permissive port, sent its first byte) this
#: long after connecting is disconnected: a silent or trickling peer must not hold a socket for ever.
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
#: The first byte of every TLS connection: a record of content type 22 (handshake), the ClientHello.
TLS_RECORD_HANDSHAKE = 0x16


def _path(name: str, value: object) -> Path | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str | Path):
        raise ValueError(f"{name} must be a file path, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"{name} {str(path)!r} is not a readable file")
    return path


@dataclass(frozen=True)
class TlsSettings:
    """A process's TLS settings, validated at construction (``ValueError`` naming the bad value).

    The same type configures servers (``cert_file``, ``key_file``, ``required``) and what this process
    connects to (``connect``, ``ca_file``, ``check_hostname``, ``verify``).
    """

    #: PEM certificate chain this process presents on every port it serves (None = serve plaintext).
    cert_file: Path | None = None
    #: PEM private key of ``cert_file``.
    key_file: Path | None = None
    #: PEM bundle of the CAs trusted to sign the servers this process connects to (None = the system's).
    ca_file: Path | None = None
    #: Refuse plaintext on every port: a client that does not start a TLS handshake is disconnected.
    required: bool = False
    #: Outgoing connections use TLS; None = exactly when this process serves TLS (the cluster speaks TLS).
    connect: bool | None = None
    #: Check that a server's certificate names the host (or IP address) connected to.
    check_hostname: bool = True
    #: Verify the server's certificate chain at all (off only for tests against self-signed servers).
    verify: bool = True

    @classmethod
    def of_files(cls, cert_file: str | Path | None = None, key_file: str | Path | None = None,
                 ca_file: str | Path | None = None, **options: Any) -> TlsSettings:
        """Settings from configured file names (a string or a path each; empty = unset), validated likewise."""
        return cls(_path("tls_cert_file", cert_file), _path("tls_key_file", key_file), _path("tls_ca_file", ca_file),
                   **options)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cert_file", _path("tls_cert_file", self.cert_file))
        object.__setattr__(self, "key_file", _path("tls_key_file", self.key_file))
        object.__setattr__(self, "ca_file", _path("tls_ca_file", self.ca_file))
        for name in ("required", "check_hostname", "verify"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"tls {name} must be true or false, got {getattr(self, name)!r}")
        if self.connect is not None and not isinstance(self.connect, bool):
            raise ValueError(f"tls connect must be true, false or unset, got {self.connect!r}")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.required and self.cert_file is None:
            raise ValueError("tls_required needs tls_cert_file and tls_key_file")
        if self.check_hostname and not self.verify:
            object.__setattr__(self, "check_hostname", False)  # a name cannot be checked on an unverified chain
        if self.cert_file is not None:
            self.server_context()  # a key that does not match its certificate fails now, not at the first client

    @classmethod
    def from_prefixed(cls, values: Any, prefix: str = "tls_") -> TlsSettings:
        """Settings from the ``tls_*`` attributes of a config object (absent attributes keep the defaults).

        Example::

            >>> TlsSettings.from_prefixed(type("C", (), {"tls_required": False})()).required
            False
        """
        names = ("cert_file", "key_file", "ca_file", "required", "connect", "check_hostname", "verify")
        return cls(**{n: getattr(values, prefix + n) for n in names if hasattr(values, prefix + n)})

    def __getstate__(self) -> dict[str, Any]:
        # SSL contexts do not pickle: a copy (a config shipped to a Spark task, a deepcopy) builds its own.
        return {k: v for k, v in self.__dict__.items() if k not in ("_server_context", "_client_context")}

    # -- what is on --------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """This process serves TLS (a certificate and key are configured)."""
        return self.cert_file is not None

    @property
    def connects(self) -> bool:
        """Outgoing connections use TLS."""
        return self.enabled if self.connect is None else self.connect

    @property
    def scheme(self) -> str:
        """``https`` or ``http``: the scheme of the URLs this process calls."""
        return "https" if self.connects else "http"

    # -- contexts ------------------------------------------------------------------------------
    @functools.cached_property
    def _server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"cannot use tls_cert_file {str(self.cert_file)!r} with tls_key_file "
                             f"{str(self.key_file)!r}: {exc}") from None
        return ctx

    def server_context(self) -> ssl.SSLContext:
        """The context every TLS port of this process serves with (one, shared); ValueError without a certificate."""
        if self.cert_file is None:
            raise ValueError("no tls_cert_file configured: this process serves plaintext")
        return self._server_context

    @functools.cached_property
    def _client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cafile=None if self.ca_file is None else str(self.ca_file))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = self.check_hostname
        if not self.verify:
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """The context of outgoing TLS connections (one, shared): verifies servers as the settings say."""
        return self._client_context

    def client_context_if_connecting(self) -> ssl.SSLContext | None:
        """:meth:`client_context` when outgoing connections use TLS, else None (what ``ssl=`` arguments take)."""
        return self._client_context if self.connects else None

    def http_verify(self) -> ssl.SSLContext:
        """What an httpx client's ``verify=`` takes: :meth:`client_context` when outgoing connections use TLS,
        else the one shared default context (see :func:`http_verify`)."""
        return self.client_context_if_connecting() or _default_http_context()

    def key_pair(self) -> tuple[bytes, bytes]:
        """``(private key PEM, certificate chain PEM)``: what gRPC's server credentials take."""
        if self.cert_file is None or self.key_file is None:
            raise ValueError("no tls_cert_file configured: this process serves plaintext")
        return self.key_file.read_bytes(), self.cert_file.read_bytes()

    def wrap_client_socket(self, sock: socket.socket, host: str) -> socket.socket:
        """A connected blocking socket wrapped for TLS to ``host`` (handshake done); as is when not connecting."""
        if not self.connects:
            return sock
        return self._client_context.wrap_socket(sock, server_hostname=host.strip("[]"))


# -- listeners ------------------------------------------------------------------------------------

ProtocolFactory = Callable[[], asyncio.BaseProtocol]


async def create_server(protocol_factory: ProtocolFactory, host: str, port: int, *, tls: TlsSettings | None,
                        backlog: int = 1024,
                        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S) -> Listener:
    """``loop.create_server`` for a binary port, as ``tls`` says: plaintext, TLS only (``required``), or both.

    With both (permissive), connections are accepted here, the first byte is peeked (not consumed), and the
    socket is handed to the loop with or without TLS; a client silent for ``handshake_timeout_s`` is dropped.
    """
    loop = asyncio.get_running_loop()
    if tls is None or not tls.enabled:
        return await loop.create_server(protocol_factory, host, port, backlog=backlog, reuse_address=True)
    ctx = tls.server_context()
    if tls.required:
        return await loop.create_server(protocol_factory, host, port, backlog=backlog, reuse_address=True,
                                        ssl=ctx, ssl_handshake_timeout=handshake_timeout_s)
    return await _SniffingServer(protocol_factory, ctx, handshake_timeout_s).start(host, port, backlog)


async def start_stream_server(client_connected: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any],
                              host: str, port: int, *, tls: TlsSettings | None, limit: int = 1 << 16,
                              ) -> Listener:
    """``asyncio.start_server`` over :func:`create_server`: a stream server on a binary port, TLS as ``tls`` says."""
    loop = asyncio.get_running_loop()

    def factory() -> asyncio.BaseProtocol:
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        return asyncio.StreamReaderProtocol(reader, client_connected, loop=loop)
    return await create_server(factory, host, port, tls=tls)


@functools.cache
def _default_http_context() -> ssl.SSLContext:
    # httpx's own default (verify=True: SSL_CERT_FILE or certifi), built once: loading the CA bundle costs about
    # 30 ms and a megabyte, and every plaintext client would otherwise load it again for nothing.
    import httpx
    return httpx.create_ssl_context()


def http_verify(tls: TlsSettings | None) -> ssl.SSLContext:
    """``verify=`` for an httpx client of ``tls`` (None: plaintext settings): :meth:`TlsSettings.http_verify`."""
    return (tls or TlsSettings()).http_verify()


class _SniffingServer(asyncio.AbstractServer):
    """A permissive listener: TLS when a client's first byte opens a TLS record, plaintext otherwise.

    It accepts on its own socket, waits (bounded) until a client's first byte arrives, peeks at it without
    consuming it, and hands the socket to the loop as a transport with or without TLS.
    """

    def __init__(self, protocol_factory: ProtocolFactory, ctx: ssl.SSLContext, timeout_s: float) -> None:
        self._factory = protocol_factory
        self._ctx = ctx
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        #: Clients dropped before their first byte (silent past the timeout, or gone).
        self.silent_dropped = 0

    async def start(self, host: str, port: int, backlog: int) -> _SniffingServer:
        bare = host.strip("[]")
        family = socket.AF_INET6 if ":" in bare else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bare, port))
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._accepting = self._loop.create_task(self._accept())
        return self

    async def _accept(self) -> None:
        assert self._sock is not None
        while True:
            try:
                conn, _ = await self._loop.sock_accept(self._sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # out of descriptors, a reset before accept: keep serving the others
                log.debug("accept failed: %s", exc)
                await asyncio.sleep(0.05)
                continue
            conn.setblocking(False)
            task = self._loop.create_task(self._start(conn))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _start(self, conn: socket.socket) -> None:
        readable = self._loop.create_future()
        fd = conn.fileno()
        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)
        self._loop.add_reader(fd, on_readable)
        try:
            await asyncio.wait_for(readable, self._timeout_s)
            first = conn.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            first = b""
        finally:
            self._loop.remove_reader(fd)
        if not first:  # silent past the timeout, or closed before saying anything
            self.silent_dropped += 1
            conn.close()
            return
        tls = first[0] == TLS_RECORD_HANDSHAKE
        try:
            if tls:
                await self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ctx,
                                                         ssl_handshake_timeout=self._timeout_s)
            else:
                await self._loop.connect_accepted_socket(self._factory, conn)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("connection dropped during its %s start: %s", "TLS" if tls else "plaintext", exc)
            conn.close()

    # -- AbstractServer -----------------------------------------------------------------------
    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening socket."""
        return (self._sock,) if self._sock is not None else ()

    def close(self) -> None:
        """Stop accepting (connections already handed over stay open)."""
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._pending):
            task.cancel()
        if self._sock is not None:
            self._sock.close()

    async def wait_closed(self) -> None:
        """Wait until the accept loop ended."""
        if self._accepting is not None:
            await asyncio.gather(self._accepting, return_exceptions=True)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The loop it serves on."""
        return self._loop

    def is_serving(self) -> bool:
        """True until closed."""
        return self._accepting is not None and not self._accepting.done()

    async def start_serving(self) -> None:
        """Already serving once started."""

    async def serve_forever(self) -> None:
        """Wait until closed."""
        await self.wait_closed()


#: What :func:`create_server` returns: the loop's server, or the permissive listener (both list their sockets).
Listener = asyncio.Server | _SniffingServer
