"""The RPCs between the members of a DLedger group, each message type defined once (msgspec structs).

Every frame on a connection between two members is::

    "RF" | version u8 | reserved u8 | body length u32 (little-endian) | body: one msgpack-encoded message

and the body is a map whose ``"type"`` field names the message.  Every message carries the group
name, the sender's node id, an RPC id (the reply carries the request's) and the sender's current term.

=================  ===================  ==============================================================
request            reply                meaning
=================  ===================  ==============================================================
``vote``           ``vote-reply``       RequestVote (``pre_vote``: only "would you?", nothing changes;
                                        ``transfer``: asked by a leadership transfer, ignores leases)
``append``         ``append-reply``     AppendEntries from ``prev_offset`` (whose entry has
                                        ``prev_term``); no entries = heartbeat; ``commit`` = leader's
                                        commit offset.  The reply's ``end``: the end of the matching
                                        prefix on success, where to retry from on failure
``timeout-now``    ``timeout-now-reply``  leadership transfer: "start an election now"
``acl``            ``acl-reply``        the leader's ACL table (JSON; only over connections authenticated
                                        with the cluster secret): the follower stores it as its own
(any)              ``refused``          the request was not served (wrong group, not a member, bad
                                        entries); the connection is then closed
=================  ===================  ==============================================================

Integers are validated on decode (terms, offsets and ids are non-negative 63-bit numbers, names are
short), so a frame that decodes is well formed; one that does not closes the connection unanswered.
"""
from __future__ import annotations

import struct
from typing import Annotated

import msgspec

__all__ = [
    "FRAME_HEADER",
    "FRAME_MAGIC",
    "FRAME_VERSION",
    "MAX_FRAME_BYTES",
    "AclReply",
    "AclRequest",
    "AppendReply",
    "AppendRequest",
    "Entry",
    "Refusal",
    "Reply",
    "Request",
    "TimeoutNowReply",
    "TimeoutNowRequest",
    "VoteReply",
    "VoteRequest",
    "decode_reply",
    "decode_request",
    "encode_frame",
    "frame_parts",
]

FRAME_MAGIC = b"RF"
FRAME_VERSION = 1
#: magic, version, reserved, body length.
FRAME_HEADER = struct.Struct("<2sBxI")
#: Largest body accepted: an AppendEntries batch (max_append_bytes, 1 MiB by default) plus at least one
#: whole entry, which may be a large batch of records (4 MiB messages) -- anything bigger is garbage.
MAX_FRAME_BYTES = 64 << 20

_U63 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
_NAME = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]


class Entry(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One log entry in an AppendEntries: its term and its bytes (it starts where the previous one ends)."""

    term: _U63
    data: bytes


class _Message(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True):
    group: _NAME
    sender: _NAME
    rpc_id: _U63
    term: _U63


class VoteRequest(_Message, tag="vote", frozen=True):
    """RequestVote: ``term`` is the term the candidate runs for; its log ends at ``last_offset`` in ``last_term``."""

    last_offset: _U63
    last_term: _U63
    #: A pre-vote: would the receiver vote for this log in ``term``?  Changes nothing on the receiver.
    pre_vote: bool = False
    #: Sent by a node told to campaign by the leader (TimeoutNow): receivers ignore their leader lease.
    transfer: bool = False


class VoteReply(_Message, tag="vote-reply", frozen=True):
    """The answer to a (pre-)vote; ``term`` is the voter's current term."""

    granted: bool


class AppendRequest(_Message, tag="append", frozen=True):
    """AppendEntries: ``entries`` follow the entry ending at ``prev_offset`` (of term ``prev_term``)."""

    prev_offset: _U63
    prev_term: _U63
    #: The leader's commit offset.
    commit: _U63
    entries: list[Entry] = []


class AppendReply(_Message, tag="append-reply", frozen=True):
    """``success``: the log matches the leader's up to ``end``; otherwise retry at or below ``end``."""

    success: bool
    end: _U63


class TimeoutNowRequest(_Message, tag="timeout-now", frozen=True):
    """From the leader to the target of a leadership transfer: campaign now, in the term after ``term``."""


class TimeoutNowReply(_Message, tag="timeout-now-reply", frozen=True):
    """Whether the target starts an election."""

    accepted: bool


class AclRequest(_Message, tag="acl", frozen=True):
    """From the leader of ``term``: its ACL table (``config/acl.json``'s JSON), for the follower to store."""

    table: bytes


class AclReply(_Message, tag="acl-reply", frozen=True):
    """Whether the follower took the table (only from its current leader, over an authenticated connection)."""

    accepted: bool


class Refusal(_Message, tag="refused", frozen=True):
    """A request that was not served; the connection closes after it."""

    reason: str


Request = VoteRequest | AppendRequest | TimeoutNowRequest | AclRequest
Reply = VoteReply | AppendReply | TimeoutNowReply | AclReply | Refusal

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)


def encode_frame(message: Request | Reply) -> bytes:
    """One frame (header and body) carrying ``message``."""
    return b"".join(frame_parts(message))


def frame_parts(message: Request | Reply) -> tuple[bytes, bytes]:
    """The frame carrying ``message`` as (header, body), to write with ``writelines``: an AppendEntries body
    is up to a MiB, and joining the two would copy it once more."""
    body = _encoder.encode(message)
    return FRAME_HEADER.pack(FRAME_MAGIC, FRAME_VERSION, len(body)), body


def decode_request(body: bytes) -> Request:
    """A request from a frame body; ``msgspec.DecodeError`` (or ``ValidationError``) when it is not one."""
    return _request_decoder.decode(body)


def decode_reply(body: bytes) -> Reply:
    """A reply from a frame body; ``msgspec.DecodeError`` (or ``ValidationError``) when it is not one."""
    return _reply_decoder.decode(body)
