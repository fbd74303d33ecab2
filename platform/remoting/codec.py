"""Frames of the remoting protocol (``docs/remoting.md``): encoding, incremental decoding, errors.

The codec knows the frame layout and nothing else: headers are opaque bytes (msgpack made by
callers) except an error response's, which is the msgpack map ``{"message": str}``.
"""
from __future__ import annotations

import struct

import msgspec

from ..common.errors import ErrorCode, SparkMQError
from ..common.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FRAME_MAGIC,
    FRAME_PREFIX_SIZE,
    KNOWN_FLAGS,
    PROTOCOL_VERSION,
    RESPONSE_SUCCESS,
)

__all__ = [
    "Frame",
    "FrameData",
    "FrameDecoder",
    "ProtocolError",
    "RemotingError",
    "Reply",
    "Response",
    "encode_error_header",
    "encode_frame",
    "error_from_frame",
    "error_reply",
    "unsupported_reply",
    "write_frame",
]

# length, magic (as uint16), version, flags, code, opaque, header_len -- one pack/unpack per frame.
_PREFIX = struct.Struct("<IHBBHII")
_pack_prefix = _PREFIX.pack
_unpack_prefix = _PREFIX.unpack_from
assert _PREFIX.size == FRAME_PREFIX_SIZE
_MAGIC = int.from_bytes(FRAME_MAGIC, "little")
#: The smallest legal ``length``: the prefix after the length field, with no header and no body.
_MIN_LENGTH = FRAME_PREFIX_SIZE - 4
_UNKNOWN_FLAGS = 0xFF & ~KNOWN_FLAGS
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


class Frame(msgspec.Struct, gc=False):
    """One received frame.

    ``header`` is ``bytes``; ``body`` is ``bytes`` when small and a read-only ``memoryview`` of
    the receive buffer when large (no copy).  Both support the buffer protocol
    (``msgspec.msgpack.decode``, ``bytes()``, native decoders).
    """

    flags: int
    code: int
    opaque: int
    header: bytes | memoryview
    body: bytes | memoryview

    @property
    def is_response(self) -> bool:
        """True for a response, False for a request."""
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """True for a request that wants no response."""
        return bool(self.flags & FLAG_ONEWAY)


class Reply(msgspec.Struct, gc=False):
    """What a server handler answers: ``code`` 0 (success) or an error's remoting number."""

    code: int = RESPONSE_SUCCESS
    header: bytes | memoryview = b""
    body: bytes | memoryview = b""


class Response(msgspec.Struct, gc=False):
    """A successful response as a client sees it (errors are raised instead)."""

    code: int
    header: bytes | memoryview
    body: bytes | memoryview


class _ErrorHeader(msgspec.Struct):
    message: str = ""


_encode_error = msgspec.msgpack.Encoder().encode
_decode_error = msgspec.msgpack.Decoder(_ErrorHeader).decode


def encode_frame(flags: int, code: int, opaque: int, header: bytes | memoryview = b"",
                 body: bytes | memoryview = b"") -> FrameData:
    """Encode one frame; returns ``bytes`` (small body) or a list of buffers (large body, not copied).

    Pass the result to :func:`write_frame` (or ``transport.write`` / ``writelines`` by type).

    Example::

        >>> encode_frame(0, 1, 7)
        b'\\x0e\\x00\\x00\\x00SM\\x01\\x00\\x01\\x00\\x07\\x00\\x00\\x00\\x00\\x00\\x00\\x00'
    """
    hlen = len(header)
    blen = len(body)
    prefix = _pack_prefix(_MIN_LENGTH + hlen + blen, _MAGIC, PROTOCOL_VERSION, flags, code, opaque, hlen)
    if blen <= _JOIN_MAX:
        return prefix + header + body
    return [prefix + header, body]


def write_frame(transport, data: FrameData) -> None:
    """Write what :func:`encode_frame` returned to an asyncio transport."""
    if type(data) is bytes:
        transport.write(data)
    else:
        transport.writelines(data)


def encode_error_header(message: str) -> bytes:
    """The msgpack header ``{"message": message}`` of an error response."""
    return _encode_error(_ErrorHeader(message))


def error_reply(code: ErrorCode, message: str) -> Reply:
    """The :class:`Reply` of an error: status ``code.remoting_code``, header ``{"message": message}``."""
    return Reply(code.remoting_code, encode_error_header(message))


def unsupported_reply(frame: Frame) -> Reply:
    """The answer to a request code the handler does not know (REQUEST_CODE_NOT_SUPPORTED)."""
    return error_reply(ErrorCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {frame.code} is not supported")


def error_from_frame(frame: Frame | Response) -> SparkMQError:
    """The :class:`SparkMQError` an error response stands for.

    A known remoting number maps back to its :class:`ErrorCode`; an unknown one (a newer peer)
    becomes INTERNAL_ERROR naming the number.  A header that is not ``{"message": str}`` keeps
    the code and says so in the message.
    """
    try:
        message = _decode_error(frame.header).message if len(frame.header) else ""
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        message = "(undecodable error header)"
    code = ErrorCode.from_remoting_code(frame.code)
    if code is None:
        return SparkMQError(ErrorCode.INTERNAL_ERROR, f"unknown remoting error code {frame.code}: {message}")
    return SparkMQError(code, message)


def _violation(length: int, magic: int, version: int, flags: int, hlen: int, max_frame_bytes: int) -> ProtocolError:
    """The ProtocolError naming what is wrong with a prefix (called only once the fast check failed)."""
    if magic != _MAGIC:
        return ProtocolError(f"bad magic {magic.to_bytes(2, 'little')!r}")
    if version != PROTOCOL_VERSION:
        return ProtocolError(f"unknown protocol version {version}")
    if flags & _UNKNOWN_FLAGS:
        return ProtocolError(f"unknown flag bits 0x{flags & _UNKNOWN_FLAGS:02x}")
    if length < _MIN_LENGTH:
        return ProtocolError(f"length {length} is below the minimum {_MIN_LENGTH}")
    if length > max_frame_bytes:
        return ProtocolError(f"length {length} exceeds max_frame_bytes {max_frame_bytes}")
    return ProtocolError(f"header_len {hlen} runs past the frame (length {length})")


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
        self._head = b""  # < 18 bytes of a prefix not yet complete
        self._parts: list[bytes | memoryview] | None = None  # the chunks of a frame spanning reads
        self._need = 0  # bytes that frame still lacks
        self._meta: tuple[int, int, int, int] = (0, 0, 0, 0)  # its flags, code, opaque, header_len

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._head) + (sum(map(len, self._parts)) if self._parts is not None else 0)

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by ``data`` (possibly none); raises :class:`ProtocolError`."""
        frames: list[Frame] = []
        off = 0
        if self._head or self._parts is not None:
            off = self._continue(data, frames)
            if off < 0:
                return frames
        n = len(data)
        max_len = self.max_frame_bytes
        append = frames.append
        while True:
            left = n - off
            if left < FRAME_PREFIX_SIZE:
                if left:
                    self._head = bytes(data[off:])
                return frames
            length, magic, version, flags, code, opaque, hlen = _unpack_prefix(data, off)
            if (magic != _MAGIC or version != PROTOCOL_VERSION or flags & _UNKNOWN_FLAGS
                    or length < _MIN_LENGTH or length > max_len or hlen > length - _MIN_LENGTH):
                raise _violation(length, magic, version, flags, hlen, max_len)
            end = off + 4 + length
            if end > n:
                self._parts = [memoryview(data)[off:] if off else data]
                self._need = end - n
                self._meta = (flags, code, opaque, hlen)
                return frames
            hs = off + FRAME_PREFIX_SIZE
            bs = hs + hlen
            if end - bs < _VIEW_MIN:
                append(Frame(flags, code, opaque, data[hs:bs], data[bs:end]))
            else:
                append(Frame(flags, code, opaque, data[hs:bs], memoryview(data)[bs:end].toreadonly()))
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
            length, magic, version, flags, code, opaque, hlen = _unpack_prefix(prefix, 0)
            max_len = self.max_frame_bytes
            if (magic != _MAGIC or version != PROTOCOL_VERSION or flags & _UNKNOWN_FLAGS
                    or length < _MIN_LENGTH or length > max_len or hlen > length - _MIN_LENGTH):
                raise _violation(length, magic, version, flags, hlen, max_len)
            self._parts = [prefix]
            self._need = 4 + length - FRAME_PREFIX_SIZE
            self._meta = (flags, code, opaque, hlen)
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
        flags, code, opaque, hlen = self._meta
        bs = FRAME_PREFIX_SIZE + hlen
        body = memoryview(wire)[bs:].toreadonly() if len(wire) - bs >= _VIEW_MIN else wire[bs:]
        frames.append(Frame(flags, code, opaque, wire[FRAME_PREFIX_SIZE:bs], body))
        return off + need
