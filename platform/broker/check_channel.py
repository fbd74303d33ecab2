"""The long-poll channel that carries transaction check-backs to live producers.

The transaction service (a thread) *offers* a due check for a producer group; a
producer of that group long-polls ``GET /transactions/checks`` and *takes* what is
pending.  Each check goes to one poller: the first to take it.  A check offered again
(the next check-back of the same transaction) replaces the pending one, so a group
whose producers stopped polling holds at most one entry per open transaction.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from ..common.waiters import WaiterRegistry
from .transaction import CheckRequest

__all__ = ["CheckChannel"]

#: Pending checks kept per group at most (the oldest are dropped; the service checks again later).
_MAX_PENDING = 10_000


class CheckChannel:
    """Pending check requests per producer group, handed to long-polling producers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, OrderedDict[str, CheckRequest]] = {}
        self._waiters: WaiterRegistry[str] = WaiterRegistry()
        self._offer_listeners: list[Callable[[str], None]] = []

    def add_offer_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(producer_group)`` after a check was offered (the remoting adapter pushes it)."""
        self._offer_listeners.append(listener)

    def take(self, group: str, max_count: int = 32) -> list[CheckRequest]:
        """Take up to ``max_count`` pending checks of ``group`` without waiting."""
        return self._take(group, max_count)

    def offer(self, request: CheckRequest) -> None:
        """Queue a check for its producer group and wake one of the group's pollers (any thread)."""
        with self._lock:
            queue = self._pending.setdefault(request.producer_group, OrderedDict())
            queue.pop(request.transaction_id, None)
            queue[request.transaction_id] = request
            while len(queue) > _MAX_PENDING:
                queue.popitem(last=False)
        self._waiters.notify(request.producer_group)
        for listener in list(self._offer_listeners):
            listener(request.producer_group)

    def pending(self, group: str) -> int:
        """How many checks wait for a producer of ``group``."""
        with self._lock:
            return len(self._pending.get(group, ()))

    def discard(self, transaction_id: str, group: str) -> None:
        """Forget a pending check (its transaction was ended)."""
        with self._lock:
            queue = self._pending.get(group)
            if queue is not None:
                queue.pop(transaction_id, None)

    def _take(self, group: str, max_count: int) -> list[CheckRequest]:
        with self._lock:
            queue = self._pending.get(group)
            if not queue:
                return []
            out: list[CheckRequest] = []
            while queue and len(out) < max_count:
                out.append(queue.popitem(last=False)[1])
            if not queue:
                del self._pending[group]
            return out

    async def poll(self, group: str, timeout_s: float, max_count: int = 32) -> list[CheckRequest]:
        """Take up to ``max_count`` pending checks of ``group``, waiting up to ``timeout_s`` for one."""
        deadline = time.monotonic() + timeout_s
        while True:
            taken = self._take(group, max_count)
            remaining = deadline - time.monotonic()
            if taken or remaining <= 0:
                return taken
            await self._waiters.wait(group, remaining, lambda: self.pending(group) > 0)
            if self._waiters_closed():
                return self._take(group, max_count)

    def _waiters_closed(self) -> bool:
        return self._waiters._closed  # noqa: SLF001  # same package; avoids a busy loop after close

    def close(self) -> None:
        """Release every poller now and later ones at once (shutdown)."""
        self._waiters.close()
