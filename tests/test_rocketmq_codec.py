"""RocketMQ's message encodings on both storage implementations (C core and Python twin).

``encode_rocketmq_records`` (a pull's answer for the Java client) and ``decode_rocketmq_batch`` (a Java batch
send) are checked against a reference written here from RocketMQ's ``MessageDecoder`` as the facts describe it
(``decode``, ``encodeMessage``): not against the code under test.  The parity tests feed both implementations
the same random, often broken, input and require the same bytes or the same error (code and text).
"""
from __future__ import annotations

import ipaddress
import struct
import zlib

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import IMPL_NAMES, IMPLS
from sparkmq.platform.common.codec import decode_properties, pack_host, unpack_host
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.ids import decode_offset_msg_id, encode_offset_msg_id
from sparkmq.platform.common.message import StoredMessage
from sparkmq.platform.common.rocketmq_records import decode_rocketmq_records
from sparkmq.storage_native import StoreError

SEG = 1 << 20
TS = 1_700_000_000_000
STORE = pack_host("10.1.2.3:10911")
BORN = pack_host("[2001:db8::7]:4242")
both = pytest.mark.skipif(len(IMPL_NAMES) < 2, reason="the C extension is not built")


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except StoreError as exc:
        return ("StoreError", exc.code, exc.message)
    except (TypeError, OverflowError) as exc:
        return (type(exc).__name__,)


# -- the reference: RocketMQ's MessageDecoder, from its description ------------------------------------
def java_decode(buf: bytes) -> list[dict]:
    """Messages of stored RocketMQ messages, read field by field as MessageDecoder.decode reads them."""
    out = []
    pos = 0
    while pos < len(buf):
        m: dict = {}
        start = pos

        def take(fmt: str):
            nonlocal pos
            values = struct.unpack_from(">" + fmt, buf, pos)
            pos += struct.calcsize(">" + fmt)
            return values if len(values) > 1 else values[0]

        m["store_size"] = take("i")
        magic = take("I")
        assert magic in (0xDAA320A7, 0xDAA320AB), hex(magic)
        m["magic"] = magic
        m["body_crc"], m["queue_id"], m["flag"] = take("iii")
        m["queue_offset"], m["commitlog_offset"] = take("qq")
        m["sys_flag"] = take("i")
        m["born_timestamp"] = take("q")
        size = 16 if m["sys_flag"] & 0x10 else 4
        m["born_ip"] = buf[pos:pos + size]
        pos += size
        m["born_port"] = take("i")
        m["store_timestamp"] = take("q")
        size = 16 if m["sys_flag"] & 0x20 else 4
        m["store_ip"] = buf[pos:pos + size]
        pos += size
        m["store_port"] = take("i")
        m["reconsume_times"] = take("i")
        m["prepared_offset"] = take("q")
        body_len = take("i")
        m["body"] = buf[pos:pos + body_len]
        pos += body_len
        topic_len = take("h") if magic == 0xDAA320AB else take("b")  # V1: a signed byte
        m["topic"] = buf[pos:pos + topic_len].decode()
        pos += topic_len
        props_len = take("h")
        m["properties"] = buf[pos:pos + props_len]
        pos += props_len
        assert pos - start == m["store_size"]
        # createMessageId: store ip + port + commit-log offset, upper-case hex
        m["offset_msg_id"] = (m["store_ip"] + struct.pack(">iq", m["store_port"], m["commitlog_offset"])).hex().upper()
        out.append(m)
    return out


def java_batch(messages: list[tuple[int, bytes, bytes]]) -> bytes:
    """MessageDecoder.encodeMessages: per message TOTALSIZE, MAGIC 0, BODYCRC 0, FLAG, body, properties."""
    return b"".join(struct.pack(">iiiii", 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(props), 0, 0, flag, len(body))
                    + body + struct.pack(">h", len(props)) + props for flag, body, props in messages)


def _expected_host(raw: bytes | None) -> tuple[bytes, int, bool]:
    """(ip bytes as RocketMQ writes them, port, is IPv6) of a stored 20-byte host."""
    raw = raw or bytes(20)
    ip = ipaddress.IPv6Address(raw[:16])
    port = int.from_bytes(raw[16:], "little", signed=True)
    if ip.ipv4_mapped is not None or not any(raw[:16]):
        return (ip.ipv4_mapped.packed if ip.ipv4_mapped else bytes(4)), port, False
    return ip.packed, port, True


def _log(impl, root):
    return impl.CommitLog(str(root), segment_size=SEG, cq_units_per_file=64)


RECORDS = [
    # topic, body, properties, sys_flag, born host, store host, reconsume, prepared, flag
    ("orders", b"hello", b"TAGS\x01red\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ID-1\x02", 0, BORN, STORE, 0, 0, 7),
    ("%RETRY%cg", zlib.compress(b"packed " * 50), b"UNIQ_KEY\x01ID-2\x02", 1, STORE, STORE, 3, 0, -1),
    ("T" * 200, b"", b"", 4, None, pack_host("[::1]:65535"), 0, 4096, 0),
    ("été", b"\x00" * 70, b"k\x01v\x02", 0xC, pack_host("127.0.0.1:1"), None, 2**31 - 1, 2**40, 2**31 - 1),
]


def _append_all(log, records=RECORDS):
    for topic, body, props, sys_flag, born, store, reconsume, prepared, flag in records:
        log.append(topic, 1, body, props, 0, flag, sys_flag, TS, born, TS + 5, store, reconsume, prepared)
    return log.read_raw(0, log.max_offset)


def test_encode_gives_every_field_as_message_decoder_reads_it(impl, tmp_path):
    with _log(impl, tmp_path) as log:
        raw = _append_all(log)
        stored = []
        at = 0
        while at < len(raw):
            size = int.from_bytes(raw[at:at + 4], "little")
            stored.append(impl.decode_record(raw[at:at + size]))
            at += size
    encoded = impl.encode_rocketmq_records(raw)
    got = java_decode(encoded)
    assert len(got) == len(RECORDS)
    for m, rec, spec in zip(got, stored, RECORDS, strict=True):
        (_total, _crc, queue_id, flag, queue_offset, clog, sys_flag, born_ts, born_host, store_ts, store_host,
         reconsume, prepared, _tag, body, topic, props) = rec
        born_ip, born_port, born6 = _expected_host(spec[4])
        store_ip, store_port, store6 = _expected_host(spec[5])
        assert m == {
            "store_size": m["store_size"], "magic": 0xDAA320AB if len(topic.encode()) > 127 else 0xDAA320A7,
            "body_crc": zlib.crc32(body) & 0x7FFFFFFF, "queue_id": queue_id, "flag": flag,
            "queue_offset": queue_offset, "commitlog_offset": clog,
            "sys_flag": sys_flag | (0x10 if born6 else 0) | (0x20 if store6 else 0), "born_timestamp": born_ts,
            "born_ip": born_ip, "born_port": born_port, "store_timestamp": store_ts, "store_ip": store_ip,
            "store_port": store_port, "reconsume_times": reconsume, "prepared_offset": prepared, "body": body,
            "topic": topic, "properties": props, "offset_msg_id": m["offset_msg_id"]}
        # the offsetMsgId the Java client computes is sparkmq's for the same store host and offset
        assert m["offset_msg_id"] == encode_offset_msg_id(unpack_host(store_host) or "0.0.0.0:0", clog)
    assert [m["queue_offset"] for m in got] == [0, 0, 0, 0]
    assert impl.encode_rocketmq_records(b"") == b""
    assert impl.encode_rocketmq_records(memoryview(bytearray(raw))) == encoded


def test_known_bytes_of_one_message(impl, tmp_path):
    """One message written out by hand from the layout (no code under test builds the expectation)."""
    with _log(impl, tmp_path) as log:
        log.append("t", 2, b"ab", b"UNIQ_KEY\x01X\x02", 0, 9, 0, 1000, pack_host("1.2.3.4:5"), 2000,
                   pack_host("10.0.0.1:10911"), 1, 0)
        raw = log.read(0)
    expect = (
        bytes.fromhex("00000069" "daa320a7") + (zlib.crc32(b"ab") & 0x7FFFFFFF).to_bytes(4, "big")
        + bytes.fromhex("00000002" "00000009" "0000000000000000" "0000000000000000" "00000000"
                        "00000000000003e8" "01020304" "00000005" "00000000000007d0" "0a000001" "00002a9f"
                        "00000001" "0000000000000000" "00000002") + b"ab" + b"\x01t" + b"\x00\x0bUNIQ_KEY\x01X\x02")
    assert len(expect) == 0x69
    assert impl.encode_rocketmq_records(raw) == expect


def test_offset_msg_ids_are_rocketmqs():
    """createMessageId: upper-case hex of store ip (4 or 16 bytes), int32 port, int64 offset."""
    assert encode_offset_msg_id("127.0.0.1:10911", 0x1234) == "7F00000100002A9F0000000000001234"
    v6 = encode_offset_msg_id("[2001:db8::1]:10911", 5)
    assert v6 == "20010DB8000000000000000000000001" "00002A9F" "0000000000000005" and len(v6) == 56
    assert decode_offset_msg_id(v6).store_host == "[2001:db8::1]:10911"


@pytest.mark.parametrize("cut", ["short", "magic", "total", "lengths"])
def test_encode_errors_are_decode_records_framing_errors(impl, tmp_path, cut):
    with _log(impl, tmp_path) as log:
        raw = bytearray(_append_all(log, RECORDS[:1]))
    if cut == "short":
        data, text = raw[:100], "record is malformed: buffer shorter than the header"
    elif cut == "magic":
        raw[4] ^= 0xFF
        data, text = raw, f"record is malformed: bad magic 0x{int.from_bytes(raw[4:8], 'little'):08x}"
    elif cut == "total":
        data, text = raw + raw[:-1], f"record is malformed: total_size {len(raw)} != buffer length {len(raw) - 1}"
    else:
        raw[116] = 250  # the body length runs past the record
        data, text = raw, "record is malformed: lengths overrun the record"
    with pytest.raises(StoreError) as err:
        impl.encode_rocketmq_records(bytes(data))
    assert (err.value.code, err.value.message) == ("CORRUPT_RECORD", text)
    with pytest.raises(TypeError):
        impl.encode_rocketmq_records("text")


def test_platform_decoder_reads_every_field_back(impl, tmp_path):
    with _log(impl, tmp_path) as log:
        raw = _append_all(log)
        offsets = [int.from_bytes(m[28:36], "little") for m in _split(raw)]
    got = decode_rocketmq_records(impl.encode_rocketmq_records(raw), inflate=lambda b: b"z:" + b)
    assert all(type(m) is StoredMessage for m in got)
    first = got[0]
    assert (first.topic, first.queue_id, first.msg_id, first.tags, first.keys, first.flag) == (
        "orders", 1, "ID-1", "red", ("k1", "k2"), 7)
    assert (first.born_host, first.store_host, first.born_timestamp, first.store_timestamp) == (
        "[2001:db8::7]:4242", "10.1.2.3:10911", TS, TS + 5)
    assert first.offset_msg_id == encode_offset_msg_id("10.1.2.3:10911", offsets[0])
    assert got[1].body == b"z:" + RECORDS[1][1] and got[1].reconsume_times == 3 and got[1].sys_flag == 1
    assert got[2].topic == "T" * 200 and got[2].prepared_offset == 4096 and got[2].born_host == ""
    assert got[2].store_host == "[::1]:65535" and got[2].sys_flag == 4 | 0x20
    assert got[3].topic == "été" and got[3].properties == {"k": "v"} and got[3].store_host == ""
    assert got[3].offset_msg_id == encode_offset_msg_id("0.0.0.0:0", offsets[3])
    assert [m.commitlog_offset for m in got] == offsets
    assert [m.body_crc for m in got] == [zlib.crc32(r[1]) & 0x7FFFFFFF for r in RECORDS]
    assert [m.tag_hash for m in got] == [0] * 4, "RocketMQ's records carry no tag hash"
    # the same message as the store's own decoding of the record, but for what RocketMQ's encoding lacks
    for m, rec in zip(got, _split(raw), strict=True):
        stored = StoredMessage.from_decoded(impl.decode_record(rec))
        assert (m.queue_offset, m.store_size, m.born_timestamp, m.properties) == (
            stored.queue_offset, len(impl.encode_rocketmq_records(rec)), stored.born_timestamp, stored.properties)


def test_platform_decoder_refuses_what_does_not_parse(tmp_path):
    with _log(IMPLS["python"], tmp_path) as log:
        good = IMPLS["python"].encode_rocketmq_records(_append_all(log, RECORDS[:1]))
    for data in (good[:-1], good[:4] + b"\0\0\0\0" + good[8:], good + good[:30]):
        with pytest.raises(SparkMQError) as err:
            decode_rocketmq_records(data)
        assert err.value.code is ErrorCode.MESSAGE_ILLEGAL
    lz4 = bytearray(good)
    lz4[36:40] = (int.from_bytes(lz4[36:40], "big") | 0x101).to_bytes(4, "big")  # COMPRESSED, type 1 (LZ4)
    with pytest.raises(SparkMQError, match="LZ4 or ZSTD"):
        decode_rocketmq_records(bytes(lz4))


def _split(raw: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(raw):
        size = int.from_bytes(raw[at:at + 4], "little")
        out.append(raw[at:at + size])
        at += size
    return out


# -- batches ---------------------------------------------------------------------------------------------
BATCH = [(5, b"one", b"TAGS\x01a\x02UNIQ_KEY\x01U-1\x02"), (-2, b"x" * 3000, b"UNIQ_KEY\x01U-2\x02KEYS\x01k\x02"),
         (0, b"\xff", "UNIQ_KEY\x01U-3\x02k\x01é\x02".encode())]


def test_batch_becomes_the_packed_batch_append_packed_stores(impl, tmp_path):
    body = java_batch(BATCH)
    data, count = impl.decode_rocketmq_batch(body, TS)
    assert count == 3
    assert impl.decode_batch(data, 3) == [(b, p, f, TS) for f, b, p in BATCH]
    assert impl.decode_rocketmq_batch(memoryview(bytearray(body)), TS) == (data, 3)
    with _log(impl, tmp_path) as log:
        first, _ts, _end, offs = log.append_packed("orders", 0, data, count, store_host=STORE, store_timestamp=TS)
        got = decode_rocketmq_records(impl.encode_rocketmq_records(log.read_packed("orders", 0, 0, 10)[2]))
    assert [(m.flag, m.body, m.msg_id, m.born_timestamp) for m in got] == [
        (5, b"one", "U-1", TS), (-2, b"x" * 3000, "U-2", TS), (0, b"\xff", "U-3", TS)]
    assert [m.commitlog_offset for m in got] == list(struct.unpack("<3q", offs)) and first == 0


def _entry(total=None, body=b"b", props=b"UNIQ_KEY\x01I\x02", body_len=None, props_len=None, flag=0) -> bytes:
    body_len = len(body) if body_len is None else body_len
    props_len = len(props) if props_len is None else props_len
    total = 22 + len(body) + len(props) if total is None else total
    return struct.pack(">iiiii", total, 0, 0, flag, body_len) + body + struct.pack(">h", props_len) + props


GOOD = _entry()


@pytest.mark.parametrize("data, text", [
    (b"", "the batch is empty"),
    (GOOD + b"\0" * 19, "message 1: the entry header is truncated (19 bytes left)"),
    (_entry(body_len=-1), "message 0: the body length -1 is negative"),
    (_entry(body_len=100), "message 0: the entry needs 122 bytes, 34 are left"),
    (_entry(props_len=-5), "message 0: the properties length -5 is negative"),
    (GOOD + _entry(props_len=40), "message 1: the entry needs 63 bytes, 34 are left"),
    (_entry(total=36), "message 0: TOTALSIZE 36 does not match the entry's 34 bytes"),
    (_entry(total=-1), "message 0: TOTALSIZE -1 does not match the entry's 34 bytes"),
    (GOOD + _entry(props=b"UNIQ_KEY\x01\xff\x02"), "message 1: the properties are not valid UTF-8"),
])
def test_batch_errors(impl, data, text):
    with pytest.raises(StoreError) as err:
        impl.decode_rocketmq_batch(data, TS)
    assert (err.value.code, err.value.message) == ("MESSAGE_ILLEGAL", text)


def test_batch_argument_errors(impl):
    with pytest.raises(OverflowError):
        impl.decode_rocketmq_batch(GOOD, 2**63)
    with pytest.raises(TypeError):
        impl.decode_rocketmq_batch("text", TS)
    with pytest.raises(TypeError):
        impl.decode_rocketmq_batch(GOOD)  # type: ignore[call-arg]


def test_batch_content_rules_are_append_packeds(impl, tmp_path):
    """What the conversion does not check (an empty body, a missing UNIQ_KEY) append_packed refuses, naming the
    same entry."""
    data, count = impl.decode_rocketmq_batch(GOOD + _entry(body=b"") + GOOD, TS)
    with _log(impl, tmp_path) as log, pytest.raises(StoreError) as err:
        log.append_packed("t", 0, data, count)
    assert err.value.message == "message 1: the body is empty" and log.max_offset == 0
    data, count = impl.decode_rocketmq_batch(GOOD + _entry(props=b"k\x01v\x02"), TS)
    with _log(impl, tmp_path / "2") as log, pytest.raises(StoreError) as err:
        log.append_packed("t", 0, data, count)
    assert err.value.message == "message 1: the properties have no UNIQ_KEY"


# -- parity under random input ------------------------------------------------------------------------------
_host = st.one_of(st.none(), st.binary(min_size=20, max_size=20), st.sampled_from([
    bytes(20), BORN, STORE, bytes(16) + b"\x01\0\0\0", ipaddress.IPv6Address("::1.2.3.4").packed + b"\xff" * 4]))


def _mutated(draw, data: bytearray, extend_max: int, random_max: int) -> tuple[bytearray, str]:
    """``data`` as drawn: mostly unchanged, else bytes flipped, cut short, extended, or replaced by random bytes."""
    mutation = draw(st.sampled_from(["none"] * 4 + ["flip", "truncate", "extend", "random"]))
    if mutation == "flip":
        for _ in range(draw(st.integers(1, 3))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif mutation == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif mutation == "extend":
        data += draw(st.binary(min_size=1, max_size=extend_max))
    elif mutation == "random":
        data = bytearray(draw(st.binary(max_size=random_max)))
    return data, mutation


@st.composite
def record_buffers(draw):
    """Stored records with random fields, perhaps damaged."""
    import tempfile

    recs = draw(st.lists(st.tuples(
        st.sampled_from(["T", "été", "%DLQ%g", "x" * 127, "y" * 128, "z" * 255]), st.binary(max_size=300),
        st.binary(max_size=60), st.integers(0, 2**31 - 1), _host, _host, st.integers(-(2**31), 2**31 - 1),
        st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1)), min_size=1, max_size=6))
    with tempfile.TemporaryDirectory() as d, _log(IMPLS["python"], d) as log:
        data = bytearray(_append_all(log, recs))
    data, mutation = _mutated(draw, data, extend_max=200, random_max=400)
    return bytes(data), recs, mutation


@both
@settings(max_examples=300, deadline=None)
@given(buf=record_buffers())
def test_random_records_encode_the_same_on_both(buf):
    data, recs, mutation = buf
    outs = [_outcome(IMPLS[n].encode_rocketmq_records, data) for n in IMPL_NAMES]
    assert outs[0] == outs[1]
    event(outs[0][0] if outs[0][0] == "ok" else outs[0][2].split(":")[-1][:30])
    if mutation == "none":
        assert outs[0][0] == "ok"
        got = java_decode(outs[0][1])
        assert [(m["topic"], m["body"], m["properties"], m["reconsume_times"], m["prepared_offset"], m["flag"])
                for m in got] == [(r[0], r[1], r[2], r[6], r[7], r[8]) for r in recs]


_good_props = st.lists(st.tuples(st.sampled_from(["k", "TAGS", "é", "DELAY"]), st.text(max_size=6)), max_size=3).map(
    lambda kv: "".join(f"{k}\x01{v}\x02" for k, v in kv).encode("utf-8", "surrogatepass"))


@st.composite
def batch_bodies(draw):
    """A Java batch body, mostly well-formed, perhaps broken."""
    msgs = draw(st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=200),
                                   st.one_of(_good_props, st.binary(max_size=30))), min_size=1, max_size=6))
    data = bytearray(java_batch(msgs))
    data, mutation = _mutated(draw, data, extend_max=40, random_max=200)
    return bytes(data), msgs, mutation


@both
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=batch_bodies(), born=st.integers(-(2**63), 2**63 - 1))
def test_random_batches_decode_the_same_on_both(body, born):
    data, msgs, mutation = body
    outs = [_outcome(IMPLS[n].decode_rocketmq_batch, data, born) for n in IMPL_NAMES]
    assert outs[0] == outs[1]
    event(outs[0][0] if outs[0][0] == "ok" else outs[0][2].split(":")[-1][:30])
    assert outs[0][0] in ("ok", "StoreError")
    if outs[0][0] == "ok":
        packed, count = outs[0][1]
        assert IMPLS["python"].decode_batch(packed, count) == [
            (b, p, f, born) for f, b, p in _entries_of(data)]
    if mutation == "none":
        valid_utf8 = all(_utf8(p) for _f, _b, p in msgs)
        assert (outs[0][0] == "ok") == valid_utf8


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _entries_of(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """(flag, body, properties) of each entry of a batch body that parsed."""
    out, at = [], 0
    while at < len(data):
        total, _m, _c, flag, body_len = struct.unpack_from(">iiiii", data, at)
        props_len = struct.unpack_from(">h", data, at + 20 + body_len)[0]
        out.append((flag, data[at + 20:at + 20 + body_len], data[at + 22 + body_len:at + total]))
        at += total
    assert at == len(data) and props_len >= 0
    return out


@pytest.mark.skipif("native" not in IMPLS, reason="the C extension is not built")
def test_large_inputs_take_the_gil_free_path_and_agree():
    """Above 64 KiB the C core works without the GIL; the result is the twin's."""
    msgs = [(i, bytes([i % 251]) * (1000 + i), f"UNIQ_KEY\x01ID-{i}\x02TAGS\x01t{i % 3}\x02".encode())
            for i in range(300)]
    body = java_batch(msgs)
    assert len(body) > 64 * 1024
    assert IMPLS["native"].decode_rocketmq_batch(body, TS) == IMPLS["python"].decode_rocketmq_batch(body, TS)
    import tempfile

    with tempfile.TemporaryDirectory() as d, _log(IMPLS["native"], d) as log:
        data, count = IMPLS["native"].decode_rocketmq_batch(body, TS)
        log.append_packed("big", 0, data, count, born_host=BORN, store_host=STORE)
        raw = log.read_packed("big", 0, 0, 1000)[2]
    assert len(raw) > 64 * 1024
    encoded = IMPLS["native"].encode_rocketmq_records(raw)
    assert encoded == IMPLS["python"].encode_rocketmq_records(raw)
    assert [(m["flag"], m["body"]) for m in java_decode(encoded)] == [(f, b) for f, b, _p in msgs]
    assert {decode_properties(m["properties"])["UNIQ_KEY"] for m in java_decode(encoded)} == {
        f"ID-{i}" for i in range(300)}


def test_unique_ids_are_rocketmqs() -> None:
    """UNIQ_KEY as MessageClientIDSetter makes it: hex of ip (4) + pid (2) + a per-process int (4) + ms since the
    start of the month (4) + counter (2); read back as its getNearlyTimeFromID and getPidFromID do."""
    import datetime as dt
    import os
    import socket

    from sparkmq.platform.common.ids import UniqueIdGenerator

    now = 1_700_000_123_456  # 2023-11-14T22:15:23.456Z
    gen = UniqueIdGenerator()
    first, second = gen.next_id(now), gen.next_id(now)
    assert len(first) == 32 and first == first.upper() and int(first, 16) >= 0
    raw = bytes.fromhex(first)
    assert int.from_bytes(raw[4:6], "big") == os.getpid() & 0xFFFF  # getPidFromID
    ip = raw[:4]
    assert ip in (socket.inet_aton("127.0.0.1"), socket.inet_aton(socket.gethostbyname(socket.gethostname())))
    month_start = dt.datetime(2023, 11, 1, tzinfo=dt.UTC).timestamp() * 1000
    assert month_start + int.from_bytes(raw[10:14], "big") == now  # getNearlyTimeFromID (at UTC)
    assert int.from_bytes(bytes.fromhex(second)[14:16], "big") == int.from_bytes(raw[14:16], "big") + 1
    assert first[:20] == second[:20]
