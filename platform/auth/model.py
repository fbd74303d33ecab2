"""The access-control model, in RocketMQ 5 ACL 2.0 terms: users, resources, actions, policies, decisions.

* A :class:`User` is an access key, a secret key and a super-user flag (a super user may do anything).
* A :class:`Policy` names a subject (a user's access key) and its :class:`PolicyEntry` list; an entry allows
  or denies a set of :class:`Action` on a :class:`ResourcePattern` (``Topic:orders``, ``Topic:orders-*``,
  ``Group:*``, ``Cluster``, ``*``) from source addresses (CIDRs; none = any address).
* :meth:`AclTable.decide` answers one question -- may this user do this action on this resource from this
  address -- as RocketMQ does: every entry that matches counts, a matching Deny wins over any Allow, and
  nothing matching means deny.

Everything here is immutable and validated at construction (``ValueError`` naming the bad value); the store
(:mod:`.store`) holds the current :class:`AclTable`.
"""
from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..common.system_topics import DLQ_PREFIX, RETRY_PREFIX
from ..common.validation import ACCESS_KEY_PATTERN, SECRET_KEY_PATTERN, Seconds, check, check_int

__all__ = ["Action", "ADMIN_ACTIONS", "CLUSTER", "Decision", "ResourceType", "ResourcePattern", "Resource", "User",
           "PolicyEntry", "Policy", "AclTable", "parse_actions", "validate_access_key", "validate_secret_key",
           "check_acl_settings"]

_ACCESS_KEY = re.compile(ACCESS_KEY_PATTERN)
_SECRET_KEY = re.compile(SECRET_KEY_PATTERN)
#: Resource names (topics, groups): the broker's name rule, plus ``*`` for patterns.
_RESOURCE_NAME = re.compile(r"^[%|a-zA-Z0-9_.-]{1,255}$")


class Action(enum.StrEnum):
    """What a request does to a resource (RocketMQ's ACL 2.0 actions)."""

    PUB = "Pub"        # send (normal, batch, half message), end a transaction
    SUB = "Sub"        # pull, receive, ack, commit and read a group's offsets, join a group
    CREATE = "Create"  # create a topic
    UPDATE = "Update"  # update a topic, reset offsets, redrive dead letters, cluster changes
    DELETE = "Delete"  # delete a topic
    GET = "Get"        # read a topic's or group's or the broker's state
    LIST = "List"      # list topics and groups


#: ``Admin`` in a policy stands for these (what an operator does that is not Pub or Sub).
ADMIN_ACTIONS = frozenset({Action.CREATE, Action.UPDATE, Action.DELETE, Action.GET, Action.LIST})
_ALIASES = {"all": frozenset(Action), "admin": ADMIN_ACTIONS}
_BY_NAME = {a.value.lower(): a for a in Action}


def parse_actions(value: str | Iterable[str]) -> frozenset[Action]:
    """Actions from ``"Pub,Sub"`` or a list (case-insensitive; ``All`` and ``Admin`` expand).

    Example::

        >>> sorted(parse_actions("pub, Sub"))
        [<Action.PUB: 'Pub'>, <Action.SUB: 'Sub'>]
    """
    items = [p.strip() for p in value.split(",")] if isinstance(value, str) else [str(p).strip() for p in value]
    out: set[Action] = set()
    for item in filter(None, items):
        key = item.lower()
        if key in _ALIASES:
            out |= _ALIASES[key]
        elif key in _BY_NAME:
            out.add(_BY_NAME[key])
        else:
            raise ValueError(f"unknown action {item!r}; known: {[a.value for a in Action]} and All, Admin")
    if not out:
        raise ValueError("a policy entry needs at least one action")
    return frozenset(out)


class Decision(enum.StrEnum):
    """What a matching entry decides."""

    ALLOW = "Allow"
    DENY = "Deny"


class ResourceType(enum.StrEnum):
    """The kinds of resource a request touches."""

    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"


@dataclass(frozen=True, slots=True)
class Resource:
    """One concrete resource a request touches (``Topic:orders``, ``Group:cg``, ``Cluster``)."""

    type: ResourceType
    name: str = ""

    def __str__(self) -> str:
        return self.type.value if self.type is ResourceType.CLUSTER else f"{self.type.value}:{self.name}"

    @classmethod
    def topic(cls, name: str) -> Resource:
        """``Topic:name``; a group's retry or dead-letter topic (``%RETRY%g``, ``%DLQ%g``) is ``Group:g``, as in
        RocketMQ: consumers reach them with their group's permission."""
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if name.startswith(prefix):
                return cls(ResourceType.GROUP, name[len(prefix):])
        return cls(ResourceType.TOPIC, name)

    @classmethod
    def group(cls, name: str) -> Resource:
        """``Group:name``."""
        return cls(ResourceType.GROUP, name)


#: ``Cluster``: the broker itself (its state, membership and ACL administration).
CLUSTER = Resource(ResourceType.CLUSTER)


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """Which resources an entry covers: ``*`` (all), ``Cluster``, ``Topic:name``, ``Topic:prefix*``, ``Topic:*``.

    Example::

        >>> p = ResourcePattern.parse("Topic:orders-*")
        >>> p.matches(Resource.topic("orders-eu")), p.matches(Resource.topic("payments"))
        (True, False)
    """

    type: ResourceType | None  # None = every type (the pattern ``*``)
    name: str = ""             # "" with prefix=True = every name of the type
    prefix: bool = False

    @classmethod
    def parse(cls, text: str) -> ResourcePattern:
        """The pattern of ``text``; ValueError for an unknown type or a bad name."""
        if not isinstance(text, str):
            raise ValueError(f"a resource must be a string, got {text!r}")
        text = text.strip()
        if text == "*":
            return cls(None, "", True)
        kind, sep, name = text.partition(":")
        types = {t.value.lower(): t for t in ResourceType}
        rtype = types.get(kind.strip().lower())
        if rtype is None:
            raise ValueError(f"resource {text!r} must be '*', 'Cluster', 'Topic:<name>' or 'Group:<name>' "
                             f"(a trailing '*' matches a prefix)")
        if rtype is ResourceType.CLUSTER:
            return cls(rtype, "", True)  # one cluster per broker: any name means this one
        if not sep or not name.strip():
            raise ValueError(f"resource {text!r} needs a name after '{rtype.value}:'")
        name = name.strip()
        prefix = name.endswith("*")
        bare = name[:-1] if prefix else name
        if bare and not _RESOURCE_NAME.match(bare):
            raise ValueError(f"resource name {name!r} has characters outside [%|a-zA-Z0-9_.-] (and a final '*')")
        return cls(rtype, bare, prefix)

    def matches(self, resource: Resource) -> bool:
        """Whether ``resource`` is covered."""
        if self.type is None:
            return True
        if self.type is not resource.type:
            return False
        return resource.name.startswith(self.name) if self.prefix else resource.name == self.name

    def __str__(self) -> str:
        if self.type is None:
            return "*"
        if self.type is ResourceType.CLUSTER:
            return "Cluster"
        return f"{self.type.value}:{self.name}{'*' if self.prefix else ''}"


def validate_access_key(value: object) -> str:
    """``value`` when it is a legal access key; ValueError otherwise."""
    if not isinstance(value, str) or not _ACCESS_KEY.match(value):
        raise ValueError(f"an access key must be 1-64 characters of [A-Za-z0-9_.@-], got {value!r}")
    return value


def validate_secret_key(value: object) -> str:
    """``value`` when it is a legal secret key; ValueError otherwise (the message never shows the secret)."""
    if not isinstance(value, str) or not _SECRET_KEY.match(value):
        raise ValueError("a secret key must be 6-128 printable characters without spaces")
    return value


@dataclass(frozen=True, slots=True)
class User:
    """An access key, its secret and whether it is a super user; ``repr`` and :meth:`to_dict` hide the secret."""

    access_key: str
    secret_key: str = field(repr=False)
    super_user: bool = False

    def __post_init__(self) -> None:
        validate_access_key(self.access_key)
        validate_secret_key(self.secret_key)
        check("super_user", self.super_user, bool, ValueError)

    def to_dict(self, *, with_secret: bool = False) -> dict[str, Any]:
        """JSON view; the secret only with ``with_secret`` (the store's file, never an API answer)."""
        out: dict[str, Any] = {"access_key": self.access_key, "super_user": self.super_user}
        if with_secret:
            out["secret_key"] = self.secret_key
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> User:
        """The user of a JSON object (ValueError when malformed)."""
        _only(data, {"access_key", "secret_key", "super_user"}, "user")
        return cls(data.get("access_key"), data.get("secret_key"), data.get("super_user", False))  # type: ignore[arg-type]


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _network(text: object) -> Network:
    if not isinstance(text, str):
        raise ValueError(f"a source address must be an IP or CIDR string, got {text!r}")
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"source address {text!r} is not an IP address or CIDR (10.0.0.0/8, ::1)") from None


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """Allow or deny ``actions`` on ``resource`` from ``source_ips`` (empty = from anywhere)."""

    resource: ResourcePattern
    actions: frozenset[Action]
    decision: Decision = Decision.ALLOW
    source_ips: tuple[Network, ...] = ()

    def applies(self, action: Action, resource: Resource, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
                ) -> bool:
        """Whether this entry speaks about ``action`` on ``resource`` from ``ip``."""
        if action not in self.actions or not self.resource.matches(resource):
            return False
        if not self.source_ips:
            return True
        if ip is None:  # an address we cannot tell never matches an address rule
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip.version == net.version and ip in net for net in self.source_ips)

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"resource": str(self.resource), "actions": sorted(a.value for a in self.actions),
                "decision": self.decision.value, "source_ips": [str(n) for n in self.source_ips]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyEntry:
        """The entry of a JSON object (ValueError when malformed)."""
        _only(data, {"resource", "actions", "decision", "source_ips"}, "policy entry")
        decision = str(data.get("decision", "Allow")).strip().capitalize()
        if decision not in ("Allow", "Deny"):
            raise ValueError(f"decision must be Allow or Deny, got {data.get('decision')!r}")
        ips = data.get("source_ips") or ()
        if isinstance(ips, str):
            ips = [p for p in ips.split(",") if p.strip()]
        return cls(ResourcePattern.parse(data.get("resource")), parse_actions(data.get("actions") or ""),  # type: ignore[arg-type]
                   Decision(decision), tuple(_network(p) for p in ips))


@dataclass(frozen=True, slots=True)
class Policy:
    """Every entry of one subject (a user's access key)."""

    subject: str
    entries: tuple[PolicyEntry, ...]

    def __post_init__(self) -> None:
        validate_access_key(self.subject)

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"subject": self.subject, "entries": [e.to_dict() for e in self.entries]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """The policy of a JSON object (ValueError when malformed)."""
        _only(data, {"subject", "entries"}, "policy")
        entries = data.get("entries")
        if not isinstance(entries, list):
            raise ValueError("a policy needs an 'entries' list")
        return cls(data.get("subject"), tuple(PolicyEntry.from_dict(e) for e in entries))  # type: ignore[arg-type]


def _only(data: object, allowed: set[str], what: str) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"a {what} must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown}; known: {sorted(allowed)}")


@dataclass(frozen=True)
class AclTable:
    """One consistent view of users and policies; :attr:`version` grows with every change."""

    users: Mapping[str, User] = field(default_factory=dict)
    policies: Mapping[str, Policy] = field(default_factory=dict)
    version: int = 0

    def decide(self, access_key: str, action: Action, resource: Resource,
               ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> Decision:
        """Allow or deny: super users may do anything; otherwise a matching Deny wins, then a matching Allow;
        no matching entry (or no such user) is a deny."""
        user = self.users.get(access_key)
        if user is None:
            return Decision.DENY
        if user.super_user:
            return Decision.ALLOW
        policy = self.policies.get(access_key)
        allowed = False
        for entry in policy.entries if policy is not None else ():
            if entry.applies(action, resource, ip):
                if entry.decision is Decision.DENY:
                    return Decision.DENY
                allowed = True
        return Decision.ALLOW if allowed else Decision.DENY

    def to_dict(self) -> dict[str, Any]:
        """The store's JSON (secrets included: the file is the only place they are written)."""
        return {"version": self.version,
                "users": [u.to_dict(with_secret=True) for u in sorted(self.users.values(), key=lambda u: u.access_key)],
                "policies": [p.to_dict() for p in sorted(self.policies.values(), key=lambda p: p.subject)]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AclTable:
        """The table of the store's JSON (ValueError when malformed)."""
        _only(data, {"version", "users", "policies"}, "ACL file")
        users = [User.from_dict(u) for u in data.get("users") or ()]
        policies = [Policy.from_dict(p) for p in data.get("policies") or ()]
        version = check_int("version", data.get("version", 0), 0, error=ValueError)
        return cls({u.access_key: u for u in users}, {p.subject: p for p in policies}, version)


def check_acl_settings(access_key: object, secret_key: object) -> None:
    """Validate a config's bootstrap super user: both keys or neither, each legal (ValueError otherwise; the
    message never shows the secret)."""
    if (access_key is None) != (secret_key is None):
        raise ValueError("acl_super_user_access_key and acl_super_user_secret_key go together: set both or neither")
    if access_key is not None:
        try:
            validate_access_key(access_key)
            validate_secret_key(secret_key)
        except ValueError as exc:
            raise ValueError(f"acl_super_user: {exc}") from None


def check_service_acl_settings(data_dir: object, enabled: object, access_key: object, secret_key: object,
                               clock_skew_s: object) -> None:
    """Validate the ``acl_*`` settings of a service that keeps its ACL under ``data_dir`` (name server, gateway):
    ValueError naming the bad setting (never showing a secret)."""
    check("acl_enabled", enabled, bool, ValueError)
    if enabled and not data_dir:
        raise ValueError("acl_enabled needs data_dir: the ACL is kept in <data_dir>/config/acl.json")
    check_acl_settings(access_key, secret_key)
    check("acl_clock_skew_s", clock_skew_s, Seconds, ValueError)
