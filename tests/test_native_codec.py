"""The packed hot-path codecs of the storage core, on both implementations.

``encode_batch`` (client) -> ``CommitLog.append_packed`` (broker) -> ``CommitLog.read_packed``
(broker) -> ``decode_records`` (client), plus ``decode_batch``.  Every test that takes
``impl`` runs on the C core and on the Python twin; the parity tests feed both the same
random (often broken) input and require identical results, or identical errors (code and
message text), and byte-identical files.
"""
from __future__ import annotations

import ipaddress
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import IMPL_NAMES, IMPLS
from sparkmq.platform.common.codec import decode_properties, pack_host, tag_hash, unpack_host
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.ids import UniqueIdGenerator, encode_offset_msg_id
from sparkmq.platform.common.message import Message, StoredMessage
from sparkmq.platform.common.record_columns import decode_records as decode_columns
from sparkmq.platform.common.record_columns import packed_records_array, records_array
from sparkmq.platform.common.sysflag import COMPRESSED
from sparkmq.platform.common.wire import (
    ReceivedMessage,
    inflate,
    received_from_arrow,
    received_from_json,
    stored_to_json,
)
from sparkmq.platform.store.message_store import translate_store_error
from sparkmq.storage_native import StoreError, errors
from sparkmq.storage_native.layout import PACKED_ENTRY, RECORD_HEADER_SIZE, encode_record, record_size

SEG = 64 * 1024
TS = 1_700_000_000_000
MONTH = 1_698_796_800_000  # 2023-11-01T00:00Z
PREFIX = "7F00000112349ABCDEF0"
STORE = pack_host("10.1.2.3:10911")
BORN = pack_host("[2001:db8::7]:4242")
both = pytest.mark.skipif(len(IMPL_NAMES) < 2, reason="the C extension is not built")


def _open(impl, root, **kw):
    kw.setdefault("segment_size", SEG)
    kw.setdefault("cq_units_per_file", 64)
    return impl.CommitLog(str(root), **kw)


def entry(body=b"x", props=b"UNIQ_KEY\x01ID-1\x02", flag=0, born=TS, body_len=None, props_len=None) -> bytes:
    """One packed-batch entry; explicit lengths make broken framing."""
    return PACKED_ENTRY.pack(len(body) if body_len is None else body_len,
                             len(props) if props_len is None else props_len, flag, born) + body + props


P1 = b"UNIQ_KEY\x01ID-1\x02"
GOOD = entry()


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _state(log, topic="T", qid=0):
    cq = log.consume_queue(topic, qid)
    return log.max_offset, None if cq is None else cq.max_offset


def _outcome(fn, *args, **kw):
    try:
        return ("ok", fn(*args, **kw))
    except StoreError as exc:
        return ("StoreError", exc.code, exc.message)
    except (TypeError, OverflowError, BufferError) as exc:
        return (type(exc).__name__,)


def _kind(outcome) -> str:
    """An outcome without its numbers, for hypothesis' statistics."""
    if outcome[0] != "StoreError":
        return outcome[0]
    return f"{outcome[1]}: " + re.sub(r"\d+", "N", re.sub(r"'.*'", "'…'", outcome[2]))


@dataclass
class M:
    """A duck-typed outgoing message (encode_batch reads attributes only)."""

    body: object = b"x"
    tags: object = None
    keys: object = ()
    properties: object = field(default_factory=dict)
    flag: object = 0


def _received(*fields):
    return ReceivedMessage(*fields)


# -- the round trip -----------------------------------------------------------------------------
HOSTS = [
    (BORN, STORE),
    (None, None),
    (pack_host("127.0.0.1:1"), pack_host("[::1]:65535")),
    (bytes(16) + (5).to_bytes(4, "little"), bytes(10) + b"\xff\xff" + bytes(4) + (7).to_bytes(4, "little")),
]


@pytest.mark.parametrize("hosts", HOSTS, ids=["v6-born-v4-store", "no-hosts", "v4-born-v6-store", "zero-ip"])
@pytest.mark.parametrize("compressed", [False, True])
def test_roundtrip_gives_back_every_field(impl, tmp_path, hosts, compressed):
    born_host, store_host = hosts
    texts = [b"payload %d " % i * 40 for i in range(12)]
    msgs = [Message("orders", zlib.compress(t) if compressed else t,
                    tags=["red", "blue", None][i % 3],
                    keys=(f"k{i}", f"order-{i}") if i % 2 else (),
                    properties={"region": "eu", "n": str(i)} | ({"UNIQ_KEY": f"MINE-{i}"} if i == 5 else {}),
                    flag=i - 3)
            for i, t in enumerate(texts)]
    data, ids, nxt = impl.encode_batch(msgs, PREFIX, MONTH, 0xFFFE, TS + 77)
    generated = [i for i in range(12) if i != 5]
    counters = [(0xFFFE + 1 + k) & 0xFFFF for k in range(len(generated))]
    assert nxt == counters[-1] == 9
    for k, i in enumerate(generated):
        assert ids[i] == f"{PREFIX}{TS + 77 - MONTH:08X}{counters[k]:04X}"
    assert ids[5] == "MINE-5"
    entries = impl.decode_batch(data, 12)
    with _open(impl, tmp_path) as log:
        log.append("orders", 3, b"before")  # the batch starts at queue offset 1
        first, ts, end, offs = log.append_packed("orders", 3, data, 12, sys_flag=int(compressed),
                                                 born_host=born_host, store_host=store_host,
                                                 store_timestamp=TS + 99)
        offsets = list(struct.unpack("<12q", offs))
        assert (first, ts, end) == (1, TS + 99, log.max_offset)
        assert offsets == sorted(offsets) and offsets[0] == log.read_view(0).nbytes
        nxt_q, count, raw = log.read_packed("orders", 3, 1, 100)
        assert (nxt_q, count) == (13, 12)
        assert raw == b"".join(r for _q, _o, r in log.get("orders", 3, 1, 100)[1])
        got = impl.decode_records(raw, "broker-a", _received, zlib.decompress)
        cq = log.consume_queue("orders", 3)
        for i, (m, msg, (body, props, flag, born_ts)) in enumerate(zip(got, msgs, entries, strict=True)):
            expect_props = decode_properties(props)
            host_text = unpack_host(store_host or bytes(20))
            assert m == ReceivedMessage(
                topic="orders", broker_name="broker-a", queue_id=3, queue_offset=1 + i, msg_id=ids[i],
                offset_msg_id=encode_offset_msg_id(host_text or "0.0.0.0:0", offsets[i]), body=texts[i],
                tags=msg.tags, keys=msg.keys, properties=expect_props, born_timestamp=TS + 77,
                born_host=unpack_host(born_host or bytes(20)), store_timestamp=TS + 99, store_host=host_text,
                reconsume_times=0, sys_flag=int(compressed), commitlog_offset=offsets[i],
                store_size=record_size(len(body), 6, len(props)))
            assert expect_props == {**({"TAGS": msg.tags} if msg.tags else {}),
                                    **({"KEYS": " ".join(msg.keys)} if msg.keys else {}),
                                    "UNIQ_KEY": ids[i], **msg.properties}
            assert list(expect_props)[:1] == ["TAGS" if msg.tags else "KEYS" if msg.keys else "UNIQ_KEY"]
            assert (flag, born_ts) == (i - 3, TS + 77)
            record = impl.decode_record(log.read(offsets[i]), True)
            assert (record[3], record[6], record[13]) == (i - 3, int(compressed), tag_hash(msg.tags))
            assert cq.unit(1 + i) == (offsets[i], record[0], tag_hash(msg.tags))


def test_decode_records_reuses_repeated_strings(impl, tmp_path):
    with _open(impl, tmp_path) as log:
        data, _ids, _ = impl.encode_batch([Message("T", b"b", tags="t")] * 3, PREFIX, MONTH, 0, TS)
        log.append_packed("T", 0, data, 3, born_host=BORN, store_host=STORE)
        got = impl.decode_records(log.read_packed("T", 0, 0, 10)[2], "b", _received, zlib.decompress)
    if impl is IMPLS.get("native"):
        assert got[0].topic is got[2].topic and got[0].store_host is got[2].store_host
        assert got[0].born_host is got[1].born_host and got[0].tags is got[2].tags
    assert [m.topic for m in got] == ["T"] * 3 and got[2].born_host == "[2001:db8::7]:4242"


def test_decode_records_builds_slots_classes_directly_and_equal_to_their_init(impl, tmp_path):
    """ReceivedMessage itself as the factory (the consumers' call) gives what its __init__ gives; the C core
    builds it without __init__ and leaves it and its keys out of the collector's lists; a class that adds
    to construction (__post_init__) still gets its __init__ run."""
    import gc

    @dataclass(slots=True)
    class Checked(ReceivedMessage):
        seen: list[str] = field(default_factory=list)

        def __post_init__(self) -> None:
            self.seen.append(self.topic)

    with _open(impl, tmp_path) as log:
        data, _ids, _ = impl.encode_batch([Message("T", b"b%d" % i, tags="t", keys=("k", f"k{i}"),
                                                   properties={"p": str(i)}) for i in range(3)], PREFIX, MONTH,
                                          0, TS)
        log.append_packed("T", 0, data, 3, born_host=BORN, store_host=STORE)
        raw = log.read_packed("T", 0, 0, 10)[2]
        direct = impl.decode_records(raw, "b", ReceivedMessage, zlib.decompress)
        called = impl.decode_records(raw, "b", _received, zlib.decompress)
        checked = impl.decode_records(raw, "b", Checked, zlib.decompress)
    assert direct == called and len(direct) == 3 and [m.keys for m in direct][1] == ("k", "k1")
    assert [type(m) for m in direct] == [ReceivedMessage] * 3
    assert [m.seen for m in checked] == [["T"]] * 3 and [m.body for m in checked] == [b"b0", b"b1", b"b2"]
    if impl is IMPLS.get("native"):
        assert not any(gc.is_tracked(m) or gc.is_tracked(m.keys) for m in direct)
    direct[0].tags = "changed"  # an ordinary, writable instance
    assert direct[0].tags == "changed" and direct[1].tags == "t"


def test_decode_records_keeps_its_factorys_slots_when_a_callback_decodes_with_another(impl, tmp_path):
    """The inflate callback runs Python: a decode it starts with another slots class (its fields at other
    offsets, after a base class's slot) must not change where the outer decode stores its fields; a class
    with the same field names in another order, or one more field, is called (positionally) instead."""
    import dataclasses

    class Padded:
        __slots__ = ("pad",)

    fields = [(f.name, object) for f in dataclasses.fields(ReceivedMessage)]
    shifted = dataclasses.make_dataclass("Shifted", fields, bases=(Padded,), slots=True)
    reordered = dataclasses.make_dataclass("Reordered", fields[::-1], slots=True)
    longer = dataclasses.make_dataclass("Longer", [*fields, ("extra", int, dataclasses.field(default=7))],
                                        slots=True)
    with _open(impl, tmp_path) as log:
        for i in range(3):
            log.append("T", 0, zlib.compress(b"z%d" % i), b"UNIQ_KEY\x01u%d\x02KEYS\x01k%d\x02" % (i, i), sys_flag=1)
        raw = log.read_packed("T", 0, 0, 10)[2]
        inner: list[Any] = []

        def inflate(body: bytes) -> bytes:
            inner.extend(impl.decode_records(raw, "inner", shifted, zlib.decompress))
            return zlib.decompress(body)

        outer = impl.decode_records(raw, "b", ReceivedMessage, inflate)
        expected = impl.decode_records(raw, "b", _received, zlib.decompress)
    assert outer == expected and [m.body for m in outer] == [b"z0", b"z1", b"z2"]
    assert [(m.broker_name, m.body, m.keys) for m in inner[:3]] == [("inner", b"z%d" % i, (f"k{i}",)) for i in range(3)]
    backwards = impl.decode_records(raw, "b", reordered, zlib.decompress)
    assert [m.store_size for m in backwards] == ["T"] * 3  # the first argument (topic) lands in the first field
    assert [m.extra for m in impl.decode_records(raw, "b", longer, zlib.decompress)] == [7] * 3


def test_decode_records_inflates_compressed_records_only(impl, tmp_path):
    calls = []
    with _open(impl, tmp_path) as log:
        log.append("T", 0, zlib.compress(b"z"), b"UNIQ_KEY\x01a\x02", sys_flag=1)
        log.append("T", 0, b"plain", b"UNIQ_KEY\x01b\x02", sys_flag=2)
        got = impl.decode_records(log.read_packed("T", 0, 0, 10)[2], "b", _received,
                                  lambda b: calls.append(b) or zlib.decompress(b))
    assert [m.body for m in got] == [b"z", b"plain"] and calls == [zlib.compress(b"z")]
    assert [m.sys_flag for m in got] == [1, 2]


def test_encode_batch_property_rules(impl):
    msgs = [
        M(b"a", tags="t", properties={"TAGS": "t", "x": "1"}),       # TAGS given twice, agreeing
        M(b"b", properties={"TAGS": "p", "KEYS": "k1  k2 "}),       # both from the properties
        M(b"c", keys="solo", properties={"UNIQ_KEY": "U-1", "z": ""}),
        M(bytearray(b"d"), keys=["a", "b"], properties={"KEYS": "a b"}),
        M(memoryview(b"e"), keys=""),
    ]
    data, ids, nxt = impl.encode_batch(msgs, PREFIX, MONTH, 41, TS)
    assert nxt == 45 and ids[2] == "U-1" and ids[4].endswith("002D")
    props = [p for _b, p, _f, _t in impl.decode_batch(data, 5)]
    assert props == [
        f"TAGS\x01t\x02UNIQ_KEY\x01{ids[0]}\x02x\x011\x02".encode(),
        f"TAGS\x01p\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01{ids[1]}\x02".encode(),
        b"KEYS\x01solo\x02UNIQ_KEY\x01U-1\x02z\x01\x02",
        f"KEYS\x01a b\x02UNIQ_KEY\x01{ids[3]}\x02".encode(),
        f"UNIQ_KEY\x01{ids[4]}\x02".encode(),
    ]
    # only user ids: the counter comes back unchanged (masked)
    assert impl.encode_batch([M(properties={"UNIQ_KEY": "u"})], PREFIX, MONTH, 0x12345, TS)[2] == 0x2345
    # the month offset wraps at 32 bits, as UniqueIdGenerator's
    assert impl.encode_batch([M()], PREFIX, TS + (1 << 32) + 5, -1, TS)[1][0] == f"{PREFIX}FFFFFFFB0000"


def test_id_generator_with_state_shares_the_counter():
    gen = UniqueIdGenerator()
    now = TS
    first = gen.next_id(now)
    data, ids, nxt = gen.with_state(now, lambda p, m, c: IMPLS["python"].encode_batch([M()] * 3, p, m, c, now))
    after = gen.next_id(now)
    counters = [int(x[-4:], 16) for x in [first, *ids, after]]
    assert counters == [counters[0] + k for k in range(5)] and nxt == counters[3]
    assert len({first, *ids, after}) == 5 and all(x[:28] == first[:28] for x in ids)
    with pytest.raises(StoreError):
        gen.with_state(now, lambda p, m, c: IMPLS["python"].encode_batch([M(body=b"")], p, m, c, now))
    assert int(gen.next_id(now)[-4:], 16) == counters[-1] + 1  # a failed encode keeps nothing


def test_new_codes_translate_to_platform_codes():
    for native, code in [(errors.MESSAGE_ILLEGAL, ErrorCode.MESSAGE_ILLEGAL),
                         (errors.MESSAGE_TOO_LARGE, ErrorCode.MESSAGE_TOO_LARGE),
                         (errors.PROPERTIES_TOO_LARGE, ErrorCode.PROPERTIES_TOO_LARGE)]:
        err = translate_store_error(StoreError(native, "message 3: x"))
        assert (err.code, err.message) == (code, "message 3: x")


# -- append_packed: every error, exact text, nothing written ---------------------------------------
def _props(*pairs: tuple[bytes, bytes], uniq: bytes | None = b"ID") -> bytes:
    out = b"".join(k + b"\x01" + v + b"\x02" for k, v in pairs)
    return out + (b"UNIQ_KEY\x01" + uniq + b"\x02" if uniq is not None else b"")


ZBODY = zlib.compress(b"hello")
PACKED_ERRORS = [
    # framing
    (b"", 0, {}, "MESSAGE_ILLEGAL", "batch count must be >= 1, got 0"),
    (GOOD, -1, {}, "MESSAGE_ILLEGAL", "batch count must be >= 1, got -1"),
    (GOOD, 2, {}, "MESSAGE_ILLEGAL", "the batch holds 1 messages, the count says 2"),
    (GOOD, 10**15, {}, "MESSAGE_ILLEGAL", "the batch holds 1 messages, the count says 1000000000000000"),
    (GOOD + b"abc", 2, {}, "MESSAGE_ILLEGAL", "message 1: the entry header is truncated (3 bytes left)"),
    (GOOD + GOOD[:-1], 2, {}, "MESSAGE_ILLEGAL",
     f"message 1: the entry needs {len(GOOD)} bytes, {len(GOOD) - 1} are left"),
    (entry(body_len=2**32 - 1), 1, {}, "MESSAGE_ILLEGAL",
     f"message 0: the entry needs {18 + 2**32 - 1 + len(P1)} bytes, {len(GOOD)} are left"),
    (GOOD + b"z", 1, {}, "MESSAGE_ILLEGAL", "the batch has 1 bytes after its 1 messages"),
    (GOOD * 3, 2, {}, "MESSAGE_ILLEGAL", f"the batch has {len(GOOD)} bytes after its 2 messages"),
    # framing is checked over the whole batch before any entry's content
    (entry(b"") + b"zz", 1, {}, "MESSAGE_ILLEGAL", "the batch has 2 bytes after its 1 messages"),
    # sizes
    (GOOD + entry(b""), 2, {}, "MESSAGE_ILLEGAL", "message 1: the body is empty"),
    (GOOD + entry(b"x" * 101), 2, {"max_body": 100}, "MESSAGE_TOO_LARGE",
     "message 1: the body is 101 bytes, the limit is 100"),
    (entry(props=_props((b"a", b"b" * 20))), 1, {"max_properties": 20}, "PROPERTIES_TOO_LARGE",
     f"message 0: the properties are {len(_props((b'a', b'b' * 20)))} bytes, the limit is 20"),
    (entry(b"y" * (SEG - 140)), 1, {}, "INVALID_ARGUMENT",
     f"message 0: record of {record_size(SEG - 140, 1, len(P1))} bytes does not fit in a segment of {SEG} bytes"),
    # compressed batches
    (entry(b"plain"), 1, {"sys_flag": 1}, "MESSAGE_ILLEGAL",
     "message 0: the batch is compressed but the body is not zlib data"),
    (entry(ZBODY) + entry(b"\x78"), 2, {"sys_flag": 3}, "MESSAGE_ILLEGAL",
     "message 1: the batch is compressed but the body is not zlib data"),
    (entry(b"\x78\x9d"), 1, {"sys_flag": 1}, "MESSAGE_ILLEGAL",  # 0x789d % 31 != 0
     "message 0: the batch is compressed but the body is not zlib data"),
    # properties
    (entry(props=_props((b"a", b"\xff"))), 1, {}, "MESSAGE_ILLEGAL", "message 0: the properties are not valid UTF-8"),
    (entry(props=_props((b"a", b"\xed\xa0\x80"))), 1, {}, "MESSAGE_ILLEGAL",  # a UTF-8 surrogate
     "message 0: the properties are not valid UTF-8"),
    (entry(props=_props() + b"a\x01b"), 1, {}, "MESSAGE_ILLEGAL", "message 0: property 1 is not terminated by \\x02"),
    (entry(props=_props() + b"ab\x02"), 1, {}, "MESSAGE_ILLEGAL",
     "message 0: property 1 has no \\x01 between name and value"),
    (entry(props=b"\x02" + _props()), 1, {}, "MESSAGE_ILLEGAL",
     "message 0: property 0 has no \\x01 between name and value"),
    (entry(props=_props((b"", b"v")),), 1, {}, "MESSAGE_ILLEGAL", "message 0: property 0 has an empty name"),
    (entry(props=_props((b"a", b"b\x01c")),), 1, {}, "MESSAGE_ILLEGAL",
     "message 0: property 0 has more than one \\x01"),
    (entry(props=_props((b"DELAY", b"3"))), 1, {"reserved_keys": ("X", "DELAY")}, "MESSAGE_ILLEGAL",
     "message 0: the property DELAY is reserved"),
    (entry(props=_props((b"\xc3\xa9t\xc3\xa9", b"3"))), 1, {"reserved_keys": ("été",)}, "MESSAGE_ILLEGAL",
     "message 0: the property été is reserved"),
    (entry(props=_props((b"TAGS", b"a"), (b"TAGS", b"a"))), 1, {}, "MESSAGE_ILLEGAL",
     "message 0: property TAGS appears twice"),
    (entry(props=_props((b"KEYS", b"a"), (b"KEYS", b"b"))), 1, {}, "MESSAGE_ILLEGAL",
     "message 0: property KEYS appears twice"),
    (entry(props=_props() + _props()), 1, {}, "MESSAGE_ILLEGAL", "message 0: property UNIQ_KEY appears twice"),
    *[(entry(props=_props((b"TAGS", tag))), 1, {}, "MESSAGE_ILLEGAL",
       "message 0: the TAGS value is empty, padded with whitespace or has '||'")
      for tag in (b"", b" a", b"a\t", b"\na", b"a\r", b"a\x0b", b"a||b", b"||")],
    *[(entry(props=_props((b"KEYS", keys))), 1, {}, "MESSAGE_ILLEGAL",
       "message 0: the KEYS value is empty or has an empty key")
      for keys in (b"", b" a", b"a ", b"a  b", b" ")],
    *[(entry(props=_props(uniq=uniq)), 1, {}, "MESSAGE_ILLEGAL",
       "message 0: the UNIQ_KEY must be 1 to 128 printable ASCII characters without spaces")
      for uniq in (b"", b"a b", b"x" * 129, b"\xc3\xa9", b"a\x7f", b"tab\t")],
    (entry(props=_props((b"a", b"b"), uniq=None)), 1, {}, "MESSAGE_ILLEGAL",
     "message 0: the properties have no UNIQ_KEY"),
    (entry(props=b""), 1, {}, "MESSAGE_ILLEGAL", "message 0: the properties have no UNIQ_KEY"),
    # the first bad entry is the one named, after good ones
    (GOOD * 5 + entry(b"") + entry(b"x" * 200), 7, {"max_body": 100}, "MESSAGE_ILLEGAL",
     "message 5: the body is empty"),
    # arguments (checked before the data)
    (GOOD, 1, {"reserved_keys": ("x" * 256,)}, "INVALID_ARGUMENT", "reserved key 0 is 256 bytes, the limit is 255"),
    (GOOD, 1, {"born_host": b"short"}, "INVALID_ARGUMENT", "born_host must be 20 bytes, got 5"),
    (GOOD, 1, {"store_host": bytes(21)}, "INVALID_ARGUMENT", "store_host must be 20 bytes, got 21"),
    (b"junk", 1, {"topic": ""}, "INVALID_ARGUMENT", "topic must not be empty"),
    (b"junk", 1, {"topic": "a/b"}, "INVALID_ARGUMENT", "topic contains a character not allowed in a file name"),
    (b"junk", 1, {"queue_id": 65536}, "INVALID_ARGUMENT", "queue_id must be in [0, 65535], got 65536"),
]


@pytest.mark.parametrize("data,count,kw,code,text", PACKED_ERRORS,
                         ids=[f"{i}-{t[:40]}" for i, (_d, _c, _k, _code, t) in enumerate(PACKED_ERRORS)])
def test_append_packed_errors_write_nothing(impl, tmp_path, data, count, kw, code, text):
    kw = dict(kw)
    topic = kw.pop("topic", "T")
    qid = kw.pop("queue_id", 0)
    with _open(impl, tmp_path / "log") as log:
        log.append("T", 0, b"first", b"UNIQ_KEY\x01F\x02", 0, 0, 0, TS, None, TS)
        before, files = _state(log), _files(tmp_path / "log")
        with pytest.raises(StoreError) as err:
            log.append_packed(topic, qid, data, count, store_timestamp=TS, **kw)
        assert (err.value.code, err.value.message) == (code, text)
        assert _state(log) == before and log.consume_queue("T", 1) is None
    assert _files(tmp_path / "log") == files


@pytest.mark.parametrize("kw,data", [({"reserved_keys": ["DELAY"]}, GOOD), ({"reserved_keys": (1,)}, GOOD),
                                     ({}, 12345), ({"sys_flag": 2**31}, GOOD), ({"max_body": 2**63}, GOOD)])
def test_append_packed_argument_types(impl, tmp_path, kw, data):
    with _open(impl, tmp_path) as log:
        with pytest.raises((TypeError, OverflowError)):
            log.append_packed("T", 0, data, 1, **kw)
        with pytest.raises(TypeError):
            log.append_packed("T", 0, GOOD, 1, 0)  # the options are keyword-only
        assert log.max_offset == 0 and log.consume_queue("T", 0) is None


def test_append_packed_on_a_closed_log(impl, tmp_path):
    log = _open(impl, tmp_path)
    log.close()
    with pytest.raises(StoreError) as err:
        log.append_packed("T", 0, GOOD, 1)
    assert (err.value.code, err.value.message) == ("CLOSED", "commit log is closed")


def test_append_packed_accepts_edge_values(impl, tmp_path):
    """What the rules allow: limits exactly met, a compressed batch, reserved names elsewhere."""
    uniq = (bytes(range(0x21, 0x7F)) + b"~" * 40)[:128]  # every printable byte, 128 of them
    zbody = b"\x78\x9c" + b"b" * 98  # a zlib header is all the check looks at
    props = _props((b"TAGS", b"a|b c"), (b"KEYS", b"k1 k2"), (b"DELAYED", b""), (b"x\xc3\xa9", b"\xe2\x82\xac"),
                   uniq=uniq)
    data = entry(zbody, props, flag=-7, born=-1) + entry(ZBODY, _props(), flag=2**31 - 1)
    with _open(impl, tmp_path) as log:
        first, ts, end, offs = log.append_packed("T", 9, data, 2, sys_flag=1, max_body=100,
                                                 max_properties=len(props), reserved_keys=("DELAY", ""),
                                                 born_host=BORN, store_host=STORE)
        assert first == 0 and end == log.max_offset and len(offs) == 16 and ts > TS
        recs = [impl.decode_record(log.read(o)) for o in struct.unpack("<2q", offs)]
        assert [(r[3], r[6], r[7], r[8], r[10], r[13], r[14], r[16]) for r in recs] == [
            (-7, 1, -1, BORN, STORE, zlib.crc32(b"a|b c"), zbody, props),
            (2**31 - 1, 1, TS, BORN, STORE, 0, ZBODY, _props())]


def test_append_packed_record_that_just_fits_and_segment_roll(impl, tmp_path):
    body = b"q" * (SEG - record_size(0, 1, len(P1)) - 8)  # size == segment_size - 8
    with _open(impl, tmp_path) as log:
        log.append("T", 0, b"x")
        _first, _ts, end, offs = log.append_packed("T", 0, entry(body) + entry(body), 2, max_body=SEG)
        assert struct.unpack("<2q", offs) == (SEG, 2 * SEG) and end == 3 * SEG - 8 == log.max_offset


# -- read_packed ---------------------------------------------------------------------------------
def test_read_packed_filters_tags_and_limits_bytes(impl, tmp_path):
    tags = ["a", "b", None, "c"]
    with _open(impl, tmp_path, segment_size=1 << 20) as log:
        msgs = [Message("T", b"%03d" % i, tags=tags[i % 4]) for i in range(100)]
        data, _ids, _ = impl.encode_batch(msgs, PREFIX, MONTH, 0, TS)
        log.append_packed("T", 0, data, 100)
        nxt, n, raw = log.read_packed("T", 0, 0, 10, frozenset({tag_hash("b")}))
        got = impl.decode_records(raw, "b", _received, zlib.decompress)
        assert (nxt, n) == (38, 10) and [m.queue_offset for m in got] == list(range(1, 38, 4))
        assert all(m.tags == "b" for m in got)
        nxt, n, raw = log.read_packed("T", 0, 98, 10, {tag_hash("zzz")})
        assert (nxt, n) == (100, 0) and raw == b""
        assert log.read_packed("T", 0, 98, 10, {tag_hash(None)})[:2] == (100, 1)
        one = len(log.read(0))
        nxt, n, raw = log.read_packed("T", 0, 0, 32, None, 1)  # below one record: still one
        assert (nxt, n, len(raw)) == (1, 1, one)
        nxt, n, raw = log.read_packed("T", 0, 0, 32, None, 3 * one + 10)
        assert (nxt, n, len(raw)) == (3, 3, 3 * one - 7)  # record 2 has no TAGS
        assert log.read_packed("T", 0, 100, 5) == (100, 0, b"")
        assert log.read_packed("nope", 0, 7, 5) == (7, 0, b"")
        assert log.read_packed("T", 0, 2**70, 5) == (2**70, 0, b"")
        for args in [("T", 0, -1, 5), ("T", 0, 0, 0)]:
            with pytest.raises(StoreError) as err:
                log.read_packed(*args)
            assert err.value.code == "INVALID_ARGUMENT"
        with pytest.raises(TypeError):
            log.read_packed("T", 0, 0, 5, [1])


def test_read_packed_equals_get_and_skips_deleted_segments(impl, tmp_path):
    with _open(impl, tmp_path, segment_size=8192) as log:
        for i in range(60):
            log.append("T", i % 2, b"v" * 700, b"UNIQ_KEY\x01x\x02", i % 3)
        log.delete_segments_before(log.segments()[2][0])
        cq = log.consume_queue("T", 0)
        with pytest.raises(StoreError) as err:
            log.read_packed("T", 0, cq.min_offset - 1, 5)
        assert err.value.code == "OFFSET_TOO_SMALL"
        for start in range(cq.min_offset, cq.max_offset + 1, 3):
            for count, tags, limit in [(1, None, 0), (7, {0, 2}, 0), (50, None, 2000), (4, frozenset(), 0)]:
                nxt, recs = log.get("T", 0, start, count, tags, limit)
                assert log.read_packed("T", 0, start, count, tags, limit) == (
                    nxt, len(recs), b"".join(r for _q, _o, r in recs))


# -- decode_batch and decode_records errors ---------------------------------------------------
def test_decode_batch(impl):
    data = entry(b"a", b"p\x01q\x02", 5, 6) + entry(b"bb", b"", -1, -2) + entry(b"", b"\xff")
    assert impl.decode_batch(data, 3) == [(b"a", b"p\x01q\x02", 5, 6), (b"bb", b"", -1, -2), (b"", b"\xff", 0, TS)]
    assert impl.decode_batch(bytearray(data), 3) == impl.decode_batch(memoryview(data), 3)
    for buf, count, text in [(data, 4, "the batch holds 3 messages, the count says 4"),
                             (data, 2, f"the batch has {PACKED_ENTRY.size + 1} bytes after its 2 messages"),
                             (data[:5], 1, "message 0: the entry header is truncated (5 bytes left)"),
                             (b"", 0, "batch count must be >= 1, got 0")]:
        with pytest.raises(StoreError) as err:
            impl.decode_batch(buf, count)
        assert (err.value.code, err.value.message) == ("MESSAGE_ILLEGAL", text)
    with pytest.raises(OverflowError):
        impl.decode_batch(data, 2**64)


def _records(impl, tmp_path) -> bytes:
    with _open(impl, tmp_path) as log:
        data, _ids, _ = impl.encode_batch([Message("T", b"x" * 50, tags="t", keys=("k",))] * 3, PREFIX, MONTH, 0, TS)
        log.append_packed("T", 0, data, 3)
        return log.read_packed("T", 0, 0, 10)[2]


def test_decode_records_errors(impl, tmp_path):
    good = _records(impl, tmp_path)
    one = int.from_bytes(good[:4], "little")
    bad_magic = bytearray(good)
    bad_magic[one + 4] ^= 1
    bad_total = bytearray(good)
    bad_total[one:one + 4] = (100).to_bytes(4, "little")
    bad_body_len = bytearray(good)
    bad_body_len[RECORD_HEADER_SIZE - 4] = 200
    bad_topic_len = bytearray(good)
    bad_topic_len[RECORD_HEADER_SIZE + 50] = 9
    bad_topic = bytearray(good)
    bad_topic[RECORD_HEADER_SIZE + 51] = 0xFF
    bad_props = bytearray(good)
    bad_props[one - 3] = 0xC3
    cases = [
        (good[:one + 119], "record is malformed: buffer shorter than the header"),
        (bytes(bad_magic), f"record is malformed: bad magic 0x{0x534D5101 ^ 1:08x}"),
        (bytes(bad_total), f"record is malformed: total_size 100 != buffer length {len(good) - one}"),
        (good[:-1], f"record is malformed: total_size {one} != buffer length {one - 1}"),
        (bytes(bad_body_len), "record is malformed: lengths overrun the record"),
        (bytes(bad_topic_len), "record is malformed: lengths overrun the record"),
        (bytes(bad_topic), "record is malformed: topic is not UTF-8"),
        (bytes(bad_props), "record is malformed: properties are not UTF-8"),
    ]
    for buf, text in cases:
        with pytest.raises(StoreError) as err:
            impl.decode_records(buf, "b", _received, zlib.decompress)
        assert (err.value.code, err.value.message) == ("CORRUPT_RECORD", text)
    assert impl.decode_records(b"", "b", _received, zlib.decompress) == []
    with pytest.raises(ZeroDivisionError):  # the factory's exceptions propagate
        impl.decode_records(good, "b", lambda *a: 1 / 0, zlib.decompress)


# -- encode_batch errors -------------------------------------------------------------------------
ENCODE_ERRORS = [
    ([M(body="text")], "MESSAGE_ILLEGAL", "message 0: the body must be bytes, got str"),
    ([M(), M(body=12)], "MESSAGE_ILLEGAL", "message 1: the body must be bytes, got int"),
    ([M(body=None)], "MESSAGE_ILLEGAL", "message 0: the body must be bytes, got NoneType"),
    ([M(body=b"")], "MESSAGE_ILLEGAL", "message 0: the body must not be empty"),
    ([M(tags=5)], "MESSAGE_ILLEGAL", "message 0: the tag must be a str, got int"),
    ([M(keys=5)], "MESSAGE_ILLEGAL", "message 0: keys must be a tuple of strings, got int"),
    ([M(keys={"a"})], "MESSAGE_ILLEGAL", "message 0: keys must be a tuple of strings, got set"),
    *[([M(keys=k)], "MESSAGE_ILLEGAL", "message 0: keys must be non-empty strings without spaces")
      for k in (("a b",), ("",), (1,), ["ok", None], "two words")],
    ([M(keys=("a\x01",))], "MESSAGE_ILLEGAL",
     "message 0: property 'KEYS' contains a reserved control character (\\x01 or \\x02)"),
    ([M(keys=("\ud800",))], "MESSAGE_ILLEGAL", "message 0: property 'KEYS' is not valid Unicode"),
    ([M(properties=[("a", "b")])], "MESSAGE_ILLEGAL", "message 0: properties must be a dict, got list"),
    ([M(properties={1: "a"})], "MESSAGE_ILLEGAL", "message 0: property 1 must map a string to a string"),
    ([M(properties={"a": None})], "MESSAGE_ILLEGAL", "message 0: property 'a' must map a string to a string"),
    ([M(properties={"": "a"})], "MESSAGE_ILLEGAL", "message 0: property names must not be empty"),
    ([M(properties={"ok": "1", "a\x02": "b"})], "MESSAGE_ILLEGAL",
     "message 0: property 'a\\x02' contains a reserved control character (\\x01 or \\x02)"),
    ([M(properties={"a": "b\x01"})], "MESSAGE_ILLEGAL",
     "message 0: property 'a' contains a reserved control character (\\x01 or \\x02)"),
    ([M(properties={"a": "\udc80"})], "MESSAGE_ILLEGAL", "message 0: property 'a' is not valid Unicode"),
    ([M(properties={"\udc80": "v"})], "MESSAGE_ILLEGAL", "message 0: property '\\udc80' is not valid Unicode"),
    ([M(flag=2**31)], "MESSAGE_ILLEGAL",
     "message 0: the flag must be an int in [-2147483648, 2147483647], got 2147483648"),
    ([M(flag="1")], "MESSAGE_ILLEGAL", "message 0: the flag must be an int in [-2147483648, 2147483647], got '1'"),
    ([M(flag=1.0)], "MESSAGE_ILLEGAL", "message 0: the flag must be an int in [-2147483648, 2147483647], got 1.0"),
    ([M(tags="a", properties={"TAGS": "b"})], "MESSAGE_ILLEGAL",
     "message 0: tags 'a' disagree with property TAGS 'b'"),
    *[([M(tags=t)], "MESSAGE_ILLEGAL", "message 0: the TAGS value is empty, padded with whitespace or has '||'")
      for t in ("", " a", "a\n", "a||b")],
    ([M(properties={"TAGS": "x "})], "MESSAGE_ILLEGAL",
     "message 0: the TAGS value is empty, padded with whitespace or has '||'"),
    ([M(tags="a\x02")], "MESSAGE_ILLEGAL",
     "message 0: property 'TAGS' contains a reserved control character (\\x01 or \\x02)"),
    ([M(tags="\ud800")], "MESSAGE_ILLEGAL", "message 0: property 'TAGS' is not valid Unicode"),
    ([M(keys=("a",), properties={"KEYS": "a b"})], "MESSAGE_ILLEGAL",
     "message 0: keys ['a'] disagree with property KEYS"),
    ([M(keys="b", properties={"KEYS": "a"})], "MESSAGE_ILLEGAL", "message 0: keys ['b'] disagree with property KEYS"),
    *[([M(properties={"UNIQ_KEY": u})], "MESSAGE_ILLEGAL",
       "message 0: the UNIQ_KEY must be 1 to 128 printable ASCII characters without spaces")
      for u in ("", "a b", "é", "x" * 129)],
    ([M(properties={"big": "x" * 65520})], "PROPERTIES_TOO_LARGE",
     f"message 0: the properties are {len('UNIQ_KEY') + 34 + len('big') + 65522} bytes, the limit is 65535"),
    ([], "MESSAGE_ILLEGAL", "the batch is empty"),
]


@pytest.mark.parametrize("msgs,code,text", ENCODE_ERRORS,
                         ids=[f"{i}-{t[:40]}" for i, (_m, _c, t) in enumerate(ENCODE_ERRORS)])
def test_encode_batch_errors(impl, msgs, code, text):
    with pytest.raises(StoreError) as err:
        impl.encode_batch(msgs, PREFIX, MONTH, 0, TS)
    assert (err.value.code, err.value.message) == (code, text)


def test_encode_batch_argument_errors(impl):
    for prefix in ("XYZ", "G" * 20, PREFIX + "0", 5, "é" * 20):
        with pytest.raises(StoreError) as err:
            impl.encode_batch([M()], prefix, MONTH, 0, TS)
        assert (err.value.code, err.value.message) == (
            "INVALID_ARGUMENT", f"id_prefix must be 20 hexadecimal digits, got {prefix!r}")
    with pytest.raises(TypeError):
        impl.encode_batch(M(), PREFIX, MONTH, 0, TS)
    with pytest.raises(OverflowError):
        impl.encode_batch([M()], PREFIX, 2**63, 0, TS)
    with pytest.raises(AttributeError):
        impl.encode_batch([object()], PREFIX, MONTH, 0, TS)
    assert impl.encode_batch([M()], PREFIX.lower(), MONTH, 2**80 + 3, TS)[1:] == (
        [f"{PREFIX.lower()}{TS - MONTH:08X}0004"], 4)


# -- parity under random input ----------------------------------------------------------------
_piece = st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY", b"DELAY", b"k", b"", b" ", b"a b", b"||", b"\xc3\xa9",
                          b"\xff", b"\x01", b"\x02", b"ID-1", b"x" * 130, b"\t"])
_wild_pair = st.one_of(st.tuples(_piece, _piece).map(lambda kv: kv[0] + b"\x01" + kv[1] + b"\x02"),
                       st.binary(max_size=12))
_wild_props = st.lists(_wild_pair, max_size=5).map(b"".join)
# well-formed properties: each name once, values the rules accept (DELAY is reserved in some calls)
_good_value = {b"TAGS": st.sampled_from([b"red", b"a b", b"\xc3\xa9t\xc3\xa9", b"x|y"]),
               b"KEYS": st.sampled_from([b"k1", b"k1 k2", b"order-7 \xe2\x82\xac"]),
               b"UNIQ_KEY": st.sampled_from([b"ID-1", b"7F0000010000000000000000000000AB", b"~" * 128]),
               b"DELAY": st.just(b"3"), b"k": st.sampled_from([b"", b"v", b"a b", b"\xc3\xa9"]),
               b"\xc3\xa9": st.just(b"v")}
_good_props = st.lists(st.sampled_from(sorted(_good_value)), unique=True, max_size=5).flatmap(
    lambda names: st.tuples(*[_good_value[n].map(lambda v, n=n: n + b"\x01" + v + b"\x02") for n in names])
).map(lambda pairs: b"".join(pairs) if any(p.startswith(b"UNIQ_KEY") for p in pairs)
      else b"".join(pairs) + b"UNIQ_KEY\x01ID\x02")
_body = st.one_of(st.binary(min_size=1, max_size=300), st.just(ZBODY), st.just(ZBODY + b"tail"))
_entry = st.one_of(
    *[st.tuples(_body, _good_props, st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1))] * 4,
    st.tuples(st.one_of(_body, st.just(b"")), _wild_props, st.integers(-(2**31), 2**31 - 1),
              st.integers(-(2**63), 2**63 - 1)))
_batch = st.lists(_entry, min_size=1, max_size=6)


@st.composite
def packed_inputs(draw):
    """A batch, mostly well-formed, then perhaps broken: truncated, flipped, extended, miscounted."""
    entries = draw(_batch)
    data = bytearray(b"".join(entry(*e) for e in entries))
    count = len(entries)
    mutation = draw(st.sampled_from(["none"] * 6 + ["truncate", "flip", "extend", "count", "random"]))
    if mutation == "truncate" and data:
        del data[draw(st.integers(0, len(data) - 1)):]
    elif mutation == "flip" and data:
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
    elif mutation == "extend":
        data += draw(st.binary(min_size=1, max_size=40))
    elif mutation == "count":
        count += draw(st.sampled_from([-count, -1, 1, 2**40]))
    elif mutation == "random":
        data = bytearray(draw(st.binary(max_size=200)))
    kw = draw(st.fixed_dictionaries({}, optional={
        "sys_flag": st.sampled_from([0, 0, 1, 2, 3]),
        "max_body": st.integers(-1, 400),
        "max_properties": st.integers(-1, 200),
        "reserved_keys": st.sampled_from([(), ("DELAY",), ("k", "TAGS"), ("é",)]),
        "born_host": st.sampled_from([None, BORN]),
    }))
    return bytes(data), count, kw


@both
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(packed_inputs(), min_size=1, max_size=4), as_type=st.sampled_from([bytes, bytearray, memoryview]))
def test_random_packed_batches_same_outcome_on_both(tmp_path_factory, calls, as_type):
    base = tmp_path_factory.mktemp("packed")
    logs = {n: _open(IMPLS[n], base / n) for n in IMPL_NAMES}
    try:
        for data, count, kw in calls:
            outcomes = {}
            for name, log in logs.items():
                before = _state(log, "P", 1)
                outcomes[name] = _outcome(log.append_packed, "P", 1, as_type(data), count, store_host=STORE,
                                          store_timestamp=TS, **kw)
                if outcomes[name][0] != "ok":
                    assert _state(log, "P", 1) == before, outcomes[name]
                else:
                    first, _ts, end, offs = outcomes[name][1]
                    assert end == log.max_offset and len(offs) == 8 * count
                    assert log.consume_queue("P", 1).max_offset == first + count
            assert outcomes[IMPL_NAMES[0]] == outcomes[IMPL_NAMES[1]]
            assert outcomes[IMPL_NAMES[0]][0] in ("ok", "StoreError"), outcomes
            event(_kind(outcomes[IMPL_NAMES[0]]))
            dec = {n: _outcome(IMPLS[n].decode_batch, data, count) for n in IMPL_NAMES}
            assert dec[IMPL_NAMES[0]] == dec[IMPL_NAMES[1]]
            if outcomes[IMPL_NAMES[0]][0] == "ok":
                assert dec[IMPL_NAMES[0]][0] == "ok"
        reads = {n: log.read_packed("P", 1, 0, 1000) for n, log in logs.items()}
        assert reads[IMPL_NAMES[0]] == reads[IMPL_NAMES[1]]
        decoded = {n: IMPLS[n].decode_records(reads[n][2], "b", _received, lambda b: b"inflated:" + b)
                   for n in IMPL_NAMES}
        assert decoded[IMPL_NAMES[0]] == decoded[IMPL_NAMES[1]]
    finally:
        for log in logs.values():
            log.close()
    files = [_files(base / n) for n in IMPL_NAMES]
    assert files[0] == files[1]


_odd_text = st.sampled_from(["", " ", "a b", "x||y", "\x01", "\x02", "\ud800", "t ", "TAGS", "KEYS", "UNIQ_KEY",
                             "A" * 130])
_text = st.one_of(st.text(max_size=8), _odd_text)
_word = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x2FF, exclude_characters="|"), min_size=1,
                max_size=6)
_good_message = st.builds(
    M,
    body=st.one_of(st.binary(min_size=1, max_size=40), st.just(bytearray(b"ba"))),
    tags=st.one_of(st.none(), _word),
    keys=st.one_of(st.lists(_word, max_size=3).map(tuple), _word, st.lists(_word, max_size=2)),
    properties=st.dictionaries(st.one_of(_word, st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY"])),
                               st.one_of(_word, st.just("")), max_size=4),
    flag=st.integers(-(2**31), 2**31 - 1),
)
_wild_message = st.builds(
    M,
    body=st.one_of(st.binary(max_size=40), st.sampled_from(["str", None, bytearray(b"ba")])),
    tags=st.one_of(st.none(), _text, st.just(3)),
    keys=st.one_of(st.lists(_text, max_size=3), st.lists(_text, max_size=3).map(tuple), _text, st.just(None)),
    properties=st.one_of(st.dictionaries(st.one_of(_text, st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY"])), _text,
                                         max_size=4), st.just([])),
    flag=st.one_of(st.integers(-(2**32), 2**32), st.just("x")),
)
_message = st.one_of(_good_message, _good_message, _good_message, _wild_message)


@both
@settings(max_examples=300, deadline=None)
@given(msgs=st.lists(_message, min_size=1, max_size=5), counter=st.integers(-(2**20), 2**20),
       born=st.integers(0, 2**45))
def test_random_messages_encode_the_same_on_both(msgs, counter, born):
    outs = [_outcome(IMPLS[n].encode_batch, msgs, PREFIX, MONTH, counter, born) for n in IMPL_NAMES]
    assert outs[0] == outs[1]
    event(_kind(outs[0]))
    if outs[0][0] == "ok":
        data, ids, _nxt = outs[0][1]
        entries = IMPLS["python"].decode_batch(data, len(msgs))
        assert [decode_properties(p)["UNIQ_KEY"] for _b, p, _f, _t in entries] == ids
        assert all(t == born for *_x, t in entries)


@st.composite
def records_buffers(draw, damage: bool = True):
    """Stored records with random hosts, topics and properties, perhaps damaged."""
    import tempfile

    host = st.one_of(st.binary(min_size=20, max_size=20), st.sampled_from([
        bytes(20), bytes(16) + b"\x01\0\0\0", bytes(10) + b"\xff\xff" + bytes(8),
        ipaddress.IPv6Address("1:0:0:2:0:0:0:3").packed + bytes(4),
        ipaddress.IPv6Address("1:0:0:2::").packed + bytes(4),
        ipaddress.IPv6Address("::1.2.3.4").packed + b"\xff" * 4]))
    props = st.one_of(_good_props, _good_props, _wild_props, st.binary(max_size=40))
    recs = draw(st.lists(st.tuples(st.sampled_from(["T", "été", "%RETRY%g"]), st.binary(max_size=30),
                                   props, st.sampled_from([0, 1, 4]), host, host,
                                   st.integers(-(2**31), 2**31 - 1)), min_size=1, max_size=5))
    with tempfile.TemporaryDirectory() as d, _open(IMPLS["python"], d) as log:
        for topic, body, props, sys_flag, born, store, reconsume in recs:
            log.append(topic, 0, body, props, 0, 0, sys_flag, TS, born, TS + 1, store, reconsume)
        data = bytearray(log.read_raw(0, log.max_offset))
    if damage and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
    if damage and draw(st.booleans()):
        del data[draw(st.integers(0, len(data))):]
    return bytes(data), recs


@both
@settings(max_examples=200, deadline=None)
@given(buf=records_buffers())
def test_random_records_decode_the_same_on_both(buf):
    data, _recs = buf
    outs = [_outcome(IMPLS[n].decode_records, data, "brk", _received, lambda b: b"inflated:" + b) for n in IMPL_NAMES]
    assert outs[0] == outs[1]
    event(_kind(outs[0]))
    assert outs[0][0] in ("ok", "StoreError")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(buf=records_buffers(damage=False))
def test_records_decode_like_the_platform_codecs(impl, buf):
    data, recs = buf
    try:
        got = impl.decode_records(data, "brk", _received, lambda b: b"inflated:" + b)
    except StoreError as exc:  # only properties that are not UTF-8 can fail an undamaged buffer
        assert exc.message == "record is malformed: properties are not UTF-8"
        return
    assert len(got) == len(recs)
    for m, (topic, body, props, sys_flag, born, store, reconsume) in zip(got, recs, strict=True):
        expect_props = decode_properties(props)
        store_text = unpack_host(store)
        assert (m.topic, m.born_host, m.store_host, m.reconsume_times) == (topic, unpack_host(born), store_text,
                                                                           reconsume)
        assert m.offset_msg_id == encode_offset_msg_id(store_text or "0.0.0.0:0", m.commitlog_offset)
        assert m.properties == expect_props and m.msg_id == expect_props.get("UNIQ_KEY", "")
        assert m.tags == expect_props.get("TAGS")
        assert m.keys == tuple(k for k in expect_props.get("KEYS", "").split(" ") if k)
        assert m.body == (b"inflated:" + body if sys_flag & 1 else body)


def _rows_outcome(fn, *args):
    """("ok", result) or ("error", code) of a decoder, native errors translated as the platform does."""
    try:
        return ("ok", fn(*args))
    except StoreError as exc:
        return ("error", translate_store_error(exc).code)
    except SparkMQError as exc:
        return ("error", exc.code)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(buf=records_buffers())
def test_columnar_decoding_gives_the_rows_of_the_row_decoder(impl, buf):
    """The columnar decoder (``record_columns``, the lake's and the Spark source's) read back into messages
    (``wire.received_from_arrow``) gives the messages of the row decoder (the client's pull), on any records;
    damaged ones make both fail."""
    data, _recs = buf
    rows = _rows_outcome(impl.decode_records, data, "brk", ReceivedMessage, lambda b: inflate(b, COMPRESSED))
    columns = _rows_outcome(lambda d: received_from_arrow(decode_columns(packed_records_array(d), "brk")), data)
    assert columns[0] == rows[0], (columns, rows)
    if rows[0] == "ok":
        assert columns[1] == rows[1]
    event(f"{rows[0]} {rows[1] if rows[0] == 'error' else ''}")


_ODD_PROPERTIES = [
    b"", b"UNIQ_KEY\x01U1\x02",
    b"TAGS\x01a\x02TAGS\x01b\x02KEYS\x01k1 k2\x02KEYS\x01 k3  k4 \x02UNIQ_KEY\x01A\x02UNIQ_KEY\x01B\x02",
    b"\x02\x02TAGS\x01\x02KEYS\x02", b"k\x01v\x01w\x02\x01nameless\x02", b"TAGS\x01t\x02x\x01y",
    "é\x01ü\x02TAGS\x01€\x02".encode(), b"\x01", b"\x02",
]


@pytest.mark.parametrize("hosts", ["one", "runs", "interleaved"])
def test_every_decoder_gives_the_same_messages_of_odd_records(impl, hosts):
    """Rows, columns and the JSON form agree on the paths a random buffer seldom takes: names given twice (the
    last wins, as in a dict), pairs without a name or a \\x01, compressed bodies, and hosts -- IPv4, IPv6, all
    zero -- alike, in runs, or interleaved past the columnar decoder's run limit (``_MAX_HOST_RUNS``)."""
    choices = [pack_host("10.1.2.3:4"), pack_host("[2001:db8::1]:5"), bytes(20), pack_host("[::ffff:1.2.3.4]:6")]
    records = []
    for i in range(600):
        pick = 0 if hosts == "one" else i // 7 % 4 if hosts == "runs" else i * 7 % 4
        compressed = i % 5 == 0
        body = zlib.compress(b"b%d" % i) if compressed else b"x" * (i % 30)
        records.append(encode_record(
            topic=["T", "été", "%RETRY%g"][i % 3], queue_id=i % 4, flag=i, queue_offset=i, commitlog_offset=1000 + i,
            sys_flag=COMPRESSED if compressed else i % 2 * 4, born_timestamp=TS + i, born_host=choices[(pick + 1) % 4],
            store_timestamp=TS + 2 * i, store_host=choices[pick], reconsume_times=i % 3, prepared_offset=0,
            tag_hash=0, body=body, properties=_ODD_PROPERTIES[i % len(_ODD_PROPERTIES)]))
    rows = impl.decode_records(b"".join(records), "brk", ReceivedMessage, lambda b: inflate(b, COMPRESSED))
    assert received_from_arrow(decode_columns(records_array(records), "brk")) == rows
    # ... and the JSON form, made of decode_record's tuple (the broker's HTTP pull) and read back by the client
    stored = [StoredMessage.from_decoded(impl.decode_record(r)) for r in records]
    assert [received_from_json(stored_to_json(m, "brk")) for m in stored] == rows
    assert rows[2].tags == "b" and rows[2].keys == ("k3", "k4") and rows[2].msg_id == "B"


@pytest.mark.skipif("native" not in IMPLS, reason="the C extension is not built")
def test_bytearray_rewritten_during_append_never_reads_past_it(tmp_path):
    """The C core validates and copies without the GIL: a thread rewriting the lengths of a
    bytearray batch meanwhile gets MESSAGE_ILLEGAL errors or stored records, never a crash."""
    import random
    import threading

    data = bytearray(b"".join(entry(b"b" * 300, _props((b"TAGS", b"t"))) for _ in range(200)))
    stop = threading.Event()

    def scribble():
        rnd = random.Random(1)
        while not stop.is_set():
            i = rnd.randrange(200) * len(entry(b"b" * 300, _props((b"TAGS", b"t"))))
            data[i:i + 6] = rnd.choice([b"\xff\xff\xff\x7f\xff\xff", PACKED_ENTRY.pack(300, 15, 0, 0)[:6]])

    outcomes = set()
    with _open(IMPLS["native"], tmp_path, segment_size=1 << 22) as log:
        t = threading.Thread(target=scribble)
        t.start()
        try:
            for _ in range(300):
                out = _outcome(log.append_packed, "T", 0, data, 200)
                outcomes.add(out[0] if out[0] != "StoreError" else out[1])
        finally:
            stop.set()
            t.join()
        nxt, count, raw = log.read_packed("T", 0, 0, 10**6)
        assert len(IMPLS["native"].decode_records(raw, "b", lambda *a: a, bytes)) == count
    assert outcomes <= {"ok", "MESSAGE_ILLEGAL"}
