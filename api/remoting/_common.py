"""What the broker's remoting handlers share: the handler and ACL-needs types, replies, bodies, threads."""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread
import msgspec

from ...platform.auth import Action, Need, Resource
from ...platform.common.codec import decode_properties
from ...platform.common.errors import ErrorCode, SparkMQError
from ...platform.common.protocol import RESPONSE_SUCCESS, ExtHeader
from ...platform.remoting import Deferred, Frame, Reply, ServerConnection

if TYPE_CHECKING:
    from . import BrokerRemoting

__all__ = ["Handler", "NeedsOf", "SIGNED", "Family", "reply", "json_body", "threaded", "peer_host", "client_id_of",
           "properties_of", "sub_topic", "sub_group", "CLIENT_ID", "encode_json"]

T = TypeVar("T")

#: ``handler(conn, frame)``: a :class:`Reply`, an awaitable of one, a :class:`Deferred` one, or None (an empty
#: success; nothing for a ONEWAY request).
Handler = Callable[[ServerConnection, Frame], "Reply | Awaitable[Reply | None] | Deferred | None"]
#: What a request needs with ACL on: ``needs(frame)`` -> (action, resource) pairs, or :data:`SIGNED` (any
#: authenticated user).  A code with no entry needs a super user.
NeedsOf = Callable[[Frame], list[Need]]
SIGNED = "signed"
#: ``family(remoting)`` -> its handlers by request code, and what each needs with ACL on.
Family = Callable[["BrokerRemoting"], tuple[dict[int, Handler], dict[int, "NeedsOf | str"]]]

#: The connection attribute holding the client id its heartbeats named (pushes go there).
CLIENT_ID = "client_id"

encode_json = msgspec.json.Encoder().encode
_decoders: dict[type, msgspec.json.Decoder[object]] = {}


def reply(ext: ExtHeader | Mapping[str, str] | None = None, body: bytes | memoryview = b"", *,
          code: int = RESPONSE_SUCCESS, remark: str | None = None) -> Reply:
    """A response with ``code`` (success by default), its header fields and body."""
    return Reply(code, ext, body, remark)


def json_body(frame: Frame, kind: type[T]) -> T:
    """The frame's JSON body as ``kind``; INVALID_ARGUMENT naming what is wrong when it is not one."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(frame.body)  # type: ignore[return-value]
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"bad {kind.__name__} body: {exc}") from None


def properties_of(text: str | None) -> dict[str, str]:
    """A message's properties string (``name\\x01value\\x02`` pairs) as a map; MESSAGE_ILLEGAL when it is not
    UTF-8 text (an unpaired surrogate from a JSON escape)."""
    if not text:
        return {}
    try:
        return decode_properties(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"properties are not valid Unicode: {exc.reason}") from None


async def threaded(fn: Callable[[], T], first: Callable[[], None] | None = None) -> T:
    """Run a call that may block (a disk sync, an fsync'ing admin change, a lake read) off the event loop;
    ``first()`` runs on the worker before it (``BrokerRemoting.queued``: SYSTEM_BUSY after too long a wait)."""
    if first is None:
        return await anyio.to_thread.run_sync(fn)

    def run() -> T:
        first()
        return fn()
    return await anyio.to_thread.run_sync(run)


def peer_host(conn: ServerConnection) -> str | None:
    """The client's ``ip:port`` (a message's born host)."""
    return conn.peer if conn.peer != "?" else None


def client_id_of(conn: ServerConnection) -> str | None:
    """The client id the connection's heartbeats named, if any."""
    client = conn.attributes.get(CLIENT_ID)
    return client if isinstance(client, str) else None


def sub_topic(topic: object) -> list[Need]:
    """Subscribing to ``topic`` (nothing when the request does not name one: its handler refuses it)."""
    return [(Action.SUB, Resource.topic(topic))] if isinstance(topic, str) else []


def sub_group(group: object) -> list[Need]:
    """Consuming as ``group``."""
    return [(Action.SUB, Resource.group(group))] if isinstance(group, str) else []
