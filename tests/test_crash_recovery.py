"""Crash safety with real processes and SIGKILL.

A child (``crash_writer.py``) appends from several threads and reports every
acknowledged put over a pipe; the test kills it with SIGKILL at a random moment,
recovers the store in this process and checks that every acknowledged record is
there and intact, the torn tail is gone, and the consume queues agree with the log.
The same store is crashed again and again, so recovery runs on recovered stores.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import IMPL_NAMES, IMPLS
from crash_writer import QUEUES, TOPIC, config, expected_body
from sparkmq.platform.store import MessageStore, verify_store
from sparkmq.platform.store.checkpoint import read_checkpoint

pytestmark = pytest.mark.cluster  # a writer child process, killed with SIGKILL

HERE = Path(__file__).resolve().parent
SYNC_KILLS = 12   # per implementation: 24 SIGKILLs with both built
ASYNC_KILLS = 6


class Child:
    """The writer process and the lines it printed before it died."""

    def __init__(self, root: Path, flush_mode: str, impl: str, seed: int, threads: int) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "crash_writer.py"), str(root), flush_mode, impl, str(seed), str(threads)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def kill_after(self, seconds: float) -> None:
        time.sleep(seconds)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)  # what was in the pipe was acknowledged too
        assert self.proc.returncode == -signal.SIGKILL, self.proc.stderr.read() if self.proc.stderr else ""

    def acks(self) -> list[tuple[int, int, int, int, int, int]]:
        return [tuple(int(x) for x in line.split()[1:]) for line in self.lines if line.startswith("ACK ")]

    def flushed(self) -> int:
        values = [int(line.split()[1]) for line in self.lines if line.startswith("FLUSHED ")]
        return max(values, default=0)


def check_queues_agree_with_log(store: MessageStore) -> int:
    """Every record in the log has exactly its unit, and every unit its record; returns the record count."""
    log = store.commit_log
    by_queue: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    offset, count = log.min_offset, 0
    while offset < log.max_offset:
        offset, records = log.scan(offset, 4096)
        for off, rec in records:
            d = IMPLS["python"].decode_record(rec, True)  # CRC-checked
            by_queue.setdefault((d[15], d[2]), []).append((d[4], off, d[0]))
            count += 1
    assert set(by_queue) <= set(log.queues())
    for topic, qid in log.queues():
        cq = log.consume_queue(topic, qid)
        units = cq.units(cq.min_offset, 10**7) if cq.max_offset > cq.min_offset else []
        records = by_queue.get((topic, qid), [])
        assert [q for q, _, _ in records] == list(range(cq.min_offset, cq.max_offset)), (topic, qid)
        assert [(u[0], u[1]) for u in units] == [(off, size) for _, off, size in records], (topic, qid)
    return count


def check_acknowledged(store: MessageStore, acks) -> None:
    for offset, qid, qoff, size, seed, n in acks:
        msg = store.read_message(offset)
        assert (msg.topic, msg.queue_id, msg.queue_offset, msg.store_size) == (TOPIC, qid, qoff, size)
        assert msg.body == expected_body(seed, n)
        assert msg.keys == (f"s{seed}n{n}",)


def reopen(root: Path, flush_mode: str, impl: str) -> MessageStore:
    cfg = config(str(root), flush_mode)
    return MessageStore(cfg, commit_log_class=IMPLS[impl].CommitLog).start()


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPL_NAMES)
def test_sync_flush_survives_repeated_sigkill(tmp_path, impl):
    rng = random.Random(20261121 + len(impl))
    root = tmp_path / "store"
    all_acks = []
    torn_seen = 0
    for round_ in range(SYNC_KILLS):
        child = Child(root, "SYNC_FLUSH", impl, seed=round_, threads=rng.choice([1, 4, 8]))
        child.kill_after(rng.uniform(0.05, 1.0))
        all_acks.extend(child.acks())
        store = reopen(root, "SYNC_FLUSH", impl)
        try:
            assert store.clean_start is False or not child.lines
            torn_seen += store.recovery["torn"]
            check_acknowledged(store, all_acks)
            records = check_queues_agree_with_log(store)
            assert records >= len(all_acks)
            assert store.commit_log.max_offset == store.recovery["end_offset"]
        finally:
            store.shutdown()
        report = verify_store(root)
        assert report.ok, report.problems
    assert len(all_acks) > 100, "the writer barely ran; the test proves little"


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPL_NAMES)
def test_async_flush_keeps_flushed_data_and_serves_nothing_past_the_tear(tmp_path, impl):
    rng = random.Random(7 + len(impl))
    root = tmp_path / "store"
    durable = []  # acknowledged records below a flushed offset: must survive a "power loss"
    for round_ in range(ASYNC_KILLS):
        child = Child(root, "ASYNC_FLUSH", impl, seed=100 + round_, threads=2)
        child.kill_after(rng.uniform(0.2, 1.0))
        checkpoint = read_checkpoint(root / "checkpoint")
        flushed = max(child.flushed(), checkpoint.flushed_offset if checkpoint else 0)
        acks = child.acks()
        durable.extend(a for a in acks if a[0] + a[3] <= flushed)
        # Simulate losing unflushed pages: damage the log somewhere past the flushed offset.
        tear = _damage_past(root, flushed, acks, rng)
        store = reopen(root, "ASYNC_FLUSH", impl)
        try:
            end = store.commit_log.max_offset
            assert end >= flushed
            if tear is not None:
                assert end <= tear, "a record past the torn point is still served"
            check_acknowledged(store, durable)
            check_queues_agree_with_log(store)
            for qid in range(QUEUES):  # everything served through the queues is intact
                offset = store.min_offset(TOPIC, qid)
                while True:
                    got = store.get_messages(TOPIC, qid, offset, 256)
                    if not got.messages:
                        break
                    assert all(m.commitlog_offset + m.store_size <= end for m in got.messages)
                    offset = got.next_offset
        finally:
            store.shutdown()
        assert verify_store(root).ok
    assert durable, "nothing was flushed; the test proves little"


def _damage_past(root: Path, flushed: int, acks, rng: random.Random) -> int | None:
    """Overwrite 8 bytes inside a random acknowledged record past ``flushed`` (as a lost
    page would); returns the damaged record's offset, or None when none lies past it."""
    candidates = [a for a in acks if a[0] >= flushed]
    if not candidates or rng.random() < 0.2:
        return None
    offset, _qid, _qoff, size, _seed, _n = rng.choice(candidates)
    seg_size = config(str(root), "ASYNC_FLUSH").segment_size
    at = offset + rng.randrange(0, size - 8)
    with open(root / "commitlog" / f"{offset // seg_size * seg_size:020d}", "r+b") as f:
        f.seek(at % seg_size)
        old = f.read(8)
        f.seek(at % seg_size)
        f.write(bytes(b ^ 0x5A for b in old))
    return offset
