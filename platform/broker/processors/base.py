"""What every processor shares: the broker's components, and the argument checks."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ...common.errors import ErrorCode, SparkMQError
from ...common.filtering import FILTER_TAG, MessageFilter, compile_filter

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["Processor", "check_int", "cached_filter", "looks_like_zlib"]


def check_int(name: str, value: object, low: int, high: int, code: ErrorCode = ErrorCode.INVALID_ARGUMENT) -> int:
    """``value`` when it is an int in ``low..high``; else ``code`` naming the argument."""
    # bool is an int subclass; True must not mean queue 1.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SparkMQError(code, f"{name} must be an integer in {low}..{high}, got {value!r}")
    return value


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


class Processor:
    """One request family's handling over the broker's components (RocketMQ's ``NettyRequestProcessor``).

    A processor takes typed arguments, validates them (a stable ``SparkMQError`` code, nothing
    changed on error) and returns typed results; protocol adapters only decode, call and encode.
    The components it reads are the broker's, named here so processor code reads like broker code.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    # The broker's components (built once, in Broker.__init__).
    @property
    def config(self) -> Any:
        return self.broker.config

    @property
    def name(self) -> str:
        return self.broker.name

    @property
    def running(self) -> bool:
        return self.broker.running

    @property
    def store(self) -> Any:
        return self.broker.store

    @property
    def topics(self) -> Any:
        return self.broker.topics

    @property
    def clients(self) -> Any:
        return self.broker.clients

    @property
    def locks(self) -> Any:
        return self.broker.locks

    @property
    def offsets(self) -> Any:
        return self.broker.offsets

    @property
    def holds(self) -> Any:
        return self.broker.holds

    @property
    def metrics(self) -> Any:
        return self.broker.metrics

    @property
    def tracer(self) -> Any:
        return self.broker.tracer

    @property
    def checks(self) -> Any:
        return self.broker.checks

    @property
    def lake_index(self) -> Any:
        return self.broker.lake_index

    @property
    def trace_lookup(self) -> Any:
        return self.broker.trace_lookup

    @property
    def levels_ms(self) -> Any:
        return self.broker.levels_ms

    # Services over the store, built when the broker starts (None on a slave).
    @property
    def schedule(self) -> Any:
        return self.broker.schedule

    @property
    def timers(self) -> Any:
        return self.broker.timers

    @property
    def transactions(self) -> Any:
        return self.broker.transactions

    def _operation(self) -> Any:
        """Count a store operation in flight (SERVICE_NOT_AVAILABLE unless running)."""
        return self.broker._operation()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.broker.name})"
