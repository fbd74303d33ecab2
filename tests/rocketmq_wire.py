"""A small RocketMQ remoting peer for tests: frames as RocketMQ's Java client writes them, written from its sources
(``facts/rocketmq-remoting.md``), independent of sparkmq's own client.

* :class:`JavaLikeClient` -- one blocking connection: JSON headers (``language`` JAVA, ``version`` 479) or, with
  ``serialize="ROCKETMQ"``, the binary header, both built byte by byte by ``rmq_wire``; requests matched by opaque;
  requests the broker sends (pushes) are kept in :attr:`JavaLikeClient.pushes` and may be answered.
* :func:`v2` -- SEND_MESSAGE_V2's one-letter header; :func:`props` -- the properties string; :func:`heartbeat` --
  a HeartbeatData body; :func:`batch_body` -- SEND_BATCH_MESSAGE's body (MessageBatch.encode).
* :func:`decode_records` -- RocketMQ stored-message records (MessageDecoder.decode) as dicts.
"""
from __future__ import annotations

import ipaddress
import json
import socket
import struct
import time
import zlib
from collections.abc import Mapping
from typing import Any

from rmq_wire import json_frame, rocketmq_frame

from sparkmq.platform.common.protocol import FLAG_ONEWAY, FLAG_RESPONSE
from sparkmq.platform.remoting import Frame, FrameDecoder

__all__ = ["JavaLikeClient", "v2", "props", "heartbeat", "batch_body", "decode_records", "JAVA_VERSION",
           "PULL_OUTCOMES"]

#: RocketMQ 5.3.3's MQVersion ordinal, what a Java client of that release sends.
JAVA_VERSION = 479
#: Pull answers' codes: found, nothing new, none matched, offset moved.
PULL_OUTCOMES = (0, 19, 20, 21)


def props(values: Mapping[str, str]) -> str:
    """RocketMQ's properties string: ``name\\x01value\\x02`` pairs (MessageDecoder.messageProperties2String)."""
    return "".join(f"{k}\x01{v}\x02" for k, v in values.items())


def v2(group: str, topic: str, *, queue_id: int = 0, properties: str = "", sys_flag: int = 0,
       born: int | None = None, flag: int = 0, reconsume: int | None = None, batch: bool = False) -> dict[str, str]:
    """SendMessageRequestHeaderV2's extFields as the Java client sends them (one-letter names, strings)."""
    ext = {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag),
           "g": str(born if born is not None else int(time.time() * 1000)), "h": str(flag), "i": properties,
           "j": str(reconsume or 0), "k": "false", "m": "true" if batch else "false"}
    return ext


def heartbeat(client_id: str, *, producers: list[str] = (), consumers: list[dict[str, Any]] = ()) -> bytes:
    """A HeartbeatData body (fastjson's bean names): ``consumers`` as ``{"groupName", "subscriptionDataSet":
    [{"topic", "subString"}], ...}`` with the Java defaults filled in."""
    data = {"clientID": client_id, "producerDataSet": [{"groupName": g} for g in producers],
            "consumerDataSet": [{"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
                                 "messageModel": "CLUSTERING", "unitMode": False,
                                 **c, "subscriptionDataSet": [{"classFilterMode": False, "codeSet": [],
                                                               "expressionType": "TAG", "subVersion": 0,
                                                               "tagsSet": [], **s}
                                                              for s in c.get("subscriptionDataSet", [])]}
                                for c in consumers],
            "heartbeatFingerprint": 0, "withoutSub": False}
    return json.dumps(data, separators=(",", ":")).encode()


def batch_body(messages: list[tuple[bytes, str, int]]) -> bytes:
    """SEND_BATCH_MESSAGE's body: per message (body, properties string, flag) as MessageDecoder.encodeMessage
    writes it -- TOTALSIZE, MAGIC 0, BODYCRC 0, FLAG, body length + body, properties length + properties."""
    out = b""
    for body, properties, flag in messages:
        raw = properties.encode()
        total = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(raw)
        out += struct.pack(">iiiii", total, 0, 0, flag, len(body)) + body + struct.pack(">h", len(raw)) + raw
    return out


def _host(data: bytes, at: int, v6: bool) -> tuple[str, int]:
    size = 16 if v6 else 4
    ip = ipaddress.ip_address(data[at: at + size])
    (port,) = struct.unpack_from(">i", data, at + size)
    return (f"[{ip}]:{port}" if v6 else f"{ip}:{port}"), at + size + 4


def decode_records(body: bytes) -> list[dict[str, Any]]:
    """RocketMQ stored-message records back to back (MessageDecoder.decode with the body inflated), as dicts with
    the Java field names; ``msgId`` is the offsetMsgId MessageDecoder makes."""
    out = []
    pos = 0
    while pos < len(body):
        (total, magic, crc, queue_id, flag, queue_offset, clog, sys_flag,
         born_ts) = struct.unpack_from(">iIiiiqqiq", body, pos)
        assert magic in (0xDAA320A7, 0xDAA320AB), hex(magic)
        at = pos + 48
        born_host, at = _host(body, at, bool(sys_flag & 0x10))
        (store_ts,) = struct.unpack_from(">q", body, at)
        store_host, at = _host(body, at + 8, bool(sys_flag & 0x20))
        reconsume, prepared, body_len = struct.unpack_from(">iqi", body, at)
        at += 16
        payload = body[at: at + body_len]
        assert crc == zlib.crc32(payload) & 0x7FFFFFFF, "BODYCRC"
        if sys_flag & 0x1:
            payload = zlib.decompress(payload)
        at += body_len
        if magic == 0xDAA320A7:
            topic_len = body[at]
            at += 1
        else:
            (topic_len,) = struct.unpack_from(">h", body, at)
            at += 2
        topic = body[at: at + topic_len].decode()
        at += topic_len
        (props_len,) = struct.unpack_from(">h", body, at)
        text = body[at + 2: at + 2 + props_len].decode()
        properties = dict(pair.split("\x01", 1) for pair in text.split("\x02") if pair)
        host, port = store_host.rsplit(":", 1)
        ip = ipaddress.ip_address(host.strip("[]"))
        msg_id = (ip.packed + struct.pack(">iq", int(port), clog)).hex().upper()
        assert at + 2 + props_len == pos + total, "TOTALSIZE"
        out.append({"storeSize": total, "queueId": queue_id, "flag": flag, "queueOffset": queue_offset,
                    "commitLogOffset": clog, "sysFlag": sys_flag, "bornTimestamp": born_ts, "bornHost": born_host,
                    "storeTimestamp": store_ts, "storeHost": store_host, "reconsumeTimes": reconsume,
                    "preparedTransactionOffset": prepared, "body": payload, "topic": topic,
                    "properties": properties, "msgId": msg_id})
        pos += total
    return out


class JavaLikeClient:
    """One connection speaking RocketMQ's remoting as its Java client does (blocking; one thread)."""

    def __init__(self, addr: str, *, serialize: str = "JSON", timeout: float = 10.0) -> None:
        host, port = addr.rsplit(":", 1)
        self.addr = addr
        self.serialize = serialize
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.decoder = FrameDecoder()
        self.opaque = 0
        #: Requests the broker sent (pushes), oldest first, until taken with :meth:`wait_push`.
        self.pushes: list[Frame] = []
        self._responses: dict[int, Frame] = {}

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> JavaLikeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _frame(self, code: int, flag: int, opaque: int, ext: Mapping[str, str] | None, body: bytes) -> bytes:
        make = rocketmq_frame if self.serialize == "ROCKETMQ" else json_frame
        return make(code, opaque, dict(ext or {}), body, flag=flag, version=JAVA_VERSION)

    def send(self, code: int, ext: Mapping[str, str] | None = None, body: bytes = b"", *,
             oneway: bool = False) -> int:
        """Write one request; its opaque."""
        self.opaque += 1
        self.sock.sendall(self._frame(code, FLAG_ONEWAY if oneway else 0, self.opaque, ext, body))
        return self.opaque

    def _read(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed by the broker")
        for frame in self.decoder.feed(data):
            if frame.flag & FLAG_RESPONSE:
                self._responses[frame.opaque] = frame
            else:
                self.pushes.append(frame)

    def response(self, opaque: int, timeout: float = 10.0) -> Frame:
        """The answer to the request sent with ``opaque`` (pushes arriving meanwhile are kept)."""
        deadline = time.monotonic() + timeout
        while opaque not in self._responses:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to opaque {opaque}")
            self._read(left)
        return self._responses.pop(opaque)

    def request(self, code: int, ext: Mapping[str, str] | None = None, body: bytes = b"",
                timeout: float = 10.0) -> Frame:
        """Send a request and wait for its answer (any code)."""
        return self.response(self.send(code, ext, body), timeout)

    def wait_push(self, code: int, timeout: float = 5.0) -> Frame:
        """The first request the broker pushed with ``code`` (taken off :attr:`pushes`)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, frame in enumerate(self.pushes):
                if frame.code == code:
                    return self.pushes.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no push with code {code}")
            try:
                self._read(left)
            except TimeoutError:
                pass

    def answer(self, push: Frame, code: int = 0, ext: Mapping[str, str] | None = None, body: bytes = b"") -> None:
        """Answer a request the broker sent."""
        self.sock.sendall(self._frame(code, FLAG_RESPONSE, push.opaque, ext, body))
