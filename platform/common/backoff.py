"""How long to wait before trying again: one backoff policy for every loop that retries.

A :class:`Backoff` says how the pause grows from one retry to the next: it starts at ``initial_s``, is multiplied
by ``factor`` and grows by ``increment_s`` after each retry, never exceeds ``max_s``, and with ``jitter`` each
pause is shortened by a random fraction of up to ``jitter`` (so many clients that failed together do not come
back together).  It computes pauses; it never sleeps.  Two ways to use it:

* a loop that runs for good and pauses after each failure (a reconnect, a long poll) keeps a
  :class:`RetryDelays`: ``next_s()`` after a failure, ``reset()`` after a success; the loop sleeps the way it
  can be stopped (``stop_event.wait(delays.next_s())``, ``await asyncio.sleep(delays.next_s())``);
* one operation retried a few times (a commit that lost a race) goes through :func:`call_with_retries`, which
  says which exceptions are retried, how many attempts and until when.

Example::

    >>> policy = Backoff(initial_s=0.2, max_s=5.0)
    >>> [policy.delay_s(n) for n in range(7)]
    [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    >>> Backoff(initial_s=0.02, max_s=1.0, factor=1.0, increment_s=0.02).delay_s(2)  # linear: 0.02, 0.04, 0.06
    0.06
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "RetryDelays", "call_with_retries"]

T = TypeVar("T")
#: A source of random numbers in [0, 1).  Where one is optional, None means ``random.random``, looked up at each
#: call (as ``time.sleep`` is), so a test can patch it.
Random = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Backoff:
    """The pauses of a retry loop; :meth:`delay_s` gives the one before retry ``n``.

    ``delay_s(n) = min(max_s, initial_s * factor**n + increment_s * n) * (1 - jitter * r)``, ``r`` uniform in [0, 1).
    ValueError (naming the field and the value) for a negative or non-finite time, ``max_s < initial_s``,
    ``factor < 1`` or a ``jitter`` outside [0, 1].
    """

    #: The pause before the first retry, in seconds.
    initial_s: float
    #: The longest pause, in seconds.
    max_s: float
    #: Each pause is the one before times this (2: exponential; 1: constant or, with ``increment_s``, linear).
    factor: float = 2.0
    #: Added to the pause after each retry, in seconds (linear growth).
    increment_s: float = 0.0
    #: Each pause is cut by a random fraction of up to this: 0.5 gives a pause in [d/2, d].
    jitter: float = 0.0

    def __post_init__(self) -> None:
        for name in ("initial_s", "max_s", "increment_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Backoff.{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.max_s < self.initial_s:
            raise ValueError(f"Backoff.max_s must be >= initial_s ({self.initial_s!r}), got {self.max_s!r}")
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float) or not 1 <= self.factor < math.inf:
            raise ValueError(f"Backoff.factor must be a finite number >= 1, got {self.factor!r}")
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, int | float) or not 0 <= self.jitter <= 1:
            raise ValueError(f"Backoff.jitter must be a number in [0, 1], got {self.jitter!r}")

    def delay_s(self, retry: int, rand: Random | None = None) -> float:
        """The pause before retry number ``retry`` (0 = the first retry, after the first failure)."""
        if retry < 0:
            raise ValueError(f"retry must be >= 0, got {retry!r}")
        try:
            grown = self.initial_s * self.factor ** retry if self.initial_s else 0.0
        except OverflowError:  # far past the cap
            grown = self.max_s
        return self.jittered_s(min(self.max_s, grown + self.increment_s * retry), rand)

    def jittered_s(self, pause_s: float, rand: Random | None = None) -> float:
        """``pause_s`` cut by a random fraction of up to ``jitter``."""
        if not self.jitter:
            return pause_s
        return pause_s * (1.0 - self.jitter * (rand or random.random)())


class RetryDelays:
    """The pauses of one long-running retry loop: :meth:`next_s` after each failure, :meth:`reset` after a success.

    >>> delays = RetryDelays(Backoff(initial_s=1.0, max_s=30.0))
    >>> delays.next_s(), delays.next_s(), delays.next_s()
    (1.0, 2.0, 4.0)
    >>> delays.reset(); delays.next_s()
    1.0
    """

    __slots__ = ("backoff", "failures", "_rand", "_at_max")

    def __init__(self, backoff: Backoff, rand: Random | None = None) -> None:
        self.backoff = backoff
        #: Failures since the last success (or since :meth:`reset`).
        self.failures = 0
        self._rand = rand
        self._at_max = False

    def next_s(self) -> float:
        """The pause after one more failure (each call counts one)."""
        if self._at_max:
            pause = self.backoff.jittered_s(self.backoff.max_s, self._rand)
        else:
            pause = self.backoff.delay_s(self.failures, self._rand)
        self.failures += 1
        return pause

    def hold_at_max(self) -> None:
        """Pause the longest from now until :meth:`reset`: for a failure that retrying soon cannot cure."""
        self._at_max = True

    def reset(self) -> None:
        """A success: the next failure pauses ``initial_s`` again."""
        self.failures = 0
        self._at_max = False


def call_with_retries(fn: Callable[[], T], backoff: Backoff, *, attempts: int,
                      retry_on: type[Exception] | tuple[type[Exception], ...] = Exception,
                      retry_if: Callable[[Exception], bool] | None = None, deadline: float | None = None,
                      on_retry: Callable[[Exception, int, float], object] | None = None,
                      sleep: Callable[[float], object] | None = None, clock: Callable[[], float] = time.monotonic,
                      rand: Random | None = None) -> T:
    """``fn()``, called again after a pause while it raises a retried exception; its result.

    An exception is retried when it is a ``retry_on`` and ``retry_if(exc)`` (when given) says so; any other
    is raised at once.  At most ``attempts`` calls (>= 1) are made; the pause before retry ``n`` is
    ``backoff.delay_s(n)``, and no retry starts at or after ``deadline`` (a ``clock()`` time, default
    ``time.monotonic``): when the pause would reach it, the last exception is raised without pausing.
    ``on_retry(exc, attempt, pause_s)`` is told of each retry before its pause (``attempt`` 1 = the first call
    failed).  ``sleep`` pauses (default ``time.sleep``; ``threading.Event.wait`` makes the loop stoppable).

    >>> calls = []
    >>> def flaky() -> str:
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise TimeoutError("not yet")
    ...     return "done"
    >>> call_with_retries(flaky, Backoff(0.01, 0.1), attempts=5, retry_on=TimeoutError, sleep=lambda s: None)
    'done'
    >>> len(calls)
    3
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be an integer >= 1, got {attempts!r}")
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except retry_on as exc:
            if attempt >= attempts or (retry_if is not None and not retry_if(exc)):
                raise
            pause = backoff.delay_s(attempt - 1, rand)
            if deadline is not None and clock() + pause >= deadline:
                raise
            if on_retry is not None:
                on_retry(exc, attempt, pause)
            (sleep or time.sleep)(pause)
