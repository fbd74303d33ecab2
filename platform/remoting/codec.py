"""Frames of RocketMQ's remoting protocol (``docs/remoting.md``): encoding, incremental decoding, errors.

A frame is big-endian ``i32 length`` (everything after this field), ``i32`` whose top byte is the header's
serialize type (0 JSON, 1 ROCKETMQ binary) and whose low 24 bits are the header length, the header, the
body.  The header carries the request or response code, the sender's language and version, the ``opaque``
that pairs a response with its request, the flag bits (response, oneway), an optional ``remark`` (an error's
message) and ``extFields``: the typed header of the request (:mod:`sparkmq.platform.common.protocol`'s
``*Header`` structs) as a map of strings.

Both header encodings are read; this side always writes JSON (RocketMQ's own servers answer in their
configured type, JSON by default, and every RocketMQ client reads it).  The codec knows nothing of what
the codes mean.
"""
from __future__ import annotations

import struct
import types
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec

from ..common.errors import ErrorCode, SparkMQError
from ..common.protocol import (
    CLIENT_VERSION,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FRAME_PREFIX_SIZE,
    MAX_HEADER_BYTES,
    RESPONSE_SUCCESS,
    ExtHeader,
    LanguageCode,
    ResponseCode,
    SerializeType,
    ext_fields,
)
from ..common.validation import describe, error_code_of

__all__ = [
    "Frame",
    "FrameData",
    "FrameDecoder",
    "ProtocolError",
    "RemotingError",
    "Reply",
    "Response",
    "decode_header",
    "encode_frame",
    "encode_rocketmq_header",
    "error_from_frame",
    "error_reply",
    "unsupported_reply",
    "write_frame",
]

H = TypeVar("H", bound=ExtHeader)

# length, serialize type << 24 | header length -- one pack/unpack per frame.
_PREFIX = struct.Struct(">iI")
_pack_prefix = _PREFIX.pack
_unpack_prefix = _PREFIX.unpack_from
assert _PREFIX.size == FRAME_PREFIX_SIZE
_JSON = int(SerializeType.JSON)
_ROCKETMQ = int(SerializeType.ROCKETMQ)
#: Bodies up to this size are joined with the prefix into one bytes (one small copy, one write);
#: larger ones are handed to the transport as a separate buffer so they are never copied here.
_JOIN_MAX = 64 * 1024
#: Received bodies at least this large are memoryviews of the receive buffer instead of copies.
_VIEW_MIN = 16 * 1024

#: What :func:`encode_frame` returns: one ``bytes`` for ``transport.write`` or, for a large body,
#: a list of buffers for ``transport.writelines``.
FrameData = bytes | list[bytes | memoryview]


class ProtocolError(ValueError):
    """The peer broke the frame format; the receiver must close the connection (it cannot resync)."""


class RemotingError(SparkMQError):
    """The peer could not be reached or did not answer in time (code SERVICE_NOT_AVAILABLE).

    ``timed_out`` tells a timeout (the request may have been processed) from a refused
    or reset connection (it was not).
    """

    def __init__(self, addr: str, message: str, *, timed_out: bool = False) -> None:
        super().__init__(ErrorCode.SERVICE_NOT_AVAILABLE, f"{addr}: {message}")
        self.addr = addr
        self.timed_out = timed_out


def decode_header(ext: Mapping[str, Any] | None, kind: type[H], what: str = "") -> H:
    """``ext`` (a frame's extFields) as the header ``kind``, converting decimal and boolean strings;
    INVALID_ARGUMENT naming the field when a required one is missing or a value does not convert."""
    try:
        return msgspec.convert(ext or {}, kind, strict=False)
    except msgspec.ValidationError as exc:
        broken = _broken_constraint(ext or {}, kind)
        if broken is not None:  # a value of the right type beyond a named limit: the code the logic answers
            raise broken from None
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                           f"bad {what or kind.__name__} header: {exc}") from None


def _broken_constraint(ext: Mapping[str, Any], kind: type[ExtHeader]) -> SparkMQError | None:
    """The error of the first field of ``ext`` that converts to its bare type but breaks the constraint of its
    named type (``validation.TopicName``, ``QueueId``, ...), answered with that type's code; None when no field
    does (a missing field or a wrong type stays INVALID_ARGUMENT)."""
    for f in msgspec.structs.fields(kind):
        code = error_code_of(f.type)
        if code is None or f.encode_name not in ext:
            continue
        value = ext[f.encode_name]
        try:
            msgspec.convert(value, f.type, strict=False)
        except msgspec.ValidationError as exc:
            try:
                msgspec.convert(value, _bare(f.type), strict=False)
            except msgspec.ValidationError:
                continue
            return SparkMQError(code, f"{f.encode_name}: {describe(f.type)}, got {str(value)[:80]!r} ({exc})")
    return None


def _bare(tp: Any) -> Any:
    """``tp`` without its constraints (``Annotated[int, Meta(...)] | None`` -> ``int | None``)."""
    if get_origin(tp) in (Union, types.UnionType):
        return Union[tuple(_bare(a) for a in get_args(tp))]  # noqa: UP007  # built from a tuple
    return tp.__origin__ if get_origin(tp) is Annotated else tp


class Frame(msgspec.Struct, gc=False):
    """One received frame (a request, or a response seen by a client).

    ``ext`` is the header's extFields (values are strings from every RocketMQ client; a JSON header may
    carry numbers); ``body`` is ``bytes`` when small and a read-only ``memoryview`` of the receive buffer
    when large (no copy).  ``language`` is the :class:`LanguageCode` number.
    """

    code: int
    flag: int
    opaque: int
    ext: dict[str, Any] | None
    body: bytes | memoryview
    remark: str | None = None
    version: int = 0
    language: int = 0
    serialize: int = 0

    @property
    def is_response(self) -> bool:
        """True for a response, False for a request."""
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """True for a request that wants no response."""
        return bool(self.flag & FLAG_ONEWAY)

    def header_as(self, kind: type[H]) -> H:
        """The extFields as the header ``kind`` (INVALID_ARGUMENT when they are not one)."""
        return decode_header(self.ext, kind)

    def ext_text(self) -> dict[str, str]:
        """The extFields with every value as the string a RocketMQ client signed (``true``/``false`` for
        booleans, decimal for numbers)."""
        out: dict[str, str] = {}
        for key, value in (self.ext or {}).items():
            if isinstance(value, str):
                out[key] = value
            elif value is True or value is False:
                out[key] = "true" if value else "false"
            elif value is not None:
                out[key] = str(value)
        return out


#: A client's view of a response (any code: the caller decides which codes are outcomes and which errors).
Response = Frame


class Reply(msgspec.Struct, gc=False):
    """What a server handler answers: a response ``code`` (0 = success), its header (an :class:`ExtHeader` or
    a ready extFields map), body and remark."""

    code: int = RESPONSE_SUCCESS
    ext: ExtHeader | Mapping[str, str] | None = None
    body: bytes | memoryview = b""
    remark: str | None = None


class _JsonHeader(msgspec.Struct):
    code: int = 0
    language: str | int = "JAVA"
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    extFields: dict[str, Any] | None = None


class _JsonHeaderOut(msgspec.Struct, omit_defaults=True):
    code: int
    language: str
    version: int
    opaque: int
    flag: int
    remark: str | None = None
    extFields: Mapping[str, str] | None = None


_decode_json_header = msgspec.json.Decoder(_JsonHeader).decode
_encode_json = msgspec.json.Encoder().encode


def _json_header(code: int, flag: int, opaque: int, ext: ExtHeader | Mapping[str, str] | None,
                 remark: str | None, version: int, language: str) -> bytes:
    fields = ext_fields(ext) if isinstance(ext, ExtHeader) else ext
    return _encode_json(_JsonHeaderOut(code, language, version, opaque, flag, remark, fields or None))


def encode_frame(code: int, flag: int, opaque: int, ext: ExtHeader | Mapping[str, str] | None = None,
                 body: bytes | memoryview = b"", remark: str | None = None, *, version: int = CLIENT_VERSION,
                 language: str = "PYTHON") -> FrameData:
    """Encode one frame with a JSON header; returns ``bytes`` (small body) or a list of buffers (large body,
    not copied).  Pass the result to :func:`write_frame` (or ``transport.write`` / ``writelines`` by type).

    Example::

        >>> encode_frame(30000, 0, 7, version=479)[:8]
        b'\\x00\\x00\\x00L\\x00\\x00\\x00H'
    """
    header = _json_header(code, flag, opaque, ext, remark, version, language)
    hlen = len(header)
    blen = len(body)
    prefix = _pack_prefix(4 + hlen + blen, hlen)
    if blen <= _JOIN_MAX:
        return prefix + header + body
    return [prefix + header, body]


def encode_rocketmq_header(code: int, flag: int, opaque: int, ext: Mapping[str, str] | None = None,
                           remark: str | None = None, *, version: int = CLIENT_VERSION,
                           language: int = int(LanguageCode.PYTHON)) -> bytes:
    """A header in RocketMQ's binary encoding (ROCKETMQ serialize type): i16 code, i8 language, i16 version,
    i32 opaque, i32 flag, i32-length remark, i32-length extFields of (i16-length key, i32-length value).

    This side never answers with it; clients that send it (RocketMQ's benchmark tools do) get JSON back.
    """
    remark_bytes = remark.encode() if remark else b""
    fields = b"".join(struct.pack(">H", len(kb := k.encode())) + kb + struct.pack(">i", len(vb := v.encode())) + vb
                      for k, v in (ext or {}).items())
    return (struct.pack(">hbhii", code, language, version, opaque, flag) + struct.pack(">i", len(remark_bytes))
            + remark_bytes + struct.pack(">i", len(fields)) + fields)


def _decode_rocketmq_header(data: bytes | memoryview) -> tuple[int, int, int, int, int, str | None, dict[str, Any]]:
    """(code, language, version, opaque, flag, remark, ext) of a ROCKETMQ binary header; ProtocolError if broken."""
    try:
        code, language, version, opaque, flag = struct.unpack_from(">hbhii", data, 0)
        pos = 13
        (rlen,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if rlen < 0 or pos + rlen > len(data):
            raise ProtocolError(f"remark length {rlen} runs past the header")
        remark = bytes(data[pos:pos + rlen]).decode() if rlen else None
        pos += rlen
        (elen,) = struct.unpack_from(">i", data, pos)
        pos += 4
        end = pos + elen
        if elen < 0 or end > len(data):
            raise ProtocolError(f"extFields length {elen} runs past the header")
        ext: dict[str, Any] = {}
        while pos < end:
            (klen,) = struct.unpack_from(">H", data, pos)
            pos += 2
            key = bytes(data[pos:pos + klen]).decode()
            pos += klen
            (vlen,) = struct.unpack_from(">i", data, pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                raise ProtocolError(f"extFields value length {vlen} runs past the header")
            ext[key] = bytes(data[pos:pos + vlen]).decode()  # a repeated key: the last wins, as in RocketMQ
            pos += vlen
        if pos != end:
            raise ProtocolError("extFields run past their length")
    except struct.error as exc:
        raise ProtocolError(f"truncated ROCKETMQ header: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"ROCKETMQ header text is not UTF-8: {exc}") from None
    return code, language, version, opaque, flag, remark, ext


#: Language name -> number, built once: ``Enum.__members__`` makes a new mapping proxy per call (every JSON frame).
_LANGUAGE_NUMBERS: dict[str, int] = {name: int(member) for name, member in LanguageCode.__members__.items()}
_OTHER_LANGUAGE = int(LanguageCode.OTHER)


def _language_number(value: str | int) -> int:
    if isinstance(value, int):
        return value
    return _LANGUAGE_NUMBERS.get(value, _OTHER_LANGUAGE)


def _frame(kind: int, header: bytes | memoryview, body: bytes | memoryview) -> Frame:
    """A frame from its header and body; ProtocolError when the header cannot be read at all."""
    if kind == _JSON:
        try:
            h = _decode_json_header(header)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProtocolError(f"bad JSON header: {exc}") from None
        return Frame(h.code, h.flag, h.opaque, h.extFields, body, h.remark, h.version,
                     _language_number(h.language), _JSON)
    code, language, version, opaque, flag, remark, ext = _decode_rocketmq_header(header)
    return Frame(code, flag, opaque, ext, body, remark, version, language, _ROCKETMQ)


def write_frame(transport: Any, data: FrameData) -> None:
    """Write what :func:`encode_frame` returned to an asyncio transport."""
    if type(data) is bytes:
        transport.write(data)
    else:
        transport.writelines(data)


def error_reply(code: ErrorCode, message: str) -> Reply:
    """The :class:`Reply` of an error: RocketMQ's response code for it, the message as the remark, and the
    exact stable code in the ``errorCode`` ext field."""
    return Reply(code.remoting_code, {"errorCode": code.name}, b"", message)


def unsupported_reply(frame: Frame) -> Reply:
    """The answer to a request code the handler does not know (REQUEST_CODE_NOT_SUPPORTED, as RocketMQ
    words it)."""
    return error_reply(ErrorCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {frame.code} not supported")


def error_from_frame(frame: Frame) -> SparkMQError:
    """The :class:`SparkMQError` an error response stands for: its ``errorCode`` field when it names a
    stable code, else the code its response code maps to (INTERNAL_ERROR naming an unknown number)."""
    message = frame.remark or ""
    named = ErrorCode.from_name((frame.ext or {}).get("errorCode"))
    if named is not None:
        return SparkMQError(named, message)
    code = ErrorCode.from_remoting_code(frame.code)
    if code is None:
        name = ResponseCode(frame.code).name if frame.code in ResponseCode._value2member_map_ else "unknown"
        return SparkMQError(ErrorCode.INTERNAL_ERROR, f"response code {frame.code} ({name}): {message}")
    return SparkMQError(code, message)


def _violation(length: int, kind: int, hlen: int, max_frame_bytes: int) -> ProtocolError:
    """The ProtocolError naming what is wrong with a prefix (called only once the fast check failed)."""
    if length < 4:
        return ProtocolError(f"length {length} is below the minimum 4")
    if length > max_frame_bytes:
        return ProtocolError(f"length {length} exceeds max_frame_bytes {max_frame_bytes}")
    if kind not in (_JSON, _ROCKETMQ):
        return ProtocolError(f"unknown serialize type {kind}")
    return ProtocolError(f"header length {hlen} runs past the frame (length {length})")


class FrameDecoder:
    """Incremental frame decoder: :meth:`feed` received bytes, get the frames they complete.

    Small frames are sliced out of the received chunk and a large body inside one chunk is a
    view of it (no copy).  A frame spanning reads keeps views of its chunks and joins them once
    it is complete: one copy of its bytes whatever the number of reads, and memory that grows
    only as bytes actually arrive (a bare prefix announcing 64 MiB allocates nothing).  After a
    :class:`ProtocolError` the decoder is unusable (the connection must be closed).  Fed buffers
    must not be modified afterwards (frames may be views of them).
    """

    __slots__ = ("max_frame_bytes", "_head", "_parts", "_need", "_meta")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._head = b""  # < 8 bytes of a prefix not yet complete
        self._parts: list[bytes | memoryview] | None = None  # the chunks of a frame spanning reads
        self._need = 0  # bytes that frame still lacks
        self._meta: tuple[int, int] = (0, 0)  # its serialize type and header length

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._head) + (sum(map(len, self._parts)) if self._parts is not None else 0)

    def _check(self, length: int, word: int) -> tuple[int, int]:
        kind = word >> 24
        hlen = word & MAX_HEADER_BYTES
        if length < 4 or length > self.max_frame_bytes or kind > 1 or hlen > length - 4:
            raise _violation(length, kind, hlen, self.max_frame_bytes)
        return kind, hlen

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by ``data`` (possibly none); raises :class:`ProtocolError`."""
        frames: list[Frame] = []
        off = 0
        if self._head or self._parts is not None:
            off = self._continue(data, frames)
            if off < 0:
                return frames
        n = len(data)
        append = frames.append
        while True:
            left = n - off
            if left < FRAME_PREFIX_SIZE:
                if left:
                    self._head = bytes(data[off:])
                return frames
            length, word = _unpack_prefix(data, off)
            kind, hlen = self._check(length, word)
            end = off + 4 + length
            if end > n:
                self._parts = [memoryview(data)[off:] if off else data]
                self._need = end - n
                self._meta = (kind, hlen)
                return frames
            hs = off + FRAME_PREFIX_SIZE
            bs = hs + hlen
            body = data[bs:end] if end - bs < _VIEW_MIN else memoryview(data)[bs:end].toreadonly()
            append(_frame(kind, data[hs:bs], body))
            off = end

    def _continue(self, data: bytes, frames: list[Frame]) -> int:
        """Go on with a partial frame; the offset in ``data`` after it, or -1 when data ran out."""
        off = 0
        if self._head:
            need = FRAME_PREFIX_SIZE - len(self._head)
            if len(data) < need:
                self._head += data
                return -1
            prefix = self._head + data[:need]
            self._head = b""
            length, word = _unpack_prefix(prefix, 0)
            kind, hlen = self._check(length, word)
            self._parts = [prefix]
            self._need = 4 + length - FRAME_PREFIX_SIZE
            self._meta = (kind, hlen)
            off = need
        parts = self._parts
        assert parts is not None
        need = self._need
        left = len(data) - off
        if left < need:
            parts.append(memoryview(data)[off:] if off else data)
            self._need = need - left
            return -1
        if need:
            parts.append(memoryview(data)[off: off + need])
        self._parts = None
        wire = b"".join(parts)  # the one copy of a frame that spanned reads
        kind, hlen = self._meta
        bs = FRAME_PREFIX_SIZE + hlen
        body = memoryview(wire)[bs:].toreadonly() if len(wire) - bs >= _VIEW_MIN else wire[bs:]
        frames.append(_frame(kind, wire[FRAME_PREFIX_SIZE:bs], body))
        return off + need
