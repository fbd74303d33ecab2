"""What every processor shares: the broker's state (a protocol), filters, and the zlib sniff.

Arguments are checked with :mod:`sparkmq.platform.common.validation` (``check_int``)."""
from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from ...common.filtering import FILTER_TAG, MessageFilter, compile_filter

if TYPE_CHECKING:
    from ..schedule import ScheduleService
    from ..timer import TimerService
    from ..transaction import TransactionService

__all__ = ["BrokerState", "StartedServices", "Processor", "cached_filter", "looks_like_zlib"]


def looks_like_zlib(body: bytes) -> bool:
    """Whether ``body`` starts with a zlib (RFC 1950) header."""
    # Deflate method, and CMF*256+FLG divisible by 31: a cheap check that a "compressed" body is
    # not plain text by mistake (inflating every body would cost too much).
    return len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0


@functools.lru_cache(maxsize=1024)
def cached_filter(expression: str | None, filter_type: str = FILTER_TAG) -> MessageFilter:
    """A compiled filter, compiled once per (expression, type) -- an LRU cache shared by pulls and heartbeats.

    FILTER_EXPRESSION_ILLEGAL (with the position) for a malformed expression; errors are not cached.
    """
    return compile_filter(expression, filter_type)


class BrokerState(Protocol):
    """What a processor reads of the broker it serves: its name, lifecycle and role (``Broker`` is one)."""

    @property
    def name(self) -> str:
        """The broker name."""
        ...

    @property
    def running(self) -> bool:
        """Whether sends and pulls are accepted."""
        ...

    @property
    def is_master(self) -> bool:
        """Whether this broker takes sends (a master, or the leader of its DLedger group)."""
        ...

    def operation(self) -> AbstractContextManager[None]:
        """Count a store operation in flight (SERVICE_NOT_AVAILABLE unless running)."""
        ...


class Processor:
    """One request family's handling over the broker's components (RocketMQ's ``NettyRequestProcessor``).

    A processor takes typed arguments, validates them (a stable ``SparkMQError`` code, nothing
    changed on error) and returns typed results; protocol adapters only decode, call and encode.
    Each processor's constructor takes the components it uses (``Broker`` wires them); this base
    keeps only the broker's state every processor reads.
    """

    def __init__(self, state: BrokerState) -> None:
        self.broker_state = state

    @property
    def name(self) -> str:
        return self.broker_state.name

    @property
    def running(self) -> bool:
        return self.broker_state.running

    def _operation(self) -> AbstractContextManager[None]:
        """Count a store operation in flight (SERVICE_NOT_AVAILABLE unless running)."""
        return self.broker_state.operation()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class StartedServices(Protocol):
    """The services over the store a broker builds when it starts as a master (each None before, on a slave, and
    on a DLedger follower): read at each use, never kept."""

    @property
    def schedule(self) -> ScheduleService | None:
        """Delay levels."""
        ...

    @property
    def timers(self) -> TimerService | None:
        """Timer messages."""
        ...

    @property
    def transactions(self) -> TransactionService | None:
        """Half messages and their checks."""
        ...
