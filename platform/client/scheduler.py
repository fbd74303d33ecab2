"""One daemon thread per client that runs its periodic work (route refresh, heartbeats, rebalance, commits).

RocketMQ's ``MQClientInstance`` runs these on a scheduled executor; a single thread is
enough here because each task is a few short HTTP calls, and it means the tasks of one
client never run concurrently with each other (a rebalance never races a commit).
Tasks can also be *triggered* to run as soon as possible (a rebalance on a broker's
membership notice).  A task that raises is logged and runs again at its next time.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Scheduler"]

log = logging.getLogger("sparkmq.client")


@dataclass
class _Task:
    name: str
    fn: Callable[[], object]
    interval_s: float
    next_run: float
    triggered: bool = False


class Scheduler:
    """Runs named periodic tasks on one daemon thread until :meth:`stop`.

    Example::

        >>> runs = []
        >>> s = Scheduler("demo")
        >>> s.every("tick", 3600, lambda: runs.append(1), initial_delay_s=3600)
        >>> s.start()
        >>> s.trigger("tick")
        >>> s.wait_idle(5.0)
        True
        >>> s.stop()
        >>> runs
        [1]
    """

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._tasks: dict[str, _Task] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = False
        self._thread: threading.Thread | None = None

    def every(self, name: str, interval_s: float, fn: Callable[[], object], *, initial_delay_s: float = 0.0) -> None:
        """Run ``fn`` every ``interval_s`` seconds, first after ``initial_delay_s``."""
        with self._cond:
            self._tasks[name] = _Task(name, fn, interval_s, self._clock() + initial_delay_s)
            self._cond.notify_all()

    def trigger(self, name: str) -> None:
        """Run task ``name`` as soon as the thread is free (its period restarts after it)."""
        with self._cond:
            task = self._tasks.get(name)
            if task is not None:
                task.triggered = True
                self._cond.notify_all()

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name=f"sparkmq-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after the running task (if any) finishes; waits at most ``timeout_s``."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no task is due, triggered or running; whether that happened within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._busy or any(t.triggered or t.next_run <= self._clock() for t in self._tasks.values()):
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return False
                self._cond.wait(min(left, 0.05))
            return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    now = self._clock()
                    due = [t for t in self._tasks.values() if t.triggered or t.next_run <= now]
                    if due:
                        break
                    wait = min((t.next_run - now for t in self._tasks.values()), default=1.0)
                    self._cond.wait(max(0.001, min(wait, 1.0)))
                self._busy = True
                for task in due:
                    task.triggered = False
            try:
                for task in due:
                    if self._stopping:
                        return
                    try:
                        task.fn()
                    except Exception:  # keep the client alive: one bad round must not end periodic work
                        log.exception("%s: task %s failed", self.name, task.name)
                    with self._cond:
                        task.next_run = self._clock() + task.interval_s
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
