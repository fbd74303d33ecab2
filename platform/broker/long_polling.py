"""Long polling: RocketMQ's ``PullRequestHoldService``.

:class:`PullHoldService` holds pulls keyed by (topic, queue_id), woken by puts on that queue,
on top of :class:`~sparkmq.platform.common.waiters.WaiterRegistry`.
"""
from __future__ import annotations

from collections.abc import Callable

from ..common.waiters import WaiterRegistry

__all__ = ["WaiterRegistry", "PullHoldService"]


class PullHoldService:
    """Held pulls per (topic, queue_id), woken when a message lands on that queue."""

    def __init__(self) -> None:
        self._registry: WaiterRegistry[tuple[str, int]] = WaiterRegistry()

    async def hold(self, topic: str, queue_id: int, timeout_s: float, ready: Callable[[], bool]) -> bool:
        """Hold until a put on (topic, queue_id) or ``timeout_s``; True when woken by an arrival.

        ``ready()`` says whether there is already something new (checked after registering).
        """
        return await self._registry.wait((topic, queue_id), timeout_s, ready)

    def notify_put(self, topic: str, queue_id: int) -> int:
        """A message was stored on (topic, queue_id): wake its held pulls (from any thread)."""
        return self._registry.notify((topic, queue_id))

    def held(self, topic: str | None = None, queue_id: int | None = None) -> int:
        """How many pulls are held (on one queue, or in all)."""
        if topic is not None and queue_id is not None:
            return self._registry.waiting((topic, queue_id))
        return self._registry.waiting()

    def close(self) -> None:
        """Release every held pull and stop holding new ones (shutdown)."""
        self._registry.close()
