"""A tiny asyncio TCP proxy for tests: put one on each link between two nodes and break the link at will.

:class:`TcpProxy` listens on its own port and forwards every connection to ``target``.  The test
switches its mode:

* ``PASS`` -- bytes flow both ways.
* ``DROP`` -- a blackhole: bytes are read and thrown away in both directions, and new connections are
  accepted but never reach the target.  Senders see silence (timeouts), not resets: a partition.
* ``HOLD`` -- nothing is read or forwarded: bytes wait (in the kernel buffers) and arrive late once the
  link passes again -- a paused process or a stalled link.  Late delivery of stale messages is
  exactly what Raft must tolerate.

:meth:`TcpProxy.cut` resets every connection through the proxy now (both ends see it die);
:meth:`TcpProxy.heal` goes back to ``PASS`` and cuts the connections that lost bytes while dropped
(their streams have holes).  :class:`ProxyMesh` puts one proxy on each directed link of a group of
nodes: node A dials node B through ``mesh.proxy(A, B)``, so a test can partition, isolate or cut links.
"""
from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
from collections.abc import Iterable

__all__ = ["LinkMode", "ProxyMesh", "TcpProxy"]

_CHUNK = 256 * 1024


class LinkMode(enum.Enum):
    """What a proxy does with the bytes it gets."""

    PASS = "pass"
    DROP = "drop"
    HOLD = "hold"


class _Pair:
    """One proxied connection: the accepted side and the side opened to the target."""

    __slots__ = ("client", "upstream", "tainted")

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tainted = False

    def abort(self) -> None:
        self.client.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()


class TcpProxy:
    """Forwards connections from its own port on ``host`` to ``target`` (settable at any time)."""

    def __init__(self, target: tuple[str, int] | None = None, *, host: str = "127.0.0.1", name: str = "") -> None:
        self.target = target
        self.host = host
        self.name = name
        self.mode = LinkMode.PASS
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        #: Bytes forwarded and thrown away, connections accepted.
        self.forwarded = 0
        self.dropped = 0
        self.accepted = 0

    async def start(self) -> TcpProxy:
        """Listen on a free port."""
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        return self

    @property
    def address(self) -> tuple[str, int]:
        """Where to connect to go through this proxy."""
        assert self._server is not None and self._server.sockets
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    # -- what the test controls -----------------------------------------------------------------
    def blackhole(self) -> None:
        """Drop everything from now on (both directions, new connections too)."""
        self.mode = LinkMode.DROP
        self._flowing.set()
        for pair in self._pairs:
            pair.tainted = True

    def hold(self) -> None:
        """Stop reading: bytes wait and are delivered late after :meth:`heal`."""
        self.mode = LinkMode.HOLD
        self._flowing.clear()

    def heal(self) -> None:
        """Pass bytes again; connections that lost bytes while dropped are cut."""
        self.mode = LinkMode.PASS
        self._flowing.set()
        for pair in [p for p in self._pairs if p.tainted]:
            self._pairs.discard(pair)
            pair.abort()

    def cut(self) -> None:
        """Reset every connection through the proxy now (the link itself stays as it is)."""
        pairs, self._pairs = self._pairs, set()
        for pair in pairs:
            pair.abort()

    async def close(self) -> None:
        """Stop listening and reset everything."""
        if self._server is not None:
            self._server.close()
        self._flowing.set()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- forwarding -----------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        pair = _Pair(writer)
        self._pairs.add(pair)
        try:
            await self._flowing.wait()
            if self.mode is LinkMode.DROP or self.target is None:
                pair.tainted = True
                await self._pump(reader, None, pair)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return
            pair.upstream = up_writer
            if pair not in self._pairs:  # cut while connecting
                return
            await asyncio.gather(self._pump(reader, up_writer, pair), self._pump(up_reader, writer, pair))
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._pairs.discard(pair)
            pair.abort()
            self._tasks.discard(task)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter | None, pair: _Pair) -> None:
        try:
            while True:
                await self._flowing.wait()
                data = await src.read(_CHUNK)
                if not data:
                    return
                await self._flowing.wait()  # HOLD may have begun while reading: keep the bytes until it ends
                if dst is None or self.mode is LinkMode.DROP:
                    pair.tainted = True
                    self.dropped += len(data)
                    continue
                if dst.is_closing():
                    return
                dst.write(data)
                self.forwarded += len(data)
                await dst.drain()
        except (ConnectionError, OSError, RuntimeError):  # uvloop: RuntimeError when the other side is closed
            pass
        finally:
            pair.abort()  # one direction ended: end the other too, as a real connection would


class ProxyMesh:
    """One :class:`TcpProxy` per directed link ``(src, dst)`` among ``node_ids``; ``src`` dials ``dst`` through it."""

    def __init__(self, node_ids: Iterable[str]) -> None:
        self.node_ids = list(node_ids)
        self.proxies: dict[tuple[str, str], TcpProxy] = {
            (a, b): TcpProxy(name=f"{a}->{b}") for a, b in itertools.permutations(self.node_ids, 2)}

    async def start(self) -> ProxyMesh:
        """Start every proxy (their targets are set with :meth:`set_target`)."""
        for proxy in self.proxies.values():
            await proxy.start()
        return self

    def proxy(self, src: str, dst: str) -> TcpProxy:
        """The proxy ``src`` dials ``dst`` through."""
        return self.proxies[(src, dst)]

    def peers_for(self, src: str) -> dict[str, tuple[str, int]]:
        """The peer addresses to give node ``src``: each peer behind its proxy."""
        return {dst: self.proxies[(src, dst)].address for dst in self.node_ids if dst != src}

    def set_target(self, dst: str, address: tuple[str, int]) -> None:
        """``dst`` now listens at ``address`` (it started, or restarted on another port)."""
        for (_, b), proxy in self.proxies.items():
            if b == dst:
                proxy.target = address

    def links(self, a: Iterable[str], b: Iterable[str]) -> list[TcpProxy]:
        """Every proxy between a node of ``a`` and a node of ``b``, both directions."""
        side_a, side_b = set(a), set(b)
        return [p for (x, y), p in self.proxies.items()
                if (x in side_a and y in side_b) or (x in side_b and y in side_a)]

    def partition(self, a: Iterable[str], b: Iterable[str], mode: LinkMode = LinkMode.DROP) -> None:
        """Break every link between side ``a`` and side ``b`` (blackhole, or hold)."""
        for proxy in self.links(a, b):
            proxy.blackhole() if mode is LinkMode.DROP else proxy.hold()

    def isolate(self, node: str, mode: LinkMode = LinkMode.DROP) -> None:
        """Break every link to and from ``node``."""
        self.partition([node], [n for n in self.node_ids if n != node], mode)

    def cut(self, a: Iterable[str], b: Iterable[str]) -> None:
        """Reset the current connections between ``a`` and ``b`` (the links stay up)."""
        for proxy in self.links(a, b):
            proxy.cut()

    def heal(self) -> None:
        """Every link passes again."""
        for proxy in self.proxies.values():
            proxy.heal()

    async def close(self) -> None:
        """Close every proxy."""
        for proxy in self.proxies.values():
            with contextlib.suppress(Exception):
                await proxy.close()
