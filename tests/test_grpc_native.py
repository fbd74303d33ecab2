"""The C SendMessage codecs of the gRPC endpoint against the protobuf runtime and the Python packer.

``pack_request`` (C, from the request's bytes) must pack exactly what ``pack_plain`` (Python, from
parsed protobuf objects) packs for every request it takes, and take none that ``pack_plain`` would
refuse; ``encode_v2_send_response`` must write what protobuf would.
"""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2, service_pb2

from sparkmq.api.grpc import convert
from sparkmq.storage_native import IMPL, decode_batch, encode_v2_send_response

pytestmark = pytest.mark.skipif(IMPL != "native", reason="the v2 codecs are C only")

PREFIX = "0123456789ABCDEF0123"
MONTH = 1_790_000_000_000
MAX_BODY = 4096


class FixedIds:
    """A UniqueIdGenerator stand-in: the same prefix, month and counter for both packers."""

    def __init__(self) -> None:
        self.counter = 7
        self.calls = 0

    def with_state(self, now_ms: int, encode: Any) -> Any:
        self.calls += 1
        result = encode(PREFIX, MONTH, self.counter)
        self.counter = result[-1] & 0xFFFF
        return result


def _message(topic: str = "Orders", body: bytes = b"body", **system: Any) -> definition_pb2.Message:
    user = system.pop("user", {})
    namespace = system.pop("namespace", "")
    msg = definition_pb2.Message(body=body, user_properties=user)
    msg.topic.name = topic
    msg.topic.resource_namespace = namespace
    sp = msg.system_properties
    born = system.pop("born", 1_790_000_123_456)
    if born is not None:
        sp.born_timestamp.FromMilliseconds(born)
    for name, value in system.items():
        if name == "keys":
            sp.keys.extend(value)
        elif name == "delivery_ms":
            sp.delivery_timestamp.FromMilliseconds(value)
        else:
            setattr(sp, name, value)
    return msg


def _request(*messages: definition_pb2.Message) -> bytes:
    return service_pb2.SendMessageRequest(messages=messages).SerializeToString()


def _both(raw: bytes, namespace: str = "") -> tuple[Any, Any]:
    """What each packer makes of ``raw``: (topic, msg_ids, entries) or None; the properties as a dict,
    since a protobuf map's order is not the wire's."""
    parsed = service_pb2.SendMessageRequest.FromString(raw)
    python = convert.pack_plain(parsed.messages, namespace, MAX_BODY, FixedIds()) if len(parsed.messages) > 1 \
        else None
    return _view(convert.pack_request(raw, namespace, MAX_BODY, FixedIds())), _view(python)


def _view(packed: convert.PackedSend | None) -> Any:
    if packed is None:
        return None
    entries = decode_batch(packed.data, len(packed.msg_ids))
    return packed.topic, packed.msg_ids, [(body, _props(props), flag, born) for body, props, flag, born in entries]


def _props(encoded: Any) -> Any:
    if isinstance(encoded, dict):
        return encoded
    text = encoded.decode() if isinstance(encoded, bytes) else encoded
    return dict(pair.split("\x01", 1) for pair in text.split("\x02") if pair)


def test_a_plain_batch_packs_exactly_as_the_python_packer() -> None:
    raw = _request(_message(tag="TagA", keys=["k1", "k2"], message_id="PRODUCER-ID-1", user={"a": "1", "b": "é"}),
                   _message(body=b"\x00\x01two", user={}),  # no id: a fresh one from the generator's state
                   _message(tag="", keys=[], message_id="", body=b"x" * MAX_BODY))
    native, python = _both(raw)
    assert native is not None and python is not None
    assert native == python
    topic, msg_ids, entries = native
    assert topic == "Orders" and [e[0] for e in entries] == [b"body", b"\x00\x01two", b"x" * MAX_BODY]
    assert entries[0][1] == {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "PRODUCER-ID-1", "a": "1", "b": "é"}
    assert msg_ids[0] == "PRODUCER-ID-1" and msg_ids[1].startswith(PREFIX) and msg_ids[1] != msg_ids[2]
    assert entries[1][1] == {"UNIQ_KEY": msg_ids[1]} and entries[0][3] == 1_790_000_123_456


def test_the_namespace_wraps_the_topic_as_the_python_packer_does() -> None:
    raw = _request(_message(namespace="ns1"), _message(namespace="ns1"))
    native, python = _both(raw)
    assert native == python and native is not None and native[0] == convert.wrap("ns1", "Orders")
    native, python = _both(raw, namespace="caller")
    assert native == python and native is not None and native[0] == convert.wrap("caller", "Orders")


@pytest.mark.parametrize("second", [
    _message(topic="Other"),  # another topic
    _message(namespace="other-ns"),
    _message(message_type=definition_pb2.MessageType.FIFO, message_group="g1"),
    _message(message_group="g1"),
    _message(message_type=definition_pb2.MessageType.DELAY, delivery_ms=1_790_000_200_000),
    _message(message_type=definition_pb2.MessageType.TRANSACTION),
    _message(body_encoding=definition_pb2.Encoding.GZIP),
    _message(body=b""),
    _message(body=b"x" * (MAX_BODY + 1)),
    _message(user={"UNIQ_KEY": "forged"}),  # a reserved property name
    _message(user={"TAGS": "forged"}),
    _message(user={"": "empty name"}),
    _message(user={"a\x01": "separator"}),
    _message(keys=["has space"]),
    _message(keys=[""]),
    _message(keys=["ключ"]),  # non-ASCII: C leaves it to the per-message path
    _message(tag="a||b"),
    _message(tag=" padded"),
    _message(message_id="has space"),
    _message(message_id="x" * 129),
], ids=lambda m: str(m).replace("\n", " ")[:60])
def test_what_the_fast_path_does_not_take_goes_to_the_per_message_path(second: definition_pb2.Message) -> None:
    ids = FixedIds()
    assert convert.pack_request(_request(_message(), second), "", MAX_BODY, ids) is None
    assert ids.counter == 7, "a refused request uses no ids"


def test_single_messages_and_bytes_that_are_not_a_request_are_left_alone() -> None:
    ids = FixedIds()
    assert convert.pack_request(_request(_message()), "", MAX_BODY, ids) is None
    for raw in (b"", b"\xff\xff\xff", _request(_message(), _message())[:-3], b"\x0a\x05\x0a\x03\x0a\x01"):
        assert convert.pack_request(raw, "", MAX_BODY, ids) is None
    assert ids.calls <= 1


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_hand_made_wire_that_protobuf_reads_differently_is_not_packed() -> None:
    one = _message().SerializeToString()
    entry = _field(1, b"k") + _field(2, b"v")
    repeated_name = one + _field(2, entry) + _field(2, _field(1, b"k") + _field(2, b"w"))
    bad_utf8 = one + _field(2, _field(1, b"k") + _field(2, b"\xc3\x28"))
    for second in (repeated_name, bad_utf8):
        raw = _field(1, one) + bytes([0x0A]) + _varint(len(second)) + second
        assert convert.pack_request(raw, "", MAX_BODY, FixedIds()) is None


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


texts = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({
    "body": st.binary(min_size=1, max_size=64),
    "tag": st.one_of(st.just(""), texts.filter(lambda t: "||" not in t)),
    "keys": st.lists(texts, max_size=3),
    "message_id": st.one_of(st.just(""), texts),
    "user": st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda t: "\x01" not in t and "\x02" not in t),
                            st.text(max_size=8).filter(lambda t: "\x01" not in t and "\x02" not in t), max_size=3),
}), min_size=2, max_size=6))
def test_any_plain_batch_packs_as_the_python_packer(messages: list[dict[str, Any]]) -> None:
    raw = _request(*(_message(**m) for m in messages))
    native, python = _both(raw)
    if python is None:  # a reserved user property name, most likely: both refuse
        assert native is None
    else:
        assert native == python


@pytest.mark.parametrize(("code", "message", "first"), [(20000, "OK", 0), (20000, "OK", 12345678901),
                                                        (0, "", 3), (40401, "topic gone", 9)])
def test_the_response_is_what_protobuf_writes(code: int, message: str, first: int) -> None:
    ids = ["A" * 32, "PRODUCER-ID-1", ""]
    raw = encode_v2_send_response(code, message, ids, first)
    status = definition_pb2.Status(code=code, message=message)
    expected = service_pb2.SendMessageResponse(status=status)
    for i, msg_id in enumerate(ids):
        expected.entries.add(message_id=msg_id, offset=first + i).status.CopyFrom(status)
    assert service_pb2.SendMessageResponse.FromString(raw) == expected
    assert raw == expected.SerializeToString()
