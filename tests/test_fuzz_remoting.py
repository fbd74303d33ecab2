"""Bad input proven harmless over remoting (issue 14): hypothesis at a real broker's remoting port.

Beyond the random and broken frames of ``test_broker_remoting.py``, these frames are well formed and carry
headers built from each request code's own header type (``platform.common.protocol``): every field present or
not, of its type or not, at and past its limits (names, queue ids, offsets, counts, waits), with packed batch
bodies intact or mutated.  They reach the processors.  The broker must answer every request with success or a
known error code (never INTERNAL_ERROR), or close the connection for a frame it cannot read, and a refused
request must leave the commit log as it was; a well-behaved client keeps working, and the broker logs no
unhandled exception.  Bounded: a few hundred frames, well under a minute.
"""
from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from procs import ProcessHarness, ServiceProcess
from sparkmq.platform.common import protocol as p
from sparkmq.platform.common.errors import ErrorCode
from sparkmq.platform.common.message import Message
from sparkmq.platform.common.protocol import RESPONSE_SUCCESS, RequestCode
from sparkmq.platform.remoting import FrameDecoder, SyncRemotingClient, encode_frame
from sparkmq.storage_native import encode_batch

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(240)]

#: The header type of every request code the broker serves.
HEADERS: dict[RequestCode, type[msgspec.Struct]] = {
    RequestCode.SEND_MESSAGE: p.SendRequest, RequestCode.SEND_BATCH: p.SendBatchRequest,
    RequestCode.SEND_HALF: p.SendRequest, RequestCode.END_TRANSACTION: p.EndTransactionRequest,
    RequestCode.PULL_MESSAGE: p.PullRequest, RequestCode.QUEUE_OFFSETS: p.QueueOffsetsRequest,
    RequestCode.HEARTBEAT: p.HeartbeatRequest, RequestCode.UNREGISTER_CLIENT: p.UnregisterRequest,
    RequestCode.COMMIT_OFFSETS: p.CommitOffsetsRequest, RequestCode.QUERY_OFFSET: p.QueryOffsetRequest,
    RequestCode.GROUP_INFO: p.GroupInfoRequest, RequestCode.LOCK_QUEUES: p.LockRequest,
    RequestCode.UNLOCK_QUEUES: p.LockRequest, RequestCode.SEND_BACK: p.SendBackRequest,
    RequestCode.POST_TRACE: p.PostTraceRequest,
}
#: Codes whose success writes to the commit log (the others never may).
WRITES = {RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH, RequestCode.SEND_HALF, RequestCode.END_TRANSACTION,
          RequestCode.SEND_BACK}
TOPIC, GROUP = "Fuzz", "fuzz-group"


@pytest.fixture(scope="module")
def broker(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One broker (no name server needed): nothing it accepted writes later (delay levels of a day, timers due
    at most 1 ms ahead, no trace), and pulls are held at most 100 ms."""
    service = module_procs.start(
        "broker", "sparkmq.api.broker_main", "--data-dir", str(tmp_path_factory.mktemp("fuzz-remoting") / "data"),
        "--no-trace", "--long-polling-max-ms", "100", "--message-delay-level", "1d 2d", "--timer-max-delay-s",
        "0.001", "--transaction-check-first-s", "3600")
    httpx.post(f"{service.url}/topics", json={"topic": TOPIC, "read_queue_nums": 2, "write_queue_nums": 2},
               timeout=10).raise_for_status()
    info = httpx.get(f"{service.url}/broker", timeout=5).json()
    return {"service": service, "url": service.url, "remoting": info["remoting_addr"]}


def _max_offset(url: str) -> int:
    return int(httpx.get(f"{url}/broker", timeout=5).json()["commitlog"]["max_offset"])


# -- headers from the header types ---------------------------------------------------------------------
_NAMES = st.sampled_from([TOPIC, GROUP, "%RETRY%fuzz-group", "%DLQ%fuzz-group", "", "bad name", "t" * 128, "g" * 121,
                          "a\n", "x|y%z", "RMQ_SYS_TRACE_TOPIC", "SCHEDULE_TOPIC_XXXX", "client-1"])
_INTS = st.one_of(st.integers(-2, 40), st.sampled_from([2**31 - 1, 2**31, 2**53, 2**63 - 1, -(2**63), 2**64 - 1,
                                                         p.MAX_LONG_POLL_MS, p.MAX_LONG_POLL_MS + 1, 1024, 16384]),
                  st.integers(-(2**63), 2**64 - 1))
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=20),
                 st.binary(max_size=20), st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3),
                 st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**64 - 1), max_size=2))


def _of_type(info: msgspec.inspect.Type, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of a msgspec type (with, now and then, a value of another type)."""
    ti = msgspec.inspect
    if isinstance(info, ti.IntType):
        typed: st.SearchStrategy[Any] = _INTS
    elif isinstance(info, ti.StrType):
        typed = st.one_of(_NAMES, st.text(max_size=30))
    elif isinstance(info, ti.BoolType):
        typed = st.booleans()
    elif isinstance(info, ti.FloatType):
        typed = st.floats()
    elif isinstance(info, ti.BytesType):
        typed = st.binary(max_size=40)
    elif isinstance(info, ti.NoneType):
        typed = st.none()
    elif isinstance(info, ti.UnionType):
        typed = st.one_of([_of_type(t, depth) for t in info.types])
    elif isinstance(info, ti.ListType | ti.VarTupleType):
        typed = st.lists(_of_type(info.item_type, depth + 1), max_size=0 if depth > 2 else 3)
    elif isinstance(info, ti.DictType):
        typed = st.dictionaries(_of_type(info.key_type, depth + 1), _of_type(info.value_type, depth + 1), max_size=3)
    elif isinstance(info, ti.StructType):
        typed = _struct(info, depth + 1)
    elif isinstance(info, ti.LiteralType):
        typed = st.sampled_from(list(info.values))
    elif isinstance(info, ti.EnumType):
        typed = st.sampled_from([m.value for m in info.cls])
    else:  # Any, and whatever else: anything
        typed = _ANY
    # A field of the wrong type one time in ten: most headers decode and reach the processor.
    return st.integers(0, 9).flatmap(lambda n: _ANY if n == 0 else typed) if depth == 0 else typed


def _struct(info: msgspec.inspect.StructType, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """A map with the struct's required fields (usually) and some of its optional ones, plus now and then a
    field it does not have."""
    required = {f.encode_name: _of_type(f.type, depth) for f in info.fields if f.required}
    optional = {f.encode_name: _of_type(f.type, depth) for f in info.fields if not f.required}
    header = st.fixed_dictionaries(required, optional=optional)
    odd = st.one_of(header.map(lambda h: {**h, "surprise": 1}), st.fixed_dictionaries({}, optional={**required,
                                                                                                 **optional}))
    return st.integers(0, 7).flatmap(lambda n: odd if n == 0 else header)


def _packed(messages: list[Message]) -> bytes:
    return encode_batch(messages, "7F000001000000000000", 0, 0, int(time.time() * 1000))[0]


_GOOD_BATCH = _packed([Message(TOPIC, b"fuzz one", tags="A"), Message(TOPIC, b"fuzz two", keys=("k",))])


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    """A frame body: empty, random, a packed batch, or a packed batch with bytes changed or cut off."""
    kind = draw(st.sampled_from(["empty", "random", "batch", "mutated", "cut"]))
    if kind == "empty":
        return b""
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=300))
    if kind == "batch":
        return _GOOD_BATCH
    data = bytearray(_GOOD_BATCH)
    if kind == "cut":
        return bytes(data[:draw(st.integers(0, len(data) - 1))])
    for _ in range(draw(st.integers(1, 6))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@st.composite
def requests(draw: st.DrawFn) -> tuple[RequestCode, bytes, bytes]:
    """(code, header, body) of a well-formed request frame of a served code."""
    code = draw(st.sampled_from(sorted(HEADERS)))
    info = msgspec.inspect.type_info(HEADERS[code])
    header = draw(_struct(info))
    raw = msgspec.msgpack.encode(header)
    if draw(st.integers(0, 9)) == 0 and raw:  # a byte of the msgpack changed
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1:]
    return code, raw, draw(_bodies())


def _frame(code: int, header: bytes, body: bytes, opaque: int) -> bytes:
    data = encode_frame(0, code, opaque, header, body)
    return data if isinstance(data, bytes) else b"".join(bytes(b) for b in data)


def _answer(addr: str, data: bytes, timeout: float = 5.0) -> Any:
    """The broker's answer frame to one request sent on a fresh connection, or None when it closed it."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        decoder = FrameDecoder()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return None
            except TimeoutError:
                break
            if not chunk:
                return None
            frames = decoder.feed(chunk)
            if frames:
                return frames[0]
    raise AssertionError("the broker neither answered nor closed the connection")


def _still_serving(addr: str) -> None:
    with SyncRemotingClient(on_push=None) as good:
        answer = good.request(addr, RequestCode.QUEUE_OFFSETS, msgspec.msgpack.encode(p.QueueOffsetsRequest(TOPIC, 0)))
    assert answer.code == RESPONSE_SUCCESS


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(request=requests(), opaque=st.integers(0, 2**32 - 1))
def test_typed_headers_get_an_answer_with_a_known_code(broker: dict[str, Any],
                                                       request: tuple[RequestCode, bytes, bytes], opaque: int) -> None:
    url, addr = broker["url"], broker["remoting"]
    code, header, body = request
    before = _max_offset(url)
    reply = _answer(addr, _frame(code, header, body, opaque))
    assert reply is not None, f"{code.name}: a well-formed frame got the connection closed"
    assert reply.is_response and reply.opaque == opaque
    if reply.code == RESPONSE_SUCCESS:
        event(f"{code.name} ok")
    else:
        known = ErrorCode.from_remoting_code(reply.code)
        assert known is not None, f"{code.name}: unknown error code {reply.code}"
        assert known is not ErrorCode.INTERNAL_ERROR, f"{code.name}: {msgspec.msgpack.decode(reply.header)}"
        event(f"{code.name} {known.name}")
        assert _max_offset(url) == before, f"{code.name} was refused ({known.name}) but changed the commit log"
    if code not in WRITES:
        assert _max_offset(url) == before, f"{code.name} changed the commit log"


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(min_size=1, max_size=64), cut=st.integers(1, 40), code=st.sampled_from(sorted(HEADERS)))
def test_mutated_frames_are_answered_or_closed_and_the_broker_keeps_serving(broker: dict[str, Any], data: bytes,
                                                                           cut: int, code: RequestCode) -> None:
    """A valid request's frame with its prefix overwritten by random bytes, then cut: answered, closed, or
    waited on (an incomplete frame) -- and another client is served throughout."""
    url, addr = broker["url"], broker["remoting"]
    before = _max_offset(url)
    good = _frame(code, msgspec.msgpack.encode({"topic": TOPIC, "queue_id": 0, "offset": 0, "count": 2}),
                  _GOOD_BATCH, 7)
    broken = (data + good[len(data):])[:max(cut, len(good) - cut)]
    try:
        reply = _answer(addr, broken, timeout=0.3)
        if reply is not None and reply.code != RESPONSE_SUCCESS:
            assert ErrorCode.from_remoting_code(reply.code) not in (None, ErrorCode.INTERNAL_ERROR), reply
            assert _max_offset(url) == before
    except AssertionError as exc:  # an incomplete frame: the broker waits for the rest
        if "neither" not in str(exc):
            raise
    _still_serving(addr)


def test_zz_the_broker_survived_and_logged_nothing_unhandled(broker: dict[str, Any]) -> None:
    _still_serving(broker["remoting"])
    service: ServiceProcess = broker["service"]
    assert service.proc.poll() is None
    log = service.log()
    for marker in ("Traceback", "unexpected error", "Unhandled"):
        assert marker not in log, log[-6000:]


@pytest.mark.parametrize("code", sorted(HEADERS), ids=lambda c: c.name)
def test_a_header_string_that_is_not_utf8_is_invalid_argument(broker: dict[str, Any], code: RequestCode) -> None:
    """Found by the fuzzer: msgspec raises UnicodeDecodeError (not DecodeError) for such a string, which the
    broker answered INTERNAL_ERROR."""
    name = msgspec.structs.fields(HEADERS[code])[0].encode_name.encode()
    header = bytes([0x81, 0xA0 | len(name)]) + name + b"\xa2\xff\xfe"  # {name: a 2-byte str that is not UTF-8}
    reply = _answer(broker["remoting"], _frame(code, header, b"x", 9))
    assert reply is not None and ErrorCode.from_remoting_code(reply.code) is ErrorCode.INVALID_ARGUMENT, reply
    assert "bad" in msgspec.msgpack.decode(reply.header)["message"]
