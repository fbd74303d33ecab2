"""platform.common.batching: the bounded buffer behind the broker's and the clients' trace batching."""
from __future__ import annotations

import threading
import time

import pytest

from procs import wait_until
from sparkmq.platform.common.batching import BatchBuffer


class Sink:
    """A deliver function that records its batches (and can be told to fail once)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.fail_next = False
        self.lock = threading.Lock()

    def __call__(self, items: list[int]) -> int:
        with self.lock:
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("sink down")
            self.batches.append(items)
        return len(items)

    @property
    def delivered(self) -> list[int]:
        with self.lock:
            return [i for b in self.batches for i in b]


def test_full_buffer_refuses_and_counts_flush_delivers_in_order() -> None:
    sink = Sink()
    buffer = BatchBuffer("t", sink, interval_s=60, batch_size=100, max_buffered=5)
    assert all(buffer.offer(i) for i in range(3))
    assert buffer.offer(3, units=2)
    assert not buffer.offer(5) and buffer.dropped == 1 and buffer.offered == 5 and buffer.buffered == 5
    assert buffer.flush() == 4 and sink.batches == [[0, 1, 2, 3]]
    assert buffer.buffered == 0 and buffer.flush() == 0 and len(sink.batches) == 1


def test_thread_delivers_at_batch_size_and_on_the_interval_and_survives_a_failure() -> None:
    sink = Sink()
    buffer = BatchBuffer("t", sink, interval_s=0.3, batch_size=10, max_buffered=1000)
    buffer.start()
    try:
        began = time.monotonic()
        for i in range(10):
            buffer.offer(i)
        wait_until(lambda: sink.delivered == list(range(10)), 5, "the full batch")
        assert time.monotonic() - began < 0.25          # a full batch goes at once, not after the interval
        sink.fail_next = True
        buffer.offer(10)                                 # delivered by the interval; this delivery fails
        time.sleep(0.5)
        buffer.offer(11)
        wait_until(lambda: sink.delivered[-1:] == [11], 5, "a delivery after the failed one")
    finally:
        buffer.offer(12)
        buffer.stop()                                    # what is left goes out on stop
    assert sink.delivered[-1] == 12


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        BatchBuffer("t", Sink(), interval_s=0, batch_size=1, max_buffered=1)
    with pytest.raises(ValueError):
        BatchBuffer("t", Sink(), interval_s=1, batch_size=0, max_buffered=1)
