"""Auto-renewed receipt handles: what a push consumer's ``auto_renew`` receive asks of the server.

A push consumer names no invisible duration: the server picks one (:attr:`Renewals.invisible_ms`) and
renews it (``PopProcessor.change_invisible``) shortly before it ends, until the client settles the
message.  A renewal replaces the receipt handle, but the client keeps acking with the one it received:
:meth:`Renewals.settle` translates it to the current one.  Renewals stop after ``max_renew_ms`` (a
consumer that never settles lets the message come back).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass

import anyio.to_thread

from ...platform.broker.broker import Broker
from ...platform.common.errors import SparkMQError

__all__ = ["Renewals"]

log = logging.getLogger("sparkmq.broker.grpc")


@dataclass
class _Tracked:
    group: str
    topic: str
    current: str
    invisible_until_ms: int
    renew_until_ms: int


class Renewals:
    """Receipt handles of auto-renewed deliveries, by the handle the client was given."""

    def __init__(self, broker: Broker, invisible_ms: int = 30_000, renew_ahead_ms: int = 10_000,
                 max_renew_ms: int = 3_600_000) -> None:
        self.broker = broker
        self.invisible_ms = invisible_ms
        self.renew_ahead_ms = renew_ahead_ms
        self.max_renew_ms = max_renew_ms
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the renewal loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="grpc-receipt-renewals")

    async def stop(self) -> None:
        """Stop renewing (the messages come back after their invisible time)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def track(self, group: str, topic: str, handle: str, invisible_until_ms: int) -> None:
        """Renew ``handle`` until it is settled."""
        now = int(time.time() * 1000)
        with self._lock:
            self._tracked[handle] = _Tracked(group, topic, handle, invisible_until_ms, now + self.max_renew_ms)

    def settle(self, group: str, topic: str, handle: str) -> str:
        """The current handle of a delivery the client names by ``handle`` (itself when not renewed); forgotten."""
        with self._lock:
            tracked = self._tracked.pop(handle, None)
        if tracked is None or (tracked.group, tracked.topic) != (group, topic):
            return handle
        return tracked.current

    def __len__(self) -> int:
        with self._lock:
            return len(self._tracked)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = int(time.time() * 1000)
            with self._lock:
                due = [(h, t) for h, t in self._tracked.items() if t.invisible_until_ms - now <= self.renew_ahead_ms]
            for handle, tracked in due:
                await self._renew(handle, tracked, now)

    async def _renew(self, handle: str, tracked: _Tracked, now: int) -> None:
        if now >= tracked.renew_until_ms:
            with self._lock:
                self._tracked.pop(handle, None)
            return
        pop = self.broker.pop_processor
        try:
            new = await anyio.to_thread.run_sync(
                lambda: pop.change_invisible(tracked.group, tracked.topic, tracked.current, self.invisible_ms))
        except SparkMQError as exc:  # settled meanwhile, or expired: nothing more to renew
            log.debug("renewal of %s stopped: %s", handle, exc)
            with self._lock:
                self._tracked.pop(handle, None)
            return
        with self._lock:
            if handle in self._tracked:  # not settled while we renewed
                tracked.current = new
                tracked.invisible_until_ms = int(time.time() * 1000) + self.invisible_ms
