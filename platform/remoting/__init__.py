"""The transport of the remoting protocol (``docs/remoting.md``): frames, a server, clients.

It carries RocketMQ's frames and knows nothing of brokers or messages: a frame's header is its code,
flags, opaque, remark and extFields (the typed headers of :mod:`sparkmq.platform.common.protocol`).

* :func:`encode_frame` / :class:`FrameDecoder` -- the frame codec; :class:`ProtocolError` on a
  broken stream (the receiver closes the connection).
* :class:`RemotingServer` -- serves ``handler(conn, frame)`` on the running loop;
  :class:`ServerConnection` is one accepted connection (``push`` notices from any thread).
* :class:`RemotingConnection` -- one multiplexed client connection; :class:`AsyncRemotingClient`
  and :class:`SyncRemotingClient` (on the process-wide :class:`LoopThread`) pool them by address.

Errors: an error response raises :class:`~sparkmq.platform.common.errors.SparkMQError` with its
code; a failed, closed or timed-out connection raises :class:`RemotingError`.
"""
from __future__ import annotations

from .client import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    SUCCESS_ONLY,
    Ext,
    PushCallback,
    RemotingConnection,
)
from .codec import (
    Frame,
    FrameData,
    FrameDecoder,
    ProtocolError,
    RemotingError,
    Reply,
    Response,
    decode_header,
    encode_frame,
    encode_rocketmq_header,
    error_from_frame,
    error_reply,
    unsupported_reply,
    write_frame,
)
from .loop import LoopThread, new_event_loop
from .pool import AsyncRemotingClient, SyncRemotingClient
from .server import Deferred, Handler, RemotingServer, ServerConnection

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "SUCCESS_ONLY",
    "AsyncRemotingClient",
    "Ext",
    "Deferred",
    "Frame",
    "FrameData",
    "FrameDecoder",
    "Handler",
    "LoopThread",
    "ProtocolError",
    "PushCallback",
    "RemotingConnection",
    "RemotingError",
    "RemotingServer",
    "Reply",
    "Response",
    "ServerConnection",
    "SyncRemotingClient",
    "decode_header",
    "encode_frame",
    "encode_rocketmq_header",
    "error_from_frame",
    "error_reply",
    "new_event_loop",
    "unsupported_reply",
    "write_frame",
]
