"""Bad input proven harmless over gRPC (issue 14): hypothesis sends raw request bytes to every method of a real
broker's ``apache.rocketmq.v2.MessagingService``, through a generic channel with no serializer.

The bytes are protobuf messages of the method's request type built field by field from its descriptor (any
field set or not, any value: names past their limits, negative and huge numbers, unknown enum values, odd
durations), those bytes mutated, or random bytes.  Every call must end in a gRPC status (a response whose
``status`` is not INTERNAL_ERROR, or a transport status other than UNKNOWN/INTERNAL), a refused request must
leave the commit log as it was, a well-formed call still works after, and the broker logs no unhandled
exception.  Bounded: a few hundred calls, well under a minute.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as Proto
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2, service_pb2  # a runtime dependency: imported, never skipped

from procs import ProcessHarness, ServiceProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(240)]

SERVICE = "apache.rocketmq.v2.MessagingService"
#: Every method the broker serves: name -> (request type, response type, kind).
METHODS: dict[str, tuple[type[Proto], type[Proto], str]] = {
    name: (getattr(service_pb2, f"{name}Request"), getattr(service_pb2, f"{name}Response"), "unary")
    for name in ("QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "AckMessage",
                 "ForwardMessageToDeadLetterQueue", "UpdateOffset", "GetOffset", "QueryOffset", "EndTransaction",
                 "NotifyClientTermination", "ChangeInvisibleDuration", "RecallMessage", "SyncLiteSubscription")}
METHODS["ReceiveMessage"] = (service_pb2.ReceiveMessageRequest, service_pb2.ReceiveMessageResponse, "stream")
METHODS["PullMessage"] = (service_pb2.PullMessageRequest, service_pb2.PullMessageResponse, "stream")
METHODS["Telemetry"] = (service_pb2.TelemetryCommand, service_pb2.TelemetryCommand, "bidi")
#: Transport statuses that mean the server failed rather than answered.
FAILED = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE}
TOPIC, GROUP = "Fuzz", "fuzz-group"
#: A call's deadline: a receive may be held (a long poll), which ends in DEADLINE_EXCEEDED here (a status).
DEADLINE_S = 2.0


@pytest.fixture(scope="module")
def target(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A name server and a broker serving gRPC; nothing it accepted writes later (no trace, delay levels of a
    day, timers due at most 1 ms ahead, transaction checks after an hour)."""
    data = tmp_path_factory.mktemp("fuzz-grpc") / "data"
    namesrv, broker = module_procs.start_platform(
        data, "--grpc-port", "0", "--no-trace", "--long-polling-max-ms", "200", "--message-delay-level", "1d 2d",
        "--timer-max-delay-s", "0.001", "--transaction-check-first-s", "3600")
    httpx.post(f"{broker.url}/topics", json={"topic": TOPIC, "read_queue_nums": 2, "write_queue_nums": 2},
               timeout=10).raise_for_status()

    def grpc_addr() -> str | None:
        live = httpx.get(f"{namesrv.url}/cluster", timeout=5).json()["live_brokers"]
        return next((info["grpc_addr"] for info in live.values() if info.get("grpc_addr")), None)
    addr = wait_until(grpc_addr, 20, "the broker registered with its gRPC endpoint")
    channel = grpc.insecure_channel(addr)
    try:
        yield {"broker": broker, "url": broker.url, "channel": channel}
    finally:
        channel.close()


def _max_offset(url: str) -> int:
    return int(httpx.get(f"{url}/broker", timeout=5).json()["commitlog"]["max_offset"])


# -- messages from descriptors --------------------------------------------------------------------------
_F = FieldDescriptor
_NAMES = st.sampled_from([TOPIC, GROUP, "", "bad name!", "t" * 300, "%RETRY%fuzz-group", "%DLQ%fuzz-group",
                          "RMQ_SYS_TRACE_TOPIC", "a\n", "ns%Fuzz"])
_INT64 = st.one_of(st.integers(-5, 50), st.sampled_from([2**31 - 1, 2**63 - 1, -(2**63)]),
                   st.integers(-(2**63), 2**63 - 1))
_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    _F.CPPTYPE_INT32: st.one_of(st.integers(-5, 50), st.integers(-(2**31), 2**31 - 1)),
    _F.CPPTYPE_INT64: _INT64,
    _F.CPPTYPE_UINT32: st.integers(0, 2**32 - 1),
    _F.CPPTYPE_UINT64: st.integers(0, 2**64 - 1),
    _F.CPPTYPE_DOUBLE: st.floats(allow_nan=True),
    _F.CPPTYPE_FLOAT: st.floats(width=32),
    _F.CPPTYPE_BOOL: st.booleans(),
    _F.CPPTYPE_STRING: st.one_of(_NAMES, st.text(max_size=30)),
}


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.cpp_type == _F.CPPTYPE_MESSAGE:
        return _message(field.message_type, depth + 1)
    if field.cpp_type == _F.CPPTYPE_ENUM:  # proto3 enums are open: unknown numbers too
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-3, 1000))
    if field.type == _F.TYPE_BYTES:
        return st.binary(max_size=64)
    return _SCALARS[field.cpp_type]


@st.composite
def _fill(draw: st.DrawFn, descriptor: Descriptor, depth: int) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for field in descriptor.fields:
        if depth > 3 and field.cpp_type == _F.CPPTYPE_MESSAGE or not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, item = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            values[field.name] = draw(st.dictionaries(_value(key, depth), _value(item, depth), max_size=3))
        elif field.is_repeated:
            values[field.name] = draw(st.lists(_value(field, depth), max_size=2))
        else:
            values[field.name] = draw(_value(field, depth))
    return values


def _message(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    return _fill(descriptor, depth)


def _build(kind: type[Proto], values: dict[str, Any]) -> Proto:
    """A message of ``kind`` from nested dicts (fields the dicts name; submessages recursively)."""
    message = kind()
    for name, value in values.items():
        field = kind.DESCRIPTOR.fields_by_name[name]
        target = getattr(message, name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for k, v in value.items():
                if value_field.message_type is not None:
                    target[k].CopyFrom(_build(_class_of(value_field), v))
                else:
                    target[k] = v
        elif field.is_repeated:
            for item in value:
                target.append(_build(_class_of(field), item) if field.message_type is not None else item)
        elif field.message_type is not None:
            target.CopyFrom(_build(_class_of(field), value))
        else:
            setattr(message, name, value)
    return message


def _class_of(field: FieldDescriptor) -> type[Proto]:
    return message_factory.GetMessageClass(field.message_type)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, bytes, tuple[tuple[str, str], ...]]:
    """(method, request bytes, metadata): a built request, the same bytes mutated, or random bytes."""
    name = draw(st.sampled_from(sorted(METHODS)))
    request_type = METHODS[name][0]
    how = draw(st.sampled_from(["built", "built", "mutated", "random"]))
    if how == "random":
        raw = draw(st.binary(max_size=200))
    else:
        try:
            raw = _build(request_type, draw(_message(request_type.DESCRIPTOR))).SerializeToString()
        except (ValueError, TypeError):  # a value protobuf refuses to hold (not the server's business)
            raw = draw(st.binary(max_size=200))
        if how == "mutated" and raw:
            data = bytearray(raw)
            for _ in range(draw(st.integers(1, 4))):
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            raw = bytes(data)
    metadata = draw(st.sampled_from([(), (("x-mq-client-id", "fuzz-client"),),
                                     (("x-mq-client-id", "fuzz-client"), ("x-mq-namespace", "ns"))]))
    return name, raw, metadata


def _statuses(target: dict[str, Any], name: str, raw: bytes, metadata: Any) -> list[Any]:
    """The ``status`` of each response the call got (a transport status raises grpc.RpcError)."""
    channel: grpc.Channel = target["channel"]
    _, response_type, kind = METHODS[name]
    path = f"/{SERVICE}/{name}"
    if kind == "unary":
        answers = [channel.unary_unary(path)(raw, metadata=metadata, timeout=DEADLINE_S)]
    elif kind == "stream":
        answers = list(channel.unary_stream(path)(raw, metadata=metadata, timeout=DEADLINE_S))
    else:
        answers = list(channel.stream_stream(path)(iter([raw]), metadata=metadata, timeout=DEADLINE_S))
    statuses = []
    for answer in answers:
        try:
            parsed = response_type.FromString(answer)
        except DecodeError as exc:
            raise AssertionError(f"{name}: the answer is not a {response_type.__name__}: {answer!r}") from exc
        if parsed.HasField("status"):
            statuses.append(parsed.status)
    return statuses


def test_raw_request_bytes_get_a_status_and_change_nothing_when_refused(target: dict[str, Any]) -> None:
    """Then, on the broker it fuzzed: a well-formed call works, and nothing went unhandled (checked here, not by
    a later test: no check may depend on test order or on which worker got which broker)."""
    url = target["url"]

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(call=calls())
    def one(call: tuple[str, bytes, Any]) -> None:
        name, raw, metadata = call
        before = _max_offset(url)
        try:
            statuses = _statuses(target, name, raw, metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            event(f"{name} transport {code.name}")
            assert code not in FAILED, f"{name}: {code} {exc.details()}"
            if code is not grpc.StatusCode.DEADLINE_EXCEEDED:  # a held receive may still deliver; nothing else writes
                assert _max_offset(url) == before
            return
        codes = [definition_pb2.Code.Name(s.code) if s.code in definition_pb2.Code.values() else s.code
                 for s in statuses]
        event(f"{name} {codes[:1]}")
        for status in statuses:
            assert status.code != definition_pb2.Code.INTERNAL_ERROR, f"{name}: {status.message}"
        if statuses and all(s.code != definition_pb2.Code.OK for s in statuses):
            assert _max_offset(url) == before, f"{name} was refused ({codes}) but changed the commit log"

    one()
    request = service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=TOPIC))
    statuses = _statuses(target, "QueryRoute", request.SerializeToString(), (("x-mq-client-id", "good"),))
    assert [s.code for s in statuses] == [definition_pb2.Code.OK]
    broker: ServiceProcess = target["broker"]
    assert broker.proc.poll() is None
    log = broker.log()
    for marker in ("Traceback", "failed\n", "Exception in callback"):
        assert marker not in log, log[-6000:]


@pytest.mark.parametrize("method", ["QueryRoute", "QueryAssignment"])
def test_route_queries_refuse_illegal_topics_and_escape_legal_ones(target: dict[str, Any], method: str) -> None:
    """Found by the fuzzer: a topic with "\\x00" broke the name-server URL (INTERNAL_ERROR), and one with "/"
    or "?" could have asked the name server another path."""
    kind = METHODS[method][0]
    metadata = (("x-mq-client-id", "good"),)
    for bad in ("a\x00b", "../cluster", "Fuzz?x=1", "t" * 300):
        request = kind(topic=definition_pb2.Resource(name=bad))
        statuses = _statuses(target, method, request.SerializeToString(), metadata)
        assert [s.code for s in statuses] == [definition_pb2.Code.ILLEGAL_TOPIC], (bad, statuses)
    legal = kind(topic=definition_pb2.Resource(name="%RETRY%no-such-group"))  # legal, with %: escaped, not found
    statuses = _statuses(target, method, legal.SerializeToString(), metadata)
    assert [s.code for s in statuses] == [definition_pb2.Code.TOPIC_NOT_FOUND], statuses
