"""The store as a Raft (DLedger) log, on every implementation: truncation of an uncommitted tail and the
visibility limit (the commit index) of consumer reads.

Truncation: a log cut back to an entry boundary is, file for file, a log that only ever got the records
before it (one that replicated that range; one that appended those records, but for a blank marker that
closes the segment before a cut at a segment start); appends and replicated appends go on from the cut; a
deposed leader's tail replaced by the new leader's records gives the new leader's log byte for byte; bad
offsets change nothing; a kill -9 right after a truncation recovers the truncated log.  Visibility: every
consumer read stops at the limit, raising it reveals the rest, no limit is the old behaviour, replication
and the log's own offsets ignore it.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import IMPL_NAMES, IMPLS
from procs import child_env
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message
from sparkmq.platform.store import FlushMode, GetStatus, MessageStore, PutStatus, StoreConfig, verify_store
from sparkmq.platform.store.checkpoint import read_checkpoint
from sparkmq.platform.store.message_store import iter_all
from sparkmq.storage_native import StoreError, encode_batch
from sparkmq.storage_native.layout import BLANK_MAGIC

SEG = 16 * 1024  # small segments: every log crosses several rolls (blank markers)
CQ_UNITS = 8     # and several consume-queue files
TS = 1_700_000_000_000
HOST = bytes(range(20))
TOPICS = ("Orders", "Payments", "%RETRY%billing")
_SIZE_MAGIC = struct.Struct("<II")


# -- helpers ------------------------------------------------------------------------------------------
def _open(impl, root: Path, **kw):
    kw.setdefault("segment_size", SEG)
    kw.setdefault("cq_units_per_file", CQ_UNITS)
    return impl.CommitLog(str(root), **kw)


def _store(root: Path, impl, **kw) -> MessageStore:
    cfg = StoreConfig(root=root, **{"segment_size": SEG, "cq_units_per_file": CQ_UNITS, "max_message_size": 4096,
                                    "max_properties_size": 1024, "background_services": False,
                                    "store_host": "10.0.0.1:10911", **kw})
    return MessageStore(cfg, commit_log_class=impl.CommitLog).start()


def append(log, i: int, spec: tuple[int, int, int]) -> tuple[int, int, int]:
    """Append record ``i`` of ``spec`` (topic index, queue id, body size); the same bytes on every log."""
    topic, qid, size = spec
    body = (b"%d:" % i * (size // 2 + 2))[:size]
    return log.append(TOPICS[topic], qid, body, b"UNIQ_KEY\x01u%d\x02" % i, i, 0, 0, TS, HOST, TS + i, HOST)


def fill(log, count: int, seed: int = 1) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    specs = [(rng.randrange(3), rng.randrange(4), rng.randrange(1, 2500)) for _ in range(count)]
    for i, spec in enumerate(specs):
        append(log, i, spec)
    return specs


def entries(log, start: int = 0) -> list[tuple[int, bytes]]:
    """(offset, bytes) of every entry (record or blank marker) of a log from ``start``, one read each."""
    out = []
    off = start
    while off < log.max_offset:
        data = log.read_replication(off, 1)
        out.append((off, data))
        off += len(data)
    return out


def is_blank(entry: bytes) -> bool:
    return _SIZE_MAGIC.unpack_from(entry)[1] == BLANK_MAGIC


def boundaries(log) -> list[int]:
    """Every entry boundary: record starts, blank marker starts, the max offset."""
    return [o for o, _d in entries(log)] + [log.max_offset]


def tree(root: Path) -> dict[str, bytes]:
    """Every file of the log and the consume queues (not the checkpoint, abort and lock files)."""
    return {str(p.relative_to(root)): p.read_bytes() for sub in ("commitlog", "consumequeue")
            for p in sorted((root / sub).rglob("*")) if p.is_file()}


def queues_state(log) -> list:
    """Every queue's bounds, units and records as the queue readers give them."""
    out = []
    for q in log.queues():
        cq = log.consume_queue(*q)
        out.append((q, cq.min_offset, cq.max_offset, cq.visible_max_offset, cq.units(cq.min_offset, 1 << 20),
                    log.get(*q, cq.min_offset, 1 << 20), log.read_packed(*q, cq.min_offset, 1 << 20)))
    return out


def state(log, root: Path) -> tuple:
    """Everything a reader of a log sees, and its files."""
    return (log.min_offset, log.max_offset, log.flushed_offset <= log.max_offset, log.queues(), queues_state(log),
            log.read_replication(log.min_offset, 1 << 40), tree(root))


def snapshot(log, root: Path) -> tuple:
    """What a refused call must leave untouched."""
    return (log.max_offset, log.flushed_offset, log.log_flushed_offset, log.visible_offset, log.segments(),
            queues_state(log), tree(root))


def outcome(fn, *args) -> tuple:
    try:
        return ("ok", fn(*args))
    except StoreError as exc:
        return ("StoreError", exc.code, exc.message)
    except TypeError:
        return ("TypeError",)


class Writer:
    """Puts messages on a store through every append path (put, put_batch, put_packed)."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.n = 0

    def _message(self, topic: str, size: int) -> Message:
        self.n += 1
        body = (b"%d|" % self.n * (size // 2 + 2))[:size]
        return Message(topic, body, tags=f"t{self.n % 3}", keys=(f"k{self.n}",), properties={"n": str(self.n)})

    def put(self, topic: str, queue_id: int, size: int, count: int = 1, mode: int = 0) -> None:
        messages = [self._message(topic, size) for _ in range(count)]
        if mode == 0:
            for msg in messages:
                self.store.put(msg, queue_id)
        elif mode == 1:
            self.store.put_batch(topic, queue_id, messages)
        else:
            data, _ids, _next = encode_batch(messages, "0A0000012A9F00000000", 1_698_796_800_000, self.n & 0xFFFF, TS)
            self.store.put_packed(topic, queue_id, data, count)


def replicate(master: MessageStore, slave: MessageStore, sizes: list[int]) -> None:
    """Fetch from the slave's max offset in chunks of ``sizes`` (cycled) until it has the whole master."""
    end = master.log_offsets().max_offset
    offset = slave.log_offsets().max_offset
    for size in itertools.cycle(sizes):
        if offset >= end:
            break
        data = master.read_replication(offset, size)
        assert slave.append_replicated(offset, data) == offset + len(data)
        offset += len(data)
    assert offset == end


def assert_same_store(a: MessageStore, b: MessageStore) -> None:
    """Everything a consumer sees is the same on both stores, and so are the files."""
    assert (a.log_offsets().min_offset, a.log_offsets().max_offset) == \
           (b.log_offsets().min_offset, b.log_offsets().max_offset)
    assert a.queues() == b.queues()
    for topic, qid in a.queues():
        lo, hi = a.min_offset(topic, qid), a.max_offset(topic, qid)
        assert (b.min_offset(topic, qid), b.max_offset(topic, qid)) == (lo, hi)
        assert b.get_messages(topic, qid, lo, 10_000) == a.get_messages(topic, qid, lo, 10_000)
    assert tree(a.config.root) == tree(b.config.root)


# -- truncation: the result is a log that only got the kept records -------------------------------------------
def test_truncate_at_every_boundary(impl, tmp_path):
    """Each entry boundary of a log that crosses rolls (record starts, blank marker starts, segment starts after a
    blank marker, the max offset): the cut log is file for file the log that replicated [0, cut); the log that
    only appended the kept records differs at most by the blank marker closing the segment before a cut at a
    segment start; appends after the cut land where they land on those logs."""
    with _open(impl, tmp_path / "full") as log:
        specs = fill(log, 45)
        ents = entries(log)
        original = log.read_replication(0, 1 << 40)
        offsets = [o for o, d in ents if not is_blank(d)]
    cuts = [o for o, _d in ents] + [len(original)]
    assert any(is_blank(d) for _o, d in ents) and len(cuts) > 40
    assert any(c % SEG == 0 and c > 0 and is_blank(ents[i - 1][1]) for i, c in enumerate(cuts[:-1]))  # after a blank
    more = [(0, 1, 2400), (2, 3, 900), (1, 0, 50)]
    for n, cut in enumerate(cuts):
        root = tmp_path / f"cut{n}"
        shutil.copytree(tmp_path / "full", root)
        with _open(impl, root) as cut_log, _open(impl, tmp_path / f"r{n}") as replica, \
                _open(impl, tmp_path / f"a{n}") as appended:
            assert cut_log.truncate(cut) == cut == cut_log.max_offset
            if cut:
                replica.append_replicated(0, original[:cut])
            assert state(cut_log, root) == state(replica, tmp_path / f"r{n}"), cut
            kept = [i for i, o in enumerate(offsets) if o < cut]
            for i in kept:
                append(appended, i, specs[i])
            assert queues_state(appended) == queues_state(cut_log)
            if appended.max_offset == cut:
                assert tree(tmp_path / f"a{n}") == tree(root)
            else:  # the cut is a segment's start and the segment before ends with a blank marker
                assert cut % SEG == 0 and is_blank(original[appended.max_offset:cut])
            for j, spec in enumerate(more, start=len(specs)):
                assert append(cut_log, j, spec) == append(replica, j, spec)
            assert state(cut_log, root) == state(replica, tmp_path / f"r{n}")
        with _open(impl, root) as reopened:  # recovery agrees
            assert reopened.max_offset == cut + sum(len(d) for _o, d in entries(reopened, cut))
            assert reopened.recovery["torn"] == 0 and reopened.recovery["cq_units_truncated"] == 0
        assert verify_store(root).ok


spec_st = st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(1, 3000))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(spec_st, min_size=1, max_size=70), picks=st.lists(st.integers(0, 10_000), min_size=1,
                                                                          max_size=3),
       after=st.lists(spec_st, max_size=10))
def test_truncate_random_boundaries_then_append(impl, tmp_path_factory, specs, picks, after):
    """Random appends, then truncations at random boundaries (each deeper than the last) with appends between
    and after: the log is the one that replicated what was kept and then got the same appends."""
    base = tmp_path_factory.mktemp("trunc")
    with _open(impl, base / "log") as log, _open(impl, base / "ref") as ref:
        n = 0
        for spec in specs:
            append(log, n, spec)
            n += 1
        for pick in picks:
            bounds = boundaries(log)
            cut = bounds[pick % len(bounds)]
            kept = log.read_replication(0, 1 << 40)[:cut]
            assert log.truncate(cut) == cut
            shutil.rmtree(base / "ref2", ignore_errors=True)
            with _open(impl, base / "ref2") as fresh:
                if cut:
                    fresh.append_replicated(0, kept)
                assert state(log, base / "log") == state(fresh, base / "ref2")
            for spec in after[:3]:
                append(log, n, spec)
                n += 1
        ref.append_replicated(0, log.read_replication(0, 1 << 40))
        for spec in after:
            assert append(log, n, spec) == append(ref, n, spec)
            n += 1
        assert state(log, base / "log") == state(ref, base / "ref")


def test_truncated_queues_continue_their_numbering(impl, tmp_path):
    """A queue's next message gets the queue offset after its last kept unit; a queue left with nothing is gone
    (files and directory), and comes back from 0."""
    with _open(impl, tmp_path) as log:
        a = [log.append("A", 0, b"a%d" % i)[0] for i in range(20)]  # across queue files of 8 units
        b0 = log.append("B", 1, b"b0")[0]
        log.append("A", 0, b"a20")
        log.append("B", 1, b"b1")
        assert log.truncate(b0) == b0
        assert log.queues() == [("A", 0)]
        assert log.consume_queue("B", 1) is None
        assert not (tmp_path / "consumequeue" / "B").exists()
        cq = log.consume_queue("A", 0)
        assert (cq.min_offset, cq.max_offset) == (0, 20)
        assert sorted(p.name for p in (tmp_path / "consumequeue" / "A" / "0").iterdir()) == \
            [f"{0:020d}", f"{8 * 20:020d}", f"{16 * 20:020d}"]
        assert log.append("A", 0, b"again")[1] == 20
        assert log.append("B", 1, b"fresh")[1] == 0
        assert log.queues() == [("A", 0), ("B", 1)]
        # a cut at a queue-file boundary deletes the file that starts there
        assert log.truncate(a[16]) == a[16]
        assert cq.max_offset == 16 and log.consume_queue("B", 1) is None
        assert sorted(p.name for p in (tmp_path / "consumequeue" / "A" / "0").iterdir()) == \
            [f"{0:020d}", f"{8 * 20:020d}"]
        assert log.append("A", 0, b"x")[1] == 16
        assert log.truncate(0) == 0
        assert (log.min_offset, log.max_offset, log.queues(), log.segments()) == (0, 0, [], [])
        assert tree(tmp_path) == {}
        assert log.append("A", 0, b"first") == (0, 0, log.store_timestamp_at(0))


def test_truncate_after_retention_keeps_the_oldest_segment(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        fill(log, 60)
        assert log.delete_segments_before(2 * SEG) == 2
        low = log.min_offset
        assert low == 2 * SEG
        with pytest.raises(StoreError) as err:
            log.truncate(low - 1)
        assert (err.value.code, err.value.message) == ("OFFSET_TOO_SMALL",
                                                     f"offset {low - 1} is below the minimum offset {low}")
        queues = {q: log.consume_queue(*q).min_offset for q in log.queues()}
        assert log.truncate(low) == low
        assert (log.min_offset, log.max_offset) == (low, low)
        assert [s for s, _p in log.segments()] == [low]
        assert (tmp_path / "commitlog" / f"{low:020d}").read_bytes() == bytes(SEG)
        assert {qmin > 0 for qmin in queues.values()} == {True, False}
        for q, qmin in queues.items():
            cq = log.consume_queue(*q)
            if qmin:  # retention numbered it from qmin on: it keeps its numbering, empty
                assert (cq.min_offset, cq.max_offset) == (qmin, qmin)
            else:  # all it ever had is cut: gone
                assert cq is None and q not in log.queues()
        kept = next(q for q, qmin in queues.items() if qmin)
        off, qoff, _ts = log.append(*kept, b"after")
        assert (off, qoff) == (low, queues[kept])
    with _open(impl, tmp_path) as log:
        assert (log.min_offset, log.max_offset) == (low, off + len(log.read(off)))


# -- a deposed leader's tail replaced by the new leader's records ----------------------------------------------
@pytest.mark.parametrize("where", ["common_end", "record", "blank_marker", "segment_start"])
def test_deposed_leader_takes_the_new_leader_s_log(impl, tmp_path, where):
    """B led, replicated a common prefix to A, then appended records A never got (uncommitted); A leads now and
    appends others.  B cuts its log at a boundary of the common prefix and replicates A from there: both logs,
    queues and files are the same, and B's stale queue is gone."""
    a = _store(tmp_path / "a", impl)
    b = _store(tmp_path / "b", impl)
    try:
        wb, wa = Writer(b), Writer(a)
        for i in range(30):
            wb.put(TOPICS[i % 3], i % 4, 700 + 53 * i, 1 + i % 3, i % 3)
        replicate(b, a, [9000])
        common = a.log_offsets().max_offset
        b.set_visible_offset(common)  # the commit index: what both hold
        wb.n = wa.n = 10_000
        for i in range(12):  # B's uncommitted tail, a queue only it has among them
            wb.put("Stale" if i % 4 == 0 else TOPICS[i % 3], i % 2, 900 + 31 * i, 1 + i % 2, i % 3)
        for i in range(15):
            wa.put(TOPICS[(i + 1) % 3], (i + 1) % 4, 400 + 71 * i, 1 + i % 4, (i + 1) % 3)
        ents = entries(a.commit_log)
        prefix = [(i, o) for i, (o, _d) in enumerate(ents) if o < common]
        cut = {
            "common_end": common,
            "record": next(o for i, o in reversed(prefix) if not is_blank(ents[i][1]) and o % SEG),
            "blank_marker": next(o for i, o in reversed(prefix) if is_blank(ents[i][1])),
            "segment_start": next(o for i, o in reversed(prefix) if i and o % SEG == 0 and is_blank(ents[i - 1][1])),
        }[where]
        assert "Stale" in {t for t, _q in b.queues()}
        assert b.truncate_log(cut) == cut == b.log_offsets().max_offset
        assert "Stale" not in {t for t, _q in b.queues()}
        assert b.visible_offset == min(common, cut)
        cp = read_checkpoint(b.paths.checkpoint)
        assert cp is not None and cp.flushed_offset <= cut
        assert b.commit_log.read_replication(0, 1 << 40) == a.commit_log.read_replication(0, cut)
        replicate(a, b, [5000, 30000, 700])
        hidden = {q: b.max_offset(*q) for q in b.queues()}
        assert b.set_visible_offset(a.log_offsets().max_offset) == a.log_offsets().max_offset  # committed now
        assert any(b.max_offset(*q) > n for q, n in hidden.items())
        assert_same_store(a, b)
        for i in range(5):  # and it goes on
            wa.put(TOPICS[i % 3], i % 4, 1500, 2, i % 3)
        replicate(a, b, [12000])
        b.set_visible_offset(None)
        assert_same_store(a, b)
        assert verify_store(tmp_path / "b").ok
    finally:
        a.shutdown()
        b.shutdown()
    b = _store(tmp_path / "b", impl)
    a = _store(tmp_path / "a", impl)
    try:
        assert b.clean_start and b.recovery["torn"] == 0
        assert_same_store(a, b)
    finally:
        a.shutdown()
        b.shutdown()


# -- bad offsets change nothing -------------------------------------------------------------------------------
def test_bad_truncate_offsets_change_nothing(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        fill(log, 50)
        ents = entries(log)
        blank = next(o for o, d in ents if is_blank(d))
        rec = next(o for o, d in ents if not is_blank(d) and o > 0)
        end = log.max_offset
        log.flush()
        log.set_visible_offset(rec)
        before = snapshot(log, tmp_path)
        cases = [
            (-1, "INVALID_ARGUMENT", "offset must be >= 0, got -1"),
            (-2**70, "INVALID_ARGUMENT", f"offset must be >= 0, got {-2**70}"),
            (end + 1, "OFFSET_OVERFLOW", f"offset {end + 1} is at or past the maximum offset {end}"),
            (2**70, "OFFSET_OVERFLOW", f"offset {2**70} is at or past the maximum offset {end}"),
            (rec + 1, "OFFSET_ILLEGAL", f"no record starts at offset {rec + 1}"),
            (rec - 1, "OFFSET_ILLEGAL", f"no record starts at offset {rec - 1}"),
            (blank + 8, "OFFSET_ILLEGAL", f"no record starts at offset {blank + 8}"),  # inside the padding
            (blank + 1, "OFFSET_ILLEGAL", f"no record starts at offset {blank + 1}"),
            (end - 1, "OFFSET_ILLEGAL", f"no record starts at offset {end - 1}"),
        ]
        for offset, code, message in cases:
            with pytest.raises(StoreError) as err:
                log.truncate(offset)
            assert (err.value.code, err.value.message) == (code, message)
            assert snapshot(log, tmp_path) == before, offset
        for bad in ("10", 1.0, None):
            with pytest.raises(TypeError):
                log.truncate(bad)
        assert snapshot(log, tmp_path) == before
        assert log.truncate(end) == end  # the max offset is a boundary: nothing to cut
        assert log.max_offset == end and tree(tmp_path) == before[-1]
    with pytest.raises(StoreError) as err:
        log.truncate(0)
    assert err.value.code == "CLOSED"


def test_store_truncate_errors_change_nothing(impl, tmp_path):
    store = _store(tmp_path / "s", impl)
    try:
        Writer(store).put("Orders", 0, 1000, 30, 1)
        store.flush()
        log = store.commit_log
        end = log.max_offset
        cp = (tmp_path / "s" / "checkpoint").read_bytes()
        before = snapshot(log, tmp_path / "s")
        for bad in (1, end + 1, -1, "0", 2.0, True, end - 3, 2**80):
            with pytest.raises(SparkMQError) as err:
                store.truncate_log(bad)
            assert err.value.code is ErrorCode.OFFSET_ILLEGAL, bad
            assert snapshot(log, tmp_path / "s") == before
            assert (tmp_path / "s" / "checkpoint").read_bytes() == cp
    finally:
        store.shutdown()


# -- kill -9 right after a truncation --------------------------------------------------------------------------
#: A child that appends, makes it durable, appends more, truncates, prints what it holds, and waits to be killed.
_TRUNCATING_CHILD = r"""
import hashlib, json, sys
from sparkmq.platform.common.message import Message
from sparkmq.platform.store import MessageStore, StoreConfig
from sparkmq.storage_native import implementations

root, impl, mode, seg, cq_units = sys.argv[1:6]
CommitLog = implementations()[impl].CommitLog
topics = ("A", "B", "C", "Late")
if mode == "store":
    config = StoreConfig(root=root, segment_size=int(seg), cq_units_per_file=int(cq_units), flush_interval_ms=10,
                         checkpoint_interval_ms=10, max_message_size=4096, max_properties_size=1024)
    store = MessageStore(config, commit_log_class=CommitLog).start()
    log = store.commit_log
    offsets = [store.put(Message(topics[i % 3], b"%d|" % i * (40 + 37 * i % 900)), i % 3).commitlog_offset
               for i in range(80)]
    store.flush()
    offsets += [store.put(Message(topics[i % 4], b"%d|" % i * (40 + 37 * i % 900)), i % 3).commitlog_offset
                for i in range(80, 120)]
    cut = store.truncate_log(offsets[55])
else:
    log = CommitLog(root, segment_size=int(seg), cq_units_per_file=int(cq_units))
    offsets = [log.append(topics[i % 3], i % 3, b"%d|" % i * (40 + 37 * i % 900))[0] for i in range(80)]
    log.flush()
    offsets += [log.append(topics[i % 4], i % 3, b"%d|" % i * (40 + 37 * i % 900))[0] for i in range(80, 120)]
    log.flush_log()
    cut = log.truncate(offsets[55])  # no flush after it: the zeroes and deletions are in the page cache only
queues = {f"{t}/{q}": log.consume_queue(t, q).units(0, 1 << 20) for t, q in log.queues()}
print(json.dumps({"cut": cut, "max": log.max_offset, "flushed": log.flushed_offset, "queues": queues,
                  "segments": len(log.segments()), "old_end": offsets[-1],
                  "sha": hashlib.sha256(log.read_replication(0, 1 << 40)).hexdigest()}), flush=True)
sys.stdin.read()
"""


@pytest.mark.cluster  # a child process killed with SIGKILL
@pytest.mark.parametrize("mode", ["store", "core"])
def test_kill9_right_after_truncate_recovers_the_truncated_log(impl, tmp_path, mode):
    impl_name = next(name for name, module in IMPLS.items() if module is impl)
    root = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-c", _TRUNCATING_CHILD, str(root), impl_name, mode, str(SEG),
                             str(CQ_UNITS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env(), text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        held = json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert held["cut"] == held["max"] < held["old_end"] and held["flushed"] <= held["cut"]
    assert "Late/1" not in held["queues"]  # only the cut records had it
    if mode == "store":
        store = _store(root, impl)
        try:
            assert store.clean_start is False
            log = store.commit_log
            check_from = store.recovery["check_from"]
            assert check_from <= held["cut"]
            _check_recovered(log, held)
        finally:
            store.shutdown()
    else:
        for check_from in (0, held["flushed"]):  # a full scan, and from what the log called durable
            with _open(impl, root, check_from=check_from) as log:
                _check_recovered(log, held)
    assert verify_store(root).ok


def _check_recovered(log, held: dict) -> None:
    assert log.max_offset == held["cut"]
    assert log.recovery["end_offset"] == held["cut"] and log.recovery["torn"] == 0
    assert len(log.segments()) == held["segments"]
    assert {f"{t}/{q}": [list(u) for u in log.consume_queue(t, q).units(0, 1 << 20)]
            for t, q in log.queues()} == held["queues"]
    assert hashlib.sha256(log.read_replication(0, 1 << 40)).hexdigest() == held["sha"]


# -- durability bookkeeping -------------------------------------------------------------------------------------
def test_flushed_offsets_never_pass_the_end(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        fill(log, 50)
        bounds = boundaries(log)
        end = log.flush()
        assert log.flushed_offset == log.log_flushed_offset == end
        cut = bounds[len(bounds) // 2]
        assert log.truncate(cut) == cut
        assert log.flushed_offset == log.log_flushed_offset == cut
        assert log.flush() == cut and log.flush_log() == cut
        append(log, 1000, (0, 0, 100))
        assert log.flushed_offset == cut  # nothing claims the new record before a sync
        assert log.flush_log() == log.max_offset and log.flushed_offset == cut
        assert log.flush() == log.max_offset


@pytest.mark.parametrize("flush_mode", [FlushMode.SYNC_FLUSH, FlushMode.ASYNC_FLUSH])
def test_store_truncate_with_the_flush_service(impl, tmp_path, flush_mode):
    """With the background flush service: the checkpoint and the service's offsets come down to the end, and a
    SYNC_FLUSH put after the cut waits for a sync that covers it."""
    store = _store(tmp_path / "s", impl, background_services=True, flush_mode=flush_mode, flush_interval_ms=20,
                   checkpoint_interval_ms=20)
    try:
        writer = Writer(store)
        for i in range(40):
            writer.put(TOPICS[i % 3], i % 2, 600 + 17 * i, 2, i % 3)
        bounds = boundaries(store.commit_log)
        cut = bounds[len(bounds) // 3]
        deadline = time.monotonic() + 10
        while read_checkpoint(store.paths.checkpoint).flushed_offset <= cut:  # a checkpoint past the cut
            assert time.monotonic() < deadline
            time.sleep(0.01)
        old = store._flusher
        assert store.truncate_log(cut) == cut
        assert store._flusher is not old and old.log_flushed_offset > cut
        assert store._flusher.log_flushed_offset == store._flusher.flushed_offset == cut
        assert read_checkpoint(store.paths.checkpoint).flushed_offset == cut
        got = store.put(Message("Orders", b"after the cut"), 0)
        assert got.commitlog_offset == cut and got.status is PutStatus.PUT_OK
        deadline = time.monotonic() + 10
        while store._flusher.log_flushed_offset < cut + got.store_size:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.1)
        assert cut <= read_checkpoint(store.paths.checkpoint).flushed_offset <= store.commit_log.max_offset
    finally:
        store.shutdown()
    store = _store(tmp_path / "s", impl)
    try:
        assert store.clean_start and store.log_offsets().max_offset == cut + got.store_size
        assert store.read_message(cut).body == b"after the cut"
    finally:
        store.shutdown()


def test_a_crash_inside_truncate_log_recovers_the_cut_log(impl, tmp_path):
    """The checkpoint comes down before the log is cut: when truncate_log dies after the cut (its flush fails
    here), the store's files as they are recover to the cut log, not to zeroes kept as records."""
    failing = type("FailingFlushLog", (impl.CommitLog,), {"fail": False})

    def flush(self):
        if self.fail:
            raise StoreError("IO_ERROR", "fdatasync: injected")
        return impl.CommitLog.flush(self)

    failing.flush = flush
    cfg = StoreConfig(root=tmp_path / "s", segment_size=SEG, cq_units_per_file=CQ_UNITS, max_message_size=4096,
                      max_properties_size=1024, background_services=False)
    store = MessageStore(cfg, commit_log_class=failing).start()
    try:
        writer = Writer(store)
        for i in range(30):
            writer.put(TOPICS[i % 3], i % 4, 900 + 41 * i, 1 + i % 2, i % 3)
        end = store.flush()
        assert read_checkpoint(store.paths.checkpoint).flushed_offset == end
        bounds = boundaries(store.commit_log)
        cut = next(b for b in bounds[len(bounds) // 2:] if b % SEG > SEG // 2)  # far from a segment's start
        store.commit_log.fail = True
        with pytest.raises(SparkMQError) as err:
            store.truncate_log(cut)
        assert err.value.code is ErrorCode.INTERNAL_ERROR
        assert store.log_offsets().max_offset == cut
        checkpoint = read_checkpoint(store.paths.checkpoint).flushed_offset
        assert checkpoint <= cut and checkpoint == cut // SEG * SEG
        shutil.copytree(tmp_path / "s", tmp_path / "crashed", ignore=shutil.ignore_patterns("lock"))
        expected = store.commit_log.read_replication(0, 1 << 40)
        store.commit_log.fail = False
    finally:
        store.shutdown()
    crashed = _store(tmp_path / "crashed", impl)
    try:
        assert crashed.clean_start is False and crashed.recovery["check_from"] == checkpoint
        assert crashed.log_offsets().max_offset == cut
        assert crashed.read_replication(0, 1 << 40) == expected
    finally:
        crashed.shutdown()


# -- thread safety ---------------------------------------------------------------------------------------------
def test_truncate_races_readers_and_flushes(impl, tmp_path):
    """Readers, flushes and range walks in threads while the main thread appends and truncates: nothing breaks,
    no flushed offset ever passes the end, and the final log is the one that replicated what it kept."""
    stop = threading.Event()
    errors: list[BaseException] = []
    with _open(impl, tmp_path / "log") as log:
        fill(log, 250)

        def reader() -> None:
            rng = random.Random(threading.get_ident())
            try:
                while not stop.is_set():
                    qs = log.queues()
                    if qs:
                        q = rng.choice(qs)
                        cq = log.consume_queue(*q)
                        if cq is not None:
                            _next, got = log.get(*q, cq.min_offset, 50)
                            for _q, clo, rec in got:  # never a record a truncation zeroed or rewrote under the copy
                                assert impl.decode_record(rec, True)[5] == clo
                            _next, count, data = log.read_packed(*q, cq.min_offset, 50)
                            assert len(impl.decode_records(data, "b", lambda *f: f, bytes)) == count
                            assert isinstance(cq.visible_max_offset, int)
                    log.queues_in_range(0, log.max_offset)
                    # the whole log (> 256 KiB: the C core copies it with the GIL released), each entry whole
                    data = log.read_replication(0, 1 << 30)
                    pos = 0
                    while pos < len(data):
                        total, magic = _SIZE_MAGIC.unpack_from(data, pos)
                        if magic == BLANK_MAGIC:
                            assert (pos + total) % SEG == 0
                        else:
                            assert impl.decode_record(data[pos:pos + total], True)[5] == pos
                        pos += total
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def flusher() -> None:
            try:
                rng = random.Random(1)
                while not stop.is_set():
                    if rng.random() < 0.5:
                        log.flush()
                    else:
                        log.flush_log()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(2)] + [threading.Thread(target=flusher)]
        for t in threads:
            t.start()
        try:
            rng = random.Random(7)
            n = 1000
            for _round in range(150):
                for _ in range(rng.randrange(1, 6)):
                    append(log, n, (rng.randrange(3), rng.randrange(4), rng.randrange(1, 2500)))
                    n += 1
                    assert log.flushed_offset <= log.log_flushed_offset <= log.max_offset
                bounds = boundaries(log)[-8:]
                cut = bounds[rng.randrange(len(bounds) - 6, len(bounds))]
                log.set_visible_offset(rng.choice(bounds))
                assert log.truncate(cut) == cut
                assert log.flushed_offset <= log.log_flushed_offset <= log.max_offset == cut
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors
        assert log.flushed_offset <= log.max_offset and log.log_flushed_offset <= log.max_offset
        whole = log.read_replication(0, 1 << 40)
        log.set_visible_offset(None)
        with _open(impl, tmp_path / "ref") as ref:
            ref.append_replicated(0, whole)
            assert state(log, tmp_path / "log") == state(ref, tmp_path / "ref")


# -- both implementations, side by side ------------------------------------------------------------------------
@pytest.mark.skipif(len(IMPL_NAMES) < 2, reason="the C extension is not built")
def test_both_implementations_truncate_and_limit_identically(tmp_path):
    logs = {name: _open(IMPLS[name], tmp_path / name) for name in IMPL_NAMES}
    try:
        rng = random.Random(3)
        n = 0
        for _round in range(12):
            for _ in range(rng.randrange(3, 15)):
                spec = (rng.randrange(3), rng.randrange(4), rng.randrange(1, 2500))
                assert len({append(log, n, spec) for log in logs.values()}) == 1
                n += 1
            first = next(iter(logs.values()))
            bounds = boundaries(first)
            cut = rng.choice(bounds[len(bounds) // 2:])
            limit = rng.choice([None, rng.randrange(0, first.max_offset + 100), *bounds[-5:]])
            for bad in (cut + 1, -3, first.max_offset + 5, 2**66, "x"):
                results = [outcome(log.truncate, bad) for log in logs.values()]
                assert results[0] == results[1] and results[0][0] != "ok", results
            ranges = [(0, first.max_offset), (bounds[1], bounds[-2]), (7, 100), (-1, 5), (5, -1), (10**20, 10**21)]
            for log in logs.values():
                log.set_visible_offset(limit)
            seen = [[outcome(log.queues_in_range, *r) for r in ranges] + [queues_state(log)] for log in logs.values()]
            assert seen[0] == seen[1]
            assert [log.truncate(cut) for log in logs.values()] == [cut, cut]
            assert queues_state(logs["python"]) == queues_state(logs["native"])
            for log in logs.values():
                log.set_visible_offset(None)
        for log in logs.values():
            log.flush()
        trees = [tree(tmp_path / name) for name in IMPL_NAMES]
        assert trees[0] == trees[1]
    finally:
        for log in logs.values():
            log.close()


# -- visibility: the commit index --------------------------------------------------------------------------------
def _model(log, limit: int | None) -> dict[tuple[str, int], tuple[int, int, list]]:
    """(min, visible max, visible units) of every queue, from its raw units."""
    out = {}
    for q in log.queues():
        cq = log.consume_queue(*q)
        units = cq.units(cq.min_offset, 1 << 20)
        shown = [u for u in units if limit is None or u[0] < limit]
        assert units[:len(shown)] == shown  # units are in log order: the visible ones are a prefix
        out[q] = (cq.min_offset, cq.min_offset + len(shown), shown)
    return out


def test_commit_log_queue_readers_stop_at_the_limit(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        fill(log, 80)
        end = log.max_offset
        raw = queues_state(log)
        assert log.visible_offset is None
        bounds = boundaries(log)
        rng = random.Random(5)
        limits = bounds[::7] + [b + 1 for b in bounds[::11]] + [0, end + 1000, rng.randrange(end)]
        for limit in limits:
            log.set_visible_offset(limit)
            assert log.visible_offset == limit
            for q, (lo, hi, shown) in _model(log, limit).items():
                cq = log.consume_queue(*q)
                assert cq.visible_max_offset == hi and cq.max_offset >= hi
                nxt, got = log.get(*q, lo, 1 << 20)
                assert nxt == hi and [(c, len(r)) for _q, c, r in got] == [(c, s) for c, s, _t in shown]
                nxt, count, data = log.read_packed(*q, lo, 1 << 20)
                assert (nxt, count, data) == (hi, len(shown), b"".join(r for _q, _c, r in got))
                assert log.get(*q, hi, 10) == (hi, [])
                if hi < cq.max_offset:  # a read from inside the hidden part finds nothing either
                    assert log.get(*q, hi + 1, 10) == (hi + 1, [])
                # a tag filter: the hidden units end the read, matching or not
                nxt, got = log.get(*q, lo, 1 << 20, frozenset({-1}))
                assert (nxt, got) == (hi, [])
                nxt, got = log.get(*q, lo, 2, None, 1)  # max_count and max_bytes still apply below the limit
                assert len(got) == min(1, len(shown)) and nxt == lo + len(got)
            # not limited: the log's own offsets and readers, replication, the raw units
            assert log.max_offset == end and log.read_replication(0, 1 << 40)[:100] == log.read_raw(0, 100)
            assert log.scan(0, 1 << 20)[0] == end
            assert [(q, cq_min, cq_max, units) for q, cq_min, cq_max, _v, units, _g, _p in queues_state(log)] == \
                   [(q, cq_min, cq_max, units) for q, cq_min, cq_max, _v, units, _g, _p in raw]
        log.set_visible_offset(None)
        assert log.visible_offset is None and queues_state(log) == raw  # no limit: as before
        log.set_visible_offset(end)
        assert queues_state(log) == raw  # a limit at the end hides nothing
        for bad, exc in ((-1, StoreError), ("1", TypeError), (2**64, OverflowError)):
            with pytest.raises(exc):
                log.set_visible_offset(bad)
        assert log.visible_offset == end
    with pytest.raises(StoreError) as err:
        log.set_visible_offset(5)
    assert err.value.code == "CLOSED"


def test_queues_in_range(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        fill(log, 70)
        ents = entries(log)
        bounds = [o for o, _d in ents] + [log.max_offset]
        units = {q: log.consume_queue(*q).units(0, 1 << 20) for q in log.queues()}
        rng = random.Random(2)
        pairs = [(0, log.max_offset), (0, 0), (bounds[5], bounds[5]), (bounds[9], bounds[4])]
        pairs += [tuple(sorted(rng.sample(bounds, 2))) for _ in range(40)]
        pairs += [(b, b + 1) for b in bounds[:10]] + [(bounds[3], bounds[3] + 5), (bounds[-2], 10**30)]
        for start, end in pairs:
            expected = sorted(((c, q) for q, us in units.items() for c, _s, _t in us if start <= c < end))
            order = list(dict.fromkeys(q for _c, q in expected))
            assert log.queues_in_range(start, end) == order, (start, end)
        blank = next(o for o, d in ents if is_blank(d))
        assert log.queues_in_range(blank, blank + 1) == []  # a blank marker holds no record
        rec = [o for o, d in ents if not is_blank(d)][3]
        for args, code, message in [((rec + 1, log.max_offset), "OFFSET_ILLEGAL",
                                     f"no record starts at offset {rec + 1}"),
                                    ((-1, 5), "INVALID_ARGUMENT", "start must be >= 0, got -1"),
                                    ((0, -2**70), "INVALID_ARGUMENT", f"end must be >= 0, got {-2**70}")]:
            with pytest.raises(StoreError) as err:
                log.queues_in_range(*args)
            assert (err.value.code, err.value.message) == (code, message)
        assert log.queues_in_range(rec + 1, rec + 1) == []  # an empty range is not checked
        assert log.queues_in_range(log.max_offset + 7, 10**40) == []
        # more than a chunk of records (the walk lets the lock go in between)
        for i in range(5000):
            log.append("Many", i % 7, b"m")
        assert sorted(log.queues_in_range(bounds[-1], log.max_offset)) == [("Many", q) for q in range(7)]
        assert log.delete_segments_before(2 * SEG) == 2
        assert log.queues_in_range(0, bounds[-1]) == log.queues_in_range(2 * SEG, bounds[-1])  # clamped to min


def _messages(store: MessageStore, topic: str, qid: int) -> list:
    return store.get_messages(topic, qid, store.min_offset(topic, qid), 10_000).messages


def test_store_reads_see_only_what_is_below_the_limit(impl, tmp_path):
    store = _store(tmp_path / "s", impl)
    try:
        writer = Writer(store)
        for i in range(40):
            writer.put(TOPICS[i % 3], i % 3, 300 + 97 * i % 2000, 1 + i % 3, i % 3)
        log = store.commit_log
        end = log.max_offset
        queues = store.queues()
        unlimited = {q: (store.max_offset(*q), _messages(store, *q)) for q in queues}
        assert store.visible_offset is None and store.log_offsets().visible_offset is None
        bounds = boundaries(log)
        for limit in [bounds[len(bounds) // 2], bounds[len(bounds) // 3] + 5, bounds[1], 0]:
            assert store.set_visible_offset(None) is None  # then any limit goes, a lower one too
            assert store.set_visible_offset(limit) == limit
            assert store.visible_offset == limit == store.log_offsets().visible_offset
            assert store.log_offsets().max_offset == end  # the log's own end is not limited
            hidden = 0
            for (topic, qid), (lo, hi, shown) in _model(log, limit).items():
                everything = unlimited[(topic, qid)][1]
                assert store.max_offset(topic, qid) == hi
                got = store.get_messages(topic, qid, lo, 10_000)
                assert got.messages == [m for m in everything if m.commitlog_offset < limit]
                assert (got.next_offset, got.max_offset) == (hi, hi)
                assert got.status is (GetStatus.FOUND if shown else GetStatus.NO_NEW_MSG)
                at_end = store.get_messages(topic, qid, hi, 10)
                assert (at_end.status, at_end.next_offset, at_end.max_offset) == (GetStatus.NO_NEW_MSG, hi, hi)
                raw_max = log.consume_queue(topic, qid).max_offset
                if hi < raw_max:
                    hidden += raw_max - hi
                    past = store.get_messages(topic, qid, hi + 1, 10)
                    assert (past.status, past.next_offset) == (GetStatus.OFFSET_OVERFLOW, hi)
                    with pytest.raises(SparkMQError) as err:
                        store.read_queue_message(topic, qid, hi)
                    assert err.value.code is ErrorCode.OFFSET_ILLEGAL
                    hidden_msg = everything[hi - lo]
                    with pytest.raises(SparkMQError) as err:
                        store.read_message(hidden_msg.commitlog_offset)
                    assert err.value.code is ErrorCode.MESSAGE_NOT_FOUND
                    with pytest.raises(SparkMQError) as err:
                        store.read_by_offset_msg_id(hidden_msg.offset_msg_id)
                    assert err.value.code is ErrorCode.MESSAGE_NOT_FOUND
                    with pytest.raises(SparkMQError) as err:
                        store.read_records([hidden_msg.commitlog_offset])
                    assert err.value.code is ErrorCode.OFFSET_ILLEGAL
                    # not limited: the raw unit, the log, replication
                    assert store.queue_unit(topic, qid, hi)[0] == hidden_msg.commitlog_offset
                    assert log.read(hidden_msg.commitlog_offset)
                packed = store.get_packed(topic, qid, lo, 10_000)
                assert (packed.count, packed.next_offset, packed.max_offset) == (len(shown), hi, hi)
                assert packed.data == b"".join(log.read(c) for c, _s, _t in shown)
                result, batch = store.get_arrow(topic, qid, lo, 10_000, decode=False)
                assert (batch.num_rows, result.next_offset, result.max_offset) == (len(shown), hi, hi)
                result, batch = store.get_arrow(topic, qid, lo, 10_000)
                assert batch.num_rows == len(shown) and result.max_offset == hi
                matching = store.get_messages_matching(topic, qid, lo, 10_000, lambda props: True)
                assert (matching.messages, matching.next_offset, matching.max_offset) == (got.messages, hi, hi)
                tagged = store.get_messages(topic, qid, lo, 10_000, tags={"t1"})
                assert tagged.messages == [m for m in got.messages if m.tags == "t1"] and tagged.next_offset == hi
                for i in range(lo, hi):
                    assert store.read_queue_message(topic, qid, i) == everything[i - lo]
                assert store.read_records([c for c, _s, _t in shown]) == packed.data
                assert store.offset_by_time(topic, qid, 2**62) == hi
                assert store.offset_by_time(topic, qid, 0) == lo
                assert store.last_store_timestamp(topic, qid) == (everything[hi - lo - 1].store_timestamp if shown
                                                                  else 0)
                assert list(iter_all(store, topic, qid)) == got.messages
            assert hidden > 0
            assert store.read_replication(0, 1 << 40) == log.read_replication(0, 1 << 40)  # whole
            assert len(store.read_replication(0, 1 << 40)) == end
        # raising the limit reveals the rest; None is the old behaviour
        bounds_mid = bounds[len(bounds) // 2]
        assert store.set_visible_offset(bounds_mid) == bounds_mid
        assert store.set_visible_offset(end) == end
        assert {q: (store.max_offset(*q), _messages(store, *q)) for q in queues} == unlimited
        assert store.set_visible_offset(None) is None
        assert {q: (store.max_offset(*q), _messages(store, *q)) for q in queues} == unlimited
    finally:
        store.shutdown()


def test_visible_offset_only_grows_except_after_a_truncation(impl, tmp_path):
    store = _store(tmp_path / "s", impl)
    try:
        writer = Writer(store)
        writer.put("Orders", 0, 1500, 30, 1)
        bounds = [o for o, d in entries(store.commit_log) if not is_blank(d)]  # record k starts at bounds[k]
        assert store.set_visible_offset(bounds[10]) == bounds[10]
        assert store.set_visible_offset(bounds[5]) == bounds[10]  # a stale update is ignored
        assert store.visible_offset == bounds[10] == store.commit_log.visible_offset
        assert store.set_visible_offset(bounds[20]) == bounds[20]
        for bad in (-1, "3", 1.5, 2**63):
            with pytest.raises(SparkMQError) as err:
                store.set_visible_offset(bad)
            assert err.value.code is ErrorCode.OFFSET_ILLEGAL
        assert store.visible_offset == bounds[20]
        # a truncation below the limit brings it down, and the next set may be lower still
        assert store.truncate_log(bounds[15]) == bounds[15]
        assert store.visible_offset == bounds[15] == store.commit_log.visible_offset
        writer.put("Orders", 0, 100, 3, 0)  # appended after the cut: not committed
        assert store.max_offset("Orders", 0) == 15
        assert store.set_visible_offset(bounds[12]) == bounds[12]
        assert store.set_visible_offset(bounds[11]) == bounds[12]  # growing again
        assert store.set_visible_offset(None) is None
        assert store.set_visible_offset(bounds[3]) == bounds[3]  # a fresh limit after None
        assert store.max_offset("Orders", 0) == 3
        # a truncation without a limit keeps it off
        assert store.set_visible_offset(None) is None
        assert store.truncate_log(bounds[14]) == bounds[14]
        assert store.visible_offset is None and store.max_offset("Orders", 0) == 14
        assert store.queues_in_range(bounds[2], bounds[9]) == [("Orders", 0)]
        for args in ((-1, 5), (0, "5"), (bounds[2] + 1, bounds[9])):
            with pytest.raises(SparkMQError) as err:
                store.queues_in_range(*args)
            assert err.value.code is ErrorCode.OFFSET_ILLEGAL
    finally:
        store.shutdown()
    store = _store(tmp_path / "s", impl)  # the limit is not persisted
    try:
        assert store.visible_offset is None and store.commit_log.visible_offset is None
    finally:
        store.shutdown()


def test_a_follower_replicates_past_its_limit(impl, tmp_path):
    """Replication (both sides) ignores the limit: a follower whose commit index lags appends its leader's
    records (queue offsets checked on the raw queues) and serves only the committed ones; the queues a commit
    index move uncovers are those of the records in between."""
    leader = _store(tmp_path / "l", impl)
    follower = _store(tmp_path / "f", impl)
    try:
        writer = Writer(leader)
        for i in range(20):
            writer.put(TOPICS[i % 3], i % 2, 800, 2, i % 3)
        leader.set_visible_offset(0)
        follower.set_visible_offset(0)
        replicate(leader, follower, [7000])  # the leader's replication read is not limited either
        assert follower.log_offsets().max_offset == leader.log_offsets().max_offset
        assert all(follower.max_offset(*q) == 0 for q in follower.queues())
        commit = 0
        for step in (5, 17, 40, 10**9):
            bounds = boundaries(leader.commit_log)
            new = bounds[min(step, len(bounds) - 1)]
            woken = follower.queues_in_range(commit, new)
            before = {q: follower.max_offset(*q) for q in follower.queues()}
            follower.set_visible_offset(new)
            after = {q: follower.max_offset(*q) for q in follower.queues()}
            assert sorted(woken) == sorted(q for q in after if after[q] > before[q])
            commit = new
        assert commit == leader.log_offsets().max_offset
        leader.set_visible_offset(commit)
        assert_same_store(leader, follower)
        writer.put("Orders", 0, 500, 3, 2)
        replicate(leader, follower, [1 << 20])
        assert follower.max_offset("Orders", 0) == leader.max_offset("Orders", 0)  # both hold it back
        assert leader.commit_log.consume_queue("Orders", 0).max_offset == follower.max_offset("Orders", 0) + 3
    finally:
        leader.shutdown()
        follower.shutdown()
