"""Validation of names, sizes, numbers and addresses, shared by the store, the broker, the clients and pipelines.

Limits follow RocketMQ: topic <= 127 characters (retry and DLQ topics <= 255),
group <= 120, characters ``[%|a-zA-Z0-9_-]``, body <= 4 MiB, properties < 32 KiB.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import sys
import types
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from msgspec import Meta

from .errors import ErrorCode, SparkMQError

__all__ = [
    "MAX_TOPIC_LENGTH",
    "MAX_SYSTEM_TOPIC_LENGTH",
    "MAX_GROUP_LENGTH",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_PROPERTIES_SIZE",
    "NAME_CHARS",
    "SYSTEM_TOPIC_PREFIXES",
    "validate_topic",
    "validate_group",
    "ADDR_PATTERN",
    "ErrorKind",
    "Port",
    "PortOrOff",
    "Int32",
    "Positive",
    "EpochMs",
    "NonNegative",
    "MillisOrZero",
    "PositiveInt32",
    "TimeoutMs",
    "Seconds",
    "SecondsOrZero",
    "Ratio",
    "Addr",
    "NODE_NAME_CHARS",
    "MAX_NODE_NAME_LENGTH",
    "NodeName",
    "MAX_QUEUE_NUMS",
    "MAX_ROUTE_QUEUE_NUMS",
    "MAX_CLIENT_ID_LENGTH",
    "MAX_RECONSUME_TIMES",
    "MAX_QUERY_HITS",
    "TOPIC_PATTERN",
    "GROUP_PATTERN",
    "TopicName",
    "GroupName",
    "QueueId",
    "error_code_of",
    "invalid",
    "describe",
    "check",
    "check_int",
    "check_fields",
    "declared_fields",
    "check_addr",
    "split_addr",
    "split_addrs",
]

T = TypeVar("T")

MAX_TOPIC_LENGTH = 127
MAX_SYSTEM_TOPIC_LENGTH = 255
MAX_GROUP_LENGTH = 120
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
DEFAULT_MAX_PROPERTIES_SIZE = 32767

#: The characters of topic and group names (a regular-expression character class).
NAME_CHARS = "[%|a-zA-Z0-9_-]"
#: Topics with these prefixes (retry and dead-letter topics) may be MAX_SYSTEM_TOPIC_LENGTH long.
SYSTEM_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%")

# fullmatch, not match with $: "$" also matches before a trailing newline.
_NAME_CHARS = re.compile(f"{NAME_CHARS}+")
_RETRY_OR_DLQ = SYSTEM_TOPIC_PREFIXES


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a legal topic name, else raise TOPIC_ILLEGAL."""
    if not isinstance(topic, str) or not topic:
        raise SparkMQError(ErrorCode.TOPIC_ILLEGAL, "the topic must be a non-empty string")
    limit = MAX_SYSTEM_TOPIC_LENGTH if topic.startswith(_RETRY_OR_DLQ) else MAX_TOPIC_LENGTH
    if len(topic) > limit:
        raise SparkMQError(ErrorCode.TOPIC_ILLEGAL, f"the topic is {len(topic)} characters, the limit is {limit}")
    if not _NAME_CHARS.fullmatch(topic):
        raise SparkMQError(ErrorCode.TOPIC_ILLEGAL, f"the topic {topic!r} has characters outside [%|a-zA-Z0-9_-]")
    return topic


def validate_group(group: object) -> str:
    """Return ``group`` if it is a legal group name, else raise GROUP_ILLEGAL."""
    if not isinstance(group, str) or not group:
        raise SparkMQError(ErrorCode.GROUP_ILLEGAL, "the group must be a non-empty string")
    if len(group) > MAX_GROUP_LENGTH:
        raise SparkMQError(ErrorCode.GROUP_ILLEGAL,
                           f"the group is {len(group)} characters, the limit is {MAX_GROUP_LENGTH}")
    if not _NAME_CHARS.fullmatch(group):
        raise SparkMQError(ErrorCode.GROUP_ILLEGAL, f"the group {group!r} has characters outside [%|a-zA-Z0-9_-]")
    return group


# -- declared limits ------------------------------------------------------------------------------------------
# A limit is written once, as a constraint of a type (msgspec's ``Meta``: the same declaration msgspec enforces
# when it decodes and states when it emits a JSON schema), and checked by :func:`check` -- with the name of what
# was checked and the bad value in the error.  :func:`check_fields` checks every declared field of a config
# dataclass; :func:`check_int` is the same check for limits known only at the call site.  A site raises the
# error it always raised: a stable :class:`ErrorCode` (a :class:`SparkMQError`, what clients see), or an
# exception class (``ValueError`` for configs).

#: What a failed check raises: a :class:`SparkMQError` with this code, or what this callable (an exception class,
#: say ``ValueError``) makes of the message.
ErrorKind = ErrorCode | Callable[[str], Exception]

_FLOAT_MAX = sys.float_info.max
_INT32_MAX = 2**31 - 1
# The port 1..65535 as a pattern (no leading zeros), so that the pattern says all the address check does.
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
#: ``host:port``: an IPv4 address, a hostname or a bracketed IPv6 address, and a port in 1..65535.
ADDR_PATTERN = rf"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):({_PORT})$"

#: Access keys of the ACL: what RocketMQ accepts (letters, digits, ``_.-@``), 1..64 characters.
ACCESS_KEY_PATTERN = r"^[A-Za-z0-9_.@-]{1,64}$"
#: Secret keys of the ACL: 6..128 printable ASCII characters without spaces.
SECRET_KEY_PATTERN = r"^[\x21-\x7e]{6,128}$"

#: A TCP port to listen on; 0 = one the OS picks.
Port = Annotated[int, Meta(ge=0, le=65535)]
#: A port that may also be off: -1 = none.
PortOrOff = Annotated[int, Meta(ge=-1, le=65535)]
#: A non-negative Java int (ids, flags, counts that travel as an ``int``).
Int32 = Annotated[int, Meta(ge=0, le=_INT32_MAX)]
#: A count or size of at least one.
Positive = Annotated[int, Meta(ge=1)]
#: A count, size or offset that may be 0.
NonNegative = Annotated[int, Meta(ge=0)]
#: A positive Java int.
PositiveInt32 = Annotated[int, Meta(ge=1, le=_INT32_MAX)]
#: Milliseconds of a timeout or wait, 1 ms .. 1 h.
TimeoutMs = Annotated[int, Meta(ge=1, le=3_600_000)]
#: A point in time in epoch milliseconds (a Java long).
EpochMs = Annotated[int, Meta(ge=0, le=2**63 - 1, description="epoch milliseconds >= 0")]
#: A duration or interval in seconds (an int or a float): finite and > 0.
Seconds = Annotated[float, Meta(gt=0, le=_FLOAT_MAX, description="a finite number of seconds > 0")]
#: A duration in seconds that may be 0.
SecondsOrZero = Annotated[float, Meta(ge=0, le=_FLOAT_MAX, description="a finite number of seconds >= 0")]
#: Milliseconds (an int or a float) that may be 0.
MillisOrZero = Annotated[float, Meta(ge=0, le=_FLOAT_MAX, description="a finite number of milliseconds >= 0")]
#: A share of a whole: 0 < ratio <= 1.
Ratio = Annotated[float, Meta(gt=0, le=1, description="a ratio in (0, 1]")]
#: The characters of cluster, broker and DLedger group names (a regular-expression character class) ...
NODE_NAME_CHARS = "[%|a-zA-Z0-9_.-]"
#: ... and their longest length (as topics).
MAX_NODE_NAME_LENGTH = 127
#: A cluster, broker or DLedger group name.
NodeName = Annotated[str, Meta(pattern=f"^{NODE_NAME_CHARS}{{1,{MAX_NODE_NAME_LENGTH}}}$",
                               description=f"1..{MAX_NODE_NAME_LENGTH} characters of {NODE_NAME_CHARS}")]
#: A ``host:port`` address (see :data:`ADDR_PATTERN`).
Addr = Annotated[str, Meta(pattern=ADDR_PATTERN, max_length=300,
                           description="'host:port' with a port in 1..65535")]

# -- named values of the wire contract ---------------------------------------------------------------------------
# The values a remoting header and an HTTP body (platform.common.http_contract) both carry are typed once, here:
# the header field and the body field name the same type, so their limits cannot differ.  ``extra["error"]`` is
# the code a value breaking the constraint is answered with (what the logic answers: validate_topic's
# TOPIC_ILLEGAL, ...); :func:`error_code_of` reads it.

#: Upper bound on a topic's read or write queue count on one broker; queue ids are below it.
MAX_QUEUE_NUMS = 1024
#: Upper bound on the read/write queue counts a broker may announce to a name server (a sanity limit, not a
#: RocketMQ one).
MAX_ROUTE_QUEUE_NUMS = 65535
#: The longest client id a broker accepts.
MAX_CLIENT_ID_LENGTH = 255
#: The most reconsume times a send-back may allow.
MAX_RECONSUME_TIMES = 10_000
#: The most hits one message query answers (RocketMQ's limit).
MAX_QUERY_HITS = 64
#: A topic: 1..127 name characters, or a retry/DLQ topic (its prefix, then name characters) up to 255 -- what
#: :func:`validate_topic` accepts.
TOPIC_PATTERN = "^(?:" + "|".join(
    [f"{re.escape(p)}{NAME_CHARS}{{0,{MAX_SYSTEM_TOPIC_LENGTH - len(p)}}}" for p in SYSTEM_TOPIC_PREFIXES]
    + [f"{NAME_CHARS}{{1,{MAX_TOPIC_LENGTH}}}"]) + ")$"
#: A consumer or producer group: 1..120 name characters -- what :func:`validate_group` accepts.
GROUP_PATTERN = f"^{NAME_CHARS}{{1,{MAX_GROUP_LENGTH}}}$"

#: A topic name.
TopicName = Annotated[str, Meta(
    min_length=1, max_length=MAX_SYSTEM_TOPIC_LENGTH, pattern=TOPIC_PATTERN,
    description=f"1..{MAX_TOPIC_LENGTH} characters of {NAME_CHARS}; %RETRY%/%DLQ% topics up to "
                f"{MAX_SYSTEM_TOPIC_LENGTH} (percent-encode % and | in paths)",
    extra={"error": ErrorCode.TOPIC_ILLEGAL})]
#: A consumer or producer group name.
GroupName = Annotated[str, Meta(
    min_length=1, max_length=MAX_GROUP_LENGTH, pattern=GROUP_PATTERN,
    description=f"1..{MAX_GROUP_LENGTH} characters of {NAME_CHARS}", extra={"error": ErrorCode.GROUP_ILLEGAL})]
#: A queue of a topic (0-based); the topic's own queue count bounds it further where the topic is known.
QueueId = Annotated[int, Meta(ge=0, le=MAX_QUEUE_NUMS - 1, description="a queue of the topic (0-based)",
                              extra={"error": ErrorCode.QUEUE_ID_ILLEGAL})]


def error_code_of(tp: Any) -> ErrorCode | None:
    """The :class:`ErrorCode` a value breaking the declared type ``tp``'s constraint is answered with (its
    ``Meta``'s ``extra["error"]``; maybe under ``| None`` or another ``Annotated``), or None when it names none."""
    if get_origin(tp) in (Union, types.UnionType):
        return next((c for c in map(error_code_of, get_args(tp)) if c is not None), None)
    if get_origin(tp) is not Annotated:
        return None
    for meta in reversed(tp.__metadata__):
        if isinstance(meta, Meta) and meta.extra and isinstance(meta.extra.get("error"), ErrorCode):
            return cast(ErrorCode, meta.extra["error"])
    return error_code_of(tp.__origin__)  # a description over a named type: ``Annotated[QueueId | None, Meta()]``


@dataclasses.dataclass(frozen=True)
class _Rule:
    """What a declared type allows, read once from its ``Meta``s."""

    kind: type
    optional: bool
    ge: float | None
    gt: float | None
    le: float | None
    lt: float | None
    min_length: int | None
    max_length: int | None
    multiple_of: int | None
    pattern: re.Pattern[str] | None
    description: str

    def allows(self, value: object) -> bool:
        if value is None:
            return self.optional
        if self.kind is bool:
            return isinstance(value, bool)
        if isinstance(value, bool):  # an int subclass: True must not mean 1
            return False
        if self.kind is str:
            return (isinstance(value, str)
                    and (self.min_length is None or len(value) >= self.min_length)
                    and (self.max_length is None or len(value) <= self.max_length)
                    and (self.pattern is None or self.pattern.fullmatch(value) is not None))
        if not isinstance(value, int if self.kind is int else int | float):
            return False
        # Written so that NaN fails every bound, as in msgspec.
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt)
                and (self.multiple_of is None or value % self.multiple_of == 0))


_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _describe(kind: type, ge: float | None, gt: float | None, le: float | None, lt: float | None) -> str:
    if kind is int and ge is not None and le is not None:
        return f"an integer in {ge}..{le}"
    bounds = [f"{op} {bound}" for op, bound in ((">=", ge), (">", gt), ("<=", le), ("<", lt)) if bound is not None]
    return " ".join([_KINDS[kind], " and ".join(bounds)]) if bounds else _KINDS[kind]


@functools.lru_cache(maxsize=512)
def _rule(tp: Any) -> _Rule:
    optional = False
    if get_origin(tp) in (Union, types.UnionType):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) != 1 or len(get_args(tp)) != 2:
            raise TypeError(f"only 'T | None' unions can be checked, not {tp!r}")
        optional, tp = True, members[0]
    metas: tuple[Meta, ...] = ()
    if get_origin(tp) is Annotated:
        metas = tuple(m for m in tp.__metadata__ if isinstance(m, Meta))
        tp = tp.__origin__
    if tp not in _KINDS:
        raise TypeError(f"no check for values of type {tp!r}")

    def last(attr: str) -> Any:
        return next((getattr(m, attr) for m in reversed(metas) if getattr(m, attr) is not None), None)

    ge, gt, le, lt = last("ge"), last("gt"), last("le"), last("lt")
    pattern = last("pattern")
    return _Rule(tp, optional, ge, gt, le, lt, last("min_length"), last("max_length"), last("multiple_of"),
                 re.compile(pattern) if pattern is not None else None,
                 last("description") or _describe(tp, ge, gt, le, lt))


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


def invalid(name: str, value: object, expected: str, error: ErrorKind = ErrorCode.INVALID_ARGUMENT) -> Exception:
    """The error saying ``name`` must be ``expected`` and is ``value`` (for checks no type declares)."""
    message = f"{name} must be {expected}, got {_shown(value)}"
    return SparkMQError(error, message) if isinstance(error, ErrorCode) else error(message)


def describe(tp: Any) -> str:
    """What the declared type ``tp`` allows, in words (``"an integer in 0..65535"``)."""
    return _rule(tp).description


def check(name: str, value: T, tp: Any, error: ErrorKind = ErrorCode.INVALID_ARGUMENT) -> T:
    """``value`` when the declared type ``tp`` allows it; else ``error`` naming ``name`` and the value.

    ``tp`` is ``int``, ``float``, ``str`` or ``bool``, maybe ``Annotated`` with msgspec ``Meta`` limits
    (ge/gt/le/lt, multiple_of, min_length/max_length, pattern -- matched in full -- and a description; give
    one with multiple_of), maybe ``| None``.
    ``bool`` is never an int or a number.

    Example::

        >>> check("port", 80, Port)
        80
        >>> check("port", True, Port, ValueError)
        Traceback (most recent call last):
        ValueError: port must be an integer in 0..65535, got True
    """
    rule = _rule(tp)
    if not rule.allows(value):
        raise invalid(name, value, rule.description, error)
    return value


def check_int(name: str, value: object, low: int, high: int | None = None,
              error: ErrorKind = ErrorCode.INVALID_ARGUMENT) -> int:
    """``value`` when it is an int (never a bool) in ``low..high`` (no upper bound when None); else ``error``.

    For limits known only where they are checked (a topic's queue count); a fixed limit is a declared type.

    Example::

        >>> check_int("queue_id", 3, 0, 7)
        3
    """
    if type(value) is int and low <= value and (high is None or value <= high):
        return value  # the common case, without the rule lookup (the same answer)
    rule = _int_rule(low, high)
    if not rule.allows(value):
        raise invalid(name, value, rule.description, error)
    return value  # type: ignore[return-value]  # allowed: an int


@functools.lru_cache(maxsize=256)
def _int_rule(low: int, high: int | None) -> _Rule:
    return _rule(Annotated[int, Meta(ge=low, le=high)])


def check_fields(obj: object, error: ErrorKind = ValueError, prefix: str = "") -> None:
    """Check every field of the dataclass ``obj`` whose type declares limits (``Annotated`` with ``Meta``,
    maybe ``| None``) or is ``bool``; the first bad one raises ``error`` naming the field (after ``prefix``)
    and its value."""
    for name, tp in declared_fields(type(obj)):
        check(prefix + name, getattr(obj, name), tp, error)


def declared_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """``(name, type)`` of each field of the dataclass ``cls`` that :func:`check_fields` checks."""
    known = _DECLARED.get(cls)
    if known is None:
        known = _DECLARED[cls] = _read_declared_fields(cls)
    return known


_DECLARED: dict[type, tuple[tuple[str, Any], ...]] = {}


def _read_declared_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        bare = next((a for a in get_args(tp) if a is not type(None)), tp) if get_origin(tp) in (
            Union, types.UnionType) and len(get_args(tp)) == 2 else tp
        if bare is bool or (get_origin(bare) is Annotated and any(isinstance(m, Meta) for m in bare.__metadata__)):
            out.append((f.name, tp))
    return tuple(out)


# -- addresses ------------------------------------------------------------------------------------------------
def check_addr(name: str, value: object, error: ErrorKind = ErrorCode.INVALID_ARGUMENT) -> str:
    """``value`` when it is ``host:port`` (:data:`ADDR_PATTERN`); else ``error`` naming ``name`` and the value."""
    return cast(str, check(name, value, Addr, error))


def split_addr(addr: str, name: str = "address", error: ErrorKind = ErrorCode.INVALID_ARGUMENT) -> tuple[str, int]:
    """``(host, port)`` of ``"host:port"`` or ``"[v6]:port"`` (brackets removed, port 0..65535); else ``error``.

    Example::

        >>> split_addr("[::1]:10911")
        ('::1', 10911)
    """
    host, sep, port = addr.rpartition(":") if isinstance(addr, str) else ("", "", "")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise invalid(name, addr, "'host:port' with a port in 0..65535", error)
    return host.strip("[]"), int(port)


def split_addrs(value: object, name: str = "namesrv_addrs", error: ErrorKind = ValueError) -> tuple[str, ...]:
    """Addresses from ``"a:1;b:2"`` (RocketMQ's namesrvAddr spelling; commas and spaces separate too) or a list,
    each checked (:func:`check_addr`), an ``http://`` prefix and a trailing ``/`` dropped, duplicates dropped.

    Example::

        >>> split_addrs("127.0.0.1:9876; http://127.0.0.1:9877/,127.0.0.1:9876")
        ('127.0.0.1:9876', '127.0.0.1:9877')
    """
    if value is None:
        return ()
    if isinstance(value, str):
        items: list[object] = list(re.split(r"[;,\s]+", value))
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise invalid(name, value, "'host:port[;host:port...]' or a list", error)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise invalid(f"an address of {name}", item, "a string", error)
        item = item.strip().removeprefix("http://").rstrip("/")
        if item and check_addr(f"an address of {name}", item, error) not in out:
            out.append(item)
    return tuple(out)
