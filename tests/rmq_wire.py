"""A RocketMQ remoting client as the Java client writes its frames, for the protocol tests (not sparkmq's client).

Frames are built here byte by byte from the protocol's description (``facts/rocketmq-remoting.md`` §1): JSON
headers as Java's ``RemotingSerializable`` writes them, or RocketMQ's binary header; :func:`java_sign` is
``AclClientRPCHook`` from its description (§7).  Only the reply is read with sparkmq's ``FrameDecoder``.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import socket
import struct
from typing import Any

from sparkmq.platform.remoting import Frame, FrameDecoder

__all__ = ["RawClient", "java_sign", "json_frame", "rocketmq_frame"]


def java_sign(ext: dict[str, str], body: bytes, access_key: str, secret_key: str,
              token: str | None = None) -> dict[str, str]:
    """``ext`` with AclClientRPCHook's fields: AccessKey (SecurityToken), then Signature = Base64(HmacSHA1(secret,
    values ordered by key (Java String order) concatenated + body))."""
    out = dict(ext, AccessKey=access_key)
    if token is not None:
        out["SecurityToken"] = token
    ordered = sorted(out, key=lambda k: k.encode("utf-16-be"))
    content = "".join(out[k] for k in ordered).encode() + body
    out["Signature"] = base64.b64encode(hmac.new(secret_key.encode(), content, hashlib.sha1).digest()).decode()
    return out


def json_frame(code: int, opaque: int, ext: dict[str, Any] | None, body: bytes = b"", *, flag: int = 0,
               version: int = 479, language: str = "JAVA") -> bytes:
    """A request with a JSON header, the fields Java writes (``serializeTypeCurrentRPC`` included)."""
    header: dict[str, Any] = {"code": code, "extFields": ext, "flag": flag, "language": language, "opaque": opaque,
                              "serializeTypeCurrentRPC": "JSON", "version": version}
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack(">iI", 4 + len(raw) + len(body), len(raw)) + raw + body


def rocketmq_frame(code: int, opaque: int, ext: dict[str, str] | None, body: bytes = b"", *, flag: int = 0,
                   version: int = 479, language: int = 0) -> bytes:
    """A request with RocketMQ's binary header (serialize type 1)."""
    fields = b"".join(struct.pack(">H", len(k.encode())) + k.encode() + struct.pack(">i", len(v.encode())) + v.encode()
                      for k, v in (ext or {}).items())
    header = (struct.pack(">hbhii", code, language, version, opaque, flag) + struct.pack(">i", 0)
              + struct.pack(">i", len(fields)) + fields)
    return struct.pack(">iI", 4 + len(header) + len(body), (1 << 24) | len(header)) + header + body


class RawClient:
    """One blocking connection sending hand-made frames and reading their replies in order."""

    def __init__(self, addr: str, timeout: float = 10.0) -> None:
        host, _, port = addr.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decoder = FrameDecoder()
        self._opaques = itertools.count(0)  # Java starts at 0
        self._ready: list[Frame] = []
        #: Requests the server pushed while a reply was awaited.
        self.pushed: list[Frame] = []

    def request(self, code: int, ext: dict[str, Any] | None = None, body: bytes = b"", *,
                serialize: str = "json", version: int = 479) -> Frame:
        """Send one request and return its reply (pushed requests meanwhile are kept in :attr:`pushed`)."""
        opaque = next(self._opaques)
        make = json_frame if serialize == "json" else rocketmq_frame
        self.sock.sendall(make(code, opaque, ext, body, version=version))
        while True:
            frame = self._next()
            if frame.flag & 1 and frame.opaque == opaque:
                return frame
            self.pushed.append(frame)

    def _next(self) -> Frame:
        while not self._ready:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the server closed the connection")
            self._ready.extend(self._decoder.feed(data))
        return self._ready.pop(0)

    def read_push(self) -> Frame:
        """The next request the server pushes (a notice)."""
        if self.pushed:
            return self.pushed.pop(0)
        return self._next()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
