#!/usr/bin/env python3
"""RocketMQ remoting frames: a decoder, a tiny client, and a logging TCP relay for protocol captures.

A frame on the wire (RocketMQ's ``RemotingCommand``), all integers big-endian::

    +----------+-------------------------------+----------------+--------+
    | i32 len  | i32 (serialize << 24 | hlen)  | header (hlen)  | body   |
    +----------+-------------------------------+----------------+--------+
      len counts everything after itself: 4 + hlen + body length

The header is JSON (serialize type 0: ``{"code":..,"extFields":{..},"flag":..,"language":"JAVA",...}``) or
RocketMQ's binary encoding (type 1)::

    i16 code | i8 language | i16 version | i32 opaque | i32 flag | i32 len + remark | i32 len + extFields
    extFields: repeated (i16 key length, key, i32 value length, value), UTF-8

``flag`` bit 0 marks a response, bit 1 a one-way request.  A response copies its request's ``opaque``.

The relay (:class:`CaptureRelay`) listens on some addresses, forwards each connection to its target byte for byte,
and writes every frame it sees -- both directions, decoded, with the request code named on responses too -- to
a text log.  Put it between a RocketMQ client and real RocketMQ servers to see what they say::

    python tests/remoting_capture.py --route 127.0.0.2:9876=127.0.0.1:9876 \\
        --route 127.0.0.2:10911=127.0.0.1:10911 --log /work/captures/producer.txt

(RocketMQ brokers advertise ``brokerIP1:listenPort``: start the broker with ``bindAddress=127.0.0.1`` and
``brokerIP1=127.0.0.2`` and the relay can listen on 127.0.0.2 at the same port, so the clients' routes lead
through it without rewriting anything.)

Standard library only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

__all__ = ["CaptureRelay", "Frame", "FrameError", "REQUEST_CODES", "RESPONSE_CODES", "decode_frame",
           "decode_records", "describe_frame", "encode_frame", "request"]

#: Serialize types of the header (top byte of the second word).
SERIALIZE_JSON, SERIALIZE_ROCKETMQ = 0, 1
#: ``LanguageCode`` by its code (the binary header carries the code, JSON the name).
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST", "NODE_JS")
#: Frames larger than this are refused (RocketMQ's default ``com.rocketmq.remoting.frameMaxLength``).
MAX_FRAME = 16 * 1024 * 1024


def _table(text: str) -> dict[int, str]:
    return {int(code): name for code, name in (item.split(":") for item in text.split())}


#: RocketMQ 5.5.0's request codes (``RequestCode``), by number.
REQUEST_CODES = _table("""
10:SEND_MESSAGE 11:PULL_MESSAGE 12:QUERY_MESSAGE 13:QUERY_BROKER_OFFSET 14:QUERY_CONSUMER_OFFSET
15:UPDATE_CONSUMER_OFFSET 17:UPDATE_AND_CREATE_TOPIC 18:UPDATE_AND_CREATE_TOPIC_LIST 21:GET_ALL_TOPIC_CONFIG
22:GET_TOPIC_CONFIG_LIST 23:GET_TOPIC_NAME_LIST 25:UPDATE_BROKER_CONFIG 26:GET_BROKER_CONFIG 27:TRIGGER_DELETE_FILES
28:GET_BROKER_RUNTIME_INFO 29:SEARCH_OFFSET_BY_TIMESTAMP 30:GET_MAX_OFFSET 31:GET_MIN_OFFSET
32:GET_EARLIEST_MSG_STORETIME 33:VIEW_MESSAGE_BY_ID 34:HEART_BEAT 35:UNREGISTER_CLIENT 36:CONSUMER_SEND_MSG_BACK
37:END_TRANSACTION 38:GET_CONSUMER_LIST_BY_GROUP 39:CHECK_TRANSACTION_STATE 40:NOTIFY_CONSUMER_IDS_CHANGED
41:LOCK_BATCH_MQ 42:UNLOCK_BATCH_MQ 43:GET_ALL_CONSUMER_OFFSET 45:GET_ALL_DELAY_OFFSET 46:CHECK_CLIENT_CONFIG
47:GET_CLIENT_CONFIG 60:GET_TIMER_CHECK_POINT 61:GET_TIMER_METRICS 100:PUT_KV_CONFIG 101:GET_KV_CONFIG
102:DELETE_KV_CONFIG 103:REGISTER_BROKER 104:UNREGISTER_BROKER 105:GET_ROUTEINFO_BY_TOPIC 106:GET_BROKER_CLUSTER_INFO
200:UPDATE_AND_CREATE_SUBSCRIPTIONGROUP 201:GET_ALL_SUBSCRIPTIONGROUP_CONFIG 202:GET_TOPIC_STATS_INFO
203:GET_CONSUMER_CONNECTION_LIST 204:GET_PRODUCER_CONNECTION_LIST 205:WIPE_WRITE_PERM_OF_BROKER
206:GET_ALL_TOPIC_LIST_FROM_NAMESERVER 207:DELETE_SUBSCRIPTIONGROUP 208:GET_CONSUME_STATS 209:SUSPEND_CONSUMER
210:RESUME_CONSUMER 211:RESET_CONSUMER_OFFSET_IN_CONSUMER 212:RESET_CONSUMER_OFFSET_IN_BROKER
213:ADJUST_CONSUMER_THREAD_POOL 214:WHO_CONSUME_THE_MESSAGE 215:DELETE_TOPIC_IN_BROKER 216:DELETE_TOPIC_IN_NAMESRV
217:REGISTER_TOPIC_IN_NAMESRV 219:GET_KVLIST_BY_NAMESPACE 220:RESET_CONSUMER_CLIENT_OFFSET
221:GET_CONSUMER_STATUS_FROM_CLIENT 222:INVOKE_BROKER_TO_RESET_OFFSET 223:INVOKE_BROKER_TO_GET_CONSUMER_STATUS
224:GET_TOPICS_BY_CLUSTER 225:UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST 300:QUERY_TOPIC_CONSUME_BY_WHO
301:REGISTER_FILTER_SERVER 302:REGISTER_MESSAGE_FILTER_CLASS 303:QUERY_CONSUME_TIME_SPAN
304:GET_SYSTEM_TOPIC_LIST_FROM_NS 305:GET_SYSTEM_TOPIC_LIST_FROM_BROKER 306:CLEAN_EXPIRED_CONSUMEQUEUE
307:GET_CONSUMER_RUNNING_INFO 308:QUERY_CORRECTION_OFFSET 309:CONSUME_MESSAGE_DIRECTLY 310:SEND_MESSAGE_V2
311:GET_UNIT_TOPIC_LIST 312:GET_HAS_UNIT_SUB_TOPIC_LIST 313:GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST 314:CLONE_GROUP_OFFSET
315:VIEW_BROKER_STATS_DATA 316:CLEAN_UNUSED_TOPIC 317:GET_BROKER_CONSUME_STATS 318:UPDATE_NAMESRV_CONFIG
319:GET_NAMESRV_CONFIG 320:SEND_BATCH_MESSAGE 321:QUERY_CONSUME_QUEUE 322:QUERY_DATA_VERSION
323:RESUME_CHECK_HALF_MESSAGE 324:SEND_REPLY_MESSAGE 325:SEND_REPLY_MESSAGE_V2 326:PUSH_REPLY_MESSAGE_TO_CLIENT
327:ADD_WRITE_PERM_OF_BROKER 328:GET_ALL_PRODUCER_INFO 329:DELETE_EXPIRED_COMMITLOG 343:QUERY_TOPICS_BY_CONSUMER
345:QUERY_SUBSCRIPTION_BY_CONSUMER 351:GET_TOPIC_CONFIG 352:GET_SUBSCRIPTIONGROUP_CONFIG
353:UPDATE_AND_GET_GROUP_FORBIDDEN 354:CHECK_ROCKSDB_CQ_WRITE_PROGRESS 355:EXPORT_ROCKSDB_CONFIG_TO_JSON
361:LITE_PULL_MESSAGE 370:RECALL_MESSAGE 400:QUERY_ASSIGNMENT 401:SET_MESSAGE_REQUEST_MODE
402:GET_ALL_MESSAGE_REQUEST_MODE 513:UPDATE_AND_CREATE_STATIC_TOPIC 901:GET_BROKER_MEMBER_GROUP 902:ADD_BROKER
903:REMOVE_BROKER 904:BROKER_HEARTBEAT 905:NOTIFY_MIN_BROKER_ID_CHANGE 906:EXCHANGE_BROKER_HA_INFO
907:GET_BROKER_HA_STATUS 908:RESET_MASTER_FLUSH_OFFSET 3001:AUTH_CREATE_USER 3002:AUTH_UPDATE_USER
3003:AUTH_DELETE_USER 3004:AUTH_GET_USER 3005:AUTH_LIST_USER 3006:AUTH_CREATE_ACL 3007:AUTH_UPDATE_ACL
3008:AUTH_DELETE_ACL 3009:AUTH_GET_ACL 3010:AUTH_LIST_ACL 200050:POP_MESSAGE 200051:ACK_MESSAGE 200052:PEEK_MESSAGE
200053:CHANGE_MESSAGE_INVISIBLETIME 200054:NOTIFICATION 200055:POLLING_INFO 200056:POP_ROLLBACK
200151:BATCH_ACK_MESSAGE
""")

#: RocketMQ 5.5.0's response codes (``ResponseCode``, ``RemotingSysResponseCode``), by number.
RESPONSE_CODES = _table("""
0:SUCCESS 1:SYSTEM_ERROR 2:SYSTEM_BUSY 3:REQUEST_CODE_NOT_SUPPORTED 4:TRANSACTION_FAILED 10:FLUSH_DISK_TIMEOUT
11:SLAVE_NOT_AVAILABLE 12:FLUSH_SLAVE_TIMEOUT 13:MESSAGE_ILLEGAL 14:SERVICE_NOT_AVAILABLE 15:VERSION_NOT_SUPPORTED
16:NO_PERMISSION 17:TOPIC_NOT_EXIST 18:TOPIC_EXIST_ALREADY 19:PULL_NOT_FOUND 20:PULL_RETRY_IMMEDIATELY
21:PULL_OFFSET_MOVED 22:QUERY_NOT_FOUND 23:SUBSCRIPTION_PARSE_FAILED 24:SUBSCRIPTION_NOT_EXIST
25:SUBSCRIPTION_NOT_LATEST 26:SUBSCRIPTION_GROUP_NOT_EXIST 27:FILTER_DATA_NOT_EXIST 28:FILTER_DATA_NOT_LATEST
29:INVALID_PARAMETER 200:TRANSACTION_SHOULD_COMMIT 201:TRANSACTION_SHOULD_ROLLBACK 202:TRANSACTION_STATE_UNKNOW
203:TRANSACTION_STATE_GROUP_WRONG 204:NO_BUYER_ID 205:NOT_IN_CURRENT_UNIT 206:CONSUMER_NOT_ONLINE
207:CONSUME_MSG_TIMEOUT 208:NO_MESSAGE 209:POLLING_FULL 210:POLLING_TIMEOUT 211:BROKER_NOT_EXIST
212:BROKER_DISPATCH_NOT_COMPLETE 213:BROADCAST_CONSUMPTION 215:FLOW_CONTROL 501:NOT_LEADER_FOR_QUEUE
604:ILLEGAL_OPERATION 1500:GO_AWAY 3001:USER_NOT_EXIST 3002:POLICY_NOT_EXIST
""")

#: Requests whose SUCCESS response body is stored message records (``MessageDecoder`` layout).
_RECORD_RESPONSES = {11, 12, 33, 361}
#: Requests whose body is stored message records.
_RECORD_REQUESTS = {39}


class FrameError(ValueError):
    """Bytes that are not a RocketMQ remoting frame (the message says what is wrong)."""


@dataclass
class Frame:
    """One remoting command, decoded.  ``header_text`` is the JSON header exactly as it was on the wire."""

    code: int
    language: str = "JAVA"
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = SERIALIZE_JSON
    header_text: str | None = None

    @property
    def is_response(self) -> bool:
        """Flag bit 0."""
        return bool(self.flag & 1)

    @property
    def is_oneway(self) -> bool:
        """Flag bit 1."""
        return bool(self.flag & 2)


def _json_header(frame: Frame) -> bytes:
    header: dict[str, object] = {"code": frame.code, "extFields": frame.ext_fields, "flag": frame.flag,
                                 "language": frame.language, "opaque": frame.opaque,
                                 "serializeTypeCurrentRPC": "JSON", "version": frame.version}
    if frame.remark is not None:
        header["remark"] = frame.remark
    return json.dumps(header, separators=(",", ":")).encode()


def _binary_header(frame: Frame) -> bytes:
    lang = LANGUAGES.index(frame.language) if frame.language in LANGUAGES else 7
    remark = frame.remark.encode() if frame.remark is not None else b""
    ext = b"".join(struct.pack(">h", len(k.encode())) + k.encode() + struct.pack(">i", len(v.encode())) + v.encode()
                   for k, v in frame.ext_fields.items())
    return (struct.pack(">hbhii", frame.code, lang, frame.version, frame.opaque, frame.flag)
            + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext)


def encode_frame(frame: Frame, serialize_type: int | None = None) -> bytes:
    """The frame's bytes, length prefix included, with a JSON or binary header."""
    kind = frame.serialize_type if serialize_type is None else serialize_type
    header = _json_header(frame) if kind == SERIALIZE_JSON else _binary_header(frame)
    return struct.pack(">ii", 4 + len(header) + len(frame.body), (kind << 24) | len(header)) + header + frame.body


def decode_frame(payload: bytes) -> Frame:
    """Decode one frame from the bytes after its length prefix; :class:`FrameError` when they are not one."""
    if len(payload) < 4:
        raise FrameError(f"frame of {len(payload)} bytes has no header length")
    (word,) = struct.unpack_from(">i", payload)
    kind, hlen = (word >> 24) & 0xFF, word & 0xFFFFFF
    if hlen > len(payload) - 4:
        raise FrameError(f"header length {hlen} exceeds the frame ({len(payload) - 4} bytes after it)")
    raw, body = payload[4:4 + hlen], payload[4 + hlen:]
    if kind == SERIALIZE_JSON:
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise FrameError(f"JSON header does not parse: {exc}") from None
        if not isinstance(header, dict) or "code" not in header:
            raise FrameError("JSON header is not an object with a code")
        lang = header.get("language", "JAVA")
        if isinstance(lang, int):
            lang = LANGUAGES[lang] if 0 <= lang < len(LANGUAGES) else str(lang)
        ext = header.get("extFields") or {}
        return Frame(int(header["code"]), str(lang), int(header.get("version", 0)), int(header.get("opaque", 0)),
                     int(header.get("flag", 0)), header.get("remark"), {str(k): str(v) for k, v in ext.items()},
                     body, kind, raw.decode("utf-8"))
    if kind == SERIALIZE_ROCKETMQ:
        try:
            code, lang_code, version, opaque, flag = struct.unpack_from(">hbhii", raw)
            pos = 13
            (rlen,) = struct.unpack_from(">i", raw, pos)
            pos += 4
            remark = raw[pos:pos + rlen].decode("utf-8") if rlen > 0 else None
            pos += max(rlen, 0)
            (elen,) = struct.unpack_from(">i", raw, pos)
            pos += 4
            end = pos + elen
            ext: dict[str, str] = {}
            while pos < end:
                (klen,) = struct.unpack_from(">h", raw, pos)
                key = raw[pos + 2:pos + 2 + klen].decode("utf-8")
                pos += 2 + klen
                (vlen,) = struct.unpack_from(">i", raw, pos)
                ext[key] = raw[pos + 4:pos + 4 + vlen].decode("utf-8")
                pos += 4 + vlen
        except (struct.error, UnicodeDecodeError) as exc:
            raise FrameError(f"binary header does not parse: {exc}") from None
        lang = LANGUAGES[lang_code] if 0 <= lang_code < len(LANGUAGES) else str(lang_code)
        return Frame(code, lang, version, opaque, flag, remark, ext, body, kind, None)
    raise FrameError(f"unknown serialize type {kind}")


# -- bodies ----------------------------------------------------------------------------------------------------------
def _props(text: str) -> dict[str, str]:
    out = {}
    for item in text.split("\x02"):
        if item:
            key, _, value = item.partition("\x01")
            out[key] = value
    return out


def decode_records(data: bytes) -> list[dict[str, object]]:
    """Stored message records back to back (pull, query and view bodies; check-back requests), as dicts.

    Layout (``MessageDecoder``): TOTALSIZE i32, MAGIC i32, BODYCRC i32, QUEUEID i32, FLAG i32, QUEUEOFFSET i64,
    PHYSICALOFFSET i64, SYSFLAG i32, BORNTIMESTAMP i64, BORNHOST (4 or 16 bytes + i32 port), STORETIMESTAMP i64,
    STOREHOST (4 or 16 + i32), RECONSUMETIMES i32, PREPAREDTRANSACTIONOFFSET i64, i32 + body, topic length (i8, or
    i16 with magic 0xDAA320AB) + topic, i16 + properties.
    """
    out: list[dict[str, object]] = []
    pos = 0
    while pos + 8 <= len(data):
        total, magic = struct.unpack_from(">iI", data, pos)
        if total <= 0 or pos + total > len(data):
            out.append({"error": f"record at {pos}: total size {total} with {len(data) - pos} bytes left"})
            break
        rec: dict[str, object] = {"totalSize": total, "magic": f"0x{magic:08X}"}
        p = pos + 8
        rec["bodyCRC"], rec["queueId"], rec["flag"], rec["queueOffset"], rec["physicalOffset"], rec["sysFlag"], \
            rec["bornTimestamp"] = struct.unpack_from(">iiiqqiq", data, p)
        p += 40
        sys_flag = int(rec["sysFlag"])  # type: ignore[arg-type]
        born_len = 16 if sys_flag & 0x10 else 4
        born_family = socket.AF_INET6 if born_len == 16 else socket.AF_INET
        rec["bornHost"] = (f"{socket.inet_ntop(born_family, data[p:p + born_len])}"
                           f":{struct.unpack_from('>i', data, p + born_len)[0]}")
        p += born_len + 4
        (rec["storeTimestamp"],) = struct.unpack_from(">q", data, p)
        p += 8
        store_len = 16 if sys_flag & 0x20 else 4
        store_family = socket.AF_INET6 if store_len == 16 else socket.AF_INET
        rec["storeHost"] = (f"{socket.inet_ntop(store_family, data[p:p + store_len])}"
                            f":{struct.unpack_from('>i', data, p + store_len)[0]}")
        p += store_len + 4
        rec["reconsumeTimes"], rec["preparedTransactionOffset"], body_len = struct.unpack_from(">iqi", data, p)
        p += 16
        body = data[p:p + body_len]
        p += body_len
        if magic == 0xDAA320AB:
            (tlen,) = struct.unpack_from(">h", data, p)
            p += 2
        else:
            tlen = data[p]
            p += 1
        rec["topic"] = data[p:p + tlen].decode("utf-8", "replace")
        p += tlen
        (plen,) = struct.unpack_from(">h", data, p)
        rec["properties"] = _props(data[p + 2:p + 2 + plen].decode("utf-8", "replace"))
        rec["body"] = _short(body, 64)
        rec["bodyLen"] = body_len
        out.append(rec)
        pos += total
    return out


def _decode_batch(data: bytes) -> list[dict[str, object]]:
    """SEND_BATCH_MESSAGE's body: per message TOTALSIZE i32, MAGIC i32, BODYCRC i32, FLAG i32, i32 + body,
    i16 + properties."""
    out: list[dict[str, object]] = []
    pos = 0
    while pos + 20 <= len(data):
        total, magic, crc, flag, blen = struct.unpack_from(">iiiii", data, pos)
        if total <= 0 or pos + total > len(data):
            out.append({"error": f"message at {pos}: total size {total} with {len(data) - pos} bytes left"})
            break
        p = pos + 20
        body = data[p:p + blen]
        p += blen
        (plen,) = struct.unpack_from(">h", data, p)
        props = _props(data[p + 2:p + 2 + plen].decode("utf-8", "replace"))
        out.append({"totalSize": total, "magic": magic, "bodyCRC": crc, "flag": flag, "body": _short(body, 64),
                    "bodyLen": blen, "properties": props})
        pos += total
    return out


def _short(data: bytes, limit: int) -> str:
    try:
        text = data.decode("utf-8")
        if text.isprintable():
            return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"
    except UnicodeDecodeError:
        pass
    return f"hex:{data[:limit].hex()}" + ("" if len(data) <= limit else f"... ({len(data)} bytes)")


def _text_body(body: bytes) -> str | None:
    if not body or body[:1] not in (b"{", b"["):
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def describe_body(frame: Frame, request_code: int | None, limit: int = 12000) -> list[str]:
    """Lines describing a frame's body: JSON text, decoded message records or batch, else a hex head."""
    body = frame.body
    if not body:
        return []
    code = request_code if frame.is_response else frame.code
    lines = [f"  body: {len(body)} bytes"]
    try:
        if (frame.is_response and frame.code == 0 and code in _RECORD_RESPONSES) or \
                (not frame.is_response and frame.code in _RECORD_REQUESTS):
            for rec in decode_records(body):
                lines.append(f"    record {json.dumps(rec, ensure_ascii=False)}")
            return lines
        if not frame.is_response and frame.code == 320:
            for rec in _decode_batch(body):
                lines.append(f"    batch message {json.dumps(rec, ensure_ascii=False)}")
            return lines
    except (struct.error, IndexError, ValueError) as exc:
        lines.append(f"    (records do not decode: {exc})")
    text = _text_body(body)
    if text is None and body[:1] == b"x":  # zlib (REGISTER_BROKER with compressed=true)
        try:
            text = _text_body(zlib.decompress(body))
            if text is not None:
                lines.append("    (zlib-compressed; inflated:)")
        except zlib.error:
            text = None
    if text is not None:
        shown = text if len(text) <= limit else f"{text[:limit]} ... ({len(text) - limit} more chars)"
        lines.append(f"    text: {shown}")
    else:
        lines.append(f"    {_short(body, 256)}")
    return lines


def describe_frame(frame: Frame, request_code: int | None = None) -> list[str]:
    """A frame as text lines: kind, code (named), opaque, flag, version, language, serialize type, remark, the
    raw JSON header (a binary header: each extField), and the body."""
    if frame.is_response:
        name = RESPONSE_CODES.get(frame.code, "?")
        what = REQUEST_CODES.get(request_code, "?") if request_code is not None else "unmatched"
        kind = f"RESPONSE code={frame.code} {name} to {what}({request_code})"
    else:
        kind = f"{'ONEWAY ' if frame.is_oneway else ''}REQUEST code={frame.code} {REQUEST_CODES.get(frame.code, '?')}"
    lines = [f"{kind} opaque={frame.opaque} flag={frame.flag} version={frame.version} language={frame.language} "
             f"serialize={'JSON' if frame.serialize_type == SERIALIZE_JSON else 'ROCKETMQ'}"]
    if frame.remark is not None:
        lines.append(f"  remark: {frame.remark!r}")
    if frame.header_text is not None:  # the JSON header exactly as sent: key order, quoting, every field
        lines.append(f"  json header: {frame.header_text}")
    else:  # a binary header: its extFields one per line
        for key, value in frame.ext_fields.items():
            shown = value.replace("\x01", "\\u0001").replace("\x02", "\\u0002")
            lines.append(f"  ext {key} = {shown}")
    lines.extend(describe_body(frame, request_code))
    return lines


# -- a client --------------------------------------------------------------------------------------------------------
async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """One frame's bytes after the length prefix, or None at end of stream."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError:
        return None
    (length,) = struct.unpack(">i", head)
    if length < 4 or length > MAX_FRAME:
        raise FrameError(f"frame length {length} out of range")
    return await reader.readexactly(length)


def request(addr: str, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"", *,
            timeout: float = 5.0, serialize_type: int = SERIALIZE_JSON, version: int = 479) -> Frame:
    """Send one request to ``host:port`` over a new connection and return the response (blocking)."""
    host, port = addr.rsplit(":", 1)
    frame = Frame(code, "JAVA", version, 1, 0, None, dict(ext_fields or {}), body, serialize_type)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode_frame(frame))
        buf = b""
        while True:
            if len(buf) >= 4:
                (length,) = struct.unpack_from(">i", buf)
                if length < 4 or length > MAX_FRAME:  # not a remoting server (an HTTP one answers "HTTP...")
                    raise FrameError(f"{addr} answered {buf[:16]!r}: not a remoting frame")
                if len(buf) >= 4 + length:
                    return decode_frame(buf[4:4 + length])
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"{addr} closed the connection before answering code {code}")
            buf += chunk


# -- the relay -------------------------------------------------------------------------------------------------------
class CaptureRelay:
    """Listens on each route's address, forwards connections to its target, and logs every frame.

    ``routes``: ``{"127.0.0.2:9876": "127.0.0.1:9876", ...}``; ``names`` labels a listen address in the log
    (``namesrv``, ``broker-a``).  Runs its own event loop on a thread: :meth:`start`, :meth:`mark`, :meth:`stop`.
    """

    def __init__(self, routes: dict[str, str], log_path: Path, names: dict[str, str] | None = None) -> None:
        self.routes = dict(routes)
        self.names = dict(names or {})
        self.log_path = Path(log_path)
        self._log: TextIO | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._conns = 0
        self._t0 = time.monotonic()
        self._writers: set[asyncio.StreamWriter] = set()
        self.frames = 0

    def start(self) -> CaptureRelay:
        """Open the log and the listening sockets; returns once they listen."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a", encoding="utf-8")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self._listen())
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name="capture-relay", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]
        self._write([f"# relay {self.names.get(k, k)}: {k} -> {v}" for k, v in self.routes.items()])
        return self

    async def _listen(self) -> None:
        for listen, target in self.routes.items():
            host, port = listen.rsplit(":", 1)
            server = await asyncio.start_server(lambda r, w, lt=listen, tg=target: self._serve(r, w, lt, tg),
                                                host, int(port), reuse_address=True)
            self._servers.append(server)

    def mark(self, text: str) -> None:
        """A separator line in the log (``=== text``): where a step of a flow begins."""
        self._write(["", f"=== [{time.monotonic() - self._t0:9.3f}] {text}"])

    def stop(self) -> None:
        """Close the listeners and every relayed connection, stop the loop, close the log."""
        loop = self._loop
        if loop is not None and loop.is_running():
            async def close() -> None:
                for server in self._servers:
                    server.close()
                for writer in list(self._writers):
                    writer.close()
                # the connections' pumps see their sockets closed and end; wait for them rather than cancel them
                # (3.11's start_server callback raises on a cancelled connection task)
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                if tasks:
                    await asyncio.wait(tasks, timeout=5)
            asyncio.run_coroutine_threadsafe(close(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> CaptureRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write(self, lines: Iterable[str]) -> None:
        with self._lock:
            if self._log is not None:
                self._log.write("\n".join(lines) + "\n")
                self._log.flush()

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter, listen: str,
                     target: str) -> None:
        self._conns += 1
        conn = self._conns
        host, port = target.rsplit(":", 1)
        peer = cwriter.get_extra_info("peername")
        server_name = self.names.get(listen, listen)
        try:
            sreader, swriter = await asyncio.open_connection(host, int(port))
        except OSError as exc:
            self._write([f"[{time.monotonic() - self._t0:9.3f}] conn#{conn} {peer} -> {server_name}: "
                         f"target {target} refused: {exc}"])
            cwriter.close()
            return
        self._writers.update((cwriter, swriter))
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._write([f"[{time.monotonic() - self._t0:9.3f}] conn#{conn} open {client} -> {server_name}"])
        pending_c2s: dict[int, int] = {}  # opaque -> code of requests the client sent
        pending_s2c: dict[int, int] = {}  # opaque -> code of requests the server sent
        await asyncio.gather(
            self._pump(creader, swriter, f"conn#{conn} {client} -> {server_name}", pending_c2s, pending_s2c),
            self._pump(sreader, cwriter, f"conn#{conn} {server_name} -> {client}", pending_s2c, pending_c2s))
        self._write([f"[{time.monotonic() - self._t0:9.3f}] conn#{conn} closed"])
        self._writers.difference_update((cwriter, swriter))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, label: str,
                    mine: dict[int, int], theirs: dict[int, int]) -> None:
        """Forward frames one way; ``mine`` holds the opaques of requests sent this way, ``theirs`` the other's."""
        raw_mode = False
        try:
            while True:
                if raw_mode:
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    writer.write(chunk)
                    await writer.drain()
                    continue
                try:
                    head = await reader.readexactly(4)
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        writer.write(exc.partial)
                    break
                (length,) = struct.unpack(">i", head)
                if length < 4 or length > MAX_FRAME:
                    self._write([f"[{time.monotonic() - self._t0:9.3f}] {label}: length {length} is not a "
                                 "frame; relaying raw bytes from here on"])
                    writer.write(head)
                    raw_mode = True
                    continue
                try:
                    payload = await reader.readexactly(length)
                except asyncio.IncompleteReadError as exc:
                    writer.write(head + exc.partial)
                    break
                writer.write(head + payload)
                await writer.drain()
                self._log_frame(label, payload, mine, theirs)
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                writer.close()
            except RuntimeError:
                pass

    def _log_frame(self, label: str, payload: bytes, mine: dict[int, int], theirs: dict[int, int]) -> None:
        stamp = f"[{time.monotonic() - self._t0:9.3f}] {label}"
        try:
            frame = decode_frame(payload)
        except FrameError as exc:
            self._write([f"{stamp}: undecodable frame ({exc}): {payload[:128].hex()}"])
            return
        self.frames += 1
        request_code = None
        if frame.is_response:
            request_code = theirs.pop(frame.opaque, None)
        elif not frame.is_oneway:
            mine[frame.opaque] = frame.code
        lines = describe_frame(frame, request_code)
        self._write([f"{stamp}: {lines[0]}", *lines[1:]])


def main(argv: list[str] | None = None) -> None:
    """Run a relay until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", action="append", required=True, metavar="LISTEN=TARGET",
                        help="host:port to listen on = host:port to forward to (repeatable)")
    parser.add_argument("--log", required=True, type=Path, help="the transcript file (appended to)")
    args = parser.parse_args(argv)
    routes = dict(r.split("=", 1) for r in args.route)
    relay = CaptureRelay(routes, args.log).start()
    print(f"relaying {routes}; logging to {args.log}", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        relay.stop()


if __name__ == "__main__":
    main()
