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
from sparkmq.storage_native.layout import CQ_UNIT, CQ_UNIT_SIZE

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
        """SIGKILL ``seconds`` after the writer's first acknowledgement (not after its start: on a loaded machine
        its imports alone can take longer than the whole window, and a kill before any write proves little)."""
        deadline = time.monotonic() + 60
        while not self.lines and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
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


# -- SYNC_FLUSH's log-only group commit: acknowledged means in the log, the queue units are rebuilt ----------
#: The event loop's send path (``put_packed(wait=False)`` + ``wait_durable``) with many sends in flight,
#: printing ``ACK offset queue_id queue_offset size seed n`` once the group commit acknowledged one, and
#: ``FULL offset`` when a full flush (log and queues) returns, before the store can checkpoint it.
_ASYNC_WRITER = r"""
import asyncio, sys, threading
from crash_writer import QUEUES, TOPIC, config, expected_body
from sparkmq.platform.common.message import Message
from sparkmq.platform.store import MessageStore, PutStatus
from sparkmq.storage_native import encode_batch, implementations

root, impl, seed, in_flight = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out_lock = threading.Lock()

def emit(line):
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

class ReportingLog(implementations()[impl].CommitLog):
    def flush(self):
        flushed = super().flush()
        emit(f"FULL {flushed}")
        return flushed

store = MessageStore(config(root, "SYNC_FLUSH"), commit_log_class=ReportingLog).start()
emit(f"FULL {store.commit_log.flushed_offset}")  # recovery synced everything it found

async def sender(t):
    loop = asyncio.get_running_loop()
    n = t * 1_000_000
    while True:
        msg = Message(TOPIC, expected_body(seed, n), tags=f"t{n % 3}", keys=(f"s{seed}n{n}",))
        data, _ids, _next = encode_batch([msg], "7F00000112349ABCDEF0", 1_698_796_800_000, n & 0xFFFF,
                                         1_700_000_000_000)
        r = store.put_packed(TOPIC, n % QUEUES, data, 1, wait=False)
        if await store.wait_durable(r.end_offset, loop) is PutStatus.PUT_OK:
            off = int.from_bytes(r.offsets[:8], "little")
            emit(f"ACK {off} {r.queue_id} {r.first_queue_offset} {r.end_offset - off} {seed} {n}")
        n += 1

async def main():
    emit("READY")
    await asyncio.gather(*(sender(t) for t in range(in_flight)))

asyncio.run(main())
"""
ASYNC_KILLS = 5


class AsyncChild(Child):
    """The ``_ASYNC_WRITER`` process (same line protocol and SIGKILL as :class:`Child`)."""

    def __init__(self, root: Path, impl: str, seed: int, in_flight: int) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ASYNC_WRITER, str(root), impl, str(seed), str(in_flight)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the store is open (so the kill lands while sends are in flight, not during imports)."""
        deadline = time.monotonic() + timeout
        while "READY" not in self.lines:
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            assert time.monotonic() < deadline, "the writer never got ready"
            time.sleep(0.01)

    def full_flushed(self) -> int:
        """The last offset a full flush reported: log and queues were durable below it."""
        return max(int(line.split()[1]) for line in self.lines if line.startswith("FULL "))


def _lose_unsynced_queue_units(root: Path, full_flushed: int, rng: random.Random) -> list[int]:
    """Zero consume-queue units of records at or past the last full flush (all of them or a random part):
    the pages only log-only syncs followed, lost as in a power failure.  Returns their log offsets."""
    keep_some = rng.random() < 0.5
    lost = []
    for path in sorted((root / "consumequeue" / TOPIC).glob("*/" + "[0-9]" * 20)):
        data = bytearray(path.read_bytes())
        for pos in range(0, len(data), CQ_UNIT_SIZE):
            clog, size, _tag = CQ_UNIT.unpack_from(data, pos)
            if size > 0 and clog >= full_flushed and not (keep_some and rng.random() < 0.5):
                data[pos:pos + CQ_UNIT_SIZE] = bytes(CQ_UNIT_SIZE)
                lost.append(clog)
        path.write_bytes(bytes(data))
    return lost


def _lose_unacknowledged_tail(root: Path, acks, checkpoint: int, rng: random.Random) -> int | None:
    """Half the time, garble the header of whatever follows the last acknowledged record of the round (or the
    checkpoint if that is later), as a torn unsynced write would: the log must end there.  Returns where, or None."""
    if not acks or rng.random() < 0.5:
        return None
    at = max(checkpoint, max(off + size for off, _q, _qo, size, _s, _n in acks))
    seg_size = config(str(root), "SYNC_FLUSH").segment_size
    path = root / "commitlog" / f"{at // seg_size * seg_size:020d}"
    if not path.exists() or at % seg_size + 12 > seg_size:
        return None
    with open(path, "r+b") as f:
        f.seek(at % seg_size + 4)  # magic and CRC
        old = f.read(8)
        f.seek(at % seg_size + 4)
        f.write(bytes(b ^ 0x5A for b in old))
    return at


def check_acknowledged_through_queues(store: MessageStore, acks) -> None:
    """Every acknowledged message is served by its consume queue at its queue offset."""
    for offset, qid, qoff, size, seed, n in acks:
        assert store.queue_unit(TOPIC, qid, qoff)[:2] == (offset, size)
        got = store.get_messages(TOPIC, qid, qoff, 1).messages
        assert len(got) == 1 and got[0].commitlog_offset == offset, (qid, qoff)
        assert got[0].body == expected_body(seed, n) and got[0].keys == (f"s{seed}n{n}",)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPL_NAMES)
def test_group_commit_acks_survive_sigkill_and_lost_queue_pages(tmp_path, impl):
    """64 sends in flight under SYNC_FLUSH (the group commit syncs the log only), SIGKILL, then the queue
    units no full flush covered and the unacknowledged tail are lost: the checkpoint never names an offset
    past the last full flush, and every acknowledged message is still read through its consume queue after
    recovery, again and again on the recovered store."""
    rng = random.Random(31 + len(impl))
    root = tmp_path / "store"
    all_acks = []
    for round_ in range(ASYNC_KILLS):
        child = AsyncChild(root, impl, seed=200 + round_, in_flight=64)
        child.wait_ready()
        child.kill_after(rng.uniform(0.2, 0.8))
        acks = child.acks()
        all_acks.extend(acks)
        checkpoint = read_checkpoint(root / "checkpoint")
        full_flushed = child.full_flushed()
        assert checkpoint is not None and checkpoint.flushed_offset <= full_flushed
        lost = _lose_unsynced_queue_units(root, full_flushed, rng)
        tear = _lose_unacknowledged_tail(root, acks, checkpoint.flushed_offset, rng)
        store = reopen(root, "SYNC_FLUSH", impl)
        try:
            assert store.clean_start is False
            assert store.recovery["check_from"] == checkpoint.flushed_offset
            end = store.commit_log.max_offset
            assert tear is None or end <= tear
            assert store.recovery["cq_units_redone"] >= sum(1 for clog in lost if clog < end)
            check_acknowledged(store, all_acks)
            check_acknowledged_through_queues(store, all_acks)
            check_queues_agree_with_log(store)
        finally:
            store.shutdown()
        report = verify_store(root)
        assert report.ok, report.problems
    assert len(all_acks) > 200, "the writer barely ran; the test proves little"
