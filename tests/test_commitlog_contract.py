"""The storage contract (``storage_native/_commitlog.pyi``), run on every implementation.

Each test runs once per implementation (C core and Python twin); the parity tests
run the same operations on both side by side and require identical results,
identical errors (code and message) and byte-identical files.
"""
from __future__ import annotations

import functools
import os
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import IMPL_NAMES, IMPLS, resident_pages
from sparkmq.storage_native import StoreError
from sparkmq.storage_native.layout import (
    BLANK_MAGIC,
    CQ_UNIT_SIZE,
    PACKED_ENTRY,
    RECORD_HEADER_SIZE,
    record_size,
)

SEG = 8192
TS = 1_700_000_000_000
HOST = bytes(range(20))


def _open(impl, root, **kw):
    kw.setdefault("segment_size", SEG)
    kw.setdefault("cq_units_per_file", 16)
    return impl.CommitLog(str(root), **kw)


def _append(log, topic="T", qid=0, body=b"body", props=b"k\x01v\x02", tag=7, ts=TS, **kw):
    return log.append(topic, qid, body, props, tag, 3, 0, ts - 5, HOST, ts, HOST, 0, 0, **kw)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- single implementation behaviour --------------------------------------------------
def test_append_read_decode_roundtrip(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        offset, qoff, ts = log.append("orders", 2, b"hello", b"a\x01b\x02", 99, 5, 1, TS - 1, HOST, TS, HOST, 3, 42)
        assert (offset, qoff, ts) == (0, 0, TS)
        rec = log.read(offset)
        assert len(rec) == record_size(5, 6, 4) == log.max_offset
        d = impl.decode_record(rec, True)
        assert d == (len(rec), zlib.crc32(rec[12:]), 2, 5, 0, 0, 1, TS - 1, HOST, TS, HOST, 3, 42, 99,
                     b"hello", "orders", b"a\x01b\x02")
        assert bytes(log.read_view(offset)) == rec
        assert log.store_timestamp_at(offset) == TS
        assert log.consume_queue("orders", 2).unit(0) == (0, len(rec), 99)
        assert log.queues() == [("orders", 2)]


def test_store_timestamp_defaults_to_now(impl, tmp_path):
    import time

    with _open(impl, tmp_path) as log:
        before = time.time_ns() // 1_000_000
        _off, _q, ts = log.append("T", 0, b"x")
        assert before <= ts <= time.time_ns() // 1_000_000
        assert impl.decode_record(log.read(0))[8] == bytes(20)  # born_host None -> zeros


def test_roll_over_writes_blank_marker_and_scan_skips_it(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        body = b"x" * 3000
        offsets = [_append(log, body=body)[0] for _ in range(6)]
        size = record_size(3000, 1, 4)
        assert offsets[:2] == [0, size]
        assert offsets[2] == SEG  # third record did not fit: the segment was closed
        raw = log.read_raw(2 * size, 8)
        assert int.from_bytes(raw[:4], "little") == SEG - 2 * size
        assert int.from_bytes(raw[4:8], "little") == BLANK_MAGIC
        nxt, recs = log.scan(0, 100)
        assert [o for o, _ in recs] == offsets and nxt == log.max_offset
        assert [s for s, _ in log.segments()] == [0, SEG, 2 * SEG]
        with pytest.raises(StoreError) as err:
            log.read(2 * size)  # the blank marker is not a record
        assert err.value.code == "OFFSET_ILLEGAL"


def test_exact_fit_and_min_tail(impl, tmp_path):
    """A record may end exactly at the segment end; otherwise 8 bytes must stay free."""
    with _open(impl, tmp_path) as log:
        fill = SEG - record_size(0, 1, 0)
        first = record_size(fill - 300, 1, 0)
        log.append("T", 0, b"a" * (fill - 300))
        exact = SEG - first - record_size(0, 1, 0)
        off, _, _ = log.append("T", 0, b"b" * exact)
        assert off == first and log.max_offset == SEG
        off, _, _ = log.append("T", 0, b"c")
        assert off == SEG


def test_batch_append_assigns_consecutive_queue_offsets(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        _append(log, qid=1)
        items = [(b"m%d" % i, b"", i, 0, 0, TS, None, 0, 0) for i in range(50)]
        first, ts, offsets = log.append_batch("T", 1, items, TS, HOST)
        assert first == 1 and ts == TS and len(offsets) == 50
        assert offsets == sorted(offsets)
        cq = log.consume_queue("T", 1)
        assert cq.max_offset == 51 and cq.min_offset == 0
        for i, off in enumerate(offsets):
            assert impl.decode_record(log.read(off))[4] == 1 + i
            assert cq.unit(1 + i)[0] == off


def test_get_filters_by_tag_hash_and_limits(impl, tmp_path):
    with _open(impl, tmp_path, segment_size=1 << 20) as log:
        for i in range(100):
            _append(log, body=b"%d" % i, tag=i % 4)
        nxt, got = log.get("T", 0, 0, 10, frozenset({1}))
        assert [q for q, _, _ in got] == [1, 5, 9, 13, 17, 21, 25, 29, 33, 37] and nxt == 38
        assert all(impl.decode_record(r)[13] == 1 for _, _, r in got)
        nxt, got = log.get("T", 0, 98, 10, {3})
        assert nxt == 100 and [q for q, _, _ in got] == [99]
        nxt, got = log.get("T", 0, 0, 32, None, 1)  # max_bytes below one record still gives one
        assert len(got) == 1 and nxt == 1
        assert log.get("T", 0, 100, 5) == (100, [])
        assert log.get("nope", 0, 3, 5) == (3, [])
        with pytest.raises(TypeError):
            log.get("T", 0, 0, 5, [1, 2])


def test_get_examines_at_most_16384_units(impl, tmp_path):
    with _open(impl, tmp_path, segment_size=4 << 20, cq_units_per_file=4096) as log:
        items = [(b"x", b"", 1, 0, 0, TS, None, 0, 0)] * 1000
        for _ in range(17):
            log.append_batch("T", 0, items, TS)
        nxt, got = log.get("T", 0, 0, 5, {2})
        assert got == [] and nxt == 16384


def test_delete_segments_moves_queue_min_offsets(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        for i in range(40):
            _append(log, qid=i % 2, body=b"y" * 1000)
        segs = log.segments()
        assert len(segs) >= 4
        assert log.delete_segments_before(segs[2][0]) == 2
        assert log.min_offset == segs[2][0]
        assert not os.path.exists(segs[0][1])
        for qid in (0, 1):
            cq = log.consume_queue("T", qid)
            assert cq.unit(cq.min_offset)[0] >= log.min_offset
            if cq.min_offset > 0:
                with pytest.raises(StoreError) as err:
                    cq.unit(cq.min_offset - 1)
                assert err.value.code == "OFFSET_TOO_SMALL"
                with pytest.raises(StoreError) as err:
                    log.get("T", qid, 0, 5)
                assert err.value.code == "OFFSET_TOO_SMALL"
        with pytest.raises(StoreError) as err:
            log.read(0)
        assert err.value.code == "OFFSET_TOO_SMALL"
        # the newest segment always stays
        assert log.delete_segments_before(10**12) == len(segs) - 3
        assert len(log.segments()) == 1


def test_reopen_restores_offsets_and_queues(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        for i in range(30):
            _append(log, topic="A" if i % 3 else "B", qid=i % 2, body=b"z" * 500)
        end, queues = log.max_offset, {q: log.consume_queue(*q).max_offset for q in log.queues()}
    with _open(impl, tmp_path) as log:
        assert log.max_offset == end and log.flushed_offset == end
        assert {q: log.consume_queue(*q).max_offset for q in log.queues()} == queues
        rec = log.recovery
        assert rec["end_offset"] == end and rec["torn"] == 0 and rec["records_checked"] == 30
        off, qoff, _ = _append(log, topic="B", qid=0)
        assert off == end and qoff == queues[("B", 0)]


def test_recovery_truncates_torn_tail_and_queue_units(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        offsets = [_append(log, body=b"q" * 300)[0] for _ in range(10)]
        end = log.max_offset
    seg = tmp_path / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    data[offsets[7] + RECORD_HEADER_SIZE + 10] ^= 0xFF  # corrupt record 7's body
    seg.write_bytes(bytes(data))
    with _open(impl, tmp_path, check_from=offsets[5]) as log:
        rec = log.recovery
        assert rec["end_offset"] == offsets[7] == log.max_offset
        assert rec["torn"] == 1 and rec["records_checked"] == 2 and rec["check_from"] == offsets[5]
        assert rec["cq_units_truncated"] == 3
        assert log.consume_queue("T", 0).max_offset == 7
        raw = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
        assert not raw[offsets[7]:end].strip(b"\0")  # the tail is zeroed
        off, qoff, _ = _append(log)
        assert (off, qoff) == (offsets[7], 7)


def test_recovery_rewrites_lost_queue_units(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        offsets = [_append(log, body=b"u", tag=i)[0] for i in range(10)]
    cq_file = tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}"
    data = bytearray(cq_file.read_bytes())
    data[6 * CQ_UNIT_SIZE:10 * CQ_UNIT_SIZE] = bytes(4 * CQ_UNIT_SIZE)  # units 6..9 lost
    cq_file.write_bytes(bytes(data))
    with _open(impl, tmp_path, check_from=offsets[4]) as log:
        assert log.recovery["cq_units_redone"] == 4
        cq = log.consume_queue("T", 0)
        assert cq.max_offset == 10
        assert [cq.unit(i)[0] for i in range(10)] == offsets
        assert cq.unit(9)[2] == 9


def test_recovery_truncates_lost_units_among_those_past_the_end(impl, tmp_path):
    """A queue page that was never written back reads as zeros while a later one made it to disk: the empty
    units at the tail go with the units past the end, and those of surviving records are rewritten."""
    with _open(impl, tmp_path) as log:
        offsets = [_append(log, body=b"v" * 200, tag=i)[0] for i in range(10)]
    seg = tmp_path / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    data[offsets[7] + RECORD_HEADER_SIZE] ^= 0xFF  # the log ends at record 7
    seg.write_bytes(bytes(data))
    cq_file = tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}"
    units = bytearray(cq_file.read_bytes())
    for lost in (6, 8):  # 6: a surviving record's unit; 8: between units past the end
        units[lost * CQ_UNIT_SIZE:(lost + 1) * CQ_UNIT_SIZE] = bytes(CQ_UNIT_SIZE)
    cq_file.write_bytes(bytes(units))
    with _open(impl, tmp_path, check_from=offsets[5]) as log:
        rec = log.recovery
        assert (rec["end_offset"], rec["cq_units_truncated"], rec["cq_units_redone"]) == (offsets[7], 4, 1)
        cq = log.consume_queue("T", 0)
        assert cq.max_offset == 7
        assert [u[0] for u in cq.units(0, 10)] == offsets[:7]
        off, qoff, _ = _append(log)
        assert (off, qoff) == (offsets[7], 7)


def test_recovery_discards_segments_after_the_end(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        offsets = [_append(log, body=b"d" * 2000)[0] for _ in range(12)]
        n_segs = len(log.segments())
    seg0 = tmp_path / "commitlog" / f"{0:020d}"
    data = bytearray(seg0.read_bytes())
    data[offsets[1] + 8] ^= 1  # CRC field of record 1
    seg0.write_bytes(bytes(data))
    with _open(impl, tmp_path) as log:
        assert log.recovery["discarded_segments"] == n_segs - 1
        assert log.max_offset == offsets[1]
        assert len(log.segments()) == 1
        assert log.consume_queue("T", 0).max_offset == 1


def test_queue_truncate(impl, tmp_path):
    with _open(impl, tmp_path, segment_size=1 << 20) as log:
        for _ in range(40):
            _append(log)
        cq = log.consume_queue("T", 0)
        cq.truncate(17)
        assert cq.max_offset == 17
        assert cq.units(15, 10) == [cq.unit(15), cq.unit(16)]
        _, qoff, _ = _append(log)
        assert qoff == 17
        cq.truncate(100)  # no-op
        assert cq.max_offset == 18


def test_closed_log_refuses(impl, tmp_path):
    log = _open(impl, tmp_path)
    _append(log)
    log.close()
    log.close()
    assert log.closed
    with pytest.raises(StoreError) as err:
        log.read(0)
    assert (err.value.code, err.value.message) == ("CLOSED", "commit log is closed")


# -- the log-only flush ------------------------------------------------------------------
def test_flush_log_moves_log_flushed_offset_only(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        assert (log.flushed_offset, log.log_flushed_offset) == (0, 0)
        _append(log)
        _append(log, qid=1)
        end = log.max_offset
        assert log.log_flushed_offset == 0  # nothing synced yet
        assert log.flush_log() == end
        assert (log.flushed_offset, log.log_flushed_offset) == (0, end)  # the queues are not covered
        assert log.flush_log() == end and log.log_flushed_offset == end  # idempotent
        _append(log)
        assert log.log_flushed_offset == end  # an append alone moves neither
        assert log.flush() == log.max_offset
        assert log.flushed_offset == log.log_flushed_offset == log.max_offset  # a full flush covers the log
        assert log.flush_log() == log.max_offset  # and leaves nothing for the log-only one to do


def test_flush_log_covers_rolled_segments(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        for i in range(12):  # several rolls: blank markers and new segments
            _append(log, qid=i % 3, body=b"r" * 2000)
        assert len(log.segments()) > 2
        assert log.flush_log() == log.max_offset
        assert log.flushed_offset == 0
        end = log.max_offset
    with _open(impl, tmp_path, check_from=0) as log:  # close flushed everything
        assert log.flushed_offset == log.log_flushed_offset == log.max_offset == end


def test_recovery_after_flush_log_rebuilds_units_from_the_checkpoint(impl, tmp_path):
    """Units of records past ``flushed_offset`` may be lost with the queue pages flush_log left
    unsynced; opening from a check_from at or below ``flushed_offset`` rewrites them."""
    with _open(impl, tmp_path) as log:
        offsets = [_append(log, body=b"a", tag=i)[0] for i in range(4)]
        checkpoint = log.flush()
        offsets += [_append(log, body=b"b", tag=4 + i)[0] for i in range(6)]
        assert log.flush_log() == log.max_offset
    cq_file = tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}"
    data = bytearray(cq_file.read_bytes())
    data[4 * CQ_UNIT_SIZE:10 * CQ_UNIT_SIZE] = bytes(6 * CQ_UNIT_SIZE)  # as if never written back
    cq_file.write_bytes(bytes(data))
    with _open(impl, tmp_path, check_from=checkpoint) as log:
        assert log.recovery["cq_units_redone"] == 6
        cq = log.consume_queue("T", 0)
        assert [cq.unit(i)[0] for i in range(10)] == offsets and cq.unit(9)[2] == 9


def test_flush_log_while_appending(impl, tmp_path):
    """Each flush_log covers at least what was appended before it and at most what was appended
    before it returned, always a record boundary; offsets never go backwards."""
    ends: set[int] = {0}
    stop = threading.Event()
    errors: list[BaseException] = []

    # Bounded: every segment and consume-queue file is a mapping, and an unbounded appender on a
    # slow disk ran into the kernel's max_map_count (ENOMEM) before the 200 flushes were done.
    with _open(impl, tmp_path, segment_size=64 * 1024, cq_units_per_file=4096) as log:
        def appender() -> None:
            try:
                i = 0
                while (not stop.is_set() or i < 200) and i < 20_000:
                    off, _, _ = _append(log, qid=i % 4, body=b"w" * (50 + i % 700))
                    ends.add(off + record_size(50 + i % 700, 1, 4))
                    i += 1
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        t = threading.Thread(target=appender)
        t.start()
        seen = []
        try:
            for _ in range(200):
                before = log.max_offset
                got = log.flush_log()
                after = log.max_offset
                assert before <= got <= after
                assert log.log_flushed_offset >= got
                seen.append(got)
        finally:
            stop.set()
            t.join()
        assert not errors
        assert seen == sorted(seen)
        assert set(seen) <= ends
        assert log.flush_log() == log.max_offset
        assert log.flushed_offset <= log.log_flushed_offset == log.max_offset


def test_flush_log_on_a_closed_log(impl, tmp_path):
    log = _open(impl, tmp_path)
    _append(log)
    log.close()
    assert log.flushed_offset == log.log_flushed_offset == log.max_offset  # close flushed everything
    with pytest.raises(StoreError) as err:
        log.flush_log()
    assert (err.value.code, err.value.message) == ("CLOSED", "commit log is closed")


def _dirty_kib(path: Path) -> int:
    """Dirty KiB of this process's mapping of ``path`` (/proc/self/smaps): written pages not yet synced."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for text in f:
            parts = text.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's header line
                inside = len(parts) >= 6 and parts[5] == str(path)
            elif inside and parts[0] in ("Private_Dirty:", "Shared_Dirty:"):
                total += int(parts[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc/self/smaps")
def test_flush_log_writes_back_the_segment_but_not_the_queue_files(impl, tmp_path):
    with _open(impl, tmp_path, segment_size=1 << 20, cq_units_per_file=1000) as log:
        for i in range(40):
            _append(log, qid=i % 2, body=b"d" * 400)
        seg = tmp_path / "commitlog" / f"{0:020d}"
        queues = [tmp_path / "consumequeue" / "T" / str(q) / f"{0:020d}" for q in (0, 1)]
        written_kib = -(-log.max_offset // 4096) * 4
        seg_before = _dirty_kib(seg)
        assert seg_before >= written_kib and all(_dirty_kib(q) > 0 for q in queues)
        log.flush_log()
        # the native core pre-faults pages past the end for writing (a thread of its own, still at it
        # meanwhile), which also count as dirty: only they may be
        assert _dirty_kib(seg) <= (1 << 20) // 1024 - written_kib
        assert all(_dirty_kib(q) > 0 for q in queues)  # the queues wait for the full flush
        log.flush()
        assert all(_dirty_kib(q) == 0 for q in queues)


# -- parity: both implementations side by side ---------------------------------------
BAD_CALLS = [
    ("append", ("", 0, b"x"), "INVALID_ARGUMENT"),
    ("append", ("t" * 256, 0, b"x"), "INVALID_ARGUMENT"),
    ("append", ("a/b", 0, b"x"), "INVALID_ARGUMENT"),
    ("append", ("..", 0, b"x"), "INVALID_ARGUMENT"),
    ("append", ("T", -1, b"x"), "INVALID_ARGUMENT"),
    ("append", ("T", 65536, b"x"), "INVALID_ARGUMENT"),
    ("append", ("T", 0, b"x", b"p" * 65536), "INVALID_ARGUMENT"),
    ("append", ("T", 0, b"x" * SEG), "INVALID_ARGUMENT"),
    ("append", ("T", 0, b"x", b"", 0, 0, 0, 0, b"short"), "INVALID_ARGUMENT"),
    ("append", ("T", 0, b"x", b"", 0, 0, 0, 0, None, 0, b"s" * 21), "INVALID_ARGUMENT"),
    ("append_batch", ("T", 0, []), "INVALID_ARGUMENT"),
    ("append_batch", ("T", 0, [(b"x",)]), "INVALID_ARGUMENT"),
    ("append_batch", ("T", 0, [(b"x", b"", 0, 0, 0, 0, None, 0, 0), (b"y" * SEG, b"", 0, 0, 0, 0, None, 0, 0)]),
     "INVALID_ARGUMENT"),
    ("append_batch", ("T", 0, [(b"x", b"", 0, 0, 0, 0, b"bad", 0, 0)]), "INVALID_ARGUMENT"),
    ("append_batch", ("", 0, [(b"x", b"", 0, 0, 0, 0, None, 0, 0)]), "INVALID_ARGUMENT"),
    ("read", (-1,), "INVALID_ARGUMENT"),
    ("read", (10**9,), "OFFSET_OVERFLOW"),
    ("read", (1,), "OFFSET_ILLEGAL"),
    ("read_view", (5,), "OFFSET_ILLEGAL"),
    ("store_timestamp_at", (10**9,), "OFFSET_OVERFLOW"),
    ("scan", (0, 0), "INVALID_ARGUMENT"),
    ("scan", (10**9,), "OFFSET_OVERFLOW"),
    ("scan", (3,), "OFFSET_ILLEGAL"),
    ("read_raw", (0, -1), "INVALID_ARGUMENT"),
    ("read_raw", (-5, 1), "INVALID_ARGUMENT"),
    ("get", ("T", 0, -1, 5), "INVALID_ARGUMENT"),
    ("get", ("T", 0, 0, 0), "INVALID_ARGUMENT"),
    ("append_packed", ("T", 0, b"", 0), "MESSAGE_ILLEGAL"),
    ("append_packed", ("T", 0, b"\0" * 17, 1), "MESSAGE_ILLEGAL"),
    ("append_packed", ("T", 0, PACKED_ENTRY.pack(1, 0, 0, 0) + b"x", 1), "MESSAGE_ILLEGAL"),  # no UNIQ_KEY
    ("append_packed", ("T", 0, PACKED_ENTRY.pack(SEG, 6, 0, 0) + b"x" * SEG + b"U\x01v\x02U", 1), "MESSAGE_ILLEGAL"),
    ("append_packed", ("", 0, b"", 1), "INVALID_ARGUMENT"),
    ("read_packed", ("T", 0, -1, 5), "INVALID_ARGUMENT"),
    ("read_packed", ("T", 0, 0, 0), "INVALID_ARGUMENT"),
]


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except StoreError as exc:
        return ("StoreError", exc.code, exc.message)
    except TypeError:
        return ("TypeError",)


@pytest.mark.skipif(len(IMPL_NAMES) < 2, reason="the C extension is not built")
@pytest.mark.parametrize("method,args,code", BAD_CALLS, ids=[f"{m}-{i}" for i, (m, _a, _c) in enumerate(BAD_CALLS)])
def test_same_errors_and_nothing_written(tmp_path, method, args, code):
    outcomes = []
    for name in IMPL_NAMES:
        root = tmp_path / name
        with _open(IMPLS[name], root) as log:
            _append(log)
            before = (log.max_offset, log.consume_queue("T", 0).max_offset)
            outcomes.append(_outcome(getattr(log, method), *args))
            assert (log.max_offset, log.consume_queue("T", 0).max_offset) == before
    assert outcomes[0][:2] == ("StoreError", code), outcomes[0]
    assert outcomes[0] == outcomes[1]
    assert _files(tmp_path / IMPL_NAMES[0]) == _files(tmp_path / IMPL_NAMES[1])


@pytest.mark.skipif(len(IMPL_NAMES) < 2, reason="the C extension is not built")
def test_same_decode_errors():
    good = None
    import tempfile

    with tempfile.TemporaryDirectory() as d, _open(IMPLS["python"], d) as log:
        _append(log)
        good = log.read(0)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    bad_len = bytearray(good)
    bad_len[RECORD_HEADER_SIZE - 4] = 200
    cases = [b"", good[:50], b"\0" * 4 + good[4:], good + b"x", bytes(bad_len), bytes(bad_crc)]
    for buf in cases:
        outs = [_outcome(IMPLS[n].decode_record, buf, True) for n in IMPL_NAMES]
        assert outs[0][0] == "StoreError" and outs[0] == outs[1], outs
    assert [IMPLS[n].decode_record(good) for n in IMPL_NAMES][0] == IMPLS["native"].decode_record(good)


operation = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(["A", "B", "%RETRY%g"]), st.integers(0, 3),
              st.binary(max_size=3000), st.binary(max_size=200), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("batch"), st.sampled_from(["A", "B"]), st.integers(0, 3),
              st.lists(st.tuples(st.binary(max_size=1500), st.binary(max_size=50)), min_size=1, max_size=8)),
    st.tuples(st.just("packed"), st.sampled_from(["A", "B"]), st.integers(0, 3),
              st.lists(st.tuples(st.binary(min_size=1, max_size=1500), st.sampled_from([b"", b"red", b"blue"])),
                       min_size=1, max_size=8)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("flush_log")),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("delete"), st.integers(0, 4)),
)


@pytest.mark.skipif(len(IMPL_NAMES) < 2, reason="the C extension is not built")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(operation, min_size=1, max_size=40))
def test_random_operations_give_identical_results_and_files(tmp_path_factory, ops):
    base = tmp_path_factory.mktemp("parity")
    logs = {n: _open(IMPLS[n], base / n) for n in IMPL_NAMES}
    ts = TS
    try:
        for op in ops:
            ts += 1
            results = {}
            for name, log in logs.items():
                kind = op[0]
                if kind == "append":
                    _, topic, qid, body, props, tag = op
                    results[name] = _outcome(log.append, topic, qid, body, props, tag, 0, 0, ts, HOST, ts, HOST)
                elif kind == "batch":
                    _, topic, qid, items = op
                    batch = [(b, p, len(b), 0, 0, ts, None, 1, 0) for b, p in items]
                    results[name] = _outcome(log.append_batch, topic, qid, batch, ts, HOST)
                elif kind == "packed":
                    _, topic, qid, items = op
                    data = b"".join(PACKED_ENTRY.pack(len(b), len(p), j, ts) + b + p for j, (b, p) in enumerate(
                        (body, (b"TAGS\x01" + tag + b"\x02" if tag else b"") + b"UNIQ_KEY\x01U%d\x02" % j)
                        for j, (body, tag) in enumerate(items)))
                    results[name] = _outcome(functools.partial(log.append_packed, topic, qid, data, len(items),
                                                               store_timestamp=ts, store_host=HOST))
                elif kind in ("flush", "flush_log"):
                    results[name] = (_outcome(getattr(log, kind)), log.flushed_offset, log.log_flushed_offset)
                elif kind == "reopen":
                    log.close()
                    logs[name] = log = _open(IMPLS[name], base / name, check_from=0)
                    results[name] = log.recovery
                elif kind == "delete":
                    segs = log.segments()
                    cut = segs[min(op[1], len(segs) - 1)][0] if segs else 0
                    results[name] = _outcome(log.delete_segments_before, cut)
            assert results[IMPL_NAMES[0]] == results[IMPL_NAMES[1]], op
        snapshots = []
        for name, log in logs.items():
            nxt, recs = log.scan(log.min_offset, 10**6, 1 << 40) if log.max_offset else (0, [])
            queues = {q: (log.consume_queue(*q).min_offset, log.consume_queue(*q).max_offset,
                          log.get(q[0], q[1], log.consume_queue(*q).min_offset, 10**6, None),
                          log.read_packed(q[0], q[1], log.consume_queue(*q).min_offset, 10**6,
                                          {0, zlib.crc32(b"red")}))
                      for q in log.queues()}
            snapshots.append((log.min_offset, log.max_offset, nxt, recs, queues))
            for off, rec in recs:
                assert IMPLS[name].decode_record(rec, True)[5] == off
        assert snapshots[0] == snapshots[1]
    finally:
        for log in logs.values():
            log.close()
    files = [_files(base / n) for n in IMPL_NAMES]
    assert files[0].keys() == files[1].keys()
    for key in files[0]:
        assert files[0][key] == files[1][key], key


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(st.tuples(st.binary(max_size=2500), st.text(max_size=30), st.integers(0, 2)),
                         min_size=1, max_size=60))
def test_hypothesis_roundtrip_across_segments(impl, tmp_path_factory, messages):
    root = tmp_path_factory.mktemp("rt")
    written = []
    with _open(impl, root) as log:
        for body, text, qid in messages:
            props = text.encode("utf-8")
            off, qoff, _ = log.append("R", qid, body, props, len(body), 0, 0, TS, None, TS, None)
            written.append((off, qid, qoff, body, props))
    with _open(impl, root) as log:
        assert log.recovery["torn"] == 0
        for off, qid, qoff, body, props in written:
            d = impl.decode_record(log.read(off), True)
            assert (d[2], d[4], d[14], d[16], d[13]) == (qid, qoff, body, props, len(body))
            assert log.consume_queue("R", qid).unit(qoff)[0] == off
        for qid in range(3):
            mine = [w for w in written if w[1] == qid]
            if mine:
                _, got = log.get("R", qid, 0, 1000)
                assert [g[1] for g in got] == [w[0] for w in mine]


def test_release_page_cache_drops_durable_pages_far_behind_the_end(impl, tmp_path):
    """Pages more than ``keep`` behind the end and below log_flushed leave the page cache; the rest stay;
    the released records still read back the same (from the disk)."""
    seg = 64 << 20
    body = os.urandom(64 * 1024)
    with _open(impl, tmp_path, segment_size=seg) as log:
        offsets = [_append(log, body=body)[0] for _ in range(640)]  # ~40 MiB in one segment
        end = log.max_offset
        path = Path(log.segments()[0][1])
        log.release_page_cache(8 << 20)
        assert all(resident_pages(path)[: (end - (8 << 20)) // 4096])  # nothing durable yet: nothing dropped
        log.flush_log()
        log.release_page_cache(0)
        assert all(resident_pages(path)[: end // 4096])  # keep 0: the OS decides
        log.release_page_cache(8 << 20)
        resident = resident_pages(path)
        cut = (end - (8 << 20)) // 4096
        # a large folio (up to 2 MiB) across the cut is kept whole
        assert not any(resident[: cut - 512]), [i for i, r in enumerate(resident[: cut - 512]) if r][:8]
        assert all(resident[cut + 1: end // 4096])  # the last 8 MiB stay for the readers at the tail
        assert body in bytes(log.read(offsets[0]))
        assert body in bytes(log.read(offsets[-1]))
        log.release_page_cache(8 << 20)  # nothing new to drop: a no-op
        _append(log, body=body)
        log.flush_log()
        log.release_page_cache(8 << 20)  # 64 KiB more is below the 16 MiB step: nothing moves
        assert resident_pages(path)[cut + 2]
        for _ in range(300):  # ~19 MiB more: the next step starts where the last one ended, to the page
            _append(log, body=body)
        log.flush_log()
        log.release_page_cache(8 << 20)
        resident = resident_pages(path)
        # from the last cut on (the reads above brought the first records back; a folio across a cut stays)
        assert not any(resident[cut + 512: (log.max_offset - (8 << 20)) // 4096 - 512])
