"""Bad input proven harmless over remoting (issue 14, then RocketMQ's protocol): hypothesis at a real broker's port.

Beyond the random and broken frames of ``test_broker_remoting.py``, these frames are well formed and carry
extFields built from each request code's own header type (``platform.common.protocol``): every field present or
not, as the string RocketMQ's clients send or as a raw JSON value (as ali-ons sends them), of its type or not, at and
past its limits (names, queue ids, offsets, counts, waits), with JSON bodies built from the body types, and batch
bodies (sparkmq's packed and RocketMQ's) intact or mutated; in JSON or in ROCKETMQ binary headers.  They reach the
processors.  The broker must answer every request with success, an outcome or a known error code (never
INTERNAL_ERROR), or close the connection for a frame it cannot read; a refused request must leave the commit log as
it was; a well-behaved client keeps working, and the broker logs no unhandled exception.  Bounded: a few hundred
frames, well under a minute.
"""
from __future__ import annotations

import socket
import struct
import time
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rocketmq_wire import batch_body, props

from procs import ProcessHarness, ServiceProcess
from sparkmq.platform.common import protocol as p
from sparkmq.platform.common.errors import ErrorCode
from sparkmq.platform.common.message import Message
from sparkmq.platform.common.protocol import RESPONSE_SUCCESS, RequestCode
from sparkmq.platform.remoting import Frame, FrameDecoder, SyncRemotingClient, encode_rocketmq_header
from sparkmq.storage_native import encode_batch

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(240)]

C = RequestCode
#: The header type of every request code the broker serves (RocketMQ's and sparkmq's own).
HEADERS: dict[RequestCode, type[msgspec.Struct]] = {
    C.SEND_MESSAGE: p.SendMessageRequestHeader, C.SEND_MESSAGE_V2: p.SendMessageRequestHeaderV2,
    C.SEND_BATCH_MESSAGE: p.SendMessageRequestHeaderV2, C.SPARKMQ_SEND_PACKED: p.SendPackedRequestHeader,
    C.CONSUMER_SEND_MSG_BACK: p.ConsumerSendMsgBackRequestHeader, C.END_TRANSACTION: p.EndTransactionRequestHeader,
    C.PULL_MESSAGE: p.PullMessageRequestHeader, C.LITE_PULL_MESSAGE: p.PullMessageRequestHeader,
    C.SPARKMQ_PULL_PACKED: p.PullMessageRequestHeader, C.GET_MAX_OFFSET: p.QueueRequestHeader,
    C.GET_MIN_OFFSET: p.QueueRequestHeader, C.GET_EARLIEST_MSG_STORETIME: p.QueueRequestHeader,
    C.SPARKMQ_QUEUE_OFFSETS: p.QueueRequestHeader, C.SEARCH_OFFSET_BY_TIMESTAMP: p.SearchOffsetRequestHeader,
    C.HEART_BEAT: p.ExtHeader, C.UNREGISTER_CLIENT: p.UnregisterClientRequestHeader,
    C.GET_CONSUMER_LIST_BY_GROUP: p.ConsumerGroupRequestHeader, C.SPARKMQ_GROUP_INFO: p.ConsumerGroupRequestHeader,
    C.QUERY_CONSUMER_OFFSET: p.QueryConsumerOffsetRequestHeader,
    C.UPDATE_CONSUMER_OFFSET: p.UpdateConsumerOffsetRequestHeader, C.SPARKMQ_UPDATE_CONSUMER_OFFSETS: p.ExtHeader,
    C.LOCK_BATCH_MQ: p.ExtHeader, C.UNLOCK_BATCH_MQ: p.ExtHeader,
    C.GET_CONSUMER_RUNNING_INFO: p.ConsumerRunningInfoRequestHeader, C.QUERY_MESSAGE: p.QueryMessageRequestHeader,
    C.VIEW_MESSAGE_BY_ID: p.ViewMessageRequestHeader, C.SPARKMQ_POST_TRACE: p.ExtHeader,
}
#: The JSON body type of the codes that carry one.
BODIES: dict[RequestCode, type[msgspec.Struct]] = {
    C.HEART_BEAT: p.HeartbeatData, C.SPARKMQ_UPDATE_CONSUMER_OFFSETS: p.UpdateConsumerOffsetsBody,
    C.LOCK_BATCH_MQ: p.LockBatchRequestBody, C.UNLOCK_BATCH_MQ: p.LockBatchRequestBody,
    C.SPARKMQ_POST_TRACE: p.PostTraceBody,
}
#: Codes whose success writes to the commit log (the others never may).
WRITES = {C.SEND_MESSAGE, C.SEND_MESSAGE_V2, C.SEND_BATCH_MESSAGE, C.SPARKMQ_SEND_PACKED, C.CONSUMER_SEND_MSG_BACK,
          C.END_TRANSACTION}
#: Answers that are outcomes, not errors: a send's durability, a pull's, a query's "none".
OUTCOMES = {0, 10, 11, 12, 19, 20, 21, 22}
TOPIC, GROUP = "Fuzz", "fuzz-group"


@pytest.fixture(scope="module")
def broker(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One broker (no name server needed): nothing it accepted writes later (delay levels of a day, timers due
    at most 1 ms ahead, no trace), and pulls are held at most 100 ms."""
    service = module_procs.start(
        "broker", "sparkmq.api.broker_main", "--data-dir", str(tmp_path_factory.mktemp("fuzz-remoting") / "data"),
        "--no-trace", "--long-polling-max-ms", "100", "--message-delay-level", "1d 2d", "--timer-max-delay-s",
        "0.001", "--transaction-check-first-s", "3600", "--ha-port", "-1")
    httpx.post(f"{service.url}/topics", json={"topic": TOPIC, "read_queue_nums": 2, "write_queue_nums": 2},
               timeout=10).raise_for_status()
    info = httpx.get(f"{service.url}/broker", timeout=5).json()
    return {"service": service, "url": service.url, "remoting": info["remoting_addr"]}


def _max_offset(url: str) -> int:
    return int(httpx.get(f"{url}/broker", timeout=5).json()["commitlog"]["max_offset"])


# -- headers and bodies from their types -----------------------------------------------------------------
_NAMES = st.sampled_from([TOPIC, GROUP, "%RETRY%fuzz-group", "%DLQ%fuzz-group", "", "bad name", "t" * 128, "g" * 121,
                          "a\n", "x|y%z", "RMQ_SYS_TRACE_TOPIC", "SCHEDULE_TOPIC_XXXX", "client-1", "TBW102"])
_INTS = st.one_of(st.integers(-2, 40), st.sampled_from([2**31 - 1, 2**31, 2**53, 2**63 - 1, -(2**63), 2**64 - 1,
                                                         p.MAX_LONG_POLL_MS, p.MAX_LONG_POLL_MS + 1, 1024, 16384]),
                  st.integers(-(2**63), 2**64 - 1))
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
                 st.text(max_size=20), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
                 st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=2))
_PROPS = st.one_of(st.just(""), st.builds(lambda d: props(d), st.dictionaries(
    st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "DELAY", "TRAN_MSG", "PGROUP", "TIMER_DELAY_MS", "TIMER_DELIVER_MS",
                     "WAIT", "color", ""]), st.one_of(_NAMES, st.sampled_from(["true", "1", "3", "-1", "99999"])),
    max_size=4)), st.text(max_size=30))


def _of_type(info: msgspec.inspect.Type, name: str = "", depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of a msgspec type (with, now and then, a value of another type)."""
    ti = msgspec.inspect
    if name in ("properties", "i"):
        typed: st.SearchStrategy[Any] = _PROPS
    elif isinstance(info, ti.IntType):
        typed = _INTS
    elif isinstance(info, ti.StrType):
        typed = st.one_of(_NAMES, st.text(max_size=30))
    elif isinstance(info, ti.BoolType):
        typed = st.booleans()
    elif isinstance(info, ti.FloatType):
        typed = st.floats(allow_nan=False)
    elif isinstance(info, ti.NoneType):
        typed = st.none()
    elif isinstance(info, ti.UnionType):
        typed = st.one_of([_of_type(t, name, depth) for t in info.types])
    elif isinstance(info, ti.ListType | ti.VarTupleType):
        typed = st.lists(_of_type(info.item_type, "", depth + 1), max_size=0 if depth > 2 else 3)
    elif isinstance(info, ti.DictType):
        typed = st.dictionaries(_of_type(info.key_type, "", depth + 1), _of_type(info.value_type, "", depth + 1),
                                max_size=3)
    elif isinstance(info, ti.StructType):
        typed = _struct(info, depth + 1)
    else:  # Any, and whatever else: anything
        typed = _ANY
    # A field of the wrong type one time in ten: most requests decode and reach the processor.
    return st.integers(0, 9).flatmap(lambda n: _ANY if n == 0 else typed) if depth == 0 else typed


def _struct(info: msgspec.inspect.StructType, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """A map with the struct's required fields (usually) and some of its optional ones, plus now and then a
    field it does not have."""
    required = {f.encode_name: _of_type(f.type, f.encode_name, depth) for f in info.fields if f.required}
    optional = {f.encode_name: _of_type(f.type, f.encode_name, depth) for f in info.fields if not f.required}
    header = st.fixed_dictionaries(required, optional=optional)
    odd = st.one_of(header.map(lambda h: {**h, "surprise": 1}), st.fixed_dictionaries({}, optional={**required,
                                                                                                 **optional}))
    return st.integers(0, 7).flatmap(lambda n: odd if n == 0 else header)


def _text(value: Any) -> Any:
    """An extFields value as RocketMQ's Java client writes it (a string); other JSON values stay (ali-ons)."""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    return value


def _packed(messages: list[Message]) -> bytes:
    return encode_batch(messages, "7F000001000000000000", 0, 0, int(time.time() * 1000))[0]


_GOOD_PACKED = _packed([Message(TOPIC, b"fuzz one", tags="A"), Message(TOPIC, b"fuzz two", keys=("k",))])
_GOOD_ROCKETMQ_BATCH = batch_body([(b"fuzz one", props({"UNIQ_KEY": "F1", "TAGS": "A"}), 0),
                                   (b"fuzz two", props({"UNIQ_KEY": "F2"}), 0)])


@st.composite
def _bodies(draw: st.DrawFn, code: RequestCode) -> bytes:
    """A frame body: empty, random, the code's JSON body, a batch, or a batch with bytes changed or cut off."""
    kind = draw(st.sampled_from(["empty", "random", "json", "batch", "mutated", "cut"]))
    if kind == "empty":
        return b""
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=300))
    if kind == "json":
        kind_of = BODIES.get(code)
        if kind_of is None:
            return draw(st.binary(min_size=1, max_size=40))
        return msgspec.json.encode(draw(_struct(msgspec.inspect.type_info(kind_of))))
    good = _GOOD_ROCKETMQ_BATCH if code == C.SEND_BATCH_MESSAGE else _GOOD_PACKED
    if kind == "batch":
        return good
    data = bytearray(good)
    if kind == "cut":
        return bytes(data[:draw(st.integers(0, len(data) - 1))])
    for _ in range(draw(st.integers(1, 6))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@st.composite
def requests(draw: st.DrawFn) -> tuple[RequestCode, dict[str, Any], bytes, bool]:
    """(code, extFields, body, binary header) of a well-formed request frame of a served code."""
    code = draw(st.sampled_from(sorted(HEADERS)))
    ext = {k: _text(v) for k, v in draw(_struct(msgspec.inspect.type_info(HEADERS[code]))).items()}
    binary = draw(st.integers(0, 4)) == 0
    if binary:  # the ROCKETMQ header carries strings only
        ext = {k: v if isinstance(v, str) else msgspec.json.encode(v).decode() for k, v in ext.items()}
    return code, ext, draw(_bodies(code)), binary


def _frame(code: int, ext: dict[str, Any], body: bytes, opaque: int, binary: bool = False) -> bytes:
    if binary:
        header = encode_rocketmq_header(code, 0, opaque, ext, language=0)
        return struct.pack(">iI", 4 + len(header) + len(body), (1 << 24) | len(header)) + header + body
    fields = ",".join(f"{msgspec.json.encode(k).decode()}:{msgspec.json.encode(v).decode()}" for k, v in ext.items())
    header = (f'{{"code":{code},"language":"JAVA","version":479,"opaque":{opaque},"flag":0,'
              f'"extFields":{{{fields}}}}}').encode()
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


def _answer(addr: str, data: bytes, timeout: float = 5.0) -> Frame | None:
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
            if chunk.startswith(b"HTTP/"):  # a first byte that is no frame's: the port took it for HTTP
                return None
            frames = [f for f in decoder.feed(chunk) if f.is_response]
            if frames:
                return frames[0]
    raise AssertionError("the broker neither answered nor closed the connection")


def _known_error(reply: Frame) -> ErrorCode:
    """The stable error an error answer names (its errorCode, else its response code); fails for none."""
    named = ErrorCode.from_name((reply.ext or {}).get("errorCode")) or ErrorCode.from_remoting_code(reply.code)
    assert named is not None, f"unknown error code {reply.code}: {reply.remark}"
    return named


def _still_serving(addr: str) -> None:
    with SyncRemotingClient(on_push=None) as good:
        answer = good.request(addr, C.SPARKMQ_QUEUE_OFFSETS, p.QueueRequestHeader(TOPIC, 0))
    assert answer.code == RESPONSE_SUCCESS


def _survived(broker: dict[str, Any]) -> None:
    """The broker still serves, and its log shows nothing unhandled (run at the end of each fuzz test, on the broker
    that test fuzzed: no check may depend on test order or on which worker got which broker)."""
    _still_serving(broker["remoting"])
    service: ServiceProcess = broker["service"]
    assert service.proc.poll() is None
    log = service.log()
    for marker in ("Traceback", "unexpected error", "Unhandled"):
        assert marker not in log, log[-6000:]


def test_typed_headers_get_an_answer_with_a_known_code(broker: dict[str, Any]) -> None:
    url, addr = broker["url"], broker["remoting"]

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(request=requests(), opaque=st.integers(0, 2**31 - 1))
    def one(request: tuple[RequestCode, dict[str, Any], bytes, bool], opaque: int) -> None:
        code, ext, body, binary = request
        before = _max_offset(url)
        reply = _answer(addr, _frame(code, ext, body, opaque, binary))
        assert reply is not None, f"{code.name}: a well-formed frame got the connection closed"
        assert reply.is_response and reply.opaque == opaque
        if reply.code in OUTCOMES:
            event(f"{code.name} {reply.code}")
        else:
            known = _known_error(reply)
            assert known is not ErrorCode.INTERNAL_ERROR, f"{code.name}: {reply.remark}"
            event(f"{code.name} {known.name}")
            assert _max_offset(url) == before, f"{code.name} was refused ({known.name}) but changed the commit log"
        if code not in WRITES:
            assert _max_offset(url) == before, f"{code.name} changed the commit log"

    one()
    _survived(broker)


def test_mutated_frames_are_answered_or_closed_and_the_broker_keeps_serving(broker: dict[str, Any]) -> None:
    """A valid request's frame with its prefix overwritten by random bytes, then cut: answered, closed, or
    waited on (an incomplete frame) -- and another client is served throughout."""
    url, addr = broker["url"], broker["remoting"]

    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.binary(min_size=1, max_size=64), cut=st.integers(1, 40), code=st.sampled_from(sorted(HEADERS)))
    def one(data: bytes, cut: int, code: RequestCode) -> None:
        before = _max_offset(url)
        good = _frame(code, {"topic": TOPIC, "queueId": "0", "queueOffset": "0", "count": "2"}, _GOOD_PACKED, 7)
        broken = (data + good[len(data):])[:max(cut, len(good) - cut)]
        try:
            reply = _answer(addr, broken, timeout=0.3)
            if reply is not None and reply.code not in OUTCOMES:
                assert _known_error(reply) is not ErrorCode.INTERNAL_ERROR, reply
                assert _max_offset(url) == before
        except AssertionError as exc:  # an incomplete frame: the broker waits for the rest
            if "neither" not in str(exc):
                raise
        _still_serving(addr)

    one()
    _survived(broker)


@pytest.mark.parametrize("code", sorted(HEADERS), ids=lambda c: c.name)
def test_every_served_code_names_a_missing_field(broker: dict[str, Any], code: RequestCode) -> None:
    """A request without its extFields (or its body) is INVALID_ARGUMENT naming what is missing, never a crash."""
    fields = [f.encode_name for f in msgspec.structs.fields(HEADERS[code]) if f.required]
    reply = _answer(broker["remoting"], _frame(code, {}, b"", 9))
    assert reply is not None and reply.is_response
    if reply.code == RESPONSE_SUCCESS:  # nothing required (a SPARKMQ_POST_TRACE of no events)
        assert not fields and code not in WRITES
        return
    assert _known_error(reply) is ErrorCode.INVALID_ARGUMENT, (reply.code, reply.remark)
    if fields:
        assert fields[0] in reply.remark, reply.remark


def test_a_header_that_is_not_utf8_closes_only_that_connection(broker: dict[str, Any]) -> None:
    """JSON with a byte that is not UTF-8, or an unpaired surrogate escape: the header cannot be read, so the
    connection is closed (the next frame boundary is unknown); another client is served."""
    for header in (b'{"code":310,"extFields":{"b":"\xff\xfe"}}', b'{"code":310,"extFields":{"b":"\\udcff"}}'):
        data = struct.pack(">iI", 4 + len(header), len(header)) + header
        assert _answer(broker["remoting"], data) is None
    _still_serving(broker["remoting"])

