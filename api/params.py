"""Constrained request values shared by the HTTP apps (broker, name server, gateway), defined once.

Each type declares its constraint in the OpenAPI schema (pattern, length, range), so generated or
hand-written clients see the limits, and FastAPI enforces it before the endpoint runs.  A value that
breaks a constraint is answered with the code the logic behind the endpoint would give (TOPIC_ILLEGAL,
GROUP_ILLEGAL, QUEUE_ID_ILLEGAL, OFFSET_ILLEGAL, ...): :func:`coded` re-types the pydantic error with the
code's name and :func:`sparkmq.api.errors.install_error_handlers` answers that code.  Values of the wrong
type (a string for an integer) stay INVALID_ARGUMENT.

The limits come from the modules that enforce them for every protocol (``platform.common.validation``,
``platform.common.protocol``, the topic table, the route table): these types only publish them.
"""
from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, StringConstraints, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError

from ..platform.broker.client_manager import MAX_CLIENT_ID_LENGTH
from ..platform.broker.lake_index import MAX_HITS
from ..platform.broker.topics import MAX_QUEUE_NUMS
from ..platform.common.errors import ErrorCode
from ..platform.common.filtering import FILTER_TYPES
from ..platform.common.protocol import MAX_BULK_PULL_BATCH, MAX_LONG_POLL_MS, MAX_MSG_ID_LENGTH, MAX_PULL_BATCH
from ..platform.common.validation import (
    ADDR_PATTERN,
    MAX_GROUP_LENGTH,
    MAX_NODE_NAME_LENGTH,
    MAX_SYSTEM_TOPIC_LENGTH,
    MAX_TOPIC_LENGTH,
    NAME_CHARS,
    NODE_NAME_CHARS,
    SYSTEM_TOPIC_PREFIXES,
)
from ..platform.namesrv import route_table
from ..platform.namesrv.perm import PERM_MAX

__all__ = [
    "coded",
    "any_case",
    "TOPIC_PATTERN",
    "GROUP_PATTERN",
    "TopicName",
    "GroupName",
    "ClientId",
    "QueueId",
    "QueueCount",
    "Offset",
    "EpochMs",
    "NonNegative",
    "SysFlag",
    "WaitMs",
    "PullMax",
    "DlqMax",
    "Perm",
    "FilterType",
    "TransactionAction",
    "ClusterName",
    "BrokerName",
    "HostPort",
    "NamesrvQueueCount",
    "QueryMax",
    "DelayMs",
    "DelayLevel",
    "NonEmpty",
    "MsgId",
    "MAX_JSON_INT",
    "MAX_INT31",
]

#: The largest integer every JSON reader holds exactly (an IEEE double's 2**53 - 1, JavaScript's
#: Number.MAX_SAFE_INTEGER): the bound declared for offsets, times and versions (the logic's own is 2**63 - 1;
#: larger numbers would reach a client rounded, and a schema maximum above it is not exact either).
MAX_JSON_INT = 2**53 - 1
MAX_INT31 = 2**31 - 1

# The pydantic error types of a broken constraint (as opposed to a wrong type, which stays INVALID_ARGUMENT).
_CONSTRAINT_ERRORS = frozenset({"string_pattern_mismatch", "string_too_short", "string_too_long", "greater_than",
                                "greater_than_equal", "less_than", "less_than_equal", "literal_error", "enum",
                                "too_short", "too_long"})


def coded(code: ErrorCode, rule: str) -> WrapValidator:
    """A validator that answers a broken constraint of the value it wraps as ``code`` (``rule`` says the limit).

    The pydantic error's type becomes ``code.name``; the app's error handler maps it back to ``code``.
    """
    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if not any(err["type"] in _CONSTRAINT_ERRORS for err in exc.errors()):
                raise
            raise PydanticCustomError(code.name, "{rule}, got {value}", {"rule": rule, "value": repr(value)[:80]}
                                      ) from None
    return WrapValidator(check)


def any_case(*words: str) -> str:
    """A JSON-Schema-compatible pattern (no inline flags) matching exactly one of ``words`` in any letter case."""
    def letters(word: str) -> str:
        return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in word)
    return "^(?:" + "|".join(letters(w) for w in words) + ")$"


# -- names ------------------------------------------------------------------------------------------
#: A topic: 1..127 name characters, or a retry/DLQ topic (its prefix, then name characters) up to 255.
TOPIC_PATTERN = "^(?:" + "|".join(
    [f"{re.escape(p)}{NAME_CHARS}{{0,{MAX_SYSTEM_TOPIC_LENGTH - len(p)}}}" for p in SYSTEM_TOPIC_PREFIXES]
    + [f"{NAME_CHARS}{{1,{MAX_TOPIC_LENGTH}}}"]) + ")$"
#: A consumer or producer group: 1..120 name characters.
GROUP_PATTERN = f"^{NAME_CHARS}{{1,{MAX_GROUP_LENGTH}}}$"

TopicName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_SYSTEM_TOPIC_LENGTH, pattern=TOPIC_PATTERN),
    coded(ErrorCode.TOPIC_ILLEGAL, f"a topic is 1..{MAX_TOPIC_LENGTH} characters of {NAME_CHARS} "
                                   f"(retry and DLQ topics up to {MAX_SYSTEM_TOPIC_LENGTH})"),
    Field(description=f"1..{MAX_TOPIC_LENGTH} characters of {NAME_CHARS}; %RETRY%/%DLQ% topics up to "
                      f"{MAX_SYSTEM_TOPIC_LENGTH} (percent-encode % and | in paths)")]
GroupName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_GROUP_LENGTH, pattern=GROUP_PATTERN),
    coded(ErrorCode.GROUP_ILLEGAL, f"a group is 1..{MAX_GROUP_LENGTH} characters of {NAME_CHARS}"),
    Field(description=f"1..{MAX_GROUP_LENGTH} characters of {NAME_CHARS}")]
#: A client id over HTTP: visible ASCII (the ids clients make: ``ip@pid#...``), no spaces.
ClientId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_CLIENT_ID_LENGTH, pattern="^[!-~]+$"),
    coded(ErrorCode.INVALID_ARGUMENT, f"a client id is 1..{MAX_CLIENT_ID_LENGTH} visible ASCII characters"),
    Field(description=f"1..{MAX_CLIENT_ID_LENGTH} visible ASCII characters, no spaces")]
_CLUSTER_RULE = f"1..{MAX_NODE_NAME_LENGTH} characters of {NODE_NAME_CHARS}"
ClusterName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NODE_NAME_LENGTH,
                           pattern=f"^{NODE_NAME_CHARS}+$"),
    coded(ErrorCode.INVALID_ARGUMENT, f"a cluster name is {_CLUSTER_RULE}"), Field(description=_CLUSTER_RULE)]
BrokerName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NODE_NAME_LENGTH,
                           pattern=f"^{NODE_NAME_CHARS}+$"),
    coded(ErrorCode.INVALID_ARGUMENT, f"a broker name is {_CLUSTER_RULE}"), Field(description=_CLUSTER_RULE)]
# The pattern says all the route table checks (validation.Addr), the port's 1..65535 included.
HostPort = Annotated[
    str, StringConstraints(max_length=300, pattern=ADDR_PATTERN),
    coded(ErrorCode.INVALID_ARGUMENT, "an address is host:port with a port in 1..65535"),
    Field(description="host:port (IPv4, hostname or [IPv6]), port 1..65535")]

# -- numbers ----------------------------------------------------------------------------------------
QueueId = Annotated[int, Field(ge=0, le=MAX_QUEUE_NUMS - 1, description="a queue of the topic (0-based)"),
                    coded(ErrorCode.QUEUE_ID_ILLEGAL, f"a queue id is in 0..{MAX_QUEUE_NUMS - 1}")]
QueueCount = Annotated[int, Field(ge=1, le=MAX_QUEUE_NUMS),
                       coded(ErrorCode.INVALID_ARGUMENT, f"a queue count is in 1..{MAX_QUEUE_NUMS}")]
#: Queue counts as brokers announce them to a name server (0 allowed: a topic being retired).
NamesrvQueueCount = Annotated[int, Field(ge=0, le=route_table.MAX_QUEUE_NUMS),
                              coded(ErrorCode.INVALID_ARGUMENT,
                                    f"a queue count is in 0..{route_table.MAX_QUEUE_NUMS}")]
Offset = Annotated[int, Field(ge=0, le=MAX_JSON_INT, description="a queue offset (>= 0)"),
                   coded(ErrorCode.OFFSET_ILLEGAL, f"an offset is in 0..{MAX_JSON_INT}")]
EpochMs = Annotated[int, Field(ge=0, le=MAX_JSON_INT, description="epoch milliseconds"),
                    coded(ErrorCode.INVALID_ARGUMENT, "a time is epoch milliseconds >= 0")]
NonNegative = Annotated[int, Field(ge=0, le=MAX_JSON_INT),
                        coded(ErrorCode.INVALID_ARGUMENT, f"the value is in 0..{MAX_JSON_INT}")]
#: A topic's system flag bits (a 32-bit signed field, non-negative).
SysFlag = Annotated[int, Field(ge=0, le=MAX_INT31), coded(ErrorCode.INVALID_ARGUMENT, f"the flag is in 0..{MAX_INT31}")]
WaitMs = Annotated[int, Field(ge=0, le=MAX_LONG_POLL_MS,
                              description=f"long-poll hold in ms, 0..{MAX_LONG_POLL_MS} (MAX_LONG_POLL_MS)"),
                   coded(ErrorCode.INVALID_ARGUMENT, f"wait_ms is in 0..{MAX_LONG_POLL_MS}")]
PullMax = Annotated[int, Field(ge=1, le=MAX_BULK_PULL_BATCH,
                               description=f"1..{MAX_PULL_BATCH}; up to {MAX_BULK_PULL_BATCH} for an unfiltered "
                                           f"Arrow pull without a group"),
                    coded(ErrorCode.INVALID_ARGUMENT, f"max is in 1..{MAX_BULK_PULL_BATCH}")]
DlqMax = Annotated[int, Field(ge=1, le=MAX_PULL_BATCH, description=f"1..{MAX_PULL_BATCH}"),
                   coded(ErrorCode.INVALID_ARGUMENT, f"max is in 1..{MAX_PULL_BATCH}")]
QueryMax = Annotated[int, Field(ge=1, le=MAX_HITS, description=f"1..{MAX_HITS}"),
                     coded(ErrorCode.INVALID_ARGUMENT, f"max is in 1..{MAX_HITS}")]
#: A timer message's delay (the send processor's bound; the broker's timer_max_delay_s applies as well).
DelayMs = Annotated[int, Field(ge=0, le=MAX_JSON_INT, description="deliver after this many ms (<= timer_max_delay_s)"),
                    coded(ErrorCode.INVALID_ARGUMENT, f"delay_ms is in 0..{MAX_JSON_INT}")]
#: A delay level: 0 = none, 1..the broker's level count (message_delay_level).
DelayLevel = Annotated[int, Field(ge=0, le=MAX_INT31, description="0 = none, 1..levels of message_delay_level"),
                       coded(ErrorCode.INVALID_ARGUMENT, "a delay level is >= 0")]
NonEmpty = Annotated[str, StringConstraints(min_length=1),
                     coded(ErrorCode.INVALID_ARGUMENT, "the value must not be empty")]
MsgId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_MSG_ID_LENGTH),
                  coded(ErrorCode.INVALID_ARGUMENT, f"a message id is 1..{MAX_MSG_ID_LENGTH} characters"),
                  Field(description=f"1..{MAX_MSG_ID_LENGTH} characters")]
Perm = Annotated[int, Field(ge=0, le=PERM_MAX, description=f"READ=4 | WRITE=2 | INHERIT=1 (0..{PERM_MAX})"),
                 coded(ErrorCode.INVALID_ARGUMENT, f"perm is in 0..{PERM_MAX}")]

# -- enumerations (case-insensitive, as the logic reads them) ----------------------------------------
FilterType = Annotated[str, StringConstraints(pattern=any_case(*FILTER_TYPES)),
                       coded(ErrorCode.FILTER_EXPRESSION_ILLEGAL, f"the filter type is one of {list(FILTER_TYPES)}"),
                       Field(description=f"{' or '.join(FILTER_TYPES)} (any case)")]
TransactionAction = Annotated[str, StringConstraints(pattern=any_case("COMMIT", "ROLLBACK", "UNKNOWN")),
                              coded(ErrorCode.INVALID_ARGUMENT, "the action is COMMIT, ROLLBACK or UNKNOWN"),
                              Field(description="COMMIT, ROLLBACK or UNKNOWN (any case)")]
