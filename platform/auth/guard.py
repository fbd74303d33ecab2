"""The access guard: authenticate a request's signature, decide its actions against the ACL, audit refusals.

One :class:`AccessGuard` per service, shared by its HTTP, remoting and gRPC endpoints.  Each endpoint maps a
request to the :class:`Need` list it implies (``Pub`` on ``Topic:orders``, ``Sub`` on ``Group:cg``, ...) and
calls :meth:`AccessGuard.authenticate_*` then :meth:`AccessGuard.authorize`; both raise a
:class:`~sparkmq.platform.common.errors.SparkMQError` (AUTHENTICATION_FAILED, NO_PERMISSION) before the request
touches anything, so a refused request changes nothing.

Decisions are cached per (user, action, resource, address) and the cache is dropped whenever the table
changes (here or in the file), so a policy change applies to the next request.  Every refusal and every ACL
change is one line on the ``sparkmq.audit`` logger: who, what, from where (never a secret).
"""
from __future__ import annotations

import functools
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..common.errors import ErrorCode, SparkMQError
from .model import AclTable, Action, Decision, Resource, User
from .signing import (
    GrpcSignature,
    RemotingRequest,
    RocketMQSignature,
    SignedRequest,
    auth_failed,
    grpc_date_ms,
    parse_grpc,
    parse_http,
    parse_remoting,
)
from .store import AclStore, acl_path

__all__ = ["AccessGuard", "Principal", "Need", "DEFAULT_CLOCK_SKEW_S", "audit_log", "peer_ip"]

#: The audit trail: one line per refused request and per ACL change.
audit_log = logging.getLogger("sparkmq.audit")
if audit_log.level == logging.NOTSET:
    audit_log.setLevel(logging.INFO)  # ACL changes are INFO lines: kept even when the service logs warnings only

#: A signature older or newer than this (seconds) is refused: a captured request cannot be replayed later.
DEFAULT_CLOCK_SKEW_S = 300.0
#: Decisions remembered before the cache starts over (bounded memory whatever the callers send).
_CACHE_MAX = 50_000
#: What a refusal for missing credentials tells sparkmq's own clients, and the official gRPC clients.
_SIGN_HINT = "sign the request with an access key"
_GRPC_SIGN_HINT = "give the client Credentials(access_key, secret_key)"
_REMOTING_SIGN_HINT = "sign the request with an access key (a RocketMQ client: an AclClientRPCHook)"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request proved to be."""

    access_key: str
    super_user: bool = False


#: (action, resource): one thing a request does.
Need = tuple[Action, Resource]


@functools.lru_cache(maxsize=4096)
def peer_ip(peer: str | None) -> IPAddress | None:
    """The IP of a peer written ``ip``, ``ip:port``, ``[v6]:port`` or ``ipv4:ip:port`` (gRPC); None if unknown."""
    if not peer:
        return None
    text = peer
    for scheme in ("ipv4:", "ipv6:"):
        text = text.removeprefix(scheme)
    candidates = [text]
    if text.startswith("["):
        candidates.append(text[1:text.find("]")] if "]" in text else text)
    elif text.count(":") == 1:
        candidates.append(text.rpartition(":")[0])
    for candidate in candidates:
        try:
            return ipaddress.ip_address(candidate)
        except ValueError:
            continue
    return None


class AccessGuard:
    """Authentication and authorization of one service over its :class:`AclStore`.

    With ``enabled`` false every check passes (``sparkmq dev`` stays open); the store still works, so
    users and policies can be prepared before ACL is turned on.

    Example::

        guard = AccessGuard(AclStore(acl_path(data_dir)), enabled=True)
        who = guard.authenticate_http("POST", "/topics/t/messages", request_headers, body, "10.0.0.5")
        guard.authorize(who, [(Action.PUB, Resource.topic("t"))], "10.0.0.5", "POST /topics/t/messages")
    """

    def __init__(self, store: AclStore, *, enabled: bool, clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.enabled = enabled
        self.clock_skew_ms = int(clock_skew_s * 1000)
        self._clock = clock
        self._decisions: dict[tuple[str, Action, Resource, IPAddress | None], Decision] = {}
        store.add_listener(self._table_changed)

    @classmethod
    def open(cls, data_dir: Path | str, *, enabled: bool, super_user_access_key: str | None = None,
             super_user_secret_key: str | None = None, clock_skew_s: float = DEFAULT_CLOCK_SKEW_S) -> AccessGuard:
        """The guard of a service keeping its ACL under ``data_dir`` (``config/acl.json``), with the config's
        bootstrap super user when both keys are given."""
        bootstrap = None
        if super_user_access_key and super_user_secret_key:
            bootstrap = User(super_user_access_key, super_user_secret_key, super_user=True)
        return cls(AclStore(acl_path(data_dir), bootstrap=bootstrap), enabled=enabled, clock_skew_s=clock_skew_s)

    def _table_changed(self, table: AclTable) -> None:
        self._decisions = {}  # a new dict, not clear(): readers on other threads keep a consistent one

    # -- authentication --------------------------------------------------------------------------
    # Every protocol goes through the same two steps: parse the claim (a malformed one is refused with no user
    # to name), then :meth:`_principal` (skew window, user lookup, signature, one audit line per refusal).
    def _principal(self, claim: SignedRequest | GrpcSignature | RocketMQSignature | None, peer: str | None,
                   what: str, *, how_to_sign: str = _SIGN_HINT) -> Principal:
        """Who made ``claim`` (None: the request carried none); AUTHENTICATION_FAILED, audited, otherwise."""
        self.store.maybe_reload()
        try:
            if claim is None:
                raise auth_failed(f"no credentials: ACL is on, {how_to_sign}")
            now_s = self._clock()
            if isinstance(claim, SignedRequest):
                signed_ms, stamp = claim.timestamp_ms, "the request was signed"
            elif isinstance(claim, GrpcSignature):  # the official gRPC clients sign x-mq-date-time, not the request
                signed_ms, stamp = grpc_date_ms(claim.date_time, now_s), "x-mq-date-time is"
            else:  # RocketMQ's remoting signature carries no time: nothing to hold it to (docs/security.md)
                signed_ms, stamp = int(now_s * 1000), ""
            skew_ms = abs(now_s * 1000 - signed_ms)
            if skew_ms > self.clock_skew_ms:
                raise auth_failed(f"{stamp} {skew_ms / 1000:.0f} s away from the server's clock "
                                  f"(the window is {self.clock_skew_ms / 1000:.0f} s)")
            user = self.store.table.users.get(claim.access_key)
            if user is None or not claim.verify(user.secret_key):
                # One answer for both: an unknown key and a wrong secret look alike to the caller.
                raise auth_failed(f"access key {claim.access_key!r} is unknown or the signature does not match")
        except SparkMQError as exc:
            self._audit_refusal(claim.access_key if claim is not None else "-", peer, what, exc)
            raise
        return Principal(user.access_key, user.super_user)

    @staticmethod
    def _audit_refusal(who: str, peer: str | None, what: str, exc: SparkMQError) -> None:
        audit_log.warning("denied user=%s from=%s request=%s reason=%s", who, peer or "-", what, exc.message)

    @classmethod
    def _parsed(cls, parse: Callable[..., _T], peer: str | None, what: str, *args: Any) -> _T:
        """``parse(*args)``; a malformed claim is audited (no user to name) and raised."""
        try:
            return parse(*args)
        except SparkMQError as exc:
            cls._audit_refusal("-", peer, what, exc)
            raise

    def authenticate_http(self, method: str, target: str, headers: Mapping[str, str], body: bytes,
                          peer: str | None) -> Principal:
        """Who signed an HTTP request (``target`` = raw path and ``?query``); AUTHENTICATION_FAILED otherwise."""
        what = f"{method} {target.partition('?')[0]}"
        return self._principal(self._parsed(parse_http, peer, what, method, target, headers, body), peer, what)

    def authenticate_remoting(self, frame: RemotingRequest, peer: str | None) -> Principal:
        """Who signed a remoting request: sparkmq's signature or a RocketMQ client's ``AclClientRPCHook``
        (:func:`~.signing.parse_remoting`); AUTHENTICATION_FAILED (RocketMQ's NO_PERMISSION, 16) otherwise.  The
        credential fields are removed from ``frame.ext`` whatever the outcome."""
        what = f"remoting code {frame.code}"
        return self._principal(self._parsed(parse_remoting, peer, what, frame), peer, what,
                               how_to_sign=_REMOTING_SIGN_HINT)

    def authenticate_grpc(self, metadata: Mapping[str, str], peer: str | None, what: str) -> Principal:
        """Who signed a gRPC call (``MQv2-HMAC-SHA1``); AUTHENTICATION_FAILED otherwise."""
        claim = self._parsed(parse_grpc, peer, what, metadata)
        return self._principal(claim, peer, what, how_to_sign=_GRPC_SIGN_HINT)

    # -- authorization ---------------------------------------------------------------------------
    def allowed(self, principal: Principal, action: Action, resource: Resource, peer: str | None) -> bool:
        """Whether ``principal`` may do ``action`` on ``resource`` from ``peer`` (cached until the ACL changes)."""
        if principal.super_user:
            return True
        ip = peer_ip(peer)
        key = (principal.access_key, action, resource, ip)
        decisions = self._decisions
        decision = decisions.get(key)
        if decision is None:
            decision = self.store.table.decide(principal.access_key, action, resource, ip)
            if len(decisions) >= _CACHE_MAX:
                decisions = self._decisions = {}
            decisions[key] = decision
        return decision is Decision.ALLOW

    def authorize(self, principal: Principal, needs: Iterable[Need], peer: str | None, what: str, *,
                  any_of: bool = False) -> None:
        """NO_PERMISSION (audited) unless every need is allowed (or, with ``any_of``, at least one)."""
        if principal.super_user:
            return
        needs = list(needs)
        refused = [(a, r) for a, r in needs if not self.allowed(principal, a, r, peer)]
        if not refused or (any_of and len(refused) < len(needs)):
            return
        action, resource = refused[0]
        message = (f"user {principal.access_key!r} may not {action.value} on {resource} "
                   f"from {peer_ip(peer) or 'an unknown address'}")
        audit_log.warning("denied user=%s from=%s request=%s action=%s resource=%s", principal.access_key,
                          peer or "-", what, action.value, resource)
        raise SparkMQError(ErrorCode.NO_PERMISSION, message)

    def require_super_user(self, principal: Principal, peer: str | None, what: str) -> None:
        """NO_PERMISSION (audited) unless ``principal`` is a super user (user and ACL administration)."""
        if principal.super_user:
            return
        audit_log.warning("denied user=%s from=%s request=%s reason=needs a super user", principal.access_key,
                          peer or "-", what)
        raise SparkMQError(ErrorCode.NO_PERMISSION, f"user {principal.access_key!r} is not a super user: "
                                                    f"only super users manage users and ACLs")

    @staticmethod
    def audit_change(principal: Principal | None, peer: str | None, change: str) -> None:
        """One audit line for an ACL change (``change`` never holds a secret)."""
        audit_log.info("acl change by user=%s from=%s: %s", principal.access_key if principal else "-",
                       peer or "-", change)
